// docs/design.md, principle 6: scheduling and running one graph many times gives the
// same results every time and leaves the user's graph exactly as it was (ggml's
// scheduler rewrote node sources in place, which broke the second run).
#include "kiln/ext/tensor_node.h"
#include "sched_test_util.h"

using namespace kiln;
using namespace sched_test;

namespace {

// Everything about a node the scheduler must not change.
struct NodeShape {
  Op op;
  int n_src;
  std::array<TensorNode*, kMaxSrc> src;
  TensorNode* view_src;
  std::array<int64_t, kMaxDims> stride;
  uint32_t flags;
  bool operator==(const NodeShape&) const = default;
};

std::vector<NodeShape> snapshot(const Graph& g) {
  std::vector<NodeShape> s;
  for (const TensorNode* n : g.nodes())
    s.push_back({n->op, n->n_src, n->src, n->view_src, n->stride, n->flags});
  return s;
}

std::vector<std::vector<float>> outputs(const Model& m) {
  std::vector<std::vector<float>> r{values(m.loss), values(m.logits)};
  for (Tensor g : m.grads()) r.push_back(values(g));
  return r;
}

}  // namespace

TEST(SchedulerRepeat, ScheduleAndRunTheSameGraph1000Times) {
  SubsetBackend dev({Op::ADD, Op::MUL, Op::RELU});
  CheckedCpu cpu(1);
  Scheduler s({&dev, &cpu});
  Model m = make_mlp(4, 6, 8, 3);
  const std::vector<NodeShape> before = snapshot(m.graph);
  const std::vector<TensorNode*> nodes = m.graph.nodes(), leafs = m.graph.leafs();

  s.alloc(m.graph);
  fill(m, 7);
  const size_t splits = s.n_splits(), copies = s.n_copies();
  ASSERT_GT(copies, 0u);
  std::vector<std::vector<float>> first;
  for (int i = 0; i < 1000; ++i) {
    // Even iterations schedule and allocate again; odd ones reuse the schedule.
    if (i % 2 == 0) EXPECT_FALSE(s.alloc(m.graph)) << "the same graph must fit the same buffers";
    m.graph.reset_grads();
    s.compute(m.graph);
    std::vector<std::vector<float>> now = outputs(m);
    if (i == 0) first = now;
    ASSERT_EQ(now, first) << "run " << i;
    ASSERT_EQ(s.n_splits(), splits);
    ASSERT_EQ(s.n_copies(), copies);
  }
  EXPECT_EQ(snapshot(m.graph), before);
  EXPECT_EQ(m.graph.nodes(), nodes);
  EXPECT_EQ(m.graph.leafs(), leafs);
}

TEST(SchedulerRepeat, GradientsAccumulateAcrossRunsWithoutReset) {
  SubsetBackend dev({Op::ADD, Op::MUL, Op::RELU});
  CheckedCpu cpu(1);
  Scheduler s({&dev, &cpu});
  Model m = make_mlp(4, 6, 8, 3);
  s.alloc(m.graph);
  fill(m, 3);
  s.compute(m.graph);
  std::vector<std::vector<float>> once;
  for (Tensor g : m.grads()) once.push_back(values(g));
  s.alloc(m.graph);  // re-planning keeps the accumulators (and their values) in place
  s.compute(m.graph);
  std::vector<Tensor> grads = m.grads();
  for (size_t i = 0; i < grads.size(); ++i) {
    std::vector<float> twice = values(grads[i]);
    for (size_t j = 0; j < twice.size(); ++j) ASSERT_EQ(twice[j], 2 * once[i][j]) << "grad " << i;
  }
}

TEST(SchedulerRepeat, TwoGraphsOfOneModelShareThePreallocatedParams) {
  // A training graph and an evaluation graph (forward only) scheduled in turn by
  // one scheduler: params the user pre-allocated keep their values.
  SubsetBackend dev({Op::ADD, Op::MUL, Op::RELU});
  CheckedCpu cpu(1);
  Scheduler s({&dev, &cpu});
  Model m = make_mlp(4, 6, 8, 3);
  Graph eval = Graph::forward(m.logits);
  std::unique_ptr<Buffer> pbuf = host_buffer_type().alloc(1 << 14);
  TensorAllocator ta(*pbuf);
  for (Tensor p : m.params) ta.place(p.node());
  ta.place(m.x.node());
  ta.place(m.labels.node());
  fill(m, 5);
  s.compute(eval);
  const std::vector<float> logits = values(m.logits);
  for (int i = 0; i < 3; ++i) {
    s.compute(m.graph);  // schedules the training graph (the eval schedule is dropped)
    s.compute(eval);
    ASSERT_EQ(values(m.logits), logits) << "round " << i;
  }
}

TEST(SchedulerRepeat, ReserveSizesTheBuffersOnceForTheLargestGraph) {
  SubsetBackend dev({Op::ADD, Op::MUL, Op::RELU});
  CheckedCpu cpu(1);
  Scheduler s({&dev, &cpu});
  Model m = make_mlp(4, 6, 8, 3);
  Graph eval = Graph::forward(m.logits);
  s.reserve(m.graph);
  const size_t host = s.buffer_size(cpu), device = s.buffer_size(dev);
  EXPECT_GT(host, 0u);
  EXPECT_GT(device, 0u);
  EXPECT_FALSE(s.alloc(m.graph));  // fits what reserve() sized
  EXPECT_FALSE(s.alloc(eval));
  EXPECT_EQ(s.buffer_size(cpu), host);
  EXPECT_EQ(s.buffer_size(dev), device);
}
