#!/usr/bin/python3
"""Trains the Llama model of model.py on the prepared Austen text.

Example:
    /usr/bin/python3 tools/train/train.py --data tools/train/data \
        --run tools/train/runs/main --minutes 40

Training runs for a wall-clock budget (--minutes) rather than a step count:
the machine's two cores are shared, so its speed varies, and the budget is
what must hold.  The learning rate warms up linearly, then follows a cosine
over the fraction of the budget spent, down to 10% of its peak.

Writes to the run folder: log.csv (step, tokens, seconds, lr, train loss
averaged over the last steps, and held-out loss where evaluated), model.pt
(config and weights, saved at every evaluation) and summary.json.
"""

import argparse
import csv
import dataclasses
import json
import math
import os
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from model import Config, Llama  # noqa: E402
from tokenizer import BOS_ID, SPACE, Vocab  # noqa: E402

# Windows evaluated for the held-out (and matching train) loss estimate.
EVAL_WINDOWS = 16


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data", required=True,
                   help="folder with train.txt, heldout.txt, vocab.json")
    p.add_argument("--run", required=True, help="output folder")
    p.add_argument("--minutes", type=float, required=True,
                   help="wall-clock training budget")
    p.add_argument("--dim", type=int, default=256)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--kv-heads", type=int, default=2)
    p.add_argument("--ffn", type=int, default=688)
    p.add_argument("--ctx", type=int, default=512,
                   help="context length, and the training window length")
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--warmup", type=int, default=30, help="warm-up steps")
    p.add_argument("--eval-every", type=int, default=50)
    p.add_argument("--seed", type=int, default=1)
    # One thread by default: with the two cores shared with compiles, two
    # threads measured half as fast as one (threads wait on each other).
    p.add_argument("--threads", type=int, default=1)
    return p.parse_args()


class Windows:
    """Training windows: BOS, then `seq` tokens of the text that start at a
    word (a piece beginning with "▁"), as a kvllm prompt does."""

    def __init__(self, ids, vocab, seq):
        self.ids = torch.tensor(ids, dtype=torch.long)
        self.seq = seq
        starts_word = np.array([p.startswith(SPACE) for p in vocab.pieces])
        ids_np = np.asarray(ids)
        self.starts = np.nonzero(starts_word[ids_np])[0]
        self.starts = self.starts[self.starts + seq <= len(ids)]

    def batch(self, starts):
        """Inputs (B, seq) beginning with BOS; targets (B, seq)."""
        rows = [self.ids[s:s + self.seq] for s in starts]
        text = torch.stack(rows)
        bos = torch.full((len(rows), 1), BOS_ID, dtype=torch.long)
        inputs = torch.cat([bos, text[:, :-1]], dim=1)
        return inputs, text

    def sample(self, rng, n):
        return self.batch(rng.choice(self.starts, size=n))

    def spread(self, n):
        """n windows evenly spread over the text, for stable evaluation."""
        return self.batch(self.starts[np.linspace(
            0, len(self.starts) - 1, n).astype(int)])


@torch.no_grad()
def evaluate(model, batch):
    model.eval()
    inputs, targets = batch
    losses = []
    for i in range(0, len(inputs), 8):
        logits = model(inputs[i:i + 8])
        losses.append(F.cross_entropy(logits.flatten(0, 1),
                                      targets[i:i + 8].flatten(),
                                      reduction="sum").item())
    model.train()
    return sum(losses) / targets.numel()


def lr_at(args, step, fraction):
    """Linear warm-up, then cosine over the spent budget to 10% of peak."""
    if step < args.warmup:
        return args.lr * (step + 1) / args.warmup
    return args.lr * (0.1 + 0.45 * (1 + math.cos(math.pi * min(fraction, 1))))


def main():
    args = parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    rng = np.random.default_rng(args.seed)
    os.makedirs(args.run, exist_ok=True)

    vocab = Vocab.load(os.path.join(args.data, "vocab.json"))

    def windows(name):
        with open(os.path.join(args.data, name), encoding="utf-8") as f:
            return Windows(vocab.encode(f.read()), vocab, args.ctx)

    train, heldout = windows("train.txt"), windows("heldout.txt")
    train_eval = train.spread(EVAL_WINDOWS)
    heldout_eval = heldout.spread(EVAL_WINDOWS)

    cfg = Config(vocab=len(vocab), dim=args.dim, n_layers=args.layers,
                 n_heads=args.heads, n_kv_heads=args.kv_heads, ffn=args.ffn,
                 ctx=args.ctx)
    model = Llama(cfg)
    n_params = sum(p.numel() for p in model.parameters())
    print(f"train: {n_params / 1e6:.2f}M parameters, {len(train.ids)} train "
          f"and {len(heldout.ids)} held-out tokens", flush=True)

    # Weight decay on matrices only; norms' gains stay free.
    decay = [p for p in model.parameters() if p.dim() == 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=args.lr, betas=(0.9, 0.95))

    def save(step, tokens, elapsed, train_loss, heldout_loss):
        torch.save({"config": dataclasses.asdict(cfg),
                    "model": model.state_dict()},
                   os.path.join(args.run, "model.pt"))
        with open(os.path.join(args.run, "summary.json"), "w") as f:
            json.dump({"parameters": n_params, "steps": step,
                       "tokens_seen": tokens, "seconds": round(elapsed),
                       "train_loss": train_loss,
                       "heldout_loss": heldout_loss,
                       "args": vars(args)}, f, indent=2)

    log = open(os.path.join(args.run, "log.csv"), "w", newline="")
    writer = csv.writer(log)
    writer.writerow(["step", "tokens", "seconds", "lr", "train_loss",
                     "heldout_loss"])
    budget = args.minutes * 60
    start = time.time()
    recent = []
    step = tokens = 0
    while True:
        elapsed = time.time() - start
        done = elapsed >= budget
        if done or step % args.eval_every == 0:
            train_loss = evaluate(model, train_eval)
            heldout_loss = evaluate(model, heldout_eval)
            writer.writerow([step, tokens, round(elapsed, 1), "",
                             f"{train_loss:.4f}", f"{heldout_loss:.4f}"])
            log.flush()
            print(f"step {step} ({elapsed:.0f}s): train {train_loss:.3f} "
                  f"held-out {heldout_loss:.3f}", flush=True)
            save(step, tokens, elapsed, train_loss, heldout_loss)
        if done:
            break

        lr = lr_at(args, step, elapsed / budget)
        for group in opt.param_groups:
            group["lr"] = lr
        inputs, targets = train.sample(rng, args.batch)
        logits = model(inputs)
        loss = F.cross_entropy(logits.flatten(0, 1), targets.flatten())
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        step += 1
        tokens += targets.numel()
        recent.append(loss.item())
        if step % 10 == 0:
            # Mean over the last 10 steps: the batch loss alone is noisy.
            writer.writerow([step, tokens, round(time.time() - start, 1),
                             f"{lr:.6f}", f"{np.mean(recent):.4f}", ""])
            log.flush()
            print(f"step {step}: loss {np.mean(recent):.3f} lr {lr:.2e}",
                  flush=True)
            recent = []
    log.close()


if __name__ == "__main__":
    main()
