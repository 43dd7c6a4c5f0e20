#!/usr/bin/python3
"""Independent float64 Llama forward pass over a GGUF file.

Example:
    /usr/bin/python3 tools/reference.py model.gguf --tokens 1,15,27 [--all]

Prints JSON: {"n_vocab": N, "positions": [...], "logits": [[...], ...]} with
the logits of the last position, or of every position with --all.  The file
is read with tools/gguf.py only, so this is a check on kvllm that shares no
code with it.  Weights are decoded to float64 one matrix at a time (large
matrices in row chunks), which keeps memory modest even for 1B models.
Activations multiplied with Q8_0 and Q4_0 matrices are first rounded to 8
bits per 32 values, as kvllm and llama.cpp do (quantize_activations).
"""

import argparse
import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gguf  # noqa: E402  (needs the path set up above)

# Rows decoded at a time when multiplying by a weight matrix.
ROW_CHUNK = 4096


class ModelError(Exception):
    """The file is not a model this reference can run."""


class LlamaConfig:
    """Hyperparameters from llama.* metadata, with llama.cpp's defaults."""

    def __init__(self, reader):
        meta = reader.metadata
        arch = meta.get("general.architecture")
        if arch != "llama":
            raise ModelError(f"unsupported architecture {arch!r} "
                             "(only 'llama' is supported)")

        def need(key):
            if key not in meta:
                raise ModelError(f"missing metadata {key!r}")
            return meta[key]

        self.n_embd = need("llama.embedding_length")
        self.n_layers = need("llama.block_count")
        self.n_head = need("llama.attention.head_count")
        self.n_kv_head = meta.get("llama.attention.head_count_kv",
                                  self.n_head)
        self.eps = need("llama.attention.layer_norm_rms_epsilon")
        self.rope_base = meta.get("llama.rope.freq_base", 10000.0)
        self.head_dim = self.n_embd // self.n_head
        self.n_rot = meta.get("llama.rope.dimension_count", self.head_dim)
        if self.n_head % self.n_kv_head:
            raise ModelError(f"{self.n_head} heads are not a multiple of "
                             f"{self.n_kv_head} key/value heads")
        if self.n_rot % 2 or self.n_rot > self.head_dim:
            raise ModelError(f"invalid rope.dimension_count {self.n_rot}")
        if self.n_embd % self.n_head:
            raise ModelError(f"embedding length {self.n_embd} is not a "
                             f"multiple of {self.n_head} heads")
        if "token_embd.weight" not in reader.tensors:
            raise ModelError("missing tensor 'token_embd.weight'")
        self.n_vocab = reader.tensors["token_embd.weight"].shape[0]


def rms_norm(x, weight, eps):
    """x / sqrt(mean(x^2) + eps) * weight, over the last axis."""
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * weight


def rope(x, positions, n_rot, base):
    """Rotate adjacent pairs (x[2i], x[2i+1]), 2i < n_rot, of every head.

    x has shape (n_tokens, n_heads, head_dim); pair i of the token at
    position p turns by angle p * base^(-2i / n_rot).
    """
    i = np.arange(n_rot // 2)
    theta = np.outer(positions, base ** (-2.0 * i / n_rot))
    cos = np.cos(theta)[:, None, :]
    sin = np.sin(theta)[:, None, :]
    x0 = x[..., 0:n_rot:2]
    x1 = x[..., 1:n_rot:2]
    out = x.copy()
    out[..., 0:n_rot:2] = x0 * cos - x1 * sin
    out[..., 1:n_rot:2] = x0 * sin + x1 * cos
    return out


def silu(a):
    return a / (1.0 + np.exp(-a))


def softmax(a):
    e = np.exp(a - a.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def attention(q, k, v, n_head, n_kv_head):
    """Causal multi-head attention with grouped key/value heads.

    q: (T, n_head, d); k, v: (T, n_kv_head, d).  Returns (T, n_head * d).
    Query head h reads key/value head h // (n_head / n_kv_head).
    """
    t, _, d = q.shape
    group = n_head // n_kv_head
    k = np.repeat(k, group, axis=1)
    v = np.repeat(v, group, axis=1)
    scores = np.einsum("qhd,khd->hqk", q, k) / np.sqrt(d)
    future = np.triu(np.ones((t, t), dtype=bool), k=1)
    scores[:, future] = -np.inf
    out = np.einsum("hqk,khd->qhd", softmax(scores), v)
    return out.reshape(t, n_head * d)


def quantize_activations(x):
    """x as kvllm multiplies it with Q8_0 and Q4_0 weights (as llama.cpp does): each run of
    32 values rounded to int8 steps of d = max|x| / 127, in float32 as the engine computes."""
    t, n = x.shape
    blocks = x.astype(np.float32).reshape(t, n // gguf.QK, gguf.QK)
    d = np.abs(blocks).max(axis=2, keepdims=True) / np.float32(127)
    with np.errstate(divide="ignore"):
        inv = np.where(d != 0, np.float32(1) / d, np.float32(0)).astype(np.float32)
    q = np.rint(blocks * inv)
    return (q * d.astype(np.float64)).reshape(t, n)


class Weights:
    """Decodes tensors on demand, so only the matrix in use is in memory."""

    def __init__(self, reader):
        self.reader = reader

    def vector(self, name):
        return self.reader.tensor(self._check(name))

    def matmul(self, name, x):
        """x @ W.T for W of shape (n_out, n_in); x has shape (T, n_in)."""
        info = self.reader.tensors[self._check(name)]
        if info.ggml_type in (gguf.GGMLType.Q8_0, gguf.GGMLType.Q4_0):
            x = quantize_activations(x)
        n_out = info.shape[0]
        out = np.empty((x.shape[0], n_out))
        for start in range(0, n_out, ROW_CHUNK):
            rows = slice(start, min(start + ROW_CHUNK, n_out))
            out[:, rows] = x @ self.reader.tensor(name, rows).T
        return out

    def _check(self, name):
        if name not in self.reader.tensors:
            raise ModelError(f"missing tensor {name!r}")
        return name


def forward(reader, tokens):
    """Logits (len(tokens), n_vocab) for tokens at positions 0, 1, ..."""
    cfg = LlamaConfig(reader)
    tokens = np.asarray(tokens, dtype=np.int64)
    if tokens.ndim != 1 or len(tokens) == 0:
        raise ValueError("need a non-empty list of tokens")
    bad = tokens[(tokens < 0) | (tokens >= cfg.n_vocab)]
    if len(bad):
        raise ValueError(f"token {bad[0]} is outside the vocabulary "
                         f"[0, {cfg.n_vocab})")
    w = Weights(reader)
    positions = np.arange(len(tokens))
    t, hd = len(tokens), cfg.head_dim

    x = reader.tensor("token_embd.weight", tokens)
    for layer in range(cfg.n_layers):
        p = f"blk.{layer}."
        h = rms_norm(x, w.vector(p + "attn_norm.weight"), cfg.eps)
        q = w.matmul(p + "attn_q.weight", h).reshape(t, cfg.n_head, hd)
        k = w.matmul(p + "attn_k.weight", h).reshape(t, cfg.n_kv_head, hd)
        v = w.matmul(p + "attn_v.weight", h).reshape(t, cfg.n_kv_head, hd)
        q = rope(q, positions, cfg.n_rot, cfg.rope_base)
        k = rope(k, positions, cfg.n_rot, cfg.rope_base)
        attn = attention(q, k, v, cfg.n_head, cfg.n_kv_head)
        x = x + w.matmul(p + "attn_output.weight", attn)

        h = rms_norm(x, w.vector(p + "ffn_norm.weight"), cfg.eps)
        gate = w.matmul(p + "ffn_gate.weight", h)
        up = w.matmul(p + "ffn_up.weight", h)
        x = x + w.matmul(p + "ffn_down.weight", silu(gate) * up)

    h = rms_norm(x, w.vector("output_norm.weight"), cfg.eps)
    out_name = ("output.weight" if "output.weight" in reader.tensors
                else "token_embd.weight")
    return w.matmul(out_name, h)


def parse_tokens(text):
    try:
        return [int(s) for s in text.split(",") if s.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected comma-separated integers, got {text!r}") from None


def main(argv=None):
    p = argparse.ArgumentParser(
        description="Reference float64 Llama forward pass over a GGUF file.")
    p.add_argument("model", help="GGUF model file")
    p.add_argument("--tokens", required=True, type=parse_tokens,
                   help="comma-separated token ids, e.g. 1,15,27")
    p.add_argument("--all", action="store_true",
                   help="print the logits of every position, not just the "
                        "last")
    args = p.parse_args(argv)
    try:
        logits = forward(gguf.GGUFReader(args.model), args.tokens)
    except (gguf.GGUFError, ModelError, ValueError, OSError) as e:
        sys.exit(f"reference.py: error: {e}")
    positions = list(range(len(args.tokens)))
    if not args.all:
        positions, logits = positions[-1:], logits[-1:]
    json.dump({"n_vocab": logits.shape[1], "positions": positions,
               "logits": logits.tolist()}, sys.stdout)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
