// TensorAllocator: alignment, best fit, merging, high-water mark, errors, measure mode.
#include <gtest/gtest.h>

#include "kiln/ext/alloc.h"
#include "kiln/kiln.h"

using namespace kiln;

namespace {

// A buffer type with a large alignment and padded tensors, to see both respected.
class PaddedType final : public BufferType {
 public:
  const char* name() const override { return "padded"; }
  size_t alignment() const override { return 256; }
  size_t alloc_size(const TensorNode* t) const override { return t->nbytes() + 100; }
  bool is_host() const override { return true; }
  std::unique_ptr<Buffer> alloc(size_t size) override { return host_buffer_type().alloc(size); }
};

}  // namespace

TEST(TensorAllocator, RoundsToTheAlignmentAndAllocSize) {
  Context ctx;
  Tensor a = ctx.tensor(f32, {3});  // 12 bytes
  Tensor b = ctx.tensor(f32, {100});
  TensorAllocator host(host_buffer_type());
  EXPECT_EQ(host.block_size(a.node()), 64u);
  EXPECT_EQ(host.block_size(b.node()), 448u);
  PaddedType padded;
  TensorAllocator ta(padded);
  EXPECT_EQ(ta.block_size(a.node()), 256u);  // 12 + 100 -> 256
  EXPECT_EQ(ta.block_size(b.node()), 512u);  // 400 + 100 -> 512
  EXPECT_EQ(ta.alloc(a.node()), 0u);
  EXPECT_EQ(ta.alloc(b.node()), 256u);
  EXPECT_EQ(ta.alloc(a.node()), 768u);
  EXPECT_EQ(ta.high_water(), 1024u);
  // A zero-element tensor still gets its own address.
  Tensor z = ctx.tensor(f32, {0});
  EXPECT_EQ(host.block_size(z.node()), 64u);
}

TEST(TensorAllocator, BestFitPicksTheSmallestBlockThatFits) {
  TensorAllocator ta(16, 1024);
  const size_t a = ta.alloc(160), b = ta.alloc(16), c = ta.alloc(64), d = ta.alloc(16);
  const size_t e = ta.alloc(32), f = ta.alloc(16);
  (void)b, (void)d, (void)f;
  ta.free(a, 160);  // holes: 160 at 0, 64 at c, 32 at e, then the tail
  ta.free(c, 64);
  ta.free(e, 32);
  EXPECT_EQ(ta.alloc(32), e);         // exact fit
  EXPECT_EQ(ta.alloc(48), c);         // 64 is the smallest that holds 48
  EXPECT_EQ(ta.alloc(100), a);        // only the 160 block (not the tail) is left that fits
  EXPECT_EQ(ta.n_free_blocks(), 3u);  // 48 after a, 16 after c, the tail
}

TEST(TensorAllocator, TiesGoToTheLowestOffset) {
  TensorAllocator ta(8, SIZE_MAX);
  size_t off[6];
  for (size_t& o : off) o = ta.alloc(32);
  ta.free(off[3], 32);
  ta.free(off[1], 32);
  EXPECT_EQ(ta.alloc(32), off[1]);
  EXPECT_EQ(ta.alloc(32), off[3]);
}

TEST(TensorAllocator, FreeMergesNeighbours) {
  TensorAllocator ta(8, 800);
  size_t off[10];
  for (size_t& o : off) o = ta.alloc(80);
  EXPECT_EQ(ta.n_free_blocks(), 0u);
  EXPECT_EQ(ta.largest_free(), 0u);
  ta.free(off[1], 80);
  ta.free(off[3], 80);
  EXPECT_EQ(ta.n_free_blocks(), 2u);
  ta.free(off[2], 80);  // merges with both sides
  EXPECT_EQ(ta.n_free_blocks(), 1u);
  EXPECT_EQ(ta.largest_free(), 240u);
  ta.free(off[4], 80);  // merges with the previous block
  ta.free(off[0], 80);  // merges with the next block
  EXPECT_EQ(ta.n_free_blocks(), 1u);
  EXPECT_EQ(ta.largest_free(), 400u);
  for (int i = 5; i < 10; ++i) ta.free(off[i], 80);
  EXPECT_EQ(ta.n_free_blocks(), 1u);
  EXPECT_EQ(ta.largest_free(), 800u);
  EXPECT_EQ(ta.in_use(), 0u);
  EXPECT_EQ(ta.alloc(800), 0u);
}

TEST(TensorAllocator, HighWaterMarkIsThePeakEnd) {
  TensorAllocator ta(64, SIZE_MAX);
  const size_t a = ta.alloc(100);  // 128
  const size_t b = ta.alloc(64);
  EXPECT_EQ(ta.high_water(), 192u);
  ta.free(a, 100);
  ta.free(b, 64);
  EXPECT_EQ(ta.high_water(), 192u);  // a mark, not the current use
  EXPECT_EQ(ta.alloc(192), 0u);
  EXPECT_EQ(ta.high_water(), 192u);
  ta.reset();
  EXPECT_EQ(ta.high_water(), 0u);
  EXPECT_EQ(ta.in_use(), 0u);
}

TEST(TensorAllocator, ATensorThatDoesNotFitNamesSizes) {
  auto buf = host_buffer_type().alloc(1024);
  TensorAllocator ta(*buf);
  Context ctx;
  Tensor a = ctx.tensor(f32, {128}, "a");         // 512 bytes
  Tensor big = ctx.tensor(f32, {20, 10}, "big");  // 800 bytes
  ta.place(a.node());
  try {
    ta.place(big.node());
    FAIL() << "expected kiln::Error";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()),
              "[alloc] tensor " + big.label() +
                  " [20, 10] needs 832 bytes but the largest free block is 512 bytes");
  }
  EXPECT_FALSE(big.has_data());
}

TEST(TensorAllocator, PlaceSetsDataAndReleaseFrees) {
  auto buf = host_buffer_type().alloc(4096);
  TensorAllocator ta(*buf);
  Context ctx;
  Tensor a = ctx.tensor(f32, {4}), b = ctx.tensor(f32, {4});
  EXPECT_EQ(ta.place(a.node()), 0u);
  EXPECT_EQ(ta.place(b.node()), 64u);
  EXPECT_EQ(a.node()->data, buf->base());
  EXPECT_EQ(b.node()->buffer, buf.get());
  b.set<float>({1, 2, 3, 4});
  EXPECT_EQ(b.get<float>(), (std::vector<float>{1, 2, 3, 4}));
  ta.release(a.node());
  EXPECT_FALSE(a.has_data());
  EXPECT_EQ(ta.in_use(), 64u);
  Tensor c = ctx.tensor(f32, {16});
  EXPECT_EQ(ta.place(c.node()), 0u);  // the freed block is reused
}

TEST(TensorAllocator, MeasureModeNeedsNoMemory) {
  TensorAllocator ta(host_buffer_type());
  EXPECT_TRUE(ta.measuring());
  Context ctx;
  Tensor huge = ctx.tensor(f32, {1 << 20, 1 << 10});  // 4 GiB: only measured
  const size_t off = ta.alloc(huge.node());
  EXPECT_EQ(off, 0u);
  EXPECT_EQ(ta.high_water(), size_t(4) << 30);
  EXPECT_THROW(ta.place(huge.node()), Error);
  ta.free(huge.node(), off);
  EXPECT_EQ(ta.in_use(), 0u);
}
