// Helpers for the GGUF tests: whole-file I/O, and a tiny
// independent GGUF encoder (written from the spec, not from kiln's writer) so
// tests can build exact and deliberately broken files byte by byte.
#pragma once
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "common/temp_dir.h"

namespace kiln_test {

inline std::vector<uint8_t> read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

// Replaces the file by a new one: truncating an existing file in place makes ext4
// flush it on close (auto_da_alloc), which slows thousands of variants to a crawl.
inline void write_file(const std::string& path, const std::vector<uint8_t>& bytes) {
  std::error_code ec;
  std::filesystem::remove(path, ec);
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(bytes.data()), std::streamsize(bytes.size()));
}

// Little-endian byte builder.
struct Bytes {
  std::vector<uint8_t> b;
  Bytes& raw(const void* p, size_t n) {
    const auto* c = static_cast<const uint8_t*>(p);
    b.insert(b.end(), c, c + n);
    return *this;
  }
  Bytes& u8(uint8_t v) { return raw(&v, 1); }
  Bytes& u16(uint16_t v) { return raw(&v, 2); }
  Bytes& u32(uint32_t v) { return raw(&v, 4); }
  Bytes& u64(uint64_t v) { return raw(&v, 8); }
  Bytes& f32(float v) { return raw(&v, 4); }
  Bytes& str(const std::string& s) { return u64(s.size()).raw(s.data(), s.size()); }
  Bytes& header(uint64_t n_tensors, uint64_t n_kv, uint32_t version = 3) {
    return raw("GGUF", 4).u32(version).u64(n_tensors).u64(n_kv);
  }
  // A tensor info: dims innermost first, as GGUF stores them.
  Bytes& tensor(const std::string& name, std::vector<uint64_t> dims, uint32_t type,
                uint64_t offset) {
    str(name).u32(uint32_t(dims.size()));
    for (uint64_t d : dims) u64(d);
    return u32(type).u64(offset);
  }
  Bytes& pad(size_t align) {
    while (b.size() % align) b.push_back(0);
    return *this;
  }
  size_t size() const { return b.size(); }
};

}  // namespace kiln_test
