// Sizes cannot overflow: every tensor creation and view checks
// its element count and byte size against int64 and fails with a kiln::Error
// naming the op (and the tensor), instead of wrapping to a small buffer that the
// kernels then overrun.
#include <gtest/gtest.h>

#include <cstdint>

#include "common/error_check.h"
#include "kiln/ext/tensor_node.h"
#include "kiln/kiln.h"

namespace {

using kiln::f32;
using kiln::i32;
using kiln::Shape;
using kiln::Tensor;

constexpr int64_t k2p40 = int64_t(1) << 40;
constexpr int64_t k2p60 = int64_t(1) << 60;
constexpr int64_t k2p61 = int64_t(1) << 61;
constexpr int64_t k2p62 = int64_t(1) << 62;

TEST(SizeOverflow, ShapeNumelDoesNotWrap) {
  // 2^61 + 1 times 8 wraps to 8 in 64-bit arithmetic.
  EXPECT_KILN_ERROR((void)Shape({k2p61 + 1, 8}).numel(), "shape", "[2305843009213693953, 8]",
                    "overflow");
  EXPECT_KILN_ERROR((void)Shape({k2p40, k2p40}).numel(), "shape", "overflow");
  EXPECT_EQ(Shape({k2p40, 0, k2p40}).numel(), 0);  // a zero dim makes any shape empty
  EXPECT_EQ(Shape({k2p62, 1}).numel(), k2p62);
}

TEST(SizeOverflow, LeavesCheckElementCountAndBytes) {
  kiln::Context ctx;
  // The element count overflows (it used to wrap to 8).
  EXPECT_KILN_ERROR(ctx.input(f32, {k2p61 + 1, 8}, "x"), "input", "'x'",
                    "[2305843009213693953, 8]");
  EXPECT_KILN_ERROR(ctx.param(f32, {k2p40, k2p40}, "w"), "param", "'w'");
  EXPECT_KILN_ERROR(ctx.tensor(i32, {k2p40, k2p40, 2}, "t"), "tensor", "'t'");
  // The count fits, the bytes do not: 2^62 f32 elements are 2^64 bytes.
  EXPECT_KILN_ERROR(ctx.input(f32, {k2p62}, "big"), "input", "'big'", "bytes");
  EXPECT_KILN_ERROR(kiln::full(ctx, {k2p61, 2}, 1.0f), "full", "bytes");
  // Nothing half-made stays behind: the failed leaves added no node.
  EXPECT_EQ(ctx.size(), 0u);
  // The largest sizes that fit are fine (metadata only: nothing is allocated).
  Tensor ok = ctx.input(f32, {k2p60, 1});
  EXPECT_EQ(ok.numel(), k2p60);
}

TEST(SizeOverflow, ViewsAndOpsCheckTheirShapes) {
  kiln::Context ctx;
  Tensor x = ctx.input(f32, {1, 8}, "x");
  EXPECT_KILN_ERROR(x.expand({k2p61 + 1, 8}), "expand", "[2305843009213693953, 8]");
  EXPECT_KILN_ERROR(x.expand({k2p40, k2p40, 8}), "expand");
  Tensor y = ctx.input(f32, {k2p60, 1}, "y");
  // [2^60, 1] + [1, 8] broadcasts to 2^63 elements.
  EXPECT_KILN_ERROR(y + x, "add", "[1152921504606846976, 8]", "overflow");
  Tensor z = ctx.input(f32, {4, 2}, "z");
  // The known dims of a reshape with -1 overflow before the division.
  EXPECT_KILN_ERROR(z.reshape({k2p62, 4, -1}), "reshape");
  EXPECT_KILN_ERROR(z.view({k2p62, 8, -1}), "view");
}

TEST(SizeOverflow, AllocateTensorsTotalDoesNotWrap) {
  // Four tensors of 2^62 bytes sum to 2^64, which wrapped to a 0-byte buffer.
  kiln::Context ctx;
  for (int i = 0; i < 4; ++i) (void)ctx.tensor(f32, {k2p60}, "t" + std::to_string(i));
  kiln::CpuBackend cpu(1);
  EXPECT_KILN_ERROR((void)kiln::allocate_tensors(ctx, cpu), "allocate_tensors", "bytes");
  for (size_t i = 0; i < ctx.size(); ++i) EXPECT_EQ(ctx.node(i)->data, nullptr);
}

}  // namespace
