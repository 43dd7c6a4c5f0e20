#!/usr/bin/env bash
# Where a decode step's time goes at depth 1 and at a deep context, on the same minute: one
# `kvllm bench` run at both depths (the deepest first) under `perf record`, then the CPU time
# per step of each function over each depth's window of steps (a window is known from the
# run's ms per token; its edges are trimmed so no prefill falls in it). Both threads' samples
# count, so a 2-thread step of T ms holds up to 2T ms of CPU.
#
# Usage: bench/step_profile.sh MODEL [DEPTH (4096)] [STEPS (300)] [KV (f16)]
#   env: BUILD (build), THREADS (2). Needs `perf`.
set -euo pipefail
model=$1 depth=${2:-4096} steps=${3:-300} kv=${4:-f16}
kvllm=${BUILD:-build}/kvllm
data=$(mktemp /tmp/step_profile.XXXXXX)
trap 'rm -f "$data"' EXIT
table=$(perf record -q -F 4000 -o "$data" -- "$kvllm" bench -m "$model" -t "${THREADS:-2}" \
  -p 1 -n 1 -r 1 --depth-steps "$steps" -ctk "$kv" -ctv "$kv" --cache-only --no-mmap \
  --no-roofline --depths "1,$depth" 2>/dev/null)
ms1=$(echo "$table" | awk -F'|' '$2 + 0 == 1 {print $3 + 0}')
msd=$(echo "$table" | awk -F'|' -v d="$depth" '$2 + 0 == d {print $3 + 0}')
echo "ms per step: depth 1 $ms1, depth $depth $msd"
echo "CPU ms per step (depth 1, depth $depth), functions over 0.4% of either window:"
# Depth 1 ran last: its window ends with the samples; depth $depth's ends before it.
perf script -i "$data" -F tid,time,ip,sym 2>/dev/null | awk -v ms1="$ms1" -v msd="$msd" \
  -v steps="$steps" '
  { t = $2 + 0; s = $4; for (i = 5; i <= NF; ++i) s = s " " $i
    time[NR] = t; sym[NR] = substr(s, 1, 80); if (t > end) end = t }
  END {
    e1 = end - 0.01; s1 = e1 - 0.95 * ms1 * steps / 1000
    ed = end - ms1 * steps / 1000 - 0.05; sd = ed - 0.9 * msd * steps / 1000
    for (i = 1; i <= NR; ++i) {
      if (time[i] >= s1 && time[i] < e1) { a[sym[i]]++; n1++ }
      if (time[i] >= sd && time[i] < ed) { b[sym[i]]++; nd++ }
    }
    for (k in a) all[k] = 1
    for (k in b) all[k] = 1
    for (k in all) if (a[k] / n1 > 0.004 || b[k] / nd > 0.004)
      printf "%8.2f %8.2f  %s\n", a[k] / 4 / (0.95 * steps), b[k] / 4 / (0.9 * steps), k
  }' | sort -k2 -rn
