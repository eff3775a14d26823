// The CUDA backend (kiln_test_cuda). Compiled and registered in every build
// with CUDA; the tests that need a device skip with GTEST_SKIP when there is
// none (CI), the rest (registry without a device, supports_op on the training
// graphs) run everywhere.
//
//   CudaRegistry.*   "cuda" listed only with a device; make_backend says why not
//   CudaSupports.*   every node of the MNIST fc/cnn, GPT-block and kiln-gpt
//                    (f32, bf16) training graphs (forward, backward, AdamW/SGD
//                    steps) has a CUDA kernel; dtype rules
//   CudaDevice.*     (device) buffers, copies, compute vs CPU, determinism,
//                    index errors, CUDA graph capture and replay, scheduler
//                    fallback to the CPU, training steps vs the CPU
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <iostream>
#include <set>
#include <string>

#include "common/error_check.h"
#include "cuda/cuda_models.h"
#include "kiln/ext/alloc.h"
#include "kiln/ext/sched.h"
#include "kiln/kiln.h"

#if KILN_HAVE_CUDA
#include "kiln/cuda.h"
#include "kiln/ext/tensor_node.h"

namespace kiln::test {
namespace {

#define SKIP_WITHOUT_DEVICE()                                                                      \
  do {                                                                                             \
    if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device: " << cuda_unavailable_reason(); \
  } while (0)

std::vector<float> ramp(int64_t n, float scale, int seed) {
  std::vector<float> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i)
    v[size_t(i)] = scale * float(((i * 37 + seed * 11) % 23) - 11) / 11.0f;
  return v;
}

// max |a - b| <= tol * max(1, max |a|)
::testing::AssertionResult close(const std::vector<float>& a, const std::vector<float>& b,
                                 double tol) {
  if (a.size() != b.size())
    return ::testing::AssertionFailure() << "sizes " << a.size() << " vs " << b.size();
  double worst = 0, mag = 1;
  size_t at = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    mag = std::max(mag, double(std::fabs(a[i])));
    const double d = std::fabs(double(a[i]) - double(b[i]));
    if (!(d <= worst)) {
      worst = d;
      at = i;
    }
  }
  if (worst <= tol * mag) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "element " << at << ": " << a[at] << " vs " << b[at]
                                       << " (|diff| " << worst << " > " << tol * mag << ")";
}

// ---------------------------------------------------------------- no device needed
TEST(CudaRegistry, ListedOnlyWithADevice) {
  const bool device = cuda_device_count() > 0;
  EXPECT_EQ(has_backend("cuda"), device);
  if (device) {
    EXPECT_EQ(backend_names().front(), "cuda");  // accelerators first
    auto be = make_backend("CUDA");
    EXPECT_STREQ(be->name(), "CUDA");
  } else {
    EXPECT_TRUE(kiln_test::is_error(kiln_test::error_message([] { make_backend("cuda"); }),
                                    "make_backend",
                                    {"'cuda' is not available", "CUDA", "available: "}));
    EXPECT_FALSE(cuda_unavailable_reason().empty());
    EXPECT_THROW(CudaBackend{}, Error);
  }
  EXPECT_TRUE(kiln_test::is_error(
      kiln_test::error_message([] { (void)CudaBackend(CudaOptions{.max_graphs = 0}); }), "cuda",
      {"max_graphs"}));
}

// Ops of a model's training graph (AdamW or SGD) that CUDA cannot run.
std::set<std::string> unsupported_ops(TestModel& m, OptimizerType opt_type,
                                      std::set<std::string>* seen) {
  CpuBackend cpu(1);
  OptConfig cfg = m.config({&cpu});
  cfg.optimizer = opt_type;
  if (opt_type == OptimizerType::sgd)
    cfg.schedule = [](const StepInfo&) {
      OptimizerParams p;
      p.sgd.momentum = 0.9f;
      return p;
    };
  // The graph as a program with a CUDA backend gets it: without the graph
  // passes, which CudaBackend::supports_pass refuses (biases and bf16 casts
  // folded into CPU-only products, bias gradients summed from bf16 copies,
  // residual sums into the norms).
  cfg.passes = GraphPasses{};
  OptContext opt(cfg);
  std::set<std::string> missing;
  for (TensorNode* n : opt.graph().nodes()) {
    if (seen) seen->insert(op_name(n->op));
    if (!CudaBackend::supports(n))
      missing.insert(std::string(op_name(n->op)) + " " + dtype_name(n->dtype));
  }
  for (TensorNode* n : opt.graph().leafs())
    if (!CudaBackend::supports(n)) missing.insert("leaf");
  return missing;
}

std::string list_of(const std::set<std::string>& items) {
  std::string s;
  for (const std::string& i : items) s += i + " ";
  return s;
}

// Every node of the training graphs has a CUDA kernel (the fused transformer
// primitives included, and kiln-gpt's model in bf16 with dropout): a training
// step runs on the GPU alone. Any op without a CUDA kernel fails this test.
TEST(CudaSupports, TrainingGraphsRunEntirelyOnCuda) {
  std::vector<std::unique_ptr<TestModel>> models = all_test_models();
  models.push_back(kiln_gpt(f32, 2, 0.1f));
  models.push_back(kiln_gpt(bf16, 2, 0.1f));
  for (auto& m : models) {
    std::set<std::string> ops;
    const std::set<std::string> missing = unsupported_ops(*m, OptimizerType::adamw, &ops);
    std::cout << m->name << " training graph ops: " << list_of(ops) << "\n";
    EXPECT_EQ(list_of(missing), "") << m->name << ": no CUDA kernel";
    EXPECT_GT(ops.size(), 5u);
  }
  std::set<std::string> ops;
  unsupported_ops(*kiln_gpt(f32), OptimizerType::adamw, &ops);
  for (const char* fused : {"attention", "attention_back", "layer_norm", "layer_norm_back",
                            "layer_norm_back_affine", "cross_entropy", "cross_entropy_back"})
    EXPECT_TRUE(ops.count(fused)) << "kiln-gpt's graph no longer has " << fused;
  auto fc = mnist_fc();
  ops.clear();
  EXPECT_EQ(list_of(unsupported_ops(*fc, OptimizerType::sgd, &ops)), "");
  EXPECT_TRUE(ops.count("sgd_step"));
}

TEST(CudaSupports, DtypeRules) {
  Context ctx;
  Tensor a = ctx.tensor(f32, {4, 8}), b = ctx.tensor(f32, {8, 3});
  Tensor h = ctx.tensor(f16, {4, 8}), hb = ctx.tensor(bf16, {8, 3});
  Tensor lab = ctx.tensor(i32, {4});
  EXPECT_TRUE(CudaBackend::supports(matmul(a, b).node()));
  EXPECT_TRUE(CudaBackend::supports(matmul(h, hb).node()));  // mixed: one operand gathered to f32
  EXPECT_TRUE(CudaBackend::supports(matmul(a.T().T(), b).node()));
  EXPECT_TRUE(CudaBackend::supports(a.to(f16).node()));
  EXPECT_TRUE(CudaBackend::supports(argmax(a, 1).node()));
  EXPECT_TRUE(CudaBackend::supports(eq(lab, lab).node()));
  EXPECT_TRUE(CudaBackend::supports(one_hot(lab, 8).node()));
  EXPECT_TRUE(CudaBackend::supports(a.T().node()));  // a view: no kernel needed
  // A node the kernels do not take: an elementwise op on i32 data.
  TensorNode bad = *add(a, a).node();
  bad.dtype = i32;
  bad.src[0] = lab.node();
  EXPECT_FALSE(CudaBackend::supports(&bad));
  TensorNode sm = *softmax(a).node();
  sm.src[0] = h.node();
  EXPECT_FALSE(CudaBackend::supports(&sm));
}

// ---------------------------------------------------------------- device
TEST(CudaDevice, BuffersAndCopies) {
  SKIP_WITHOUT_DEVICE();
  CudaBackend gpu;
  Context ctx;
  Tensor d1 = ctx.tensor(f32, {1000}), d2 = ctx.tensor(f32, {1000});
  auto buf = allocate_tensors(ctx, gpu);
  EXPECT_FALSE(buf->is_host());
  EXPECT_EQ(reinterpret_cast<uintptr_t>(buf->base()) % buf->type().alignment(), 0u);
  EXPECT_EQ(d1.get<float>(), std::vector<float>(1000, 0.0f));  // allocate_tensors zero-fills
  const std::vector<float> v = ramp(1000, 3.0f, 1);
  d1.set(v);
  EXPECT_EQ(d1.get<float>(), v);
  copy_tensor(d1.node(), d2.node());  // device to device
  EXPECT_EQ(d2.get<float>(), v);
  Context hctx;
  Tensor h = hctx.tensor(f32, {1000});
  CpuBackend cpu(1);
  auto hbuf = allocate_tensors(hctx, cpu);
  copy_tensor(d2.node(), h.node());  // device to host
  EXPECT_EQ(h.get<float>(), v);
  h.set(ramp(1000, 1.0f, 2));
  copy_tensor(h.node(), d1.node());  // host to device
  EXPECT_EQ(d1.get<float>(), ramp(1000, 1.0f, 2));
  d1.fill_zero();
  EXPECT_EQ(d1.get<float>(), std::vector<float>(1000, 0.0f));
  buf->clear(0xff);
  for (float x : d2.get<float>()) EXPECT_TRUE(std::isnan(x));
}

// A graph touching every kernel family, on CUDA and on the CPU.
struct Mixed {
  Context ctx;
  Tensor x, w, idx, out;
  Graph g;
  Mixed() {
    x = ctx.input(f32, {2, 3, 6, 6}, "x");
    w = ctx.param(f32, {4, 3, 3, 3}, "w");
    idx = ctx.input(i32, {5}, "idx");
    Conv2dOptions o;
    o.padding[0] = o.padding[1] = 1;
    Tensor c = max_pool2d(gelu(conv2d(x, w, {}, o)));  // [2, 4, 3, 3]
    Tensor f = c.reshape({2, 36});
    Tensor s = softmax(matmul(f, f.T()), {.scale = 0.1f});  // [2, 2]
    Tensor e = embedding(f.T().contiguous(), idx);          // [5, 2]
    // A layer norm written out: the fused LAYER_NORM has no CUDA kernel yet, and
    // this graph must run on CUDA alone.
    Tensor ctr = f - mean(f, 1, true);
    Tensor nrm = ctr / sqrt(mean(sqr(ctr), 1, true) + 1e-5f);
    out = sum(concat({s, e}, 0), 0) + sum(max(nrm, 1));  // [2]
    Tensor loss = sum(out);
    g = Graph::forward(loss);
    g.expand(out);
    g.backward(loss);
  }
  void set_inputs(int seed) {
    x.set(ramp(x.numel(), 1.0f, seed));
    idx.set(std::vector<int32_t>{0, 5, 35, 7, 1});
  }
};

// The device tests run Mixed on CudaBackend alone (no scheduler): every node
// must have a CUDA kernel. Checked here without a device.
TEST(CudaSupports, MixedGraphNeedsNoFallback) {
  Mixed m;
  for (TensorNode* n : m.g.nodes())
    EXPECT_TRUE(CudaBackend::supports(n)) << op_name(n->op) << " " << dtype_name(n->dtype);
}

std::vector<float> run_mixed(Backend& be, int seed, std::vector<float>* grad = nullptr) {
  Mixed m;
  auto buf = allocate_tensors(m.ctx, be);
  m.w.set(ramp(m.w.numel(), 0.3f, 9));
  m.set_inputs(seed);
  be.compute(m.g);
  if (grad) *grad = m.g.grad(m.w).get<float>();
  return m.out.get<float>();
}

TEST(CudaDevice, MixedGraphMatchesCpu) {
  SKIP_WITHOUT_DEVICE();
  CudaBackend gpu;
  CpuBackend cpu(1);
  std::vector<float> gg, gc;
  EXPECT_TRUE(close(run_mixed(gpu, 1, &gg), run_mixed(cpu, 1, &gc), 1e-5));
  EXPECT_TRUE(close(gg, gc, 1e-5));
}

TEST(CudaDevice, ReductionsAreDeterministic) {
  SKIP_WITHOUT_DEVICE();
  CudaBackend gpu;
  Context ctx;
  Tensor x = ctx.input(f32, {3, 1 << 20});
  Tensor s = sum(x), s1 = sum(x, 1), s0 = sum(x, 0), m = max(x, 1);
  Graph g = Graph::forward({s, s1, s0, m});
  auto buf = allocate_tensors(ctx, gpu);
  std::vector<float> v(size_t(x.numel()));
  for (size_t i = 0; i < v.size(); ++i) v[i] = std::sin(float(i) * 0.37f) * 100.0f;
  x.set(v);
  std::vector<std::vector<float>> first;
  for (int run = 0; run < 3; ++run) {
    gpu.compute(g);
    std::vector<std::vector<float>> got = {s.get<float>(), s1.get<float>(), s0.get<float>(),
                                           m.get<float>()};
    if (run == 0) first = got;
    for (size_t k = 0; k < got.size(); ++k)
      EXPECT_EQ(std::memcmp(got[k].data(), first[k].data(), got[k].size() * 4), 0)
          << "output " << k << " run " << run;
  }
  double ref = 0;
  for (float f : v) ref += f;
  EXPECT_NEAR(first[0][0], ref, 1e-5 * std::fabs(ref) + 1e-2);
}

TEST(CudaDevice, IndexErrorsThrow) {
  SKIP_WITHOUT_DEVICE();
  CudaBackend gpu;
  Context ctx;
  Tensor table = ctx.input(f32, {5, 4}), idx = ctx.input(i32, {3}), lab = ctx.input(i32, {2});
  Tensor e = embedding(table, idx), oh = one_hot(lab, 3);
  Graph g = Graph::forward({e, oh});
  auto buf = allocate_tensors(ctx, gpu);
  idx.set(std::vector<int32_t>{0, 4, 2});
  lab.set(std::vector<int32_t>{2, 0});
  gpu.compute(g);
  EXPECT_EQ(oh.get<float>(), (std::vector<float>{0, 0, 1, 1, 0, 0}));
  idx.set(std::vector<int32_t>{0, 4, 7});
  EXPECT_TRUE(kiln_test::is_error(kiln_test::error_message([&] { gpu.compute(g); }), "embedding",
                                  {"index 7", "position 2", "5 rows"}));
  idx.set(std::vector<int32_t>{0, 1, 2});
  lab.set(std::vector<int32_t>{-1, 3});
  EXPECT_TRUE(kiln_test::is_error(kiln_test::error_message([&] { gpu.compute(g); }), "one_hot",
                                  {"label -1", "position 0", "[0, 3)"}));
  // The fused loss checks its labels on the GPU too, with the CPU's message.
  Tensor logits = ctx.input(f32, {3, 4}), labels = ctx.input(i32, {3});
  Tensor loss = cross_entropy(logits, labels);
  Graph gl = Graph::forward(loss);
  auto lbuf = allocate_tensors(ctx, gpu);
  logits.set(std::vector<float>(12, 0.5f));
  labels.set(std::vector<int32_t>{3, 0, 1});
  gpu.compute(gl);
  EXPECT_NEAR(loss.get<float>()[0], std::log(4.0f), 1e-6);
  labels.set(std::vector<int32_t>{3, 4, -2});
  EXPECT_TRUE(kiln_test::is_error(kiln_test::error_message([&] { gpu.compute(gl); }),
                                  "cross_entropy", {"label 4", "position 1", "[0, 4)"}));
}

TEST(CudaDevice, RepeatedNodeListsAreCapturedAndReplayed) {
  SKIP_WITHOUT_DEVICE();
  CudaBackend gpu, plain({.graphs = false});
  CpuBackend cpu(1);
  for (int run = 0; run < 3; ++run)
    EXPECT_TRUE(close(run_mixed(plain, run, nullptr), run_mixed(cpu, run, nullptr), 1e-5))
        << "run " << run;
  EXPECT_EQ(plain.stats().captures, 0);
  EXPECT_EQ(plain.stats().eager, 3);

  Mixed m;
  auto buf = allocate_tensors(m.ctx, gpu);
  m.w.set(ramp(m.w.numel(), 0.3f, 9));
  std::vector<float> outs[2];
  for (int run = 0; run < 5; ++run) {
    // New values each run: a replay must read them (they are graph inputs).
    m.set_inputs(run);
    gpu.compute(m.g);
    const std::vector<float> want = run_mixed(cpu, run, nullptr);
    // Gradients accumulate over runs in m; the output does not depend on them.
    EXPECT_TRUE(close(m.out.get<float>(), want, 1e-5)) << "run " << run;
  }
  const CudaBackend::Stats st = gpu.stats();
  EXPECT_EQ(st.eager, 1);     // the first run
  EXPECT_EQ(st.captures, 1);  // the second run of the same list
  EXPECT_EQ(st.replays, 4);   // runs 2..5 (the capturing run launches the graph too)
}

// A CUDA backend that refuses SOFTMAX and LOG_SOFTMAX, so the scheduler runs
// them on the CPU with copies both ways.
class CudaWithoutSoftmax : public Backend {
 public:
  const char* name() const override { return "CUDA-no-softmax"; }
  BufferType& buffer_type() override { return gpu.buffer_type(); }
  bool supports_op(const TensorNode* n) const override {
    return n->op != Op::SOFTMAX && n->op != Op::LOG_SOFTMAX && gpu.supports_op(n);
  }
  using Backend::compute;
  void compute(std::span<TensorNode* const> nodes) override { gpu.compute(nodes); }
  void synchronize() override { gpu.synchronize(); }
  CudaBackend gpu;
};

TEST(CudaDevice, SchedulerFallsBackToCpu) {
  SKIP_WITHOUT_DEVICE();
  auto run = [](std::vector<Backend*> list, std::vector<std::string>* on_cpu) {
    Mixed m;
    Scheduler s(list);
    s.alloc(m.g);
    m.w.set(ramp(m.w.numel(), 0.3f, 9));
    m.set_inputs(3);
    s.compute(m.g);
    s.compute(m.g);  // twice: the CUDA splits replay; gradients accumulate
    if (on_cpu)
      for (const SplitInfo& sp : s.splits())
        if (sp.backend == 1)
          for (TensorNode* n : sp.nodes) on_cpu->push_back(op_name(n->op));
    return std::make_pair(m.out.get<float>(), m.g.grad(m.w).get<float>());
  };
  CudaWithoutSoftmax gpu;
  CpuBackend cpu(1), cpu_ref(1);
  std::vector<std::string> on_cpu;
  const auto got = run({&gpu, &cpu}, &on_cpu);
  const auto want = run({&cpu_ref}, nullptr);
  EXPECT_TRUE(close(got.first, want.first, 1e-5));
  EXPECT_TRUE(close(got.second, want.second, 1e-5));
  // The refused op ran on the CPU (the scheduler may move neighbours along).
  EXPECT_NE(std::find(on_cpu.begin(), on_cpu.end(), "softmax"), on_cpu.end());
}

// A few AdamW steps of each test model on CUDA and on the CPU, from the same
// values: losses and params agree. The CUDA side has the CPU as fallback (which
// these models no longer need: CudaSupports.TrainingGraphsRunEntirelyOnCuda).
TEST(CudaDevice, TrainingStepsMatchCpu) {
  SKIP_WITHOUT_DEVICE();
  for (int k = 0; k < 3; ++k) {
    std::vector<float> losses[2], params[2];
    for (int side = 0; side < 2; ++side) {
      auto models = all_test_models();
      TestModel& m = *models[size_t(k)];
      CudaBackend gpu;
      CpuBackend cpu(1);
      std::vector<Backend*> backends = {&cpu};
      if (side == 0) backends = {&gpu, &cpu};
      OptContext opt(m.config(backends));
      m.fill(opt, 7);
      for (int step = 0; step < 3; ++step) losses[side].push_back(float(opt.train_batch()));
      for (const Tensor& p : m.params)
        for (float v : p.get<float>()) params[side].push_back(v);
      if (side == 0) {
        EXPECT_GE(gpu.stats().replays, 1) << "the training step was never replayed";
        EXPECT_EQ(gpu.stats().evictions, 0);
      }
    }
    EXPECT_TRUE(close(losses[0], losses[1], 1e-4)) << all_test_models()[size_t(k)]->name;
    EXPECT_TRUE(close(params[0], params[1], 1e-4)) << all_test_models()[size_t(k)]->name;
  }
}

// CudaOptions::profile: every node timed, summed per op, dtype and shape.
TEST(CudaDevice, ProfileTimesEveryNode) {
  SKIP_WITHOUT_DEVICE();
  CudaBackend gpu(CudaOptions{.profile = true});
  Context ctx;
  Tensor a = ctx.input(f32, {64, 32}), b = ctx.input(f32, {64, 32});
  Tensor y = relu(a * b + a);
  Graph g = Graph::forward(y);
  auto buf = allocate_tensors(ctx, gpu);
  a.set(ramp(a.numel(), 1.0f, 1));
  b.set(ramp(b.numel(), 1.0f, 2));
  for (int r = 0; r < 3; ++r) gpu.compute(g);
  const std::string rep = gpu.profile_report();
  for (const char* row : {"mul f32 [64, 32]", "add f32 [64, 32]", "relu f32 [64, 32]"})
    EXPECT_NE(rep.find(row), std::string::npos) << rep;
  EXPECT_NE(rep.find("       3 "), std::string::npos) << rep;  // each node's three calls
  EXPECT_EQ(gpu.stats().replays, 0);                           // timing needs plain launches
  if (!std::getenv("KILN_CUDA_PROFILE")) EXPECT_EQ(CudaBackend().profile_report(), "");
}

// kiln-gpt's model trained on the GPU alone (no CPU backend to fall back on:
// the fused layer norm, attention and cross-entropy kernels run there), f32
// and bf16, against the same steps on the CPU.
TEST(CudaDevice, KilnGptTrainsOnTheGpuAloneLikeTheCpu) {
  SKIP_WITHOUT_DEVICE();
  for (DType precision : {f32, bf16}) {
    std::vector<float> losses[2], params[2];
    for (int side = 0; side < 2; ++side) {
      auto m = kiln_gpt(precision);
      CudaBackend gpu;
      CpuBackend cpu(1);
      OptContext opt(m->config({side == 0 ? static_cast<Backend*>(&gpu) : &cpu}));
      m->fill(opt, 7);
      for (int step = 0; step < 3; ++step) losses[side].push_back(float(opt.train_batch()));
      for (const Tensor& p : m->params)
        for (float v : p.get<float>()) params[side].push_back(v);
      if (side == 0) EXPECT_GE(gpu.stats().replays, 1) << "the training step was never replayed";
    }
    // bf16: both round the products' operands to bf16 and accumulate in f32,
    // in different orders; f32: only the order of the sums differs. AdamW
    // divides by sqrt(v): a near-zero gradient element whose last bits differ
    // moves its param by up to lr (1e-3) a step either way, so the params get
    // lr's tolerance (the H200 run saw 1.4e-4 in f32).
    const double tol = precision == f32 ? 1e-4 : 2e-2;
    EXPECT_TRUE(close(losses[0], losses[1], tol)) << dtype_name(precision);
    EXPECT_TRUE(close(params[0], params[1], std::max(tol, 1e-3))) << dtype_name(precision);
  }
}

// ---------------------------------------------------------------- device: the
// cases the review of the kernels found (each compared with the CPU backend).

// A graph built by `build` (outputs to read, and the inputs to set once memory
// exists), run on `be`; the outputs' values as f32 (i32 outputs converted).
struct Built {
  Graph g;
  std::vector<Tensor> outs;
  std::function<void()> set_inputs;
};
std::vector<std::vector<float>> run_built(Backend& be, const std::function<Built(Context&)>& build,
                                          int runs = 1) {
  Context ctx;
  Built b = build(ctx);
  for (TensorNode* n : b.g.nodes())  // the test's graph must not need the CPU
    EXPECT_TRUE(be.supports_op(n)) << op_name(n->op) << " " << dtype_name(n->dtype);
  auto buf = allocate_tensors(ctx, be);
  if (b.set_inputs) b.set_inputs();
  for (int r = 0; r < runs; ++r) be.compute(b.g);
  std::vector<std::vector<float>> r;
  for (const Tensor& t : b.outs) {
    if (t.dtype() == i32) {
      std::vector<float> v;
      for (int32_t x : t.get<int32_t>()) v.push_back(float(x));
      r.push_back(v);
    } else {
      r.push_back(t.get<float>());
    }
  }
  return r;
}

// Same bits (NaN payloads aside: any NaN equals any NaN).
::testing::AssertionResult same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  if (a.size() != b.size())
    return ::testing::AssertionFailure() << "sizes " << a.size() << " vs " << b.size();
  for (size_t i = 0; i < a.size(); ++i) {
    if (std::isnan(a[i]) && std::isnan(b[i])) continue;
    if (std::memcmp(&a[i], &b[i], 4) != 0)
      return ::testing::AssertionFailure() << "element " << i << ": " << a[i] << " vs " << b[i];
  }
  return ::testing::AssertionSuccess();
}

TEST(CudaDevice, CountEqualOverTheWholeGrid) {
  SKIP_WITHOUT_DEVICE();
  CudaBackend gpu;
  const int64_t n = 3'000'007;  // hundreds of blocks, a partial last one
  auto build = [&](Context& ctx) {
    Tensor a = ctx.input(i32, {n}), b = ctx.input(i32, {n});
    Tensor x = ctx.input(f32, {n / 7, 7});
    Tensor c = count_equal(a, b), cf = count_equal(x, x.T().contiguous().T());
    Built r{Graph::forward({c, cf}), {c, cf}, {}};
    r.set_inputs = [=]() mutable {
      std::vector<int32_t> va(static_cast<size_t>(n)), vb(static_cast<size_t>(n));
      for (int64_t i = 0; i < n; ++i) {
        va[size_t(i)] = int32_t(i % 1000);
        vb[size_t(i)] = i % 3 == 0 ? int32_t(i % 1000) : -1;
      }
      a.set(va);
      b.set(vb);
      x.set(ramp(x.numel(), 1.0f, 3));
    };
    return r;
  };
  const auto got = run_built(gpu, build);
  EXPECT_EQ(got[0][0], float((n + 2) / 3));
  EXPECT_EQ(got[1][0], float(n / 7 * 7));
}

// Embedding backward (SCATTER_ADD_ROWS) with repeated and hot rows: the same
// bits as the CPU (each row's values added in index order).
TEST(CudaDevice, ScatterAddRowsIsTheCpuSum) {
  SKIP_WITHOUT_DEVICE();
  CudaBackend gpu;
  CpuBackend cpu(1);
  auto build = [](Context& ctx) {
    Tensor table = ctx.param(f32, {50, 7}, "table"), idx = ctx.input(i32, {40, 100}, "idx");
    Tensor up = ctx.input(f32, {40, 100, 7}, "up");
    Tensor loss = sum(embedding(table, idx) * up);
    Built r{Graph::forward(loss), {}, {}};
    r.g.backward(loss);
    r.outs = {r.g.grad(table)};
    r.set_inputs = [=]() mutable {
      std::vector<int32_t> v(4000);
      for (size_t i = 0; i < v.size(); ++i) v[i] = i % 3 == 0 ? 7 : int32_t((i * 31) % 49);
      idx.set(v);
      up.set(ramp(up.numel(), 1.7f, 5));
      table.set(ramp(table.numel(), 0.5f, 1));
    };
    return r;
  };
  const auto got = run_built(gpu, build, 3), want = run_built(cpu, build, 3);
  EXPECT_TRUE(same_bits(got[0], want[0]));
  // cub's sort sizes and launches inside a stream capture too.
  EXPECT_EQ(gpu.stats().captures, 1);
  EXPECT_EQ(gpu.stats().replays, 2);
}

// A long axis with many outputs: the thread-per-output path sums in runs of
// 256 as the CPU does (same bits for a strided axis); the block path is close.
TEST(CudaDevice, LongAxisSumsWithManyOutputs) {
  SKIP_WITHOUT_DEVICE();
  CudaBackend gpu;
  CpuBackend cpu(1);
  auto build = [](Context& ctx) {
    Tensor x = ctx.input(f32, {4096, 5000});
    Tensor s0 = sum(x, 0), s1 = sum(x, 1), m0 = max(x, 0);
    Built r{Graph::forward({s0, s1, m0}), {s0, s1, m0}, {}};
    r.set_inputs = [=]() mutable {
      std::vector<float> v(size_t(x.numel()));
      for (size_t i = 0; i < v.size(); ++i) v[i] = 0.1f + 0.01f * float(i % 13);
      x.set(v);
    };
    return r;
  };
  const auto got = run_built(gpu, build), want = run_built(cpu, build);
  EXPECT_TRUE(same_bits(got[0], want[0]));
  EXPECT_TRUE(close(got[1], want[1], 1e-6));
  EXPECT_TRUE(same_bits(got[2], want[2]));
}

// NaN in softmax rows: as the CPU kernel (a NaN with a finite max: the unmasked
// entries NaN; a NaN among -inf only: the whole row NaN; masked rows: 0 / -inf).
TEST(CudaDevice, SoftmaxNanRowsLikeTheCpu) {
  SKIP_WITHOUT_DEVICE();
  CudaBackend gpu;
  CpuBackend cpu(1);
  auto build = [](Context& ctx) {
    Tensor x = ctx.input(f32, {5, 4});
    SoftmaxOptions causal;
    causal.causal = true;
    Tensor a = softmax(x), b = log_softmax(x), c = softmax(x, causal), d = log_softmax(x, causal);
    Built r{Graph::forward({a, b, c, d}), {a, b, c, d}, {}};
    r.set_inputs = [=]() mutable {
      const float nan = std::nanf(""), inf = INFINITY;
      x.set(std::vector<float>{nan,  1,    2, 3,   nan, -inf, -inf, -inf, -inf, -inf,
                               -inf, -inf, 1, nan, 0,   2,    -inf, 0,    1,    nan});
    };
    return r;
  };
  const auto got = run_built(gpu, build), want = run_built(cpu, build);
  for (size_t k = 0; k < got.size(); ++k) EXPECT_TRUE(same_bits(got[k], want[k])) << "output " << k;
}

// MATMUL operands cuBLAS cannot read as they lie, with equal and mixed dtypes.
TEST(CudaDevice, MatmulCopiesUnreadableAndMixedOperands) {
  SKIP_WITHOUT_DEVICE();
  CudaBackend gpu;
  CpuBackend cpu(1);
  auto build = [](Context& ctx) {
    Tensor a = ctx.input(f32, {6, 4, 5}), w = ctx.input(f32, {6, 3});
    Tensor a16 = a.to(f16), w16 = w.to(f16);
    // f16 x f16, a [5, 4, 6] view without a unit stride in its last two dims.
    Tensor out1 = matmul(a16.permute({2, 1, 0}), w16);
    Tensor out2 = matmul(a.permute({2, 1, 0}), w16);    // f32 (the same layout) x f16
    Tensor out3 = matmul(a16.permute({1, 2, 0}), w16);  // [4, 5, 6] read transposed in place
    Tensor out4 = matmul(a16.permute({1, 2, 0}), w);    // f16 x f32: both in f32
    Tensor b = ctx.input(f32, {4, 6, 3});
    Tensor out5 = matmul(a16.permute({1, 2, 0}), b.to(f16));  // batched, per-batch strides
    Built r{Graph::forward({out1, out2, out3, out4, out5}), {out1, out2, out3, out4, out5}, {}};
    r.set_inputs = [=]() mutable {
      a.set(ramp(a.numel(), 1.0f, 1));
      w.set(ramp(w.numel(), 1.0f, 3));
      b.set(ramp(b.numel(), 1.0f, 4));
    };
    return r;
  };
  const auto got = run_built(gpu, build), want = run_built(cpu, build);
  for (size_t k = 0; k < got.size(); ++k)
    EXPECT_TRUE(close(got[k], want[k], 1e-5)) << "output " << k;
}

// conv2d gradients whose dy has a zero row stride (sum over the channels) or
// is a broadcast scalar on a 1x1 output: gathered, not handed to cuBLAS with ld 0.
TEST(CudaDevice, ConvGradientsOfBroadcastOutputs) {
  SKIP_WITHOUT_DEVICE();
  CudaBackend gpu;
  CpuBackend cpu(1);
  auto build = [](Context& ctx) {
    Tensor x = ctx.param(f32, {2, 3, 5, 5}, "x"), w = ctx.param(f32, {4, 3, 3, 3}, "w");
    Tensor x1 = ctx.param(f32, {2, 3, 3, 3}, "x1");
    Tensor loss = sum(sum(conv2d(x, w), 1)) + sum(conv2d(x1, w));  // [2, 4, 3, 3] and [2, 4, 1, 1]
    Built r{Graph::forward(loss), {}, {}};
    r.g.backward(loss);
    r.outs = {r.g.grad(x), r.g.grad(w), r.g.grad(x1)};
    r.set_inputs = [=]() mutable {
      x.set(ramp(x.numel(), 1.0f, 1));
      w.set(ramp(w.numel(), 0.3f, 2));
      x1.set(ramp(x1.numel(), 1.0f, 3));
    };
    return r;
  };
  const auto got = run_built(gpu, build), want = run_built(cpu, build);
  for (size_t k = 0; k < got.size(); ++k)
    EXPECT_TRUE(close(got[k], want[k], 1e-5)) << "output " << k;
}

// Two node lists alternating through a cache of one: each drops the other, so
// nothing replays; a cache of two replays both.
TEST(CudaDevice, GraphCacheSizeDecidesReplays) {
  SKIP_WITHOUT_DEVICE();
  for (int cap = 1; cap <= 2; ++cap) {
    CudaBackend gpu({.max_graphs = cap});
    Context ctx;
    Tensor x = ctx.input(f32, {64});
    Tensor y1 = exp(x), y2 = sqr(x) + 1.0f;
    Graph g1 = Graph::forward(y1), g2 = Graph::forward(y2);
    auto buf = allocate_tensors(ctx, gpu);
    x.set(ramp(64, 1.0f, 1));
    for (int r = 0; r < 4; ++r) {
      gpu.compute(g1);
      gpu.compute(g2);
    }
    const CudaBackend::Stats st = gpu.stats();
    if (cap == 1) {
      EXPECT_EQ(st.replays, 0);
      EXPECT_EQ(st.eager, 8);
      EXPECT_EQ(st.evictions, 7);
    } else {
      EXPECT_EQ(st.eager, 2);
      EXPECT_EQ(st.captures, 2);
      EXPECT_EQ(st.replays, 6);
      EXPECT_EQ(st.evictions, 0);
    }
    const float x3 = ramp(64, 1.0f, 1)[3];
    EXPECT_FLOAT_EQ(y2.get<float>()[3], x3 * x3 + 1.0f);
  }
}

TEST(CudaDevice, Tf32IsOptIn) {
  SKIP_WITHOUT_DEVICE();
  CudaBackend exact, fast({.allow_tf32 = true});
  EXPECT_FALSE(exact.options().allow_tf32);
  CpuBackend cpu(1);
  auto mm = [](Backend& be) {
    Context ctx;
    Tensor a = ctx.input(f32, {64, 256}), b = ctx.input(f32, {256, 64});
    Tensor c = matmul(a, b);
    Graph g = Graph::forward(c);
    auto buf = allocate_tensors(ctx, be);
    a.set(ramp(a.numel(), 1.0f + 1e-3f, 1));
    b.set(ramp(b.numel(), 1.0f + 1e-3f, 2));
    be.compute(g);
    return c.get<float>();
  };
  const std::vector<float> ref = mm(cpu);
  EXPECT_TRUE(close(mm(exact), ref, 1e-5));  // full f32: close to the CPU
  EXPECT_TRUE(close(mm(fast), ref, 1e-2));   // TF32: 10-bit mantissas
}

}  // namespace
}  // namespace kiln::test

#else  // built without CUDA: the suite still exists and says so

TEST(CudaBackend, NotBuilt) {
  EXPECT_FALSE(kiln::has_backend("cuda"));
  GTEST_SKIP() << "kiln was built without CUDA (KILN_CUDA=OFF or nvcc not found)";
}

#endif
