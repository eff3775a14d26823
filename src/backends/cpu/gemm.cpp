// GEMM driver (BLIS-style blocking, loops reordered for work stealing):
//   for jc in N by ncb:            B[:, jc:jc+ncb] packed for all of K (KC x NR
//                                  strips), shared by all threads: packed
//                                  cooperatively (each thread strips that
//                                  its column of the grid computes), then a
//                                  barrier; or, when all of B is one small
//                                  panel, packed by every thread for itself
//                                  (no barrier; Plan::private_b)
//     for each row chunk (<= MC):  the work units; thread i owns those of its
//                                  rectangle of C and, when done, takes units
//                                  of slower threads (atomic counters)
//       for pc in K by KC:         A block mc x kc, packed by the unit's thread
//         for jr in the strips:    micro-kernel over each MR x NR tile
//           for ir in the chunk by MR:
// K is never split across threads, and the K blocking depends only on K, so
// every C element gets the same operations whatever the thread count and
// whichever thread computes it.
// With A and B both bf16 (and AVX512_BF16) the same driver runs on bf16 pairs
// (BF16Path: pair-interleaved packing, vdpbf16ps kernel, KC_BF16).
// An optional bias row is added to each C tile by the micro-kernel that runs
// its last K block, before it stores the tile (the small paths add it as they
// store C). A bf16 C (GemmArgs::C_bf16) takes each tile's K blocks back to
// back into an f32 tile in L1, rounded into C once complete; the small paths
// compute into an f32 copy of C on thread 0 and round it.
// Special cases: products under kSoloWork multiply-adds run on thread 0 alone;
// M <= 4 with row-contiguous B and N <= 4 with row-contiguous A skip packing
// (gemm_small_m.cpp, gemm_small_n.cpp). The choice depends only on the args.
#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <new>
#include <vector>

#include "backends/cpu/gemm.h"
#include "backends/cpu/gemm_convert.h"
#include "backends/cpu/gemm_internal.h"
#include "backends/cpu/kernels/common.h"

#if defined(KILN_GEMM_AVX512)
#include "backends/cpu/intrinsics.h"
#endif

namespace kiln::cpu {

using namespace gemm_detail;

namespace {

struct Grid {
  int tm = 1, tn = 1;  // threads along M and N; tm*tn <= nth
};

// Picks the grid of thread rectangles with the least estimated time per k step
// on the busiest thread: its micro-tiles, packing its own A rows, and reading
// the B strips that other threads packed (B packing itself is shared evenly
// whatever the grid). Each thread packs strips of its own grid column, so
// (tm-1)/tm of a thread's B comes from other cores' caches, and again for
// every row chunk once B outgrows the L2. kColCost, that cost per column and
// k, is empirical (2-core Zen 5 VM shared with other work, bf16): it moves the
// weight-gradient products with M <= 256 and the products with N >= 384 to an
// N split, which ran them as fast when the machine was calm and up to 1.4x
// faster (medians) when other processes loaded the caches; with N = 128 and
// M >= 384 splitting M stays ahead.
// rows_local: A's rows (contiguous in k) are activations or gradients of a
// graph, written by an op that split its rows over the same threads, so a
// thread finds 1/nth of them in its own cache: with tm < nth it packs rows
// other cores wrote, at kRemoteRowCost more per row and k. (An isolated
// benchmark never sees this: there A is in both caches.) In kiln-gpt's bf16
// step this moved the [768 x 128] x [128 x 384 / 512] products to an M split:
// 13-25% faster per node when other processes loaded the machine, level when
// it was calm (docs/benchmarks.md).
Grid choose_grid(int64_t M, int64_t N, int nth, bool rows_local) {
#if defined(KILN_GEMM_AVX512)
  constexpr double kTileCost = MR * NR / 32.0, kRowCost = 0.5;
#elif defined(KILN_GEMM_AVX2)
  constexpr double kTileCost = MR * NR / 16.0, kRowCost = 0.5;
#else
  constexpr double kTileCost = MR * NR / 4.0, kRowCost = 1.0;
#endif
  constexpr double kColCost = 1.0, kRemoteRowCost = 0.5;
  const int64_t pm = ceil_div(M, MR), pn = ceil_div(N, NR);
  Grid best;
  double best_cost = -1;
  for (int tm = nth; tm >= 1; --tm) {  // ties go to the larger M split
    const int tn = nth / tm;
    const double mp = double(ceil_div(pm, tm)), np = double(ceil_div(pn, tn));
    const double remote_rows = rows_local ? 1.0 - double(tm) / nth : 0.0;
    const double cost = mp * np * kTileCost + mp * MR * (kRowCost + kRemoteRowCost * remote_rows) +
                        np * NR * kColCost * (tm - 1) / tm;
    if (best_cost < 0 || cost < best_cost) {
      best_cost = cost;
      best = {tm, tn};
    }
  }
  return best;
}

// Below this many multiply-adds one thread does the whole product: splitting
// would save less than the synchronization costs.
constexpr double kSoloWork = 1 << 18;

// Packed B holds all of K for ncb columns at a time: at most this many floats
// (plus rounding) unless K alone is larger than that. 4 MiB: every chunk of
// rows streams the panel again, so it should stay in the L3 beside the other
// work (the LM head's B, 113 MB, in 16 MiB panels ran 13% slower, in 1-2 MiB
// ones 2-4%; the layers' B fit in one panel either way).
constexpr int64_t kBPanelFloats = int64_t(1) << 20;

// A B panel packed all at once of at most this many bytes is packed by every
// thread for itself (Plan::private_b): no barrier after the packing, and no
// packed line written by one core and read by the other. Sharing such a panel
// cost more in coherence traffic (each call's packing invalidating the copies
// the other core read in the last one, then reading half of it from that
// core) than packing all of it twice: the GPT-sized bf16 products ran up to
// 25% faster with it private (most 3-19%; docs/benchmarks.md), a 1 MiB limit
// (the c_proj weight gradient's 768 KiB B too) was no faster.
constexpr size_t kPrivateBBytes = size_t(256) << 10;

// A chunk's rows of A packed for all of K at once when they take at most this
// (about half of a 1 MiB L2, where they stay while the chunk's strips go by).
constexpr size_t kAllKBytes = size_t(512) << 10;

// The packed paths: element type of the packed blocks, K block length, k
// granule (packed blocks hold kc rounded up to it) and the routines.
struct F32Path {
  using E = float;
  static constexpr int64_t kKC = KC, kKStep = 1;
  static void pack_a(const GemmOperand& A, int64_t i0, int64_t k0, int64_t mc, int64_t kc, E* d) {
    gemm_detail::pack_a(A, i0, k0, mc, kc, d);
  }
  static void pack_b(const GemmOperand& B, int64_t k0, int64_t j0, int64_t kc, int64_t nc, E* d) {
    gemm_detail::pack_b(B, k0, j0, kc, nc, d);
  }
  static void kernel(int64_t kc, const E* a, const E* b, float* c, int64_t ldc, int m, int n,
                     bool add_c, const float* bias) {
    gemm_detail::kernel(kc, a, b, c, ldc, m, n, add_c, bias);
  }
};

#if defined(KILN_GEMM_BF16)
struct BF16Path {
  using E = uint16_t;
  static constexpr int64_t kKC = KC_BF16, kKStep = 2;
  static void pack_a(const GemmOperand& A, int64_t i0, int64_t k0, int64_t mc, int64_t kc, E* d) {
    if (A.round_bf16) pack_a_bf16_round(A, i0, k0, mc, kc, d);
    else pack_a_bf16(A, i0, k0, mc, kc, d);
  }
  static void pack_b(const GemmOperand& B, int64_t k0, int64_t j0, int64_t kc, int64_t nc, E* d) {
    if (B.round_bf16) pack_b_bf16_round(B, k0, j0, kc, nc, d);
    else pack_b_bf16(B, k0, j0, kc, nc, d);
  }
  static void kernel(int64_t kc, const E* a, const E* b, float* c, int64_t ldc, int m, int n,
                     bool add_c, const float* bias) {
    kernel_bf16(kc, a, b, c, ldc, m, n, add_c, bias);
  }
};
#endif

// Everything the threads must agree on, computed identically on each.
template <class P>
struct Plan {
  int64_t M, N, K;
  int64_t nkb, kcb;  // K blocks: the arithmetic depends on these (and on K only)
  int64_t kstride;   // kcb rounded up to P::kKStep: K block p of packed B at p*kstride*ncb
  int64_t ncb;       // columns of B packed at once (a multiple of NR)
  int64_t pm, pn;    // MR panels of M, NR strips of N
  Grid grid;
  int nth;
  bool even_panels;  // see row()
  bool private_b;    // every thread packs all of B itself (kPrivateBBytes); then grid.tm == nth

  Plan(const GemmArgs& g, int nth_) : M(g.M), N(g.N), K(g.K), nth(nth_) {
    nkb = ceil_div(K, P::kKC);
    kcb = nkb == 1 ? K : round_up(ceil_div(K, nkb), 16);
    nkb = ceil_div(K, kcb);  // (no empty last block)
    kstride = round_up(kcb, P::kKStep);
    const int64_t cap = std::max<int64_t>(NR, kBPanelFloats / (nkb * kstride) / NR * NR);
    const int64_t nnb = ceil_div(N, cap);
    ncb = round_up(ceil_div(N, nnb), NR);
    pm = ceil_div(M, MR);
    pn = ceil_div(N, NR);
    even_panels = M - (pm - 1) * MR < MR / 2;
    private_b = nth > 1 && ncb >= N && pm >= nth &&
                size_t(nkb * kstride * ncb) * sizeof(typename P::E) <= kPrivateBBytes;
    // With B private every thread needs all of it anyway: split M only.
    grid = private_b ? Grid{nth, 1} : choose_grid(M, N, nth, g.A.cs == 1 && g.A.rs != 1);
  }
  // C's rows in panels: panel q is rows [row(q), row(q+1)), MR each but the
  // last, unless that one would have under MR / 2 rows: then the panels are as
  // even as MR allows, ceil(M / pm) rows or one fewer (M = 128: ten panels of
  // 12 or 13 rows, not nine of 14 and one of 2, which took as long as half a
  // full one and, last in one thread's share, made the other wait: 8% on
  // kiln-gpt's c_proj weight gradient). Full panels are packed in one call
  // per chunk (M = 768, even panels ran ~2% slower).
  int64_t row(int64_t q) const { return even_panels ? q * M / pm : std::min(q * MR, M); }
  int64_t rows(int64_t q) const { return row(q + 1) - row(q); }
  int64_t kc(int64_t p) const { return std::min(kcb, K - p * kcb); }
  // Packed length of K block p (panel and strip stride in k).
  int64_t kc_packed(int64_t p) const { return round_up(kc(p), P::kKStep); }

  // Thread i's rectangle of C: M panels [p0, p1), N strips [q0, q1), split
  // into `chunks` row chunks (the work units, in this order).
  struct Rect {
    int64_t p0 = 0, p1 = 0, q0 = 0, q1 = 0, chunks = 0;
  };
  Rect rect(int i) const {
    Rect r;
    if (i >= grid.tm * grid.tn) return r;
    const int ti = i / grid.tn, tj = i % grid.tn;
    r.p0 = pm * ti / grid.tm, r.p1 = pm * (ti + 1) / grid.tm;
    r.q0 = pn * tj / grid.tn, r.q1 = pn * (tj + 1) / grid.tn;
    const int64_t panels = r.p1 - r.p0;
    if (panels <= 0 || r.q1 <= r.q0) return {};
    // Row chunks of at most MC rows; with several threads at least 4 per
    // thread (when there are enough panels) so that a thread that finishes
    // early can take over some of a slower (e.g. descheduled) thread's work.
    r.chunks = ceil_div(panels, MC / MR);
    if (nth > 1) r.chunks = std::max(r.chunks, std::min<int64_t>(panels, 4));
    return r;
  }

  // Thread i's share of packing the B panel at column jc (ns strips): items
  // (strip s0 + it / nkb, K block it % nkb) for it in [it0, it1). The strips
  // of its column of the grid, split over that column's tm threads: with
  // tn > 1 each thread's part of B is packed into its own cache (a thread
  // reading strips another packed takes them from that core's cache).
  struct PackShare {
    int64_t s0 = 0, it0 = 0, it1 = 0;
  };
  PackShare pack_share(int i, int64_t jc, int64_t ns) const {
    if (i >= grid.tm * grid.tn) return {};
    const int ti = i / grid.tn, tj = i % grid.tn;
    const int64_t s_base = jc / NR;
    const int64_t s0 = std::clamp<int64_t>(pn * tj / grid.tn - s_base, 0, ns);
    const int64_t s1 = std::clamp<int64_t>(pn * (tj + 1) / grid.tn - s_base, 0, ns);
    const int64_t items = (s1 - s0) * nkb;
    return {s0, items * ti / grid.tm, items * (ti + 1) / grid.tm};
  }
};

// C[0:m, 0:n] += bias[0:n] for K = 0, where no micro-kernel adds GemmArgs::bias
// (the blocked paths' kernels add it to each tile before storing it).
void add_bias(float* c, int64_t ldc, int64_t m, int64_t n, const float* bias) {
  for (int64_t i = 0; i < m; ++i, c += ldc)
    for (int64_t j = 0; j < n; ++j) c[j] += bias[j];
}

// Chunk c of rectangle r: its panels [q0, q1) of C's rows (Plan::row) x this
// panel's strips [s_lo, s_hi), over all of K. Packs its own A blocks: with
// a_all_k all K blocks of the chunk at once (block p at p * a_stride), then
// each tile of C runs its K blocks back to back while it is in L1 (C rows a
// multiple of 4 KiB apart, as the [T, 49152] logits of an LM head, share a few
// cache sets, so a C tile revisited once per K block after a whole panel of
// strips would come from memory); otherwise one K block of A at a time, each
// over all strips. The per-element arithmetic is the same either way: K
// blocks in order.
template <class P, class E = typename P::E>
void run_chunk(const GemmArgs& g, const Plan<P>& pl, const typename Plan<P>::Rect& r, int64_t c,
               int64_t jc, int64_t ns, const E* bbuf, E* abuf, bool a_all_k) {
  const int64_t panels = r.p1 - r.p0;
  const int64_t q0 = r.p0 + panels * c / r.chunks, q1 = r.p0 + panels * (c + 1) / r.chunks;
  const int64_t s_base = jc / NR;
  const int64_t s_lo = std::max(r.q0, s_base) - s_base, s_hi = std::min(r.q1, s_base + ns) - s_base;
  if (q1 <= q0 || s_hi <= s_lo) return;
  const int64_t ldc = g.ldc;
  // Packs K block p of the chunk's panels, panel q at dst + (q - q0) * kc_packed * MR.
  auto pack_panels = [&](int64_t p, E* dst) {
    if (!pl.even_panels)  // MR rows each (but the last): pack_a's own panels
      return P::pack_a(g.A, pl.row(q0), p * pl.kcb, pl.row(q1) - pl.row(q0), pl.kc(p), dst);
    for (int64_t q = q0; q < q1; ++q)
      P::pack_a(g.A, pl.row(q), p * pl.kcb, pl.rows(q), pl.kc(p),
                dst + (q - q0) * pl.kc_packed(p) * MR);
  };
  if (a_all_k) {
    const int64_t a_stride = (q1 - q0) * MR * pl.kstride;
    for (int64_t p = 0; p < pl.nkb; ++p) pack_panels(p, abuf + p * a_stride);
    alignas(64) float tile[MR * NR];  // a bf16 C's tile, complete before it is rounded
    for (int64_t s = s_lo; s < s_hi; ++s) {
      const int64_t j = jc + s * NR;
      const int n = int(std::min<int64_t>(NR, pl.N - j));
      for (int64_t q = q0; q < q1; ++q) {
        const int m = int(pl.rows(q));
        const int64_t ir = (q - q0) * MR;  // the panel's offset in the packed block
        float* cp = g.C_bf16 ? tile : g.C + pl.row(q) * ldc + j;
        const int64_t ldt = g.C_bf16 ? NR : ldc;
        for (int64_t p = 0; p < pl.nkb; ++p) {
          const int64_t kcp = pl.kc_packed(p);
          const E* bp = bbuf + p * pl.kstride * pl.ncb + s * kcp * NR;
          P::kernel(pl.kc(p), abuf + p * a_stride + ir * kcp, bp, cp, ldt, m, n,
                    g.accumulate || p > 0, p == pl.nkb - 1 && g.bias ? g.bias + j : nullptr);
        }
        if (g.C_bf16)
          for (int i = 0; i < m; ++i)
            f32_to_bf16_n(tile + i * NR, g.C_bf16 + (pl.row(q) + i) * ldc + j, n);
      }
    }
    return;
  }
  for (int64_t p = 0; p < pl.nkb; ++p) {
    const int64_t kc = pl.kc(p), kcp = pl.kc_packed(p);
    const bool add_c = g.accumulate || p > 0;
    const float* bias = p == pl.nkb - 1 ? g.bias : nullptr;  // after the last K block
    pack_panels(p, abuf);
    const E* bp0 = bbuf + p * pl.kstride * pl.ncb;
    for (int64_t s = s_lo; s < s_hi; ++s) {
      const int64_t j = jc + s * NR;
      const int n = int(std::min<int64_t>(NR, pl.N - j));
      const E* bp = bp0 + s * kcp * NR;
      for (int64_t q = q0; q < q1; ++q)
        P::kernel(kc, abuf + (q - q0) * MR * kcp, bp, g.C + pl.row(q) * ldc + j, ldc,
                  int(pl.rows(q)), n, add_c, bias ? bias + j : nullptr);
    }
  }
}

// Runs thread ith's chunks of the panel at jc, then (with nth > 1) takes
// chunks of the others: counters[i] numbers rectangle i's chunks, claimed in
// order by whoever comes first.
template <class P, class E = typename P::E>
void run_chunks(const GemmArgs& g, const Plan<P>& pl, int ith, int nth, WorkCounter* counters,
                int64_t jc, int64_t ns, const E* bbuf, E* abuf, bool a_all_k) {
  for (int v = 0; v < nth; ++v) {
    const int i = (ith + v) % nth;
    const typename Plan<P>::Rect r = pl.rect(i);
    if (r.chunks == 0) continue;
    for (int64_t c; (c = counters[i].next.fetch_add(1, std::memory_order_relaxed)) < r.chunks;)
      run_chunk(g, pl, r, c, jc, ns, bbuf, abuf, a_all_k);
  }
}

// The blocked algorithm for thread ith of nth. With nth > 1 the threads share
// the packed B (t.shared_scratch) and meet at barriers, or, with private_b,
// each packs B in its own t.scratch() and they only share work counters
// (t.work_counters(); gemm's closing barrier ends the call); with nth == 1 it
// touches only t.scratch() and never synchronizes.
template <class P>
void blocked(const GemmArgs& g, int ith, int nth, ThreadCtx& t) {
  using E = typename P::E;
  using Rect = typename Plan<P>::Rect;
  const Plan<P> pl(g, nth);
  const Rect mine = pl.rect(ith);

  const size_t b_bytes = size_t(pl.nkb * pl.kstride * pl.ncb) * sizeof(E);
  int64_t max_chunk_rows = MR;
  for (int i = 0; i < nth; ++i) {  // any thread may run any thread's chunks
    const Rect r = pl.rect(i);
    if (r.chunks > 0)
      max_chunk_rows = std::max(max_chunk_rows, ceil_div(r.p1 - r.p0, r.chunks) * MR);
  }
  // A packed for all of K when that fits kAllKBytes (then each C tile gets all
  // its K blocks at once: run_chunk).
  const size_t a_block = size_t(max_chunk_rows * pl.kstride) * sizeof(E);
  // (Always for a bf16 C, whose tiles are rounded once all K is in.)
  const bool a_all_k = g.C_bf16 || (pl.nkb > 1 && a_block * size_t(pl.nkb) <= kAllKBytes);
  const size_t a_bytes = a_all_k ? a_block * size_t(pl.nkb) : a_block;

  // Packs items [it0, it1) of the panel at jc (ns strips) into bbuf: item it
  // is (strip s0 + it / nkb, K block it % nkb).
  auto pack_b_items = [&](E* bbuf, int64_t jc, int64_t nc, int64_t s0, int64_t it0, int64_t it1) {
    for (int64_t it = it0; it < it1; ++it) {
      const int64_t s = s0 + it / pl.nkb, p = it % pl.nkb;
      P::pack_b(g.B, p * pl.kcb, jc + s * NR, pl.kc(p), std::min<int64_t>(NR, nc - s * NR),
                bbuf + p * pl.kstride * pl.ncb + s * pl.kc_packed(p) * NR);
    }
  };

  if (nth == 1 || pl.private_b) {  // B in this thread's scratch, one panel at a time
    E* bbuf = static_cast<E*>(t.scratch(b_bytes + a_bytes));
    E* abuf = reinterpret_cast<E*>(reinterpret_cast<char*>(bbuf) + b_bytes);  // (64-byte multiple)
    for (int64_t jc = 0; jc < pl.N; jc += pl.ncb) {  // (one panel when private_b)
      const int64_t nc = std::min(pl.ncb, pl.N - jc), ns = ceil_div(nc, NR);
      pack_b_items(bbuf, jc, nc, 0, 0, ns * pl.nkb);
      if (nth == 1)
        for (int64_t c = 0; c < mine.chunks; ++c)
          run_chunk(g, pl, mine, c, jc, ns, bbuf, abuf, a_all_k);
      else run_chunks(g, pl, ith, nth, t.work_counters(), jc, ns, bbuf, abuf, a_all_k);
    }
    return;
  }

  // Shared B: [work counters | packed B: block p at p*kcb*ncb]; A private.
  const size_t hdr = size_t(nth) * sizeof(WorkCounter);
  char* shared = static_cast<char*>(t.shared_scratch(hdr + b_bytes));
  E* abuf = static_cast<E*>(t.scratch(a_bytes));
  auto* counters = reinterpret_cast<WorkCounter*>(shared);
  E* bbuf = reinterpret_cast<E*>(shared + hdr);
  for (int64_t jc = 0; jc < pl.N; jc += pl.ncb) {
    const int64_t nc = std::min(pl.ncb, pl.N - jc), ns = ceil_div(nc, NR);
    if (jc > 0) t.barrier();  // everyone is done with the previous panel
    const auto share = pl.pack_share(ith, jc, ns);
    pack_b_items(bbuf, jc, nc, share.s0, share.it0, share.it1);
    if (ith == 0)
      for (int i = 0; i < nth; ++i) new (&counters[i].next) std::atomic<int64_t>(0);
    t.barrier();  // B packed, counters set
    run_chunks(g, pl, ith, nth, counters, jc, ns, bbuf, abuf, a_all_k);
  }
}

[[maybe_unused]] bool bf16_operand(const GemmOperand& x) {
  return x.type == GemmType::bf16 || (x.type == GemmType::f32 && x.round_bf16);
}

}  // namespace

GemmOperand rounded_bf16_copy(const GemmOperand& x, int64_t rows, int64_t cols, int slot) {
  thread_local std::vector<uint16_t> copies[2];
  std::vector<uint16_t>& c = copies[slot];
  // The copy has x's strides (gaps and signs included): the path gemm takes
  // for it, hence the order of the sums, is the one it takes for a bf16
  // operand of x's layout.
  const int64_t lo =
      std::min<int64_t>(0, (rows - 1) * x.rs) + std::min<int64_t>(0, (cols - 1) * x.cs);
  const int64_t hi =
      std::max<int64_t>(0, (rows - 1) * x.rs) + std::max<int64_t>(0, (cols - 1) * x.cs);
  c.assign(size_t(hi - lo + 1), 0);
  uint16_t* base = c.data() - lo;
  const float* s = static_cast<const float*>(x.data);
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < cols; ++j)
      base[i * x.rs + j * x.cs] = f32_to_bf16_daz(s[i * x.rs + j * x.cs]);
  return {base, GemmType::bf16, x.rs, x.cs};
}

void gemm(const GemmArgs& g, ThreadCtx& t) {
  const int64_t M = g.M, N = g.N, K = g.K;
  if (M <= 0 || N <= 0) return;
  const int nth = t.nth < 1 ? 1 : t.nth, ith = t.ith;

  if ((g.A.round_bf16 || g.B.round_bf16) && K > 0 &&
      (small_m_applicable(g) || small_n_applicable(g))) {
    // The small paths read operands in place: they get bf16 copies (the same
    // values, so the same result). The blocked paths pack rounded operands
    // themselves (into bf16 pairs, or rounded and widened back to f32).
    GemmArgs c = g;
    if (g.A.round_bf16) c.A = rounded_bf16_copy(g.A, M, K, 0);
    if (g.B.round_bf16) c.B = rounded_bf16_copy(g.B, K, N, 1);
    return gemm(c, t);
  }

  if (g.C_bf16) {
    KILN_ASSERT(!g.accumulate);
    if (K <= 0 || small_m_applicable(g) || small_n_applicable(g)) {
      // Few rows or columns (or K = 0): an f32 C on thread 0, then rounded.
      if (ith == 0) {
        thread_local std::vector<float> c32;
        c32.assign(size_t(M * N), 0.0f);
        GemmArgs c = g;
        c.C_bf16 = nullptr;
        c.C = c32.data();
        c.ldc = N;
        gemm_alone(c);
        for (int64_t i = 0; i < M; ++i) f32_to_bf16_n(c32.data() + i * N, g.C_bf16 + i * g.ldc, N);
      }
      t.barrier();
      return;
    }
  }

  if (K <= 0) {  // C = 0 (or unchanged when accumulating), plus the bias
    for (int64_t i = M * ith / nth; i < M * (ith + 1) / nth; ++i) {
      if (!g.accumulate) std::memset(g.C + i * g.ldc, 0, size_t(N) * sizeof(float));
      if (g.bias) add_bias(g.C + i * g.ldc, g.ldc, 1, N, g.bias);
    }
    t.barrier();
    return;
  }

  // The algorithm (hence the arithmetic) depends only on the arguments; nth
  // only changes who computes which tile.
  const bool solo = nth == 1 || double(M) * double(N) * double(K) < kSoloWork;
  const int tn = solo ? 1 : nth;  // threads that work
  if (small_m_applicable(g)) {
    if (ith < tn)
      gemm_small_m(g, ith, tn, static_cast<float*>(t.scratch(size_t(M * K) * sizeof(float))));
  } else if (small_n_applicable(g)) {
    if (ith < tn)
      gemm_small_n(g, ith, tn, static_cast<float*>(t.scratch(size_t(N * K) * sizeof(float))));
  } else if (ith < tn) {
#if defined(KILN_GEMM_BF16)
    if (bf16_operand(g.A) && bf16_operand(g.B)) blocked<BF16Path>(g, ith, tn, t);
    else blocked<F32Path>(g, ith, tn, t);
#else
    blocked<F32Path>(g, ith, tn, t);
#endif
  }
  t.barrier();  // all of C is written; the shared B panel is free again
}

void gemm_alone(const GemmArgs& args) {
  thread_local ThreadCtx alone;
  gemm(args, alone);
}

}  // namespace kiln::cpu
