#!/bin/bash
# Rebuilds models/kvllm-prose.gguf from scratch:
#   install deps -> prepare data -> train tokenizer -> train -> export ->
#   verify against kvllm -> plot the loss curve.
#
# Usage (from anywhere):
#   bash tools/train/train_all.sh           # full run, ~40 minutes
#   bash tools/train/train_all.sh --quick   # 1-minute pilot into runs/quick
#
# The full run writes models/kvllm-prose.gguf and models/kvllm-prose-loss.png;
# the pilot leaves everything in tools/train/runs/quick.  The verification
# needs kvllm built in build-main (cmake --build build-main --target kvllm).
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$root"
py=/usr/bin/python3  # Debian's python, which sees the apt-installed torch
train=tools/train
data=$train/data

if [[ "${1:-}" == "--quick" ]]; then
  run=$train/runs/quick
  minutes=1
  train_flags=(--eval-every 10 --warmup 5)
  model=$run/model.gguf
  plot=$run/loss.png
else
  run=$train/runs/main
  minutes=38
  train_flags=()
  model=models/kvllm-prose.gguf
  plot=models/kvllm-prose-loss.png
fi

bash $train/install-deps.sh
$py $train/prepare_data.py $data
$py $train/train_tokenizer.py $data/train.txt $data/vocab.json --size 4096
$py $train/train.py --data $data --run $run --minutes $minutes \
  "${train_flags[@]}"
$py $train/export_gguf.py $run/model.pt $data/vocab.json $model
$py $train/verify_export.py $run/model.pt $data/vocab.json $model \
  --text $data/heldout.txt
$py $train/plot_loss.py $run/log.csv $plot
