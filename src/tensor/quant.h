// Quantized block layouts, bit-identical to GGUF's Q8_0 and Q4_0, and their scalar reference
// quantize / dequantize routines.
#pragma once

#include <cstdint>

#include "tensor/dtype.h"

namespace kvllm {

// Q8_0: x[j] = d * qs[j].
struct BlockQ8_0 {
  uint16_t d;  // f16 scale
  int8_t qs[kQK];
};
static_assert(sizeof(BlockQ8_0) == 34);

// Q8_0 rows of `slots` tokens stored dimension-major (the KV cache's Q8_0 K): for each group of
// kQK dimensions, `slots` f16 scales, then kQK rows of `slots` int8 codes. The same bytes as
// `slots` Q8_0 rows, laid out so that a vector holds one dimension of many tokens.
struct Q8DimsLayout {
  int64_t slots;
  int64_t GroupBytes() const { return slots * static_cast<int64_t>(sizeof(BlockQ8_0)); }
  int64_t ScaleOffset(int64_t group, int64_t slot) const {
    return group * GroupBytes() + slot * 2;
  }
  int64_t CodeOffset(int64_t group, int64_t i, int64_t slot) const {
    return group * GroupBytes() + 2 * slots + i * slots + slot;
  }
};

// Q4_0: x[j] = d * ((qs[j] & 0xF) - 8), x[j + 16] = d * ((qs[j] >> 4) - 8), j < 16.
struct BlockQ4_0 {
  uint16_t d;  // f16 scale
  uint8_t qs[kQK / 2];
};
static_assert(sizeof(BlockQ4_0) == 18);

// Block b of 16 consecutive rows side by side (a matrix stored WeightLayout::kInterleaved16):
// the rows' scales, then their bytes four at a time, [byte group][row][4]. One 64-byte line
// holds the same four bytes of all 16 rows, so that vpdpbusd multiplies 16 rows' quads by one
// broadcast quad of activations, each row's sum in its own int32 lane; no horizontal sums.
//   Q4_0x16: qs[j][r] = row r's qs[4j .. 4j + 3] (their low nibbles are elements 4j .. 4j + 3,
//            their high nibbles elements 4j + 16 .. 4j + 19).
//   Q8_0x16: qs[j][r] = row r's codes 4j .. 4j + 3 plus 128, unsigned as vpdpbusd wants them.
// Same size as the 16 blocks they come from. A group's blocks are not an array of these: their
// d and qs lie as Interleaved16Layout says.
struct BlockQ4_0x16 {
  uint16_t d[16];
  uint8_t qs[kQK / 8][16][4];
};
static_assert(sizeof(BlockQ4_0x16) == 16 * sizeof(BlockQ4_0));

struct BlockQ8_0x16 {
  uint16_t d[16];
  uint8_t qs[kQK / 4][16][4];
};
static_assert(sizeof(BlockQ8_0x16) == 16 * sizeof(BlockQ8_0));

// Where the blocks of an interleaved group lie: in pairs, blocks 2p and 2p + 1 as both blocks'
// 16 scales (one 64-byte line), then block 2p's qs, then block 2p + 1's; the last block of an
// odd count as its scales, then its qs. A block is 288 (Q4_0) or 544 (Q8_0) bytes, 32 past a
// multiple of the line: one after another, every other block's 64-byte rows of qs would
// straddle two lines (a group of an even count starts on a line, and so does each pair).
struct Interleaved16Layout {
  static constexpr int64_t kScaleBytes = 32;
  int64_t nb;           // blocks per group
  int64_t block_bytes;  // sizeof(BlockQ4_0x16) or sizeof(BlockQ8_0x16)
  int64_t GroupBytes() const { return nb * block_bytes; }
  // Offsets from the group's first byte.
  int64_t ScaleOffset(int64_t b) const { return (b & ~1) * block_bytes + (b & 1) * kScaleBytes; }
  int64_t QsOffset(int64_t b) const {
    const int64_t blocks_in_pair = (b | 1) < nb ? 2 : 1;
    return (b & ~1) * block_bytes + blocks_in_pair * kScaleBytes +
           (b & 1) * (block_bytes - kScaleBytes);
  }
};

// The order of a float (F16, BF16) group's chunks of 32 columns in the kInterleaved16 layout:
// position i holds chunk (i x stride) mod n_chunks, stride the first of 17, 19, 23, ... that
// does not divide n_chunks (so the order is a permutation) nor leaves 1 (so it is not column
// order, unless there are only 2 chunks). Decode reads a group's chunks position after
// position, one stream of weights, and each chunk's 128 bytes of x with it: x read in column
// order was a second sequential stream, which the hardware prefetchers followed at the
// weights' expense; strided, it is read from the caches as before, and the F16 decode stream
// ran 2-6% faster on the AVX-512 host (docs/performance.md).
struct FloatChunkOrder {
  explicit FloatChunkOrder(int64_t n_chunks);
  int64_t n_chunks;
  int64_t stride;  // in [0, n_chunks)
  // The step between the positions of consecutive chunks: stride x Inverse() = 1 (mod
  // n_chunks). Computed on each call (a few divisions), which decode, building an order per
  // task, never makes.
  int64_t Inverse() const;
  int64_t ChunkAt(int64_t position) const { return position * stride % n_chunks; }
  int64_t PositionOf(int64_t chunk) const { return chunk * Inverse() % n_chunks; }
};

// Rows interleaved 16 at a time: out holds n_out / 16 groups, group after group, each
//   Q8_0, Q4_0: the n / 32 blocks of its rows (BlockQ4_0x16 or BlockQ8_0x16's bytes, placed
//               as Interleaved16Layout says);
//   F16, BF16:  the n / 32 chunks of 32 columns of its rows in FloatChunkOrder, each chunk
//               [row][32] elements: each row's part one 64-byte line, and a group is read
//               as one stream.
// n_out and n are multiples of 16 and 32; `rows` is [n_out] rows of RowBytes(t, n) and `out`
// as many bytes.
void InterleaveRows(DType t, const void* rows, int64_t n_out, int64_t n, void* out);

// An activation row quantized for the integer dot with Q8_0 and Q4_0 weights (llama.cpp does
// the same once per matmul): x[j] ~ d * qs[j] with d = max|x| / 127 kept in f32 and qs
// rounded to nearest, ties to even; sum = d * sum_j qs[j], which lets a Q4_0 dot multiply the
// unsigned nibbles and subtract 8 * sum once per block. Every kernel level quantizes
// bit-identically.
struct BlockQ8Act {
  float d;
  float sum;
  int8_t qs[kQK];
};
static_assert(sizeof(BlockQ8Act) == 40);

// sums[b] = sum_j xq[b].qs[j] for b < n_blocks: the code sums the interleaved kernels take
// the codes' offset off with (DotAct16).
void ActCodeSums(const BlockQ8Act* xq, int64_t n_blocks, int32_t* sums);

// Whether MatMul multiplies rows of t with quantized activations (BlockQ8Act) rather than f32.
constexpr bool UsesQ8Activations(DType t) { return t == DType::kQ8_0 || t == DType::kQ4_0; }

// Converts n floats (n a multiple of BlockElems(t)) into a row of type t, and back.
void QuantizeRow(DType t, const float* x, void* row, int64_t n);
void DequantizeRow(DType t, const void* row, float* y, int64_t n);

}  // namespace kvllm
