// The id tables, byte tables and merge table of a Model, and the matching of
// added tokens in text (leftmost-longest, as Hugging Face tokenizers'
// AddedVocabulary does, with lstrip / rstrip / single_word).
#include <algorithm>
#include <array>
#include <atomic>
#include <cstdio>

#include "kiln/error.h"
#include "tokenizer/model.h"
#include "tokenizer/utf8.h"

namespace kiln::tok {

void build_vocab(Model& m, const std::vector<std::pair<std::string, int64_t>>& vocab,
                 const std::string& unk) {
  // Ids may leave holes, but not so many that a bad file makes kiln allocate
  // far more than the file holds.
  int64_t max_id = -1;
  for (const auto& [tok, id] : vocab) {
    if (id < 0)
      fail("tokenizer", m.source, ": vocabulary token '", tok, "' has the negative id ", id);
    max_id = std::max(max_id, id);
  }
  for (const AddedToken& a : m.added) max_id = std::max<int64_t>(max_id, a.id);
  int64_t entries = int64_t(vocab.size() + m.added.size());
  if (max_id >= 2 * entries + 65536)
    fail("tokenizer", m.source, ": id ", max_id, " is far beyond the ", entries,
         " tokens the file holds");
  size_t n = size_t(max_id + 1);
  m.tokens.assign(n, std::string());
  m.special.assign(n, 0);
  // token_ids holds the model's vocabulary while the merges are resolved, and
  // the added tokens after that.
  m.token_ids.reserve(vocab.size() + m.added.size());
  for (const auto& [tok, id] : vocab) {
    m.tokens[size_t(id)] = tok;
    m.token_ids.put(tok, id, false);
  }
  const FlatMap& spelt = m.token_ids;

  Bpe& b = m.bpe;
  static std::atomic<uint64_t> serials{0};
  b.serial = ++serials;
  b.vocab = &m.token_ids;
  b.byte_id.fill(-1);
  b.fallback_id.fill(-1);
  if (b.byte_level) {
    // Byte-level tokens are spelt in GPT-2's byte alphabet; kiln matches the raw
    // bytes they stand for, so the text is never mapped to that alphabet.
    m.bytes.assign(n, std::string());
    for (const auto& [tok, id] : vocab)
      if (!byte_level_decode(tok, m.bytes[size_t(id)])) m.bytes[size_t(id)] = tok;
    for (int c = 0; c < 256; ++c) {
      b.byte_id[size_t(c)] = int32_t(spelt.get(byte_level_encode(std::string(1, char(c)))));
    }
  }
  for (int c = 0; c < 256; ++c) {
    char name[8];
    std::snprintf(name, sizeof name, "<0x%02X>", c);
    b.fallback_id[size_t(c)] = int32_t(spelt.get(name));
  }
  b.merges.build(m.merges.size());
  // Three lookups per merge, each a likely cache miss in a large vocabulary:
  // hashed and prefetched a block ahead.
  constexpr size_t kBlock = 32;
  std::vector<std::string> joined(kBlock);
  std::array<uint64_t, 3 * kBlock> h;
  for (size_t r0 = 0; r0 < m.merges.size(); r0 += kBlock) {
    size_t n = std::min(kBlock, m.merges.size() - r0);
    for (size_t k = 0; k < n; ++k) {
      const auto& [l, rt] = m.merges[r0 + k];
      joined[k].assign(l).append(rt);
      h[3 * k] = hash_bytes(l);
      h[3 * k + 1] = hash_bytes(rt);
      h[3 * k + 2] = hash_bytes(joined[k]);
      for (int q = 0; q < 3; ++q) spelt.prefetch(h[3 * k + q]);
    }
    for (size_t k = 0; k < n; ++k) {
      const auto& [l, rt] = m.merges[r0 + k];
      int64_t il = spelt.get(l, h[3 * k]), ir = spelt.get(rt, h[3 * k + 1]),
              ij = spelt.get(joined[k], h[3 * k + 2]);
      if (il < 0 || ir < 0 || ij < 0)
        fail("tokenizer", m.source, ": merge number ", r0 + k + 1, " '", l, " ", rt, "': '",
             il < 0   ? l
             : ir < 0 ? rt
                      : joined[k],
             "' is not in the vocabulary");
      b.merges.insert(int32_t(il), int32_t(ir), int32_t(r0 + k), int32_t(ij));
    }
  }
  for (const AddedToken& a : m.added) {
    m.tokens[size_t(a.id)] = a.content;
    m.token_ids.put(a.content, a.id);
    if (a.special) m.special[size_t(a.id)] = 1;
    // Decoded as the reference does: through the byte alphabet when every
    // character is in it, otherwise as the content's own bytes.
    if (b.byte_level) {
      std::string& raw = m.bytes[size_t(a.id)];
      raw.clear();
      if (!byte_level_decode(a.content, raw)) raw = a.content;
    }
  }
  b.unk_id = -1;
  if (!unk.empty()) {
    int64_t id = m.token_ids.get(unk);
    if (id < 0) fail("tokenizer", m.source, ": unk_token '", unk, "' is not in the vocabulary");
    b.unk_id = int32_t(id);
  }
  m.finish();
}

void AddedMatcher::build(const std::vector<AddedToken>& all, bool normalized) {
  tokens.clear();
  for (auto& v : by_first) v.clear();
  for (const AddedToken& a : all)
    if (a.normalized == normalized) tokens.push_back(&a);
  std::stable_sort(tokens.begin(), tokens.end(), [](const AddedToken* x, const AddedToken* y) {
    return x->content.size() > y->content.size();
  });
  for (uint32_t k = 0; k < tokens.size(); ++k)
    by_first[static_cast<unsigned char>(tokens[k]->content[0])].push_back(k);
}

void Model::finish() {
  added_raw.build(added, false);
  added_normalized.build(added, true);
}

namespace {

// The character ending just before `end` (valid UTF-8), or 0 at the start.
char32_t char_before(std::string_view s, size_t end) {
  if (end == 0) return 0;
  size_t b = end - 1;
  while (b > 0 && (static_cast<unsigned char>(s[b]) & 0xC0) == 0x80) --b;
  return next_char(s, b);
}

}  // namespace

void split_added(const AddedMatcher& m, std::string_view text, std::vector<Section>& out) {
  size_t start = 0;  // of the text not yet emitted
  size_t i = 0;
  while (i < text.size()) {
    const auto& cands = m.by_first[static_cast<unsigned char>(text[i])];
    const AddedToken* hit = nullptr;
    for (uint32_t k : cands) {
      const std::string& c = m.tokens[k]->content;
      if (text.compare(i, c.size(), c) == 0) {
        hit = m.tokens[k];
        break;  // longest first
      }
    }
    if (!hit) {
      ++i;
      continue;
    }
    size_t b = i, e = i + hit->content.size();
    if (hit->single_word) {
      size_t j = e;
      bool word_before = b > 0 && is_alphanumeric(char_before(text, b));
      bool word_after = e < text.size() && is_alphanumeric(next_char(text, j));
      if (word_before || word_after) {
        i += utf8_len(static_cast<unsigned char>(text[i]));
        continue;
      }
    }
    if (hit->lstrip) {
      while (b > start) {
        size_t p = b - 1;
        while (p > start && (static_cast<unsigned char>(text[p]) & 0xC0) == 0x80) --p;
        size_t q = p;
        if (!is_whitespace(next_char(text, q))) break;
        b = p;
      }
    }
    if (hit->rstrip) {
      while (e < text.size()) {
        size_t q = e;
        if (!is_whitespace(next_char(text, q))) break;
        e = q;
      }
    }
    if (b > start) out.push_back({text.substr(start, b - start), -1, start});
    out.push_back({text.substr(b, e - b), hit->id, b});
    start = i = e;
  }
  if (start < text.size()) out.push_back({text.substr(start), -1, start});
}

}  // namespace kiln::tok
