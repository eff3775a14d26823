// A training step through the loaded models: the cross-entropy loss and the
// gradients of named parameters equal the PyTorch reference's (float64).
#include "models_test_util.h"

namespace kiln::test {
namespace {

class ModelTraining : public ::testing::TestWithParam<const char*> {};

TEST_P(ModelTraining, LossAndGradientsMatchTheReference) {
  Context ctx;
  CpuBackend cpu(1);
  auto model = models::load_pretrained(ctx, cpu, fixture_dir(GetParam()));
  Expected e(GetParam());
  const std::vector<int64_t> d = e.dims("input_ids");
  const int64_t B = d[0], T = d[1], V = model->vocab_size();
  model->train();
  Tensor ids = ctx.input(i32, {B, T}, "input_ids");
  Tensor labels = ctx.input(i32, {B * T}, "labels");
  Tensor logits = (*model)(ids);
  Tensor loss = cross_entropy(logits.reshape({B * T, V}), labels);
  Graph g = Graph::forward({loss, logits});
  g.backward(loss);
  GraphAllocator galloc(cpu.buffer_type());
  galloc.alloc(g);
  g.reset_grads();
  ids.set(e.ints("input_ids"));
  labels.set(e.ints("labels"));
  cpu.compute(g);

  EXPECT_LT(rel_error(logits.get<float>(), e.floats("logits")), 1e-4);
  EXPECT_NEAR(loss.item(), e.floats("loss")[0], 1e-5 * std::fabs(e.floats("loss")[0]));
  int grads = 0;
  for (const std::string& name : e.names()) {
    if (name.rfind("grad.", 0) != 0) continue;
    const std::string param = name.substr(5);
    Tensor gr = g.grad(model->parameter(param));
    ASSERT_TRUE(gr.defined()) << "no gradient for " << param;
    const double err = rel_error(gr.get<float>(), e.floats(name));
    EXPECT_LT(err, 1e-4) << param;
    ++grads;
  }
  EXPECT_GE(grads, 5);
  // Every parameter gets a gradient, not only the recorded ones.
  for (const auto& [n, p] : model->named_parameters())
    EXPECT_TRUE(g.grad(p).defined()) << "no gradient for " << n;
}

INSTANTIATE_TEST_SUITE_P(Fixtures, ModelTraining, ::testing::Values("llama3_gqa", "gpt2"));

}  // namespace
}  // namespace kiln::test
