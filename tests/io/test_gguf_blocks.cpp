// GGUF tensors of every block-quantized type of kiln/quant_types.def (Q4_1,
// Q5_0, Q5_1, Q2_K .. Q6_K besides Q8_0 / Q4_0): written, read back as they
// are, loaded into tensors of their dtype and dequantized as ggml does; and the
// errors of bad files and bad data, each naming the file, the tensor and why.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <fstream>
#include <iterator>
#include <random>

#include "common/error_check.h"
#include "common/temp_dir.h"
#include "kiln/io.h"
#include "kiln/kiln.h"

using namespace kiln;

namespace {

std::vector<float> random_values(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> v(n);
  for (float& x : v) x = nd(rng);
  return v;
}

std::vector<char> file_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), {}};
}

void write_bytes(const std::string& path, const std::vector<char>& b) {
  std::ofstream(path, std::ios::binary).write(b.data(), std::streamsize(b.size()));
}

class GgufBlocks : public ::testing::TestWithParam<const QuantType*> {};

TEST_P(GgufBlocks, WrittenReadLoadedAndDequantized) {
  const QuantType& qt = *GetParam();
  kiln_test::TempDir tmp;
  const int64_t rows = 3, cols = 2 * 256;
  const std::vector<float> x = random_values(size_t(rows * cols), qt.gguf_id);
  std::vector<uint8_t> data(dtype_row_bytes(qt.dtype, rows * cols));
  quantize_row(qt.dtype, x.data(), data.data(), rows * cols);
  std::vector<float> want(x.size());
  dequantize_row(qt.dtype, data.data(), want.data(), rows * cols);

  GgufWriter w;
  w.add_tensor_quantized("w", qt.gguf_id, {rows, cols}, data);
  w.save(tmp.file("q.gguf"));
  GgufFile f(tmp.file("q.gguf"));
  const GgufTensorInfo& t = f.tensor_info("w");
  EXPECT_EQ(t.dtype, qt.dtype);
  EXPECT_EQ(t.ggml_type, qt.gguf_id);
  EXPECT_EQ(t.quant, qt.gguf_name);
  EXPECT_EQ(t.shape, Shape({rows, cols}));
  EXPECT_EQ(t.nbytes, data.size());
  EXPECT_EQ(f.read_bytes("w"), data);
  EXPECT_EQ(gguf_dequantize(t, f.read_bytes("w")), want);
  // Loaded as stored into a tensor of its dtype; saved back to the same bytes.
  Context ctx;
  Tensor q = ctx.tensor(qt.dtype, {rows, cols}, "w");
  CpuBackend cpu(1);
  auto buf = allocate_tensors(ctx, cpu);
  f.load(q, "w");
  EXPECT_EQ(q.get<uint8_t>(), data);
  EXPECT_EQ(q.get<float>(), want);
  GgufWriter again;
  again.add_tensor(q);
  again.save(tmp.file("again.gguf"));
  GgufFile g(tmp.file("again.gguf"));
  EXPECT_EQ(g.tensor_info("w").ggml_type, qt.gguf_id);
  EXPECT_EQ(g.read_bytes("w"), data);
}

// The errors: data whose size disagrees with the type and shape, a row that is
// not whole blocks (in the writer and in a file), a truncated file.
TEST_P(GgufBlocks, BadSizesNameTheTensorAndTheReason) {
  const QuantType& qt = *GetParam();
  kiln_test::TempDir tmp;
  const int64_t block = qt.block_elems;
  const char* name = qt.gguf_name;
  const std::string whole = "multiple of the block size " + std::to_string(block);
  const std::string two_blocks = std::to_string(2 * qt.block_bytes) + " bytes";
  const std::string one_block = std::to_string(qt.block_bytes) + " bytes";
  GgufWriter bad;
  EXPECT_KILN_ERROR(bad.add_tensor_quantized("x", qt.gguf_id, {block + block / 2},
                                             std::vector<uint8_t>(2 * qt.block_bytes)),
                    "gguf", "'x'", qt.name, whole.c_str());
  EXPECT_KILN_ERROR(bad.add_tensor_quantized("x", qt.gguf_id, {2 * block},
                                             std::vector<uint8_t>(2 * qt.block_bytes - 1)),
                    "gguf", "'x'", qt.name, two_blocks.c_str());

  GgufWriter w;
  w.add_tensor_quantized("w", qt.gguf_id, {2 * block}, std::vector<uint8_t>(2 * qt.block_bytes));
  w.save(tmp.file("q.gguf"));
  GgufFile ok(tmp.file("q.gguf"));
  EXPECT_KILN_ERROR(gguf_dequantize(ok.tensor_info("w"), std::vector<uint8_t>(qt.block_bytes)),
                    "gguf", "'w'", name, one_block.c_str());
  std::vector<char> b = file_bytes(tmp.file("q.gguf"));
  // The last block cut short (the file ends a byte before the tensor's end,
  // padding after it gone too).
  const GgufTensorInfo& info = ok.tensor_info("w");
  write_bytes(tmp.file("short.gguf"),
              std::vector<char>(b.begin(), b.begin() + long(info.offset + info.nbytes - 1)));
  EXPECT_KILN_ERROR(GgufFile(tmp.file("short.gguf")), "gguf", "short.gguf", "truncated",
                    "tensor 'w'");
  // The innermost dim (u64 after name "w" and n_dims 1) one and a half blocks.
  const std::string key = std::string("\x01\0\0\0\0\0\0\0w\x01\0\0\0", 13);
  auto at = std::search(b.begin(), b.end(), key.begin(), key.end());
  ASSERT_NE(at, b.end());
  const uint64_t dim = uint64_t(block + block / 2);
  std::memcpy(&*(at + 13), &dim, 8);
  write_bytes(tmp.file("partial.gguf"), b);
  EXPECT_KILN_ERROR(GgufFile(tmp.file("partial.gguf")), "gguf", "partial.gguf", "'w'", name,
                    whole.c_str());
}

std::vector<const QuantType*> all_types() {
  std::vector<const QuantType*> v;
  for (const QuantType& q : kQuantTypes) v.push_back(&q);
  return v;
}

INSTANTIATE_TEST_SUITE_P(Types, GgufBlocks, ::testing::ValuesIn(all_types()),
                         [](const auto& info) { return std::string(info.param->name); });

// A type number that is not in the table: the file, the tensor and the number.
TEST(GgufBlocks, UnknownTypeIdNamesTheTensorAndTheId) {
  kiln_test::TempDir tmp;
  GgufWriter w;
  w.add_tensor_quantized("w", 12, {256}, std::vector<uint8_t>(144));
  w.save(tmp.file("q.gguf"));
  std::vector<char> b = file_bytes(tmp.file("q.gguf"));
  // After name "w", n_dims 1 and dims[0] = 256 comes the u32 type: 12 -> 23 (IQ4_XS).
  const std::string key = std::string("\x01\0\0\0\0\0\0\0w\x01\0\0\0\0\x01\0\0\0\0\0\0", 21);
  auto at = std::search(b.begin(), b.end(), key.begin(), key.end());
  ASSERT_NE(at, b.end());
  const uint32_t id = 23;
  std::memcpy(&*(at + 21), &id, 4);
  write_bytes(tmp.file("unknown.gguf"), b);
  EXPECT_KILN_ERROR(GgufFile(tmp.file("unknown.gguf")), "gguf", "unknown.gguf", "'w'",
                    "ggml type 23", "Q4_K=12");
}

}  // namespace
