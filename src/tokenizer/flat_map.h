// An open-addressing hash map from strings to 64-bit values, for the tokenizer's
// hot lookups (the vocabulary, the word cache): keys live in one pool, slots
// hold the hash, so a lookup is one probe sequence and usually one memcmp.
#pragma once
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>
#include <vector>

namespace kiln::tok {

inline uint64_t hash_bytes(std::string_view s) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  size_t n = s.size();
  uint64_t h = 0x9E3779B97F4A7C15ull ^ (n * 0xFF51AFD7ED558CCDull);
  while (n >= 8) {
    uint64_t w;
    std::memcpy(&w, p, 8);
    h = (h ^ w) * 0xC4CEB9FE1A85EC53ull;
    h ^= h >> 29;
    p += 8;
    n -= 8;
  }
  uint64_t w = 0;
  std::memcpy(&w, p, n);
  h = (h ^ w) * 0xC4CEB9FE1A85EC53ull;
  h ^= h >> 32;
  h *= 0xFF51AFD7ED558CCDull;
  return h ^ (h >> 29);
}

class FlatMap {
 public:
  static constexpr int64_t kMissing = -1;

  size_t size() const { return size_; }
  void clear() {
    slots_.assign(slots_.size(), Slot{});
    pool_.clear();
    size_ = 0;
  }
  void reserve(size_t n) {
    if (n * 2 > slots_.size()) rehash(n * 2);
  }
  // The value of key, or kMissing.
  int64_t get(std::string_view key) const { return get(key, hash_bytes(key)); }
  // The same, with h = hash_bytes(key) computed earlier (see prefetch).
  int64_t get(std::string_view key, uint64_t h) const {
    if (slots_.empty()) return kMissing;
    for (size_t i = h & mask_;; i = (i + 1) & mask_) {
      const Slot& s = slots_[i];
      if (s.len == kEmpty) return kMissing;
      if (s.hash == h && s.len == key.size() &&
          std::memcmp(pool_.data() + s.off, key.data(), key.size()) == 0)
        return s.value;
    }
  }
  // Loads the slot where a lookup of a key with hash h starts into the cache:
  // loops over many keys hash and prefetch a block ahead of their lookups.
  void prefetch(uint64_t h) const {
    if (!slots_.empty()) __builtin_prefetch(&slots_[h & mask_]);
  }
  // Inserts key -> value; an existing key is given the new value when overwrite.
  void put(std::string_view key, int64_t value, bool overwrite = true) {
    if ((size_ + 1) * 2 > slots_.size()) rehash(slots_.empty() ? 16 : slots_.size() * 2);
    uint64_t h = hash_bytes(key);
    for (size_t i = h & mask_;; i = (i + 1) & mask_) {
      Slot& s = slots_[i];
      if (s.len == kEmpty) {
        s = {h, uint32_t(pool_.size()), uint32_t(key.size()), value};
        pool_.append(key);
        ++size_;
        return;
      }
      if (s.hash == h && s.len == key.size() &&
          std::memcmp(pool_.data() + s.off, key.data(), key.size()) == 0) {
        if (overwrite) s.value = value;
        return;
      }
    }
  }

 private:
  static constexpr uint32_t kEmpty = ~uint32_t(0);
  struct Slot {
    uint64_t hash = 0;
    uint32_t off = 0, len = kEmpty;
    int64_t value = 0;
  };
  void rehash(size_t want) {
    size_t cap = 16;
    while (cap < want) cap *= 2;
    std::vector<Slot> old = std::move(slots_);
    slots_.assign(cap, Slot{});
    mask_ = cap - 1;
    for (const Slot& s : old) {
      if (s.len == kEmpty) continue;
      size_t i = s.hash & mask_;
      while (slots_[i].len != kEmpty) i = (i + 1) & mask_;
      slots_[i] = s;
    }
  }
  std::vector<Slot> slots_;
  std::string pool_;
  size_t size_ = 0, mask_ = 0;
};

}  // namespace kiln::tok
