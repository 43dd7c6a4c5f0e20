#!/usr/bin/env bash
# Runs every fuzz target of a KVLLM_FUZZ build on a scratch copy of its seed corpus
# (fuzz/corpus/NAME is never written), one at a time, and prints one line per target.
#   scripts/run-fuzzers.sh BUILD_DIR [NAME...]
# FUZZ_RUNS (default 1000000) caps the executions of each target, FUZZ_SECONDS (default 0: no
# cap) its time. Exits non-zero when a target crashes; its log and the crashing input stay
# under BUILD_DIR/fuzz-out/ (or FUZZ_OUT).
set -uo pipefail
cd "$(dirname "$0")/.."
build=${1:?usage: run-fuzzers.sh BUILD_DIR [NAME...]}
shift
runs=${FUZZ_RUNS:-1000000}
seconds=${FUZZ_SECONDS:-0}
names=("$@")
if [ ${#names[@]} -eq 0 ]; then
  for f in fuzz/*_fuzz.cc; do names+=("$(basename "$f" _fuzz.cc)"); done
fi

out=${FUZZ_OUT:-$build/fuzz-out}
failed=()
for name in "${names[@]}"; do
  corpus=$out/corpus/$name
  rm -rf "$corpus" && mkdir -p "$corpus" "$out/artifacts"
  cp fuzz/corpus/"$name"/* "$corpus"/
  log=$out/$name.log
  start=$(date +%s%N)
  "$build/fuzz/${name}_fuzz" -runs="$runs" -max_total_time="$seconds" -timeout=25 \
    -print_final_stats=1 -artifact_prefix="$out/artifacts/$name-" "$corpus" >"$log" 2>&1
  rc=$?
  ms=$(( ($(date +%s%N) - start) / 1000000 ))
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log")
  rate=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log")
  printf '%-14s %10s runs %6d.%d s %8s exec/s  corpus %s files\n' "$name" "${execs:-?}" \
    $((ms / 1000)) $((ms % 1000 / 100)) "${rate:-?}" "$(ls "$corpus" | wc -l)"
  if [ $rc -ne 0 ]; then
    echo "fuzz: $name failed (exit $rc); log: $log" >&2
    grep -E 'ERROR|FUZZ_CHECK|runtime error|Test unit written' "$log" | head -5 >&2
    failed+=("$name")
  fi
done
[ ${#failed[@]} -eq 0 ] || { echo "fuzz: failed: ${failed[*]}" >&2; exit 1; }
