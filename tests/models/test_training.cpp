// A training step through the loaded models: the cross-entropy loss and the
// gradients of named parameters equal the PyTorch reference's (float64).
#include <fstream>
#include <iterator>

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

INSTANTIATE_TEST_SUITE_P(Fixtures, ModelTraining,
                         ::testing::Values("llama3_gqa", "phi3_longrope", "gpt2"));

}  // namespace
}  // namespace kiln::test

namespace kiln::test {
namespace {

// The loaded models train with the ordinary training API: an OptContext given
// the model memorises one batch (the loss falls to a fraction of its start).
class ModelFit : public ::testing::TestWithParam<const char*> {};

TEST_P(ModelFit, OptContextLowersTheLoss) {
  Context ctx;
  CpuBackend cpu(1);
  auto model = models::load_pretrained(ctx, cpu, fixture_dir(GetParam()));
  Expected e(GetParam());
  const std::vector<int64_t> d = e.dims("input_ids");
  const int64_t B = d[0], T = d[1], V = model->vocab_size();
  model->train();
  Tensor ids = ctx.input(i32, {B, T}, "input_ids");
  OptConfig cfg;
  cfg.inputs = ids;
  // One row of logits per token: a loss of the user's (OptContext's own
  // cross-entropy wants one row per sample).
  Tensor logits = (*model)(ids);
  Tensor labels = ctx.input(i32, {B * T}, "labels");
  cfg.outputs = logits;
  cfg.loss = LossKind::user;
  cfg.user_loss = cross_entropy(logits.reshape({B * T, V}), labels);
  cfg.model = model.get();
  cfg.backends = {&cpu};
  cfg.schedule = schedule::constant(OptimizerParams{}.set_lr(1e-2f));
  OptContext opt(cfg);
  const std::vector<int32_t> x = e.ints("input_ids");
  std::vector<int32_t> y(x.size());  // next token of each row (the last predicts token 0)
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < T; ++t) y[size_t(b * T + t)] = t + 1 < T ? x[size_t(b * T + t + 1)] : 0;
  double first = 0, last = 0;
  for (int step = 0; step < 40; ++step) {
    opt.inputs().set(x);
    labels.set(y);
    last = opt.train_batch();
    if (step == 0) first = last;
  }
  EXPECT_GT(first, 2.0);
  EXPECT_LT(last, 0.25 * first) << "loss " << first << " -> " << last;
}

INSTANTIATE_TEST_SUITE_P(Fixtures, ModelFit,
                         ::testing::Values("llama3_gqa", "qwen3_qknorm_f16", "mistral_swa",
                                           "gpt2"));

}  // namespace
}  // namespace kiln::test

namespace kiln::test {
namespace {

// Dropout from the config (GPT-2's three; attention_dropout with Mistral's
// window, which takes the composite attention) acts in training graphs only.
TEST(ModelDropout, OnlyInTrainingGraphs) {
  struct Case {
    const char* fixture;
    std::vector<std::pair<std::string, std::string>> edits;
  };
  const Case cases[] = {
      {"gpt2",
       {{"\"resid_pdrop\": 0.0", "\"resid_pdrop\": 0.1"},
        {"\"embd_pdrop\": 0.0", "\"embd_pdrop\": 0.1"},
        {"\"attn_pdrop\": 0.0", "\"attn_pdrop\": 0.1"}}},
      {"mistral_swa", {{"\"attention_dropout\": 0.0", "\"attention_dropout\": 0.1"}}},
  };
  for (const Case& c : cases) {
    const std::string dir = fixture_dir(c.fixture);
    std::ifstream in(dir + "/config.json");
    std::string text((std::istreambuf_iterator<char>(in)), {});
    for (const auto& [from, to] : c.edits) {
      const size_t at = text.find(from);
      ASSERT_NE(at, std::string::npos) << from;
      text.replace(at, from.size(), to);
    }
    models::ModelConfig cfg = models::parse_config(text);
    Context ctx;
    CpuBackend cpu(1);
    auto model = models::make_model(ctx, cfg);
    model->allocate(cpu);
    models::load_weights(*model, dir);
    Expected e(c.fixture);
    // Evaluation: no dropout, the reference's logits.
    EXPECT_LT(rel_error(run_logits(ctx, *model, e), e.floats("logits")), 1e-4) << c.fixture;
    // Training: masks drop some activations.
    model->train();
    const std::vector<int64_t> d = e.dims("input_ids");
    Tensor ids = ctx.input(i32, {d[0], d[1]}, "ids_train");
    Tensor logits = (*model)(ids);
    Graph g = Graph::forward(logits);
    int masks = 0;
    for (const TensorNode* n : g.nodes()) masks += n->op == Op::RAND_MASK;
    EXPECT_GE(masks, 1) << c.fixture;
    GraphAllocator galloc(cpu.buffer_type());
    galloc.alloc(g);
    model->set_dropout_step(3);
    ids.set(e.ints("input_ids"));
    cpu.compute(g);
    const std::vector<float> train = logits.get<float>();
    for (float v : train) ASSERT_TRUE(std::isfinite(v)) << c.fixture;
    EXPECT_GT(rel_error(train, e.floats("logits")), 1e-3) << c.fixture;
  }
}

}  // namespace
}  // namespace kiln::test
