// GGUF vocabularies: llama.cpp's tokenizer.ggml.* keys. "gpt2" is byte-level
// BPE with the pre-tokenizer regex that tokenizer.ggml.pre names; "llama" is
// SentencePiece-style BPE (spaces as U+2581, byte fallback), with its merges
// from tokenizer.ggml.merges or, when absent, from the scores as SentencePiece
// ranks them (the pair whose merged piece scores highest merges first).
#include <algorithm>
#include <numeric>

#include "kiln/error.h"
#include "kiln/io.h"
#include "kiln/tokenizer.h"
#include "tokenizer/model.h"
#include "tokenizer/utf8.h"

namespace kiln {

namespace {

using tok::Decoder;
using tok::Model;
using tok::Normalizer;
using tok::PreTokenizer;

constexpr const char* kMeta = "\xE2\x96\x81";  // U+2581, SentencePiece's space

// How each tokenizer.ggml.pre name splits text before byte-level BPE: the
// pre-tokenizer steps of the tokenizer.json files llama.cpp's converter gives
// that name. Canonical names first (the writer writes the first entry whose
// steps equal a tokenizer's), then the converter's other names for the same
// steps (DeepSeek-R1's Qwen distills keep Qwen2's tokenizer; Smaug's is Llama 3's).
struct PreEntry {
  const char* name;
  const char* pattern;     // the Split regex; nullptr: GPT-2's regex inside ByteLevel
  bool keep_matches_only;  // Split with behavior Removed, inverted (o200k's form)
  bool digits_first;       // a Digits step (each digit its own piece) before ByteLevel
  bool ignore_merges, nfc;
};
const char* const kLlama3Split =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
const char* const kQwen2Split =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
const char* const kTekkenSplit =
    R"([^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
const char* const kGpt4oSplit =
    R"([^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
const PreEntry kPre[] = {
    // name                pattern       matches  digits ignore_merges nfc
    {"llama-bpe", kLlama3Split, false, false, true, false},
    {"qwen2", kQwen2Split, false, false, false, true},
    {"tekken", kTekkenSplit, false, false, true, false},
    {"gpt-4o", kGpt4oSplit, true, false, false, false},
    {"smollm", nullptr, false, true, false, false},
    {"gpt-2", nullptr, false, false, false, false},
    // other names for the same steps
    {"default", nullptr, false, false, false, false},
    {"smaug-bpe", kLlama3Split, false, false, true, false},
    {"deepseek-r1-qwen", kQwen2Split, false, false, false, true},
};

std::vector<PreTokenizer> pre_steps(const PreEntry& e, const std::string& where) {
  std::vector<PreTokenizer> steps;
  if (e.pattern) {
    PreTokenizer s{PreTokenizer::Split};
    s.regex = std::make_shared<tok::Regex>(e.pattern, where);
    if (e.keep_matches_only) {
      s.behavior = tok::SplitBehavior::Removed;
      s.invert = true;
    }
    steps.push_back(std::move(s));
  }
  if (e.digits_first) {
    PreTokenizer d{PreTokenizer::Digits};
    d.individual_digits = true;
    steps.push_back(std::move(d));
  }
  PreTokenizer bl{PreTokenizer::ByteLevel};
  if (!e.pattern) bl.regex = std::make_shared<tok::Regex>(tok::kGpt2ByteLevelPattern, where);
  steps.push_back(std::move(bl));
  return steps;
}

// Whether two pre-tokenizer step lists split every text the same way (what a
// GGUF name can say: the fields byte-level tokenizers use).
bool same_steps(const std::vector<PreTokenizer>& a, const std::vector<PreTokenizer>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    const PreTokenizer &x = a[i], &y = b[i];
    std::string px = x.regex ? x.regex->pattern() : "", py = y.regex ? y.regex->pattern() : "";
    if (x.kind != y.kind || px != py || x.literal != y.literal || x.behavior != y.behavior ||
        x.invert != y.invert || x.add_prefix_space != y.add_prefix_space ||
        x.individual_digits != y.individual_digits)
      return false;
  }
  return true;
}

std::string pre_names() {
  std::string s;
  for (const PreEntry& e : kPre) s += (s.empty() ? "" : ", ") + std::string(e.name);
  return s;
}

enum TokenType {
  kNormal = 1,
  kUnknown = 2,
  kControl = 3,
  kUserDefined = 4,
  kUnused = 5,
  kByte = 6
};

[[noreturn]] void gguf_fail(const GgufFile& f, const std::string& msg) {
  fail("tokenizer", f.path(), ": ", msg);
}

int32_t id_key(const GgufFile& f, const char* key, size_t n) {
  const GgufValue* v = f.find(key);
  if (!v) return -1;
  int64_t id = v->as_int();
  if (id < 0 || size_t(id) >= n)
    gguf_fail(f, std::string(key) + " = " + std::to_string(id) + " is not a token id");
  return int32_t(id);
}

bool flag_key(const GgufFile& f, const char* key, bool dflt) {
  const GgufValue* v = f.find(key);
  return v ? v->as_bool() : dflt;
}

}  // namespace

Tokenizer Tokenizer::from_gguf(const GgufFile& f) {
  auto m = std::make_unique<Model>();
  m->source = f.path();
  std::string kind = f.get("tokenizer.ggml.model").as_string();
  const std::vector<std::string>& tokens = f.get("tokenizer.ggml.tokens").as_strings();
  size_t n = tokens.size();
  std::vector<int64_t> types(n, kNormal);
  if (const GgufValue* t = f.find("tokenizer.ggml.token_type")) {
    types = t->as_ints();
    if (types.size() != n)
      gguf_fail(f, "tokenizer.ggml.token_type has " + std::to_string(types.size()) +
                       " entries for " + std::to_string(n) + " tokens");
  }
  std::vector<std::pair<std::string, int64_t>> vocab;
  vocab.reserve(n);
  for (size_t i = 0; i < n; ++i) {
    vocab.emplace_back(tokens[i], int64_t(i));
    // Control and unknown tokens are special added tokens, as in the
    // tokenizer.json files these vocabularies are converted from.
    if (types[i] == kControl || types[i] == kUnknown || types[i] == kUserDefined) {
      tok::AddedToken a;
      a.content = tokens[i];
      a.id = int32_t(i);
      a.special = types[i] != kUserDefined;
      if (!a.content.empty()) m->added.push_back(std::move(a));
    }
  }
  if (const GgufValue* mg = f.find("tokenizer.ggml.merges")) {
    for (const std::string& line : mg->as_strings()) {
      size_t sp = line.find(' ', 1);
      if (sp == std::string::npos)
        gguf_fail(f, "merge '" + line + "' is not two tokens separated by a space");
      m->merges.emplace_back(line.substr(0, sp), line.substr(sp + 1));
    }
  }
  int32_t unk = id_key(f, "tokenizer.ggml.unknown_token_id", n);
  m->bos = id_key(f, "tokenizer.ggml.bos_token_id", n);
  m->eos = id_key(f, "tokenizer.ggml.eos_token_id", n);

  if (kind == "gpt2") {
    std::string pre =
        f.has("tokenizer.ggml.pre") ? f.get("tokenizer.ggml.pre").as_string() : "default";
    const PreEntry* e = nullptr;
    for (const PreEntry& p : kPre)
      if (pre == p.name) e = &p;
    if (!e)
      gguf_fail(f, "tokenizer.ggml.pre '" + pre + "' is not one kiln knows (" + pre_names() + ")");
    if (e->nfc) m->normalizer = std::make_unique<Normalizer>(Normalizer{Normalizer::NFC});
    m->pre = pre_steps(*e, f.path() + ": tokenizer.ggml.pre '" + pre + "'");
    if (e->pattern) m->split_regex = e->pattern;
    m->bpe.byte_level = true;
    m->bpe.ignore_merges = e->ignore_merges;
    m->decoder = std::make_unique<Decoder>(Decoder{Decoder::ByteLevel});
    if (m->merges.empty()) gguf_fail(f, "a gpt2 vocabulary needs tokenizer.ggml.merges");
  } else if (kind == "llama") {
    Normalizer prepend{Normalizer::Prepend}, replace{Normalizer::Replace};
    prepend.text = kMeta;
    replace.literal = " ";
    replace.text = kMeta;
    auto seq = std::make_unique<Normalizer>(Normalizer{Normalizer::Sequence});
    seq->steps = {prepend, replace};
    m->normalizer = std::move(seq);
    m->bpe.byte_fallback = true;
    m->bpe.fuse_unk = true;
    Decoder rep{Decoder::Replace}, strip{Decoder::Strip};
    rep.literal = kMeta;
    rep.content = " ";
    strip.content = " ";
    strip.start = 1;
    auto dec = std::make_unique<Decoder>(Decoder{Decoder::Sequence});
    dec->steps = {rep, Decoder{Decoder::ByteFallback}, Decoder{Decoder::Fuse}, strip};
    m->decoder = std::move(dec);
    if (m->merges.empty()) {
      // SentencePiece BPE: the merge producing the piece with the higher score first.
      const GgufValue* sc = f.find("tokenizer.ggml.scores");
      if (!sc)
        gguf_fail(f, "a llama vocabulary needs tokenizer.ggml.scores or tokenizer.ggml.merges");
      std::vector<double> scores = sc->as_floats();
      if (scores.size() != n)
        gguf_fail(f, "tokenizer.ggml.scores does not have one score per token");
      std::vector<size_t> order(n);
      std::iota(order.begin(), order.end(), 0);
      std::stable_sort(order.begin(), order.end(),
                       [&](size_t a, size_t b) { return scores[a] > scores[b]; });
      tok::FlatMap ids;
      for (size_t i = 0; i < n; ++i)
        if (types[i] == kNormal) ids.put(tokens[i], int64_t(i), false);
      for (size_t i : order) {
        const std::string& t = tokens[i];
        if (types[i] != kNormal) continue;
        for (size_t cut = tok::utf8_len(static_cast<unsigned char>(t[0])); cut < t.size();
             cut += tok::utf8_len(static_cast<unsigned char>(t[cut])))
          if (ids.get(std::string_view(t).substr(0, cut)) >= 0 &&
              ids.get(std::string_view(t).substr(cut)) >= 0)
            m->merges.emplace_back(t.substr(0, cut), t.substr(cut));
      }
    }
  } else {
    gguf_fail(f, "tokenizer.ggml.model '" + kind + "' is not supported (kiln has gpt2 and llama)");
  }
  if (flag_key(f, "tokenizer.ggml.add_bos_token", kind == "llama") && m->bos >= 0)
    m->post.before = {m->bos};
  if (flag_key(f, "tokenizer.ggml.add_eos_token", false) && m->eos >= 0) m->post.after = {m->eos};
  m->post.present = !m->post.before.empty() || !m->post.after.empty();
  tok::build_vocab(*m, vocab, unk >= 0 ? tokens[size_t(unk)] : std::string());
  return Tokenizer(std::move(m));
}

void Tokenizer::write_gguf_vocab(GgufWriter& w) const {
  const Model& m = *m_;
  auto refuse = [&](const std::string& why) {
    fail("tokenizer", m.source, ": cannot write a GGUF vocabulary: ", why);
  };
  std::string kind, pre;
  if (m.bpe.byte_level) {
    kind = "gpt2";
    bool nfc = m.normalizer && m.normalizer->kind == Normalizer::NFC;
    if (m.normalizer && !nfc) refuse("its normalizer has no GGUF equivalent");
    for (const PreEntry& e : kPre) {
      if (e.ignore_merges == m.bpe.ignore_merges && e.nfc == nfc &&
          same_steps(m.pre, pre_steps(e, m.source))) {
        pre = e.name;
        break;
      }
    }
    if (pre.empty())
      refuse("its pre-tokenizer is none of those the tokenizer.ggml.pre names stand for (" +
             pre_names() + ")");
  } else {
    kind = "llama";
    if (!m.pre.empty() || !m.bpe.byte_fallback)
      refuse("only byte-level or SentencePiece-style (byte fallback) BPE");
  }
  std::vector<std::string> tokens = m.tokens;
  std::vector<int32_t> types(tokens.size(), kNormal);
  for (size_t i = 0; i < tokens.size(); ++i) {
    if (tokens[i].empty()) types[i] = kUnused;
    if (kind == "llama" && tokens[i].size() == 6 && tokens[i].compare(0, 3, "<0x") == 0)
      types[i] = kByte;
  }
  for (const tok::AddedToken& a : m.added)
    types[size_t(a.id)] = a.special ? kControl : kUserDefined;
  if (m.bpe.unk_id >= 0) types[size_t(m.bpe.unk_id)] = kUnknown;
  std::vector<std::string> merges;
  merges.reserve(m.merges.size());
  for (const auto& [a, b] : m.merges) {
    if (a.find(' ') != std::string::npos || b.find(' ') != std::string::npos)
      refuse("merge '" + a + "' '" + b + "' holds a space, which GGUF's \"a b\" form cannot");
    merges.push_back(a + " " + b);
  }
  w.set("tokenizer.ggml.model", kind);
  if (!pre.empty()) w.set("tokenizer.ggml.pre", pre);
  w.set("tokenizer.ggml.tokens", std::move(tokens));
  w.set("tokenizer.ggml.token_type", types);
  w.set("tokenizer.ggml.merges", std::move(merges));
  if (kind == "llama") {
    // SentencePiece scores: the merge order as descending scores.
    std::vector<float> scores(m.tokens.size(), 0.0f);
    for (size_t r = 0; r < m.merges.size(); ++r) {
      int64_t id = m.token_ids.get(m.merges[r].first + m.merges[r].second);
      if (id >= 0 && scores[size_t(id)] == 0.0f) scores[size_t(id)] = -float(r + 1);
    }
    w.set("tokenizer.ggml.scores", scores);
  }
  if (m.bos >= 0) w.set("tokenizer.ggml.bos_token_id", uint32_t(m.bos));
  if (m.eos >= 0) w.set("tokenizer.ggml.eos_token_id", uint32_t(m.eos));
  if (m.bpe.unk_id >= 0) w.set("tokenizer.ggml.unknown_token_id", uint32_t(m.bpe.unk_id));
  bool add_bos = m.post.before.size() == 1 && m.post.before[0] == m.bos;
  if (!m.post.before.empty() && !add_bos)
    refuse("its post-processor adds tokens other than BOS before the text");
  bool add_eos = m.post.after.size() == 1 && m.post.after[0] == m.eos;
  if (!m.post.after.empty() && !add_eos)
    refuse("its post-processor adds tokens other than EOS after the text");
  w.set("tokenizer.ggml.add_bos_token", add_bos);
  w.set("tokenizer.ggml.add_eos_token", add_eos);
}

}  // namespace kiln
