// Zero-element tensors save to and load from GGUF like any
// other: a [0, 3] tensor next to ordinary ones round-trips with its shape.
#include <gtest/gtest.h>

#include "gguf_test_util.h"
#include "kiln/io.h"
#include "kiln/kiln.h"

using namespace kiln;
using kiln_test::TempDir;

namespace {

TEST(GgufEmpty, ZeroElementTensorRoundTrips) {
  TempDir dir;
  const std::string path = dir.file("empty.gguf");
  CpuBackend cpu(1);
  {
    Context ctx;
    Tensor e = ctx.param(f32, {0, 3}, "e");
    Tensor w = ctx.param(f32, {2}, "w");
    auto buf = allocate_tensors(ctx, cpu);
    w.set({1.5f, -2.0f});
    GgufWriter wr;
    wr.add_tensor(e);
    wr.add_tensor(w);
    wr.save(path);
  }
  Context ctx;
  Tensor e = ctx.param(f32, {0, 3}, "e");
  Tensor w = ctx.param(f32, {2}, "w");
  auto buf = allocate_tensors(ctx, cpu);
  GgufFile f(path);
  f.load(e);
  f.load(w);
  EXPECT_TRUE(e.get<float>().empty());
  EXPECT_EQ(w.get<float>(), (std::vector<float>{1.5f, -2.0f}));
}

}  // namespace
