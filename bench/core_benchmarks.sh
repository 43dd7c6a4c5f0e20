#!/usr/bin/env bash
# Reproduces the tables of docs/benchmarks.md: writes the two benchmark models (random weights;
# speed depends only on shapes and formats) and runs `kvllm bench` on each with 2 threads.
#   stories15M shape (dim 288, 6 layers, 6 heads, ffn 768, vocab 32000), f32 weights:
#     pp512, tg128 and decode time per token at depths 64..1024 with and without the KV cache
#   TinyLlama-1.1B shape (dim 2048, 22 layers, 32 heads, 4 KV heads, ffn 5632), Q8_0 weights:
#     pp512 and tg128 (the no-cache depth table would take hours at this size)
set -euo pipefail
build=${BUILD:-build}
threads=${THREADS:-2}
py=/usr/bin/python3
mkdir -p "$build/models"

stories="$build/models/stories15m-random-f32.gguf"
tinyllama="$build/models/tinyllama-random-q8_0.gguf"
[ -f "$stories" ] || $py tools/make_model.py --preset stories15m --type f32 --seed 1 --out "$stories"
[ -f "$tinyllama" ] || $py tools/make_model.py --preset tinyllama --type q8_0 --seed 1 --out "$tinyllama"

"$build/kvllm" bench -m "$stories" -t "$threads"
echo
"$build/kvllm" bench -m "$tinyllama" -t "$threads" --no-depths
