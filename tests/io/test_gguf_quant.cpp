// Block-quantized GGUF tensors (ggml's Q8_0 and Q4_0): written, read, and
// dequantized to the values ggml's layout defines; refused where kiln cannot
// hold them (loading into a tensor, an innermost dim that is not whole blocks).
#include <gtest/gtest.h>

#include <cstring>
#include <fstream>
#include <iterator>

#include "common/error_check.h"
#include "common/temp_dir.h"
#include "kiln/io.h"
#include "kiln/kiln.h"

using namespace kiln;

namespace {

// One block: f16 scale d, then the payload.
std::vector<uint8_t> block(float d, const std::vector<uint8_t>& payload) {
  std::vector<uint8_t> b(2);
  const uint16_t h = f32_to_f16(d);
  std::memcpy(b.data(), &h, 2);
  b.insert(b.end(), payload.begin(), payload.end());
  return b;
}

TEST(GgufQuant, Q8_0ValuesAreScaleTimesInt8) {
  kiln_test::TempDir tmp;
  std::vector<uint8_t> data;
  std::vector<float> want;
  for (int b = 0; b < 4; ++b) {  // [2, 64]: two blocks per row
    const float d = 0.25f * float(b + 1);
    std::vector<uint8_t> q(32);
    for (int i = 0; i < 32; ++i) {
      const int8_t v = int8_t(i * 7 - 100 + b);
      q[size_t(i)] = uint8_t(v);
      want.push_back(float(v) * d);
    }
    const std::vector<uint8_t> blk = block(d, q);
    data.insert(data.end(), blk.begin(), blk.end());
  }
  GgufWriter w;
  w.add_tensor_quantized("w", 8, {2, 64}, data);
  w.save(tmp.file("q.gguf"));
  GgufFile f(tmp.file("q.gguf"));
  const GgufTensorInfo& t = f.tensor_info("w");
  EXPECT_TRUE(t.quantized());
  EXPECT_EQ(t.quant, "Q8_0");
  EXPECT_EQ(t.shape, Shape({2, 64}));
  EXPECT_EQ(t.nbytes, 4u * 34u);
  EXPECT_EQ(f.read_bytes("w"), data);
  EXPECT_EQ(gguf_dequantize(t, f.read_bytes("w")), want);
}

TEST(GgufQuant, Q4_0LowNibblesFirstHalfHighNibblesSecond) {
  kiln_test::TempDir tmp;
  std::vector<uint8_t> q(16);
  std::vector<float> want(32);
  const float d = 1.5f;
  for (int i = 0; i < 16; ++i) {
    const int lo = i, hi = 15 - i;
    q[size_t(i)] = uint8_t(lo | (hi << 4));
    want[size_t(i)] = float(lo - 8) * d;
    want[size_t(i + 16)] = float(hi - 8) * d;
  }
  GgufWriter w;
  w.add_tensor_quantized("w", 2, {32}, block(d, q));
  w.save(tmp.file("q.gguf"));
  GgufFile f(tmp.file("q.gguf"));
  EXPECT_EQ(f.tensor_info("w").quant, "Q4_0");
  EXPECT_EQ(gguf_dequantize(f.tensor_info("w"), f.read_bytes("w")), want);
}

TEST(GgufQuant, PlainTypesDequantizeToTheirValues) {
  kiln_test::TempDir tmp;
  Context ctx;
  Tensor a = ctx.tensor(f16, {3}, "a");
  CpuBackend cpu(1);
  auto buf = allocate_tensors(ctx, cpu);
  a.set(std::vector<uint16_t>{f32_to_f16(1.0f), f32_to_f16(-2.5f), f32_to_f16(0.125f)});
  GgufWriter w;
  w.add_tensor(a);
  w.save(tmp.file("a.gguf"));
  GgufFile f(tmp.file("a.gguf"));
  EXPECT_EQ(gguf_dequantize(f.tensor_info("a"), f.read_bytes("a")),
            (std::vector<float>{1.0f, -2.5f, 0.125f}));
}

// Quantized data loads as it is into a tensor of its dtype (q8_0 / q4_0) and
// is refused by any other; a kiln q8_0 tensor saves back to the same bytes.
TEST(GgufQuant, LoadsIntoQuantizedTensorsOnly) {
  kiln_test::TempDir tmp;
  std::vector<uint8_t> data(68);
  for (size_t i = 0; i < data.size(); ++i) data[i] = uint8_t(i * 7 + 1);
  data[1] = data[35] = 0x3c;  // f16 scales near 1, not NaN
  GgufWriter w;
  w.add_tensor_quantized("w", 8, {2, 32}, data);
  w.save(tmp.file("q.gguf"));
  GgufFile f(tmp.file("q.gguf"));
  EXPECT_EQ(f.tensor_info("w").dtype, kiln::q8_0);
  Context ctx;
  Tensor t = ctx.tensor(f32, {2, 32}, "t");
  Tensor q = ctx.tensor(kiln::q8_0, {2, 32}, "w");
  CpuBackend cpu(1);
  auto buf = allocate_tensors(ctx, cpu);
  EXPECT_KILN_ERROR(f.load(t, "w"), "gguf", "q.gguf", "'w'", "Q8_0", "f32", "gguf_dequantize");
  f.load(q, "w");
  EXPECT_EQ(q.get<uint8_t>(), data);
  EXPECT_EQ(q.get<float>(), gguf_dequantize(f.tensor_info("w"), data));
  GgufWriter again;
  again.add_tensor(q);
  again.save(tmp.file("again.gguf"));
  GgufFile g(tmp.file("again.gguf"));
  EXPECT_EQ(g.tensor_info("w").quant, "Q8_0");
  EXPECT_EQ(g.read_bytes("w"), data);
  auto sd = open_state_dict(tmp.file("q.gguf"));
  EXPECT_TRUE(sd->find("w")->loadable());
  EXPECT_EQ(sd->find("w")->file_dtype, "Q8_0");
  EXPECT_KILN_ERROR(gguf_dequantize(f.tensor_info("w"), std::vector<uint8_t>(33)), "gguf", "'w'",
                    "33 bytes");

  GgufWriter bad;
  EXPECT_KILN_ERROR(bad.add_tensor_quantized("x", 8, {48}, std::vector<uint8_t>(51)), "gguf", "'x'",
                    "multiple of the block size 32");
  EXPECT_KILN_ERROR(bad.add_tensor_quantized("x", 8, {32}, std::vector<uint8_t>(33)), "gguf",
                    "34 bytes");
  // 15 is ggml's Q8_K (dot-product scratch, not a storage type): not in kiln's table.
  EXPECT_KILN_ERROR(bad.add_tensor_quantized("x", 15, {256}, std::vector<uint8_t>(292)), "gguf",
                    "ggml type 15");
}

// A file whose Q8_0 tensor has an innermost dim of 48 (a block and a half).
TEST(GgufQuant, PartialBlocksAreCorrupt) {
  kiln_test::TempDir tmp;
  GgufWriter w;
  w.add_tensor_quantized("w", 8, {64}, std::vector<uint8_t>(68, 0));
  w.save(tmp.file("q.gguf"));
  std::ifstream in(tmp.file("q.gguf"), std::ios::binary);
  std::vector<char> b((std::istreambuf_iterator<char>(in)), {});
  in.close();
  // name "w" (u64 length 1, 'w'), u32 n_dims 1, u64 dims[0] = 64 -> 48.
  const std::string key = std::string("\x01\0\0\0\0\0\0\0w\x01\0\0\0", 13);
  auto at = std::search(b.begin(), b.end(), key.begin(), key.end());
  ASSERT_NE(at, b.end());
  const uint64_t dim = 48;
  std::memcpy(&*(at + 13), &dim, 8);
  std::ofstream(tmp.file("bad.gguf"), std::ios::binary).write(b.data(), std::streamsize(b.size()));
  EXPECT_KILN_ERROR(GgufFile(tmp.file("bad.gguf")), "gguf", "bad.gguf", "'w'", "Q8_0",
                    "multiple of the block size 32");
}

}  // namespace
