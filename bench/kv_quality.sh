#!/usr/bin/env bash
# Reproduces docs/kv-quality.md: what each KV format costs (bytes per token), what it loses
# (perplexity, mean KL divergence and top-1 agreement against f16 KV on the same text and
# context) and how fast it decodes at 2k context; then the sliding window: memory over a long
# generation and perplexity on chunks 4x longer than the trained context.
# Needs the bundled model and the held-out text written by tools/train/prepare_data.py.
#   BUILD=build MODEL=models/kvllm-prose.gguf TEXT=tools/train/data/heldout.txt bash bench/kv_quality.sh
set -euo pipefail
build=${BUILD:-build}
model=${MODEL:-models/kvllm-prose.gguf}
text=${TEXT:-tools/train/data/heldout.txt}
chunks=${CHUNKS:-30}
ctx=${CTX:-512}
threads=${THREADS:-2}
kvllm="$build/kvllm"
out="$build/kv-quality"
mkdir -p "$out"
[ -f "$text" ] || { echo "kv_quality: $text is missing: run /usr/bin/python3 tools/train/prepare_data.py first" >&2; exit 1; }

# K/V pairs to measure; f16/f16 is the baseline.
pairs=${PAIRS:-"f16/f16 f32/f32 bf16/bf16 q8_0/q8_0 q8_0/q4_0 q4_0/q4_0 q4_0r/q4_0 k4/k4 k4/k2 k2/k2"}

ppl() { sed -n 's/^Final estimate: PPL = \([0-9.]*\) +\/- \([0-9.]*\).*/\1 ± \2/p' "$1"; }
kld() { sed -n 's/^Mean KLD: \([0-9.]*\) +\/- \([0-9.]*\); same top-1 token: \([0-9.]*\)%.*/\1 ± \2|\3%/p' "$1"; }

if [ "${SKIP_FORMATS:-0}" != 1 ]; then
echo "## KV formats on $(basename "$model"), $text, -c $ctx, $chunks chunks"
echo
echo "base: $kvllm perplexity -m $model -f $text -c $ctx --chunks $chunks -t $threads -ctk f16 -ctv f16 --kl-divergence-base $out/base.kld"
"$kvllm" perplexity -m "$model" -f "$text" -c "$ctx" --chunks "$chunks" -t "$threads" \
  -ctk f16 -ctv f16 --kl-divergence-base "$out/base.kld" > "$out/f16_f16.txt" 2>/dev/null
echo
echo "| K | V | bytes/token | perplexity | mean KLD vs f16 | same top-1 | decode tokens/s at 2048 |"
echo "|---|---|---:|---:|---:|---:|---:|"
for pair in $pairs; do
  k=${pair%/*}; v=${pair#*/}
  log="$out/${k}_${v}.txt"
  "$kvllm" perplexity -m "$model" -f "$text" -c "$ctx" --chunks "$chunks" -t "$threads" \
    -ctk "$k" -ctv "$v" --kl-divergence "$out/base.kld" > "$log" 2>/dev/null
  bpt=$("$kvllm" kv-size -m "$model" --json | /usr/bin/python3 -c "
import json, sys
k, v = sys.argv[1], sys.argv[2]
fmts = {f['k_type']: f['bytes_per_token'] for f in json.load(sys.stdin)['formats']}
print((fmts[k] + fmts[v]) // 2 if k in fmts and v in fmts else '?')" "$k" "$v")
  tps=$("$kvllm" bench -m "$model" -t "$threads" -r 3 -p 16 -n 8 --depths 2048 --depth-steps 16 \
        --cache-only -ctk "$k" -ctv "$v" --json 2>/dev/null | /usr/bin/python3 -c "
import json, sys; print('%.1f' % json.load(sys.stdin)['depth'][0]['cached_tokens_per_s'])")
  IFS='|' read -r kl top1 <<< "$(kld "$log")"
  echo "| $k | $v | $bpt | $(ppl "$log") | $kl | $top1 | $tps |"
done
echo
echo "per row: $kvllm perplexity -m $model -f $text -c $ctx --chunks $chunks -t $threads -ctk K -ctv V --kl-divergence $out/base.kld"
echo "speed:   $kvllm bench -m $model -t $threads -r 3 -p 16 -n 8 --depths 2048 --depth-steps 16 --cache-only -ctk K -ctv V"
fi

# --- Sliding window with attention sinks -------------------------------------------------------
window=${WINDOW:-256}
long=$((ctx * 4))
echo
echo "## Sliding window: memory over a 20,000-token generation (window $window + 4 sinks)"
echo
echo "| run | KV blocks at the end | peak KV blocks | peak KV bytes | max RSS |"
echo "|---|---:|---:|---:|---:|"
for mode in window full; do
  # Without a window the cache grows with every token (and attention with it): 2,000 tokens
  # show the slope without waiting for 20,000.
  if [ $mode = window ]; then flags="--kv-window $window --kv-sinks 4 -c 1024"; n=20000; else flags="-c 2016"; n=2000; fi
  /usr/bin/time -v "$kvllm" run -m "$model" -p "It is a truth universally acknowledged" -n $n \
    --ignore-eos --seed 1 -t "$threads" $flags --json > "$out/gen_$mode.json" 2> "$out/gen_$mode.time"
  /usr/bin/python3 - "$out/gen_$mode.json" "$out/gen_$mode.time" "$mode" "$flags" <<'PY'
import json, re, sys
j = json.load(open(sys.argv[1]))
rss = re.search(r"Maximum resident set size \(kbytes\): (\d+)", open(sys.argv[2]).read()).group(1)
print("| %s (%s, %d tokens) | %d | %d | %.2f MiB | %.1f MiB |" % (
    sys.argv[3], sys.argv[4], len(j["generated_tokens"]), j["kv_blocks_used"], j["kv_blocks_peak"],
    j["kv_bytes_peak"] / 2**20, int(rss) / 1024))
PY
done
echo
echo "commands: $kvllm run -m $model -p \"It is a truth universally acknowledged\" -n 20000 --ignore-eos --seed 1 -t $threads --kv-window $window --kv-sinks 4 -c 1024 --json  (and -n 2000 -c 2016 without a window)"
echo
echo "## Perplexity on chunks of $long tokens ($((long / ctx))x the trained context of $ctx)"
echo
echo "| attention | perplexity |"
echo "|---|---:|"
lchunks=$((chunks / 4 > 0 ? chunks / 4 : 1))
for mode in "in-context:-c $ctx --chunks $chunks" "full cache:-c $long --chunks $lchunks" \
            "window $window, no sinks:-c $long --chunks $lchunks --kv-window $window --kv-sinks 0" \
            "window $window + 4 sinks:-c $long --chunks $lchunks --kv-window $window --kv-sinks 4"; do
  name=${mode%%:*}; flags=${mode#*:}
  "$kvllm" perplexity -m "$model" -f "$text" -t "$threads" $flags > "$out/long.txt" 2>/dev/null
  echo "| $name (\`$flags\`) | $(ppl "$out/long.txt") |"
done
echo
echo "each row: $kvllm perplexity -m $model -f $text -t $threads <flags>"
