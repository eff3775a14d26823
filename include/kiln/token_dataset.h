// Token streams for language models: a corpus held as u8 byte tokens or as u16 /
// u32 token ids (no float copy), split into train and validation ranges without
// copying, and batches of next-token windows written into i32 graph inputs.
//
//   TokenDataset corpus = load_text_corpus("data/sotu", "bash scripts/get-sotu.sh");
//   // or ids of a tokenizer, encoded once and cached on disk (KILN_TOKENIZER):
//   TokenDataset corpus = load_token_corpus(tok, "data/sotu", "out/sotu.llama3.tok");
//   auto [train, val] = corpus.split(0.9);          // first 90% / last 10% of tokens
//   std::mt19937_64 rng(seed);
//   train.sample_batch(ctx.inputs(), ctx.labels(), rng);  // random windows (training)
//   for (int64_t b = 0; b < val.n_batches(B, T); ++b)
//     val.get_batch(ctx.inputs(), ctx.labels(), b);        // consecutive windows (eval)
//
// A window is block+1 consecutive tokens w[0..block]: the inputs are w[0..block)
// and the labels w[1..block] (the next token of each input position). Inputs and
// labels are i32 tensors holding B*T elements with B = inputs.size(0) and
// T = block: [B, T], or labels flattened to [B*T] for cross_entropy over
// [B*T, V] logits. Definitions: docs/gpt.md; token ids: docs/tokenizer.md.
#pragma once
#include <cstdint>
#include <memory>
#include <random>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "kiln/tensor.h"

namespace kiln {

class TokenDataset {
 public:
  TokenDataset() = default;
  // Takes the tokens (bytes); the vocabulary is 256.
  explicit TokenDataset(std::vector<uint8_t> tokens);
  // Takes token ids of a vocabulary of `vocab_size` tokens, kept as given (u16
  // for vocabularies up to 65536, u32 up to 2^32). An id >= vocab_size, or a
  // vocab_size outside [1, 65536] (u16) or [1, 2^32] (u32), throws kiln::Error.
  // Batches are i32: a window holding an id >= 2^31 throws when written.
  TokenDataset(std::vector<uint16_t> ids, int64_t vocab_size);
  TokenDataset(std::vector<uint32_t> ids, int64_t vocab_size);

  int64_t size() const { return end_ - begin_; }  // tokens
  int64_t vocab_size() const { return vocab_; }
  int id_bytes() const { return width_; }  // 1 (bytes), 2 (u16 ids) or 4 (u32 ids)
  uint32_t id(int64_t i) const;            // token i of this range, any width
  // The byte tokens; a dataset of u16/u32 ids throws kiln::Error (use id()).
  std::span<const uint8_t> tokens() const;

  // The first floor(size * train_fraction) tokens and the rest (nanoGPT's
  // `int(n * 0.9)` for 0.9). Both share this dataset's storage.
  std::pair<TokenDataset, TokenDataset> split(double train_fraction) const;

  // ---- training: windows at random offsets ----
  // Offset of one random window of block+1 tokens: uniform in
  // [0, size - block - 1], drawn from the engine's raw output (no std
  // distribution), so a seed gives the same offsets on every platform.
  int64_t random_offset(std::mt19937_64& rng, int64_t block) const;
  // Row b of the batch is the window at the b-th offset drawn from rng.
  void sample_batch(Tensor inputs, Tensor labels, std::mt19937_64& rng) const;

  // ---- evaluation: consecutive non-overlapping windows ----
  // Window w covers tokens [w (block+1), (w+1)(block+1)); a final partial one is
  // not used.
  int64_t n_windows(int64_t block) const;
  int64_t n_batches(int64_t batch, int64_t block) const;  // full batches of windows
  // Batch `batch_index`: windows batch_index*B ... batch_index*B + B-1.
  void get_batch(Tensor inputs, Tensor labels, int64_t batch_index) const;

  // Writes the windows starting at `offsets` (one per row) into inputs and labels
  // (labels may be undefined). Both batch functions end here.
  void write_windows(Tensor inputs, Tensor labels, std::span<const int64_t> offsets) const;

 private:
  TokenDataset range(int64_t begin, int64_t end) const;
  std::shared_ptr<const void> data_;  // owns the std::vector of u8, u16 or u32
  const void* base_ = nullptr;        // its first element
  int width_ = 1;
  int64_t vocab_ = 256;
  int64_t begin_ = 0, end_ = 0;
};

// Byte tokens of every `*.txt` file directly in `dir`, in byte order of the file
// names, each file followed by one '\n'. A missing or empty directory throws
// kiln::Error naming the path and `fetch_hint` (the command that fetches it).
TokenDataset load_text_corpus(const std::string& dir, const std::string& fetch_hint = "");

#if defined(KILN_HAVE_TOKENIZER)
class Tokenizer;
// The token ids of every `*.txt` file in `corpus_dir`, encoded once by `tok` and
// cached in `cache_path` (cached_corpus_tokens, kiln/tokenizer.h): the ids of a
// current cache are read back, not re-encoded. Held as u16 when the vocabulary
// has at most 65536 tokens, else u32.
TokenDataset load_token_corpus(const Tokenizer& tok, const std::string& corpus_dir,
                               const std::string& cache_path, int threads = 0);
#endif

}  // namespace kiln
