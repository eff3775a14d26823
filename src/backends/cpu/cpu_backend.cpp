// CpuBackend: runs a node list on a persistent thread pool. One pool run per
// graph; every thread walks all nodes, each kernel splits its own work, and a
// barrier separates nodes (so the per-node cost is one barrier), except for runs
// of small nodes, which thread 0 computes alone between two barriers.
#include <algorithm>
#include <vector>

#include "backends/cpu/kernels/kernels.h"
#include "backends/cpu/thread_pool.h"
#include "kiln/cpu.h"
#include "kiln/ext/tensor_node.h"

namespace kiln {

namespace {

using KernelFn = void (*)(TensorNode*, cpu::ThreadCtx&);

#define KILN_KERNEL_LEAF(e) nullptr,
#define KILN_KERNEL_VIEW(e) nullptr,
#define KILN_KERNEL_ALIAS(e) &cpu::kernel_##e,
#define KILN_KERNEL_COMPUTE(e) &cpu::kernel_##e,
constexpr KernelFn kKernels[] = {
#define KILN_OP(e, family, kind, inplace, grad) KILN_KERNEL_##kind(e)
#include "kiln/ops.def"
#undef KILN_OP
};
#undef KILN_KERNEL_LEAF
#undef KILN_KERNEL_VIEW
#undef KILN_KERNEL_ALIAS
#undef KILN_KERNEL_COMPUTE

// Nodes this small run on thread 0 alone: splitting them costs more (a barrier
// per node, ~0.1-1 us) than it saves. Consecutive small nodes form one serial
// run with no barrier between them, so a chain of tiny ops costs ~40 ns a node.
// Kernels give the same result for any thread count, so this changes no value.
constexpr int64_t kSerialWork = 1 << 15;

int64_t work_of(const TensorNode* n) {
  int64_t w = n->numel();
  for (int i = 0; i < n->n_src; ++i)
    if (n->src[i]) w = std::max(w, n->src[i]->numel());
  if (n->op == Op::MATMUL || n->op == Op::MATMUL_ACC) {
    const TensorNode* a = n->src[n->op == Op::MATMUL ? 0 : 1];
    w *= a->shape[a->shape.ndim() - 1];
  }
  return w;
}

struct Step {
  TensorNode* node;  // parallel node, or the first of a serial run
  int count;         // 0: parallel; >0: nodes [node, node + count) of `work` run on thread 0
  size_t first;
};

}  // namespace

struct CpuBackend::Impl {
  std::unique_ptr<cpu::ThreadPool> pool;
  cpu::ThreadCtx solo;            // thread 0's context for serial runs (nth = 1)
  std::vector<TensorNode*> work;  // reused between computes: no per-run allocation
  std::vector<Step> steps;
};

CpuBackend::CpuBackend(int n_threads) : impl_(std::make_unique<Impl>()) {
  set_n_threads(n_threads);
}
CpuBackend::~CpuBackend() = default;

int CpuBackend::n_threads() const { return impl_->pool->size(); }

void CpuBackend::set_n_threads(int n) {
  if (n <= 0) n = cpu::default_thread_count();
  impl_->pool = std::make_unique<cpu::ThreadPool>(n);
}

bool CpuBackend::supports_op(const TensorNode* node) const {
  return op_kind(node->op) != OpKind::COMPUTE && op_kind(node->op) != OpKind::ALIAS
             ? true
             : kKernels[size_t(node->op)] != nullptr;
}

void CpuBackend::compute(std::span<TensorNode* const> nodes) {
  std::vector<TensorNode*>& work = impl_->work;
  std::vector<Step>& steps = impl_->steps;
  work.clear();
  steps.clear();
  const bool parallel = impl_->pool->size() > 1;
  for (TensorNode* n : nodes) {
    detail::check_memory(n);
    if (!kKernels[size_t(n->op)] || n->numel() == 0) continue;
    const bool serial = !parallel || work_of(n) <= kSerialWork;
    if (serial && !steps.empty() && steps.back().count > 0) {
      steps.back().count++;
    } else {
      steps.push_back({n, serial ? 1 : 0, work.size()});
    }
    work.push_back(n);
  }
  if (work.empty()) return;
  if (!parallel) {
    for (TensorNode* n : work) kKernels[size_t(n->op)](n, impl_->solo);
    return;
  }
  // A kernel that throws makes the pool abort the run: the other threads'
  // next barrier() unwinds them, and run() rethrows the first exception here.
  cpu::ThreadCtx& solo = impl_->solo;
  impl_->pool->run([&](cpu::ThreadCtx& t) {
    for (const Step& s : steps) {
      if (s.count == 0) {
        kKernels[size_t(s.node->op)](s.node, t);
      } else if (t.ith == 0) {
        for (size_t i = s.first; i < s.first + size_t(s.count); ++i)
          kKernels[size_t(work[i]->op)](work[i], solo);
      }
      t.barrier();
    }
  });
}

}  // namespace kiln
