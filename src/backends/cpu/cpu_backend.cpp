// CpuBackend: runs a node list on a persistent thread pool. One pool run per
// graph; every thread walks all nodes and each kernel splits its own work;
// small nodes run on one thread alone. A barrier goes between two nodes only
// where the second touches memory the nodes since the last barrier touch in a
// conflicting way (cpu::plan_nodes), so a thread that finished its share of
// one node goes on to the next independent one. The plan is made once per node
// list and kept for its next computes.
#include <algorithm>
#include <vector>

#include "backends/cpu/kernels/kernels.h"
#include "backends/cpu/node_plan.h"
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

// Nodes this small run on one thread alone: splitting them costs more than it
// saves. A chain of small nodes runs on one thread with no barrier between
// them (cpu::plan_nodes), so a chain of tiny ops costs ~40 ns a node.
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

// A node list's plan, kept for the next compute() of the same list: the
// kernels to run and the steps with their barriers (cpu::plan_nodes). It is
// valid while the list holds the same nodes with the same memory: `sig` keeps,
// per node and per source, the node, its data pointer and the end of the bytes
// it spans (so a graph rebuilt at the same addresses with other shapes is
// seen), and each node's id and op.
struct Plan {
  const TensorNode* const* key = nullptr;
  size_t size = 0;
  std::vector<uintptr_t> sig;
  std::vector<TensorNode*> work;
  cpu::NodePlan run;  // steps over work, when the pool has several threads
  uint64_t last_use = 0;

  template <class F>
  static void for_sig(std::span<TensorNode* const> nodes, F&& f) {
    auto tensor = [&f](const TensorNode* t) {
      f(uintptr_t(t));
      if (!t) return;
      f(uintptr_t(t->data));
      f(cpu::byte_range(t).hi);  // the extent: shape and strides
    };
    for (const TensorNode* n : nodes) {
      tensor(n);
      f(uintptr_t(n->id) << 16 | uintptr_t(n->op) << 4 | uintptr_t(n->n_src));
      for (int i = 0; i < n->n_src; ++i) tensor(n->src[i]);
    }
  }
  bool matches(std::span<TensorNode* const> nodes) const {
    if (nodes.data() != key || nodes.size() != size) return false;
    size_t i = 0;
    bool same = true;
    for_sig(nodes, [&](uintptr_t v) { same = same && i < sig.size() && sig[i++] == v; });
    return same && i == sig.size();
  }
};

// Plans of this many node lists are kept (a training step computes a few).
constexpr size_t kMaxPlans = 16;

}  // namespace

struct CpuBackend::Impl {
  std::unique_ptr<cpu::ThreadPool> pool;
  // Each thread's context for its serial steps (nth = 1).
  std::vector<std::unique_ptr<cpu::ThreadCtx>> solo;
  std::vector<Plan> plans;
  uint64_t uses = 0;

  const Plan& plan_for(std::span<TensorNode* const> nodes);
};

const Plan& CpuBackend::Impl::plan_for(std::span<TensorNode* const> nodes) {
  ++uses;
  for (Plan& p : plans)
    if (p.matches(nodes)) {
      p.last_use = uses;
      return p;
    }
  Plan* p;
  if (plans.size() < kMaxPlans) {
    p = &plans.emplace_back();
  } else {
    p = &*std::min_element(plans.begin(), plans.end(),
                           [](const Plan& a, const Plan& b) { return a.last_use < b.last_use; });
  }
  p->key = nullptr;  // not valid until built (check_memory may throw)
  p->sig.clear();
  p->work.clear();
  p->run = {};
  const bool parallel = pool->size() > 1;
  std::vector<bool> serial_flags;
  for (TensorNode* n : nodes) {
    detail::check_memory(n);
    if (!kKernels[size_t(n->op)] || n->numel() == 0) continue;
    p->work.push_back(n);
    serial_flags.push_back(!parallel || work_of(n) <= kSerialWork);
  }
  if (parallel) p->run = cpu::plan_nodes(p->work, serial_flags, pool->size());
  Plan::for_sig(nodes, [&](uintptr_t v) { p->sig.push_back(v); });
  p->key = nodes.data();
  p->size = nodes.size();
  p->last_use = uses;
  return *p;
}

CpuBackend::CpuBackend(int n_threads) : impl_(std::make_unique<Impl>()) {
  set_n_threads(n_threads);
}
CpuBackend::~CpuBackend() = default;

int CpuBackend::n_threads() const { return impl_->pool->size(); }

void CpuBackend::set_n_threads(int n) {
  if (n <= 0) n = cpu::default_thread_count();
  impl_->pool = std::make_unique<cpu::ThreadPool>(n);
  impl_->solo.clear();
  for (int i = 0; i < n; ++i) impl_->solo.push_back(std::make_unique<cpu::ThreadCtx>());
  impl_->plans.clear();
}

bool CpuBackend::supports_op(const TensorNode* node) const {
  return op_kind(node->op) != OpKind::COMPUTE && op_kind(node->op) != OpKind::ALIAS
             ? true
             : kKernels[size_t(node->op)] != nullptr;
}

void CpuBackend::compute(std::span<TensorNode* const> nodes) {
  const Plan& plan = impl_->plan_for(nodes);
  const std::vector<TensorNode*>& work = plan.work;
  if (work.empty()) return;
  if (impl_->pool->size() == 1) {
    for (TensorNode* n : work) kKernels[size_t(n->op)](n, *impl_->solo[0]);
    return;
  }
  // A kernel that throws makes the pool abort the run: the other threads'
  // next barrier() unwinds them, and run() rethrows the first exception here.
  impl_->pool->run([&](cpu::ThreadCtx& t) {
    const uint32_t* order = plan.run.order.data();
    for (const cpu::NodeStep& s : plan.run.steps) {
      if (s.barrier_before) t.barrier();
      if (!s.serial) {
        TensorNode* n = work[order[s.first]];
        kKernels[size_t(n->op)](n, t);
      } else if (t.ith == s.thread) {
        cpu::ThreadCtx& solo = *impl_->solo[size_t(t.ith)];
        for (uint32_t i = s.first; i < s.first + s.count; ++i)
          kKernels[size_t(work[order[i]]->op)](work[order[i]], solo);
      }
    }
  });
}

}  // namespace kiln
