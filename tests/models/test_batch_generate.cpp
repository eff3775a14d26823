// Batched decoding (BatchGenerator, kiln/generate.h) against the one-sequence
// Generator: sequences that join and leave between steps get the logits and
// greedy ids each would get alone.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>

#include "common/error_check.h"
#include "kiln/generate.h"
#include "models_test_util.h"

namespace kiln::test {
namespace {

struct Loaded {
  Context ctx;
  CpuBackend cpu{1};
  std::unique_ptr<models::CausalLM> model;
  // precision: the context's matmul precision, set before the model is built.
  explicit Loaded(const std::string& name, DType precision = f32)
      : model((ctx.set_matmul_precision(precision),
               models::load_pretrained(ctx, cpu, fixture_dir(name)))) {}
};

int32_t argmax(std::span<const float> v) {
  return int32_t(std::max_element(v.begin(), v.end()) - v.begin());
}

// Generator's greedy run of `prompt`: the logits before each new token.
struct Reference {
  std::vector<int32_t> ids;
  std::vector<std::vector<float>> logits;
};
Reference alone(Loaded& m, const std::vector<int32_t>& prompt, int64_t n) {
  models::Generator gen(*m.model, m.cpu);
  Reference r;
  std::span<const float> l = gen.prefill(prompt);
  for (int64_t i = 0; i < n; ++i) {
    r.logits.emplace_back(l.begin(), l.end());
    r.ids.push_back(argmax(l));
    if (i + 1 < n) l = gen.step(r.ids.back());
  }
  return r;
}

class BatchGenerateFixture : public ::testing::TestWithParam<const char*> {};

// Four streams through three sequences: stream 0 starts alone, 1 and 2 join at
// steps 1 and 2, stream 0 leaves after its tokens (its row is taken by the
// last one) and stream 3 joins in its place; at step 4 stream 1 sits out (a
// padding row of the pass). Every logit vector matches Generator's within
// float rounding, and so every greedy id is the same.
TEST_P(BatchGenerateFixture, StreamsJoiningAndLeavingMatchGenerator) {
  Loaded m(GetParam());
  const int64_t n = 6;  // the GPT-2 fixture has 16 positions: 7 + 6 fit
  const std::vector<std::vector<int32_t>> prompts = {
      {5, 9, 13, 2, 40}, {7, 11, 3}, {1, 2, 3, 4, 5, 6, 7}, {33, 8}};
  std::vector<Reference> ref;
  for (const auto& p : prompts) ref.push_back(alone(m, p, n));

  models::BatchGenerator batch(*m.model, m.cpu, 3);
  struct Stream {
    int64_t seq = -1;
    std::vector<int32_t> ids;
    bool done = false;
  };
  std::vector<Stream> streams(prompts.size());
  auto join = [&](size_t s) { streams[s].seq = batch.start(prompts[s]); };
  for (int step = 0; step < 40; ++step) {
    if (step == 0) join(0);
    if (step == 1) join(1);
    if (step == 2) join(2);
    if (streams[0].done && streams[3].seq < 0) join(3);
    std::vector<models::BatchGenerator::Token> tokens;
    for (size_t s = 0; s < streams.size(); ++s) {
      Stream& st = streams[s];
      if (st.seq < 0 || st.done) continue;
      if (step == 4 && s == 1) continue;  // sits out one step
      const size_t k = st.ids.size();
      std::span<const float> l = batch.logits(st.seq);
      EXPECT_LT(rel_error({l.begin(), l.end()}, ref[s].logits[k]), 1e-5)
          << GetParam() << " stream " << s << " token " << k;
      st.ids.push_back(argmax(l));
      if (int64_t(st.ids.size()) == n) {
        st.done = true;
        batch.finish(st.seq);
      } else {
        tokens.push_back({st.seq, st.ids.back()});
      }
    }
    batch.step(tokens);
  }
  for (size_t s = 0; s < streams.size(); ++s) EXPECT_EQ(streams[s].ids, ref[s].ids) << s;
  EXPECT_EQ(batch.active(), 0);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, BatchGenerateFixture,
                         ::testing::Values("llama3_gqa", "qwen2_bias", "qwen3_qknorm_f16",
                                           "mistral_swa", "phi3_longrope", "gpt2"));

// start(prompt, true): a prompt that continues a finished sequence's tokens
// takes their keys and values from the free row that kept them (copied when
// that row is not the one the new sequence gets) and runs only the rest; the
// logits and greedy ids are Generator's on the whole prompt. A row another
// sequence has since used keeps nothing.
TEST_P(BatchGenerateFixture, FinishedPrefixesAreReused) {
  Loaded m(GetParam());
  models::BatchGenerator batch(*m.model, m.cpu, 2);
  const std::vector<int32_t> px{5, 9, 13}, py{7, 11, 3, 4};
  const int64_t x = batch.start(px, true), y = batch.start(py, true);
  EXPECT_EQ(batch.reused_tokens(x), 0);
  std::vector<int32_t> tx = px, ty = py;  // the tokens each cache row holds
  for (int k = 0; k < 2; ++k) {
    const int32_t ix = argmax(batch.logits(x)), iy = argmax(batch.logits(y));
    batch.step({{x, ix}, {y, iy}});
    tx.push_back(ix);
    ty.push_back(iy);
  }
  batch.finish(y);  // row 1 keeps ty
  batch.finish(x);  // row 0 keeps tx
  std::vector<int32_t> pz = ty;
  for (int32_t id : {2, 6}) pz.push_back(id);
  const int64_t n = 4;  // the GPT-2 fixture has 16 positions: 8 + 4 fit
  const Reference ref = alone(m, pz, n);
  const int64_t z = batch.start(pz, true);  // row 0, copied from row 1
  EXPECT_EQ(batch.reused_tokens(z), int64_t(ty.size()));
  EXPECT_EQ(batch.position(z), int64_t(pz.size()));
  std::vector<int32_t> ids;
  for (int64_t k = 0; k < n; ++k) {
    std::span<const float> l = batch.logits(z);
    EXPECT_LT(rel_error({l.begin(), l.end()}, ref.logits[size_t(k)]), 1e-5) << GetParam() << k;
    ids.push_back(argmax(l));
    if (k + 1 < n) batch.step({{z, ids.back()}});
  }
  EXPECT_EQ(ids, ref.ids);
  // Row 0 now holds z: x's tokens are gone. Row 1 still keeps ty.
  std::vector<int32_t> pw = tx;
  pw.push_back(1);
  const int64_t w = batch.start(pw, true);
  EXPECT_EQ(batch.reused_tokens(w), 0);
  batch.finish(w);
  batch.finish(z);
  // Without reuse_prefix nothing is taken; the same prompt again reuses all
  // but its last token.
  const int64_t again = batch.start(pz);
  EXPECT_EQ(batch.reused_tokens(again), 0);
  batch.finish(again);
  EXPECT_EQ(batch.reused_tokens(batch.start(pz, true)), int64_t(pz.size()) - 1);
}

TEST(BatchGenerate, Errors) {
  Loaded m("gpt2");
  models::GeneratorOptions go;
  go.max_seq_len = 8;
  models::BatchGenerator batch(*m.model, m.cpu, 2, go);
  EXPECT_KILN_ERROR(batch.start(std::vector<int32_t>(9, 1)), "generate", "9 tokens",
                    "cache of 8 positions");
  EXPECT_KILN_ERROR(batch.start(std::vector<int32_t>{}), "generate", "empty prompt");
  EXPECT_KILN_ERROR(batch.start(std::vector<int32_t>{1, 96}), "generate", "token id 96");
  const int64_t a = batch.start(std::vector<int32_t>(7, 1));
  const int64_t b = batch.start(std::vector<int32_t>{1});
  EXPECT_KILN_ERROR(batch.start(std::vector<int32_t>{1}), "generate", "all 2 sequences");
  EXPECT_KILN_ERROR(batch.step({{a, 1}, {a, 2}}), "generate", "sequence 0 is given twice");
  EXPECT_KILN_ERROR(batch.step({{b, 96}}), "generate", "token id 96");
  EXPECT_KILN_ERROR(batch.step({{a + 5, 1}}), "generate", "sequence 5 is not active");
  batch.step({{a, 1}, {b, 1}});
  EXPECT_EQ(batch.position(a), 8);
  EXPECT_KILN_ERROR(batch.step({{a, 1}}), "generate", "fills its cache of 8");
  batch.finish(a);
  EXPECT_KILN_ERROR(batch.logits(a), "generate", "sequence 0 is not active");
  EXPECT_EQ(batch.position(b), 2);
  EXPECT_KILN_ERROR(models::BatchGenerator(*m.model, m.cpu, 0), "generate", "max_sequences");
}

// GeneratorOptions::passes in batched decoding: the bit-identical inference
// passes (fuse_bias, fuse_casts, fold_casts) under the bf16 policy give the
// logits of the graphs without passes, bit for bit, for prompts and batched
// steps; a training-only pass is an error naming it.
TEST(BatchGenerate, GraphPasses) {
  const GraphPasses exact =
      GraphPasses::defaults(GraphKind::inference).without(GraphPass::bf16_gelu_inputs);
  for (const char* name : {"qwen2_bias", "gpt2"}) {
    SCOPED_TRACE(name);
    Loaded plain(name, bf16), fused(name, bf16);
    models::GeneratorOptions go;
    go.passes = exact;
    models::BatchGenerator b0(*plain.model, plain.cpu, 2), b1(*fused.model, fused.cpu, 2, go);
    auto same = [&](int64_t s0, int64_t s1) {
      const std::span<const float> l0 = b0.logits(s0), l1 = b1.logits(s1);
      ASSERT_EQ(l0.size(), l1.size());
      EXPECT_EQ(std::memcmp(l0.data(), l1.data(), l0.size() * sizeof(float)), 0);
    };
    const int64_t a0 = b0.start(std::vector<int32_t>{5, 9, 13, 2}),
                  a1 = b1.start(std::vector<int32_t>{5, 9, 13, 2});
    const int64_t c0 = b0.start(std::vector<int32_t>{7, 11}),
                  c1 = b1.start(std::vector<int32_t>{7, 11});
    same(a0, a1);
    same(c0, c1);
    for (int32_t t : {3, 8, 1}) {
      b0.step({{a0, t}, {c0, int32_t(t + 1)}});
      b1.step({{a1, t}, {c1, int32_t(t + 1)}});
      same(a0, a1);
      same(c0, c1);
    }
    int biased = 0;
    for (size_t i = 0; i < fused.ctx.size(); ++i)
      biased += fused.ctx.node(i)->op == Op::MATMUL && fused.ctx.node(i)->n_src == 3;
    EXPECT_GT(biased, 0);
  }
  Loaded m("gpt2");
  models::GeneratorOptions go;
  go.passes = {GraphPass::bf16_grad_sums};
  EXPECT_KILN_ERROR(models::BatchGenerator(*m.model, m.cpu, 2, go), "generate",
                    "graph pass bf16_grad_sums", "not valid for inference graphs");
}

// x @ W^T for a few rows of x (a decoding batch) reads W once for all rows
// (gemv_rows_multi): each row equals its one-row product (gemv_rows) up to
// float rounding (FMA contraction may differ between the two loops), for f32,
// f16 and bf16 W and K with and without a tail.
TEST(BatchGenerate, FewRowProductsEqualOneRowProducts) {
  for (DType wt : {f32, f16, bf16})
    for (int64_t K : {64, 67}) {
      const int64_t N = 37, M = 8;
      Context ctx;
      CpuBackend cpu(2);
      Tensor x = ctx.input(f32, {M, K}), w32 = ctx.input(f32, {N, K});
      Tensor w = wt == f32 ? w32 : w32.to(wt);
      std::vector<Tensor> outs = {matmul(x, w.T())};
      for (int64_t m = 1; m <= M; ++m)  // the first m rows together, and row m-1 alone
        outs.push_back(matmul(x.narrow(0, 0, m).contiguous(), w.T()));
      for (int64_t m = 0; m < M; ++m) outs.push_back(matmul(x.narrow(0, m, 1).contiguous(), w.T()));
      Graph g = Graph::forward(outs[0]);
      for (Tensor t : outs) g.expand(t);
      GraphAllocator galloc(cpu.buffer_type());
      galloc.alloc(g);
      std::vector<float> xv(size_t(M * K)), wv(size_t(N * K));
      for (size_t i = 0; i < xv.size(); ++i) xv[i] = float(std::sin(0.37 * double(i)));
      for (size_t i = 0; i < wv.size(); ++i) wv[i] = float(std::cos(0.11 * double(i)));
      x.set(xv);
      w32.set(wv);
      cpu.compute(g);
      for (int64_t m = 0; m < M; ++m) {
        const std::vector<float> alone = outs[size_t(1 + M + m)].get<float>();
        for (int64_t rows = m + 1; rows <= M; ++rows) {
          const std::vector<float> all = outs[size_t(rows)].get<float>();
          const std::vector<float> mine(all.begin() + m * N, all.begin() + (m + 1) * N);
          EXPECT_LT(rel_error(mine, alone), 1e-6)
              << dtype_name(wt) << " K=" << K << " row " << m << " of " << rows;
        }
      }
    }
}

}  // namespace
}  // namespace kiln::test
