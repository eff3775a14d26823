// Supervised fine-tuning data: JSONL files of conversations as TRL and mlx-lm
// read them, rendered through the model's chat template and tokenized, with
// the tokens that get the loss marked (the assistant's, or a completion's).
//
//   kiln::Tokenizer tok = kiln::Tokenizer::load("models/smollm2");
//   kiln::chat::ChatTemplate tmpl = kiln::chat::ChatTemplate::load("models/smollm2");
//   kiln::ChatDataOptions o;
//   o.max_tokens = 257;  // a window of 256 inputs and their 256 next tokens
//   kiln::ChatDataset train = kiln::load_chat_jsonl("train.jsonl", tok, &tmpl, o);
//   train.write_batch(rows, ctx.inputs(), ctx.labels());  // labels -100 where untrained
//   // or packed: several examples per window of 256 positions
//   kiln::ChatPacking packed = kiln::pack_chat_examples(train, 256);
//   packed.write_batch(train, rows, ids, labels, segments, positions);
//
// One JSON object per line (blank lines are skipped), each one of:
// - {"messages": [{"role", "content", ...}, ...], "tools": [...]?}: rendered
//   with the template; the tokens of each assistant turn are trained.
// - {"prompt": P, "completion": C}: strings are plain text, the prompt encoded
//   with the tokenizer's special tokens, the completion without, then EOS; lists
//   of messages are a conversation whose completion messages are trained (TRL's
//   conversational prompt-completion).
// - {"text": T}: plain text, every token trained.
// Which tokens are an assistant turn's is computed exactly from the template:
// turn i starts where messages[:i] rendered with add_generation_prompt ends and
// ends where messages[:i+1] rendered ends. Both must be prefixes of the whole
// conversation's text and their tokens prefixes of its tokens; a template that
// renders a prefix otherwise is an error naming the line and the turn. A
// template with {% generation %} blocks says it itself: the tokens of the text
// the blocks wrote are trained (transformers' return_assistant_tokens_mask), the
// k-th block taken as the k-th assistant message's.
// docs/chat.md#fine-tuning-on-conversations has the formats and flags.
#pragma once
#include <cstdint>
#include <random>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "kiln/tensor.h"

namespace kiln {

class Tokenizer;
namespace chat {
class ChatTemplate;
}

// One tokenized example: ids and, per id, whether it gets the loss.
struct ChatExample {
  std::vector<int32_t> ids;
  std::vector<uint8_t> trained;  // 1: the loss covers this token (as a label)
  int64_t line = 0;              // 1-based line of the JSONL file
  int64_t trained_count() const;
};

enum class TrainOn { assistant, all };

struct ChatDataOptions {
  TrainOn train_on = TrainOn::assistant;  // all: every token trained (no masking)
  // Longest example in tokens (a window of max_tokens - 1 positions); 0: no limit.
  int64_t max_tokens = 0;
  // A longer example is cut to max_tokens (true) or skipped and counted (false).
  bool truncate = false;
};

struct ChatDataset {
  std::string file;
  std::vector<ChatExample> examples;
  std::vector<int64_t> skipped_lines;  // examples longer than max_tokens, not truncated
  int64_t truncated = 0;               // examples cut to max_tokens

  int64_t size() const { return int64_t(examples.size()); }
  int64_t longest() const;         // ids of the longest example
  int64_t trained_tokens() const;  // over all examples
  // The last floor(size * fraction) examples as a second dataset (validation),
  // removed from this one; the order is kept, so the split is reproducible.
  ChatDataset split_off(double fraction);

  // Writes examples[rows[b]] into row b of inputs and labels (i32 [B, T], or
  // labels [B*T]): inputs ids[0..n-1), labels ids[1..n) where trained, else
  // kIgnoreIndex; the rest of the row is padding (input 0, label kIgnoreIndex).
  // A row index of -1 is a row of padding only. An example longer than T + 1
  // tokens is a kiln::Error.
  void write_batch(std::span<const int64_t> rows, Tensor inputs, Tensor labels) const;
  // The example indices of physical batch k of optimizer step `step` (batch
  // rows each, `per_step` batches a step): consecutive slices of a sequence
  // of epochs, each a permutation drawn from (seed, epoch) alone, so the rows
  // of a step do not depend on what ran before (exact resume).
  std::vector<int64_t> training_rows(uint64_t seed, int64_t step, int64_t per_step, int64_t k,
                                     int64_t batch) const;
};

// Examples packed into windows of T input positions (an example of n tokens
// takes n - 1: its inputs, each with its next token as the label), several per
// window, none split: first-fit decreasing (longest first, each into the first
// window with room), so windows come out nearly full. Deterministic (ties keep
// the dataset's order); examples lie in a window in the order they were
// placed. write_batch fills a batch of windows with segment ids (the slot of
// the example in its window, -1 for padding) and positions (from 0 in each
// example), what CausalLM::forward_packed reads.
struct ChatPacking {
  int64_t window = 0;                         // T
  std::vector<std::vector<int64_t>> windows;  // example indices per window
  int64_t real_positions = 0;                 // positions holding an example's input
  int64_t size() const { return int64_t(windows.size()); }
  // Share of the windows' positions holding real tokens (1 - padding).
  double efficiency() const;
  // Writes windows[rows[b]] into row b (all i32 [B, T]; labels may be [B*T]):
  // inputs and labels as ChatDataset::write_batch per example, segments and
  // positions; padding: input 0, label kIgnoreIndex, segment -1, position 0.
  // A row index of -1 is a row of padding only.
  void write_batch(const ChatDataset& data, std::span<const int64_t> rows, Tensor inputs,
                   Tensor labels, Tensor segments, Tensor positions) const;
};
// Packs `data` into windows of `window` positions; an example longer than
// window + 1 tokens is a kiln::Error.
ChatPacking pack_chat_examples(const ChatDataset& data, int64_t window);

// Row indices of physical batch k of optimizer step `step` over n rows
// (examples or packed windows): consecutive slices of a sequence of epochs,
// each a permutation drawn from (seed, epoch) alone (exact resume).
std::vector<int64_t> epoch_rows(int64_t n, uint64_t seed, int64_t step, int64_t per_step, int64_t k,
                                int64_t batch);

// Tokenizes one example (one JSONL line's text). `where` ("file:line") starts
// its error messages. `tmpl` may be null for "text" and string prompt/completion
// examples only.
ChatExample tokenize_chat_example(std::string_view json, const Tokenizer& tok,
                                  const chat::ChatTemplate* tmpl, TrainOn train_on,
                                  const std::string& where);

// Every example of a JSONL file. Errors (bad JSON, an unknown role, an empty
// conversation, a conversation without an assistant turn to train on, a
// template that renders prefixes inconsistently) name the file and line.
ChatDataset load_chat_jsonl(const std::string& path, const Tokenizer& tok,
                            const chat::ChatTemplate* tmpl, const ChatDataOptions& options);

}  // namespace kiln
