// BlasBackend: MATMUL through cblas_sgemm (kiln/blas.h), and MATMUL_ACC (the
// product added into a gradient accumulator) with beta = 1.
//
// A matrix operand with element strides (rs, cs) is passed to row-major sgemm as
//   NoTrans, ld = rs   when cs == 1 (rows are contiguous), or
//   Trans,   ld = cs   when rs == 1 (a transposed view: columns are contiguous),
// so the transposed views of matmul's backward (a.T() @ dC, dC @ b.T()) go to
// sgemm as they are, without copies. Other layouts (broadcast rows, sliced
// columns) are left to the CPU backend. Batch dims (numpy broadcast) loop over
// one sgemm call per matrix.
#include <cblas.h>

#include <algorithm>
#include <array>
#include <climits>
#include <cstring>
#include <optional>

#include "backends/cpu/thread_pool.h"
#include "kiln/blas.h"
#include "kiln/cpu.h"
#include "kiln/ext/op_params.h"
#include "kiln/ext/tensor_node.h"

// OpenBLAS extensions, declared here as well in case the cblas.h found is not
// OpenBLAS's own (identical redeclarations are fine).
extern "C" {
void openblas_set_num_threads(int num_threads);
int openblas_get_num_threads(void);
char* openblas_get_config(void);
char* openblas_get_corename(void);
}

namespace kiln {

namespace {

struct Operand {
  bool trans;  // pass CblasTrans
  int ld;
};

// How sgemm can read a rows x cols matrix with element strides rs, cs (see top).
// A size-1 dim's stride is irrelevant, so it never rules a layout out.
std::optional<Operand> operand_layout(int64_t rows, int64_t cols, int64_t rs, int64_t cs) {
  auto fits = [](int64_t v) { return v >= 1 && v <= INT_MAX; };
  if (cols == 1 || cs == 1) {
    const int64_t ld = rows == 1 ? std::max<int64_t>(cols, 1) : rs;
    if (fits(ld) && ld >= std::max<int64_t>(cols, 1)) return Operand{false, int(ld)};
  }
  if (rows == 1 || rs == 1) {
    const int64_t ld = cols == 1 ? std::max<int64_t>(rows, 1) : cs;
    if (fits(ld) && ld >= std::max<int64_t>(rows, 1)) return Operand{true, int(ld)};
  }
  return std::nullopt;
}

struct Gemm {
  int M, N, K;
  Operand a, b;
  int ldc;
  bool accumulate;  // MATMUL_ACC: C += A B
};

// The product's operands: MATMUL's src0 and src1, MATMUL_ACC's src1 and src2 (its
// src0 is the accumulator C, which the node aliases).
const TensorNode* operand(const TensorNode* n, int i) {
  return n->src[n->op == Op::MATMUL_ACC ? i + 1 : i];
}

// The sgemm description of a MATMUL node, or nothing when sgemm cannot run it.
std::optional<Gemm> plan_gemm(const TensorNode* n) {
  const bool acc = n->op == Op::MATMUL_ACC;
  // (A MATMUL with a third source carries a fused bias: left to the CPU kernels.)
  if ((n->op != Op::MATMUL && !acc) || n->n_src != (acc ? 3 : 2)) return std::nullopt;
  const TensorNode *a = operand(n, 0), *b = operand(n, 1);
  if (a->dtype != DType::f32 || b->dtype != DType::f32 || n->dtype != DType::f32)
    return std::nullopt;
  // Factors read rounded to bf16 (Graph::fold_bf16_casts): the CPU kernel's.
  if (op_params<MatmulParams>(*n).round_bf16 != 0) return std::nullopt;
  const int nd = n->shape.ndim(), na = a->shape.ndim(), nb = b->shape.ndim();
  if (nd < 2 || na < 2 || nb < 2) return std::nullopt;
  const int64_t M = n->shape[nd - 2], N = n->shape[nd - 1], K = a->shape[na - 1];
  if (M > INT_MAX || N > INT_MAX || K > INT_MAX) return std::nullopt;
  // dst rows must be contiguous; ldc is its row stride.
  const int64_t ldc = n->stride[nd - 2] / 4;
  if ((N > 1 && n->stride[nd - 1] != 4) || (M > 1 && (ldc < N || ldc > INT_MAX)))
    return std::nullopt;
  auto la = operand_layout(M, K, a->stride[na - 2] / 4, a->stride[na - 1] / 4);
  auto lb = operand_layout(K, N, b->stride[nb - 2] / 4, b->stride[nb - 1] / 4);
  if (!la || !lb) return std::nullopt;
  return Gemm{int(M), int(N), int(K), *la, *lb, int(std::max<int64_t>(M > 1 ? ldc : N, 1)), acc};
}

// Byte stride of src's batch dim for each of dst's nb batch dims (0: broadcast).
std::array<int64_t, kMaxDims> batch_strides(const TensorNode* src, const TensorNode* dst, int nb) {
  std::array<int64_t, kMaxDims> st{};
  const int snb = src->shape.ndim() - 2;
  for (int d = 0; d < nb; ++d) {
    const int sd = d - (nb - snb);
    if (sd >= 0 && src->shape[sd] != 1) st[size_t(d)] = src->stride[size_t(sd)];
  }
  return st;
}

// Products smaller than this (multiply-adds) run as one sgemm call on the
// calling thread.
constexpr double kParallelWork = 64.0 * 64 * 64;

// Thread `ith` of `nth`'s share of every batch's product. With `cut`, C is cut
// into blocks of rows (or of columns, when C is wider than tall) whose size
// depends on the shape only, one sgemm call each, dealt out round-robin:
// OpenBLAS may sum a sub-product in another order than the whole one, so the
// cut must not depend on the thread count for the bits not to. Products too
// small to cut are dealt out whole, batch by batch.
void run_sgemm(TensorNode* n, const Gemm& g, int ith, int nth, bool cut) {
  const TensorNode *a = operand(n, 0), *b = operand(n, 1);
  const bool by_rows = g.M >= g.N;
  const int64_t total = by_rows ? g.M : g.N;
  const bool whole = !cut || double(g.M) * g.N * std::max(g.K, 1) < kParallelWork;
  const int64_t bs = whole ? total : std::max<int64_t>(32, ((total + 31) / 32 + 15) / 16 * 16);
  const int64_t nblocks = (total + bs - 1) / bs;
  const int nd = n->shape.ndim();
  const int nbd = nd - 2;
  const auto sa = batch_strides(a, n, nbd), sb = batch_strides(b, n, nbd);
  int64_t nbatch = 1;
  for (int d = 0; d < nbd; ++d) nbatch *= n->shape[d];
  std::array<int64_t, kMaxDims> idx{};
  for (int64_t i = 0; i < nbatch; ++i) {
    int64_t oa = 0, ob = 0, oc = 0;
    for (int d = 0; d < nbd; ++d) {
      oa += idx[size_t(d)] * sa[size_t(d)];
      ob += idx[size_t(d)] * sb[size_t(d)];
      oc += idx[size_t(d)] * n->stride[size_t(d)];
    }
    const bool batch_mine = nblocks > 1 || i % nth == ith;
    for (int64_t blk = nblocks > 1 ? ith : 0;
         batch_mine && blk<nblocks; blk += nblocks> 1 ? nth : 1) {
      const int64_t lo = blk * bs, hi = std::min(total, lo + bs);
      const int m = by_rows ? int(hi - lo) : g.M, nn = by_rows ? g.N : int(hi - lo);
      // Element offsets of the block's first row (column) in A (B) and C.
      const int64_t off_a = by_rows ? (g.a.trans ? lo : lo * g.a.ld) : 0;
      const int64_t off_b = by_rows ? 0 : (g.b.trans ? lo * g.b.ld : lo);
      float* c =
          reinterpret_cast<float*>(static_cast<char*>(n->data) + oc) + (by_rows ? lo * g.ldc : lo);
      if (g.K == 0) {
        if (g.accumulate) continue;  // C += 0
        // Empty sum: C = 0 (rows may be padded by ldc, so row by row).
        for (int r = 0; r < m; ++r) std::memset(c + int64_t(r) * g.ldc, 0, size_t(nn) * 4);
        continue;
      }
      cblas_sgemm(CblasRowMajor, g.a.trans ? CblasTrans : CblasNoTrans,
                  g.b.trans ? CblasTrans : CblasNoTrans, m, nn, g.K, 1.0f,
                  reinterpret_cast<const float*>(static_cast<const char*>(a->data) + oa) + off_a,
                  g.a.ld,
                  reinterpret_cast<const float*>(static_cast<const char*>(b->data) + ob) + off_b,
                  g.b.ld, g.accumulate ? 1.0f : 0.0f, c, g.ldc);
    }
    for (int d = nbd - 1; d >= 0; --d) {  // next batch index, last dim fastest
      if (++idx[size_t(d)] < n->shape[d]) break;
      idx[size_t(d)] = 0;
    }
  }
}

}  // namespace

struct BlasBackend::Impl {
  int n_threads = 1;
  BlasThreads threads = BlasThreads::pool;
  std::unique_ptr<cpu::ThreadPool> pool;  // BlasThreads::pool with n_threads > 1
  std::unique_ptr<CpuBackend> cpu;        // cpu_kernels mode only
  std::vector<TensorNode*> pending;       // consecutive nodes for the CPU backend

  void matmul(TensorNode* n, const Gemm& g) {
    // OpenBLAS's thread count is process-wide: set it only when another user
    // (or another BlasBackend) changed it.
    const int want = threads == BlasThreads::openblas ? n_threads : 1;
    if (openblas_get_num_threads() != want) openblas_set_num_threads(want);
    const bool cut = threads == BlasThreads::pool;
    const double work =
        double(g.M) * g.N * std::max(g.K, 1) * double(n->numel() / (int64_t(g.M) * g.N));
    if (pool && work >= kParallelWork)
      pool->run([&](cpu::ThreadCtx& t) { run_sgemm(n, g, t.ith, t.nth, cut); });
    else run_sgemm(n, g, 0, 1, cut);
  }
};

BlasBackend::BlasBackend(int n_threads, bool cpu_kernels, BlasThreads threads)
    : impl_(std::make_unique<Impl>()) {
  impl_->threads = threads;
  if (cpu_kernels) impl_->cpu = std::make_unique<CpuBackend>(n_threads);
  set_n_threads(n_threads);
}

BlasBackend::~BlasBackend() = default;

int BlasBackend::n_threads() const { return impl_->n_threads; }

void BlasBackend::set_n_threads(int n) {
  impl_->n_threads = n <= 0 ? cpu::default_thread_count() : n;
  if (impl_->cpu) impl_->cpu->set_n_threads(impl_->n_threads);
  impl_->pool.reset();
  if (impl_->threads == BlasThreads::pool && impl_->n_threads > 1)
    impl_->pool = std::make_unique<cpu::ThreadPool>(impl_->n_threads);
}

BlasThreads BlasBackend::threads() const { return impl_->threads; }

bool BlasBackend::cpu_kernels() const { return impl_->cpu != nullptr; }

bool BlasBackend::sgemm_can_run(const TensorNode* node) { return plan_gemm(node).has_value(); }

bool BlasBackend::supports_op(const TensorNode* node) const {
  const OpKind kind = op_kind(node->op);
  if (kind == OpKind::LEAF || kind == OpKind::VIEW) return true;  // no kernel needed
  if (plan_gemm(node)) return true;
  return impl_->cpu && impl_->cpu->supports_op(node);
}

void BlasBackend::compute(std::span<TensorNode* const> nodes) {
  std::vector<TensorNode*>& pending = impl_->pending;
  pending.clear();
  auto flush = [&] {
    if (!pending.empty()) impl_->cpu->compute(std::span<TensorNode* const>(pending));
    pending.clear();
  };
  for (TensorNode* n : nodes) {
    const OpKind kind = op_kind(n->op);
    if (kind == OpKind::LEAF || kind == OpKind::VIEW) continue;
    detail::check_memory(n);
    if (auto g = plan_gemm(n)) {
      flush();
      if (n->numel() == 0) continue;
      impl_->matmul(n, *g);
    } else if (impl_->cpu) {
      pending.push_back(n);
    } else {
      fail("blas", "node ", n->label(), " (", op_name(n->op), " ", dtype_name(n->dtype),
           n->shape.str(),
           ") is not supported by the BLAS backend (sgemm only): run the graph with a "
           "kiln::Scheduler that has a CPU backend after it, or make the backend with cpu_kernels");
    }
  }
  flush();
}

std::string blas_library_info() {
  std::string s = openblas_get_config();
  while (!s.empty() && (s.back() == ' ' || s.back() == '\n')) s.pop_back();
  return s;
}

std::string blas_description() {
  // "OpenBLAS 0.3.21 NO_LAPACKE DYNAMIC_ARCH ..." -> "OpenBLAS 0.3.21"
  const std::string config = blas_library_info();
  size_t end = config.find(' ');
  if (end != std::string::npos) end = config.find(' ', end + 1);
  return config.substr(0, end) + " (" + openblas_get_corename() + " kernels) sgemm + CPU kernels";
}

}  // namespace kiln
