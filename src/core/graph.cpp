// Graph construction (topological order by iterative DFS) and printing.
#include "kiln/graph.h"

#include "kiln/context.h"
#include "kiln/ext/tensor_node.h"

#include <sstream>

namespace kiln {

Graph Graph::forward(Tensor output) {
  Graph g;
  g.expand(output);
  return g;
}

Graph Graph::forward(std::initializer_list<Tensor> outputs) {
  Graph g;
  for (const Tensor& t : outputs) g.expand(t);
  return g;
}

void Graph::expand(Tensor output) {
  if (!output.defined()) fail("graph", "output is an undefined tensor");
  check_alive();
  TensorNode* n = output.node();
  if (nodes_.empty() && leafs_.empty()) life_ = n->ctx ? n->ctx->life() : detail::immortal_life();
  output.node()->flags |= kFlagOutput;
  visit(output.node());
  if (grads_.empty()) n_forward_ = nodes_.size();
}

// Post-order DFS without recursion (graphs of 100k+ nodes would overflow the stack).
void Graph::visit(TensorNode* root) {
  if (seen_.count(root)) return;
  std::vector<std::pair<TensorNode*, int>> stack;
  stack.emplace_back(root, 0);
  seen_.insert(root);
  while (!stack.empty()) {
    auto& [n, next] = stack.back();
    if (next < n->n_src) {
      TensorNode* s = n->src[next++];
      if (s && seen_.insert(s).second) stack.emplace_back(s, 0);
      continue;
    }
    if (n->op == Op::NONE) leafs_.push_back(n);
    else nodes_.push_back(n);
    stack.pop_back();
  }
}

Tensor Graph::grad(Tensor t) const {
  check_alive();
  for (const auto& [param, acc] : accumulators_)
    if (param == t.node()) return Tensor(acc);
  auto it = grads_.find(t.node());
  return it == grads_.end() ? Tensor() : Tensor(it->second);
}

void Graph::reset_grads() {
  check_alive();
  for (const auto& [param, acc] : accumulators_) Tensor(acc).fill_zero();
}

std::string Graph::dump() const {
  check_alive();
  std::ostringstream os;
  os << "graph: " << leafs_.size() << " leafs, " << nodes_.size() << " nodes (" << n_forward_
     << " forward)\n";
  for (const TensorNode* n : leafs_)
    os << "  leaf " << n->label() << " " << dtype_name(n->dtype) << n->shape.str() << "\n";
  for (size_t i = 0; i < nodes_.size(); ++i) {
    const TensorNode* n = nodes_[i];
    os << "  " << i << (i < n_forward_ ? "  " : " b") << " " << op_name(n->op) << " " << n->label()
       << " " << dtype_name(n->dtype) << n->shape.str() << " <-";
    for (int s = 0; s < n->n_src; ++s)
      if (n->src[s]) os << " " << n->src[s]->label();
    os << "\n";
  }
  return os.str();
}

}  // namespace kiln
