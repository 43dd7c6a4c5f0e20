#!/usr/bin/env bash
# Where a decode step's time goes at depth 1 and at a deep context: a `kvllm bench` run per
# depth under `perf record` (the bench steps the depths of one run side by side, so one run's
# samples could not be told apart by time), then the CPU time per step of each function over
# the run's last window of steps (its length known from the run's ms per token, its edges
# trimmed so no prefill falls in it). Both threads' samples count, so a 2-thread step of T ms
# holds up to 2T ms of CPU.
#
# Usage: bench/step_profile.sh MODEL [DEPTH (4096)] [STEPS (300)] [KV (f16)]
#   env: BUILD (build), THREADS (2). Needs `perf`.
set -euo pipefail
model=$1 depth=${2:-4096} steps=${3:-300} kv=${4:-f16}
kvllm=${BUILD:-build}/kvllm
hz=4000  # perf's samples per second and thread: a sample stands for 1000 / hz ms of CPU
dir=$(mktemp -d /tmp/step_profile.XXXXXX)
trap 'rm -rf "$dir"' EXIT
# Profiles one depth: writes $dir/$1.tsv (CPU ms per step, function) and prints its ms per step.
profile() {
  local d=$1 table ms
  table=$(perf record -q -F "$hz" -o "$dir/$d.data" -- "$kvllm" bench -m "$model" \
    -t "${THREADS:-2}" -p 1 -n 1 -r 1 --depth-steps "$steps" -ctk "$kv" -ctv "$kv" \
    --cache-only --no-mmap --no-roofline --depths "$d" 2>"$dir/$d.err") || true
  ms=$(echo "$table" | awk -F'|' -v d="$d" '$2 + 0 == d && $3 + 0 > 0 {print $3 + 0}')
  if [ -z "$ms" ]; then
    echo "step_profile: no depth-$d row in the bench's output:" >&2
    cat "$dir/$d.err" >&2
    exit 1
  fi
  perf script -i "$dir/$d.data" -F tid,time,ip,sym 2>/dev/null | awk -v ms="$ms" \
    -v steps="$steps" -v hz="$hz" '
    { t = $2 + 0; s = $4; for (i = 5; i <= NF; ++i) s = s " " $i
      time[NR] = t; sym[NR] = substr(s, 1, 80); if (t > end) end = t }
    END {
      stop = end - 0.01; start = stop - 0.9 * ms * steps / 1000
      for (i = 1; i <= NR; ++i) if (time[i] >= start && time[i] < stop) { a[sym[i]]++; n++ }
      for (k in a) printf "%s\t%.4f\t%s\n", k, a[k] * 1000 / hz / (0.9 * steps), a[k] / n
    }' > "$dir/$d.tsv"
  echo "$ms"
}
ms1=$(profile 1)
msd=$(profile "$depth")
echo "ms per step: depth 1 $ms1, depth $depth $msd (separate runs)"
echo "CPU ms per step (depth 1, depth $depth), functions over 0.4% of either window:"
awk -F'\t' 'FNR == NR { a[$1] = $2; fa[$1] = $3; all[$1] = 1; next }
  { b[$1] = $2; fb[$1] = $3; all[$1] = 1 }
  END { for (k in all) if (fa[k] > 0.004 || fb[k] > 0.004)
          printf "%8.2f %8.2f  %s\n", a[k], b[k], k }' "$dir/1.tsv" "$dir/$depth.tsv" |
  sort -k2 -rn
