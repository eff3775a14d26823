// A corpus encoded once and kept on disk as u16 or u32 ids. Layout (little-endian):
//   "KILNTOK1"  u32 id bytes (2 or 4)  u32 0  u64 vocab size
//   u64 tokenizer fingerprint  u64 corpus fingerprint  u64 count  ids...
// The fingerprints (FNV-1a 64) cover the tokenizer's tokens, merges and the ids
// of a probe text, and the corpus's file names and bytes: a cache made by
// another tokenizer or of another corpus is rebuilt.
#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "kiln/error.h"
#include "kiln/tokenizer.h"
#include "tokenizer/model.h"

namespace kiln {

namespace {

namespace fs = std::filesystem;

struct Fnv {
  uint64_t h = 0xcbf29ce484222325ull;
  void bytes(const void* p, size_t n) {
    auto* b = static_cast<const unsigned char*>(p);
    for (size_t i = 0; i < n; ++i) h = (h ^ b[i]) * 0x100000001b3ull;
  }
  void str(std::string_view s) {
    uint64_t n = s.size();
    bytes(&n, 8);
    bytes(s.data(), s.size());
  }
};

uint64_t tokenizer_fingerprint(const Tokenizer& t) {
  Fnv f;
  const tok::Model& m = t.model();
  for (const std::string& s : m.tokens) f.str(s);
  for (const auto& [a, b] : m.merges) {
    f.str(a);
    f.str(b);
  }
  std::vector<int32_t> probe =
      t.encode("The 1234 quick\n\n  brown  fox's caf\xC3\xA9 \xE4\xB8\xAD\xE6\x96\x87!", true);
  f.bytes(probe.data(), probe.size() * 4);
  f.bytes(&m.eos, 4);
  return f.h;
}

struct Header {
  char magic[8];
  uint32_t width, zero;
  uint64_t vocab, tok_fp, corpus_fp, count;
};

}  // namespace

TokenCache cached_corpus_tokens(const Tokenizer& tok, const std::string& corpus_dir,
                                const std::string& cache_path, int threads) {
  std::vector<fs::path> files;
  if (fs::is_directory(corpus_dir))
    for (const auto& e : fs::directory_iterator(corpus_dir))
      if (e.is_regular_file() && e.path().extension() == ".txt") files.push_back(e.path());
  if (files.empty()) fail("token cache", corpus_dir, " has no *.txt files");
  std::sort(files.begin(), files.end(), [](const fs::path& a, const fs::path& b) {
    return a.filename().string() < b.filename().string();
  });
  std::vector<std::string> docs;
  Fnv corpus;
  for (const fs::path& p : files) {
    std::ifstream in(p, std::ios::binary);
    std::ostringstream ss;
    ss << in.rdbuf();
    docs.push_back(ss.str());
    corpus.str(p.filename().string());
    corpus.str(docs.back());
  }
  TokenCache out;
  out.vocab_size = tok.vocab_size();
  uint32_t width = out.vocab_size <= 65536 ? 2 : 4;
  uint64_t tfp = tokenizer_fingerprint(tok);

  std::ifstream in(cache_path, std::ios::binary);
  Header h{};
  if (in && in.read(reinterpret_cast<char*>(&h), sizeof h) &&
      std::memcmp(h.magic, "KILNTOK1", 8) == 0 && h.width == width &&
      h.vocab == uint64_t(out.vocab_size) && h.tok_fp == tfp && h.corpus_fp == corpus.h &&
      fs::file_size(cache_path) == sizeof h + h.count * width) {
    out.ids.resize(h.count);
    if (width == 4) {
      in.read(reinterpret_cast<char*>(out.ids.data()), std::streamsize(h.count * 4));
    } else {
      std::vector<uint16_t> small(h.count);
      in.read(reinterpret_cast<char*>(small.data()), std::streamsize(h.count * 2));
      std::copy(small.begin(), small.end(), out.ids.begin());
    }
    if (in) return out;
  }

  auto encoded = tok.encode_batch(docs, false, threads);
  for (const auto& d : encoded) {
    out.ids.insert(out.ids.end(), d.begin(), d.end());
    if (tok.eos_id()) out.ids.push_back(uint32_t(*tok.eos_id()));
  }
  out.rebuilt = true;
  std::memcpy(h.magic, "KILNTOK1", 8);
  h.width = width;
  h.zero = 0;
  h.vocab = uint64_t(out.vocab_size);
  h.tok_fp = tfp;
  h.corpus_fp = corpus.h;
  h.count = out.ids.size();
  std::string tmp = cache_path + ".tmp";
  {
    std::ofstream o(tmp, std::ios::binary | std::ios::trunc);
    if (!o) fail("token cache", "cannot write ", tmp);
    o.write(reinterpret_cast<const char*>(&h), sizeof h);
    if (width == 4) {
      o.write(reinterpret_cast<const char*>(out.ids.data()), std::streamsize(out.ids.size() * 4));
    } else {
      std::vector<uint16_t> small(out.ids.begin(), out.ids.end());
      o.write(reinterpret_cast<const char*>(small.data()), std::streamsize(small.size() * 2));
    }
    if (!o) fail("token cache", "writing ", tmp, " failed");
  }
  fs::rename(tmp, cache_path);
  return out;
}

}  // namespace kiln
