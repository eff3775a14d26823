// ATTENTION and ATTENTION_BACK: FlashAttention-style tiles in shared memory, f32
// FMA on the CUDA cores (ROPE and ROPE_BACK, of the same op family, are in attention_rope.cu).
//
// Attention. A block is 4 warps (128 threads) and owns 64 rows of one head:
// query rows (forward, dq) or key rows (dk, dv), 16 per warp. It walks the other
// side in tiles of NC rows staged in shared memory as f32 (bf16 inputs
// converted; any strides; rows past T and columns past E zero). Every operand
// is row-major [rows][EP + 4] (E padded to EP = 32, 64 or 128, the 4 extra
// floats place consecutive rows 4 banks apart). In a warp, lane (rg, cg) =
// (lane / 8, lane % 8) holds rows r * 4 + rg (r < 4) of its warp's 16, and score
// columns cg + 8 t or E columns cg * 4 + 32 t + u: every float4 read of a tile
// is then a broadcast or conflict free. Two register-tiled products do all the
// work: dot_tile (scores, rows . rows over E) and pv_tile (weights times rows).
// Grid: x the heads (flat over the leading dims), y the block's tiles of 64.
//
// Tiles and shared memory per block (all under sm_86/89's 99 KiB opt-in limit;
// the kernels raise their dynamic limit once):
//   EP    forward: NC, smem    backward: NC, smem (dq / dkv)
//   32             64, 44 KiB            32, 36 KiB
//   64             64, 68 KiB            32, 60 KiB (3 blocks per SM)
//   128            32, 75 KiB            16, 88 KiB
//
// Forward (k_attention): per key tile the scores, FlashAttention's online
// softmax in f32 (running max m and sum l per row, the output rescaled when m
// rises), the weights P through shared memory into O += P V. Causal: key tiles
// past the last visible key of the query tile are skipped. Rows that see no key
// (or only -inf scores) give zeros, as the CPU. Dropout (AttentionParams::keep
// < 1): the weights times the dropout op's mask factors, recomputed from the
// seed (Geom::drop) forward and in both backward kernels, never stored.
//
// Backward, deterministic (no atomics; every output element is written by one
// thread, once), recomputing P = exp(s - m) / l from the row stats:
//   k_attention_dq, per query tile: a first pass over the keys gives m and 1/l
//     of each row, and D = dO . O; they go to the workspace; a second pass
//     forms dS = P (dP - D), dP = dO v^T, and dq = scale dS K.
//   k_attention_dkv, per key tile (after k_attention_dq): over the query tiles
//     that see it, dv += P^T dO and dk += scale dS^T q.
// Grouped heads (k, v broadcast over a leading dim) need nothing special: the
// gradients are per query head, in k's and v's broadcast shapes (EXPAND's rule
// sums them). dq, dk, dv go where the CPU's grad_head puts them (flat, or in
// the tensor that q, k and v are slices of). E > 128 runs on the CPU.
#include <atomic>
#include <cmath>

#include "backends/cuda/common.cuh"
#include "kiln/error.h"
#include "kiln/ext/op_params.h"
#include "kiln/ext/rng.h"

namespace kiln::cuda {
namespace {

// ---------------------------------------------------------------- attention

constexpr int kAttnWarps = 4;
constexpr int kAttnThreads = 32 * kAttnWarps;
constexpr int kRowsPerBlock = 16 * kAttnWarps;  // a block's own rows (queries or keys)
constexpr int kMaxE = 128;

// The problem: leading dims (heads), lengths, head dim, scale and mask.
struct Geom {
  int nl;  // leading dims, 0 to 2
  int64_t lsize[2];
  int64_t heads, tq, tk;
  int e;
  float scale;
  bool causal;
  // Dropout on the weights (keep < 1): the dropout op's mask bits of the
  // [..., Tq, Tk] weights, rng_uniform(seed ^ *seed_t, (h Tq + i) Tk + j) < keep
  // (kiln/ext/rng.h, as the CPU's DropMask), kept ones times 1 / keep.
  // seed_t: the seed tensor on the device, or null.
  float keep, inv_keep;
  uint64_t seed;
  const int32_t* seed_t;
  // splitmix64 of the step's seed, computed by each thread once.
  __device__ uint64_t mixed_seed() const {
    return detail::splitmix64(seed_t ? seed ^ uint64_t(int64_t(*seed_t)) : seed);
  }
  // Dropout's factor of key j for query i of head h (mixed: mixed_seed()).
  __device__ float drop(uint64_t mixed, int64_t h, int64_t i, int64_t j) const {
    const uint64_t index = uint64_t((h * tq + i) * tk + j);
    return detail::rng_uniform_mixed(mixed, index) < keep ? inv_keep : 0.0f;
  }
  // Offset of head h (flat over the leading dims) for per-dim strides st.
  // (Constant indices: a loop over d would copy the parameters to the stack.)
  __device__ int64_t head_off(const int64_t (&st)[2], int64_t h) const {
    if (nl == 2) return (h % lsize[1]) * st[1] + (h / lsize[1]) * st[0];
    return nl == 1 ? h * st[0] : 0;
  }
  // Keys visible to query row i (none past Tq): all, or j <= i + Tk - Tq.
  __device__ int64_t visible(int64_t i) const {
    if (i >= tq) return 0;
    if (!causal) return tk;
    return min(max(i + tk - tq + 1, int64_t(0)), tk);
  }
};

// One [..., T, E] source: byte strides of its leading dims, rows and columns.
struct Operand {
  const char* p;
  DType dt;
  int64_t lead[2];
  int64_t rs, cs;
  bool vec;  // f32 or bf16 rows of E % 4 == 0 unit-stride elements, 4-element aligned
  __device__ const char* head(const Geom& g, int64_t h) const { return p + g.head_off(lead, h); }
};

// Where a gradient's head goes in ATTENTION_BACK's f32 result: element
// base + head_off(lead, h) + i * ld + c.
struct GradOut {
  float* p;
  int64_t base, ld;
  int64_t lead[2];
  __device__ float* head(const Geom& g, int64_t h) const { return p + base + g.head_off(lead, h); }
};

// What a lane holds: rows r * 4 + rg of its warp's 16 (r < 4); score columns
// cg + 8 t; E columns cg * 4 + 32 t + u.
struct Lane {
  int warp, rg, cg;
  __device__ int row(int r) const { return warp * 16 + r * 4 + rg; }
};
__device__ inline Lane lane_of() {
  const int l = int(threadIdx.x) & 31;
  return {int(threadIdx.x) >> 5, l >> 3, l & 7};
}

// Writes a lane's f32 accumulator (rows ln.row(r), r < 4, of the tile at row0;
// columns ln.cg * 4 + 32 t + u) to out with row stride ld: rows below n and
// columns below e only (the gradients dq, dk, dv).
template <int EP>
__device__ inline void store_tile(float* out, int64_t ld, int64_t row0, int64_t n, int e,
                                  const Lane& ln, const float (&acc)[4][EP / 8]) {
#pragma unroll
  for (int r = 0; r < 4; ++r) {
    const int64_t i = row0 + ln.row(r);
    if (i >= n) continue;
#pragma unroll
    for (int t = 0; t < EP / 32; ++t)
#pragma unroll
      for (int u = 0; u < 4; ++u) {
        const int c = ln.cg * 4 + 32 * t + u;
        if (c < e) out[i * ld + c] = acc[r][4 * t + u];
      }
  }
}

// Reductions over the 8 lanes that share a row (lane bits 0-2). Every lane
// gets the same bits (each step combines the same two values on both sides).
__device__ inline float group_max(float v) {
  for (int o = 1; o < 8; o <<= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}
__device__ inline float group_sum(float v) {
  for (int o = 1; o < 8; o <<= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ inline float warp_sum(float v) {
  for (int o = 1; o < 32; o <<= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// 4 consecutive elements of a vec operand as f32 (one 16- or 8-byte load).
__device__ inline float4 load4(const char* p, DType dt) {
  if (dt == DType::f32) return *reinterpret_cast<const float4*>(p);
  const uint2 u = *reinterpret_cast<const uint2*>(p);  // 4 bf16, the first in the low half
  return {from_bf16(uint16_t(u.x)), from_bf16(uint16_t(u.x >> 16)), from_bf16(uint16_t(u.y)),
          from_bf16(uint16_t(u.y >> 16))};
}

// Rows [r0, r0 + R) of a head into sm ([R][EP + 4], f32): rows past n and
// columns past e are zero (the products run over whole tiles).
template <int R, int EP>
__device__ void load_rows(float* sm, const char* head, const Operand& x, int64_t r0, int64_t n,
                          int e) {
  if (x.vec) {
    for (int f = int(threadIdx.x); f < R * EP / 4; f += kAttnThreads) {
      const int r = f / (EP / 4), c = f % (EP / 4) * 4;
      const int64_t row = r0 + r;
      float4 v = {0.0f, 0.0f, 0.0f, 0.0f};
      if (row < n && c < e) v = load4(head + row * x.rs + c * x.cs, x.dt);
      *reinterpret_cast<float4*>(sm + r * (EP + 4) + c) = v;
    }
    return;
  }
  for (int f = int(threadIdx.x); f < R * EP; f += kAttnThreads) {
    const int r = f / EP, c = f % EP;
    const int64_t row = r0 + r;
    float v = 0.0f;
    if (row < n && c < e) v = load_as_f32(head + row * x.rs + c * x.cs, x.dt);
    sm[r * (EP + 4) + c] = v;
  }
}

// acc[r][t] = A[row(r)] . B[cg + 8 t] over EP columns: A [64][EP + 4], B
// [NC][EP + 4], both row-major. (A sequential FMA chain over e, as the CPU.)
template <int EP, int NT>
__device__ void dot_tile(const float* A, const float* B, const Lane& ln, float (&acc)[4][NT]) {
  constexpr int ld = EP + 4;
#pragma unroll
  for (int r = 0; r < 4; ++r)
#pragma unroll
    for (int t = 0; t < NT; ++t) acc[r][t] = 0.0f;
#pragma unroll 2
  for (int e = 0; e < EP; e += 4) {
    float4 a[4], b[NT];
#pragma unroll
    for (int r = 0; r < 4; ++r) a[r] = *reinterpret_cast<const float4*>(A + ln.row(r) * ld + e);
#pragma unroll
    for (int t = 0; t < NT; ++t)
      b[t] = *reinterpret_cast<const float4*>(B + (ln.cg + 8 * t) * ld + e);
#pragma unroll
    for (int r = 0; r < 4; ++r)
#pragma unroll
      for (int t = 0; t < NT; ++t) {
        float s = acc[r][t];
        s = fmaf(a[r].x, b[t].x, s);
        s = fmaf(a[r].y, b[t].y, s);
        s = fmaf(a[r].z, b[t].z, s);
        acc[r][t] = fmaf(a[r].w, b[t].w, s);
      }
  }
}

// acc[r][4 t + u] += sum over k < NC of W[row(r)][k] B[k][cg * 4 + 32 t + u]:
// W [64][NC + 4] (weights), B [NC][EP + 4].
template <int EP, int NC>
__device__ void pv_tile(const float* W, const float* B, const Lane& ln, float (&acc)[4][EP / 8]) {
  constexpr int ldw = NC + 4, ldb = EP + 4, NV = EP / 32;
#pragma unroll 2
  for (int k = 0; k < NC; k += 4) {
    float4 w[4];
#pragma unroll
    for (int r = 0; r < 4; ++r) w[r] = *reinterpret_cast<const float4*>(W + ln.row(r) * ldw + k);
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) {
      float4 b[NV];
#pragma unroll
      for (int t = 0; t < NV; ++t)
        b[t] = *reinterpret_cast<const float4*>(B + (k + kk) * ldb + ln.cg * 4 + 32 * t);
#pragma unroll
      for (int r = 0; r < 4; ++r) {
        const float wr = kk == 0 ? w[r].x : kk == 1 ? w[r].y : kk == 2 ? w[r].z : w[r].w;
#pragma unroll
        for (int t = 0; t < NV; ++t) {
          acc[r][4 * t + 0] = fmaf(wr, b[t].x, acc[r][4 * t + 0]);
          acc[r][4 * t + 1] = fmaf(wr, b[t].y, acc[r][4 * t + 1]);
          acc[r][4 * t + 2] = fmaf(wr, b[t].z, acc[r][4 * t + 2]);
          acc[r][4 * t + 3] = fmaf(wr, b[t].w, acc[r][4 * t + 3]);
        }
      }
    }
  }
}

// One key tile of the online softmax for one row: s (raw dots of keys j0 +
// cg + 8 t) becomes the weights exp(scale s - m), 0 for keys past vis; m and
// l are updated. Returns the factor for what was accumulated before
// (exp(m_old - m_new)). No visible finite score yet: weights 0, factor 1.
template <int NT>
__device__ float online_step(float (&s)[NT], int64_t j0, int cg, int64_t vis, float scale, float& m,
                             float& l) {
  float mx = -INFINITY;
#pragma unroll
  for (int t = 0; t < NT; ++t) {
    s[t] = j0 + cg + 8 * t < vis ? s[t] * scale : -INFINITY;
    mx = fmaxf(mx, s[t]);
  }
  const float mn = fmaxf(m, group_max(mx));
  float corr = 1.0f, sum = 0.0f;
  if (mn == -INFINITY) {
#pragma unroll
    for (int t = 0; t < NT; ++t) s[t] = 0.0f;
  } else {
    corr = expf(m - mn);  // m = -inf: 0 (nothing accumulated yet)
#pragma unroll
    for (int t = 0; t < NT; ++t) {
      s[t] = expf(s[t] - mn);
      sum += s[t];
    }
  }
  l = l * corr + group_sum(sum);
  m = mn;
  return corr;
}

// Shared memory of the kernels (floats), for E padded to EP and tiles of NC.
template <int EP, int NC>
struct Smem {
  static constexpr int own = kRowsPerBlock * (EP + 4);  // a [64][EP + 4] tile
  static constexpr int other = NC * (EP + 4);           // a [NC][EP + 4] tile
  static constexpr int weights = kRowsPerBlock * (NC + 4);
  static constexpr size_t bytes(int floats) { return size_t(floats) * sizeof(float); }
  static constexpr size_t fwd() { return bytes(own + 2 * other + weights); }
  static constexpr size_t dq() { return bytes(2 * own + 2 * other + weights); }
  static constexpr size_t dkv() { return bytes(2 * own + 2 * other + weights + 3 * NC); }
};

// Forward: block (head, query tile), tiles taken last first (the causal
// triangle's longest rows start first). dst [heads, Tq, E] in q's dtype.
template <int EP, int NC>
__global__ void __launch_bounds__(kAttnThreads)
    k_attention(Geom g, Operand q, Operand k, Operand v, char* out, DType odt, int osz) {
  constexpr int NT = NC / 8, NE = EP / 8;
  extern __shared__ float4 attn_smem[];
  float* sQ = reinterpret_cast<float*>(attn_smem);
  float* sK = sQ + Smem<EP, NC>::own;
  float* sV = sK + Smem<EP, NC>::other;
  float* sP = sV + Smem<EP, NC>::other;
  const Lane ln = lane_of();
  const int64_t h = blockIdx.x;
  const int64_t i0 = int64_t(gridDim.y - 1 - blockIdx.y) * kRowsPerBlock;
  const char *qh = q.head(g, h), *kh = k.head(g, h), *vh = v.head(g, h);
  load_rows<kRowsPerBlock, EP>(sQ, qh, q, i0, g.tq, g.e);
  const int64_t nkeys = g.visible(min(i0 + kRowsPerBlock, g.tq) - 1);
  float m[4], l[4], o[4][NE];
  int64_t vis[4];
#pragma unroll
  for (int r = 0; r < 4; ++r) {
    m[r] = -INFINITY;
    l[r] = 0.0f;
    vis[r] = g.visible(i0 + ln.row(r));
#pragma unroll
    for (int c = 0; c < NE; ++c) o[r][c] = 0.0f;
  }
  const bool dropping = g.keep < 1.0f;
  const uint64_t mixed = dropping ? g.mixed_seed() : 0;
  for (int64_t j0 = 0; j0 < nkeys; j0 += NC) {
    __syncthreads();  // every warp is done with the previous K and V
    load_rows<NC, EP>(sK, kh, k, j0, g.tk, g.e);
    load_rows<NC, EP>(sV, vh, v, j0, g.tk, g.e);
    __syncthreads();
    float s[4][NT];
    dot_tile<EP, NT>(sQ, sK, ln, s);
#pragma unroll
    for (int r = 0; r < 4; ++r) {
      const float corr = online_step<NT>(s[r], j0, ln.cg, vis[r], g.scale, m[r], l[r]);
#pragma unroll
      for (int c = 0; c < NE; ++c) o[r][c] *= corr;
      // Dropout after the sum (l normalises the undropped weights); the
      // weights of invisible keys are 0 already.
      if (dropping)
#pragma unroll
        for (int t = 0; t < NT; ++t) {
          const int64_t j = j0 + ln.cg + 8 * t;
          if (j < vis[r]) s[r][t] *= g.drop(mixed, h, i0 + ln.row(r), j);
        }
#pragma unroll
      for (int t = 0; t < NT; ++t) sP[ln.row(r) * (NC + 4) + ln.cg + 8 * t] = s[r][t];
    }
    __syncwarp();  // a warp reads only its own rows of sP
    pv_tile<EP, NC>(sP, sV, ln, o);
  }
#pragma unroll
  for (int r = 0; r < 4; ++r) {
    const int64_t i = i0 + ln.row(r);
    if (i >= g.tq) continue;
    const float inv = l[r] > 0.0f ? 1.0f / l[r] : 0.0f;  // no visible key: zeros
    char* row = out + (h * g.tq + i) * g.e * osz;
#pragma unroll
    for (int t = 0; t < EP / 32; ++t)
#pragma unroll
      for (int u = 0; u < 4; ++u) {
        const int c = ln.cg * 4 + 32 * t + u;
        if (c < g.e) store_from_f32(row + c * osz, odt, o[r][4 * t + u] * inv);
      }
  }
}

// The backward's extra sources and workspace: per query row (h * Tq + i) its
// max m (0 when it sees nothing finite), 1/l (0 then) and D = dO . O.
struct BackArgs {
  Operand o, dout;
  float *m, *il, *d;
};

// dq (and the row stats): block (head, query tile), last tiles first.
template <int EP, int NC>
__global__ void __launch_bounds__(kAttnThreads)
    k_attention_dq(Geom g, Operand q, Operand k, Operand v, BackArgs b, GradOut dq) {
  constexpr int NT = NC / 8, NE = EP / 8, ld = EP + 4;
  extern __shared__ float4 attn_smem[];
  float* sQ = reinterpret_cast<float*>(attn_smem);
  float* sG = sQ + Smem<EP, NC>::own;  // dO
  float* sK = sG + Smem<EP, NC>::own;
  float* sV = sK + Smem<EP, NC>::other;
  float* sS = sV + Smem<EP, NC>::other;  // dS, and D of the block's rows first
  const Lane ln = lane_of();
  const int64_t h = blockIdx.x;
  const int64_t i0 = int64_t(gridDim.y - 1 - blockIdx.y) * kRowsPerBlock;
  const char *kh = k.head(g, h), *vh = v.head(g, h);
  load_rows<kRowsPerBlock, EP>(sQ, q.head(g, h), q, i0, g.tq, g.e);
  load_rows<kRowsPerBlock, EP>(sG, b.dout.head(g, h), b.dout, i0, g.tq, g.e);
  const int64_t nkeys = g.visible(min(i0 + kRowsPerBlock, g.tq) - 1);
  float m[4], l[4];
  int64_t vis[4];
#pragma unroll
  for (int r = 0; r < 4; ++r) {
    m[r] = -INFINITY;
    l[r] = 0.0f;
    vis[r] = g.visible(i0 + ln.row(r));
  }
  // Pass 1: each row's max and sum over its visible keys.
  for (int64_t j0 = 0; j0 < nkeys; j0 += NC) {
    __syncthreads();
    load_rows<NC, EP>(sK, kh, k, j0, g.tk, g.e);
    __syncthreads();
    float s[4][NT];
    dot_tile<EP, NT>(sQ, sK, ln, s);
#pragma unroll
    for (int r = 0; r < 4; ++r) online_step<NT>(s[r], j0, ln.cg, vis[r], g.scale, m[r], l[r]);
  }
  // D = dO . O for the warp's 16 rows (dO staged in sG; O read from memory).
  float* sD = sS;
  __syncthreads();  // sG is complete (pass 1 may have had no key tile)
  {
    const char* oh = b.o.head(g, h);
    for (int rr = 0; rr < 16; ++rr) {
      const int row = ln.warp * 16 + rr;
      const int64_t i = i0 + row;
      float d = 0.0f;
      if (i < g.tq)
        for (int c = int(threadIdx.x) & 31; c < g.e; c += 32)
          d += sG[row * ld + c] * load_as_f32(oh + i * b.o.rs + c * b.o.cs, b.o.dt);
      d = warp_sum(d);
      if ((threadIdx.x & 31) == 0) sD[row] = d;
    }
  }
  __syncwarp();
  float M[4], IL[4], D[4];
#pragma unroll
  for (int r = 0; r < 4; ++r) {
    M[r] = m[r] == -INFINITY ? 0.0f : m[r];  // with 1/l = 0: P = 0
    IL[r] = l[r] > 0.0f ? 1.0f / l[r] : 0.0f;
    D[r] = sD[ln.row(r)];
    const int64_t i = i0 + ln.row(r);
    if (ln.cg == 0 && i < g.tq) {
      b.m[h * g.tq + i] = M[r];
      b.il[h * g.tq + i] = IL[r];
      b.d[h * g.tq + i] = D[r];
    }
  }
  // Pass 2: dq = scale dS K, dS = P (dP f - D), dP = dO v^T, f dropout's
  // factors (1 without).
  const bool dropping = g.keep < 1.0f;
  const uint64_t mixed = dropping ? g.mixed_seed() : 0;
  float acc[4][NE];
#pragma unroll
  for (int r = 0; r < 4; ++r)
#pragma unroll
    for (int c = 0; c < NE; ++c) acc[r][c] = 0.0f;
  for (int64_t j0 = 0; j0 < nkeys; j0 += NC) {
    __syncthreads();  // also orders sD's reads before sS is rewritten
    load_rows<NC, EP>(sK, kh, k, j0, g.tk, g.e);
    load_rows<NC, EP>(sV, vh, v, j0, g.tk, g.e);
    __syncthreads();
    float p[4][NT], dp[4][NT];
    dot_tile<EP, NT>(sQ, sK, ln, p);
    dot_tile<EP, NT>(sG, sV, ln, dp);
#pragma unroll
    for (int r = 0; r < 4; ++r)
#pragma unroll
      for (int t = 0; t < NT; ++t) {
        const int64_t j = j0 + ln.cg + 8 * t;
        const bool seen = j < vis[r];
        const float pr = expf(p[r][t] * g.scale - M[r]) * IL[r];
        const float f = dropping && seen ? g.drop(mixed, h, i0 + ln.row(r), j) : 1.0f;
        sS[ln.row(r) * (NC + 4) + ln.cg + 8 * t] =
            seen ? pr * (dp[r][t] * f - D[r]) * g.scale : 0.0f;
      }
    __syncwarp();
    pv_tile<EP, NC>(sS, sK, ln, acc);
  }
  store_tile<EP>(dq.head(g, h), dq.ld, i0, g.tq, g.e, ln, acc);
}

// dk and dv: block (head, key tile), first tiles first (in the causal case
// they see the most queries). Needs k_attention_dq's row stats. At EP <= 64
// three blocks fit an SM's shared memory; 168 registers let them fit its
// register file too (measured: 13% faster than 2 blocks at 193 registers).
template <int EP, int NC>
__global__ void __launch_bounds__(kAttnThreads, EP <= 64 ? 3 : 1)
    k_attention_dkv(Geom g, Operand q, Operand k, Operand v, BackArgs b, GradOut dk, GradOut dv) {
  constexpr int NT = NC / 8, NE = EP / 8;
  extern __shared__ float4 attn_smem[];
  float* sK = reinterpret_cast<float*>(attn_smem);
  float* sV = sK + Smem<EP, NC>::own;
  float* sQ = sV + Smem<EP, NC>::own;
  float* sG = sQ + Smem<EP, NC>::other;  // dO
  float* sS = sG + Smem<EP, NC>::other;  // P^T, then scale dS^T
  float* sM = sS + Smem<EP, NC>::weights;
  float* sIL = sM + NC;
  float* sD = sIL + NC;
  const Lane ln = lane_of();
  const int64_t h = blockIdx.x;
  const int64_t j0 = int64_t(blockIdx.y) * kRowsPerBlock;
  const char *qh = q.head(g, h), *gh = b.dout.head(g, h);
  load_rows<kRowsPerBlock, EP>(sK, k.head(g, h), k, j0, g.tk, g.e);
  load_rows<kRowsPerBlock, EP>(sV, v.head(g, h), v, j0, g.tk, g.e);
  // Queries before the first that sees key j0 contribute nothing.
  int64_t first = g.causal ? max(int64_t(0), j0 - (g.tk - g.tq)) : 0;
  first = first / NC * NC;
  const bool dropping = g.keep < 1.0f;
  const uint64_t mixed = dropping ? g.mixed_seed() : 0;
  float dka[4][NE], dva[4][NE];
#pragma unroll
  for (int r = 0; r < 4; ++r)
#pragma unroll
    for (int c = 0; c < NE; ++c) dka[r][c] = dva[r][c] = 0.0f;
  for (int64_t i0 = first; i0 < g.tq; i0 += NC) {
    __syncthreads();
    load_rows<NC, EP>(sQ, qh, q, i0, g.tq, g.e);
    load_rows<NC, EP>(sG, gh, b.dout, i0, g.tq, g.e);
    for (int c = int(threadIdx.x); c < NC; c += kAttnThreads) {
      const int64_t i = i0 + c;
      const bool in = i < g.tq;
      sM[c] = in ? b.m[h * g.tq + i] : 0.0f;
      sIL[c] = in ? b.il[h * g.tq + i] : 0.0f;
      sD[c] = in ? b.d[h * g.tq + i] : 0.0f;
    }
    __syncthreads();
    // Lane element (r, t): key j0 + row(r), query i0 + cg + 8 t; f its
    // dropout factor (1 without).
    bool seen[4][NT];
    float p[4][NT], f[4][NT];
    dot_tile<EP, NT>(sK, sQ, ln, p);
#pragma unroll
    for (int r = 0; r < 4; ++r)
#pragma unroll
      for (int t = 0; t < NT; ++t) {
        const int c = ln.cg + 8 * t;
        seen[r][t] = j0 + ln.row(r) < g.visible(i0 + c);
        p[r][t] = seen[r][t] ? expf(p[r][t] * g.scale - sM[c]) * sIL[c] : 0.0f;
        f[r][t] = dropping && seen[r][t] ? g.drop(mixed, h, i0 + c, j0 + ln.row(r)) : 1.0f;
        sS[ln.row(r) * (NC + 4) + c] = p[r][t] * f[r][t];
      }
    __syncwarp();                      // a warp reads only its own rows of sS
    pv_tile<EP, NC>(sS, sG, ln, dva);  // dv += (P f)^T dO
    float dp[4][NT];
    dot_tile<EP, NT>(sV, sG, ln, dp);  // dP^T: v_j . dO_i
    __syncwarp();                      // the warp is done reading P^T
#pragma unroll
    for (int r = 0; r < 4; ++r)
#pragma unroll
      for (int t = 0; t < NT; ++t) {
        const int c = ln.cg + 8 * t;
        sS[ln.row(r) * (NC + 4) + c] =
            seen[r][t] ? p[r][t] * (dp[r][t] * f[r][t] - sD[c]) * g.scale : 0.0f;
      }
    __syncwarp();
    pv_tile<EP, NC>(sS, sQ, ln, dka);  // dk += scale dS^T q
  }
  store_tile<EP>(dk.head(g, h), dk.ld, j0, g.tk, g.e, ln, dka);
  store_tile<EP>(dv.head(g, h), dv.ld, j0, g.tk, g.e, ln, dva);
}

// ---- host side

Geom geom_of(const TensorNode* dst) {
  const TensorNode *q = dst->src[0], *k = dst->src[1];
  const int nd = q->shape.ndim();
  const AttentionParams p = op_params<AttentionParams>(*dst);
  Geom g{};
  g.nl = nd - 2;
  g.heads = 1;
  for (int d = 0; d < g.nl; ++d) {
    g.lsize[d] = q->shape[d];
    g.heads *= q->shape[d];
  }
  g.tq = q->shape[nd - 2];
  g.tk = k->shape[nd - 2];
  g.e = int(q->shape[nd - 1]);
  g.scale = p.scale;
  g.causal = p.causal;
  g.keep = p.keep;
  g.inv_keep = 1.0f / p.keep;
  g.seed = uint64_t(p.seed);
  // The seed tensor: the last source when seeded (after the segment ids,
  // which the CUDA kernels do not take).
  g.seed_t = p.seeded ? static_cast<const int32_t*>(dst->src[dst->n_src - 1]->data) : nullptr;
  return g;
}

Operand operand_of(const TensorNode* t) {
  const int nd = t->shape.ndim();
  Operand x{};
  x.p = static_cast<const char*>(t->data);
  x.dt = t->dtype;
  for (int d = 0; d < nd - 2; ++d) x.lead[d] = t->stride[size_t(d)];
  x.rs = t->stride[size_t(nd - 2)];
  x.cs = t->stride[size_t(nd - 1)];
  // Vector loads: 4 elements at once wherever a row's group of 4 starts.
  const int64_t es = int64_t(t->elem_size()), a = 4 * es;
  x.vec = (t->dtype == DType::f32 || t->dtype == DType::bf16) && x.cs == es &&
          t->shape[nd - 1] % 4 == 0 && reinterpret_cast<uintptr_t>(x.p) % uintptr_t(a) == 0 &&
          x.rs % a == 0;
  for (int d = 0; d < nd - 2; ++d) x.vec = x.vec && x.lead[d] % a == 0;
  return x;
}

// Where ATTENTION_BACK puts the gradient of source i (0 q, 1 k, 2 v), as the
// CPU's grad_head: flat (each dense after the ones before it), or shaped like
// the tensor q, k and v are slices of, each where its source sits in it.
GradOut grad_out(TensorNode* dst, int i, const Geom& g) {
  const TensorNode* s = dst->src[i];
  const int nd = s->shape.ndim();
  GradOut o{};
  o.p = static_cast<float*>(dst->data);
  if (dst->shape.ndim() == 1) {
    for (int j = 0; j < i; ++j) o.base += dst->src[j]->numel();
    o.ld = s->shape[nd - 1];
    int64_t st = s->shape[nd - 2] * s->shape[nd - 1];
    for (int d = g.nl - 1; d >= 0; --d) {
      o.lead[d] = st;
      st *= g.lsize[d];
    }
    return o;
  }
  const TensorNode *q = dst->src[0], *k = dst->src[1], *v = dst->src[2];
  const size_t lo = std::min({q->view_offs, k->view_offs, v->view_offs});
  const int64_t es = int64_t(s->elem_size());
  o.base = int64_t(s->view_offs - lo) / es;
  for (int d = 0; d < g.nl; ++d) o.lead[d] = s->stride[size_t(d)] / es;
  o.ld = s->stride[size_t(nd - 2)] / es;
  return o;
}

// E padded to the kernels' EP (the table at the top gives each EP's tiles).
int padded_e(int64_t e) { return e <= 32 ? 32 : e <= 64 ? 64 : 128; }

// Raises a kernel's dynamic shared memory limit, once per kernel and device
// (a function attribute is the current device's; the first run of a node list
// is eager, never inside a graph capture). `done`: a bit per device, set by
// any thread (backends of two devices may run in two threads).
template <class Kernel>
void allow_smem(Kernel* kernel, size_t bytes, std::atomic<uint64_t>& done) {
  int dev = 0;
  check(cudaGetDevice(&dev), "attention: cudaGetDevice");
  const uint64_t bit = dev >= 0 && dev < 64 ? uint64_t(1) << dev : 0;
  if (bit && (done.load(std::memory_order_acquire) & bit)) return;
  check(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(bytes)),
        "attention: cudaFuncSetAttribute");
  done.fetch_or(bit, std::memory_order_release);
}

unsigned tiles(int64_t n) { return unsigned((n + kRowsPerBlock - 1) / kRowsPerBlock); }

template <int EP, int NC>
void attention_fwd(TensorNode* dst, const Geom& g, cudaStream_t st) {
  static std::atomic<uint64_t> ready{0};
  constexpr size_t smem = Smem<EP, NC>::fwd();
  allow_smem(k_attention<EP, NC>, smem, ready);
  const dim3 grid(unsigned(g.heads), tiles(g.tq));
  k_attention<EP, NC><<<grid, kAttnThreads, smem, st>>>(
      g, operand_of(dst->src[0]), operand_of(dst->src[1]), operand_of(dst->src[2]),
      static_cast<char*>(dst->data), dst->dtype, int(dst->elem_size()));
  check_launch("attention");
}

template <int EP, int NC>
void attention_back(TensorNode* dst, const Geom& g, const Launch& L) {
  static std::atomic<uint64_t> ready_dq{0}, ready_dkv{0};
  constexpr size_t smem_dq = Smem<EP, NC>::dq(), smem_dkv = Smem<EP, NC>::dkv();
  allow_smem(k_attention_dq<EP, NC>, smem_dq, ready_dq);
  allow_smem(k_attention_dkv<EP, NC>, smem_dkv, ready_dkv);
  const Operand q = operand_of(dst->src[0]), k = operand_of(dst->src[1]),
                v = operand_of(dst->src[2]);
  const int64_t rows = g.heads * g.tq;
  float* ws = reinterpret_cast<float*>(L.ws);
  const BackArgs b{operand_of(dst->src[3]), operand_of(dst->src[4]), ws, ws + rows, ws + 2 * rows};
  if (g.tq > 0) {
    k_attention_dq<EP, NC>
        <<<dim3(unsigned(g.heads), tiles(g.tq)), kAttnThreads, smem_dq, L.stream>>>(
            g, q, k, v, b, grad_out(dst, 0, g));
    check_launch("attention_back (dq)");
  }
  if (g.tk > 0) {
    k_attention_dkv<EP, NC>
        <<<dim3(unsigned(g.heads), tiles(g.tk)), kAttnThreads, smem_dkv, L.stream>>>(
            g, q, k, v, b, grad_out(dst, 1, g), grad_out(dst, 2, g));
    check_launch("attention_back (dk, dv)");
  }
}

void attention_ops(TensorNode* dst, const Launch& L) {
  const Geom g = geom_of(dst);
  if (g.heads == 0 || g.e == 0) return;
  if (dst->op == Op::ATTENTION) {
    if (g.tq == 0) return;
    switch (padded_e(g.e)) {
      case 32: attention_fwd<32, 64>(dst, g, L.stream); break;
      case 64: attention_fwd<64, 64>(dst, g, L.stream); break;
      default: attention_fwd<128, 32>(dst, g, L.stream); break;
    }
    return;
  }
  switch (padded_e(g.e)) {
    case 32: attention_back<32, 32>(dst, g, L); break;
    case 64: attention_back<64, 32>(dst, g, L); break;
    default: attention_back<128, 16>(dst, g, L); break;
  }
}

static_assert(Smem<64, 64>::fwd() <= 99 * 1024 && Smem<128, 32>::fwd() <= 99 * 1024 &&
              Smem<64, 32>::dkv() <= 99 * 1024 && Smem<128, 16>::dkv() <= 99 * 1024);

// q, k, v f32 or bf16 (one dtype), no segment ids, E <= 128, grids within CUDA's limits; the
// backward's O and dO of any float dtype, and a packed result only as the
// autodiff rule makes it (q, k, v views of one tensor).
bool attention_supports(const TensorNode* n) {
  const TensorNode *q = n->src[0], *k = n->src[1], *v = n->src[2];
  // Segment ids (packed examples): the CPU kernels only; the scheduler runs
  // the node there.
  const AttentionParams prm = op_params<AttentionParams>(*n);
  if (prm.segmented) return false;
  if (prm.seeded && n->src[n->n_src - 1]->dtype != DType::i32) return false;
  if (q->dtype != DType::f32 && q->dtype != DType::bf16) return false;
  if (k->dtype != q->dtype || v->dtype != q->dtype) return false;
  const int nd = q->shape.ndim();
  if (nd < 2 || nd > 4 || q->shape[nd - 1] > kMaxE) return false;
  const int64_t limit = int64_t(65535) * kRowsPerBlock;
  if (q->shape[nd - 2] > limit || k->shape[nd - 2] > limit) return false;
  int64_t heads = 1;
  for (int d = 0; d < nd - 2; ++d) heads *= q->shape[d];
  if (heads > INT32_MAX) return false;
  if (n->op == Op::ATTENTION) return n->dtype == q->dtype;
  if (n->dtype != DType::f32 || !is_float(n->src[3]->dtype) || !is_float(n->src[4]->dtype))
    return false;
  if (n->shape.ndim() == 1) return true;
  return q->view_src && k->view_src == q->view_src && v->view_src == q->view_src;
}

// ATTENTION_BACK's row stats: m, 1/l and D per query row.
size_t attention_workspace(const TensorNode* n) {
  if (n->op != Op::ATTENTION_BACK) return 0;
  const TensorNode* q = n->src[0];
  const int nd = q->shape.ndim();
  return size_t(3) * size_t(q->numel() / std::max<int64_t>(1, q->shape[nd - 1])) * sizeof(float);
}

}  // namespace

OpKernel attention_kernel(Op op) {
  switch (op) {
    case Op::ATTENTION:
    case Op::ATTENTION_BACK: return {attention_supports, attention_ops, attention_workspace};
    case Op::ROPE:
    case Op::ROPE_BACK: return rope_kernel(op);
    default: return {};
  }
}

}  // namespace kiln::cuda
