// kiln::Tokenizer: encode (added tokens, normalizer, pre-tokenizers, BPE,
// post-processor), decode, streaming decode and batch encoding.
#include "kiln/tokenizer.h"

#include <atomic>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "kiln/error.h"
#include "tokenizer/model.h"
#include "tokenizer/utf8.h"

namespace kiln {

namespace tok {

std::vector<int32_t> Model::encode(std::string_view text, bool add_special) const {
  std::string fixed;
  if (valid_utf8_prefix(text) != text.size()) {
    fixed = repair_utf8(text);
    text = fixed;
  }
  std::vector<int32_t> out;
  out.reserve(text.size() / 3 + 4);
  if (add_special) out.insert(out.end(), post.before.begin(), post.before.end());
  std::vector<Section> sections, inner;
  if (added_raw.empty()) sections.push_back({text, -1, 0});
  else split_added(added_raw, text, sections);
  Pieces p;
  std::string norm;
  for (const Section& s : sections) {
    if (s.id >= 0) {
      out.push_back(s.id);
      continue;
    }
    std::string_view view = s.text;
    if (normalizer) {
      norm = normalize(*normalizer, std::string(s.text));
      view = norm;
    }
    inner.clear();
    if (added_normalized.empty()) inner.push_back({view, -1, 0});
    else split_added(added_normalized, view, inner);
    for (const Section& in : inner) {
      if (in.id >= 0) {
        out.push_back(in.id);
        continue;
      }
      p.views.assign(1, in.text);
      p.arena.clear();
      pre_tokenize(pre, p, s.offset == 0 && in.offset == 0);
      for (std::string_view piece : p.views) bpe.tokenize(piece, out);
    }
  }
  if (add_special) out.insert(out.end(), post.after.begin(), post.after.end());
  return out;
}

std::string Model::decode(const int32_t* ids, size_t n, bool skip_special) const {
  for (size_t k = 0; k < n; ++k)
    if (ids[k] < 0 || size_t(ids[k]) >= tokens.size())
      fail("tokenizer", "decode: id ", ids[k], " is outside the vocabulary [0, ", tokens.size(),
           ")");
  if (bpe.byte_level) {
    std::string raw;
    for (size_t k = 0; k < n; ++k)
      if (!(skip_special && special[size_t(ids[k])])) raw += bytes[size_t(ids[k])];
    return repair_utf8(raw);
  }
  std::vector<std::string> toks;
  toks.reserve(n);
  for (size_t k = 0; k < n; ++k)
    if (!(skip_special && special[size_t(ids[k])])) toks.push_back(tokens[size_t(ids[k])]);
  if (decoder) decode_chain(*decoder, toks);
  std::string out;
  for (const std::string& t : toks) out += t;
  return out;
}

}  // namespace tok

namespace {

std::string read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) fail("tokenizer", "cannot open ", path);
  std::ostringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

}  // namespace

Tokenizer::Tokenizer(std::unique_ptr<tok::Model> m) : m_(std::move(m)) {}
Tokenizer::Tokenizer(Tokenizer&&) noexcept = default;
Tokenizer& Tokenizer::operator=(Tokenizer&&) noexcept = default;
Tokenizer::~Tokenizer() = default;

Tokenizer Tokenizer::load(const std::string& path) {
  namespace fs = std::filesystem;
  std::string json_path = path, config;
  if (fs::is_directory(path)) {
    json_path = (fs::path(path) / "tokenizer.json").string();
    if (!fs::exists(json_path)) fail("tokenizer", path, " has no tokenizer.json");
    fs::path cfg = fs::path(path) / "tokenizer_config.json";
    if (fs::exists(cfg)) config = read_file(cfg.string());
  } else if (!fs::exists(path)) {
    fail("tokenizer", path, " does not exist");
  } else {
    fs::path cfg = fs::path(path).parent_path() / "tokenizer_config.json";
    if (fs::exists(cfg)) config = read_file(cfg.string());
  }
  return from_json(read_file(json_path), config, json_path);
}

Tokenizer Tokenizer::from_json(std::string_view tokenizer_json, std::string_view config_json,
                               const std::string& what) {
  return Tokenizer(tok::load_json(tokenizer_json, config_json, what));
}

std::vector<int32_t> Tokenizer::encode(std::string_view text, bool add_special_tokens) const {
  return m_->encode(text, add_special_tokens);
}

std::vector<std::vector<int32_t>> Tokenizer::encode_batch(std::span<const std::string> texts,
                                                          bool add_special_tokens,
                                                          int threads) const {
  std::vector<std::vector<int32_t>> out(texts.size());
  size_t n = threads > 0 ? size_t(threads) : std::max(1u, std::thread::hardware_concurrency());
  n = std::min(n, texts.size());
  if (n <= 1) {
    for (size_t k = 0; k < texts.size(); ++k) out[k] = encode(texts[k], add_special_tokens);
    return out;
  }
  std::atomic<size_t> next{0};
  std::exception_ptr error;
  std::atomic<bool> failed{false};
  auto work = [&] {
    try {
      for (size_t k; (k = next++) < texts.size() && !failed;)
        out[k] = encode(texts[k], add_special_tokens);
    } catch (...) {
      if (!failed.exchange(true)) error = std::current_exception();
    }
  };
  std::vector<std::thread> pool;
  for (size_t t = 1; t < n; ++t) pool.emplace_back(work);
  work();
  for (auto& t : pool) t.join();
  if (error) std::rethrow_exception(error);
  return out;
}

std::string Tokenizer::decode(std::span<const int32_t> ids, bool skip_special_tokens) const {
  return m_->decode(ids.data(), ids.size(), skip_special_tokens);
}

int64_t Tokenizer::vocab_size() const { return int64_t(m_->tokens.size()); }

std::optional<int32_t> Tokenizer::token_to_id(std::string_view token) const {
  int64_t id = m_->token_ids.get(token);
  if (id < 0) return std::nullopt;
  return int32_t(id);
}

const std::string& Tokenizer::id_to_token(int32_t id) const {
  if (id < 0 || id >= vocab_size())
    fail("tokenizer", "id_to_token: id ", id, " is outside the vocabulary [0, ", vocab_size(), ")");
  return m_->tokens[size_t(id)];
}

bool Tokenizer::is_special(int32_t id) const {
  return id >= 0 && id < vocab_size() && m_->special[size_t(id)] != 0;
}

std::optional<int32_t> Tokenizer::bos_id() const {
  return m_->bos >= 0 ? std::optional<int32_t>(m_->bos) : std::nullopt;
}
std::optional<int32_t> Tokenizer::eos_id() const {
  return m_->eos >= 0 ? std::optional<int32_t>(m_->eos) : std::nullopt;
}
std::optional<int32_t> Tokenizer::unk_id() const {
  return m_->bpe.unk_id >= 0 ? std::optional<int32_t>(m_->bpe.unk_id) : std::nullopt;
}

// ---- streaming decode ----
// Hugging Face's DecodeStream: decode a short window of ids (the last emitted
// token as context, so decoders that strip the first token's space see the
// same text as a full decode) and emit what it adds to the window's prefix,
// unless it ends in U+FFFD (a character whose bytes have not all arrived).

StreamDecoder::StreamDecoder(const Tokenizer& tok, bool skip_special_tokens)
    : tok_(&tok), skip_special_(skip_special_tokens) {}

namespace {
bool ends_incomplete(const std::string& s) {
  return s.size() >= 3 && s.compare(s.size() - 3, 3, "\xEF\xBF\xBD") == 0;
}
}  // namespace

std::string StreamDecoder::push(int32_t id) {
  ids_.push_back(id);
  std::string s = tok_->decode(ids_, skip_special_);
  if (s.size() <= prefix_.size() || ends_incomplete(s)) return {};
  std::string fresh = s.substr(prefix_.size());
  size_t new_index = ids_.size() - prefix_index_;
  ids_.erase(ids_.begin(), ids_.begin() + std::ptrdiff_t(prefix_index_));
  prefix_ = tok_->decode(ids_, skip_special_);
  prefix_index_ = new_index;
  return fresh;
}

std::string StreamDecoder::flush() {
  std::string s = tok_->decode(ids_, skip_special_);
  std::string rest = s.size() > prefix_.size() ? s.substr(prefix_.size()) : std::string();
  ids_.clear();
  prefix_.clear();
  prefix_index_ = 0;
  return rest;
}

}  // namespace kiln
