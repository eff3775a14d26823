// Dequantization of GGUF tensor data to f32: the plain dtypes, and ggml's
// Q8_0 and Q4_0 blocks (32 values each, an f16 scale first).
#include <cstring>

#include "io/gguf_format.h"
#include "kiln/io.h"

namespace kiln {
namespace {

float f16_at(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return f16_to_f32(h);
}

}  // namespace

std::vector<float> gguf_dequantize(const GgufTensorInfo& t, std::span<const uint8_t> bytes) {
  const uint64_t n = uint64_t(t.shape.numel());
  std::vector<float> out;
  if (const std::optional<gguf::BlockType> bt = gguf::block_type(t.ggml_type)) {
    if (n % bt->elems != 0 || bytes.size() != n / bt->elems * bt->bytes)
      fail("gguf", "tensor '", t.name, "' is ", bt->name, " ", t.shape.str(), " but ", bytes.size(),
           " bytes were given");
    out.resize(n);
    for (uint64_t b = 0; b < n / bt->elems; ++b) {
      const uint8_t* blk = bytes.data() + b * bt->bytes;
      const float d = f16_at(blk);
      float* y = out.data() + b * bt->elems;
      if (t.ggml_type == gguf::kGgmlQ8_0) {
        for (int i = 0; i < 32; ++i) y[i] = float(int8_t(blk[2 + i])) * d;
      } else {  // Q4_0: low nibbles are values 0..15, high nibbles 16..31
        for (int i = 0; i < 16; ++i) {
          y[i] = float(int(blk[2 + i] & 0x0F) - 8) * d;
          y[i + 16] = float(int(blk[2 + i] >> 4) - 8) * d;
        }
      }
    }
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
