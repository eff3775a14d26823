// The id tables, BPE units and merge table of a Model, and the matching of
// added tokens in text (leftmost-longest, as Hugging Face tokenizers'
// AddedVocabulary does, with lstrip / rstrip / single_word).
#include <algorithm>
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
  StringMap spelt;  // the model's own vocabulary, for merges
  spelt.reserve(vocab.size());
  for (const auto& [tok, id] : vocab) {
    m.tokens[size_t(id)] = tok;
    spelt.emplace(tok, int32_t(id));
    m.token_ids.emplace(tok, int32_t(id));
  }
  for (const AddedToken& a : m.added) {
    m.tokens[size_t(a.id)] = a.content;
    m.token_ids[a.content] = a.id;
    if (a.special) m.special[size_t(a.id)] = 1;
  }

  Bpe& b = m.bpe;
  static std::atomic<uint64_t> serials{0};
  b.serial = ++serials;
  b.byte_id.fill(-1);
  b.fallback_id.fill(-1);
  b.units.reserve(vocab.size());
  if (b.byte_level) {
    // Byte-level tokens are spelt in GPT-2's byte alphabet; kiln matches the raw
    // bytes they stand for, so the text is never mapped to that alphabet.
    m.bytes.assign(n, std::string());
    for (const auto& [tok, id] : vocab) {
      std::string raw;
      if (byte_level_decode(tok, raw)) {
        b.units.emplace(raw, int32_t(id));
        m.bytes[size_t(id)] = std::move(raw);
      } else {
        m.bytes[size_t(id)] = tok;
      }
    }
    for (const AddedToken& a : m.added) {
      // Decoded as the reference does: through the alphabet when every character
      // is in it, otherwise as the content's own bytes.
      std::string raw;
      m.bytes[size_t(a.id)] = byte_level_decode(a.content, raw) ? raw : a.content;
    }
    for (int c = 0; c < 256; ++c) {
      auto it = b.units.find(std::string_view(reinterpret_cast<const char*>(&c), 1));
      if (it != b.units.end()) b.byte_id[size_t(c)] = it->second;
    }
  } else {
    for (const auto& [tok, id] : vocab) b.units.emplace(tok, int32_t(id));
  }
  for (int c = 0; c < 256; ++c) {
    char name[8];
    std::snprintf(name, sizeof name, "<0x%02X>", c);
    auto it = spelt.find(std::string_view(name));
    if (it != spelt.end()) b.fallback_id[size_t(c)] = it->second;
  }
  b.unk_id = -1;
  if (!unk.empty()) {
    auto it = m.token_ids.find(unk);
    if (it == m.token_ids.end())
      fail("tokenizer", m.source, ": unk_token '", unk, "' is not in the vocabulary");
    b.unk_id = it->second;
  }
  b.merges.build(m.merges.size());
  std::string joined;
  for (size_t r = 0; r < m.merges.size(); ++r) {
    const auto& [l, rt] = m.merges[r];
    auto il = spelt.find(l), ir = spelt.find(rt);
    joined = l + rt;
    auto ij = spelt.find(joined);
    if (il == spelt.end() || ir == spelt.end() || ij == spelt.end())
      fail("tokenizer", m.source, ": merge number ", r + 1, " '", l, " ", rt, "': '",
           il == spelt.end()   ? l
           : ir == spelt.end() ? rt
                               : joined,
           "' is not in the vocabulary");
    b.merges.insert(il->second, ir->second, int32_t(r), ij->second);
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
