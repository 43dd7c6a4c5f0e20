#!/usr/bin/python3
"""Plots the train and held-out loss of a run's log.csv to a PNG.

Example:
    /usr/bin/python3 tools/train/plot_loss.py tools/train/runs/main/log.csv \
        models/kvllm-prose-loss.png
"""

import argparse
import csv

import matplotlib

matplotlib.use("Agg")  # no display: write files only
import matplotlib.pyplot as plt  # noqa: E402


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("log", help="log.csv written by train.py")
    p.add_argument("out", help="PNG to write")
    args = p.parse_args()
    with open(args.log, newline="") as f:
        rows = list(csv.DictReader(f))
    # Batch losses (mean of 10 steps) and periodic evaluations share the log.
    batch = [(int(r["tokens"]) / 1e6, float(r["train_loss"]))
             for r in rows if r["lr"]]
    evals = [(int(r["tokens"]) / 1e6, float(r["train_loss"]),
              float(r["heldout_loss"])) for r in rows if r["heldout_loss"]]

    fig, ax = plt.subplots(figsize=(7, 4.5), dpi=100)
    ax.plot(*zip(*batch), color="tab:blue", alpha=0.35, lw=1,
            label="train (batch, mean of 10 steps)")
    ax.plot([e[0] for e in evals], [e[1] for e in evals], "o-",
            color="tab:blue", ms=3, label="train (eval windows)")
    ax.plot([e[0] for e in evals], [e[2] for e in evals], "o-",
            color="tab:orange", ms=3, label="held-out: Persuasion")
    ax.set_xlabel("training tokens (millions)")
    ax.set_ylabel("cross-entropy (nats / token)")
    ax.set_title("kvllm-prose training loss")
    ax.set_ylim(bottom=min(e[2] for e in evals) - 0.5,
                top=min(8.5, max(b[1] for b in batch) + 0.2))
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(args.out)
    print(f"plot_loss: wrote {args.out}")


if __name__ == "__main__":
    main()
