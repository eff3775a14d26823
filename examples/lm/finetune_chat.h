// kiln-lm finetune on JSONL chat data (kiln/chat_dataset.h): the examples of
// --data and --val (or a --val-split fraction of --data's), and the batches
// and validation loss the training loop asks for; training examples packed
// into windows (segment ids, positions per example) unless --no-packing.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "kiln/kiln.h"

namespace lm {

struct ChatDataFlags {
  std::vector<std::string> data;  // one JSONL file
  std::string val;                // JSONL; empty: the last val_split of data's examples
  double val_split = 0.1;
  std::string tokenizer_dir;  // tokenizer.json and the chat template
  std::string train_on = "assistant";
  bool truncate = false;
  int64_t max_tokens = 0;  // --seq + 1
};

// Does --data name JSONL files (chat data) rather than text?
bool is_chat_data(const std::vector<std::string>& paths);

struct ChatData {
  kiln::ChatDataset train, val;
  int64_t vocab_size = 0;
  int64_t block = 0;  // positions of a window: the longest example's tokens - 1
  // Training examples packed into windows of --seq positions (the default;
  // --no-packing: none, each example padded to `block`).
  std::optional<kiln::ChatPacking> packing;
  // Packs train into windows of `window` positions and reports (stderr) the
  // packing efficiency.
  void pack(int64_t window, const char* cmd);
  // Batch k of optimizer step `step`: batch examples (packed: windows) drawn
  // per epoch (seed); segments and positions only when packed.
  void write_batch(uint64_t seed, int64_t step, int64_t per_step, int64_t k, kiln::Tensor inputs,
                   kiln::Tensor labels, kiln::Tensor segments = {},
                   kiln::Tensor positions = {}) const;
  // The mean loss per trained token over the first `batches` batches of val
  // (fewer when val holds fewer), with the evaluator's batch size.
  double val_loss(kiln::TokenLossEvaluator& eval, int64_t batches) const;
};

// Loads and reports (stderr) the data; `cmd` names the command in errors.
ChatData load_chat_data(const ChatDataFlags& f, const char* cmd);

}  // namespace lm
