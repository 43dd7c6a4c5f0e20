"""The Llama model kvllm runs, in PyTorch, laid out as GGUF stores it.

RoPE rotates adjacent pairs (x[2i], x[2i+1]) of each head, the layout of
GGUF llama files (and of tools/reference.py), so the trained q/k weights are
exported as they are, with no permutation.
"""

import dataclasses
import math

import torch
import torch.nn.functional as F
from torch import nn


@dataclasses.dataclass
class Config:
    vocab: int = 4096
    dim: int = 256
    n_layers: int = 6
    n_heads: int = 8
    n_kv_heads: int = 2
    ffn: int = 768
    ctx: int = 512
    rope_base: float = 10000.0
    rms_eps: float = 1e-5

    @property
    def head_dim(self):
        return self.dim // self.n_heads


class RMSNorm(nn.Module):
    def __init__(self, dim, eps):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) \
            * self.weight


def rope_tables(cfg, n_positions):
    """cos, sin of angle p * base^(-2i / head_dim); shape (T, head_dim/2)."""
    i = torch.arange(cfg.head_dim // 2, dtype=torch.float64)
    inv_freq = cfg.rope_base ** (-2.0 * i / cfg.head_dim)
    angles = torch.outer(torch.arange(n_positions, dtype=torch.float64),
                         inv_freq)
    return angles.cos().float(), angles.sin().float()


def apply_rope(x, cos, sin):
    """Rotates adjacent pairs of x, shape (B, heads, T, head_dim)."""
    x0, x1 = x[..., 0::2], x[..., 1::2]
    out = torch.stack((x0 * cos - x1 * sin, x0 * sin + x1 * cos), dim=-1)
    return out.flatten(-2)


class Block(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.cfg = cfg
        kv_dim = cfg.n_kv_heads * cfg.head_dim
        self.attn_norm = RMSNorm(cfg.dim, cfg.rms_eps)
        self.wq = nn.Linear(cfg.dim, cfg.dim, bias=False)
        self.wk = nn.Linear(cfg.dim, kv_dim, bias=False)
        self.wv = nn.Linear(cfg.dim, kv_dim, bias=False)
        self.wo = nn.Linear(cfg.dim, cfg.dim, bias=False)
        self.ffn_norm = RMSNorm(cfg.dim, cfg.rms_eps)
        self.gate = nn.Linear(cfg.dim, cfg.ffn, bias=False)
        self.up = nn.Linear(cfg.dim, cfg.ffn, bias=False)
        self.down = nn.Linear(cfg.ffn, cfg.dim, bias=False)

    @staticmethod
    def future_mask(t):
        """True where a query (row) would see a later key (column)."""
        return torch.ones(t, t, dtype=torch.bool).triu(1)

    def forward(self, x, cos, sin):
        cfg = self.cfg
        b, t, _ = x.shape
        h = self.attn_norm(x)
        q = self.wq(h).view(b, t, cfg.n_heads, cfg.head_dim).transpose(1, 2)
        k = self.wk(h).view(b, t, cfg.n_kv_heads, cfg.head_dim).transpose(1, 2)
        v = self.wv(h).view(b, t, cfg.n_kv_heads, cfg.head_dim).transpose(1, 2)
        q = apply_rope(q, cos, sin)
        k = apply_rope(k, cos, sin)
        # Query head h reads key/value head h // group, as kvllm does.
        group = cfg.n_heads // cfg.n_kv_heads
        k = k.repeat_interleave(group, dim=1)
        v = v.repeat_interleave(group, dim=1)
        scores = (q @ k.transpose(-2, -1)) / math.sqrt(cfg.head_dim)
        scores = scores.masked_fill(self.future_mask(t), float("-inf"))
        attn = scores.softmax(-1) @ v
        x = x + self.wo(attn.transpose(1, 2).reshape(b, t, cfg.dim))
        h = self.ffn_norm(x)
        return x + self.down(F.silu(self.gate(h)) * self.up(h))


class Llama(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.cfg = cfg
        self.embed = nn.Embedding(cfg.vocab, cfg.dim)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layers))
        self.norm = RMSNorm(cfg.dim, cfg.rms_eps)
        self.output = nn.Linear(cfg.dim, cfg.vocab, bias=False)
        cos, sin = rope_tables(cfg, cfg.ctx)
        self.register_buffer("cos", cos, persistent=False)
        self.register_buffer("sin", sin, persistent=False)
        self._init_weights()

    def _init_weights(self):
        # GPT-2 style: small normal weights, with the projections that write
        # into the residual stream scaled down by depth so it stays stable.
        for name, p in self.named_parameters():
            if p.dim() == 2:
                std = 0.02
                if name.endswith(("wo.weight", "down.weight")):
                    std /= math.sqrt(2 * self.cfg.n_layers)
                nn.init.normal_(p, std=std)

    def forward(self, tokens):
        """Logits (B, T, vocab) for tokens (B, T) at positions 0..T-1."""
        t = tokens.shape[1]
        x = self.embed(tokens)
        cos, sin = self.cos[:t], self.sin[:t]
        for block in self.blocks:
            x = block(x, cos, sin)
        return self.output(self.norm(x))
