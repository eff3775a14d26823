// GraphAllocator planning, no kernels needed: liveness, in-place rules, views,
// keep-alive, reserve/alloc, pre-allocated tensors, node lists, and the overlap
// check over thousands of random graphs.
#include <gtest/gtest.h>

#include <set>

#include "alloc_check.h"
#include "kiln/ext/alloc.h"

using namespace kiln;
using alloc_test::check_overlaps;

namespace {

const char* ptr(Tensor t) { return static_cast<const char*>(t.node()->data); }

bool disjoint(Tensor a, Tensor b) {
  return ptr(a) + a.node()->nbytes() <= ptr(b) || ptr(b) + b.node()->nbytes() <= ptr(a);
}

}  // namespace

TEST(GraphAllocator, ElementwiseChainRunsInPlace) {
  Context ctx;
  Tensor x = ctx.input(f32, {64}, "x");
  Tensor s = scale(x, 2.0f);
  Tensor r = relu(s);
  Tensor t = tanh(r);
  Tensor out = sum(t);
  Graph g = Graph::forward(out);
  GraphAllocator galloc(host_buffer_type());
  EXPECT_TRUE(galloc.alloc(g));
  EXPECT_EQ(galloc.plan().n_inplace, 2u);  // relu over scale, tanh over relu
  EXPECT_NE(ptr(s), ptr(x));               // never over an input
  EXPECT_EQ(ptr(r), ptr(s));
  EXPECT_EQ(ptr(t), ptr(s));
  EXPECT_EQ(galloc.plan().buffer_size, 256u + 256u + 64u);
  EXPECT_EQ(galloc.plan().lower_bound, galloc.plan().buffer_size);
  EXPECT_EQ(check_overlaps(g, *galloc.buffer()), "");
}

TEST(GraphAllocator, NoInPlaceWhenTheSourceIsReadLater) {
  Context ctx;
  Tensor x = ctx.input(f32, {16, 16}, "x");
  Tensor a = scale(x, 0.5f);
  Tensor b = relu(a);        // a is read again below: relu needs its own block
  Tensor c = add(b, a);      // b's last reader: c may take over b
  Tensor d = add(c, c.T());  // c read twice (transposed): no in-place
  Graph g = Graph::forward(sum(d));
  GraphAllocator galloc(host_buffer_type());
  galloc.alloc(g);
  EXPECT_TRUE(disjoint(a, b));
  EXPECT_EQ(ptr(c), ptr(b));
  EXPECT_TRUE(disjoint(d, c));
  EXPECT_EQ(galloc.plan().n_inplace, 1u);
  EXPECT_EQ(check_overlaps(g, *galloc.buffer()), "");
}

TEST(GraphAllocator, NeverInPlaceOverKeptTensors) {
  Context ctx;
  Tensor x = ctx.input(f32, {8}, "x"), p = ctx.param(f32, {8}, "p"), c = ctx.tensor(f32, {8}, "c");
  Tensor h = scale(c, 3.0f);
  detail::set_flags(h, kFlagOutput);  // an output read by a later node
  Tensor y = relu(x) + relu(p) + relu(h);
  Graph g = Graph::forward(y);
  g.expand(h);
  GraphAllocator galloc(host_buffer_type());
  galloc.alloc(g);
  // (Blocks of dead tensors are reused, so compare each node with its own source.)
  for (TensorNode* n : g.nodes())
    for (Tensor kept : {x, p, c, h})
      if (n->src[0] == kept.node() && n->data == kept.node()->data)
        ADD_FAILURE() << op_name(n->op) << " ran in place over " << kept.name();
  EXPECT_EQ(galloc.plan().n_inplace, 1u);  // only the add over relu(x)
  EXPECT_EQ(check_overlaps(g, *galloc.buffer()), "");
}

TEST(GraphAllocator, ViewsKeepTheirSourceAlive) {
  Context ctx;
  Tensor x = ctx.input(f32, {8, 8}, "x");
  Tensor a = scale(x, 2.0f);
  Tensor v = a.narrow(0, 2, 4).T();  // read after b is computed
  Tensor b = exp(x);
  Tensor c = matmul(v, b.narrow(0, 0, 4));
  Graph g = Graph::forward(c);
  GraphAllocator galloc(host_buffer_type());
  galloc.alloc(g);
  EXPECT_TRUE(disjoint(a, b));
  EXPECT_EQ(ptr(v), ptr(a) + v.node()->view_offs);
  EXPECT_EQ(check_overlaps(g, *galloc.buffer()), "");
}

TEST(GraphAllocator, InPlaceThroughAWholeReshape) {
  Context ctx;
  Tensor x = ctx.input(f32, {4, 8}, "x");
  Tensor a = scale(x, 2.0f);
  Tensor r = relu(a.reshape({32}));     // the view covers all of a: relu may take a's block
  Tensor n = relu(r.narrow(0, 0, 16));  // a narrow view covers half: no
  Graph g = Graph::forward(sum(n));
  GraphAllocator galloc(host_buffer_type());
  galloc.alloc(g);
  EXPECT_EQ(ptr(r), ptr(a));
  EXPECT_TRUE(disjoint(n, r));
  EXPECT_EQ(galloc.plan().n_inplace, 1u);
  EXPECT_EQ(check_overlaps(g, *galloc.buffer()), "");
}

TEST(GraphAllocator, BlocksAreFreedAfterTheLastConsumer) {
  // A long chain of matmuls: only two activations (plus leaves) live at a time.
  Context ctx;
  Tensor h = ctx.input(f32, {64, 64}, "x");
  Tensor w = ctx.param(f32, {64, 64}, "w");
  for (int i = 0; i < 20; ++i) h = matmul(h, w);
  Graph g = Graph::forward(h);
  GraphAllocator galloc(host_buffer_type());
  galloc.alloc(g);
  const size_t one = 64 * 64 * 4;
  EXPECT_EQ(galloc.plan().total_size, 22 * one);
  EXPECT_EQ(galloc.plan().lower_bound, 4 * one);
  EXPECT_EQ(galloc.plan().buffer_size, 4 * one);
  EXPECT_EQ(check_overlaps(g, *galloc.buffer()), "");
}

TEST(GraphAllocator, ReuseOffGivesEveryTensorItsOwnBlock) {
  Context ctx;
  Tensor x = ctx.input(f32, {32}, "x");
  Tensor y = sum(tanh(relu(x * x)) + x);
  Graph g = Graph::forward(y);
  GraphAllocator galloc(host_buffer_type(), {.reuse = false});
  galloc.alloc(g);
  EXPECT_EQ(galloc.plan().n_inplace, 0u);
  EXPECT_EQ(galloc.plan().buffer_size, galloc.plan().total_size);
  EXPECT_EQ(galloc.plan().lower_bound, galloc.plan().total_size);
  std::set<void*> seen;
  for (TensorNode* n : g.nodes())
    if (!n->is_view()) {
      EXPECT_TRUE(seen.insert(n->data).second);
    }
}

TEST(GraphAllocator, ReserveThenAllocDoesNotReallocate) {
  auto mlp = [](Context& ctx, int64_t batch) {
    Tensor x = ctx.input(f32, {batch, 32}, "x");
    Tensor w1 = ctx.param(f32, {32, 64}, "w1"), w2 = ctx.param(f32, {64, 10}, "w2");
    Tensor loss = mean(sqr(matmul(relu(matmul(x, w1)), w2)));
    Graph g = Graph::forward(loss);
    g.backward(loss);
    return g;
  };
  Context big_ctx, small_ctx;
  Graph big = mlp(big_ctx, 64), small = mlp(small_ctx, 16);
  GraphAllocator galloc(host_buffer_type());
  EXPECT_TRUE(galloc.reserve(big));
  EXPECT_EQ(galloc.n_reallocs(), 1);
  for (TensorNode* n : big.nodes()) EXPECT_EQ(n->data, nullptr);  // reserve places nothing
  EXPECT_FALSE(galloc.alloc(big));
  EXPECT_EQ(check_overlaps(big, *galloc.buffer()), "");
  std::vector<void*> before;
  for (TensorNode* n : big.nodes()) before.push_back(n->data);
  EXPECT_FALSE(galloc.alloc(big));  // same graph again: same places
  for (size_t i = 0; i < before.size(); ++i) EXPECT_EQ(big.nodes()[i]->data, before[i]);
  EXPECT_FALSE(galloc.alloc(small));  // a smaller graph fits
  EXPECT_EQ(check_overlaps(small, *galloc.buffer()), "");
  EXPECT_EQ(galloc.n_reallocs(), 1);
  // A larger graph than reserved: one reallocation, reported.
  Context huge_ctx;
  Graph huge = mlp(huge_ctx, 256);
  EXPECT_TRUE(galloc.alloc(huge));
  EXPECT_EQ(galloc.n_reallocs(), 2);
  EXPECT_GE(galloc.buffer_size(), galloc.plan().buffer_size);
  EXPECT_EQ(check_overlaps(huge, *galloc.buffer()), "");
}

TEST(GraphAllocator, PreAllocatedTensorsAreLeftAlone) {
  Context ctx;
  CpuBackend cpu(1);
  Tensor w = ctx.param(f32, {16, 16}, "w");
  auto weights = allocate_tensors(ctx, cpu);  // only w so far
  void* w_data = w.node()->data;
  Tensor x = ctx.input(f32, {4, 16}, "x");
  Tensor y = relu(matmul(x, w));
  Graph g = Graph::forward(y);
  GraphAllocator galloc(cpu.buffer_type());
  galloc.alloc(g);
  EXPECT_EQ(w.node()->data, w_data);
  EXPECT_EQ(w.node()->buffer, weights.get());
  EXPECT_EQ(x.node()->buffer, galloc.buffer());
  EXPECT_EQ(galloc.plan().n_tensors, 3u);  // x, matmul, relu
  EXPECT_EQ(check_overlaps(g, *galloc.buffer()), "");
}

TEST(GraphAllocator, MeasureTouchesNothing) {
  Context ctx;
  Tensor x = ctx.input(f32, {128, 128}, "x");
  Tensor y = sum(exp(x) * x);
  Graph g = Graph::forward(y);
  GraphAllocator galloc(host_buffer_type());
  MemoryPlan p = galloc.measure(g);
  EXPECT_EQ(galloc.buffer(), nullptr);
  EXPECT_FALSE(x.has_data());
  EXPECT_LE(p.lower_bound, p.buffer_size);
  EXPECT_LE(p.buffer_size, p.total_size);
  EXPECT_EQ(p.n_steps, g.nodes().size());
}

TEST(GraphAllocator, NodeListsSplitTensorsBetweenAllocators) {
  // Two allocators over one schedule: one places the leaves, the other the rest.
  Context ctx;
  Tensor x = ctx.input(f32, {8, 8}, "x"), w = ctx.param(f32, {8, 8}, "w");
  Tensor y = sum(relu(matmul(x, w)).T() * x);
  Graph g = Graph::forward(y);
  auto is_leaf = [](const TensorNode* t) { return t->op == Op::NONE; };
  GraphAllocator leaves(host_buffer_type()), rest(host_buffer_type());
  NodeList a(g), b(g);
  a.mine = is_leaf;
  b.mine = [&](const TensorNode* t) { return !is_leaf(t); };
  leaves.alloc(a);
  rest.alloc(b);
  EXPECT_EQ(x.node()->buffer, leaves.buffer());
  for (TensorNode* n : g.nodes())
    if (!n->is_view()) {
      EXPECT_EQ(n->buffer, rest.buffer());
    }
  EXPECT_EQ(rest.plan().n_tensors, g.nodes().size() - 1);  // all but the transpose view
}

TEST(GraphAllocator, AKeepPredicateHoldsATensorToTheEnd) {
  // E.g. a tensor a later split (on another backend) still reads.
  Context ctx;
  Tensor x = ctx.input(f32, {8, 8}, "x");
  Tensor a = scale(x, 2.0f);
  Tensor b = exp(a);
  Tensor c = matmul(b, b);
  Graph g = Graph::forward(c);
  GraphAllocator galloc(host_buffer_type());
  NodeList list(g);
  EXPECT_EQ(galloc.measure(list).lower_bound, 3 * 256u);  // x, b, c at the matmul
  list.keep = [&](const TensorNode* t) { return t == a.node(); };
  galloc.alloc(list);
  EXPECT_EQ(galloc.plan().lower_bound, 4 * 256u);  // a no longer dies at exp
  EXPECT_TRUE(disjoint(a, b) && disjoint(a, c));
}

TEST(GraphAllocator, AViewOfATensorOutsideTheListNeedsMemory) {
  Context ctx;
  Tensor x = ctx.input(f32, {4, 4}, "x");
  Tensor a = relu(x).set_name("a");
  Tensor v = a.T();
  std::vector<TensorNode*> nodes{v.node()};
  GraphAllocator galloc(host_buffer_type());
  try {
    galloc.alloc(NodeList(nodes));
    FAIL() << "expected kiln::Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("aliases tensor"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("'a'"), std::string::npos) << e.what();
  }
}

// Thousands of random graphs: no two tensors live at the same step overlap, with
// the default placement and with each strategy forced.
TEST(GraphAllocator, RandomGraphsNeverOverlap) {
  const Placement forced[] = {Placement::best_fit, Placement::by_size, Placement::by_end,
                              Placement::by_start};
  size_t inplace = 0, graphs = 0, at_bound = 0;
  for (uint64_t seed = 1; seed <= 3000; ++seed) {
    const bool backward = seed % 3 == 0;
    alloc_test::RandomGraph rg = alloc_test::make_random_graph(seed, backward);
    GraphAllocator galloc(host_buffer_type());
    galloc.alloc(rg.graph);
    const MemoryPlan p = galloc.plan();
    ASSERT_EQ(check_overlaps(rg.graph, *galloc.buffer()), "") << "seed " << seed << "\n"
                                                              << rg.graph.dump();
    ASSERT_LE(p.lower_bound, p.buffer_size) << "seed " << seed;
    ASSERT_LE(p.buffer_size, p.total_size) << "seed " << seed;
    ASSERT_LE(p.buffer_size, p.best_fit_size) << "seed " << seed;
    inplace += p.n_inplace;
    at_bound += p.buffer_size == p.lower_bound;
    ++graphs;
    // A fresh graph (data of the first one is set) under one forced strategy.
    alloc_test::RandomGraph again = alloc_test::make_random_graph(seed, backward);
    GraphAllocator one(host_buffer_type(), {.placement = forced[seed % 4]});
    one.alloc(again.graph);
    ASSERT_EQ(check_overlaps(again.graph, *one.buffer()), "")
        << "seed " << seed << " strategy " << one.plan().strategy;
    ASSERT_GE(one.plan().buffer_size, p.buffer_size) << "seed " << seed;
  }
  EXPECT_GT(inplace, graphs);           // the generator exercises in-place reuse a lot
  EXPECT_GT(at_bound, graphs * 3 / 4);  // and the planner mostly reaches the bound
}
