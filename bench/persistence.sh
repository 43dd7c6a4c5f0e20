#!/usr/bin/env bash
# Time to first token for a 2,048-token history: prefilled, restored from the disk tier
# (--kv-store-dir) and restored from Redis (--kv-store-redis), each in a fresh kvllm process,
# on the bundled model and on a TinyLlama-1.1B-shaped Q8_0 random model (f16 KV).
# Usage: BUILD=build bash bench/persistence.sh [repetitions]   (writes a 1.1 GB model once)
#        MODELS="models/kvllm-prose.gguf" ... to measure only some models
set -euo pipefail
cd "$(dirname "$0")/.."
build=${BUILD:-build}
reps=${1:-3}
py=/usr/bin/python3
kvllm="$build/kvllm"
work="$build/bench-persistence"
mkdir -p "$work" "$build/models"
tinyllama="$build/models/tinyllama-random-q8_0.gguf"
models=${MODELS:-"models/kvllm-prose.gguf $tinyllama"}
if [[ " $models " == *" $tinyllama "* && ! -f "$tinyllama" ]]; then
  $py tools/make_model.py --preset tinyllama --type q8_0 --seed 1 --out "$tinyllama"
fi

port=$($py -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
redis-server --port "$port" --bind 127.0.0.1 --save '' --appendonly no >/dev/null &
redis_pid=$!
trap 'kill $redis_pid 2>/dev/null || true' EXIT
for _ in $(seq 100); do redis-cli -p "$port" ping >/dev/null 2>&1 && break; sleep 0.1; done

# A prompt file of at least 2,048 tokens for `model`.
make_prompt() {
  local model=$1 out=$2
  local sentence="It is a truth universally acknowledged, that a single man in possession of a good fortune, must be in want of a wife. "
  local per; per=$("$kvllm" tokenize -m "$model" -p "$sentence" --ids --no-bos | $py -c 'import json,sys; print(len(json.load(sys.stdin)))')
  local n=$(( (2048 + per - 1) / per ))
  : > "$out"
  for _ in $(seq "$n"); do printf '%s' "$sentence" >> "$out"; done
  # Joined sentences tokenize a little differently: top up until the history is long enough.
  while [ "$("$kvllm" tokenize -m "$model" -f "$out" --ids | $py -c 'import json,sys; print(len(json.load(sys.stdin)))')" -lt 2048 ]; do
    printf '%s' "$sentence" >> "$out"
  done
}

median() { $py -c 'import sys,statistics; print("%.1f" % statistics.median(float(x) for x in sys.argv[1:]))' "$@"; }
field() { $py -c "import json,sys; print(json.load(sys.stdin)['$1'])"; }

echo "| model | history tokens | prefill TTFT (ms) | disk TTFT (ms) | Redis TTFT (ms) | disk speed-up | Redis speed-up |"
echo "|---|---|---|---|---|---|---|"
for model in $models; do
  prompt="$work/$(basename "$model").txt"
  make_prompt "$model" "$prompt"
  common=(-m "$model" -f "$prompt" -n 1 --temp 0 -t 2 -c 4096 --json)
  prefill=() disk=() redis=() tokens=0
  for r in $(seq "$reps"); do
    dir="$work/store-$r"
    rm -rf "$dir"
    redis-cli -p "$port" flushall >/dev/null
    # The first run computes the history (and writes its blocks to both tiers on exit).
    out=$("$kvllm" run "${common[@]}" --kv-store-dir "$dir" --kv-store-redis "redis://127.0.0.1:$port")
    prefill+=("$(echo "$out" | field ttft_ms)")
    tokens=$(echo "$out" | field prompt_tokens)
    out=$("$kvllm" run "${common[@]}" --kv-store-dir "$dir")
    disk+=("$(echo "$out" | field ttft_ms)")
    out=$("$kvllm" run "${common[@]}" --kv-store-redis "redis://127.0.0.1:$port")
    redis+=("$(echo "$out" | field ttft_ms)")
    echo "$(basename "$model") rep $r: prefill ${prefill[-1]} ms, disk ${disk[-1]} ms, redis ${redis[-1]} ms" >&2
  done
  p=$(median "${prefill[@]}") d=$(median "${disk[@]}") q=$(median "${redis[@]}")
  echo "| $(basename "$model") | $tokens | $p | $d | $q | $($py -c "print('%.0fx' % ($p/$d))") | $($py -c "print('%.0fx' % ($p/$q))") |"
done
echo
echo "command: BUILD=$build MODELS=\"$models\" bash bench/persistence.sh $reps   (medians of $reps runs, 2 threads)"
