// Multi-tensor AdamW (OptConfig::multi_tensor) for the GPU (issue 44).
//
//   CudaOptimizerSteps.GptRecipeStepNodes   (no device) the optimizer nodes and
//        the kernels they launch for kiln-gpt's model at nanoGPT's GPU recipe
//        (6 layers, 6 heads, 384 wide, block 256; AdamW, weight-decay groups,
//        clipping at 1), per-param steps against multi-tensor steps; printed
//        for docs/cuda.md
//   CudaDevice.MultiAdamWMatchesPerParamAndCpu   (device) kiln-gpt's model
//        trained on the GPU alone with both, and on the CPU: same params
#include <gtest/gtest.h>

#include <cmath>
#include <iostream>
#include <vector>

#include "cuda/cuda_models.h"
#include "kiln/ext/tensor_node.h"
#include "kiln/kiln.h"

#if KILN_HAVE_CUDA
#include "kiln/cuda.h"
#endif

namespace kiln::test {
namespace {

struct OptNodes {
  size_t nodes = 0, kernels = 0, step_nodes = 0;  // kernels: nodes that are not views
  size_t grad_fills = 0;                          // fills zeroing the gradients per step
  size_t params = 0;
};

// kiln-gpt's optimizer program as examples/gpt/main.cpp builds it (one backend
// here: the CPU's; the nodes do not depend on it), batch 1.
OptNodes gpt_recipe_nodes(bool multi) {
  Context ctx;
  gpt::GptConfig c;
  c.n_layer = 6;
  c.n_head = 6;
  c.n_embd = 384;
  c.block = 256;
  c.vocab = 65;
  gpt::Gpt model(ctx, c);
  CpuBackend cpu(1);
  model.allocate(cpu);
  Tensor idx = ctx.input(i32, {1, c.block}, "idx"), targets = ctx.input(i32, {1, c.block}, "t");
  OptConfig oc = next_token_opt_config(model, idx, model(idx), targets, 0.1f);
  oc.clip_grad_norm = 1.0f;
  oc.backends = {&cpu};
  oc.multi_tensor = multi;
  OptContext opt(oc);
  OptNodes r;
  for (size_t k = opt.n_backward_nodes(); k < opt.graph().size(); ++k) {
    const TensorNode* n = opt.graph().nodes()[k];
    ++r.nodes;
    r.kernels += op_kind(n->op) != OpKind::VIEW;
    r.step_nodes += n->op == Op::ADAMW_STEP || n->op == Op::ADAMW_STEP_MULTI;
  }
  r.params = opt.params().size();
  r.grad_fills = multi ? 1 : r.params;
  return r;
}

TEST(CudaOptimizerSteps, GptRecipeStepNodes) {
  const OptNodes per = gpt_recipe_nodes(false), multi = gpt_recipe_nodes(true);
  std::cout << "kiln-gpt recipe optimizer program (" << per.params
            << " params, 2 groups, clip 1):\n"
            << "  per-param:    " << per.nodes << " nodes, " << per.kernels << " kernels, "
            << per.step_nodes << " step nodes, " << per.grad_fills << " gradient fills\n"
            << "  multi-tensor: " << multi.nodes << " nodes, " << multi.kernels << " kernels, "
            << multi.step_nodes << " step nodes, " << multi.grad_fills << " gradient fills\n";
  EXPECT_EQ(per.params, 76u);  // 12 per block, 2 embeddings, the final norm's 2
  EXPECT_EQ(per.step_nodes, per.params);
  EXPECT_EQ(multi.step_nodes, 1u);
  EXPECT_LE(multi.kernels, 12u);
  EXPECT_GE(per.kernels, 4 * per.params);  // sqr, sum, an add and a step per param
}

#if KILN_HAVE_CUDA
// kiln-gpt's model (cuda_models.h: params placed by the context, as flat
// slices) on the GPU alone with clipping that acts: multi-tensor steps against
// per-param steps on the GPU (same per-element arithmetic; the norm sums in
// another order) and against the CPU.
TEST(CudaDevice, MultiAdamWMatchesPerParamAndCpu) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device: " << cuda_unavailable_reason();
  std::vector<float> params[3];
  for (int side = 0; side < 3; ++side) {  // GPU multi, GPU per-param, CPU multi
    auto m = kiln_gpt(f32);
    CudaBackend gpu;
    CpuBackend cpu(1);
    OptConfig cfg = m->config({side < 2 ? static_cast<Backend*>(&gpu) : &cpu});
    cfg.clip_grad_norm = 0.05f;
    cfg.multi_tensor = side != 1;
    cfg.schedule =
        schedule::constant(OptimizerParams{.adamw = {.lr = 1e-3f, .weight_decay = 0.1f}});
    OptContext opt(cfg);
    m->fill(opt, 7);
    for (int step = 0; step < 3; ++step) opt.train_batch();
    EXPECT_GT(opt.grad_norm(), 0.05);
    for (const Tensor& p : m->params)
      for (float v : p.get<float>()) params[side].push_back(v);
  }
  ASSERT_EQ(params[0].size(), params[1].size());
  ASSERT_EQ(params[0].size(), params[2].size());
  // lr's tolerance, as KilnGptTrainsOnTheGpuAloneLikeTheCpu explains.
  for (int other : {1, 2})
    for (size_t i = 0; i < params[0].size(); ++i)
      ASSERT_NEAR(params[0][i], params[other][i], 1e-3) << "side " << other << " [" << i << "]";
}
#endif

}  // namespace
}  // namespace kiln::test
