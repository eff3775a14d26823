// Scheduler::dump(): the splits as text, in the spirit of ggml's SPLIT dumps:
//
// ## SPLIT #1: CPU (backend 1), nodes 3..4 (2 nodes), 1 input: [#5 'h' f32[4, 8] 128 B from TEST]
//   node   3 softmax      #6 f32[4, 8] [CPU] <- #5 'h' [copy from TEST]
#include <cstdio>
#include <sstream>

#include "kiln/ext/sched.h"
#include "sched/sched_impl.h"

namespace kiln::sched_detail {

namespace {

std::string bytes(size_t n) {
  char buf[32];
  if (n < 1024) std::snprintf(buf, sizeof buf, "%zu B", n);
  else if (n < 1024 * 1024) std::snprintf(buf, sizeof buf, "%.1f KiB", double(n) / 1024);
  else std::snprintf(buf, sizeof buf, "%.1f MiB", double(n) / (1024.0 * 1024));
  return buf;
}

}  // namespace

std::string dump_schedule(const Schedule& s, const Env& c) {
  const std::vector<Backend*>& be = c.backends;
  auto where_name = [&](const TensorNode* t) -> std::string {
    const TensorNode* o = owner_of(t);
    auto it = s.where.find(o);
    std::string n = it == s.where.end() ? "?" : be[size_t(it->second)]->name();
    if (s.preallocated.count(o)) n += ", pre-allocated";
    return n;
  };
  std::unordered_map<const TensorNode*, int> index;
  for (size_t k = 0; k < s.nodes.size(); ++k) index[s.nodes[k]] = int(k);
  std::ostringstream os;
  os << "scheduler: " << be.size() << " backend" << (be.size() == 1 ? "" : "s") << " [";
  for (size_t b = 0; b < be.size(); ++b)
    os << (b ? ", " : "") << b << " " << be[b]->name() << " (" << be[b]->buffer_type().name()
       << " memory)";
  os << "], " << s.nodes.size() << " nodes, " << s.splits.size() << " split"
     << (s.splits.size() == 1 ? "" : "s") << ", " << s.n_copies << " cop"
     << (s.n_copies == 1 ? "y" : "ies") << " per run\n";
  for (size_t i = 0; i < s.splits.size(); ++i) {
    const Split& sp = s.splits[i];
    os << "## SPLIT #" << i << ": " << be[size_t(sp.backend)]->name() << " (backend " << sp.backend
       << "), nodes " << sp.first << ".." << sp.last << " (" << sp.user_nodes.size() << " node"
       << (sp.user_nodes.size() == 1 ? "" : "s") << "), " << sp.copies.size() << " input"
       << (sp.copies.size() == 1 ? "" : "s") << (sp.copies.empty() ? "" : ":");
    for (const Copy& cp : sp.copies)
      os << " [" << cp.from->label() << " " << dtype_name(cp.from->dtype) << cp.from->shape.str()
         << " " << bytes(cp.from->nbytes()) << " from " << where_name(cp.from) << "]";
    os << "\n";
    for (size_t j = 0; j < sp.user_nodes.size(); ++j) {
      const TensorNode* n = sp.user_nodes[j];
      const TensorNode* r = sp.run[j];  // n itself or its shadow
      char head[64];
      std::snprintf(head, sizeof head, "  node %3d %-12s ", index.at(n), op_name(n->op));
      os << head << n->label() << " " << dtype_name(n->dtype) << n->shape.str() << " ["
         << be[size_t(sp.backend)]->name() << "] <-";
      for (int q = 0; q < n->n_src; ++q) {
        const TensorNode* x = n->src[q];
        if (!x) continue;
        os << (q ? ", " : " ") << x->label();
        if (x->view_src && op_kind(x->op) == OpKind::VIEW)
          os << " (" << op_name(x->op) << " of " << x->view_src->label() << ")";
        if (r->src[q] != x) os << " [copy from " << where_name(x) << "]";
        else os << " [" << where_name(x) << "]";
      }
      os << "\n";
    }
  }
  return os.str();
}

}  // namespace kiln::sched_detail
