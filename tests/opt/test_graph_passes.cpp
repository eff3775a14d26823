// Graph passes as options (kiln/graph_passes.h): the table and its defaults,
// each pass on and off in an OptContext (off: the graph holds no node of the
// pass's fused form), the backend's say (Backend::supports_pass), several
// backends, and the errors for a pass asked where it is not valid.
#include <gtest/gtest.h>

#include <functional>
#include <memory>

#include "common/error_check.h"
#include "common/random_values.h"
#include "common/two_block_training.h"
#include "kiln/ext/op_params.h"
#include "kiln/ext/tensor_node.h"
#include "kiln/kiln.h"

namespace kiln::test {
namespace {

using kiln_test::error_message;
using kiln_test::is_error;

const GraphPasses kTraining = GraphPasses::defaults(GraphKind::training);
const GraphPasses kInference = GraphPasses::defaults(GraphKind::inference);

// Nodes of pass p's fused form in g: what only that pass makes.
int fused_form(const Graph& g, GraphPass p) {
  int n = 0;
  for (const TensorNode* t : g.nodes()) switch (p) {
      case GraphPass::fuse_bias: n += t->op == Op::MATMUL && t->n_src == 3; break;
      case GraphPass::fuse_residual:
        n += (t->op == Op::LAYER_NORM_BACK && op_params<Op::LAYER_NORM_BACK>(*t).has_residual);
        break;
      case GraphPass::bf16_grad_sums: n += t->op == Op::SUM && t->src[0]->dtype == bf16; break;
      case GraphPass::bf16_gelu_inputs:
        n += (t->op == Op::GELU || t->op == Op::GELU_ERF) && t->src[0]->dtype == bf16;
        break;
      case GraphPass::fuse_casts: n += t->op == Op::LAYER_NORM && t->dtype == bf16; break;
      case GraphPass::fold_casts:
        n += (t->op == Op::MATMUL || t->op == Op::MATMUL_ACC) &&
             op_params<MatmulParams>(*t).round_bf16 != 0;
        break;
    }
  return n;
}

// Two pre-LN transformer blocks under the bf16 policy in an OptContext whose
// config `tweak` may change.
struct TwoBlocks {
  Context ctx;
  std::unique_ptr<nn::Sequential> net;
  Tensor x, out;
  std::unique_ptr<OptContext> opt;
  explicit TwoBlocks(const std::function<void(OptConfig&)>& tweak = {}) {
    ctx.set_matmul_precision(bf16);
    net = std::make_unique<nn::Sequential>(ctx);
    net->push_back<nn::TransformerBlock>(64, 4, 0.0f, true);
    net->push_back<nn::TransformerBlock>(64, 4, 0.0f, true);
    x = ctx.input(f32, {4, 16, 64}, "x");
    out = net->forward(x);
    OptConfig cfg;
    cfg.inputs = x;
    cfg.outputs = out;
    cfg.loss = LossKind::mse;
    cfg.model = net.get();
    cfg.n_threads = 1;
    if (tweak) tweak(cfg);
    opt = std::make_unique<OptContext>(cfg);
  }
};

// A CPU that keeps Backend's default answer to supports_pass (no pass), as a
// backend without the fused kernels does.
class PasslessCpu : public Backend {
 public:
  const char* name() const override { return "passless CPU"; }
  BufferType& buffer_type() override { return cpu_.buffer_type(); }
  bool supports_op(const TensorNode* n) const override { return cpu_.supports_op(n); }
  using Backend::compute;
  void compute(std::span<TensorNode* const> nodes) override { cpu_.compute(nodes); }

 private:
  CpuBackend cpu_{1};
};

// A CPU without kernels for the bias fusion.
class CpuWithoutBiasFusion : public CpuBackend {
 public:
  CpuWithoutBiasFusion() : CpuBackend(1) {}
  bool supports_pass(GraphPass p) const override { return p != GraphPass::fuse_bias; }
};

TEST(GraphPasses, TableNamesAndDefaults) {
  ASSERT_EQ(graph_pass_table().size(), size_t(kGraphPassCount));
  for (size_t i = 0; i < graph_pass_table().size(); ++i) {
    const GraphPassInfo& info = graph_pass_table()[i];
    EXPECT_EQ(size_t(info.pass), i);  // the table is in run order
    EXPECT_EQ(&graph_pass_info(info.pass), &info);
    EXPECT_TRUE(info.training);  // every pass is valid for training graphs
    EXPECT_EQ(GraphPasses::parse(info.name), GraphPasses{info.pass});
  }
  EXPECT_EQ(kTraining.str(),
            "fuse_bias,fuse_residual,bf16_grad_sums,bf16_gelu_inputs,fuse_casts,fold_casts");
  EXPECT_EQ(kInference, (GraphPasses{GraphPass::fuse_bias, GraphPass::bf16_gelu_inputs,
                                     GraphPass::fuse_casts, GraphPass::fold_casts}));
  EXPECT_EQ(GraphPasses::parse(kTraining.str()), kTraining);
  EXPECT_EQ(GraphPasses::parse("all"), kTraining);
  EXPECT_TRUE(GraphPasses::parse("none").empty());
  EXPECT_EQ(GraphPasses().str(), "none");
  EXPECT_EQ(GraphPasses::parse("fold_casts,fuse_bias").str(), "fuse_bias,fold_casts");
  EXPECT_TRUE(is_error(error_message([] { GraphPasses::parse("fuse_bias,fuse_gelu"); }),
                       "graph passes", {"unknown pass 'fuse_gelu'", "fold_casts"}));
  EXPECT_TRUE(
      is_error(error_message([] { GraphPasses::parse(""); }), "graph passes", {"unknown pass ''"}));
}

// No options: every pass runs on a CPU program, as before the options existed,
// and the graph is the one the explicit defaults give.
TEST(GraphPasses, DefaultsRunEveryPassOnTheCpu) {
  TwoBlocks unset, set([](OptConfig&c) { c.passes = kTraining; });
  EXPECT_EQ(unset.opt->graph_passes(), kTraining);
  EXPECT_EQ(set.opt->graph_passes(), kTraining);
  const Graph &a = unset.opt->graph(), &b = set.opt->graph();
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a.nodes()[i]->op, b.nodes()[i]->op) << i;
    EXPECT_EQ(a.nodes()[i]->dtype, b.nodes()[i]->dtype) << i;
  }
  for (const GraphPassInfo& info : graph_pass_table())
    EXPECT_GT(fused_form(a, info.pass), 0) << info.name;
}

// Each pass off (with the passes that need it): its fused form is gone and
// the others' stay; on (the defaults): there.
TEST(GraphPasses, EachPassOnAndOff) {
  for (const GraphPassInfo& info : graph_pass_table()) {
    SCOPED_TRACE(info.name);
    GraphPasses off = kTraining.without(info.pass);
    for (const GraphPassInfo& other : graph_pass_table())
      if (other.needs.has(info.pass)) off = off.without(other.pass);
    TwoBlocks m([&](OptConfig& c) { c.passes = off; });
    EXPECT_EQ(m.opt->graph_passes(), off);
    EXPECT_EQ(fused_form(m.opt->graph(), info.pass), 0);
    for (const GraphPassInfo& other : graph_pass_table())
      if (off.has(other.pass) && other.pass != GraphPass::bf16_gelu_inputs)
        EXPECT_GT(fused_form(m.opt->graph(), other.pass), 0) << other.name;
    TwoBlocks on([&](OptConfig& c) {
      c.passes = GraphPasses{info.pass}.with(GraphPass::fuse_bias).with(GraphPass::fuse_casts);
    });
    EXPECT_GT(fused_form(on.opt->graph(), info.pass), 0);
  }
}

// A forward-only context runs the inference passes by default; the training
// ones would find nothing in its graph (no backward nodes).
TEST(GraphPasses, ForwardOnlyRunsTheInferencePasses) {
  TwoBlocks m([](OptConfig& c) { c.forward_only = true; });
  EXPECT_EQ(m.opt->graph_passes(), kInference);
  EXPECT_GT(fused_form(m.opt->graph(), GraphPass::fuse_casts), 0);
  // The same model's forward graph, no context made: nothing for the training
  // passes (so leaving them out of forward-only contexts changes nothing).
  Context ctx;
  ctx.set_matmul_precision(bf16);
  nn::Sequential net(ctx);
  net.push_back<nn::TransformerBlock>(64, 4, 0.0f, true);
  net.push_back<nn::TransformerBlock>(64, 4, 0.0f, true);
  Graph g = Graph::forward(net.forward(ctx.input(f32, {4, 16, 64}, "x")));
  EXPECT_EQ(g.fuse_norm_residual(), 0u);
  EXPECT_EQ(g.sum_bf16_gradients(), 0u);
}

TEST(GraphPasses, TheBackendDecides) {
  {
    CpuWithoutBiasFusion cpu;
    TwoBlocks m([&](OptConfig& c) { c.backends = {&cpu}; });
    EXPECT_EQ(m.opt->graph_passes(), kTraining.without(GraphPass::fuse_bias));
    EXPECT_EQ(fused_form(m.opt->graph(), GraphPass::fuse_bias), 0);
    EXPECT_GT(fused_form(m.opt->graph(), GraphPass::fuse_casts), 0);
  }
  // Backend's default: no pass. The program trains as a CPU one without passes.
  PasslessCpu passless;
  TwoBlocks m([&](OptConfig& c) { c.backends = {&passless}; });
  TwoBlocks none([](OptConfig& c) { c.passes = GraphPasses(); });
  EXPECT_TRUE(m.opt->graph_passes().empty());
  for (const GraphPassInfo& info : graph_pass_table())
    EXPECT_EQ(fused_form(m.opt->graph(), info.pass), 0) << info.name;
  EXPECT_EQ(m.opt->graph().size(), none.opt->graph().size());
  for (TwoBlocks* b : {&m, &none}) {
    uint32_t seed = 10;
    for (Tensor p : b->net->parameters())
      p.set(kiln_test::uniform_floats(size_t(p.numel()), seed++));
    b->x.set(kiln_test::uniform_floats(size_t(b->x.numel()), 1));
    b->opt->labels().set(kiln_test::uniform_floats(size_t(b->opt->labels().numel()), 2));
  }
  for (int step = 0; step < 2; ++step) EXPECT_EQ(m.opt->train_batch(), none.opt->train_batch());
}

// The phase graphs of several backends are copies taken before the passes.
TEST(GraphPasses, SeveralBackendsGetNone) {
  CpuBackend c1(1), c2(1);
  TwoBlocks m([&](OptConfig& c) { c.backends = {&c1, &c2}; });
  EXPECT_TRUE(m.opt->graph_passes().empty());
  EXPECT_EQ(fused_form(m.opt->graph(), GraphPass::fuse_bias), 0);
}

TEST(GraphPasses, PassesAskedWhereTheyAreNotValidAreErrors) {
  auto build = [](GraphPasses p, bool forward_only) {
    return error_message([&] {
      TwoBlocks m([&](OptConfig& c) {
        c.passes = p;
        c.forward_only = forward_only;
      });
    });
  };
  EXPECT_TRUE(is_error(build({GraphPass::bf16_grad_sums}, true), "opt",
                       {"graph pass bf16_grad_sums", "not valid for inference graphs"}));
  EXPECT_TRUE(is_error(build(kTraining, true), "opt", {"fuse_residual", "inference"}));
  EXPECT_TRUE(is_error(build(kTraining.without(GraphPass::fuse_casts), false), "opt",
                       {"graph pass bf16_gelu_inputs needs fuse_casts"}));
  EXPECT_TRUE(is_error(build({GraphPass::fold_casts}, true), "opt",
                       {"graph pass fold_casts needs fuse_casts"}));
  EXPECT_EQ(build(kInference, true), "<no exception>");
}

}  // namespace
}  // namespace kiln::test
