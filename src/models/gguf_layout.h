// llama.cpp's GGUF conventions for kiln's models, shared by the model files
// (gguf_model.cpp) and the LoRA adapter files (lora_gguf.cpp): the
// architecture name, tensor names, and how a tensor's rows differ from Hugging
// Face's layout.
#pragma once
#include <algorithm>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "kiln/models.h"

namespace kiln::models::detail {

// general.architecture of a config.
std::string arch_of(const ModelConfig& c);

// HF parameter name -> llama.cpp tensor name ("" when it has none).
std::string gguf_name(const std::string& hf, const ModelConfig& c);

// The usual shape of that map: HF module names under `layers` ("model.layers.")
// map through `layer` to "blk.N.<name>", others through `top`; the suffix
// (".weight", ".bias") stays. "" for a name neither map has.
using NameMap = std::map<std::string, std::string>;
std::string mapped_gguf_name(const std::string& hf, const std::string& layers, const NameMap& top,
                             const NameMap& layer);

// How a tensor's values differ between kiln (HF layout) and the GGUF file.
enum class Layout { same, rope_pairs, transposed };

// llama.cpp's "llama" architecture rotates adjacent pairs (dims 2j, 2j+1), HF the
// two halves of each head (j, j + D/2), so its converter reorders the rows of q
// and k (weights and biases): file row 2j + h of a head is HF row h * D/2 + j.
// Qwen2 and Qwen3 keep HF's order (llama.cpp runs them with NeoX-style RoPE).
// `heads`: set to the head count of q or k for Layout::rope_pairs. Each
// architecture says which of its tensors have which layout (architecture.h).
Layout layout_of(const std::string& hf, const ModelConfig& c, int64_t* heads);

// Reorders the rows of x ([heads * D, cols], row-major) between the two RoPE
// layouts; to_file: HF -> llama.cpp, else back. T: the stored element (float, or
// the 16 bits of f16/bf16: moving rows needs no conversion).
template <class T>
std::vector<T> reorder_rope_rows(const std::vector<T>& x, int64_t heads, int64_t rows,
                                 bool to_file) {
  const int64_t cols = int64_t(x.size()) / rows, D = rows / heads, half = D / 2;
  std::vector<T> out(x.size());
  for (int64_t h = 0; h < heads; ++h)
    for (int64_t j = 0; j < half; ++j)
      for (int64_t s = 0; s < 2; ++s) {
        const int64_t hf_row = h * D + s * half + j, file_row = h * D + 2 * j + s;
        const int64_t src = to_file ? hf_row : file_row, dst = to_file ? file_row : hf_row;
        std::copy_n(x.begin() + src * cols, cols, out.begin() + dst * cols);
      }
  return out;
}

template <class T>
std::vector<T> transpose(const std::vector<T>& x, int64_t rows, int64_t cols) {
  std::vector<T> out(x.size());
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) out[size_t(c * rows + r)] = x[size_t(r * cols + c)];
  return out;
}

}  // namespace kiln::models::detail
