// GEMM driver (BLIS-style loop nest):
//   for jc in N by NC:                      B panel kc x nc, shared by all threads
//     for pc in K by KC:                    (packed cooperatively, then a barrier)
//       for ic in my rows by MC:            A block mc x kc, private to the thread
//         for jr in my strips of the panel: micro-kernel over each MR x NR tile
//           for ir in the block by MR:
// Threads own disjoint rectangles of C (a tm x tn grid of MR/NR-aligned
// ranges); K is never split, and the K blocking depends only on K, so every C
// element gets the same operations whatever the thread count.
#include <algorithm>
#include <cstring>

#include "backends/cpu/gemm.h"
#include "backends/cpu/gemm_internal.h"

namespace kiln::cpu {

using namespace gemm_detail;

namespace {

struct Grid {
  int tm = 1, tn = 1;  // threads along M and N; tm*tn <= nth
};

// Picks the thread grid with the least estimated time per k step on the
// busiest thread: its micro-tiles plus packing its own A rows (B packing is
// shared evenly whatever the grid).
Grid choose_grid(int64_t M, int64_t N, int nth) {
#if defined(KILN_GEMM_AVX512)
  constexpr double kTileCost = MR * NR / 32.0, kRowCost = 0.5;
#elif defined(KILN_GEMM_AVX2)
  constexpr double kTileCost = MR * NR / 16.0, kRowCost = 0.5;
#else
  constexpr double kTileCost = MR * NR / 4.0, kRowCost = 1.0;
#endif
  const int64_t pm = ceil_div(M, MR), pn = ceil_div(N, NR);
  Grid best;
  double best_cost = -1;
  for (int tm = nth; tm >= 1; --tm) {  // ties go to the larger M split
    const int tn = nth / tm;
    const double mp = double(ceil_div(pm, tm)), np = double(ceil_div(pn, tn));
    const double cost = mp * np * kTileCost + mp * MR * kRowCost;
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

// The blocked algorithm for thread ith of nth. With nth > 1 the threads share
// the packed B panel (t.shared_scratch) and meet at barriers; with nth == 1 it
// touches only t.scratch() and never synchronizes.
void blocked(const GemmArgs& g, int ith, int nth, ThreadCtx& t) {
  const int64_t M = g.M, N = g.N, K = g.K, ldc = g.ldc;
  const auto barrier = [&] {
    if (nth > 1) t.barrier();
  };

  // Blockings that depend only on the shape (K's decides the arithmetic).
  const int64_t nkb = ceil_div(K, KC);
  const int64_t kcb = nkb == 1 ? K : round_up(ceil_div(K, nkb), 16);
  const int64_t nnb = ceil_div(N, NC);
  const int64_t ncb = round_up(ceil_div(N, nnb), NR);
  const int64_t pm = ceil_div(M, MR), pn = ceil_div(N, NR);

  // This thread's rectangle: M panels [p0, p1), N strips [q0, q1).
  const Grid gr = choose_grid(M, N, nth);
  const bool active = ith < gr.tm * gr.tn;
  const int ti = ith / gr.tn, tj = ith % gr.tn;
  const int64_t p0 = pm * ti / gr.tm, p1 = pm * (ti + 1) / gr.tm;
  const int64_t q0 = pn * tj / gr.tn, q1 = pn * (tj + 1) / gr.tn;
  const int64_t i_begin = p0 * MR, i_end = std::min(M, p1 * MR);
  const int64_t my_rows = active ? std::max<int64_t>(i_end - i_begin, 0) : 0;
  const int64_t nmc = std::max<int64_t>(ceil_div(my_rows, MC), 1);
  const int64_t mcb = round_up(std::max<int64_t>(ceil_div(my_rows, nmc), 1), MR);

  const int64_t kc_max = std::min(K, kcb);
  const size_t a_bytes = size_t(mcb * kc_max) * sizeof(float);
  const size_t b_bytes = size_t(kc_max * ncb) * sizeof(float);  // a multiple of 128
  float *abuf, *bbuf;
  if (nth > 1) {
    bbuf = static_cast<float*>(t.shared_scratch(b_bytes));
    abuf = static_cast<float*>(t.scratch(a_bytes));
  } else {
    bbuf = static_cast<float*>(t.scratch(b_bytes + a_bytes));
    abuf = bbuf + b_bytes / sizeof(float);
  }

  bool first = true;
  for (int64_t jc = 0; jc < N; jc += ncb) {
    const int64_t nc = std::min(ncb, N - jc);
    const int64_t ns = ceil_div(nc, NR), s_base = jc / NR;
    // Strips of this panel that this thread computes.
    const int64_t lo = std::max(q0, s_base) - s_base, hi = std::min(q1, s_base + ns) - s_base;
    for (int64_t pc = 0; pc < K; pc += kcb) {
      const int64_t kc = std::min(kcb, K - pc);
      if (!first) barrier();  // everyone is done with the previous B panel
      first = false;
      const int64_t sa = ns * ith / nth, sb = ns * (ith + 1) / nth;
      if (sb > sa)
        pack_b(g.B, pc, jc + sa * NR, kc, std::min(nc, sb * NR) - sa * NR, bbuf + sa * kc * NR);
      barrier();
      if (my_rows == 0 || lo >= hi) continue;

      const bool add_c = g.accumulate || pc > 0;
      for (int64_t ic = i_begin; ic < i_end; ic += mcb) {
        const int64_t mc = std::min(mcb, i_end - ic);
        pack_a(g.A, ic, pc, mc, kc, abuf);
        for (int64_t s = lo; s < hi; ++s) {
          const int64_t j = jc + s * NR;
          const int n = int(std::min<int64_t>(NR, N - j));
          const float* bp = bbuf + s * kc * NR;
          float* cp = g.C + ic * ldc + j;
          for (int64_t ir = 0; ir < mc; ir += MR) {
            const int m = int(std::min<int64_t>(MR, mc - ir));
            kernel(kc, abuf + ir * kc, bp, cp + ir * ldc, ldc, m, n, add_c);
          }
        }
      }
    }
  }
}

}  // namespace

void gemm(const GemmArgs& g, ThreadCtx& t) {
  const int64_t M = g.M, N = g.N, K = g.K;
  if (M <= 0 || N <= 0) return;
  const int nth = t.nth < 1 ? 1 : t.nth, ith = t.ith;

  if (K <= 0) {  // C = 0 (or unchanged when accumulating)
    if (!g.accumulate)
      for (int64_t i = M * ith / nth; i < M * (ith + 1) / nth; ++i)
        std::memset(g.C + i * g.ldc, 0, size_t(N) * sizeof(float));
    t.barrier();
    return;
  }

  // The algorithm (hence the arithmetic) depends only on the arguments; nth
  // only changes who computes which tile.
  const bool solo = nth == 1 || double(M) * double(N) * double(K) < kSoloWork;
  const int tn = solo ? 1 : nth;  // threads that work
  if (small_m_applicable(g)) {
    if (ith < tn) gemm_small_m(g, ith, tn, static_cast<float*>(t.scratch(size_t(M * K) * sizeof(float))));
  } else if (small_n_applicable(g)) {
    if (ith < tn) gemm_small_n(g, ith, tn, static_cast<float*>(t.scratch(size_t(N * K) * sizeof(float))));
  } else if (ith < tn) {
    blocked(g, ith, tn, t);
  }
  t.barrier();  // all of C is written; the shared B panel is free again
}

}  // namespace kiln::cpu
