#include "kv/attention.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "kv/hadamard.h"
#include "kv/kivi.h"
#include "tensor/kernels.h"
#include "tensor/quant.h"

namespace kvllm {
namespace {

// Slots whose scores are taken before one softmax update: whole blocks, at least 256 slots,
// so that the per-head bookkeeping (max, rescaling, the exp call, the kernels' calls) is paid
// once per 256 slots, not once per block. 256 against 128, alternated step by step over 22
// layers x 4 KV heads at 4,096 tokens on 2 threads: f16 and q8_0 5-7% less time, q4_0
// (V turned into floats first, 64 KiB a chunk) 0.3-0.8% less (docs/performance.md).
int32_t ChunkSlots(int32_t block_size) { return std::max(block_size, 256); }

// Floats that hold a group's query quantized for a q8_0 K (BlockQ8Act is 10 floats' size).
int64_t Q8Floats(int32_t n_group, int32_t head_dim) {
  static_assert(sizeof(BlockQ8Act) % sizeof(float) == 0 && alignof(BlockQ8Act) <= alignof(float));
  return int64_t{n_group} * (head_dim / kQK) * static_cast<int64_t>(sizeof(BlockQ8Act) / 4);
}

// AttendGroup's scratch, carved from one buffer of ScratchFloats floats.
struct Scratch {
  float* scores;      // [n_group][ChunkSlots] a chunk's scores, then its softmax numerators
  float* piece;       // [n_group][block_size] one block's scores from a matrix product
  float* run_max;     // [n_group]
  float* run_sum;     // [n_group]
  float* q_rot;       // [n_group][head_dim] the span's query, rotated (q4_0r)
  float* q_scale;     // [n_group][head_dim] q · a KIVI block's channel scales
  float* q_min;       // [n_group] q · the block's channel minima
  float* chan_scale;  // [head_dim]
  float* chan_min;    // [head_dim]
  BlockQ8Act* q8;     // [n_group][head_dim / 32] the span's query quantized (a q8_0 K)
  // [ChunkSlots][head_dim] a block's K codes or a chunk's V rows as floats, all unpacked
  // before any is read (reading a row right after writing it stalls on store forwarding)
  float* rows;

  Scratch(float* p, int32_t n_group, int32_t block_size, int32_t head_dim) {
    const int64_t g = n_group, d = head_dim;
    scores = p;
    piece = scores + g * ChunkSlots(block_size);
    run_max = piece + g * block_size;
    run_sum = run_max + g;
    q_rot = run_sum + g;
    q_scale = q_rot + g * d;
    q_min = q_scale + g * d;
    chan_scale = q_min + g;
    chan_min = chan_scale + d;
    q8 = reinterpret_cast<BlockQ8Act*>(chan_min + d);
    rows = chan_min + d + Q8Floats(n_group, head_dim);
  }
};

int64_t ScratchFloats(int32_t n_group, int32_t block_size, int32_t head_dim) {
  const int64_t g = n_group, d = head_dim;
  return g * ChunkSlots(block_size) + g * block_size + 2 * g + 2 * g * d + g + 2 * d +
         Q8Floats(n_group, head_dim) + int64_t{ChunkSlots(block_size)} * d;
}

// Where one block's K of the attended head is read from, for slots [slot0, slot0 + n).
struct KBlock {
  const uint8_t* tile;    // the head's K tile in the pool
  const uint16_t* rows;   // [block_size][head_dim] f16 when the block is staged, else nullptr
};

// scores[g * stride + j] = scale · q_g · k_{slot0 + j} for j < n, where the slots lie in one
// block, or for an f16 dimension-major K in a run of blocks adjacent in the pool (whose tiles
// follow one another). A dimension-major K (f16, q8_0) meets the whole group in one kernel.
// Other K blocks are turned into float rows once (s.rows) and multiplied with the group in one
// small matrix product, so each row is converted once, not once per query head.
void KScores(const AttentionArgs& a, const KBlock& kb, int32_t slot0, int32_t n, const float* q,
             Scratch& s, float* scores, int32_t stride, Prefetch* ahead) {
  const KernelSet& kern = Kernels();
  const KVLayout& lay = a.kv->layout();
  const KVFormat f = lay.k_format();
  const int32_t d = lay.shape().head_dim;
  if (kb.rows == nullptr && f.dimension_major(KVRole::kK)) {
    if (f.row_type() == DType::kF16) {
      kern.scores_f16t(reinterpret_cast<const uint16_t*>(kb.tile), lay.block_size(), slot0, n,
                       q, a.n_group, d, a.scale, scores, stride, ahead);
    } else {
      kern.scores_q8t(kb.tile, lay.block_size(), slot0, n, s.q8, a.n_group, d, a.scale, scores,
                      stride, ahead);
    }
    return;
  }
  const float* queries = q;
  // A head's rows of one block lie one after another, so n rows convert in one call.
  if (kb.rows != nullptr) {
    kern.dequantize(DType::kF16, kb.rows + int64_t{slot0} * d, s.rows, int64_t{n} * d);
  } else if (f.is_kivi()) {
    kivi::KTileChannels(kb.tile, d, s.chan_scale, s.chan_min);
    for (int32_t g = 0; g < a.n_group; ++g) {
      const float* qg = q + int64_t{g} * d;
      float* qs = s.q_scale + int64_t{g} * d;
      for (int32_t i = 0; i < d; ++i) qs[i] = qg[i] * s.chan_scale[i];
      s.q_min[g] = kern.dot_f32(qg, s.chan_min, d);
    }
    for (int32_t j = 0; j < n; ++j) {
      kivi::UnpackCodes(f.bits(), kb.tile + kivi::KCodesOffset(f.bits(), d, slot0 + j),
                        s.rows + int64_t{j} * d, d);
    }
    queries = s.q_scale;
  } else {
    kern.dequantize(f.row_type(), kb.tile + slot0 * lay.k_row_bytes(), s.rows, int64_t{n} * d);
  }
  MatMul(DType::kF32, s.rows, n, d, queries, a.n_group, s.piece, nullptr);
  const bool add_min = f.is_kivi() && kb.rows == nullptr;
  for (int32_t g = 0; g < a.n_group; ++g) {
    const float shift = add_min ? s.q_min[g] : 0.0f;
    for (int32_t j = 0; j < n; ++j) scores[g * stride + j] = (s.piece[g * n + j] + shift) * a.scale;
  }
}

// rows[j] = v_{slot0 + j} as floats for j < n, from a block's V rows of the attended head.
void DequantizeValues(const AttentionArgs& a, const uint8_t* v_rows, int32_t slot0, int32_t n,
                      float* rows) {
  const KVLayout& lay = a.kv->layout();
  const KVFormat f = lay.v_format();
  const int32_t d = lay.shape().head_dim;
  if (f.is_kivi()) {
    for (int32_t j = 0; j < n; ++j) {
      kivi::DequantizeVRow(f.bits(), v_rows + (slot0 + j) * lay.v_row_bytes(),
                           rows + int64_t{j} * d, d);
    }
  } else {
    Kernels().dequantize(f.row_type(), v_rows + slot0 * lay.v_row_bytes(), rows,
                         int64_t{n} * d);
  }
}

// The attended head's K and V in blocks [b0, b1), the next chunk's, asked for ahead of use:
// the hardware prefetchers alone leave the FMA loops waiting on memory, even along adjacent
// blocks, and do not follow a jump to another block. Blocks adjacent in the pool make one
// range each of K and of V, which the kernels ask for a line per loop step (Prefetch);
// others block by block, each through the kernel that reads the block at its place in this
// chunk (ChunkAhead::b0, b1). Where the blocks stay adjacent for kFarChunks more
// chunks before `last` (one past the span's last block), each request also asks the L2 for
// the line that many chunks further on: with requests only one chunk ahead, K and V still
// arrived late enough to leave the FMAs waiting a fifth of the time at 4,096 tokens. Kernels
// with a prefetch_lead are given their own chunk instead where it and the next are adjacent
// (LeadOf).
constexpr int32_t kFarChunks = 2;

struct ChunkAhead {
  Prefetch k, v;
  // Blocks [b0, b1) of the next chunk where they are not adjacent: each is asked for through
  // the kernel that reads the block at its place in this chunk, a line a loop step (asked for
  // all at once as the chunk began, a step's f16 attention over blocks not adjacent took
  // 9.2-9.8 ms against 7.0-7.3, q8_0 5.9-6.1 against 3.8-4.1: `BM_AttentionStep`,
  // `interleaved:1`).
  int32_t b0 = 0, b1 = 0;
};

ChunkAhead AheadOf(const AttentionArgs& a, const BlockTable& table, int32_t b0, int32_t b1,
                   int32_t last) {
  const KVLayout& lay = a.kv->layout();
  ChunkAhead ahead;
  if (b0 >= b1) return ahead;
  auto adjacent_to = [&](int32_t end) {
    for (int32_t b = b0 + 1; b < end; ++b) {
      if (table.blocks[b].value != table.blocks[b - 1].value + 1) return false;
    }
    return true;
  };
  if (adjacent_to(b1)) {
    const uint8_t* k = a.kv->KHead(table.blocks[b0], a.layer, a.kv_head);
    const uint8_t* v = a.kv->VHead(table.blocks[b0], a.layer, a.kv_head);
    ahead.k = {k, k + (b1 - b0) * lay.k_head_bytes()};
    ahead.v = {v, v + (b1 - b0) * lay.v_head_bytes()};
    const int32_t far_blocks = kFarChunks * (b1 - b0);
    if (b1 + far_blocks <= last && adjacent_to(b1 + far_blocks)) {
      ahead.k.far = static_cast<int64_t>(far_blocks * lay.k_head_bytes());
      ahead.v.far = static_cast<int64_t>(far_blocks * lay.v_head_bytes());
    }
    return ahead;
  }
  ahead.b0 = b0;
  ahead.b1 = b1;
  return ahead;
}

// The next chunk's block at the place of this chunk's block i (from its first), K or V.
Prefetch ScatteredAhead(const AttentionArgs& a, const BlockTable& table, const ChunkAhead& c,
                        int32_t i, bool v) {
  const int32_t b = c.b0 + i;
  if (b >= c.b1) return {};
  const KVLayout& lay = a.kv->layout();
  const uint8_t* p = v ? a.kv->VHead(table.blocks[b], a.layer, a.kv_head)
                       : a.kv->KHead(table.blocks[b], a.layer, a.kv_head);
  return {p, p + (v ? lay.v_head_bytes() : lay.k_head_bytes())};
}

// For a level with KernelSet::prefetch_lead > 0: what its kernels ask for while they read the
// range `cur` (a chunk's K or V, adjacent in the pool), given `next`, the next chunk's range
// (empty where there is none or its blocks are not adjacent). They ask for cur itself, `lead`
// bytes ahead of where they read, running on into the next chunk's first bytes where it
// follows; each line's far partner is its line of the next chunk, asked for only where the
// next chunk is as long (a shorter last chunk would send the requests past the span's end).
Prefetch LeadOf(const Prefetch& cur, const Prefetch& next, int64_t lead) {
  const int64_t bytes = cur.end - cur.next;
  const bool follows = next.next != nullptr && next.next == cur.end;
  Prefetch p;
  p.next = cur.next + std::min(lead, bytes);
  p.end = follows ? cur.end + std::min<int64_t>(lead, next.end - next.next) : cur.end;
  if (follows && next.end - next.next == bytes && bytes > lead) p.far = bytes - lead;
  return p;
}

// Asks for the lines of `ahead` a kernel did not.
void PrefetchRest(const Prefetch& ahead) {
  for (const uint8_t* p = ahead.next; p < ahead.end; p += 64) {
    __builtin_prefetch(p);
    if (ahead.far > 0) __builtin_prefetch(p + ahead.far, 0, 2);
  }
}

// Calls fn(block, first slot in it, slots, offset from `from`) for each block's piece of the
// slots [from, to), with one division for the first block: a division per piece (its block
// and slot) cost 1-2% of attention at 4,096 tokens.
template <class Fn>
void ForEachPiece(int32_t from, int32_t to, int32_t bs, const Fn& fn) {
  int32_t block = from / bs, slot0 = from % bs;
  for (int32_t idx = from; idx < to; ++block, slot0 = 0) {
    const int32_t n = std::min(bs - slot0, to - idx);
    fn(block, slot0, n, idx - from);
    idx += n;
  }
}

// The same for runs of pieces whose blocks are adjacent in the pool (ids one apart), so that
// every per-head tile of the run lies in one piece of memory: fn(first block, first slot in
// it, slots of the run, offset from `from`).
template <class Fn>
void ForEachRun(int32_t from, int32_t to, int32_t bs, const BlockTable& table, const Fn& fn) {
  int32_t run_block = -1, run_slot0 = 0, run_n = 0, run_off = 0;
  ForEachPiece(from, to, bs, [&](int32_t b, int32_t slot0, int32_t n, int32_t off) {
    if (run_n > 0 && table.blocks[b].value == table.blocks[b - 1].value + 1) {
      run_n += n;
      return;
    }
    if (run_n > 0) fn(run_block, run_slot0, run_n, run_off);
    run_block = b;
    run_slot0 = slot0;
    run_n = n;
    run_off = off;
  });
  if (run_n > 0) fn(run_block, run_slot0, run_n, run_off);
}

// Where the chunk that starts at `chunk0` ends, for a span that ends at `end`: on the last
// block boundary within ChunkSlots, so that chunks from any block boundary keep to one grid.
int32_t ChunkEnd(int32_t chunk0, int32_t end, int32_t bs) {
  return std::min(end, (chunk0 + ChunkSlots(bs)) / bs * bs);
}

// Attends the spans' slots in [lo, hi), leaving acc, run_max and run_sum unnormalised; with a
// claim, each chunk is taken from it first, and the loop stops where that fails.
void AttendRange(const AttentionArgs& a, int32_t lo, int32_t hi, float* acc_out, float* run_max,
                 float* run_sum, float* scratch, SlotClaim* claim = nullptr) {
  const KernelSet& kern = Kernels();
  const KVLayout& lay = a.kv->layout();
  const int32_t bs = lay.block_size();
  const int32_t d = lay.shape().head_dim;
  const BlockTable& table = a.kv->Table(a.seq);
  const KVCache::StagedK staged = a.kv->Staged(a.seq, a.layer);
  Scratch s(scratch, a.n_group, bs, d);
  const KVFormat vf = lay.v_format();
  const DType vt = vf.row_type();
  // An f16 dimension-major K is scored a run of adjacent blocks at a time.
  const bool k_runs = lay.k_format().dimension_major(KVRole::kK) &&
                      lay.k_format().row_type() == DType::kF16;
  // V rows of a type weighted_rows reads are read in place; others are converted first.
  const bool v_in_place = !vf.is_kivi() && (vt == DType::kF32 || vt == DType::kF16 ||
                                            vt == DType::kBF16 || vt == DType::kQ8_0);
  // Kernels that ask for their own data ahead (prefetch_lead) are given it where they read
  // both K and V in place as 8- or 16-bit codes: a dimension-major K, and such a V.
  const int64_t lead =
      lay.k_format().dimension_major(KVRole::kK) && v_in_place && vt != DType::kF32
          ? kern.prefetch_lead
          : 0;
  std::fill(run_max, run_max + a.n_group, -std::numeric_limits<float>::infinity());
  std::fill(run_sum, run_sum + a.n_group, 0.0f);
  std::fill(acc_out, acc_out + int64_t{a.n_group} * d, 0.0f);

  for (int32_t sp = 0; sp < a.n_spans; ++sp) {
    const AttentionSpan& span = a.spans[sp];
    const int32_t begin = std::max(span.begin, lo);
    const int32_t end = std::min(span.end, hi);
    if (begin >= end) continue;
    const float* q = span.q;
    if (lay.k_format().rotated()) {
      std::copy(q, q + int64_t{a.n_group} * d, s.q_rot);
      for (int32_t g = 0; g < a.n_group; ++g) HadamardRotate(s.q_rot + int64_t{g} * d, d);
      q = s.q_rot;
    }
    if (AttentionQuantizesQuery(lay.k_format())) {
      for (int32_t g = 0; g < a.n_group; ++g) {
        kern.quantize_act(q + int64_t{g} * d, s.q8 + int64_t{g} * (d / kQK), d);
      }
    }
    // Visit the span chunk by chunk: a chunk ends on the last block boundary within cap
    // slots (or at the span's end), and each block's piece of it is visited in turn.
    const int32_t cap = ChunkSlots(bs);
    for (int32_t chunk0 = begin; chunk0 < end;) {
      const int32_t chunk_end = ChunkEnd(chunk0, end, bs);
      if (claim != nullptr && !claim->TakeChunk(chunk0, chunk_end)) break;
      const int32_t len = chunk_end - chunk0;
      // The next chunk's blocks (at 16 slots a block, 16 of 2 KiB of K and of V each).
      const int32_t next_end = ChunkEnd(chunk_end, end, bs);
      ChunkAhead ahead = AheadOf(a, table, chunk_end / bs,
                                 chunk_end < next_end ? (next_end - 1) / bs + 1 : 0,
                                 (end - 1) / bs + 1);
      const int32_t chunk_b0 = chunk0 / bs;
      if (lead > 0 && ahead.b0 >= ahead.b1) {
        const ChunkAhead cur = AheadOf(a, table, chunk_b0, (chunk_end - 1) / bs + 1, 0);
        if (cur.b0 >= cur.b1) {
          ahead.k = LeadOf(cur.k, ahead.k, lead);
          ahead.v = LeadOf(cur.v, ahead.v, lead);
        }
      }
      auto k_scores = [&](int32_t b, int32_t slot0, int32_t n, int32_t off) {
        KBlock kb{a.kv->KHead(table.blocks[b], a.layer, a.kv_head), nullptr};
        if (b == staged.block_idx) kb.rows = staged.rows + int64_t{a.kv_head} * bs * d;
        if (ahead.b0 < ahead.b1) {
          Prefetch p = ScatteredAhead(a, table, ahead, b - chunk_b0, false);
          KScores(a, kb, slot0, n, q, s, s.scores + off, cap, &p);
          PrefetchRest(p);
          return;
        }
        KScores(a, kb, slot0, n, q, s, s.scores + off, cap, &ahead.k);
      };
      if (k_runs) {
        ForEachRun(chunk0, chunk_end, bs, table, k_scores);
      } else {
        ForEachPiece(chunk0, chunk_end, bs, k_scores);
      }
      PrefetchRest(ahead.k);
      for (int32_t g = 0; g < a.n_group; ++g) {
        float* sc = s.scores + g * cap;
        const float m_new = std::max(run_max[g], kern.max_f32(sc, len));
        const float correction = std::exp(run_max[g] - m_new);  // 0 on the first chunk
        float* acc = acc_out + int64_t{g} * d;
        if (correction != 1.0f) {
          for (int32_t i = 0; i < d; ++i) acc[i] *= correction;
        }
        run_max[g] = m_new;
        run_sum[g] = run_sum[g] * correction + kern.exp_sum(sc, len, m_new);
      }
      if (v_in_place) {
        // One weighted sum per run of adjacent blocks.
        ForEachRun(chunk0, chunk_end, bs, table,
                   [&](int32_t b, int32_t slot0, int32_t n, int32_t off) {
                     const uint8_t* rows = a.kv->VHead(table.blocks[b], a.layer, a.kv_head) +
                                           slot0 * lay.v_row_bytes();
                     if (ahead.b0 < ahead.b1) {
                       Prefetch p = ScatteredAhead(a, table, ahead, b - chunk_b0, true);
                       kern.weighted_rows(s.scores + off, cap, a.n_group, vt, rows, n, d,
                                          acc_out, &p);
                       PrefetchRest(p);
                       return;
                     }
                     kern.weighted_rows(s.scores + off, cap, a.n_group, vt, rows, n, d, acc_out,
                                        &ahead.v);
                   });
      } else {
        // The chunk's V rows become floats once (s.rows, free again once KScores is done with
        // it), then one weighted sum over the whole chunk for the group: the outputs are
        // loaded and stored once per chunk, not once per block.
        ForEachPiece(chunk0, chunk_end, bs,
                     [&](int32_t b, int32_t slot0, int32_t n, int32_t off) {
                       DequantizeValues(a, a.kv->VHead(table.blocks[b], a.layer, a.kv_head),
                                        slot0, n, s.rows + int64_t{off} * d);
                       if (ahead.b0 < ahead.b1) {
                         PrefetchRest(ScatteredAhead(a, table, ahead, b - chunk_b0, true));
                       }
                     });
        kern.weighted_rows(s.scores, cap, a.n_group, DType::kF32, s.rows, len, d, acc_out,
                           &ahead.v);
      }
      PrefetchRest(ahead.v);
      // Next-chunk blocks past this chunk's count (its first chunk may be shorter).
      for (int32_t i = (chunk_end - 1) / bs + 1 - chunk_b0; ahead.b0 + i < ahead.b1; ++i) {
        PrefetchRest(ScatteredAhead(a, table, ahead, i, false));
        PrefetchRest(ScatteredAhead(a, table, ahead, i, true));
      }
      chunk0 = chunk_end;
    }
  }
}

}  // namespace

// A dimension-major q8_0 K meets the query in scores_q8t.
bool AttentionQuantizesQuery(KVFormat k_format) {
  return k_format.dimension_major(KVRole::kK) && k_format.row_type() == DType::kQ8_0;
}

bool AttentionWeighsVInIntegers(KVFormat v_format) {
  return !v_format.is_kivi() && v_format.row_type() == DType::kQ8_0;
}

int64_t AttentionScratchFloats(const KVLayout& layout, int32_t n_group) {
  return ScratchFloats(n_group, layout.block_size(), layout.shape().head_dim);
}

void AttendGroup(const AttentionArgs& a, float* out, float* scratch) {
  const int32_t d = a.kv->layout().shape().head_dim;
  Scratch s(scratch, a.n_group, a.kv->layout().block_size(), d);
  AttendRange(a, 0, std::numeric_limits<int32_t>::max(), out, s.run_max, s.run_sum, scratch);
  for (int32_t g = 0; g < a.n_group; ++g) {
    const float inv = s.run_sum[g] > 0 ? 1.0f / s.run_sum[g] : 0.0f;
    float* acc = out + int64_t{g} * d;
    for (int32_t i = 0; i < d; ++i) acc[i] *= inv;
  }
}

int64_t AttentionPartFloats(int32_t n_group, int32_t head_dim) {
  return int64_t{n_group} * head_dim + 2 * int64_t{n_group};
}

namespace {

// AttendRange into a part's layout (AttentionPartFloats): acc, then max, then sum.
void AttendRangeIntoPart(const AttentionArgs& a, int32_t lo, int32_t hi, float* part,
                         float* scratch, SlotClaim* claim) {
  const int64_t acc_floats = int64_t{a.n_group} * a.kv->layout().shape().head_dim;
  AttendRange(a, lo, hi, part, part + acc_floats, part + acc_floats + a.n_group, scratch, claim);
}

}  // namespace

void AttendGroupPart(const AttentionArgs& a, int32_t slot_begin, int32_t slot_end, float* part,
                     float* scratch) {
  AttendRangeIntoPart(a, slot_begin, slot_end, part, scratch, nullptr);
}

void MergeAttentionParts(const float* const* parts, int32_t n_parts, int32_t n_group,
                         int32_t head_dim, float* out) {
  const int64_t acc_floats = int64_t{n_group} * head_dim;
  for (int32_t g = 0; g < n_group; ++g) {
    float m = -std::numeric_limits<float>::infinity();
    for (int32_t p = 0; p < n_parts; ++p) m = std::max(m, parts[p][acc_floats + g]);
    float* o = out + int64_t{g} * head_dim;
    std::fill(o, o + head_dim, 0.0f);
    float sum = 0.0f;
    for (int32_t p = 0; p < n_parts; ++p) {
      const float* part = parts[p];
      const float part_sum = part[acc_floats + n_group + g];
      if (part_sum == 0.0f) continue;  // no slot (its max is −inf)
      const float c = std::exp(part[acc_floats + g] - m);
      sum += part_sum * c;
      const float* acc = part + int64_t{g} * head_dim;
      for (int32_t i = 0; i < head_dim; ++i) o[i] += acc[i] * c;
    }
    const float inv = sum > 0 ? 1.0f / sum : 0.0f;
    for (int32_t i = 0; i < head_dim; ++i) o[i] *= inv;
  }
}

namespace {

constexpr uint64_t PackClaim(int32_t next, int32_t limit) {
  return static_cast<uint64_t>(static_cast<uint32_t>(next)) << 32 | static_cast<uint32_t>(limit);
}
constexpr int32_t ClaimNext(uint64_t word) { return static_cast<int32_t>(word >> 32); }
constexpr int32_t ClaimLimit(uint64_t word) { return static_cast<int32_t>(word & 0xffffffffu); }

}  // namespace

void SlotClaim::Set(int32_t next, int32_t limit) { word_.store(PackClaim(next, limit)); }

int32_t SlotClaim::Next() const { return ClaimNext(word_.load()); }

int32_t SlotClaim::Unclaimed() const {
  const uint64_t w = word_.load();
  return std::max(0, ClaimLimit(w) - ClaimNext(w));
}

bool SlotClaim::TakeBackHalf(int32_t block_size, int32_t* begin, int32_t* end) {
  uint64_t w = word_.load();
  for (;;) {
    const int32_t next = ClaimNext(w), limit = ClaimLimit(w);
    int32_t chunks = 0;
    for (int32_t c = next; c < limit; c = ChunkEnd(c, limit, block_size)) ++chunks;
    if (chunks < 2) return false;
    int32_t mid = next;
    for (int32_t i = 0; i < (chunks + 1) / 2; ++i) mid = ChunkEnd(mid, limit, block_size);
    if (word_.compare_exchange_weak(w, PackClaim(next, mid))) {
      *begin = mid;
      *end = limit;
      return true;
    }
  }
}

bool SlotClaim::TakeChunk(int32_t from, int32_t to) {
  uint64_t w = word_.load();
  for (;;) {
    if (ClaimNext(w) != from || from >= ClaimLimit(w)) return false;
    if (word_.compare_exchange_weak(w, PackClaim(to, ClaimLimit(w)))) return true;
  }
}

void AttendGroupClaimed(const AttentionArgs& a, SlotClaim& claim, float* part, float* scratch) {
  AttendRangeIntoPart(a, claim.Next(), std::numeric_limits<int32_t>::max(), part, scratch,
                      &claim);
}

void AttendGroup_ref(const AttentionArgs& a, float* out) {
  const int32_t d = a.kv->layout().shape().head_dim;
  std::vector<float> row(d), q_seen(d);
  std::vector<BlockQ8Act> q8(d / kQK);
  for (int32_t g = 0; g < a.n_group; ++g) {
    std::vector<double> s;
    std::vector<int32_t> slots;
    for (int32_t sp = 0; sp < a.n_spans; ++sp) {
      const float* qg = a.spans[sp].q + int64_t{g} * d;
      if (AttentionQuantizesQuery(a.kv->layout().k_format())) {
        // The query as the kernel sees it: quantized, then read back exactly.
        ReferenceKernels().quantize_act(qg, q8.data(), d);
        for (int32_t i = 0; i < d; ++i) q_seen[i] = q8[i / kQK].d * q8[i / kQK].qs[i % kQK];
        qg = q_seen.data();
      }
      for (int32_t j = a.spans[sp].begin; j < a.spans[sp].end; ++j) {
        a.kv->ReadK(a.seq, a.layer, a.kv_head, j, row.data());
        double dot = 0;
        for (int32_t i = 0; i < d; ++i) dot += double{qg[i]} * row[i];
        s.push_back(dot * a.scale);
        slots.push_back(j);
      }
    }
    const double m = *std::max_element(s.begin(), s.end());
    double sum = 0;
    for (double& x : s) sum += (x = std::exp(x - m));
    std::vector<double> acc(d, 0.0);
    for (size_t j = 0; j < slots.size(); ++j) {
      a.kv->ReadV(a.seq, a.layer, a.kv_head, slots[j], row.data());
      for (int32_t i = 0; i < d; ++i) acc[i] += s[j] / sum * row[i];
    }
    for (int32_t i = 0; i < d; ++i) out[int64_t{g} * d + i] = static_cast<float>(acc[i]);
  }
}

}  // namespace kvllm
