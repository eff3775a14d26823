// The loaded tokenizer pipeline, private to src/tokenizer: normalizers,
// pre-tokenizers, the BPE model, added tokens, post-processor and decoders, in
// the order Hugging Face's tokenizers library runs them (docs/tokenizer.md).
#pragma once
#include <array>
#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "tokenizer/flat_map.h"
#include "tokenizer/regex.h"

namespace kiln::tok {

// ---- normalizers ----
struct Normalizer {
  enum Kind { NFC, NFD, NFKC, NFKD, Lowercase, Strip, Prepend, Replace, Sequence } kind = Sequence;
  Normalizer() = default;
  explicit Normalizer(Kind k) : kind(k) {}
  bool strip_left = false, strip_right = false;  // Strip
  std::string text;                              // Prepend: prefix; Replace: content
  std::string literal;                           // Replace with a String pattern
  std::shared_ptr<Regex> regex;                  // Replace with a Regex pattern
  std::vector<Normalizer> steps;                 // Sequence
};
std::string normalize(const Normalizer& n, std::string s);

// ---- pre-tokenizers ----
enum class SplitBehavior { Removed, Isolated, MergedWithPrevious, MergedWithNext, Contiguous };

// GPT-2's pre-tokenizer regex: what a ByteLevel step with use_regex splits by.
inline constexpr const char* kGpt2ByteLevelPattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

struct PreTokenizer {
  enum Kind {
    Split,
    ByteLevel,
    Metaspace,
    Digits,
    Punctuation,
    Whitespace,
    WhitespaceSplit
  } kind = Split;
  PreTokenizer() = default;
  explicit PreTokenizer(Kind k) : kind(k) {}
  std::shared_ptr<Regex> regex;  // Split (Regex), ByteLevel with use_regex
  std::string literal;           // Split with a String pattern
  SplitBehavior behavior = SplitBehavior::Isolated;
  bool invert = false;
  bool add_prefix_space = false;  // ByteLevel
  std::string replacement;        // Metaspace
  enum Prepend { Always, First, Never } prepend = Always;
  bool metaspace_split = true;
  bool individual_digits = false;
};

// Pieces of one section of text: views into the section or into `arena`
// (pieces a step rewrote). std::deque keeps the arena's strings in place.
struct Pieces {
  std::vector<std::string_view> views;
  std::deque<std::string> arena;
};
// first_section: the section starts the text (Metaspace's prepend_scheme "first").
void pre_tokenize(const std::vector<PreTokenizer>& steps, Pieces& p, bool first_section);

// ---- the BPE model ----
struct MergeTable {
  struct Slot {
    uint64_t key = ~uint64_t(0);
    int32_t rank = 0, id = 0;
  };
  std::vector<Slot> slots;
  uint64_t mask = 0;
  int shift = 63;
  uint64_t slot_of(uint64_t key) const { return (key * 0x9E3779B97F4A7C15ull) >> shift; }
  void build(size_t n);
  void insert(int32_t a, int32_t b, int32_t rank, int32_t id);
  const Slot* find(int32_t a, int32_t b) const {
    uint64_t key = (uint64_t(uint32_t(a)) << 32) | uint32_t(b);
    for (uint64_t i = slot_of(key);; i = (i + 1) & mask) {
      const Slot& s = slots[i];
      if (s.key == key) return &s;
      if (s.key == ~uint64_t(0)) return nullptr;
    }
  }
};

struct Bpe {
  // Byte-level tokenizers match raw bytes: a unit is one byte (its id in
  // byte_id), otherwise one UTF-8 character (its id in vocab).
  bool byte_level = false;
  const FlatMap* vocab = nullptr;        // token as spelt -> id (the Model's token_ids)
  std::array<int32_t, 256> byte_id;      // byte_level: id of each single byte, -1 if none
  std::array<int32_t, 256> fallback_id;  // byte_fallback: id of <0xXX>, -1 if none
  MergeTable merges;
  int32_t unk_id = -1;
  bool fuse_unk = false, byte_fallback = false, ignore_merges = false;
  uint64_t serial = 0;  // tells thread-local caches apart
  // Appends the ids of one pre-tokenized piece.
  void tokenize(std::string_view piece, std::vector<int32_t>& out) const;
  void merge_word(std::string_view piece, std::vector<int32_t>& out) const;
  // ignore_merges: the id of the whole piece when it is a token, or -1.
  int32_t whole_word(std::string_view piece) const;
};

// ---- added tokens ----
struct AddedToken {
  std::string content;
  int32_t id = 0;
  bool special = false, lstrip = false, rstrip = false, normalized = false, single_word = false;
};

// Leftmost-longest matcher over a set of added tokens.
struct AddedMatcher {
  std::vector<const AddedToken*> tokens;            // longest first
  std::array<std::vector<uint32_t>, 256> by_first;  // indexes into tokens
  void build(const std::vector<AddedToken>& all, bool normalized);
  bool empty() const { return tokens.empty(); }
};
// One part of a text: an added token (id >= 0) or text to tokenize.
struct Section {
  std::string_view text;
  int32_t id = -1;
  size_t offset = 0;  // where it starts in the text it was split from
};
void split_added(const AddedMatcher& m, std::string_view text, std::vector<Section>& out);

// ---- decoders ----
struct Decoder {
  enum Kind { ByteLevel, Metaspace, ByteFallback, Fuse, Strip, Replace, Sequence } kind = Sequence;
  Decoder() = default;
  explicit Decoder(Kind k) : kind(k) {}
  std::string literal, content;  // Replace (String pattern); Strip: content
  std::shared_ptr<Regex> regex;  // Replace with a Regex pattern
  int start = 0, stop = 0;       // Strip
  std::string replacement;       // Metaspace
  bool prepend = true;           // Metaspace: prepend_scheme != never
  std::vector<Decoder> steps;    // Sequence
};
void decode_chain(const Decoder& d, std::vector<std::string>& tokens);

// ---- post-processor (single sequences) ----
struct Template {
  bool present = false;                // TemplateProcessing: otherwise ids pass through
  std::vector<int32_t> before, after;  // special ids around sequence A
};

// ---- the whole pipeline ----
struct Model {
  std::string source;               // file name for messages
  std::vector<std::string> tokens;  // id -> token as the file spells it ("" for holes)
  std::vector<std::string> bytes;   // byte_level: id -> raw bytes it decodes to
  FlatMap token_ids;                // token (as spelt) -> id, added tokens included
  std::vector<uint8_t> special;     // id -> special added token
  std::vector<AddedToken> added;
  AddedMatcher added_raw, added_normalized;
  std::unique_ptr<Normalizer> normalizer;
  std::vector<PreTokenizer> pre;  // Sequence flattened
  Bpe bpe;
  std::unique_ptr<Decoder> decoder;
  Template post;
  int32_t bos = -1, eos = -1;
  // What the GGUF writer needs to know of the pipeline.
  std::vector<std::pair<std::string, std::string>> merges;  // as spelt, in rank order
  std::string split_regex;  // the Split pre-tokenizer's pattern, if any

  std::vector<int32_t> encode(std::string_view text, bool add_special) const;
  std::string decode(const int32_t* ids, size_t n, bool skip_special) const;
  void finish();  // builds the matchers and lookup tables after loading
};

// Fills the id tables, the BPE units and the merge table from the vocabulary
// (token as spelt, id) and m.merges, m.added; unk: the unknown token or "".
void build_vocab(Model& m, const std::vector<std::pair<std::string, int64_t>>& vocab,
                 const std::string& unk);
std::unique_ptr<Model> load_json(std::string_view json, std::string_view config,
                                 const std::string& what);

}  // namespace kiln::tok
