// Shared by the Hugging Face and GGUF loaders: host-side conversion of stored
// weights (f16/bf16 -> f32) and the peak RSS they report.
#pragma once
#include <sys/resource.h>

#include <cstdint>
#include <cstring>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "kiln/dtype.h"
#include "kiln/nn.h"
#include "kiln/tensor.h"

namespace kiln::models::detail {

// Little-endian f32, f16 or bf16 values -> f32.
inline std::vector<float> to_f32(const std::vector<uint8_t>& bytes, DType stored) {
  std::vector<float> out;
  if (stored == f32) {
    out.resize(bytes.size() / 4);
    std::memcpy(out.data(), bytes.data(), out.size() * 4);
    return out;
  }
  out.resize(bytes.size() / 2);
  for (size_t i = 0; i < out.size(); ++i) {
    uint16_t h;
    std::memcpy(&h, bytes.data() + 2 * i, 2);
    out[i] = stored == f16 ? f16_to_f32(h) : bf16_to_f32(h);
  }
  return out;
}

// f32 values rounded (to nearest even) to `half` (f16 or bf16) bits.
inline std::vector<uint16_t> to_half(const std::vector<float>& v, DType half) {
  std::vector<uint16_t> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) out[i] = half == f16 ? f32_to_f16(v[i]) : f32_to_bf16(v[i]);
  return out;
}

// A param's values as f32 (f32, or f16/bf16/q8_0/q4_0 weights kept as stored).
inline std::vector<float> values_f32(Tensor t) {
  if (t.dtype() == f32 || is_quantized(t.dtype())) return t.get<float>();  // dequantized
  const std::vector<uint16_t> h = t.get<uint16_t>();
  std::vector<uint8_t> bytes(h.size() * 2);
  std::memcpy(bytes.data(), h.data(), bytes.size());
  return to_f32(bytes, t.dtype());
}

// Gives the params of the load plan's items the dtype `pick(item)` returns
// (nullopt: unchanged), in one walk of the model (nn::Module::set_parameter_dtypes):
// a call per param would make loading quadratic in the number of tensors.
// Item has `name` (the param's) and `param` (updated).
template <class Item, class Pick>
void retype_params(nn::Module& model, std::vector<Item>& plan, Pick pick) {
  std::vector<std::pair<std::string, DType>> changes;
  std::vector<Item*> items;
  for (Item& it : plan)
    if (const std::optional<DType> d = pick(it)) {
      changes.emplace_back(it.name, *d);
      items.push_back(&it);
    }
  if (changes.empty()) return;
  const std::vector<Tensor> now = model.set_parameter_dtypes(changes);
  for (size_t i = 0; i < items.size(); ++i) items[i]->param = now[i];
}

// The process's peak resident set so far, in bytes.
inline int64_t peak_rss_bytes() {
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  return int64_t(ru.ru_maxrss) * 1024;  // Linux reports KiB
}

}  // namespace kiln::models::detail
