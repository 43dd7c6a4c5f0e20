#!/usr/bin/python3
"""Exports a trained checkpoint and its vocabulary as a GGUF llama model.

Example:
    /usr/bin/python3 tools/train/export_gguf.py \
        tools/train/runs/main/model.pt tools/train/data/vocab.json \
        models/kvllm-prose.gguf

Matrices are stored as F16 and norm gains as F32.  A torch Linear weight of
shape (out, in) goes to tools/gguf.py as is, which stores it with
ne = [in, out], the layout kvllm and llama.cpp expect.  model.py's RoPE
already uses GGUF's adjacent-pair layout, so q and k need no permutation.
"""

import argparse
import os
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(HERE))
import gguf  # noqa: E402  (tools/gguf.py)
from gguf import GGMLType, ValueType  # noqa: E402
from model import Config  # noqa: E402
from tokenizer import BOS_ID, EOS_ID, UNK_ID, Vocab  # noqa: E402

# llama.cpp's general.file_type for "mostly F16".
FILE_TYPE_MOSTLY_F16 = 1

# GGUF tensor name of each parameter of model.Block, per layer.
BLOCK_TENSORS = {
    "attn_norm.weight": "attn_norm",
    "attn_q.weight": "wq.weight",
    "attn_k.weight": "wk.weight",
    "attn_v.weight": "wv.weight",
    "attn_output.weight": "wo.weight",
    "ffn_norm.weight": "ffn_norm",
    "ffn_gate.weight": "gate.weight",
    "ffn_up.weight": "up.weight",
    "ffn_down.weight": "down.weight",
}


def tensors(cfg, state):
    """(GGUF name, float32 numpy array) in file order."""
    yield "token_embd.weight", state["embed.weight"]
    for layer in range(cfg.n_layers):
        for gguf_name, torch_name in BLOCK_TENSORS.items():
            if not torch_name.endswith(".weight"):
                torch_name += ".weight"  # RMSNorm gains
            yield (f"blk.{layer}.{gguf_name}",
                   state[f"blocks.{layer}.{torch_name}"])
    yield "output_norm.weight", state["norm.weight"]
    yield "output.weight", state["output.weight"]


def export(checkpoint, vocab, path, name):
    cfg = Config(**checkpoint["config"])
    state = {k: v.float().numpy() for k, v in checkpoint["model"].items()}
    plan = list(tensors(cfg, state))
    with gguf.GGUFWriter(path) as w:
        w.add_string("general.architecture", "llama")
        w.add_string("general.name", name)
        w.add_string("general.license", "MIT")
        w.add_uint32("general.file_type", FILE_TYPE_MOSTLY_F16)
        w.add_uint32("llama.context_length", cfg.ctx)
        w.add_uint32("llama.embedding_length", cfg.dim)
        w.add_uint32("llama.block_count", cfg.n_layers)
        w.add_uint32("llama.feed_forward_length", cfg.ffn)
        w.add_uint32("llama.attention.head_count", cfg.n_heads)
        w.add_uint32("llama.attention.head_count_kv", cfg.n_kv_heads)
        w.add_uint32("llama.rope.dimension_count", cfg.head_dim)
        w.add_float32("llama.attention.layer_norm_rms_epsilon", cfg.rms_eps)
        w.add_float32("llama.rope.freq_base", cfg.rope_base)
        w.add_uint32("llama.vocab_size", cfg.vocab)
        w.add_string("tokenizer.ggml.model", "llama")
        w.add_array("tokenizer.ggml.tokens", vocab.pieces, ValueType.STRING)
        w.add_array("tokenizer.ggml.scores", vocab.scores, ValueType.FLOAT32)
        w.add_array("tokenizer.ggml.token_type", vocab.types, ValueType.INT32)
        w.add_uint32("tokenizer.ggml.bos_token_id", BOS_ID)
        w.add_uint32("tokenizer.ggml.eos_token_id", EOS_ID)
        w.add_uint32("tokenizer.ggml.unknown_token_id", UNK_ID)
        w.add_bool("tokenizer.ggml.add_bos_token", True)
        w.add_bool("tokenizer.ggml.add_eos_token", False)
        for tname, array in plan:
            w.add_tensor_info(tname, array.shape, GGMLType.F32
                              if array.ndim == 1 else GGMLType.F16)
        w.write_header()
        for tname, array in plan:
            w.write_tensor(tname, array)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("checkpoint", help="model.pt written by train.py")
    p.add_argument("vocab", help="vocab.json written by train_tokenizer.py")
    p.add_argument("out", help="GGUF file to write")
    p.add_argument("--name", default="kvllm-prose")
    args = p.parse_args()
    checkpoint = torch.load(args.checkpoint, map_location="cpu")
    export(checkpoint, Vocab.load(args.vocab), args.out, args.name)
    print(f"export_gguf: wrote {args.out} "
          f"({os.path.getsize(args.out) / 1e6:.1f} MB)")


if __name__ == "__main__":
    main()
