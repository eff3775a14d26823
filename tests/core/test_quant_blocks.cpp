// The quantized-type table (kiln/quant_types.def) and the block formats added
// through it (Q4_1, Q5_0, Q5_1, Q2_K .. Q6_K): quantize_row byte for byte and
// dequantize_row bit for bit against fixtures of ggml's reference formulas
// (quant/make_block_fixtures.py, which quant/check_block_fixtures_with_ggml.py
// checked against ggml itself), also through Tensor::set/get and the COPY op,
// whatever the number of rows per call; and the errors of what does not read
// these types yet.
#include <gtest/gtest.h>

#include <cstring>
#include <fstream>
#include <iterator>
#include <set>
#include <string>
#include <vector>

#include "common/error_check.h"
#include "kiln/ext/alloc.h"
#include "kiln/kiln.h"

namespace {

using kiln::DType;
using kiln::f32;
using kiln::Tensor;

std::vector<uint8_t> read_file(const std::string& name) {
  const std::string path = std::string(KILN_SOURCE_DIR) + "/tests/core/quant/blocks/" + name;
  std::ifstream in(path, std::ios::binary);
  EXPECT_TRUE(in.good()) << "cannot open " << path;
  return {std::istreambuf_iterator<char>(in), {}};
}

std::vector<float> floats(const std::vector<uint8_t>& b) {
  std::vector<float> v(b.size() / 4);
  std::memcpy(v.data(), b.data(), v.size() * 4);
  return v;
}

std::vector<uint32_t> bits(const std::vector<float>& v) {
  std::vector<uint32_t> b(v.size());
  std::memcpy(b.data(), v.data(), v.size() * 4);
  return b;
}

constexpr int64_t kRowLen = 256;  // the fixture's rows: one k-quant block, eight 32-value ones

class BlockFormat : public ::testing::TestWithParam<DType> {
 protected:
  void SetUp() override {
    input = floats(read_file("input.f32"));
    blocks = read_file(std::string(kiln::dtype_name(GetParam())) + ".blocks");
    value_bits = bits(floats(read_file(std::string(kiln::dtype_name(GetParam())) + ".f32")));
    ASSERT_EQ(input.size() % kRowLen, 0u);
    ASSERT_GT(input.size(), 0u);
  }
  std::vector<float> input;
  std::vector<uint8_t> blocks;
  std::vector<uint32_t> value_bits;
};

TEST_P(BlockFormat, RowsMatchGgmlReferenceBytesAndValues) {
  const DType t = GetParam();
  const int64_t n = int64_t(input.size());
  ASSERT_EQ(blocks.size(), kiln::dtype_row_bytes(t, n));
  ASSERT_EQ(value_bits.size(), input.size());
  std::vector<uint8_t> q(blocks.size());
  kiln::quantize_row(t, input.data(), q.data(), n);
  // Per row, so a mismatch names the fixture row (make_block_fixtures.py's rows()).
  const size_t row_bytes = kiln::dtype_row_bytes(t, kRowLen);
  for (size_t r = 0; r < input.size() / kRowLen; ++r)
    EXPECT_TRUE(std::equal(q.begin() + long(r * row_bytes), q.begin() + long((r + 1) * row_bytes),
                           blocks.begin() + long(r * row_bytes)))
        << kiln::dtype_name(t) << " row " << r;
  std::vector<float> y(input.size());
  kiln::dequantize_row(t, blocks.data(), y.data(), n);
  EXPECT_EQ(bits(y), value_bits);
}

TEST_P(BlockFormat, TensorSetGetAndCopyOpMatchTheReference) {
  const DType t = GetParam();
  const int64_t rows = int64_t(input.size()) / kRowLen;
  kiln::Context ctx;
  Tensor w = ctx.param(t, {rows, kRowLen}, "w");
  Tensor x = ctx.input(f32, {rows, kRowLen}, "x");
  Tensor q = x.to(t);       // COPY quantizes
  Tensor back = w.to(f32);  // COPY dequantizes
  kiln::Graph g = kiln::Graph::forward({q, back});
  kiln::CpuBackend cpu(2);
  auto buf = kiln::allocate_tensors(ctx, cpu);
  w.set(input);
  EXPECT_EQ(w.get<uint8_t>(), blocks);
  EXPECT_EQ(bits(w.get<float>()), value_bits);
  x.set(input);
  cpu.compute(g);
  EXPECT_EQ(q.get<uint8_t>(), blocks);
  EXPECT_EQ(bits(back.get<float>()), value_bits);
}

INSTANTIATE_TEST_SUITE_P(Types, BlockFormat,
                         ::testing::Values(kiln::q4_1, kiln::q5_0, kiln::q5_1, kiln::q2_k,
                                           kiln::q3_k, kiln::q4_k, kiln::q5_k, kiln::q6_k),
                         [](const auto& info) {
                           return std::string(kiln::dtype_name(info.param));
                         });

TEST(QuantTable, RowsAreConsistent) {
  std::set<uint32_t> ids;
  std::set<std::string> names;
  for (const kiln::QuantType& q : kiln::kQuantTypes) {
    EXPECT_TRUE(kiln::is_quantized(q.dtype)) << q.name;
    EXPECT_EQ(&kiln::quant_type(q.dtype), &q) << q.name;
    EXPECT_EQ(kiln::quant_type_of_gguf(q.gguf_id), &q) << q.name;
    EXPECT_STREQ(kiln::dtype_name(q.dtype), q.name);
    EXPECT_EQ(kiln::dtype_size(q.dtype), q.block_bytes) << q.name;
    EXPECT_EQ(kiln::dtype_block_elems(q.dtype), q.block_elems) << q.name;
    EXPECT_TRUE(ids.insert(q.gguf_id).second) << q.name << ": GGUF id " << q.gguf_id << " twice";
    EXPECT_TRUE(names.insert(q.name).second) << q.name << " twice";
  }
  for (DType t : {kiln::f32, kiln::f16, kiln::bf16, kiln::i32})
    EXPECT_FALSE(kiln::is_quantized(t)) << kiln::dtype_name(t);
  // ggml's numbers and sizes for a few of them (ggml-common.h, ggml.h).
  EXPECT_EQ(kiln::quant_type(kiln::q4_k).gguf_id, 12u);
  EXPECT_EQ(kiln::quant_type(kiln::q6_k).block_bytes, 210u);
  EXPECT_EQ(kiln::quant_type(kiln::q5_1).block_bytes, 24u);
  EXPECT_EQ(kiln::quant_type_of_gguf(15), nullptr);  // Q8_K: ggml's, not a storage type here
  EXPECT_TRUE(kiln::quant_type(kiln::q8_0).matmul_reads);
  EXPECT_TRUE(kiln::quant_type(kiln::q4_k).matmul_reads);
}

TEST(QuantTable, ErrorsNameTheTypeAndTheBlock) {
  std::vector<float> x(300);
  std::vector<uint8_t> y(1024);
  EXPECT_KILN_ERROR(kiln::quantize_row(kiln::q4_k, x.data(), y.data(), 288), "quantize", "q4_k",
                    "256", "288");
  EXPECT_KILN_ERROR(kiln::dequantize_row(kiln::q5_1, y.data(), x.data(), 40), "dequantize", "q5_1",
                    "32", "40");
  kiln::Context ctx;
  EXPECT_KILN_ERROR(ctx.param(kiln::q6_k, {4, 96}, "bad"), "param", "q6_k", "[4, 96]",
                    "multiple of 256");
  // matmul reads the table's qmatmul rows as stored: today every row (a
  // `dequant` row would be refused when the graph is built, naming the type).
  for (const kiln::QuantType& q : kiln::kQuantTypes) EXPECT_TRUE(q.matmul_reads) << q.name;
  Tensor w = ctx.param(kiln::q4_k, {8, 256}, "w");
  Tensor x2 = ctx.input(f32, {2, 256}, "x");
  EXPECT_EQ(kiln::matmul(x2, w.T()).shape(), kiln::Shape({2, 8}));
}

}  // namespace
