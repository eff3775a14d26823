// Packed examples (CausalLM::forward_packed, kiln::ChatPacking): a batch of
// windows, each holding several examples that attend only to themselves and
// count positions from 0, gives the loss and every gradient of its examples
// run one at a time (the mean over all their trained tokens), on a small
// random Llama; and the packing itself (first-fit decreasing, the rows it
// writes).
#include <functional>
#include <random>

#include "kiln/chat_dataset.h"
#include "models_test_util.h"

namespace kiln::test {
namespace {

models::ModelConfig small_llama() {
  models::LlamaConfig c;
  c.vocab_size = 61;
  c.hidden_size = 32;
  c.intermediate_size = 48;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;  // grouped-query attention
  c.head_dim = 8;
  c.max_position_embeddings = 128;
  c.rope_theta = 100.0;  // angles that differ visibly between positions
  models::ModelConfig cfg;
  cfg.model_type = "llama";
  cfg.llama = c;
  return cfg;
}

// Phi-3's shape of it: fused qkv_proj and gate_up_proj, 6 of the 8 dims of a head rotating.
models::ModelConfig small_phi3() {
  models::ModelConfig cfg = small_llama();
  cfg.model_type = cfg.llama->model_type = "phi3";
  cfg.llama->fused_projections = true;
  cfg.llama->rotary_dim = 6;
  return cfg;
}

// Examples of the given token counts: random ids, a random trained mask with
// at least one trained label.
ChatDataset random_examples(const std::vector<int64_t>& lengths, int64_t vocab, uint64_t seed) {
  std::mt19937_64 rng(seed);
  ChatDataset d;
  d.file = "random.jsonl";
  for (const int64_t n : lengths) {
    ChatExample e;
    e.line = d.size() + 1;
    for (int64_t t = 0; t < n; ++t) {
      e.ids.push_back(int32_t(rng() % uint64_t(vocab)));
      e.trained.push_back(uint8_t(rng() % 3 != 0));
    }
    e.trained[size_t(n - 1)] = 1;
    d.examples.push_back(std::move(e));
  }
  return d;
}

Tensor masked_loss(Tensor logits, Tensor labels) {
  const int64_t V = logits.size(2), N = labels.numel();
  CrossEntropyOptions o;
  o.ignore_index = kIgnoreIndex;
  return cross_entropy(logits.reshape({N, V}), labels.reshape({N}), o);
}

struct PackingLossAndGrads {
  double loss = 0;
  std::vector<std::vector<float>> grads;  // per param, in named_parameters order
};

// Computes g (its loss first) and reads the loss and the params' gradients.
PackingLossAndGrads run_packing_graph(Graph& g, Tensor loss, models::CausalLM& m, CpuBackend& cpu,
                                      const std::function<void()>& write) {
  GraphAllocator galloc(cpu.buffer_type());
  galloc.alloc(g);
  g.reset_grads();
  write();
  cpu.compute(g);
  PackingLossAndGrads r;
  r.loss = loss.item();
  for (const auto& [name, p] : m.named_parameters()) {
    Tensor gr = g.grad(p);
    EXPECT_TRUE(gr.defined()) << name;
    r.grads.push_back(gr.defined() ? gr.get<float>() : std::vector<float>{});
  }
  return r;
}

// The windows' examples one at a time, each a batch of one unpacked sequence:
// sum over examples of (loss x trained labels) / all trained labels, and the
// gradients weighted the same way.
PackingLossAndGrads one_at_a_time(Context& ctx, models::CausalLM& m, CpuBackend& cpu,
                                  const ChatDataset& d, const ChatPacking& p,
                                  const std::vector<int64_t>& rows) {
  PackingLossAndGrads sum;
  double counted = 0;
  for (const int64_t w : rows)
    for (const int64_t i : p.windows[size_t(w)]) {
      const ChatExample& e = d.examples[size_t(i)];
      const int64_t n = int64_t(e.ids.size()) - 1;
      double labels_counted = 0;
      for (int64_t t = 1; t <= n; ++t) labels_counted += e.trained[size_t(t)];
      Tensor ids = ctx.input(i32, {1, n}, "ids");
      Tensor labels = ctx.input(i32, {1, n}, "labels");
      Tensor loss = masked_loss(m(ids), labels);
      Graph g = Graph::forward(loss);
      g.backward(loss);
      const PackingLossAndGrads r = run_packing_graph(g, loss, m, cpu, [&] {
        const std::vector<int64_t> one = {i};
        d.write_batch(one, ids, labels);
      });
      sum.loss += r.loss * labels_counted;
      if (sum.grads.empty()) sum.grads.assign(r.grads.size(), {});
      for (size_t k = 0; k < r.grads.size(); ++k) {
        sum.grads[k].resize(r.grads[k].size(), 0.0f);
        for (size_t j = 0; j < r.grads[k].size(); ++j)
          sum.grads[k][j] += float(double(r.grads[k][j]) * labels_counted);
      }
      counted += labels_counted;
    }
  sum.loss /= counted;
  for (auto& gk : sum.grads)
    for (float& x : gk) x = float(double(x) / counted);
  return sum;
}

// Windows of 16 positions (the small-head attention kernels) and of 80 (the
// tiled ones); a batch of every window ([B, H, T, D] heads) and one window
// alone (grouped heads over one row of segment ids).
class ModelPacking : public ::testing::TestWithParam<const char*> {};

TEST_P(ModelPacking, PackedBatchEqualsItsExamplesOneAtATime) {
  Context ctx;
  CpuBackend cpu(2);
  models::ModelOptions mo;
  mo.max_seq_len = 128;
  auto model =
      models::make_model(ctx, std::string(GetParam()) == "phi3" ? small_phi3() : small_llama(), mo);
  model->allocate(cpu);
  model->init(7);
  // Norm weights off 1, so their gradients are not all alike.
  for (const auto& [name, p] : model->named_parameters())
    if (p.ndim() == 1) {
      std::vector<float> v = p.get<float>();
      for (size_t i = 0; i < v.size(); ++i) v[i] = 0.8f + 0.03f * float(i % 13);
      Tensor(p).set(v);
    }
  ASSERT_TRUE(model->supports_packing());
  model->train();
  struct Shape_ {
    int64_t window;
    std::vector<int64_t> lengths;
  };
  const Shape_ shapes[] = {{16, {5, 9, 3, 7, 4, 6, 2, 12, 17}},
                           {80, {40, 23, 61, 9, 33, 18, 5, 70, 12}}};
  for (const Shape_& s : shapes) {
    const ChatDataset d = random_examples(s.lengths, 61, uint64_t(s.window));
    const ChatPacking p = pack_chat_examples(d, s.window);
    ASSERT_GE(p.size(), 2);
    std::vector<int64_t> all(size_t(p.size()));
    int64_t fullest = 0;  // the window of the most examples
    for (int64_t w = 0; w < p.size(); ++w) {
      all[size_t(w)] = w;
      if (p.windows[size_t(w)].size() > p.windows[size_t(fullest)].size()) fullest = w;
    }
    ASSERT_GE(p.windows[size_t(fullest)].size(), 3u);
    for (const std::vector<int64_t>& rows : {all, std::vector<int64_t>{fullest}}) {
      SCOPED_TRACE("window " + std::to_string(s.window) + ", " + std::to_string(rows.size()) +
                   " windows");
      const int64_t B = int64_t(rows.size()), T = s.window;
      Tensor ids = ctx.input(i32, {B, T}, "ids");
      Tensor labels = ctx.input(i32, {B, T}, "labels");
      Tensor seg = ctx.input(i32, {B, T}, "segments");
      Tensor pos = ctx.input(i32, {B, T}, "positions");
      Tensor loss = masked_loss(model->forward_packed(ids, seg, pos), labels);
      Graph g = Graph::forward(loss);
      g.backward(loss);
      const PackingLossAndGrads packed = run_packing_graph(
          g, loss, *model, cpu, [&] { p.write_batch(d, rows, ids, labels, seg, pos); });
      const PackingLossAndGrads alone = one_at_a_time(ctx, *model, cpu, d, p, rows);
      EXPECT_NEAR(packed.loss, alone.loss, 1e-5 * alone.loss);
      ASSERT_EQ(packed.grads.size(), alone.grads.size());
      size_t k = 0;
      for (const auto& [name, param] : model->named_parameters()) {
        EXPECT_LT(rel_error(packed.grads[k], alone.grads[k]), 1e-4) << name;
        ++k;
      }
      // Without the segments and positions the same batch is another loss:
      // the comparison above can fail.
      Tensor ids2 = ctx.input(i32, {B, T}, "ids");
      Tensor labels2 = ctx.input(i32, {B, T}, "labels");
      Tensor seg2 = ctx.input(i32, {B, T}, "segments");
      Tensor pos2 = ctx.input(i32, {B, T}, "positions");
      Tensor plain = masked_loss((*model)(ids2), labels2);
      Graph gp = Graph::forward(plain);
      gp.expand(seg2);
      gp.expand(pos2);
      GraphAllocator galloc(cpu.buffer_type());
      galloc.alloc(gp);
      p.write_batch(d, rows, ids2, labels2, seg2, pos2);
      cpu.compute(gp);
      // (By ten times the tolerance of the equality above: Phi-3's shape, whose
      // positions turn 6 of 8 dims, differs by 7e-4 in one window.)
      EXPECT_GT(std::fabs(plain.item() - packed.loss), 10 * 1e-5 * alone.loss);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Families, ModelPacking, ::testing::Values("llama", "phi3"));

TEST(ChatPackingTest, FirstFitDecreasingAndTheRowsItWrites) {
  // Input positions (tokens - 1): 6, 3, 9, 2, 5, 4 into windows of 10:
  // 9 -> w0; 6 -> w1; 5 -> w2; 4 -> w1 (6 + 4); 3 -> w2 (5 + 3); 2 -> w2.
  const ChatDataset d = random_examples({7, 4, 10, 3, 6, 5}, 50, 3);
  const ChatPacking p = pack_chat_examples(d, 10);
  ASSERT_EQ(p.size(), 3);
  EXPECT_EQ(p.windows[0], (std::vector<int64_t>{2}));
  EXPECT_EQ(p.windows[1], (std::vector<int64_t>{0, 5}));
  EXPECT_EQ(p.windows[2], (std::vector<int64_t>{4, 1, 3}));
  EXPECT_EQ(p.real_positions, 29);
  EXPECT_NEAR(p.efficiency(), 29.0 / 30.0, 1e-12);

  Context ctx;
  CpuBackend cpu(1);
  Tensor ids = ctx.tensor(i32, {2, 10}), labels = ctx.tensor(i32, {2, 10});
  Tensor seg = ctx.tensor(i32, {2, 10}), pos = ctx.tensor(i32, {2, 10});
  auto buf = cpu.buffer_type().alloc(4096);
  TensorAllocator place(*buf);
  for (Tensor t : {ids, labels, seg, pos}) place.place(t.node());
  const std::vector<int64_t> rows = {0, 2};
  p.write_batch(d, rows, ids, labels, seg, pos);
  const std::vector<int32_t> s = seg.get<int32_t>(), q = pos.get<int32_t>();
  const std::vector<int32_t> x = ids.get<int32_t>(), y = labels.get<int32_t>();
  // Row 0: example 2 (9 positions), then one of padding.
  EXPECT_EQ(std::vector<int32_t>(s.begin(), s.begin() + 10),
            (std::vector<int32_t>{0, 0, 0, 0, 0, 0, 0, 0, 0, -1}));
  EXPECT_EQ(q[8], 8);
  EXPECT_EQ(y[9], kIgnoreIndex);
  // Row 1: examples 4 (5), 1 (3), 3 (2), positions from 0 in each.
  EXPECT_EQ(std::vector<int32_t>(s.begin() + 10, s.end()),
            (std::vector<int32_t>{0, 0, 0, 0, 0, 1, 1, 1, 2, 2}));
  EXPECT_EQ(std::vector<int32_t>(q.begin() + 10, q.end()),
            (std::vector<int32_t>{0, 1, 2, 3, 4, 0, 1, 2, 0, 1}));
  const ChatExample& e1 = d.examples[1];
  for (int64_t t = 0; t < 3; ++t) {
    EXPECT_EQ(x[size_t(15 + t)], e1.ids[size_t(t)]);
    EXPECT_EQ(y[size_t(15 + t)], e1.trained[size_t(t + 1)] ? e1.ids[size_t(t + 1)] : kIgnoreIndex);
  }
  // An example longer than a window + 1 tokens names its line.
  try {
    (void)pack_chat_examples(d, 8);
    FAIL() << "no error";
  } catch (const Error& err) {
    EXPECT_NE(std::string(err.what()).find("random.jsonl:3"), std::string::npos) << err.what();
  }
}

}  // namespace
}  // namespace kiln::test
