#!/usr/bin/python3
"""Checks that kvllm runs an exported model exactly as PyTorch trained it.

Example:
    /usr/bin/python3 tools/train/verify_export.py \
        tools/train/runs/main/model.pt tools/train/data/vocab.json \
        models/kvllm-prose.gguf --text tools/train/data/heldout.txt

Three checks, each failing loudly:
1. tokenizer: kvllm's `tokenize --ids --no-bos` of --text gives exactly the
   ids of tokenizer.py, the encoder the model was trained with;
2. logits: tools/reference.py (float64, reading the GGUF file) agrees with
   the PyTorch model to within F16 rounding of the weights;
3. generation: kvllm's greedy continuation of a prompt equals PyTorch's,
   token for token (a near-tie flipped by F16 rounding is reported, with the
   PyTorch logit gap at the first difference, rather than failing).
"""

import argparse
import json
import os
import subprocess
import sys

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
from model import Config, Llama  # noqa: E402
from tokenizer import BOS_ID, Vocab  # noqa: E402

KVLLM = os.path.join(ROOT, "build-main", "kvllm")
REFERENCE = os.path.join(ROOT, "tools", "reference.py")


def check_tokenizer(vocab, gguf_path, text_path):
    with open(text_path, encoding="utf-8") as f:
        ours = vocab.encode(f.read())
    out = subprocess.run([KVLLM, "tokenize", "-m", gguf_path, "-f", text_path,
                          "--ids", "--no-bos"], check=True,
                         capture_output=True, text=True).stdout
    theirs = json.loads(out)
    if ours != theirs:
        first = next((i for i, (a, b) in enumerate(zip(ours, theirs))
                      if a != b), min(len(ours), len(theirs)))
        sys.exit(f"tokenizer MISMATCH at token {first}: python "
                 f"{ours[first:first + 5]} kvllm {theirs[first:first + 5]}")
    print(f"tokenizer: identical ids for all {len(ours)} tokens of "
          f"{text_path}")


def check_logits(model, gguf_path, ids):
    out = subprocess.run([sys.executable, REFERENCE, gguf_path, "--tokens",
                          ",".join(map(str, ids)), "--all"], check=True,
                         capture_output=True, text=True).stdout
    ref = np.array(json.loads(out)["logits"])
    with torch.no_grad():
        ours = model(torch.tensor([ids]))[0].double().numpy()
    diff = np.abs(ref - ours).max()
    scale = np.abs(ours).max()
    print(f"logits: max |reference - torch| = {diff:.4f} "
          f"(logits up to {scale:.1f}) over {len(ids)} positions")
    # F16 weights carry a relative error of about 5e-4 each; through the
    # layers that gives logit differences around 1e-2 of the logit scale.
    if diff > 0.02 * scale + 0.05:
        sys.exit("logits MISMATCH: more than F16 rounding explains")


def check_generation(model, vocab, gguf_path, prompt, n):
    ids = [BOS_ID] + vocab.encode(prompt)
    gaps = []
    with torch.no_grad():
        for _ in range(n):
            logits = model(torch.tensor([ids]))[0, -1]
            top2 = logits.topk(2).values
            gaps.append((top2[0] - top2[1]).item())
            ids.append(int(logits.argmax()))
    ours = ids[-n:]
    out = subprocess.run([KVLLM, "run", "-m", gguf_path, "-p", prompt, "-n",
                          str(n), "--temp", "0", "--ignore-eos", "--json"],
                         check=True, capture_output=True, text=True).stdout
    theirs = json.loads(out)["generated_tokens"]
    print(f"generation (torch): {prompt}{vocab.decode(ours)!r}")
    if ours == theirs:
        print(f"generation: kvllm's {n} greedy tokens equal torch's")
        return
    first = next(i for i, (a, b) in enumerate(zip(ours, theirs)) if a != b)
    print(f"generation (kvllm): {prompt}{vocab.decode(theirs)!r}")
    message = (f"generation: first difference at token {first}, where "
               f"torch's top-2 logit gap is {gaps[first]:.4f}")
    if gaps[first] > 0.05:
        sys.exit(message + ": more than F16 rounding explains")
    print(message + " (a near-tie: F16 rounding)")


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("checkpoint")
    p.add_argument("vocab")
    p.add_argument("gguf")
    p.add_argument("--text", required=True,
                   help="text whose tokenization is compared")
    p.add_argument("--prompt", default="It is a truth universally")
    p.add_argument("-n", type=int, default=40, help="greedy tokens")
    args = p.parse_args()
    torch.set_num_threads(1)
    vocab = Vocab.load(args.vocab)
    checkpoint = torch.load(args.checkpoint, map_location="cpu")
    model = Llama(Config(**checkpoint["config"]))
    model.load_state_dict(checkpoint["model"])
    model.eval()
    check_tokenizer(vocab, args.gguf, args.text)
    check_logits(model, args.gguf,
                 [BOS_ID] + vocab.encode("It is a truth universally "
                                         "acknowledged, that a single man"))
    check_generation(model, vocab, args.gguf, args.prompt, args.n)


if __name__ == "__main__":
    main()
