// Barrier placement of CpuBackend's node plans (backends/cpu/node_plan.h): the
// byte ranges of nodes and views, the hazards that need a barrier (read after
// write, write after read, write after write, through views and through
// buffers the memory planner reuses), and that independent nodes get none.
#include <gtest/gtest.h>

#include <cmath>
#include <deque>
#include <vector>

#include "backends/cpu/node_plan.h"
#include "kiln/cpu.h"
#include "kiln/ext/op_params.h"

namespace {

using kiln::DType;
using kiln::Op;
using kiln::Shape;
using kiln::TensorNode;
using kiln::cpu::byte_range;
using kiln::cpu::ByteRange;
using kiln::cpu::NodePlan;
using kiln::cpu::plan_nodes;

// Nodes over one shared arena, placed by hand (as a memory planner would:
// reusing bytes between tensors that are not alive at the same time).
class Arena {
 public:
  std::vector<float> mem = std::vector<float>(1 << 16);
  std::deque<TensorNode> nodes;

  // A dense f32 tensor at float offset `at`, made by op from srcs.
  TensorNode* at(int64_t at, const Shape& s, Op op = Op::NONE,
                 std::initializer_list<TensorNode*> srcs = {}) {
    TensorNode& n = nodes.emplace_back();
    n.shape = s;
    int64_t acc = 4;
    for (int d = s.ndim() - 1; d >= 0; --d) n.stride[d] = acc, acc *= s[d];
    n.data = mem.data() + at;
    n.op = op;
    for (TensorNode* x : srcs) n.src[n.n_src++] = x;
    return &n;
  }
  // A view of base: shape s, byte strides st, starting `offs` floats in.
  TensorNode* view(TensorNode* base, const Shape& s, std::array<int64_t, kiln::kMaxDims> st,
                   int64_t offs = 0) {
    TensorNode& n = nodes.emplace_back();
    n.shape = s;
    n.stride = st;
    n.op = Op::NARROW;
    n.view_src = base;
    n.view_offs = size_t(offs) * 4;
    n.data = static_cast<char*>(base->data) + n.view_offs;
    n.src[n.n_src++] = base;
    return &n;
  }
  uintptr_t addr(int64_t at) const { return reinterpret_cast<uintptr_t>(mem.data() + at); }
};

NodePlan plan(std::vector<TensorNode*> nodes, std::vector<bool> serial = {}) {
  if (serial.empty()) serial.assign(nodes.size(), false);
  return plan_nodes(nodes, serial, 2);
}

// "b" for a step with a barrier before it, "-" without; serial steps as "s<count>".
std::string shape_of(const NodePlan& p) {
  std::string out;
  for (const kiln::cpu::NodeStep& st : p.steps) {
    out += st.barrier_before ? "b" : "-";
    if (st.serial) out += "s" + std::to_string(st.count) + "@" + std::to_string(st.thread);
  }
  return out;
}

std::vector<uint32_t> order_of(const NodePlan& p) { return p.order; }

TEST(NodePlan, ByteRangeOfDenseTensorsAndViews) {
  Arena a;
  TensorNode* x = a.at(100, {4, 8});
  EXPECT_EQ(byte_range(x).lo, a.addr(100));
  EXPECT_EQ(byte_range(x).hi, a.addr(132));
  // Transposed: same bytes.
  TensorNode* xt = a.view(x, {8, 4}, {4, 32});
  EXPECT_EQ(byte_range(xt).lo, a.addr(100));
  EXPECT_EQ(byte_range(xt).hi, a.addr(132));
  // Columns 2..3 of every row: from row 0 col 2 to row 3 col 3.
  TensorNode* cols = a.view(x, {4, 2}, {32, 4}, 2);
  EXPECT_EQ(byte_range(cols).lo, a.addr(102));
  EXPECT_EQ(byte_range(cols).hi, a.addr(100 + 3 * 8 + 3 + 1));
  // Broadcast (stride 0): one row read 5 times.
  TensorNode* bc = a.view(x, {5, 8}, {0, 4}, 16);
  EXPECT_EQ(byte_range(bc).lo, a.addr(116));
  EXPECT_EQ(byte_range(bc).hi, a.addr(124));
  // Negative stride (rows in reverse), starting at the last row.
  TensorNode* rev = a.view(x, {4, 8}, {-32, 4}, 24);
  EXPECT_EQ(byte_range(rev).lo, a.addr(100));
  EXPECT_EQ(byte_range(rev).hi, a.addr(132));
  // No elements or no memory: touches nothing.
  EXPECT_EQ(byte_range(a.at(0, {0, 8})).hi, byte_range(a.at(0, {0, 8})).lo);
  TensorNode* nomem = a.at(0, {4});
  nomem->data = nullptr;
  EXPECT_FALSE(byte_range(nomem).overlaps(byte_range(x)));
}

TEST(NodePlan, RangeSetsMergeAndAnswerOverlaps) {
  kiln::cpu::RangeSet s;
  s.add({10, 20});
  s.add({30, 40});
  s.add({0, 0});  // empty: nothing
  EXPECT_EQ(s.intervals(), 2u);
  EXPECT_TRUE(s.overlaps({19, 21}));
  EXPECT_FALSE(s.overlaps({20, 30}));
  EXPECT_FALSE(s.overlaps({0, 10}));
  EXPECT_FALSE(s.overlaps({40, 50}));
  EXPECT_TRUE(s.overlaps({0, 100}));
  EXPECT_FALSE(s.overlaps({15, 15}));
  s.add({20, 30});  // touches both: one interval
  EXPECT_EQ(s.intervals(), 1u);
  EXPECT_TRUE(s.overlaps({25, 26}));
  s.add({5, 12});
  s.add({100, 110});
  s.add({50, 60});
  EXPECT_EQ(s.intervals(), 3u);
  EXPECT_TRUE(s.overlaps({4, 6}));
  EXPECT_FALSE(s.overlaps({60, 100}));
  EXPECT_TRUE(s.overlaps({109, 200}));
}

TEST(NodePlan, LongChainsAndWideListsPlanFast) {
  // 20000 small nodes in one chain, then 20000 independent ones: the chain
  // stays on one thread without barriers, the wide part fills levels of
  // kMaxLevelNodes; both plan in well under a second.
  Arena a;
  a.mem.assign(size_t(4 * 20000 + 64), 0.f);
  std::vector<TensorNode*> nodes;
  TensorNode* prev = a.at(0, {4});
  for (int i = 0; i < 20000; ++i)
    nodes.push_back(prev = a.at(4 * (i % 3 + 1), {4}, Op::NEG, {prev}));
  NodePlan pl = plan(nodes, std::vector<bool>(nodes.size(), true));
  EXPECT_EQ(pl.steps.size(), 1u);
  EXPECT_EQ(pl.barriers(), 0);
  nodes.clear();
  TensorNode* x = a.at(0, {4});
  for (int i = 0; i < 20000; ++i) nodes.push_back(a.at(4 * (i + 1), {4}, Op::NEG, {x}));
  pl = plan(nodes);
  EXPECT_EQ(pl.barriers(),
            int(20000 / kiln::cpu::kMaxLevelNodes) - 1 + (20000 % kiln::cpu::kMaxLevelNodes != 0));
}

TEST(NodePlan, QuantizedViewsTakeTheOwnersBytes) {
  Arena a;
  TensorNode* q = a.at(0, {4, 64});
  q->dtype = DType::q8_0;  // 2 blocks of 34 bytes per row
  q->stride = {2 * 34, 34};
  TensorNode* row = a.view(q, {1, 64}, {68, 34}, 0);
  row->dtype = DType::q8_0;
  row->data = static_cast<char*>(q->data) + 68;
  EXPECT_EQ(byte_range(row).lo, a.addr(0));
  EXPECT_EQ(byte_range(row).hi, a.addr(0) + 4 * 68);
}

TEST(NodePlan, IndependentNodesNeedNoBarrier) {
  Arena a;
  TensorNode* x = a.at(0, {64});
  TensorNode* y = a.at(64, {64});
  TensorNode* p = a.at(128, {64}, Op::NEG, {x});
  TensorNode* q = a.at(192, {64}, Op::ADD, {x, y});  // reads what p reads: fine
  TensorNode* r = a.at(256, {64}, Op::EXP, {y});
  EXPECT_EQ(shape_of(plan({p, q, r})), "---");
}

TEST(NodePlan, ReadAfterWrite) {
  Arena a;
  TensorNode* x = a.at(0, {64});
  TensorNode* p = a.at(64, {64}, Op::NEG, {x});
  TensorNode* q = a.at(128, {64}, Op::EXP, {p});
  EXPECT_EQ(shape_of(plan({p, q})), "-b");
  // Through a view: q reads the second half of p only.
  TensorNode* half = a.view(p, {32}, {4}, 32);
  TensorNode* q2 = a.at(128, {32}, Op::EXP, {half});
  EXPECT_EQ(shape_of(plan({p, q2})), "-b");
}

TEST(NodePlan, ReadOfDisjointPartOfABufferNeedsNoBarrier) {
  Arena a;
  TensorNode* x = a.at(0, {64});
  TensorNode* whole = a.at(64, {64});
  // p writes the first half of `whole`'s bytes, q reads its second half.
  TensorNode* p = a.at(64, {32}, Op::NEG, {x});
  TensorNode* q = a.at(200, {32}, Op::EXP, {a.view(whole, {32}, {4}, 32)});
  EXPECT_EQ(shape_of(plan({p, q})), "--");
  // One float of overlap is enough for a barrier.
  TensorNode* q2 = a.at(200, {32}, Op::EXP, {a.view(whole, {32}, {4}, 31)});
  EXPECT_EQ(shape_of(plan({p, q2})), "-b");
}

TEST(NodePlan, WriteAfterReadThroughAReusedBuffer) {
  Arena a;
  TensorNode* x = a.at(0, {64});
  TensorNode* p = a.at(64, {64}, Op::EXP, {x});  // reads x
  // The planner gave q the bytes of x (x is dead after p): q must wait for p.
  TensorNode* y = a.at(256, {64});
  TensorNode* q = a.at(16, {64}, Op::NEG, {y});
  EXPECT_EQ(shape_of(plan({p, q})), "-b");
  // A transposed read of x counts the same.
  TensorNode* xt = a.at(0, {8, 8});
  TensorNode* p2 = a.at(64, {8, 8}, Op::EXP, {a.view(xt, {8, 8}, {4, 32})});
  EXPECT_EQ(shape_of(plan({p2, q})), "-b");
}

TEST(NodePlan, WriteAfterWrite) {
  Arena a;
  TensorNode* x = a.at(0, {64});
  TensorNode* p = a.at(64, {64}, Op::NEG, {x});
  TensorNode* q = a.at(100, {8}, Op::EXP, {x});  // overwrites part of p's output
  EXPECT_EQ(shape_of(plan({p, q})), "-b");
}

TEST(NodePlan, InPlaceKernelsWriteTheirSources) {
  Arena a;
  TensorNode* acc = a.at(0, {64});
  TensorNode* g = a.at(64, {64});
  TensorNode* m = a.at(128, {64});
  TensorNode* v = a.at(192, {64});
  TensorNode* hp = a.at(256, {16});
  // ACCUMULATE: dst aliases src0, which it updates.
  TensorNode* upd = a.at(0, {64}, Op::ACCUMULATE, {acc, g});
  upd->view_src = acc;
  TensorNode* use = a.at(300, {64}, Op::EXP, {acc});
  EXPECT_EQ(shape_of(plan({upd, use})), "-b");
  // ADAMW_STEP also writes the moments m and v: a reader of m waits.
  TensorNode* step = a.at(0, {64}, Op::ADAMW_STEP, {acc, g, m, v, hp});
  step->view_src = acc;
  TensorNode* read_m = a.at(300, {64}, Op::EXP, {m});
  EXPECT_EQ(shape_of(plan({step, read_m})), "-b");
  // ... while a node touching none of its memory does not.
  TensorNode* other = a.at(300, {64}, Op::EXP, {a.at(400, {64})});
  EXPECT_EQ(shape_of(plan({step, other})), "--");
  // Two parameters' steps only read the shared hyperparameters: no barrier.
  TensorNode* p2 = a.at(500, {64});
  TensorNode* step2 =
      a.at(500, {64}, Op::ADAMW_STEP, {p2, a.at(600, {64}), a.at(700, {64}), a.at(800, {64}), hp});
  step2->view_src = p2;
  EXPECT_EQ(shape_of(plan({step, step2})), "--");
}

TEST(NodePlan, ABarrierStartsAFreshSet) {
  Arena a;
  TensorNode* x = a.at(0, {64});
  TensorNode* p = a.at(64, {64}, Op::NEG, {x});
  TensorNode* q = a.at(128, {64}, Op::EXP, {p});  // barrier (reads p)
  TensorNode* r = a.at(192, {64}, Op::EXP, {p});  // p was complete at that barrier
  TensorNode* s = a.at(256, {64}, Op::EXP, {q});  // q is not
  EXPECT_EQ(shape_of(plan({p, q, r, s})), "-b-b");
}

TEST(NodePlan, SerialRunsOnThreadZero) {
  Arena a;
  TensorNode* x = a.at(0, {64});
  TensorNode* s1 = a.at(64, {64}, Op::NEG, {x});
  TensorNode* s2 = a.at(128, {64}, Op::EXP, {s1});  // same thread, in order: no barrier
  TensorNode* p = a.at(192, {64}, Op::EXP, {x});    // independent of the run
  TensorNode* s3 = a.at(256, {64}, Op::EXP, {s2});  // after p, but only needs thread 0's work
  TensorNode* s4 = a.at(320, {64}, Op::EXP, {p});   // needs every thread's share of p
  TensorNode* p2 = a.at(384, {64}, Op::EXP, {s4});  // needs thread 0's serial work
  const NodePlan pl = plan({s1, s2, p, s3, s4, p2}, {true, true, false, true, true, false});
  // Level 0: p, then s1 s2 s3 in list order on thread 0; then s4; then p2.
  EXPECT_EQ(shape_of(pl), "--s3@0bs1@0b");
  EXPECT_EQ(order_of(pl), (std::vector<uint32_t>{2, 0, 1, 3, 4, 5}));
}

TEST(NodePlan, IndependentSerialChainsGoToDifferentThreads) {
  Arena a;
  TensorNode* x = a.at(0, {64});
  TensorNode* a1 = a.at(64, {64}, Op::NEG, {x});
  TensorNode* b1 = a.at(128, {64}, Op::EXP, {x});
  TensorNode* a2 = a.at(192, {64}, Op::EXP, {a1});  // a's chain
  TensorNode* b2 = a.at(256, {64}, Op::EXP, {b1});  // b's chain
  TensorNode* c = a.at(320, {8}, Op::NEG, {x});     // alone: to the less loaded thread
  const NodePlan pl = plan({a1, b1, a2, b2, c}, std::vector<bool>(5, true));
  EXPECT_EQ(shape_of(pl), "-s3@0-s2@1");
  EXPECT_EQ(order_of(pl), (std::vector<uint32_t>{0, 2, 4, 1, 3}));
  // A node that reads both chains' results joins them into one chain (so
  // they run on one thread, before it).
  TensorNode* j = a.at(400, {64}, Op::ADD, {a2, b2});
  const NodePlan joined = plan({a1, b1, a2, b2, c, j}, std::vector<bool>(6, true));
  EXPECT_EQ(shape_of(joined), "-s5@0-s1@1");
  EXPECT_EQ(order_of(joined), (std::vector<uint32_t>{0, 1, 2, 3, 5, 4}));
  // So does one that overwrites what both read.
  TensorNode* over_x = a.at(0, {64}, Op::NEG, {a.at(500, {64})});
  EXPECT_EQ(shape_of(plan({a1, b1, over_x}, std::vector<bool>(3, true))), "-s3@0");
}

TEST(NodePlan, IndependentNodesRunSideBySideOutOfListOrder) {
  // Sums of squares of two tensors, as a gradient norm computes them: both
  // squares, then both sums, with one barrier instead of three.
  Arena a;
  TensorNode* x = a.at(0, {64});
  TensorNode* y = a.at(64, {64});
  TensorNode* x2 = a.at(128, {64}, Op::SQR, {x});
  TensorNode* sx = a.at(192, {1}, Op::SUM, {x2});
  TensorNode* y2 = a.at(256, {64}, Op::SQR, {y});
  TensorNode* sy = a.at(320, {1}, Op::SUM, {y2});
  NodePlan pl = plan({x2, sx, y2, sy});
  EXPECT_EQ(shape_of(pl), "--b-");
  EXPECT_EQ(order_of(pl), (std::vector<uint32_t>{0, 2, 1, 3}));
  // If y2 takes x's bytes (x is dead after x2 as far as the list goes), it
  // must still wait for x2 to finish reading them.
  TensorNode* y2_over_x = a.at(0, {64}, Op::SQR, {y});
  TensorNode* sy2 = a.at(320, {1}, Op::SUM, {y2_over_x});
  pl = plan({x2, sx, y2_over_x, sy2});
  EXPECT_EQ(shape_of(pl), "-b-b");
  EXPECT_EQ(order_of(pl), (std::vector<uint32_t>{0, 1, 2, 3}));
  // Nor may a node move before one it overwrites the output of (WAW).
  TensorNode* y2_over_sx = a.at(192, {64}, Op::SQR, {y});
  pl = plan({x2, sx, y2_over_sx});
  EXPECT_EQ(shape_of(pl), "-bb");
}

// End to end: a 2-thread CpuBackend over nodes that share bytes as a memory
// planner would lay them out (inputs overwritten once read) computes what one
// thread does, run after run, with the barriers only where the plan says.
TEST(NodePlan, TwoThreadsMatchOneThroughReusedBuffers) {
  const int64_t n = 1 << 17;  // large enough to split over threads
  Arena a;
  const int64_t m = 1000, zs = 6 * n + 64;  // small nodes (one thread each) from zs on
  a.mem.assign(size_t(zs + 5 * m), 0.f);
  auto inputs = [&] {
    std::fill(a.mem.begin(), a.mem.end(), 0.f);
    for (int64_t i = 0; i < 2 * n; ++i) a.mem[size_t(i)] = float(i % 97) * 0.01f - 0.3f;
    for (int64_t i = zs; i < zs + m; ++i) a.mem[size_t(i)] = float(i % 89) * 0.01f - 0.2f;
  };
  TensorNode* x = a.at(0, {2, n / 2});
  TensorNode* y = a.at(n, {n});
  kiln::ScaleParams twice;
  twice.mul = 2.f;
  // p reads x transposed: each thread's rows touch both halves of x.
  TensorNode* p = a.at(2 * n, {n / 2, 2}, Op::SCALE, {a.view(x, {n / 2, 2}, {4, n / 2 * 4})});
  p->params = kiln::detail::pack_params(twice);
  TensorNode* q = a.at(3 * n, {n}, Op::NEG, {y});          // independent of p
  TensorNode* r = a.at(0, {n}, Op::EXP, {y});              // takes x's bytes: WAR on p
  TensorNode* pf = a.at(2 * n, {n});                       // p's bytes, flat
  TensorNode* s = a.at(4 * n, {n}, Op::ADD, {pf, q});      // p and q done at r's barrier
  TensorNode* t = a.at(5 * n + 64, {n}, Op::MUL, {r, s});  // RAW on r
  TensorNode* u = a.at(n + 5, {n}, Op::NEG, {s});          // over y and p: read before t
  // Two chains of small nodes, which the plan gives to different threads.
  TensorNode* z = a.at(zs, {m});
  TensorNode* z1 = a.at(zs + m, {m}, Op::EXP, {z});
  TensorNode* w1 = a.at(zs + 2 * m, {m}, Op::NEG, {z});
  TensorNode* z2 = a.at(zs + 3 * m, {m}, Op::MUL, {z1, z});
  TensorNode* w2 = a.at(zs + 4 * m, {m}, Op::EXP, {w1});
  TensorNode* z3 = a.at(zs + m, {m}, Op::NEG, {z2});  // over z1, which z2 has read
  std::vector<TensorNode*> nodes = {p, z1, q, w1, r, z2, s, w2, t, u, z3};
  ASSERT_EQ(shape_of(plan(
                nodes, {false, true, false, true, false, true, false, true, false, false, true})),
            "---s3@0-s2@1b-b-");

  inputs();
  kiln::CpuBackend cpu1(1);
  cpu1.compute(nodes);
  const std::vector<float> want = a.mem;
  kiln::CpuBackend cpu2(2);
  for (int rep = 0; rep < 50; ++rep) {
    inputs();
    cpu2.compute(nodes);
    size_t bad = 0;
    while (bad < want.size() && a.mem[bad] == want[bad]) ++bad;
    ASSERT_EQ(bad, want.size()) << "run " << rep << ": element " << bad << " is " << a.mem[bad]
                                << ", want " << want[bad];
  }
}

}  // namespace

namespace {

// compute() keeps a plan per node list; a list whose storage is reused for
// other nodes (or whose nodes got other memory) gets a new plan.
TEST(NodePlan, PlansFollowTheListsContents) {
  Arena a;
  TensorNode* x = a.at(0, {64});
  a.mem[0] = 1.f;
  TensorNode* p = a.at(64, {64}, Op::NEG, {x});
  TensorNode* q = a.at(128, {64}, Op::EXP, {x});
  kiln::CpuBackend cpu(2);
  std::vector<TensorNode*> nodes = {p};
  cpu.compute(nodes);
  EXPECT_EQ(a.mem[64], -1.f);
  nodes[0] = q;  // same storage, another node
  cpu.compute(nodes);
  EXPECT_FLOAT_EQ(a.mem[128], std::exp(1.f));
  q->data = a.mem.data() + 192;  // same node, moved
  cpu.compute(nodes);
  EXPECT_FLOAT_EQ(a.mem[192], std::exp(1.f));
  nodes.push_back(p);  // a longer list
  a.mem[64] = 0.f;
  cpu.compute(nodes);
  EXPECT_EQ(a.mem[64], -1.f);
}

}  // namespace
