// Builds safetensors files byte by byte from the spec (not with kiln's writer):
// an 8-byte little-endian header length, the JSON header text exactly as given
// (padding included), then the data section.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "gguf_test_util.h"

namespace kiln_test {

inline std::vector<uint8_t> safetensors_bytes(const std::string& header,
                                              const std::vector<uint8_t>& data,
                                              uint64_t header_len_field = ~uint64_t(0)) {
  Bytes b;
  b.u64(header_len_field == ~uint64_t(0) ? header.size() : header_len_field);
  b.raw(header.data(), header.size());
  b.raw(data.data(), data.size());
  return b.b;
}

// `header` padded with spaces to a multiple of 8 bytes, as the reference writer does.
inline std::string pad8(std::string header) {
  while (header.size() % 8) header += ' ';
  return header;
}

template <class T>
void append(std::vector<uint8_t>& out, std::initializer_list<T> values) {
  for (T v : values) {
    const auto* p = reinterpret_cast<const uint8_t*>(&v);
    out.insert(out.end(), p, p + sizeof(T));
  }
}

}  // namespace kiln_test
