#!/usr/bin/python3
"""Write a random-weight Llama model as a GGUF file.

Example:
    /usr/bin/python3 tools/make_model.py --out /tmp/tiny.gguf --preset tiny \
        --type q8_0

The weights depend only on --seed and the model shape: files that differ only
in --type (or --gguf-version, --alignment) hold the same model, merely stored
differently, and --tied only drops output.weight.  Tensors are generated and
written one at a time so memory stays bounded by the largest tensor.
"""

import argparse
import math
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gguf  # noqa: E402  (needs the path set up above)
from gguf import GGMLType, ValueType  # noqa: E402

PRESETS = {
    "tiny": dict(dim=64, n_layers=2, n_heads=4, n_kv_heads=2, ffn=192,
                 vocab=512, ctx=512),
    "stories15m": dict(dim=288, n_layers=6, n_heads=6, n_kv_heads=6, ffn=768,
                       vocab=32000, ctx=2048),
    "tinyllama": dict(dim=2048, n_layers=22, n_heads=32, n_kv_heads=4,
                      ffn=5632, vocab=32000, ctx=2048),
}

# --type name -> (tensor type of 2-D weights, llama.cpp general.file_type).
TYPES = {
    "f32": (GGMLType.F32, 0),
    "f16": (GGMLType.F16, 1),
    "q4_0": (GGMLType.Q4_0, 2),
    "q8_0": (GGMLType.Q8_0, 7),
    "bf16": (GGMLType.BF16, 32),
}

# SentencePiece token types.
TOKEN_NORMAL, TOKEN_UNKNOWN, TOKEN_CONTROL, TOKEN_BYTE = 1, 2, 3, 6
SPACE = "\u2581"  # SentencePiece's visible space, "▁"

# Common English words (story-flavoured) that get whole-word pieces.
WORDS = """
the and once upon time there was a little girl boy named she he it to of in
on with is for they her his said day one big happy very saw wanted play went
had not but so all you i that what mom dad friend dog cat tree sun ball park
house home came look looked like liked be were have then after up down out
from at this are can good new could would see go make made an as by we my
your them when will just about know into over some sad smiled help found
toy fun bird red blue
""".split()

# Common word endings and fragments (no leading space).
SUBWORDS = """
ing ed er ly es en th he in an re on at nd st or ou it is ar le al ion ent
ter ver est ay ow ll ss oo ee
""".split()

MIN_VOCAB = 3 + 256 + 1 + 94  # specials, bytes, "▁", printable ASCII


def build_vocab(n_vocab):
    """Return (tokens, scores, token_types) for a SentencePiece-style vocab.

    Multi-character pieces are added together with all their prefixes, so
    each one can be reached by merging a shorter piece with one character.
    Normal pieces score -id: earlier pieces are preferred.
    """
    if n_vocab < MIN_VOCAB:
        raise ValueError(f"vocab must be at least {MIN_VOCAB}, got {n_vocab}")
    tokens = ["<unk>", "<s>", "</s>"]
    types = [TOKEN_UNKNOWN, TOKEN_CONTROL, TOKEN_CONTROL]
    tokens += [f"<0x{b:02X}>" for b in range(256)]
    types += [TOKEN_BYTE] * 256

    normal = [SPACE] + [chr(c) for c in range(0x21, 0x7F)]
    normal += [SPACE + chr(c) for c in range(ord("a"), ord("z") + 1)]
    seen = set(tokens) | set(normal)

    def add_with_prefixes(piece):
        for end in range(2, len(piece) + 1):
            if piece[:end] not in seen:
                seen.add(piece[:end])
                normal.append(piece[:end])

    for word in WORDS:
        add_with_prefixes(SPACE + word)
    for sub in SUBWORDS:
        add_with_prefixes(sub)
    filler = 0
    while len(tokens) + len(normal) < n_vocab:
        piece = f"{SPACE}w{filler}"
        filler += 1
        if piece not in seen:
            seen.add(piece)
            normal.append(piece)

    tokens += normal
    del tokens[n_vocab:]
    types += [TOKEN_NORMAL] * (n_vocab - len(types))
    scores = [-float(i) if t == TOKEN_NORMAL else 0.0
              for i, t in enumerate(types)]
    return tokens, scores, types


def tensor_plan(cfg, tied):
    """(name, numpy shape) of every tensor, in generation and file order.

    output.weight comes last, so --tied leaves every other tensor unchanged.
    """
    dim, ffn = cfg["dim"], cfg["ffn"]
    head_dim = dim // cfg["n_heads"]
    q_dim = cfg["n_heads"] * head_dim
    kv_dim = cfg["n_kv_heads"] * head_dim
    plan = [("token_embd.weight", (cfg["vocab"], dim))]
    for i in range(cfg["n_layers"]):
        p = f"blk.{i}."
        plan += [
            (p + "attn_norm.weight", (dim,)),
            (p + "attn_q.weight", (q_dim, dim)),
            (p + "attn_k.weight", (kv_dim, dim)),
            (p + "attn_v.weight", (kv_dim, dim)),
            (p + "attn_output.weight", (dim, q_dim)),
            (p + "ffn_norm.weight", (dim,)),
            (p + "ffn_gate.weight", (ffn, dim)),
            (p + "ffn_up.weight", (ffn, dim)),
            (p + "ffn_down.weight", (dim, ffn)),
        ]
    plan.append(("output_norm.weight", (dim,)))
    if not tied:
        plan.append(("output.weight", (cfg["vocab"], dim)))
    return plan


def random_weight(rng, shape):
    """Norm weights: 1 + 0.1 N(0,1).  Matrices: N(0,1) / sqrt(n_in).

    The 1/sqrt(n_in) scale keeps every projection's output near unit RMS,
    so attention scores and logits come out roughly N(0,1): neither flat
    nor saturated.
    """
    if len(shape) == 1:
        w = rng.standard_normal(shape, dtype=np.float32)
        w *= np.float32(0.1)
        w += np.float32(1)
        return w
    w = rng.standard_normal(shape, dtype=np.float32)
    w *= np.float32(1 / math.sqrt(shape[1]))
    return w


def write_model(path, cfg, type_name, seed=0, tied=False, version=3,
                alignment=gguf.DEFAULT_ALIGNMENT):
    """Write the model described by `cfg` (see PRESETS; plus rope_base and
    rms_eps) to `path`."""
    weight_type, file_type = TYPES[type_name]
    head_dim = cfg["dim"] // cfg["n_heads"]
    tokens, scores, token_types = build_vocab(cfg["vocab"])
    plan = tensor_plan(cfg, tied)

    with gguf.GGUFWriter(path, version=version) as w:
        w.add_string("general.architecture", "llama")
        w.add_string("general.name", f"kvllm-random-{type_name}-seed{seed}")
        w.add_uint32(gguf.ALIGNMENT_KEY, alignment)
        w.add_uint32("general.file_type", file_type)
        w.add_uint32("llama.context_length", cfg["ctx"])
        w.add_uint32("llama.embedding_length", cfg["dim"])
        w.add_uint32("llama.block_count", cfg["n_layers"])
        w.add_uint32("llama.feed_forward_length", cfg["ffn"])
        w.add_uint32("llama.attention.head_count", cfg["n_heads"])
        w.add_uint32("llama.attention.head_count_kv", cfg["n_kv_heads"])
        w.add_uint32("llama.rope.dimension_count", head_dim)
        w.add_uint32("llama.vocab_size", cfg["vocab"])
        w.add_float32("llama.attention.layer_norm_rms_epsilon",
                      cfg["rms_eps"])
        w.add_float32("llama.rope.freq_base", cfg["rope_base"])
        if cfg.get("sliding_window"):
            w.add_uint32("llama.attention.sliding_window",
                         cfg["sliding_window"])
        w.add_string("tokenizer.ggml.model", "llama")
        w.add_array("tokenizer.ggml.tokens", tokens, ValueType.STRING)
        w.add_array("tokenizer.ggml.scores", scores, ValueType.FLOAT32)
        w.add_array("tokenizer.ggml.token_type", token_types,
                    ValueType.INT32)
        w.add_uint32("tokenizer.ggml.bos_token_id", 1)
        w.add_uint32("tokenizer.ggml.eos_token_id", 2)
        w.add_uint32("tokenizer.ggml.unknown_token_id", 0)
        w.add_bool("tokenizer.ggml.add_bos_token", True)
        w.add_bool("tokenizer.ggml.add_eos_token", False)

        for name, shape in plan:
            w.add_tensor_info(name, shape,
                              GGMLType.F32 if len(shape) == 1 else weight_type)
        w.write_header()

        rng = np.random.default_rng(seed)
        for name, shape in plan:
            w.write_tensor(name, random_weight(rng, shape))


def parse_args(argv):
    p = argparse.ArgumentParser(
        description="Write a random-weight Llama GGUF model.")
    p.add_argument("--out", required=True, help="output .gguf path")
    p.add_argument("--preset", choices=sorted(PRESETS), default="tiny",
                   help="base shape (default: tiny)")
    p.add_argument("--dim", type=int, help="embedding length")
    p.add_argument("--n-layers", type=int, help="number of blocks")
    p.add_argument("--n-heads", type=int, help="attention heads")
    p.add_argument("--n-kv-heads", type=int, help="key/value heads")
    p.add_argument("--ffn", type=int, help="feed-forward length")
    p.add_argument("--vocab", type=int, help="vocabulary size")
    p.add_argument("--ctx", type=int, help="context length")
    p.add_argument("--rope-base", type=float, default=10000.0)
    p.add_argument("--rms-eps", type=float, default=1e-5)
    p.add_argument("--type", choices=sorted(TYPES), default="f32",
                   help="storage type of the 2-D weights (default: f32)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--tied", action="store_true",
                   help="omit output.weight; logits reuse token_embd")
    p.add_argument("--gguf-version", type=int, choices=(2, 3), default=3)
    p.add_argument("--alignment", type=int, default=gguf.DEFAULT_ALIGNMENT)
    p.add_argument("--sliding-window", type=int, default=0,
                   help="declare llama.attention.sliding_window (0: none)")
    args = p.parse_args(argv)

    cfg = dict(PRESETS[args.preset])
    for key in cfg:
        if getattr(args, key) is not None:
            cfg[key] = getattr(args, key)
    cfg["rope_base"] = args.rope_base
    cfg["rms_eps"] = args.rms_eps

    if any(v <= 0 for v in cfg.values()):
        p.error("all sizes, --rope-base and --rms-eps must be positive")
    if cfg["dim"] % cfg["n_heads"]:
        p.error(f"--dim {cfg['dim']} is not a multiple of "
                f"--n-heads {cfg['n_heads']}")
    if cfg["n_heads"] % cfg["n_kv_heads"]:
        p.error(f"--n-heads {cfg['n_heads']} is not a multiple of "
                f"--n-kv-heads {cfg['n_kv_heads']}")
    if (cfg["dim"] // cfg["n_heads"]) % 2:
        p.error("the head size (dim / n_heads) must be even for RoPE")
    if cfg["vocab"] < MIN_VOCAB:
        p.error(f"--vocab must be at least {MIN_VOCAB}")
    if args.type in ("q8_0", "q4_0"):
        for flag, n in (("--dim", cfg["dim"]), ("--ffn", cfg["ffn"])):
            if n % gguf.QK:
                p.error(f"{flag} {n} must be a multiple of {gguf.QK} "
                        f"for --type {args.type}")
    if args.alignment <= 0 or args.alignment % 8:
        p.error("--alignment must be a positive multiple of 8")
    if args.sliding_window < 0:
        p.error("--sliding-window must not be negative")
    cfg["sliding_window"] = args.sliding_window
    return args, cfg


def main(argv=None):
    args, cfg = parse_args(argv)
    write_model(args.out, cfg, args.type, seed=args.seed, tied=args.tied,
                version=args.gguf_version, alignment=args.alignment)
    size = os.path.getsize(args.out)
    print(f"{args.out}: llama dim={cfg['dim']} layers={cfg['n_layers']} "
          f"heads={cfg['n_heads']}/{cfg['n_kv_heads']} ffn={cfg['ffn']} "
          f"vocab={cfg['vocab']} ctx={cfg['ctx']} type={args.type}"
          f"{' tied' if args.tied else ''} v{args.gguf_version} "
          f"size={size} bytes ({size / 2**20:.1f} MiB)")


if __name__ == "__main__":
    main()
