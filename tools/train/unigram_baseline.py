#!/usr/bin/python3
"""Perplexity of a unigram model on the held-out text: the bar to beat.

Example:
    /usr/bin/python3 tools/train/unigram_baseline.py tools/train/data

Token frequencies are counted on train.txt with tokenizer.py (the tokenizer
kvllm uses), smoothed by adding one to every vocabulary entry's count, and
scored on heldout.txt's tokens (no BOS), so the number is comparable with the
model's per-token held-out perplexity.
"""

import argparse
import math
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from tokenizer import Vocab  # noqa: E402


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("data", help="folder with train.txt, heldout.txt, "
                                "vocab.json")
    args = p.parse_args()
    vocab = Vocab.load(os.path.join(args.data, "vocab.json"))

    def encode(name):
        with open(os.path.join(args.data, name), encoding="utf-8") as f:
            return np.array(vocab.encode(f.read()))

    counts = np.bincount(encode("train.txt"), minlength=len(vocab)) + 1.0
    log_p = np.log(counts / counts.sum())
    heldout = encode("heldout.txt")
    nll = -log_p[heldout].mean()
    print(f"unigram baseline: {len(heldout)} held-out tokens, "
          f"cross-entropy {nll:.4f} nats/token, "
          f"perplexity {math.exp(nll):.1f}")


if __name__ == "__main__":
    main()
