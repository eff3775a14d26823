// CpuBackend: runs a node list on a persistent thread pool. One pool run per
// graph; every thread walks all nodes, each kernel splits its own work, and a
// barrier separates nodes (so the per-node cost is one barrier).
#include <atomic>
#include <exception>
#include <mutex>
#include <vector>

#include "backends/cpu/kernels/kernels.h"
#include "backends/cpu/thread_pool.h"
#include "kiln/cpu.h"

namespace kiln {

namespace {

using KernelFn = void (*)(TensorNode*, cpu::ThreadCtx&);

#define KILN_KERNEL_LEAF(e) nullptr,
#define KILN_KERNEL_VIEW(e) nullptr,
#define KILN_KERNEL_ALIAS(e) &cpu::kernel_##e,
#define KILN_KERNEL_COMPUTE(e) &cpu::kernel_##e,
constexpr KernelFn kKernels[] = {
#define KILN_OP(e, name, kind, inplace, grad) KILN_KERNEL_##kind(e)
#include "kiln/ops.def"
#undef KILN_OP
};
#undef KILN_KERNEL_LEAF
#undef KILN_KERNEL_VIEW
#undef KILN_KERNEL_ALIAS
#undef KILN_KERNEL_COMPUTE

}  // namespace

struct CpuBackend::Impl {
  std::unique_ptr<cpu::ThreadPool> pool;
  std::vector<TensorNode*> work;  // reused between computes: no per-run allocation
};

CpuBackend::CpuBackend(int n_threads) : impl_(std::make_unique<Impl>()) { set_n_threads(n_threads); }
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
  work.clear();
  for (TensorNode* n : nodes) {
    if (!n->data && n->numel() > 0)
      fail("compute", "node #", n->id, " (", op_name(n->op), " ", n->shape.str(),
           ") has no memory: allocate the graph first");
    if (kKernels[size_t(n->op)] && n->numel() > 0) work.push_back(n);
  }
  if (work.empty()) return;

  std::atomic<bool> failed{false};
  std::exception_ptr error;
  std::mutex error_mu;
  impl_->pool->run([&](cpu::ThreadCtx& t) {
    for (TensorNode* n : work) {
      try {
        kKernels[size_t(n->op)](n, t);
      } catch (...) {
        std::lock_guard<std::mutex> lock(error_mu);
        if (!error) error = std::current_exception();
        failed.store(true, std::memory_order_relaxed);
      }
      t.barrier();
      // The failing thread set the flag before the barrier, so every thread
      // sees it here and all leave the loop together.
      if (failed.load(std::memory_order_relaxed)) break;
    }
  });
  if (error) std::rethrow_exception(error);
}

}  // namespace kiln
