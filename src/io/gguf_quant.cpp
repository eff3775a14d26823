// Dequantization of GGUF tensor data to f32: the plain dtypes, and ggml's
// Q8_0 and Q4_0 blocks (kiln's dequantize_row, src/core/quant.cpp).
#include <cstring>

#include "io/gguf_format.h"
#include "kiln/io.h"

namespace kiln {

std::vector<float> gguf_dequantize(const GgufTensorInfo& t, std::span<const uint8_t> bytes) {
  const uint64_t n = uint64_t(t.shape.numel());
  std::vector<float> out;
  if (const std::optional<gguf::BlockType> bt = gguf::block_type(t.ggml_type)) {
    if (n % bt->elems != 0 || bytes.size() != n / bt->elems * bt->bytes)
      fail("gguf", "tensor '", t.name, "' is ", bt->name, " ", t.shape.str(), " but ", bytes.size(),
           " bytes were given");
    out.resize(n);
    const DType q = t.ggml_type == gguf::kGgmlQ8_0 ? DType::q8_0 : DType::q4_0;
    dequantize_row(q, bytes.data(), out.data(), int64_t(n));  // blocks run on across rows
    return out;
  }
  if (t.dtype == i32) fail("gguf", "tensor '", t.name, "' is i32, not a float tensor");
  const size_t es = dtype_size(t.dtype);
  if (bytes.size() != n * es)
    fail("gguf", "tensor '", t.name, "' is ", dtype_name(t.dtype), " ", t.shape.str(), " but ",
         bytes.size(), " bytes were given");
  out.resize(n);
  if (t.dtype == f32) {
    std::memcpy(out.data(), bytes.data(), bytes.size());
    return out;
  }
  for (uint64_t i = 0; i < n; ++i) {
    uint16_t h;
    std::memcpy(&h, bytes.data() + 2 * i, 2);
    out[i] = t.dtype == f16 ? f16_to_f32(h) : bf16_to_f32(h);
  }
  return out;
}

}  // namespace kiln
