// ATTENTION (forward): fused scaled dot-product attention, FlashAttention's
// online softmax on the CPU. Memory is O(T) per head: the [Tq, Tk] scores never
// exist.
//
// Grouped heads: consecutive heads whose k and v are the same memory (a
// broadcast leading dim, as a model's grouped-query attention passes them: q
// [B, Hkv, G, T, E] against k, v [B, Hkv, 1 -> G, T, E]) form one group. A
// thread packs a group's keys and values once (k^T in chunks of kChunk keys,
// each chunk contiguous; v row-major, zero past Tk) and keeps them while it
// works through the group's queries.
//
// Work unit: a tile of up to kTileRows query rows, the same kTilePos
// positions of each head of a (sub)group, so every packed key is loaded once
// for all of them. Per key block of kBlock keys the scores of the tile are
// register-blocked micro-kernels (rows x 2 vectors of keys, FMA chains over E),
// then each row's running max m, sum l and output accumulator are updated
// (rescaled by exp(m_old - m_new) when the block raises the max), then
// P V is a second micro-kernel (6 rows x up to 4 vectors of E). Key blocks
// past a tile's last visible key are never computed (the causal triangle), nor
// keys before its first (packed examples: segment ids), so packed attention
// costs about the sum of its examples'. Dropout (AttentionParams::keep < 1)
// scales each row's block weights by their mask factors (DropMask) after its
// sum is taken, before P V.
//
// Threads take contiguous runs of (group, tile) units of about equal work
// (a unit costs its rows times its visible keys). Every row's arithmetic
// depends only on its own q row and the key blocks (fixed from key 0; with
// segment ids from the tile's first visible chunk, and tiles are fixed by the
// shape), never on the split: results are the same for any thread count.
#include <cmath>
#include <cstring>
#include <limits>

#include "backends/cpu/kernels/attention_bf16.h"
#include "backends/cpu/kernels/attention_head.h"
#include "backends/cpu/kernels/attention_small.h"
#include "backends/cpu/kernels/common.h"
#include "backends/cpu/kernels/kernels.h"
#include "backends/cpu/kernels/row_ops.h"
#include "backends/cpu/kernels/vec_math.h"

namespace kiln::cpu {

namespace {

using namespace attn;
using vm::VF;
constexpr int64_t kW = vm::kW;
constexpr int64_t kChunk = 2 * kW;  // keys per score micro-kernel (2 vectors)
constexpr int64_t kBlock = 256;     // keys per online-softmax step
static_assert(kBlock % kChunk == 0);
constexpr int kRowsPV = 6;                 // rows per P V micro-kernel
constexpr int kRowsS = kW >= 16 ? 12 : 6;  // rows per score micro-kernel
constexpr int kNV = kW >= 16 ? 4 : 2;      // P V: vectors of E per call
constexpr int kTileRows = 12;              // a multiple of kRowsS and kRowsPV
static_assert(kTileRows % kRowsS == 0 && kTileRows % kRowsPV == 0);
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// S[r * kBlock + j] = scale * q_r . k_j for R rows (qt row-major, ld e) and
// the kChunk keys of one packed chunk (ktc[c * kChunk + j] = k_j[c]).
template <int R>
void chunk_scores(const float* qt, int64_t e, const float* ktc, float scale, float* S) {
  VF acc[R][2];
  for (int r = 0; r < R; ++r) acc[r][0] = acc[r][1] = vm::c<VF>(0.0f);
  for (int64_t c = 0; c < e; ++c) {
    const VF b0 = vm::loadv<VF>(ktc + c * kChunk), b1 = vm::loadv<VF>(ktc + c * kChunk + kW);
    for (int r = 0; r < R; ++r) {
      const VF a = vm::c<VF>(qt[r * e + c]);
      acc[r][0] = vm::madd(a, b0, acc[r][0]);
      acc[r][1] = vm::madd(a, b1, acc[r][1]);
    }
  }
  const VF vs = vm::c<VF>(scale);
  for (int r = 0; r < R; ++r) {
    vm::store(S + r * kBlock, acc[r][0] * vs);
    vm::store(S + r * kBlock + kW, acc[r][1] * vs);
  }
}

// O[r * e + c0 + ...] += sum over j < n of P[r * kBlock + j] v[j * e + c0 + ...]
// for kRowsPV rows and NV vectors of columns from c0 (the last one m lanes).
template <int NV>
void chunk_pv(const float* P, const float* v, int64_t n, int64_t e, int64_t c0, int m, float* O) {
  constexpr int R = kRowsPV;
  VF a[R][NV];
  for (int r = 0; r < R; ++r)
    for (int x = 0; x < NV; ++x) a[r][x] = vm::c<VF>(0.0f);
  for (int64_t j = 0; j < n; ++j) {
    VF b[NV];
    const float* vj = v + j * e + c0;
    for (int x = 0; x + 1 < NV; ++x) b[x] = vm::loadv<VF>(vj + x * kW);
    b[NV - 1] = vm::loadv<VF>(vj + (NV - 1) * kW, m);
    for (int r = 0; r < R; ++r) {
      const VF w = vm::c<VF>(P[r * kBlock + j]);
      for (int x = 0; x < NV; ++x) a[r][x] = vm::madd(w, b[x], a[r][x]);
    }
  }
  for (int r = 0; r < R; ++r) {
    float* o = O + r * e + c0;
    for (int x = 0; x + 1 < NV; ++x) vm::store(o + x * kW, vm::loadv<VF>(o + x * kW) + a[r][x]);
    const int64_t l = (NV - 1) * kW;
    vm::store(o + l, vm::loadv<VF>(o + l, m) + a[r][NV - 1], m);
  }
}

// The P V product of kRowsPV rows over all of E, in chunks of up to kNV vectors.
void rows_pv(const float* P, const float* v, int64_t n, int64_t e, float* O) {
  int64_t c0 = 0;
  for (; c0 + kNV * kW <= e; c0 += kNV * kW) chunk_pv<kNV>(P, v, n, e, c0, int(kW), O);
  while (c0 < e) {  // the tail, one vector at a time
    const int m = int(std::min<int64_t>(kW, e - c0));
    chunk_pv<1>(P, v, n, e, c0, m, O);
    c0 += kW;
  }
}

// One row of a key block in the online softmax: sr[a, n) are its visible
// scores (of jw written); the running max m and sum l are updated (the
// output accumulator o rescaled when the max rises), and sr becomes the
// block's probabilities exp(s - m), 0 outside [a, n). Whole vectors
// throughout: the invisible lanes (before a: keys of an earlier packed
// example) are set to -inf first (exp gives 0).
void block_softmax(float* sr, int64_t a, int64_t n, int64_t jw, float& m, float& l, float* o,
                   int64_t e) {
  const int64_t nv = (n + kW - 1) / kW;  // vectors holding visible scores
  std::fill(sr, sr + std::min(a, n), kNegInf);
  std::fill(sr + n, sr + nv * kW, kNegInf);
  VF mx = vm::c<VF>(kNegInf);
  for (int64_t v = 0; v < nv; ++v) mx = vm::max(mx, vm::loadv<VF>(sr + v * kW));
  const float bm = std::max(m, nv > 0 ? vm::hmax(mx) : kNegInf);
  if (bm == kNegInf) {  // nothing visible (or only -inf inputs) yet: weight 0
    std::fill(sr, sr + jw, 0.0f);
    return;
  }
  if (m != kNegInf && bm != m) {  // the max rose: rescale what came before
    const float corr = vm::exp(m - bm);
    l *= corr;
    const VF vc = vm::c<VF>(corr);
    for (int64_t c = 0; c < e; c += kW) {
      const int w = int(std::min(kW, e - c));
      vm::store(o + c, vm::loadv<VF>(o + c, w) * vc, w);
    }
  }
  m = bm;
  const VF vm_ = vm::c<VF>(bm);
  VF sum = vm::c<VF>(0.0f);
  for (int64_t v = 0; v < nv; ++v) {
    const VF p = vm::exp(vm::loadv<VF>(sr + v * kW) - vm_);
    sum = sum + p;
    vm::store(sr + v * kW, p);
  }
  l += vm::hsum(sum);
  std::fill(sr + nv * kW, sr + jw, 0.0f);  // keys past the row's causal limit
}

// k^T of tk keys in chunks: ktc = kt + (j / kChunk) * e * kChunk, key j's
// element c at ktc[c * kChunk + j % kChunk]; keys past tk are 0.
void pack_keys(const HeadMat& k, int64_t tk, int64_t e, float* kt, float* buf) {
  const int64_t chunks = (tk + kChunk - 1) / kChunk;
  std::memset(kt, 0, size_t(chunks * kChunk * e) * sizeof(float));
  for (int64_t j = 0; j < tk; ++j) {
    const float* r = k.row(j, e, buf);
    float* d = kt + (j / kChunk) * e * kChunk + j % kChunk;
    for (int64_t c = 0; c < e; ++c) d[c * kChunk] = r[c];
  }
}

// v row-major (ld e) for tk keys, rows up to a whole chunk past tk zero.
void pack_values(const HeadMat& v, int64_t tk, int64_t e, float* vp) {
  const int64_t rows = (tk + kChunk - 1) / kChunk * kChunk;
  for (int64_t j = 0; j < tk; ++j) {
    const float* r = v.row(j, e, vp + j * e);
    if (r != vp + j * e) std::memcpy(vp + j * e, r, size_t(e) * sizeof(float));
  }
  std::memset(vp + tk * e, 0, size_t((rows - tk) * e) * sizeof(float));
}

// How the heads group: gh consecutive heads share k and v (the largest such
// count dividing the head count), and a tile covers sub heads of a group
// (sub divides gh, at most kTileRows) times pos positions.
struct Grouping {
  int64_t gh = 1, sub = 1, pos = kTileRows;
};
Grouping grouping(const TensorNode* k, const TensorNode* v, int64_t heads) {
  Grouping g;
  int64_t run = 1;  // heads sharing head 0's k and v
  while (run < heads && head_of(k, run) == head_of(k, 0) && head_of(v, run) == head_of(v, 0)) ++run;
  for (int64_t gh = run; gh > 1; --gh) {
    if (heads % gh != 0) continue;
    bool ok = true;
    for (int64_t h = 0; h < heads && ok; ++h)
      ok = head_of(k, h) == head_of(k, h - h % gh) && head_of(v, h) == head_of(v, h - h % gh);
    if (ok) {
      g.gh = gh;
      break;
    }
  }
  for (int64_t s = std::min<int64_t>(g.gh, kTileRows); s >= 1; --s)
    if (g.gh % s == 0) {
      g.sub = s;
      break;
    }
  g.pos = std::max<int64_t>(1, kTileRows / g.sub);
  return g;
}

// Thread t's run of units u = (head block hb of `sub` heads) * tiles + tile.
struct UnitRange {
  int64_t begin = 0, end = 0;
};
UnitRange unit_range(const ThreadCtx& t, int64_t blocks, int64_t tiles, const Grouping& g,
                     const Dims& D, bool causal) {
  auto cost = [&](int64_t i) {  // the tile's rows times the keys its last row sees (+ overhead)
    const int64_t last = std::min(D.tq, (i + 1) * g.pos) - 1;
    return g.sub * g.pos * (visible(last, D.tq, D.tk, causal) + 8);
  };
  int64_t per_block = 0;
  for (int64_t i = 0; i < tiles; ++i) per_block += cost(i);
  const int64_t total = blocks * per_block;
  const int k = useful_threads(total, t.nth, D.e);
  if (t.ith >= k) return {};
  const int64_t lo = total * t.ith / k, hi = total * (t.ith + 1) / k;
  // Units whose cumulative start cost lies in [lo, hi).
  UnitRange r{blocks * tiles, blocks * tiles};
  int64_t start = 0;
  bool found = false;
  for (int64_t u = 0; u < blocks * tiles; ++u) {
    if (!found && start >= lo) r.begin = u, found = true;
    if (start >= hi) {
      r.end = u;
      break;
    }
    start += cost(u % tiles);
  }
  if (!found) r.begin = r.end;
  return r;
}

}  // namespace

void kernel_ATTENTION(TensorNode* dst, ThreadCtx& t) {
  if (attention_small_forward(dst, t)) return;  // small heads: whole heads per thread
  if (attention_bf16_forward(dst, t)) return;   // bf16 inputs on vdpbf16ps
  const TensorNode *q = dst->src[0], *k = dst->src[1], *v = dst->src[2];
  const AttentionParams p = op_params<Op::ATTENTION>(*dst);
  const Dims D = dims_of(q, k);
  if (dst->numel() == 0) return;
  const Grouping g = grouping(k, v, D.heads);
  const int64_t blocks = D.heads / g.sub, tiles = (D.tq + g.pos - 1) / g.pos;
  const UnitRange ur = unit_range(t, blocks, tiles, g, D, p.causal);
  if (ur.end <= ur.begin) return;
  KeyRanges ranges(dst, D, p);
  const DropMask drop(dst, p, D);
  const int64_t e = D.e, tkp = round_up(std::max<int64_t>(D.tk, 1), kChunk);
  const int64_t eb = round_up(e, kW);
  float* kt = static_cast<float*>(
      t.scratch(size_t(2 * tkp * e + kTileRows * (kBlock + 2 * e) + eb) * sizeof(float)));
  float* vp = kt + tkp * e;
  float* S = vp + tkp * e;             // kTileRows x kBlock: scores, then probabilities
  float* qt = S + kTileRows * kBlock;  // kTileRows x e: the tile's q rows
  float* O = qt + kTileRows * e;       // kTileRows x e: output accumulators
  float* rbuf = O + kTileRows * e;
  char* out = static_cast<char*>(dst->data);
  const int64_t osz = int64_t(dtype_size(dst->dtype));
  const char *packed_k = nullptr, *packed_v = nullptr;  // the heads in kt and vp
  for (int64_t u = ur.begin; u < ur.end; ++u) {
    const int64_t h0 = u / tiles * g.sub, i0 = u % tiles * g.pos;
    const HeadMat kh = head_of(k, h0), vh = head_of(v, h0);
    if (kh.base != packed_k || vh.base != packed_v) {
      pack_keys(kh, D.tk, e, kt, rbuf);
      pack_values(vh, D.tk, e, vp);
      packed_k = kh.base, packed_v = vh.base;
    }
    // Tile row r = s * pos + i: head h0 + s, query i0 + i; rows past tq are
    // zero padding (they see no key and are not written).
    const int64_t np = std::min(g.pos, D.tq - i0);
    const int rows = int(g.sub * g.pos);
    float m[kTileRows], l[kTileRows];
    int64_t n_row[kTileRows], lo_row[kTileRows];  // row r sees keys [lo_row, n_row)
    int64_t n_max = 0, lo_min = D.tk;
    for (int r = 0; r < rows; ++r) {
      const int64_t s = r / g.pos, i = r % g.pos;
      m[r] = kNegInf;
      l[r] = 0.0f;
      float* qr = qt + r * e;
      if (i >= np) {
        n_row[r] = lo_row[r] = 0;
        std::fill(qr, qr + e, 0.0f);
        continue;
      }
      const KeyRange kr = ranges.row(h0 + s, i0 + i);
      n_row[r] = kr.hi;
      lo_row[r] = kr.lo;
      n_max = std::max(n_max, n_row[r]);
      lo_min = std::min(lo_min, kr.lo);
      const float* src = head_of(q, h0 + s).row(i0 + i, e, qr);
      if (src != qr) std::memcpy(qr, src, size_t(e) * sizeof(float));
    }
    const int prow = int(round_up(rows, kRowsPV));  // rows the kernels run (a multiple of 6)
    for (int r = rows; r < prow; ++r) {
      m[r] = kNegInf, l[r] = 0.0f, n_row[r] = lo_row[r] = 0;
      std::fill(qt + r * e, qt + (r + 1) * e, 0.0f);
    }
    std::fill(O, O + prow * e, 0.0f);
    // Keys before every row's first visible one (earlier packed examples) are
    // skipped from a whole chunk on.
    const int64_t j_start = lo_min < n_max ? lo_min / kChunk * kChunk : 0;
    for (int64_t j0 = j_start; j0 < n_max; j0 += kBlock) {
      const int64_t jn = std::min(n_max - j0, kBlock);  // keys in this block
      for (int64_t jc = 0; jc < jn; jc += kChunk) {
        const float* ktc = kt + (j0 + jc) / kChunk * e * kChunk;
        int r0 = 0;
        for (; r0 + kRowsS <= prow; r0 += kRowsS)
          chunk_scores<kRowsS>(qt + r0 * e, e, ktc, p.scale, S + r0 * kBlock + jc);
        for (; r0 < prow; r0 += kRowsPV)
          chunk_scores<kRowsPV>(qt + r0 * e, e, ktc, p.scale, S + r0 * kBlock + jc);
      }
      const int64_t jw = round_up(jn, kChunk);  // score columns written
      for (int r = 0; r < prow; ++r) {
        const int64_t n = std::clamp(n_row[r] - j0, int64_t(0), jn);   // visible in block
        const int64_t a = std::clamp(lo_row[r] - j0, int64_t(0), jn);  // from here
        block_softmax(S + r * kBlock, a, n, jw, m[r], l[r], O + r * e, e);
        // Dropout after the sum (l normalises the undropped weights).
        if (drop.on() && n > a)
          drop.apply(h0 + r / g.pos, i0 + r % g.pos, j0 + a, n - a, S + r * kBlock + a);
      }
      for (int r0 = 0; r0 < prow; r0 += kRowsPV)
        rows_pv(S + r0 * kBlock, vp + j0 * e, jn, e, O + r0 * e);
    }
    for (int r = 0; r < rows; ++r) {
      const int64_t s = r / g.pos, i = r % g.pos;
      if (i >= np) continue;
      float* a = O + r * e;
      const float inv = l[r] > 0.0f ? 1.0f / l[r] : 0.0f;  // no visible key: zeros
      for (int64_t c = 0; c < e; ++c) a[c] *= inv;
      convert((const char*)a, DType::f32, 4, out + ((h0 + s) * D.tq + i0 + i) * e * osz, dst->dtype,
              osz, e);
    }
  }
}

}  // namespace kiln::cpu
