#!/usr/bin/python3
"""Learns a BPE vocabulary for kvllm's SentencePiece-style tokenizer.

Example:
    /usr/bin/python3 tools/train/train_tokenizer.py \
        tools/train/data/train.txt tools/train/runs/vocab.json --size 4096

Layout of the vocabulary (what GGUF "llama" vocabularies use):
    0 <unk> (unknown), 1 <s>, 2 </s> (control), 3..258 <0x00>..<0xFF>
    (byte fallback), then normal pieces: every character of the training
    text (including "\n", so the model can write line breaks as one token),
    then the merged pieces in the order they were learned.
A normal piece's score is minus its id, so earlier merges win in kvllm's
highest-score-first merging, as they do in BPE.
"""

import argparse
import collections
import time

from tokenizer import (BOS_ID, EOS_ID, TYPE_BYTE, TYPE_CONTROL, TYPE_NORMAL,
                       TYPE_UNKNOWN, UNK_ID, Vocab, chunks, normalize)


def count_words(text):
    """Frequency of each chunk ("word") of the normalized text."""
    return collections.Counter(chunks(normalize(text)))


def learn_merges(word_counts, n_merges, known):
    """Greedy BPE over a word-frequency table.

    Returns the merged pieces in learned order, skipping concatenations that
    are already pieces (two merges can spell the same string, and a
    vocabulary must not hold a piece twice), until `n_merges` new pieces
    exist.  Pair counts are updated incrementally from the words a merge
    touches, so each merge costs time in proportion to those words only.
    """
    words = [list(w) for w in word_counts]
    freqs = list(word_counts.values())
    pair_counts = collections.Counter()
    where = collections.defaultdict(set)  # pair -> indices of words with it
    for i, (w, f) in enumerate(zip(words, freqs)):
        for pair in zip(w, w[1:]):
            pair_counts[pair] += f
            where[pair].add(i)

    new_pieces = []
    seen = set(known)
    while len(new_pieces) < n_merges and pair_counts:
        best = max(pair_counts, key=pair_counts.get)
        if pair_counts[best] < 2:
            break  # nothing left worth a token
        a, b = best
        merged = a + b
        if merged not in seen:
            seen.add(merged)
            new_pieces.append(merged)
        for i in where.pop(best):
            w, f = words[i], freqs[i]
            for pair in zip(w, w[1:]):
                pair_counts[pair] -= f
                if pair_counts[pair] <= 0:
                    del pair_counts[pair]
            out = []
            j = 0
            while j < len(w):
                if j + 1 < len(w) and w[j] == a and w[j + 1] == b:
                    out.append(merged)
                    j += 2
                else:
                    out.append(w[j])
                    j += 1
            words[i] = out
            for pair in zip(out, out[1:]):
                pair_counts[pair] += f
                where[pair].add(i)
    return new_pieces


def build_vocab(text, size):
    pieces = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)]
    types = [TYPE_UNKNOWN, TYPE_CONTROL, TYPE_CONTROL] + [TYPE_BYTE] * 256
    assert (pieces[UNK_ID], pieces[BOS_ID], pieces[EOS_ID]) == (
        "<unk>", "<s>", "</s>")
    word_counts = count_words(text)
    chars = sorted({c for w in word_counts for c in w})
    n_merges = size - len(pieces) - len(chars)
    if n_merges < 0:
        raise SystemExit(f"vocabulary size {size} is too small for "
                         f"{len(chars)} characters")
    merges = learn_merges(word_counts, n_merges, chars)
    normal = chars + merges
    pieces += normal
    types += [TYPE_NORMAL] * len(normal)
    # Specials and bytes never take part in merging, so their score is moot.
    scores = [0.0] * (len(pieces) - len(normal))
    scores += [-float(i) for i in range(len(pieces) - len(normal),
                                        len(pieces))]
    return Vocab(pieces, scores, types)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("train_text", help="UTF-8 training text")
    p.add_argument("out", help="vocabulary JSON to write")
    p.add_argument("--size", type=int, default=4096,
                   help="total number of tokens (default 4096)")
    args = p.parse_args()
    start = time.time()
    with open(args.train_text, encoding="utf-8") as f:
        text = f.read()
    vocab = build_vocab(text, args.size)
    vocab.save(args.out)
    print(f"train_tokenizer: {len(vocab)} tokens in "
          f"{time.time() - start:.1f}s -> {args.out}")


if __name__ == "__main__":
    main()
