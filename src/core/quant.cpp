// quantize_row / dequantize_row: argument checks, then the type's row code
// (src/core/quant/<family>.cpp), dispatched from kiln/quant_types.def.
#include "core/quant/quant_rows.h"
#include "kiln/dtype.h"
#include "kiln/error.h"

namespace kiln {
namespace {

int64_t check_row(const char* what, DType t, int64_t n) {
  if (!is_quantized(t)) fail(what, "dtype must be a quantized type, got ", dtype_name(t));
  const int64_t block = dtype_block_elems(t);
  if (n < 0 || n % block != 0)
    fail(what, dtype_name(t), " rows hold whole blocks of ", block, " values; got ", n, " values");
  return n / block;
}

}  // namespace

void quantize_row(DType t, const float* x, void* y, int64_t n) {
  const int64_t nblocks = check_row("quantize", t, n);
  auto* out = static_cast<uint8_t*>(y);
  switch (t) {
#define KILN_QUANT_TYPE(name, GGUF_NAME, gguf_id, block_elems, block_bytes, family, matmul) \
  case DType::name:                                                                         \
    return quant::quantize_row_##name(x, out, nblocks);
#include "kiln/quant_types.def"
#undef KILN_QUANT_TYPE
    default: break;
  }
}

void dequantize_row(DType t, const void* x, float* y, int64_t n) {
  const int64_t nblocks = check_row("dequantize", t, n);
  const auto* in = static_cast<const uint8_t*>(x);
  switch (t) {
#define KILN_QUANT_TYPE(name, GGUF_NAME, gguf_id, block_elems, block_bytes, family, matmul) \
  case DType::name:                                                                         \
    return quant::dequantize_row_##name(in, y, nblocks);
#include "kiln/quant_types.def"
#undef KILN_QUANT_TYPE
    default: break;
  }
}

}  // namespace kiln
