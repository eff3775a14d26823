// Dequantization of GGUF tensor data to f32: the plain dtypes, and ggml's
// block-quantized types (kiln/quant_types.def; kiln's dequantize_row), and the
// list of type numbers kiln reads, for errors.
#include <cstring>
#include <string>

#include "io/gguf_format.h"
#include "kiln/io.h"

namespace kiln {

std::vector<float> gguf_dequantize(const GgufTensorInfo& t, std::span<const uint8_t> bytes) {
  const uint64_t n = uint64_t(t.shape.numel());
  std::vector<float> out;
  if (is_quantized(t.dtype)) {
    const uint64_t block = uint64_t(dtype_block_elems(t.dtype));
    if (n % block != 0 || bytes.size() != n / block * dtype_size(t.dtype))
      fail("gguf", "tensor '", t.name, "' is ", quant_type(t.dtype).gguf_name, " ", t.shape.str(),
           " but ", bytes.size(), " bytes were given");
    out.resize(n);
    dequantize_row(t.dtype, bytes.data(), out.data(), int64_t(n));  // blocks run on across rows
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

namespace gguf {
std::string known_ggml_types() {
  std::string s = "f32=0, f16=1, bf16=30, i32=26";
  for (const QuantType& q : kQuantTypes)
    s += std::string(", ") + q.gguf_name + "=" + std::to_string(q.gguf_id);
  return s;
}
}  // namespace gguf

}  // namespace kiln
