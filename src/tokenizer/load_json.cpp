// Reads a Hugging Face tokenizer.json (and tokenizer_config.json) into a Model.
// Every component kiln does not implement is refused with an error naming it.
#include <nlohmann/json.hpp>

#include <algorithm>

#include "kiln/error.h"
#include "tokenizer/model.h"
#include "tokenizer/utf8.h"

namespace kiln::tok {

namespace {

using json = nlohmann::json;

// Context for messages: "[tokenizer] <file>: <component>: ...".
struct Ctx {
  const std::string& what;
  [[noreturn]] void error(const std::string& where, const std::string& msg) const {
    fail("tokenizer", what, ": ", where, ": ", msg);
  }
  const json& field(const json& o, const char* key, const std::string& where) const {
    if (!o.is_object()) error(where, "is not a JSON object");
    auto it = o.find(key);
    if (it == o.end()) error(where, std::string("has no '") + key + "'");
    return *it;
  }
  std::string str(const json& o, const char* key, const std::string& where) const {
    const json& v = field(o, key, where);
    if (!v.is_string()) error(where, std::string("'") + key + "' is not a string");
    return v.get<std::string>();
  }
  bool flag(const json& o, const char* key, bool dflt, const std::string& where) const {
    auto it = o.find(key);
    if (it == o.end() || it->is_null()) return dflt;
    if (!it->is_boolean()) error(where, std::string("'") + key + "' is not a boolean");
    return it->get<bool>();
  }
  int64_t integer(const json& o, const char* key, int64_t dflt, const std::string& where) const {
    auto it = o.find(key);
    if (it == o.end() || it->is_null()) return dflt;
    if (!it->is_number_integer()) error(where, std::string("'") + key + "' is not an integer");
    return it->get<int64_t>();
  }
  std::string type(const json& o, const std::string& where) const { return str(o, "type", where); }
};

// A Split/Replace "pattern": {"Regex": "..."} or {"String": "..."}.
void read_pattern(const Ctx& c, const json& o, const std::string& where,
                  std::shared_ptr<Regex>& regex, std::string& literal) {
  const json& p = c.field(o, "pattern", where);
  if (p.is_object() && p.contains("Regex") && p["Regex"].is_string())
    regex = std::make_shared<Regex>(p["Regex"].get<std::string>(), c.what + ": " + where);
  else if (p.is_object() && p.contains("String") && p["String"].is_string())
    literal = p["String"].get<std::string>();
  else c.error(where, "pattern is neither {\"Regex\": ...} nor {\"String\": ...}");
}

// Parses tokenizer.json into a DOM, except the two large parts: model.vocab and
// model.merges go straight into vectors (a DOM of a 9 MB Llama-3 file's
// 128k-entry vocabulary and 280k merges takes most of a second to build).
struct Collector {
  json dom_root;
  nlohmann::detail::json_sax_dom_parser<json> dom{dom_root, true};
  std::vector<std::pair<std::string, int64_t>> vocab;
  std::vector<std::pair<std::string, std::string>> merges;
  bool have_vocab = false, have_merges = false;
  std::string bad;  // what was wrong inside vocab or merges
  // Path: the key under which each open container sits ("" in arrays).
  std::vector<std::string> keys;
  std::string pending_key;
  enum Mode { Dom, Vocab, Merges, MergePair } mode = Dom;
  std::vector<std::string> pair;

  bool at_model_field(const char* name) const {
    return keys.size() == 2 && keys[1] == "model" && pending_key == name;
  }
  bool null() { return mode == Dom ? dom.null() : fail_inside("null"); }
  bool boolean(bool v) { return mode == Dom ? dom.boolean(v) : fail_inside("a boolean"); }
  bool number_integer(int64_t v) {
    if (mode == Vocab) {
      vocab.emplace_back(std::move(pending_key), v);
      return true;
    }
    return mode == Dom ? dom.number_integer(v) : fail_inside("a number");
  }
  bool number_unsigned(uint64_t v) {
    if (mode == Vocab) {
      if (v > uint64_t(INT32_MAX)) return fail_inside("an id beyond 2^31");
      vocab.emplace_back(std::move(pending_key), int64_t(v));
      return true;
    }
    return mode == Dom ? dom.number_unsigned(v) : fail_inside("a number");
  }
  bool number_float(double v, const std::string& s) {
    return mode == Dom ? dom.number_float(v, s) : fail_inside("a fractional number");
  }
  bool binary(json::binary_t& b) { return dom.binary(b); }
  bool string(std::string& v) {
    if (mode == Merges) {
      size_t sp = v.find(' ');
      if (sp == std::string::npos || v.find(' ', sp + 1) != std::string::npos)
        return fail_inside("merge number " + std::to_string(merges.size() + 1) + " '" + v +
                           "', which is not two tokens separated by one space");
      merges.emplace_back(v.substr(0, sp), v.substr(sp + 1));
      return true;
    }
    if (mode == MergePair) {
      pair.push_back(std::move(v));
      return pair.size() <= 2 || fail_inside("a merge of more than two tokens");
    }
    return mode == Dom ? dom.string(v) : fail_inside("a string where an id belongs");
  }
  bool key(std::string& k) {
    pending_key = k;
    return mode == Dom ? dom.key(k) : true;
  }
  bool start_object(size_t n) {
    if (mode == Dom && at_model_field("vocab")) {
      mode = Vocab;
      have_vocab = true;
      return true;
    }
    if (mode != Dom) return fail_inside("an object");
    keys.push_back(pending_key);
    pending_key.clear();
    return dom.start_object(n);
  }
  bool end_object() {
    if (mode == Vocab) {
      mode = Dom;
      return dom.null();
    }
    keys.pop_back();
    return dom.end_object();
  }
  bool start_array(size_t n) {
    if (mode == Dom && at_model_field("merges")) {
      mode = Merges;
      have_merges = true;
      return true;
    }
    if (mode == Merges) {
      mode = MergePair;
      pair.clear();
      return true;
    }
    if (mode != Dom) return fail_inside("an array");
    keys.push_back(pending_key);
    pending_key.clear();
    return dom.start_array(n);
  }
  bool end_array() {
    if (mode == MergePair) {
      if (pair.size() != 2) return fail_inside("a merge that is not two tokens");
      merges.emplace_back(std::move(pair[0]), std::move(pair[1]));
      mode = Merges;
      return true;
    }
    if (mode == Merges) {
      mode = Dom;
      return dom.null();
    }
    keys.pop_back();
    return dom.end_array();
  }
  bool parse_error(size_t pos, const std::string& tok, const nlohmann::detail::exception& e) {
    return dom.parse_error(pos, tok, e);
  }
  bool fail_inside(const std::string& what) {
    bad = std::string(mode == Vocab ? "model.vocab" : "model.merges") + " holds " + what;
    return false;
  }
};

Normalizer read_normalizer(const Ctx& c, const json& o) {
  std::string t = c.type(o, "normalizer");
  std::string where = "normalizer '" + t + "'";
  Normalizer n{Normalizer::Sequence};
  if (t == "NFC") n.kind = Normalizer::NFC;
  else if (t == "NFD") n.kind = Normalizer::NFD;
  else if (t == "NFKC") n.kind = Normalizer::NFKC;
  else if (t == "NFKD") n.kind = Normalizer::NFKD;
  else if (t == "Lowercase") n.kind = Normalizer::Lowercase;
  else if (t == "Strip") {
    n.kind = Normalizer::Strip;
    n.strip_left = c.flag(o, "strip_left", true, where);
    n.strip_right = c.flag(o, "strip_right", true, where);
  } else if (t == "Prepend") {
    n.kind = Normalizer::Prepend;
    n.text = c.str(o, "prepend", where);
  } else if (t == "Replace") {
    n.kind = Normalizer::Replace;
    read_pattern(c, o, where, n.regex, n.literal);
    n.text = c.str(o, "content", where);
  } else if (t == "Sequence") {
    const json& list = c.field(o, "normalizers", where);
    if (!list.is_array()) c.error(where, "'normalizers' is not an array");
    for (const json& s : list) n.steps.push_back(read_normalizer(c, s));
  } else {
    c.error(where,
            "is not supported (kiln has NFC, NFD, NFKC, NFKD, Lowercase, Strip, Prepend, Replace, "
            "Sequence)");
  }
  return n;
}

SplitBehavior read_behavior(const Ctx& c, const json& o, const std::string& where) {
  auto it = o.find("behavior");
  if (it == o.end() || it->is_null()) return SplitBehavior::Isolated;
  std::string b = it->is_string() ? it->get<std::string>() : "";
  if (b == "Removed") return SplitBehavior::Removed;
  if (b == "Isolated") return SplitBehavior::Isolated;
  if (b == "MergedWithPrevious") return SplitBehavior::MergedWithPrevious;
  if (b == "MergedWithNext") return SplitBehavior::MergedWithNext;
  if (b == "Contiguous") return SplitBehavior::Contiguous;
  c.error(where, "unknown behavior '" + b + "'");
}

PreTokenizer::Prepend read_prepend(const Ctx& c, const json& o, const std::string& where) {
  auto it = o.find("prepend_scheme");
  if (it != o.end() && !it->is_null()) {
    std::string s = it->is_string() ? it->get<std::string>() : "";
    if (s == "always") return PreTokenizer::Always;
    if (s == "first") return PreTokenizer::First;
    if (s == "never") return PreTokenizer::Never;
    c.error(where, "unknown prepend_scheme '" + s + "'");
  }
  return c.flag(o, "add_prefix_space", true, where) ? PreTokenizer::Always : PreTokenizer::Never;
}

void read_pre_tokenizer(const Ctx& c, const json& o, Model& m) {
  std::string t = c.type(o, "pre_tokenizer");
  std::string where = "pre_tokenizer '" + t + "'";
  PreTokenizer p{PreTokenizer::Split};
  if (t == "Sequence") {
    const json& list = c.field(o, "pretokenizers", where);
    if (!list.is_array()) c.error(where, "'pretokenizers' is not an array");
    for (const json& s : list) read_pre_tokenizer(c, s, m);
    return;
  }
  if (t == "Split") {
    read_pattern(c, o, where, p.regex, p.literal);
    p.behavior = read_behavior(c, o, where);
    p.invert = c.flag(o, "invert", false, where);
    if (p.regex && m.split_regex.empty()) m.split_regex = p.regex->pattern();
  } else if (t == "ByteLevel") {
    p.kind = PreTokenizer::ByteLevel;
    p.add_prefix_space = c.flag(o, "add_prefix_space", true, where);
    if (c.flag(o, "use_regex", true, where))
      p.regex = std::make_shared<Regex>(kGpt2ByteLevelPattern, c.what + ": " + where);
    m.bpe.byte_level = true;
  } else if (t == "Metaspace") {
    p.kind = PreTokenizer::Metaspace;
    p.replacement = c.str(o, "replacement", where);
    p.prepend = read_prepend(c, o, where);
    p.metaspace_split = c.flag(o, "split", true, where);
  } else if (t == "Digits") {
    p.kind = PreTokenizer::Digits;
    p.individual_digits = c.flag(o, "individual_digits", false, where);
  } else if (t == "Punctuation") {
    p.kind = PreTokenizer::Punctuation;
    p.behavior = read_behavior(c, o, where);
  } else if (t == "Whitespace") {
    p.kind = PreTokenizer::Whitespace;
    p.regex = std::make_shared<Regex>(R"(\w+|[^\w\s]+)", c.what + ": " + where);
  } else if (t == "WhitespaceSplit") {
    p.kind = PreTokenizer::WhitespaceSplit;
  } else {
    c.error(where,
            "is not supported (kiln has Sequence, Split, ByteLevel, Metaspace, Digits, "
            "Punctuation, Whitespace, "
            "WhitespaceSplit)");
  }
  // Byte-level BPE matches raw bytes, so the byte-to-character mapping must be
  // the last step (it is in every byte-level tokenizer.json).
  if (!m.pre.empty() && m.pre.back().kind == PreTokenizer::ByteLevel)
    c.error(where,
            "follows a ByteLevel pre-tokenizer; kiln needs ByteLevel to be the last pre-tokenizer");
  m.pre.push_back(std::move(p));
}

Decoder read_decoder(const Ctx& c, const json& o) {
  std::string t = c.type(o, "decoder");
  std::string where = "decoder '" + t + "'";
  Decoder d{Decoder::Sequence};
  if (t == "ByteLevel") d.kind = Decoder::ByteLevel;
  else if (t == "ByteFallback") d.kind = Decoder::ByteFallback;
  else if (t == "Fuse") d.kind = Decoder::Fuse;
  else if (t == "Metaspace") {
    d.kind = Decoder::Metaspace;
    d.replacement = c.str(o, "replacement", where);
    d.prepend = read_prepend(c, o, where) != PreTokenizer::Never;
  } else if (t == "Strip") {
    d.kind = Decoder::Strip;
    d.content = c.str(o, "content", where);
    d.start = int(c.integer(o, "start", 0, where));
    d.stop = int(c.integer(o, "stop", 0, where));
  } else if (t == "Replace") {
    d.kind = Decoder::Replace;
    read_pattern(c, o, where, d.regex, d.literal);
    d.content = c.str(o, "content", where);
  } else if (t == "Sequence") {
    const json& list = c.field(o, "decoders", where);
    if (!list.is_array()) c.error(where, "'decoders' is not an array");
    for (const json& s : list) d.steps.push_back(read_decoder(c, s));
  } else {
    c.error(where,
            "is not supported (kiln has ByteLevel, Metaspace, ByteFallback, Fuse, Strip, Replace, "
            "Sequence)");
  }
  return d;
}

void read_post(const Ctx& c, const json& o, Model& m) {
  std::string t = c.type(o, "post_processor");
  std::string where = "post_processor '" + t + "'";
  if (t == "ByteLevel") return;  // offsets only: the ids pass through
  if (t == "Sequence") {
    const json& list = c.field(o, "processors", where);
    if (!list.is_array()) c.error(where, "'processors' is not an array");
    for (const json& s : list) read_post(c, s, m);
    return;
  }
  if (t != "TemplateProcessing")
    c.error(where, "is not supported (kiln has TemplateProcessing, ByteLevel, Sequence)");
  if (m.post.present) c.error(where, "a second TemplateProcessing");
  m.post.present = true;
  const json& single = c.field(o, "single", where);
  const json& specials = c.field(o, "special_tokens", where);
  if (!single.is_array()) c.error(where, "'single' is not an array");
  bool seen_a = false;
  for (const json& item : single) {
    if (item.is_object() && item.contains("Sequence")) {
      seen_a = true;
      continue;
    }
    if (!item.is_object() || !item.contains("SpecialToken"))
      c.error(where, "'single' holds an item that is neither SpecialToken nor Sequence");
    std::string name = c.str(item["SpecialToken"], "id", where + " SpecialToken");
    const json& st = c.field(specials, name.c_str(), where + " special_tokens");
    const json& ids = c.field(st, "ids", where + " special token '" + name + "'");
    if (!ids.is_array()) c.error(where, "special token '" + name + "' ids is not an array");
    for (const json& id : ids) {
      if (!id.is_number_integer())
        c.error(where, "special token '" + name + "' has a non-integer id");
      (seen_a ? m.post.after : m.post.before).push_back(int32_t(id.get<int64_t>()));
    }
  }
}

// bos_token / eos_token of tokenizer_config.json: a string or {"content": ...}.
std::string config_token(const json& cfg, const char* key) {
  auto it = cfg.find(key);
  if (it == cfg.end()) return {};
  if (it->is_string()) return it->get<std::string>();
  if (it->is_object() && it->contains("content") && (*it)["content"].is_string())
    return (*it)["content"].get<std::string>();
  return {};
}

void read_model(const Ctx& c, const json& o, Collector& col, Model& m,
                std::vector<std::pair<std::string, int64_t>>& vocab) {
  std::string where = "model";
  if (o.contains("type")) {
    std::string t = c.type(o, where);
    if (t != "BPE") c.error("model '" + t + "'", "is not supported (kiln has BPE)");
  }
  where = "model 'BPE'";
  if (!col.have_vocab) c.error(where, "has no 'vocab' object");
  if (!col.have_merges) c.error(where, "has no 'merges' array");
  vocab = std::move(col.vocab);
  m.merges = std::move(col.merges);
  m.bpe.byte_fallback = c.flag(o, "byte_fallback", false, where);
  m.bpe.fuse_unk = c.flag(o, "fuse_unk", false, where);
  m.bpe.ignore_merges = c.flag(o, "ignore_merges", false, where);
  auto dropout = o.find("dropout");
  if (dropout != o.end() && !dropout->is_null() &&
      !(dropout->is_number() && dropout->get<double>() == 0))
    c.error(where, "dropout is not supported (encoding would not be deterministic)");
  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"}) {
    auto it = o.find(key);
    if (it != o.end() && !it->is_null() && !(it->is_string() && it->get<std::string>().empty()))
      c.error(where, std::string(key) + " is not supported");
  }
}

}  // namespace

std::unique_ptr<Model> load_json(std::string_view text, std::string_view config,
                                 const std::string& what) {
  auto m = std::make_unique<Model>();
  m->source = what;
  Ctx c{what};
  Collector col;
  json cfg;
  try {
    bool ok = json::sax_parse(text, &col);
    if (!ok)
      fail("tokenizer", what, ": ", col.bad.empty() ? std::string("not valid JSON") : col.bad);
    if (!config.empty()) cfg = json::parse(config);
  } catch (const json::exception& e) {
    fail("tokenizer", what, ": not valid JSON: ", e.what());
  }
  json& j = col.dom_root;
  if (!j.is_object()) fail("tokenizer", what, ": not a JSON object");
  try {
    std::vector<std::pair<std::string, int64_t>> vocab;
    const json& model = c.field(j, "model", "top level");
    read_model(c, model, col, *m, vocab);
    if (j.contains("normalizer") && !j["normalizer"].is_null())
      m->normalizer = std::make_unique<Normalizer>(read_normalizer(c, j["normalizer"]));
    if (j.contains("pre_tokenizer") && !j["pre_tokenizer"].is_null())
      read_pre_tokenizer(c, j["pre_tokenizer"], *m);
    if (j.contains("post_processor") && !j["post_processor"].is_null())
      read_post(c, j["post_processor"], *m);
    if (j.contains("decoder") && !j["decoder"].is_null())
      m->decoder = std::make_unique<Decoder>(read_decoder(c, j["decoder"]));
    if (j.contains("added_tokens")) {
      const json& list = j["added_tokens"];
      if (!list.is_array()) c.error("added_tokens", "is not an array");
      for (const json& a : list) {
        AddedToken t;
        t.content = c.str(a, "content", "added_tokens");
        int64_t id = c.integer(a, "id", -1, "added token '" + t.content + "'");
        if (id < 0 || id > INT32_MAX) c.error("added token '" + t.content + "'", "has no valid id");
        t.id = int32_t(id);
        std::string w = "added token '" + t.content + "'";
        t.special = c.flag(a, "special", false, w);
        t.lstrip = c.flag(a, "lstrip", false, w);
        t.rstrip = c.flag(a, "rstrip", false, w);
        t.normalized = c.flag(a, "normalized", !t.special, w);
        t.single_word = c.flag(a, "single_word", false, w);
        if (t.content.empty()) c.error(w, "is empty");
        m->added.push_back(std::move(t));
      }
    }
    std::string unk;
    if (model.contains("unk_token") && model["unk_token"].is_string())
      unk = model["unk_token"].get<std::string>();
    build_vocab(*m, vocab, unk);
    if (cfg.is_object()) {
      for (auto [key, slot] : {std::pair{"bos_token", &m->bos}, std::pair{"eos_token", &m->eos}}) {
        std::string name = config_token(cfg, key);
        if (name.empty()) continue;
        int64_t id = m->token_ids.get(name);
        if (id < 0)
          c.error("tokenizer_config.json", std::string(key) + " '" + name + "' is not a token");
        *slot = int32_t(id);
      }
    }
  } catch (const json::exception& e) {
    fail("tokenizer", what, ": ", e.what());
  }
  if (m->decoder && m->bpe.byte_level && m->decoder->kind != Decoder::ByteLevel)
    fail("tokenizer", what,
         ": a byte-level pre-tokenizer needs the ByteLevel decoder; kiln does not combine it with ",
         "the decoders given");
  return m;
}

}  // namespace kiln::tok
