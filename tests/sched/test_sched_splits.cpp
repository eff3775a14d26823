// The scheduler with a device-like test backend (own memory, only some ops):
// many splits and copies, and still the CPU backend's bits.
#include "kiln/ext/alloc.h"
#include "kiln/ext/sched.h"
#include "sched_test_util.h"

using namespace kiln;
using namespace sched_test;

namespace {

struct RunResult {
  std::vector<float> loss, logits;
  std::vector<std::vector<float>> grads;
  bool operator==(const RunResult&) const = default;
};

RunResult collect(const Model& m) {
  RunResult r{values(m.loss), values(m.logits), {}};
  for (Tensor g : m.grads()) r.grads.push_back(values(g));
  return r;
}

// Reference: the whole graph on the CPU backend, no scheduler.
RunResult reference(Model m, uint32_t seed, int runs = 1) {
  CpuBackend cpu(2);
  GraphAllocator galloc(cpu.buffer_type());
  galloc.alloc(m.graph);
  fill(m, seed);
  for (int i = 0; i < runs; ++i) cpu.compute(m.graph);
  return collect(m);
}

RunResult scheduled(Model& m, Scheduler& s, uint32_t seed, int runs = 1) {
  s.alloc(m.graph);
  fill(m, seed);
  for (int i = 0; i < runs; ++i) s.compute(m.graph);
  return collect(m);
}

const std::set<Op> kElementwise = {Op::ADD, Op::MUL, Op::RELU};

}  // namespace

TEST(SchedulerSplits, SubsetBackendMatchesCpuBitForBitOnAnMlp) {
  // Without expansion every add/mul/relu runs on TEST: many splits and copies.
  const RunResult want = reference(make_mlp(16, 20, 32, 5), 3, 2);
  for (bool expand : {false, true}) {
    SubsetBackend dev(kElementwise);
    CheckedCpu cpu(1);
    Scheduler s({&dev, &cpu}, {.expand = expand});
    Model m = make_mlp(16, 20, 32, 5);
    const int sets = DeviceBuffer::n_set, gets = DeviceBuffer::n_get;
    RunResult got = scheduled(m, s, 3, 2);  // two runs: gradients accumulate
    // Without expansion, 7 splits: CPU matmul | TEST add+relu | CPU matmul |
    // TEST add (logits) | CPU cross_entropy, its fused backward and the layer-2
    // and dh products | TEST mul (relu backward) | CPU rest. 7 copies: one into
    // each split after the first, and split 5 takes two (dh and the relu mask).
    // (The composite cross_entropy, 9 splits, put its ADDs and MULs on TEST.)
    EXPECT_EQ(s.n_splits(), expand ? 3u : 7u) << s.dump();
    EXPECT_EQ(s.n_copies(), expand ? 2u : 7u) << s.dump();
    EXPECT_GE(dev.n_computes, 2);
    EXPECT_GT(DeviceBuffer::n_set, sets);  // copies went through the device buffer
    EXPECT_GT(DeviceBuffer::n_get, gets);
    EXPECT_EQ(got, want) << "expand " << expand;
  }
}

TEST(SchedulerSplits, SubsetBackendMatchesCpuBitForBitOnACnn) {
  const RunResult want = reference(make_cnn(3, 2, 8, 4), 5);
  for (bool expand : {false, true}) {
    SubsetBackend dev(kElementwise);
    CheckedCpu cpu(1);
    Scheduler s({&dev, &cpu}, {.expand = expand});
    Model m = make_cnn(3, 2, 8, 4);
    RunResult got = scheduled(m, s, 5);
    EXPECT_GE(s.n_splits(), expand ? 5u : 10u) << s.dump();
    EXPECT_EQ(got, want) << "expand " << expand;
  }
}

TEST(SchedulerSplits, CpuFirstOrTestFirstGiveTheSameBits) {
  // Preference order changes the assignment, never the results.
  SubsetBackend dev({Op::ADD, Op::MUL, Op::RELU, Op::SUM, Op::EXP, Op::LOG, Op::SUB});
  CheckedCpu cpu(1);
  Scheduler dev_first({&dev, &cpu}), cpu_first({&cpu, &dev});
  Model a = make_mlp(8, 12, 16, 4), b = make_mlp(8, 12, 16, 4);
  RunResult ra = scheduled(a, dev_first, 9), rb = scheduled(b, cpu_first, 9);
  EXPECT_EQ(cpu_first.n_splits(), 1u) << cpu_first.dump();  // CPU supports everything
  EXPECT_GT(dev_first.n_splits(), 1u);
  EXPECT_EQ(ra, rb);
}

TEST(SchedulerSplits, StridedViewsOfDeviceTensorsAreCopiedWithTheirLayout) {
  // dW2 = h.T() @ dlogits: h lives on TEST, the matmul runs on CPU and reads a
  // transposed view of it, so the scheduler copies h and views the copy alike.
  SubsetBackend dev(kElementwise);
  CheckedCpu cpu(1);
  Scheduler s({&dev, &cpu});
  Model m = make_mlp(6, 5, 7, 3);
  RunResult got = scheduled(m, s, 11);
  bool transposed_copy = false;
  for (const SplitInfo& sp : s.splits())
    for (const TensorNode* n : sp.nodes)
      for (int i = 0; i < n->n_src; ++i)
        if (n->src[i]->view_src && !n->src[i]->is_contiguous() && s.backend_of(n) == &cpu &&
            s.backend_of(n->src[i]) == &dev)
          transposed_copy = true;
  EXPECT_TRUE(transposed_copy) << s.dump();
  EXPECT_EQ(got, reference(make_mlp(6, 5, 7, 3), 11));
}

TEST(SchedulerSplits, HostBackendsShareMemoryWithoutCopies) {
  // Like BLAS + CPU: different backends, same (host) memory: splits, no copies.
  SubsetBackend mm({Op::MATMUL}, /*host_memory=*/true);
  CheckedCpu cpu(1);
  Scheduler s({&mm, &cpu});
  Model m = make_mlp(8, 10, 12, 3);
  RunResult got = scheduled(m, s, 2);
  EXPECT_GE(s.n_splits(), 4u) << s.dump();
  EXPECT_EQ(s.n_copies(), 0u) << s.dump();
  EXPECT_GT(mm.n_computes, 0);
  EXPECT_EQ(s.buffer_size(mm), s.buffer_size(cpu));  // one allocator for host memory
  EXPECT_EQ(got, reference(make_mlp(8, 10, 12, 3), 2));
}

TEST(SchedulerSplits, ExpansionKeepsANodeWithItsNeighboursMemory) {
  // softmax (CPU only) -> relu (both) -> log_softmax (CPU only): relu stays on
  // the CPU, which saves copying its input to TEST and its output back.
  for (bool expand : {true, false}) {
    SubsetBackend dev(kElementwise);
    CheckedCpu cpu(1);
    Scheduler s({&dev, &cpu}, {.expand = expand});
    Context ctx;
    Tensor x = ctx.input(f32, {4, 6}, "x");
    Tensor r = relu(softmax(x));
    Tensor y = log_softmax(r);
    Graph g = Graph::forward(y);
    s.alloc(g);
    std::vector<float> xv(24);
    for (size_t i = 0; i < xv.size(); ++i) xv[i] = float(i % 5) - 2.0f;
    x.set(xv);
    s.compute(g);
    EXPECT_EQ(s.backend_of(r), expand ? static_cast<Backend*>(&cpu) : &dev) << s.dump();
    EXPECT_EQ(s.n_copies(), expand ? 0u : 2u) << s.dump();
    EXPECT_EQ(s.n_splits(), expand ? 1u : 3u) << s.dump();
  }
}

TEST(SchedulerSplits, OpsReadingPreallocatedTensorsRunWhereTheyLive) {
  // Params allocated by the user in device memory: the bias add runs on TEST
  // next to them; matmul (CPU only) gets a copy of w1. Params in host memory:
  // the bias add moves to the CPU.
  for (bool on_device : {true, false}) {
    SubsetBackend dev(kElementwise);
    CheckedCpu cpu(1);
    Scheduler s({&dev, &cpu});
    Model m = make_mlp(8, 10, 12, 3);
    BufferType& bt =
        on_device ? static_cast<BufferType&>(device_buffer_type()) : host_buffer_type();
    std::unique_ptr<Buffer> params = bt.alloc(1 << 16);
    TensorAllocator ta(*params);
    for (Tensor p : m.params) ta.place(p.node());
    RunResult got = scheduled(m, s, 4);
    const TensorNode* bias_add = nullptr;  // matmul(x, w1) + b1
    for (const TensorNode* n : m.graph.nodes())
      if (n->op == Op::ADD && n->src[1] == m.params[1].node()) bias_add = n;
    ASSERT_NE(bias_add, nullptr);
    EXPECT_EQ(s.backend_of(bias_add), on_device ? static_cast<Backend*>(&dev) : &cpu) << s.dump();
    for (Tensor p : m.params) EXPECT_EQ(p.node()->buffer, params.get());  // never moved
    bool w1_copied = false;
    for (const SplitInfo& sp : s.splits())
      for (const TensorNode* c : sp.copied) w1_copied |= c == m.params[0].node();
    EXPECT_EQ(w1_copied, on_device) << s.dump();
    EXPECT_EQ(got, reference(make_mlp(8, 10, 12, 3), 4));
  }
}

TEST(SchedulerSplits, DumpListsSplitsBackendsAndCopies) {
  SubsetBackend dev(kElementwise);
  CheckedCpu cpu(1);
  Scheduler s({&dev, &cpu});
  Model m = make_mlp(4, 6, 8, 3);
  s.alloc(m.graph);
  const std::string d = s.dump();
  EXPECT_NE(d.find("## SPLIT #0: "), std::string::npos) << d;
  EXPECT_NE(d.find("## SPLIT #" + std::to_string(s.n_splits() - 1) + ": "), std::string::npos) << d;
  EXPECT_NE(d.find("TEST (backend 0)"), std::string::npos) << d;
  EXPECT_NE(d.find("CPU (backend 1)"), std::string::npos) << d;
  EXPECT_NE(d.find("[copy from "), std::string::npos) << d;
  EXPECT_NE(d.find(" from TEST]"), std::string::npos) << d;  // an input copied off the device
  EXPECT_NE(d.find("matmul"), std::string::npos) << d;
  EXPECT_NE(d.find(std::to_string(s.n_copies()) + " copies per run"), std::string::npos) << d;
}

TEST(SchedulerSplits, AnOpNoBackendSupportsIsAClearError) {
  SubsetBackend dev(kElementwise);
  Scheduler s({&dev});
  Model m = make_mlp(4, 6, 8, 3);
  try {
    s.alloc(m.graph);
    FAIL() << "expected kiln::Error";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("[sched]"), std::string::npos) << msg;
    EXPECT_NE(msg.find("no backend supports it (backends: TEST)"), std::string::npos) << msg;
  }
  EXPECT_THROW(Scheduler({}), Error);
  EXPECT_THROW(Scheduler({&dev, &dev}), Error);
}
