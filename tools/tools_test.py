#!/usr/bin/python3
"""Tests for tools/gguf.py, tools/make_model.py and tools/reference.py.

Run with:  /usr/bin/python3 tools/tools_test.py
      or:  /usr/bin/python3 -m unittest tools/tools_test.py
"""

import contextlib
import io
import json
import os
import struct
import subprocess
import sys
import tempfile
import unittest

import numpy as np

TOOLS = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, TOOLS)
import gguf  # noqa: E402
import make_model  # noqa: E402
import reference  # noqa: E402
from gguf import GGMLType, ValueType  # noqa: E402

TYPE_OF = {"f32": GGMLType.F32, "f16": GGMLType.F16, "bf16": GGMLType.BF16,
           "q8_0": GGMLType.Q8_0, "q4_0": GGMLType.Q4_0}


class TempDirTest(unittest.TestCase):
    def setUp(self):
        self._tmp = tempfile.TemporaryDirectory()
        self.dir = self._tmp.name
        self.addCleanup(self._tmp.cleanup)

    def make(self, name, *flags):
        """Run make_model with `flags`; return the written file's path."""
        path = os.path.join(self.dir, name)
        with contextlib.redirect_stdout(io.StringIO()):
            make_model.main(["--out", path, *flags])
        return path


class WriterReaderTest(TempDirTest):
    METADATA = [
        ("u8", 200, ValueType.UINT8),
        ("i8", -100, ValueType.INT8),
        ("u16", 60000, ValueType.UINT16),
        ("i16", -30000, ValueType.INT16),
        ("u32", 4000000000, ValueType.UINT32),
        ("i32", -2000000000, ValueType.INT32),
        ("f32", 0.5, ValueType.FLOAT32),
        ("bool.t", True, ValueType.BOOL),
        ("bool.f", False, ValueType.BOOL),
        ("str", "h\u00e9llo \u2581w\u00f6rld", ValueType.STRING),
        ("u64", 2**63 + 5, ValueType.UINT64),
        ("i64", -2**62, ValueType.INT64),
        ("f64", 1 / 3, ValueType.FLOAT64),
        ("arr.i32", [1, -2, 3], (ValueType.ARRAY, ValueType.INT32)),
        ("arr.f32", [0.25, -1.5], (ValueType.ARRAY, ValueType.FLOAT32)),
        ("arr.bool", [True, False], (ValueType.ARRAY, ValueType.BOOL)),
        ("arr.str", ["a", "", "\u2581b"], (ValueType.ARRAY, ValueType.STRING)),
        ("arr.empty", [], (ValueType.ARRAY, ValueType.UINT8)),
        ("arr.nested", [[1, 2], [], [3]],
         (ValueType.ARRAY, (ValueType.ARRAY, ValueType.UINT64))),
    ]

    def write(self, path, version, alignment):
        vec = np.arange(5, dtype=np.float32)
        mat = np.linspace(-1, 1, 3 * 64, dtype=np.float32).reshape(3, 64)
        with gguf.GGUFWriter(path, version=version) as w:
            w.add_uint32(gguf.ALIGNMENT_KEY, alignment)
            for key, value, vtype in self.METADATA:
                w.add(key, value, vtype)
            w.add_tensor_info("vec", vec.shape, GGMLType.F32)
            w.add_tensor_info("mat", mat.shape, GGMLType.F16)
            w.add_tensor_info("q", mat.shape, GGMLType.Q8_0)
            w.write_header()
            w.write_tensor("vec", vec)
            w.write_tensor("mat", mat)
            w.write_tensor("q", mat)
        return vec, mat

    def test_round_trip_all_value_types_and_versions(self):
        for version in (2, 3):
            for alignment in (32, 64):
                with self.subTest(version=version, alignment=alignment):
                    path = os.path.join(self.dir, f"v{version}.gguf")
                    vec, mat = self.write(path, version, alignment)
                    r = gguf.GGUFReader(path)
                    self.assertEqual(r.version, version)
                    self.assertEqual(r.alignment, alignment)
                    for key, value, vtype in self.METADATA:
                        self.assertEqual(r.metadata[key], value, key)
                        self.assertEqual(r.types[key], vtype, key)
                    self.assertEqual(list(r.tensors), ["vec", "mat", "q"])
                    self.assertEqual(r.tensors["mat"].shape, (3, 64))
                    self.assertEqual(r.tensors["q"].ggml_type, GGMLType.Q8_0)
                    self.assertEqual(r.data_start % alignment, 0)
                    for info in r.tensors.values():
                        self.assertEqual(info.offset % alignment, 0)
                    np.testing.assert_array_equal(r.tensor("vec"), vec)
                    np.testing.assert_array_equal(
                        r.tensor("mat"), mat.astype(np.float16))
                    np.testing.assert_array_equal(
                        r.tensor("mat", [2, 0]),
                        mat.astype(np.float16)[[2, 0]])

    def test_header_layout(self):
        path = os.path.join(self.dir, "h.gguf")
        with gguf.GGUFWriter(path) as w:
            w.add_uint32("k", 7)
            w.add_tensor_info("t", (2, 32), GGMLType.F32)
            w.write_header()
            w.write_tensor("t", np.zeros((2, 32)))
        with open(path, "rb") as f:
            data = f.read()
        self.assertEqual(data[:4], b"GGUF")
        self.assertEqual(struct.unpack_from("<IQQ", data, 4), (3, 1, 1))
        # key "k": u64 length, bytes, u32 type 4, u32 value 7
        self.assertEqual(struct.unpack_from("<Q", data, 24), (1,))
        self.assertEqual(data[32:33], b"k")
        self.assertEqual(struct.unpack_from("<II", data, 33), (4, 7))
        # tensor "t": name, n_dims 2, ne = [32, 2] (innermost first), F32, 0
        self.assertEqual(struct.unpack_from("<Q", data, 41), (1,))
        self.assertEqual(data[49:50], b"t")
        self.assertEqual(struct.unpack_from("<IQQIQ", data, 50),
                         (2, 32, 2, 0, 0))

    def test_writer_rejects_misuse(self):
        path = os.path.join(self.dir, "bad.gguf")
        with gguf.GGUFWriter(path) as w:
            with self.assertRaises(gguf.GGUFError):
                w.add_tensor_info("q", (2, 48), GGMLType.Q4_0)
            w.add_tensor_info("a", (4,), GGMLType.F32)
            w.add_tensor_info("b", (4,), GGMLType.F32)
            w.write_header()
            with self.assertRaises(gguf.GGUFError):
                w.write_tensor("b", np.zeros(4))
            with self.assertRaises(gguf.GGUFError):
                w.write_tensor("a", np.zeros(5))
            w.write_tensor("a", np.zeros(4))
            with self.assertRaises(gguf.GGUFError):
                w.close()

    def test_reader_rejects_bad_files(self):
        path = os.path.join(self.dir, "x.gguf")
        for blob in (b"GGML" + bytes(20),
                     b"GGUF" + struct.pack("<IQQ", 1, 0, 0),
                     b"GGUF" + struct.pack("<IQQ", 3, 0, 1)):
            with open(path, "wb") as f:
                f.write(blob)
            with self.assertRaises(gguf.GGUFError):
                gguf.GGUFReader(path)


class QuantizationTest(unittest.TestCase):
    def test_q8_0_block_decode(self):
        qs = np.arange(-16, 16, dtype=np.int8)
        raw = np.frombuffer(struct.pack("<e", 0.5) + qs.tobytes(), np.uint8)
        np.testing.assert_array_equal(gguf.decode(raw, GGMLType.Q8_0),
                                      0.5 * np.arange(-16, 16))

    def test_q4_0_block_decode_nibble_order(self):
        j = np.arange(16, dtype=np.uint8)
        qs = j | ((15 - j) << 4)
        raw = np.frombuffer(struct.pack("<e", 2.0) + qs.tobytes(), np.uint8)
        expected = np.concatenate([2.0 * (j - 8.0), 2.0 * (7.0 - j)])
        np.testing.assert_array_equal(gguf.decode(raw, GGMLType.Q4_0),
                                      expected)

    def test_q8_0_quantize_matches_reference_rules(self):
        x = np.zeros(32, np.float32)
        x[:4] = [63.5, 0.25, -0.25, 0.74]  # d = 0.5; halves round away
        raw = gguf.quantize_q8_0(x)
        self.assertEqual(raw.size, 34)
        self.assertEqual(struct.unpack("<e", raw[:2].tobytes()), (0.5,))
        np.testing.assert_array_equal(raw[2:6].view(np.int8),
                                      [127, 1, -1, 1])
        np.testing.assert_array_equal(gguf.quantize_q8_0(np.zeros(32)),
                                      np.zeros(34, np.uint8))

    def test_q4_0_quantize_matches_reference_rules(self):
        x = np.zeros(32, np.float32)
        x[:6] = [-8.0, 7.0, 7.9, 0.4, 0.6, -0.6]
        x[8] = 8.0  # same magnitude as x[0]: the first one sets the sign
        x[16] = 3.0
        raw = gguf.quantize_q4_0(x)
        self.assertEqual(raw.size, 18)
        self.assertEqual(struct.unpack("<e", raw[:2].tobytes()), (1.0,))
        # q = min(15, trunc(x + 8.5)); element 16 is byte 0's high nibble.
        self.assertEqual(raw[2], 0 | (11 << 4))
        np.testing.assert_array_equal(
            gguf.decode(raw, GGMLType.Q4_0)[:9],
            [-8, 7, 7, 0, 1, -1, 0, 0, 7])
        # A positive extreme gives a negative scale and still maps exactly.
        y = np.zeros(32, np.float32)
        y[5], y[6] = 4.0, -1.0
        raw = gguf.quantize_q4_0(y)
        self.assertEqual(struct.unpack("<e", raw[:2].tobytes()), (-0.5,))
        np.testing.assert_array_equal(gguf.decode(raw, GGMLType.Q4_0)[5:7],
                                      [4.0, -1.0])

    def test_bf16_rounds_to_nearest_even(self):
        x = np.array([1 + 2**-8, 1 + 3 * 2**-8, -2.5, np.inf], np.float32)
        np.testing.assert_array_equal(
            gguf.decode(gguf.encode(x, GGMLType.BF16), GGMLType.BF16),
            [1.0, 1 + 2**-6, -2.5, np.inf])
        self.assertTrue(np.isnan(gguf.decode(
            gguf.encode(np.array([np.nan]), GGMLType.BF16), GGMLType.BF16)[0]))

    def test_round_trip_error_is_small(self):
        x = np.random.default_rng(1).standard_normal(32 * 500)
        for ggml_type, rel_rms in ((GGMLType.F32, 1e-7),
                                   (GGMLType.F16, 1e-3),
                                   (GGMLType.BF16, 4e-3),
                                   (GGMLType.Q8_0, 1e-2),
                                   (GGMLType.Q4_0, 0.15)):
            with self.subTest(ggml_type.name):
                raw = gguf.encode(x, ggml_type)
                self.assertEqual(raw.size,
                                 gguf.tensor_nbytes(x.shape, ggml_type))
                y = gguf.decode(raw, ggml_type)
                err = np.sqrt(np.mean((y - x) ** 2) / np.mean(x ** 2))
                self.assertLess(err, rel_rms)
        blocks = x.reshape(-1, 32)
        step = np.abs(blocks).max(axis=1, keepdims=True) / 127
        y = gguf.decode(gguf.quantize_q8_0(x), GGMLType.Q8_0).reshape(-1, 32)
        # Q8_0's error per element is at most half a step, plus the f16
        # rounding of the scale times the largest quant.
        self.assertTrue(np.all(np.abs(y - blocks)
                               <= step * (0.5 + 127 * 2**-11)))


class MakeModelTest(TempDirTest):
    def test_every_type_reads_back(self):
        file_types = {"f32": 0, "f16": 1, "q4_0": 2, "q8_0": 7, "bf16": 32}
        for type_name, ggml_type in TYPE_OF.items():
            with self.subTest(type_name):
                r = gguf.GGUFReader(self.make(f"{type_name}.gguf",
                                              "--type", type_name))
                m = r.metadata
                self.assertEqual(r.version, 3)
                self.assertEqual(m["general.architecture"], "llama")
                self.assertEqual(m["general.file_type"], file_types[type_name])
                expected_u32 = {
                    "general.alignment": 32,
                    "llama.context_length": 512,
                    "llama.embedding_length": 64,
                    "llama.block_count": 2,
                    "llama.feed_forward_length": 192,
                    "llama.attention.head_count": 4,
                    "llama.attention.head_count_kv": 2,
                    "llama.rope.dimension_count": 16,
                    "llama.vocab_size": 512,
                    "tokenizer.ggml.bos_token_id": 1,
                    "tokenizer.ggml.eos_token_id": 2,
                    "tokenizer.ggml.unknown_token_id": 0,
                }
                for key, value in expected_u32.items():
                    self.assertEqual(m[key], value, key)
                    self.assertEqual(r.types[key], ValueType.UINT32, key)
                self.assertEqual(
                    r.types["llama.attention.layer_norm_rms_epsilon"],
                    ValueType.FLOAT32)
                self.assertAlmostEqual(
                    m["llama.attention.layer_norm_rms_epsilon"], 1e-5)
                self.assertEqual(m["llama.rope.freq_base"], 10000.0)
                self.assertIs(m["tokenizer.ggml.add_bos_token"], True)
                self.assertIs(m["tokenizer.ggml.add_eos_token"], False)
                self.assertEqual(r.types["tokenizer.ggml.token_type"],
                                 (ValueType.ARRAY, ValueType.INT32))

                self.assertEqual(len(r.tensors), 3 + 2 * 9)
                for info in r.tensors.values():
                    self.assertEqual(info.offset % 32, 0, info.name)
                    self.assertEqual(
                        info.ggml_type,
                        GGMLType.F32 if len(info.shape) == 1 else ggml_type)
                shapes = {n: i.shape for n, i in r.tensors.items()}
                self.assertEqual(shapes["token_embd.weight"], (512, 64))
                self.assertEqual(shapes["output.weight"], (512, 64))
                self.assertEqual(shapes["output_norm.weight"], (64,))
                self.assertEqual(shapes["blk.1.attn_q.weight"], (64, 64))
                self.assertEqual(shapes["blk.1.attn_k.weight"], (32, 64))
                self.assertEqual(shapes["blk.1.attn_v.weight"], (32, 64))
                self.assertEqual(shapes["blk.1.attn_output.weight"], (64, 64))
                self.assertEqual(shapes["blk.1.ffn_gate.weight"], (192, 64))
                self.assertEqual(shapes["blk.1.ffn_up.weight"], (192, 64))
                self.assertEqual(shapes["blk.1.ffn_down.weight"], (64, 192))
                self.assertTrue(np.all(np.isfinite(
                    r.tensor("blk.1.ffn_down.weight"))))

    def test_vocabulary(self):
        r = gguf.GGUFReader(self.make("v.gguf", "--vocab", "1000"))
        tokens = r.metadata["tokenizer.ggml.tokens"]
        scores = r.metadata["tokenizer.ggml.scores"]
        types = r.metadata["tokenizer.ggml.token_type"]
        self.assertEqual(len(tokens), 1000)
        self.assertEqual(len(set(tokens)), 1000)
        self.assertEqual(tokens[:4], ["<unk>", "<s>", "</s>", "<0x00>"])
        self.assertEqual(tokens[258], "<0xFF>")
        self.assertEqual(tokens[259], "\u2581")
        self.assertEqual(types[:4], [2, 3, 3, 6])
        self.assertEqual(set(types[259:]), {1})
        for word in ("the", "and", "once", "upon", "time", "a", "z"):
            self.assertIn("\u2581" + word, tokens)
        for i in (0, 1, 100, 259, 999):
            self.assertEqual(scores[i], -float(i) if types[i] == 1 else 0.0)
        self.assertEqual(len(tokens), r.tensors["token_embd.weight"].shape[0])
        with self.assertRaises(SystemExit), \
                contextlib.redirect_stderr(io.StringIO()):
            self.make("small.gguf", "--vocab", "300")

    def test_same_seed_same_weights_across_types(self):
        f32 = gguf.GGUFReader(self.make("a.gguf"))
        others = {t: gguf.GGUFReader(self.make(f"{t}.gguf", "--type", t))
                  for t in ("f16", "bf16", "q8_0")}
        other_seed = gguf.GGUFReader(self.make("s.gguf", "--seed", "7"))
        for name in f32.tensors:
            a = f32.tensor(name)
            # Rounding to nearest: half a unit in the last place at most.
            np.testing.assert_allclose(others["f16"].tensor(name), a,
                                       rtol=2**-11, atol=2**-25)
            np.testing.assert_allclose(others["bf16"].tensor(name), a,
                                       rtol=2**-8, atol=0)
            err = others["q8_0"].tensor(name) - a
            self.assertLess(np.abs(err).max(), 0.01 * np.abs(a).max() + 1e-9)
            self.assertFalse(np.allclose(other_seed.tensor(name), a))

    def test_tied_drops_only_output(self):
        untied = gguf.GGUFReader(self.make("u.gguf"))
        tied = gguf.GGUFReader(self.make("t.gguf", "--tied"))
        self.assertNotIn("output.weight", tied.tensors)
        self.assertEqual(set(untied.tensors) - set(tied.tensors),
                         {"output.weight"})
        for name in tied.tensors:
            np.testing.assert_array_equal(tied.raw(name), untied.raw(name))

    def test_version_2_and_alignment(self):
        r = gguf.GGUFReader(self.make("v2.gguf", "--gguf-version", "2",
                                      "--alignment", "64", "--type", "q4_0"))
        self.assertEqual((r.version, r.alignment), (2, 64))
        self.assertEqual(r.data_start % 64, 0)
        for info in r.tensors.values():
            self.assertEqual(info.offset % 64, 0)

    def test_quantized_types_need_multiples_of_32(self):
        for flags in (("--dim", "48", "--n-heads", "4", "--n-kv-heads", "2"),
                      ("--ffn", "100")):
            with self.subTest(flags), self.assertRaises(SystemExit), \
                    contextlib.redirect_stderr(io.StringIO()) as err:
                self.make("q.gguf", "--type", "q8_0", *flags)
            self.assertIn("multiple of 32", err.getvalue())
        # Fine for unquantized types.
        self.make("f.gguf", "--dim", "48", "--n-heads", "4", "--ffn", "100")


class ReferenceTest(TempDirTest):
    TOKENS = [1, 300, 301, 420, 9, 17]

    def logits(self, path, tokens):
        return reference.forward(gguf.GGUFReader(path), tokens)

    def test_rope_adjacent_pairs(self):
        x = np.array([1.0, 0.0, 1.0, 0.0, 5.0, 6.0]).reshape(1, 1, 6)
        out = reference.rope(x, np.array([1]), n_rot=4, base=10000.0)
        # pair 0 turns by 1 rad, pair 1 by 10000^(-2/4); dims >= n_rot stay.
        np.testing.assert_allclose(
            out.reshape(-1),
            [np.cos(1), np.sin(1), np.cos(0.01), np.sin(0.01), 5.0, 6.0],
            rtol=1e-15)
        # Scores depend only on relative position.
        rng = np.random.default_rng(0)
        q, k = rng.standard_normal((2, 1, 1, 8))

        def score(pq, pk):
            return np.sum(reference.rope(q, np.array([pq]), 8, 10000.0)
                          * reference.rope(k, np.array([pk]), 8, 10000.0))
        self.assertAlmostEqual(score(5, 2), score(13, 10), places=12)

    def test_attention_groups_query_heads(self):
        q = np.ones((1, 4, 2))
        k = np.ones((1, 2, 2))
        v = np.stack([np.zeros(2), np.ones(2)]).reshape(1, 2, 2)
        out = reference.attention(q, k, v, n_head=4, n_kv_head=2)
        # Heads 0 and 1 share kv head 0; heads 2 and 3 share kv head 1.
        np.testing.assert_array_equal(out.reshape(4, 2)[:, 0], [0, 0, 1, 1])

    def test_attention_scale_and_mask(self):
        q = np.array([[0.0, 0, 0, 0], [2, 0, 0, 0]]).reshape(2, 1, 4)
        k = np.array([[1.0, 0, 0, 0], [0, 0, 0, 0]]).reshape(2, 1, 4)
        v = np.array([[1.0, 0, 0, 0], [0, 1, 0, 0]]).reshape(2, 1, 4)
        out = reference.attention(q, k, v, n_head=1, n_kv_head=1)
        # Token 0 sees only itself; token 1 scores [2/sqrt(4), 0].
        e = np.e
        np.testing.assert_allclose(
            out, [[1, 0, 0, 0], [e / (e + 1), 1 / (e + 1), 0, 0]],
            rtol=1e-15)

    def test_single_token_matches_hand_computation(self):
        # At position 0 RoPE is the identity and attention returns v. The
        # file is q8_0, so every matrix sees its input rounded to 8 bits.
        path = self.make("one.gguf", "--type", "q8_0")
        r = gguf.GGUFReader(path)

        def w(name):
            return r.tensor(name)

        def mm(name, x):
            return w(name) @ reference.quantize_activations(x[None, :])[0]

        def norm(x, name):
            return x / np.sqrt(np.mean(x**2) + 1e-5) * w(name)
        x = w("token_embd.weight")[42]
        for i in range(2):
            p = f"blk.{i}."
            v = mm(p + "attn_v.weight", norm(x, p + "attn_norm.weight"))
            x = x + mm(p + "attn_output.weight",
                       np.tile(v.reshape(2, 16), (1, 2)).reshape(-1))
            h = norm(x, p + "ffn_norm.weight")
            g, u = mm(p + "ffn_gate.weight", h), mm(p + "ffn_up.weight", h)
            x = x + mm(p + "ffn_down.weight", g / (1 + np.exp(-g)) * u)
        expected = mm("output.weight", norm(x, "output_norm.weight"))
        np.testing.assert_allclose(self.logits(path, [42])[0], expected,
                                   rtol=1e-9, atol=1e-9)

    def test_quantize_activations(self):
        x = np.zeros((1, 64))
        x[0, 32:36] = [-127.0, 2.5, 3.5, 100.2]
        q = reference.quantize_activations(x)
        # A block of zeros stays zero; d = 1 in the second block, where
        # ties round to even.
        np.testing.assert_array_equal(q[0, :36], [0] * 32 + [-127, 2, 4, 100])

    def test_causal(self):
        path = self.make("c.gguf")
        full = self.logits(path, self.TOKENS)
        changed = self.logits(path, self.TOKENS[:3] + [5, 6, 7])
        prefix = self.logits(path, self.TOKENS[:3])
        np.testing.assert_allclose(changed[:3], full[:3], rtol=1e-12)
        np.testing.assert_allclose(prefix, full[:3], rtol=1e-12)
        self.assertFalse(np.allclose(changed[3:], full[3:]))
        self.assertGreater(full.std(), 0.3)  # logits are not degenerate

    def test_gqa_tied_and_types_run(self):
        variants = {
            "mha": ("--n-kv-heads", "4"),
            "mqa": ("--n-kv-heads", "1"),
            "tied": ("--tied", "--type", "q4_0"),
            "rot": ("--rope-base", "500", "--n-heads", "2",
                    "--n-kv-heads", "1"),
        }
        for name, flags in variants.items():
            with self.subTest(name):
                logits = self.logits(self.make(name + ".gguf", *flags),
                                     self.TOKENS)
                self.assertEqual(logits.shape, (len(self.TOKENS), 512))
                self.assertTrue(np.all(np.isfinite(logits)))
        # Tied logits come from token_embd.
        untied = self.make("untied.gguf", "--type", "q4_0")
        self.assertFalse(np.allclose(
            self.logits(untied, self.TOKENS),
            self.logits(os.path.join(self.dir, "tied.gguf"), self.TOKENS)))

    def test_types_agree_and_v2_matches_v3(self):
        base = self.logits(self.make("f32.gguf"), self.TOKENS)
        v2 = self.logits(self.make("v2.gguf", "--gguf-version", "2"),
                         self.TOKENS)
        np.testing.assert_array_equal(v2, base)
        # Same model, stored less precisely: the relative RMS logit error
        # grows with the storage error (observed: 0.1%, 0.7%, 2.4%, 37%).
        for type_name, tol in (("f16", 0.005), ("bf16", 0.03),
                               ("q8_0", 0.08), ("q4_0", 0.6)):
            with self.subTest(type_name):
                logits = self.logits(
                    self.make(f"{type_name}.gguf", "--type", type_name),
                    self.TOKENS)
                err = np.sqrt(np.mean((logits - base) ** 2)
                              / np.mean(base ** 2))
                self.assertLess(err, tol)

    def test_cli(self):
        path = self.make("cli.gguf", "--type", "f16")
        script = os.path.join(TOOLS, "reference.py")
        tokens = ",".join(map(str, self.TOKENS))
        run = subprocess.run([sys.executable, script, path, "--tokens",
                              tokens, "--all"],
                             capture_output=True, text=True, check=True)
        out = json.loads(run.stdout)
        self.assertEqual(out["n_vocab"], 512)
        self.assertEqual(out["positions"], list(range(len(self.TOKENS))))
        np.testing.assert_array_equal(out["logits"],
                                      self.logits(path, self.TOKENS))
        last = json.loads(subprocess.run(
            [sys.executable, script, path, "--tokens", tokens],
            capture_output=True, text=True, check=True).stdout)
        self.assertEqual(last["positions"], [len(self.TOKENS) - 1])
        self.assertEqual(last["logits"], out["logits"][-1:])

        bad = subprocess.run([sys.executable, script, path, "--tokens",
                              "1,512"], capture_output=True, text=True)
        self.assertNotEqual(bad.returncode, 0)
        self.assertIn("outside the vocabulary", bad.stderr)

    def test_unsupported_tensor_type(self):
        path = self.make("k.gguf")
        with open(path, "r+b") as f:
            header = f.read(1 << 16)
            # The name (u64 length + bytes; the length keeps it from matching
            # "blk.N.attn_output.weight"), u32 n_dims, two u64 ne, u32 type.
            name = struct.pack("<Q", 13) + b"output.weight"
            f.seek(header.index(name) + len(name) + 20)
            f.write(struct.pack("<I", 12))  # Q4_K
        r = gguf.GGUFReader(path)
        self.assertEqual(r.tensors["output.weight"].ggml_type, 12)
        with self.assertRaisesRegex(gguf.GGUFError,
                                    "unsupported ggml type 12"):
            reference.forward(r, [1, 2])

    def test_unsupported_architecture(self):
        path = os.path.join(self.dir, "gpt2.gguf")
        with gguf.GGUFWriter(path) as w:
            w.add_string("general.architecture", "gpt2")
            w.write_header()
        run = subprocess.run([sys.executable,
                              os.path.join(TOOLS, "reference.py"), path,
                              "--tokens", "1"], capture_output=True, text=True)
        self.assertNotEqual(run.returncode, 0)
        self.assertIn("unsupported architecture 'gpt2'", run.stderr)


if __name__ == "__main__":
    unittest.main()
