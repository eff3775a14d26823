// kiln::Tokenizer: the exact tokenizer of a pretrained model, read from a
// Hugging Face tokenizer.json (+ tokenizer_config.json) or from a GGUF file's
// tokenizer.ggml.* vocabulary. BPE models (byte-level like GPT-2, Llama-3 and
// Qwen, or SentencePiece-style like Llama-2 and Mistral with byte fallback).
//
//   kiln::Tokenizer tok = kiln::Tokenizer::load("data/tokenizers/llama3");  // dir or file
//   std::vector<int32_t> ids = tok.encode("Hello world", /*add_special_tokens=*/true);
//   std::string text = tok.decode(ids);
//   kiln::StreamDecoder stream(tok);           // generation: text as complete UTF-8
//   for (int32_t id : generated) std::cout << stream.push(id);
//
// What is supported, how invalid UTF-8 is handled and where kiln differs from
// the reference implementations: docs/tokenizer.md. Unsupported components of a
// tokenizer.json (another model type, a normalizer kiln lacks) are refused with
// a kiln::Error naming them, never skipped.
#pragma once
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace kiln {

class GgufWriter;
class GgufFile;

namespace tok {
struct Model;  // the loaded pipeline (src/tokenizer)
}

class Tokenizer {
 public:
  // A tokenizer.json file, or a directory holding tokenizer.json and, when
  // present, tokenizer_config.json (its bos_token / eos_token name the special ids).
  static Tokenizer load(const std::string& path);
  // tokenizer.json text (and tokenizer_config.json text, may be empty). `what`
  // names the source in error messages.
  static Tokenizer from_json(std::string_view tokenizer_json, std::string_view config_json = {},
                             const std::string& what = "tokenizer.json");
  // The tokenizer.ggml.* metadata of a GGUF file (llama.cpp's keys; docs/tokenizer.md).
  static Tokenizer from_gguf(const GgufFile& file);

  Tokenizer(Tokenizer&&) noexcept;
  Tokenizer& operator=(Tokenizer&&) noexcept;
  ~Tokenizer();

  // Token ids of `text` (UTF-8; invalid sequences are read as U+FFFD, one per
  // maximal invalid subpart, as the WHATWG decoder and the reference do).
  // add_special_tokens: what the post-processor adds (BOS for Llama-2).
  std::vector<int32_t> encode(std::string_view text, bool add_special_tokens = true) const;
  // Each text on its own, spread over `threads` threads (0: hardware threads).
  std::vector<std::vector<int32_t>> encode_batch(std::span<const std::string> texts,
                                                 bool add_special_tokens = true,
                                                 int threads = 0) const;
  // Text of the ids through the tokenizer's decoder; bytes that are not valid
  // UTF-8 come out as U+FFFD. skip_special_tokens drops special added tokens.
  std::string decode(std::span<const int32_t> ids, bool skip_special_tokens = false) const;

  int64_t vocab_size() const;  // ids are in [0, vocab_size)
  std::optional<int32_t> token_to_id(std::string_view token) const;
  const std::string& id_to_token(int32_t id) const;  // throws for an id out of range
  bool is_special(int32_t id) const;
  std::optional<int32_t> bos_id() const;
  std::optional<int32_t> eos_id() const;
  std::optional<int32_t> unk_id() const;

  // Writes the tokenizer.ggml.* keys that from_gguf reads (model, tokens,
  // token_type, merges, special ids, pre) into `w`. Refuses tokenizers whose
  // pipeline GGUF cannot express (docs/tokenizer.md).
  void write_gguf_vocab(GgufWriter& w) const;

  const tok::Model& model() const { return *m_; }

 private:
  explicit Tokenizer(std::unique_ptr<tok::Model> m);
  std::unique_ptr<tok::Model> m_;
};

// tokenizer.json text with `tokens` added as special tokens, as transformers'
// tokenizer.add_special_tokens() and save_pretrained() write them: each token
// not yet in the vocabulary or the added tokens gets the next id (after the
// highest id the file uses), in order, as an "added_tokens" entry with
// special true and normalized, lstrip, rstrip, single_word false (so it is
// matched in text before normalization, never split, and decode's
// skip_special_tokens drops it). Tokens already there are left as they are.
// The model's embedding then needs the new rows (kiln::models::
// resize_token_embeddings). `what` names the source in errors.
std::string add_special_tokens_json(std::string_view tokenizer_json,
                                    std::span<const std::string> tokens,
                                    const std::string& what = "tokenizer.json");

// Decodes generated ids one at a time: push() returns the text that the new id
// completes. Bytes that do not yet form UTF-8 (a character split over byte
// tokens) wait for the next ids; the pieces concatenated equal decode(all ids).
class StreamDecoder {
 public:
  explicit StreamDecoder(const Tokenizer& tok, bool skip_special_tokens = false);
  std::string push(int32_t id);
  // What is still held back (an incomplete character at the end), as U+FFFD.
  std::string flush();

 private:
  const Tokenizer* tok_;
  bool skip_special_;
  std::vector<int32_t> ids_;
  std::string prefix_;
  size_t prefix_index_ = 0;
};

// A corpus encoded once and cached on disk as u16 ids (vocabulary <= 65536) or
// u32 ids, so training programs do not re-tokenize every run. The cache file
// (docs/tokenizer.md) records the tokenizer's fingerprint and the corpus's size
// and hash; a stale cache is rebuilt.
struct TokenCache {
  std::vector<uint32_t> ids;
  int64_t vocab_size = 0;
  bool rebuilt = false;  // true when this call encoded the corpus
};
// Encodes every `*.txt` file directly in `corpus_dir` (byte order of names, each
// on its own, without special tokens, an EOS id between documents when the
// tokenizer has one) into `cache_path`, or reads it back when it is current.
TokenCache cached_corpus_tokens(const Tokenizer& tok, const std::string& corpus_dir,
                                const std::string& cache_path, int threads = 0);

}  // namespace kiln
