// The graph passes' table, their set and the runner (kiln/graph_passes.h).
#include "kiln/graph_passes.h"

#include <array>

#include "kiln/error.h"
#include "kiln/graph.h"

namespace kiln {

namespace {

// In run order (GraphPass's order).
const std::array<GraphPassInfo, kGraphPassCount> kTable = {{
    {GraphPass::fuse_bias,
     "fuse_bias",
     "Graph::fuse_matmul_bias",
     "none (bit-identical)",
     /*training=*/true,
     /*inference=*/true,
     {}},
    {GraphPass::fuse_residual,
     "fuse_residual",
     "Graph::fuse_norm_residual",
     "none (bit-identical)",
     /*training=*/true,
     /*inference=*/false,
     {}},
    {GraphPass::bf16_grad_sums,
     "bf16_grad_sums",
     "Graph::sum_bf16_gradients",
     "bias gradients sum the bf16-rounded terms of their gradient (2^-9 relative each)",
     /*training=*/true,
     /*inference=*/false,
     {}},
    {GraphPass::bf16_gelu_inputs,
     "bf16_gelu_inputs",
     "Graph::bf16_gelu_inputs",
     "GELU reads its input (a Linear's output) rounded to bf16 (2^-9 relative)",
     /*training=*/true,
     /*inference=*/true,
     {GraphPass::fuse_casts}},
    {GraphPass::fuse_casts,
     "fuse_casts",
     "Graph::fuse_bf16_casts",
     "none (bit-identical)",
     /*training=*/true,
     /*inference=*/true,
     {}},
    {GraphPass::fold_casts,
     "fold_casts",
     "Graph::fold_bf16_casts",
     "none (bit-identical; subnormals read as zero)",
     /*training=*/true,
     /*inference=*/true,
     {GraphPass::fuse_casts}},
}};

std::string all_names() {
  std::string s;
  for (const GraphPassInfo& i : kTable) s += std::string(s.empty() ? "" : ", ") + i.name;
  return s;
}

}  // namespace

const char* graph_kind_name(GraphKind k) {
  return k == GraphKind::training ? "training" : "inference";
}

std::span<const GraphPassInfo> graph_pass_table() { return kTable; }
const GraphPassInfo& graph_pass_info(GraphPass p) { return kTable[size_t(p)]; }
const char* graph_pass_name(GraphPass p) { return graph_pass_info(p).name; }

GraphPasses GraphPasses::defaults(GraphKind kind) {
  GraphPasses s;
  for (const GraphPassInfo& i : kTable)
    if (kind == GraphKind::training ? i.training : i.inference) s = s.with(i.pass);
  return s;
}

GraphPasses GraphPasses::parse(std::string_view list) {
  if (list == "none") return {};
  GraphPasses s;
  if (list == "all") {
    for (const GraphPassInfo& i : kTable) s = s.with(i.pass);
    return s;
  }
  // Every name between commas must be a pass: "" and "a,,b" are errors.
  for (bool more = true; more;) {
    const size_t comma = list.find(',');
    const std::string_view name = list.substr(0, comma);
    const GraphPassInfo* found = nullptr;
    for (const GraphPassInfo& i : kTable)
      if (name == i.name) found = &i;
    if (!found)
      fail("graph passes", "unknown pass '", name, "' (passes: ", all_names(), "; or none, all)");
    s = s.with(found->pass);
    more = comma != std::string_view::npos;
    if (more) list = list.substr(comma + 1);
  }
  return s;
}

std::string GraphPasses::str() const {
  std::string s;
  for (const GraphPassInfo& i : kTable)
    if (has(i.pass)) s += std::string(s.empty() ? "" : ",") + i.name;
  return s.empty() ? "none" : s;
}

void check_graph_passes(const char* who, GraphPasses passes, GraphKind kind) {
  for (const GraphPassInfo& i : kTable) {
    if (!passes.has(i.pass)) continue;
    if (!(kind == GraphKind::training ? i.training : i.inference))
      fail(who, "graph pass ", i.name, " is not valid for ", graph_kind_name(kind),
           " graphs (it is for ", i.training ? "training" : "inference", " graphs only)");
    for (const GraphPassInfo& n : kTable)
      if (i.needs.has(n.pass) && !passes.has(n.pass))
        fail(who, "graph pass ", i.name, " needs ", n.name, ", which is not in the set (",
             passes.str(), ")");
  }
}

GraphPasses run_graph_passes(Graph& g, GraphPasses passes) {
  GraphPasses ran;
  for (const GraphPassInfo& i : kTable) {
    if (!passes.has(i.pass) || (passes & i.needs) != i.needs) continue;
    switch (i.pass) {
      case GraphPass::fuse_bias: g.fuse_matmul_bias(); break;
      case GraphPass::fuse_residual: g.fuse_norm_residual(); break;
      case GraphPass::bf16_grad_sums: g.sum_bf16_gradients(); break;
      case GraphPass::bf16_gelu_inputs: g.bf16_gelu_inputs(); break;
      case GraphPass::fuse_casts: g.fuse_bf16_casts(); break;
      case GraphPass::fold_casts: g.fold_bf16_casts(); break;
    }
    ran = ran.with(i.pass);
  }
  return ran;
}

}  // namespace kiln
