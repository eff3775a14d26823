// The row code of every quantized type, declared from kiln/quant_types.def:
// quantize_row_<name> writes nblocks blocks from nblocks * block_elems values
// (ggml's quantize_row_<type>_ref, byte for byte); dequantize_row_<name> reads
// them back (ggml's dequantize_row_<type>, bit for bit). Each pair lives in
// src/core/quant/<family>.cpp, the row's family column. kiln::quantize_row /
// dequantize_row (src/core/quant.cpp) check the arguments and dispatch here.
#pragma once
#include <cstdint>

namespace kiln::quant {

#define KILN_QUANT_TYPE(name, GGUF_NAME, gguf_id, block_elems, block_bytes, family, matmul) \
  void quantize_row_##name(const float* x, uint8_t* y, int64_t nblocks);                    \
  void dequantize_row_##name(const uint8_t* x, float* y, int64_t nblocks);
#include "kiln/quant_types.def"
#undef KILN_QUANT_TYPE

}  // namespace kiln::quant
