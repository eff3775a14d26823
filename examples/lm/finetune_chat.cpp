// kiln-lm finetune's chat data (finetune_chat.h).
#include "finetune_chat.h"

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <optional>

#include "chat_setup.h"
#include "lm_model.h"

namespace lm {

bool is_chat_data(const std::vector<std::string>& paths) {
  for (const std::string& p : paths)
    if (std::filesystem::path(p).extension() == ".jsonl") return true;
  return false;
}

namespace {

void report(const char* cmd, const char* what, const kiln::ChatDataset& d) {
  std::fprintf(stderr, "%s: %s %s: %lld examples, %lld trained tokens, longest %lld tokens", cmd,
               what, d.file.c_str(), (long long)d.size(), (long long)d.trained_tokens(),
               (long long)d.longest());
  if (d.truncated) std::fprintf(stderr, ", %lld truncated", (long long)d.truncated);
  if (!d.skipped_lines.empty()) {
    std::fprintf(stderr, ", %zu skipped as longer than the context (lines", d.skipped_lines.size());
    for (size_t i = 0; i < d.skipped_lines.size() && i < 10; ++i)
      std::fprintf(stderr, " %lld", (long long)d.skipped_lines[i]);
    std::fprintf(stderr, "%s; --truncate cuts them)", d.skipped_lines.size() > 10 ? " ..." : "");
  }
  std::fprintf(stderr, "\n");
}

}  // namespace

ChatData load_chat_data(const ChatDataFlags& f, const char* cmd) {
  if (f.data.size() != 1 || !is_chat_data(f.data))
    kiln::fail(cmd, "chat data is one --data FILE.jsonl (got ", f.data.size(), " paths)");
  if (!f.val.empty() && std::filesystem::path(f.val).extension() != ".jsonl")
    kiln::fail(cmd, "--val ", f.val, " must be a .jsonl file");
  const kiln::Tokenizer tok = load_tokenizer(f.tokenizer_dir);  // directory, file or GGUF
  // Plain-text examples need no template; conversations report its absence.
  std::optional<kiln::chat::ChatTemplate> tmpl;
  try {
    tmpl = is_gguf_file(f.tokenizer_dir) ? load_chat_template(f.tokenizer_dir, "")
                                         : kiln::chat::ChatTemplate::load(f.tokenizer_dir);
  } catch (const kiln::Error& e) {
    std::fprintf(stderr, "%s: no chat template (%s)\n", cmd, e.what());
  }
  kiln::ChatDataOptions o;
  o.train_on = f.train_on == "all" ? kiln::TrainOn::all : kiln::TrainOn::assistant;
  o.truncate = f.truncate;
  o.max_tokens = f.max_tokens;
  const kiln::chat::ChatTemplate* t = tmpl ? &*tmpl : nullptr;
  ChatData d;
  d.train = kiln::load_chat_jsonl(f.data[0], tok, t, o);
  if (!f.val.empty()) d.val = kiln::load_chat_jsonl(f.val, tok, t, o);
  else d.val = d.train.split_off(f.val_split);
  report(cmd, "train", d.train);
  report(cmd, "val", d.val);
  d.vocab_size = tok.vocab_size();
  // One graph for every batch: windows as long as the longest example, the
  // shorter ones padded (labels kIgnoreIndex, so padding is never trained).
  d.block = std::max(d.train.longest(), d.val.longest()) - 1;
  return d;
}

void ChatData::pack(int64_t window, const char* cmd) {
  packing = kiln::pack_chat_examples(train, window);
  const int64_t padded = train.size() * block;  // what padding to the longest would take
  std::fprintf(stderr,
               "%s: packed %lld examples into %lld windows of %lld positions: packing efficiency "
               "%.1f%% (real tokens per window position; padding to the longest example: "
               "%.1f%%)\n",
               cmd, (long long)train.size(), (long long)packing->size(), (long long)window,
               100.0 * packing->efficiency(),
               padded > 0 ? 100.0 * double(packing->real_positions) / double(padded) : 0.0);
}

void ChatData::write_batch(uint64_t seed, int64_t step, int64_t per_step, int64_t k,
                           kiln::Tensor inputs, kiln::Tensor labels, kiln::Tensor segments,
                           kiln::Tensor positions) const {
  const int64_t B = inputs.size(0);
  if (!packing) {
    train.write_batch(train.training_rows(seed, step, per_step, k, B), inputs, labels);
    return;
  }
  packing->write_batch(train, kiln::epoch_rows(packing->size(), seed, step, per_step, k, B), inputs,
                       labels, segments, positions);
}

double ChatData::val_loss(kiln::TokenLossEvaluator& eval, int64_t batches) const {
  const int64_t B = eval.batch();
  const int64_t n = std::min(batches, (val.size() + B - 1) / B);
  double sum = 0, tokens = 0;
  for (int64_t b = 0; b < n; ++b) {
    std::vector<int64_t> rows(size_t(B), -1);  // -1: a row of padding after the last example
    double count = 0;
    for (int64_t r = 0; r < B && b * B + r < val.size(); ++r) {
      rows[size_t(r)] = b * B + r;
      count += double(val.examples[size_t(b * B + r)].trained_count());
    }
    val.write_batch(rows, eval.inputs(), eval.labels());
    sum += eval.batch_loss() * count;  // the batch's mean over its trained tokens
    tokens += count;
  }
  return sum / tokens;
}

}  // namespace lm
