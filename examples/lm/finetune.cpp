// kiln-lm finetune: fine-tunes a Hugging Face model directory on texts, with
// LoRA adapters (default; saved in PEFT's layout, or with --out FILE.gguf as
// one GGUF adapter file in llama.cpp's format) or every weight (--full; saved
// as a Hugging Face directory with the tokenizer). The loop is
// kiln::train_on_tokens (kiln/token_train.h), as pretrain's: AdamW with linear
// warm-up and cosine decay, gradient accumulation (--grad-accum), gradient
// checkpointing (--checkpointing), validation loss on the last --val-split of
// the tokens before the first step and every --eval-every steps, a checkpoint
// (trained weights, AdamW state, step) at every evaluation with --checkpoint,
// exact --resume (the batches of step s depend only on --seed and s).
//   kiln-lm finetune --model DIR --data FILE|DIR...|FILE.jsonl --out DIR [--lora-r 8]
//       [--val FILE.jsonl] [--train-on assistant|all] [--truncate] [--no-packing]
//       [--lora-alpha 16] [--lora-dropout 0] [--targets q_proj,v_proj,...] [--full]
//       [--quantize q8_0|q4_0|q4_k|...] [--precision f32|bf16]
//       [--tokenizer FILE|DIR | --bytes] [--steps 100] [--batch 4] [--seq 64]
//       [--grad-accum 1] [--checkpointing] [--lr 2e-4] [--warmup 10]
//       [--eval-every 20] [--eval-batches 4] [--checkpoint PATH [--resume]]
//       [--stop-after N] [--threads N]
// Chat data: --data train.jsonl [--val val.jsonl] (finetune_chat.h): conversations
// rendered with the model's chat template, the loss on the assistant's tokens
// only (--train-on all: every token), examples packed into windows of --seq
// positions (attention within each example, positions from 0 in each;
// --no-packing: one per row, padded to the longest); longer than --seq + 1
// tokens: skipped and counted, or --truncate.
// Ends with "val_loss_start=… val_loss=… trained_params=… train_tokens_per_s=…
// train_time_s=… peak_rss_mb=…" (val_loss_start: the base model's); chat data
// adds "trained_tokens=…" (of the training examples, one epoch).
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include "commands.h"
#include "finetune_chat.h"
#include "kiln/kiln.h"
#include "kiln/token_train.h"
#include "lm_model.h"

namespace lm {

namespace {

namespace fs = std::filesystem;
using kiln::Tensor;

struct FinetuneOptions {
  std::string model, out, tokenizer, checkpoint;
  std::vector<std::string> data;
  bool bytes = false, full = false, checkpointing = false, resume = false;
  int64_t lora_r = 8;
  float lora_alpha = 16, lora_dropout = 0;
  std::string targets = "q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj";
  int64_t steps = 100, batch = 4, seq = 64, grad_accum = 1, warmup = 10, eval_every = 20;
  int64_t eval_batches = 4, stop_after = 0;
  float lr = 2e-4f, min_lr = 0, weight_decay = 0, clip = 0, val_split = 0.1f;
  uint64_t seed = 1;
  int threads = 0;
  std::string
      quantize;  // a block type (q8_0, q4_k, ...): QLoRA, adapters on a quantized, frozen base
  std::string precision = "f32";  // matmul precision (Context::set_matmul_precision)
  std::string val;                // chat data: validation JSONL
  std::string train_on = "assistant";
  bool truncate = false;
  bool no_packing = false;  // chat data: pad each example instead of packing windows
};

constexpr const char* kCmd = "kiln-lm finetune";

// The documents of --data: each file, or each *.txt of a directory (by name).
std::vector<std::string> read_documents(const std::vector<std::string>& paths) {
  std::vector<std::string> docs;
  for (const std::string& path : paths) {
    if (!fs::exists(path)) kiln::fail(kCmd, "--data ", path, " does not exist");
    std::vector<std::string> files;
    if (fs::is_directory(path)) {
      for (const auto& e : fs::directory_iterator(path))
        if (e.path().extension() == ".txt") files.push_back(e.path().string());
      std::sort(files.begin(), files.end());
      if (files.empty()) kiln::fail(kCmd, "--data ", path, " has no *.txt files");
    } else {
      files.push_back(path);
    }
    for (const std::string& f : files) docs.push_back(read_text(f, kCmd));
  }
  return docs;
}

kiln::TokenDataset tokens(const FinetuneOptions& o) {
  const std::vector<std::string> docs = read_documents(o.data);
  if (o.bytes) {
    std::vector<uint8_t> b;
    for (const std::string& d : docs) {
      b.insert(b.end(), d.begin(), d.end());
      b.push_back('\n');
    }
    return kiln::TokenDataset(std::move(b));
  }
  const kiln::Tokenizer tok = load_tokenizer(o.tokenizer.empty() ? o.model : o.tokenizer);
  return kiln::TokenDataset(document_ids(tok, docs, o.threads), tok.vocab_size());
}

std::vector<std::string> split_list(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  for (std::string item; std::getline(ss, item, ',');)
    if (!item.empty()) out.push_back(item);
  return out;
}

// What a checkpoint must agree on to be resumed: the trained params and how
// the steps are made (the base model's config stands for the base).
std::string run_settings(const FinetuneOptions& o, const kiln::models::CausalLM& model) {
  std::ostringstream s;
  if (o.full) s << "full";
  else
    s << "lora r=" << o.lora_r << " alpha=" << o.lora_alpha << " dropout=" << o.lora_dropout
      << " targets=" << o.targets;
  // The batches of step s come from --seed and s, the learning rate from the
  // schedule: both must be the run's own for the resumed steps to be its steps.
  s << " batch=" << o.batch << " seq=" << o.seq << " grad_accum=" << o.grad_accum
    << " quantize=" << (o.quantize.empty() ? "none" : o.quantize) << " precision=" << o.precision
    << " seed=" << o.seed << " steps=" << o.steps << " lr=" << o.lr << " min_lr=" << o.min_lr
    << " warmup=" << o.warmup << " weight_decay=" << o.weight_decay << " clip=" << o.clip
    << " val_split=" << o.val_split << " base=" << kiln::models::config_json(model.config());
  if (is_chat_data(o.data))
    s << " chat train_on=" << o.train_on << " truncate=" << o.truncate << " val=" << o.val
      << " packing=" << !o.no_packing;
  return s.str();
}

int run(const FinetuneOptions& o) {
  if (o.steps < 1 || o.batch < 1 || o.seq < 1 || o.grad_accum < 1 || o.eval_every < 1 ||
      o.eval_batches < 1)
    kiln::fail(kCmd,
               "--steps, --batch, --seq, --grad-accum, --eval-every and --eval-batches must be "
               ">= 1");
  if (!(o.val_split > 0 && o.val_split < 1)) kiln::fail(kCmd, "--val-split must be in (0, 1)");
  if (o.resume && o.checkpoint.empty()) kiln::fail(kCmd, "--resume needs --checkpoint PATH");
  const bool gguf_out = fs::path(o.out).extension() == ".gguf";
  const bool chat = is_chat_data(o.data);
  if (!chat && (!o.val.empty() || o.truncate || o.train_on != "assistant" || o.no_packing))
    kiln::fail(kCmd,
               "--val, --truncate, --train-on and --no-packing take chat data (--data FILE.jsonl)");
  if (chat && o.bytes)
    kiln::fail(kCmd, "chat data (--data FILE.jsonl) needs a tokenizer, not --bytes");
  kiln::TokenDataset data, train, val;
  ChatData chat_data;
  if (chat) {
    ChatDataFlags f;
    f.data = o.data;
    f.val = o.val;
    f.val_split = o.val_split;
    f.tokenizer_dir = o.tokenizer.empty() ? o.model : o.tokenizer;
    f.train_on = o.train_on;
    f.truncate = o.truncate;
    f.max_tokens = o.seq + 1;
    chat_data = load_chat_data(f, kCmd);
  } else {
    data = tokens(o);
    std::tie(train, val) = data.split(1.0 - o.val_split);
  }
  const int64_t B = o.batch, T = chat ? chat_data.block : o.seq;
  if (!chat && (val.n_batches(B, T) < o.eval_batches || train.size() < T + 1))
    kiln::fail(kCmd, "--data has ", data.size(), " tokens: too few for ", o.eval_batches,
               " validation batches of ", B, " x ", T, " (lower --eval-batches, --batch, --seq)");
  const int64_t data_vocab = chat ? chat_data.vocab_size : data.vocab_size();

  kiln::Context ctx;
  // bf16: the products of the forward and backward passes (and of the
  // validation loss) on bf16 operands, accumulated in f32; trained weights,
  // their gradients and the AdamW state stay f32, and so do the saved files.
  ctx.set_matmul_precision(o.precision == "bf16" ? kiln::bf16 : kiln::f32);
  kiln::CpuBackend cpu(o.threads);
  if (o.full && !o.quantize.empty())
    kiln::fail(kCmd, "--quantize trains LoRA adapters on a frozen quantized base, not --full");
  kiln::models::ModelOptions mo;
  const bool gguf_base = is_gguf_file(o.model);
  if (!o.quantize.empty())
    // The parser checked the name (quantized_weight_dtype_names()).
    mo.weight_dtype = *kiln::models::quantized_weight_dtype_named(o.quantize);
  else if (gguf_base && !o.full && has_quantized_tensors(o.model))
    // LoRA on a quantized GGUF base trains on its blocks as stored (QLoRA on a
    // Q4_K_M file as with --quantize); --full dequantizes them into f32.
    mo.weight_dtype = kiln::models::ModelOptions::WeightDType::stored;
  auto model = kiln::models::load(ctx, cpu, o.model, mo);  // directory: HF; file: GGUF
  const int64_t V = model->vocab_size();
  if (data_vocab > V)
    kiln::fail(kCmd, "the data's vocabulary (", data_vocab, ") is larger than the model's (", V,
               ")");
  if (T > model->max_seq_len())
    kiln::fail(
        kCmd, chat ? "the longest example needs a window of " : "--seq ", T,
        chat ? " positions, longer than the model takes (" : " is longer than the model takes (",
        model->max_seq_len(), ")", chat ? "; lower --seq to skip or --truncate it" : "");
  if (!o.full) {
    kiln::nn::LoraConfig lc;
    lc.r = o.lora_r;
    lc.alpha = o.lora_alpha;
    lc.dropout = o.lora_dropout;
    lc.target_modules = split_list(o.targets);
    kiln::nn::add_lora(*model, cpu, lc, "default", o.seed);  // freezes the rest
  }
  int64_t trained = 0, total = 0;
  for (Tensor p : model->parameters()) {
    total += p.numel();
    if (p.requires_grad()) trained += p.numel();
  }
  std::fprintf(stderr, "%s: %lld of %lld params trained (%.2f%%), %lld train tokens\n", kCmd,
               (long long)trained, (long long)total, 100.0 * double(trained) / double(total),
               (long long)(chat ? chat_data.train.trained_tokens() : train.size()));

  // Eval mode: no dropout. Chat data: labels kIgnoreIndex count for nothing.
  kiln::TokenLossEvaluator eval(*model, B, T, {&cpu}, {}, chat);
  // Chat data trains on windows of --seq positions packed with examples
  // (validation stays padded: the same loss, one example per row).
  const bool packed = chat && !o.no_packing && model->supports_packing();
  if (chat && !o.no_packing && !packed)
    std::fprintf(stderr, "%s: this model does not take packed examples: padding instead\n", kCmd);
  if (packed) chat_data.pack(o.seq, kCmd);
  const int64_t TT = packed ? o.seq : T;  // training window
  model->train();
  Tensor ids = ctx.input(kiln::i32, {B, TT}, "ids");
  Tensor labels = ctx.input(kiln::i32, {B, TT}, "labels");
  Tensor segments, positions;
  if (packed) {
    segments = ctx.input(kiln::i32, {B, TT}, "segments");
    positions = ctx.input(kiln::i32, {B, TT}, "positions");
  }
  Tensor logits = packed ? model->forward_packed(ids, segments, positions) : (*model)(ids);
  kiln::OptimizerParams p;
  p.adamw.lr = o.lr;
  kiln::OptConfig oc =
      kiln::next_token_opt_config(*model, ids, logits, labels, o.weight_decay, chat);
  oc.schedule = kiln::schedule::cosine(p, o.warmup, o.min_lr, o.steps);
  oc.logical_batch = B * o.grad_accum;
  oc.checkpointing = o.checkpointing;
  oc.clip_grad_norm = o.clip;
  oc.backends = {&cpu};
  kiln::OptContext opt(oc);

  const std::string settings = run_settings(o, *model);
  if (o.resume) {
    kiln::GgufFile f(o.checkpoint);
    const kiln::GgufValue* saved = f.find("kiln.lm.finetune");
    if (!saved || saved->as_string() != settings)
      kiln::fail(kCmd, o.checkpoint,
                 ": was written by another run (model, LoRA settings, --full, --batch, --seq, "
                 "--grad-accum or --precision differ); resume with the same options");
  }
  // The base model's validation loss (the checkpoint is loaded afterwards).
  const int64_t windows = o.eval_batches * B;
  auto val_loss = [&] {
    return chat ? chat_data.val_loss(eval, o.eval_batches) : eval.loss(val, windows);
  };
  const double start = val_loss();
  std::fprintf(stderr, "finetune iter 0: val_loss %.4f\n", start);

  kiln::TokenTrainOptions to;
  to.iters = o.steps;
  to.stop_after = o.stop_after;
  to.eval_interval = o.eval_every;
  to.eval_windows = windows;
  to.seed = o.seed;
  to.checkpoint = o.checkpoint;
  to.checkpoint_metadata = {{"kiln.lm.finetune", settings}};
  to.resume = o.resume;
  to.label = "finetune";
  const int64_t per_step = opt.accumulation_steps();
  const kiln::TokenTrainResult r =
      chat ? kiln::train_on_batches(
                 opt,
                 [&](int64_t step, int64_t k, Tensor x, Tensor y) {
                   chat_data.write_batch(o.seed, step, per_step, k, x, y, segments, positions);
                 },
                 val_loss, to)
           : kiln::train_on_tokens(opt, eval, train, val, to);
  const double rss_mb = peak_rss_mb();  // before saving

  const std::string tok_source = o.tokenizer.empty() ? o.model : o.tokenizer;
  if (o.full && gguf_out) {
    // A GGUF model file (f32 weights), with the tokenizer when there is one.
    std::optional<kiln::Tokenizer> tok;
    if (!o.bytes) tok = load_tokenizer(tok_source);
    kiln::models::save_gguf(*model, o.out, tok ? &*tok : nullptr);
  } else if (o.full) {
    kiln::models::save_pretrained(*model, o.out);
    if (!o.bytes && !is_gguf_file(tok_source)) copy_tokenizer_files(tok_source, o.out);
    else if (!o.bytes)
      std::fprintf(stderr,
                   "%s: %s has no tokenizer.json to copy: the directory gets none (give "
                   "--tokenizer DIR, or --out FILE.gguf to keep the GGUF vocabulary)\n",
                   kCmd, tok_source.c_str());
  } else if (gguf_out) {
    kiln::models::save_lora_gguf(*model, o.out);  // llama.cpp's adapter format
  } else {
    kiln::models::save_lora(*model, o.out, "default", o.model);
  }
  std::printf(
      "val_loss_start=%.4f val_loss=%.4f trained_params=%lld train_tokens_per_s=%.0f "
      "train_time_s=%.2f peak_rss_mb=%.1f",
      start, r.val_loss, (long long)trained, r.tokens_per_s, r.train_time_s, rss_mb);
  if (chat) std::printf(" trained_tokens=%lld", (long long)chat_data.train.trained_tokens());
  std::printf("\n");
  return 0;
}

}  // namespace

Command add_finetune(CLI::App& app) {
  auto o = std::make_shared<FinetuneOptions>();
  CLI::App* c = app.add_subcommand(
      "finetune", "fine-tune a Hugging Face model on texts: LoRA (PEFT files) or --full");
  c->add_option("--model", o->model,
                "the base: a Hugging Face model directory or a GGUF file (LoRA trains on a "
                "quantized file's blocks as stored)")
      ->required();
  c->add_option("--data", o->data,
                "text files and/or directories of *.txt (one document each), or one JSONL file "
                "of chat examples (messages, prompt/completion or text)")
      ->required();
  c->add_option("--val", o->val, "chat data: validation JSONL (default: --val-split of --data)");
  c->add_option("--train-on", o->train_on,
                "chat data: the tokens that get the loss: assistant (turns and completions) or "
                "all")
      ->check(CLI::IsMember({"assistant", "all"}))
      ->capture_default_str();
  c->add_flag("--no-packing", o->no_packing,
              "chat data: one example per row, padded to the longest (default: examples packed "
              "into windows of --seq positions, none attending to another)");
  c->add_flag("--truncate", o->truncate,
              "chat data: cut examples longer than --seq + 1 tokens (default: skip and count)");
  c->add_option("--out", o->out,
                "output: PEFT adapter directory, or FILE.gguf for a GGUF LoRA adapter in "
                "llama.cpp's format (LoRA); with --full a model directory, or FILE.gguf for a "
                "GGUF model file")
      ->required();
  c->add_option("--tokenizer", o->tokenizer, "tokenizer.json (file or directory); default --model");
  c->add_flag("--bytes", o->bytes, "train on the text's bytes (ids 0..255), no tokenizer");
  c->add_flag("--full", o->full, "train every weight instead of LoRA adapters");
  c->add_option("--lora-r", o->lora_r, "LoRA rank")->capture_default_str();
  c->add_option("--lora-alpha", o->lora_alpha, "LoRA alpha (scaling alpha / r)")
      ->capture_default_str();
  c->add_option("--lora-dropout", o->lora_dropout, "dropout on the adapters' input")
      ->capture_default_str();
  c->add_option("--targets", o->targets, "comma-separated module names to adapt")
      ->capture_default_str();
  c->add_option("--steps", o->steps, "optimizer steps")->capture_default_str();
  c->add_option("--batch", o->batch, "sequences per physical batch")->capture_default_str();
  c->add_option("--seq", o->seq,
                "tokens per sequence (chat data: a packed window's positions, examples of more "
                "than N + 1 tokens skipped or cut; --no-packing: windows as long as the longest "
                "example)")
      ->capture_default_str();
  c->add_option("--grad-accum", o->grad_accum,
                "physical batches per optimizer step (gradient accumulation)")
      ->capture_default_str();
  c->add_flag("--checkpointing", o->checkpointing,
              "gradient checkpointing: keep about sqrt(layers) activations, recompute the rest");
  c->add_option("--lr", o->lr, "peak learning rate (AdamW)")->capture_default_str();
  c->add_option("--min-lr", o->min_lr, "learning rate at the end of the cosine")
      ->capture_default_str();
  c->add_option("--warmup", o->warmup, "linear warm-up steps")->capture_default_str();
  c->add_option("--weight-decay", o->weight_decay, "AdamW weight decay of matrices")
      ->capture_default_str();
  c->add_option("--clip", o->clip, "gradient clipping at this global norm (0: off)")
      ->capture_default_str();
  c->add_option("--val-split,--val-fraction", o->val_split,
                "fraction of the tokens (chat data: the last examples) held out for validation")
      ->capture_default_str();
  c->add_option("--eval-every", o->eval_every, "steps between validation losses (and checkpoints)")
      ->capture_default_str();
  c->add_option("--eval-batches", o->eval_batches, "validation batches per evaluation")
      ->capture_default_str();
  c->add_option("--checkpoint", o->checkpoint,
                "write trained weights, AdamW state and step here at every evaluation");
  c->add_flag("--resume", o->resume, "continue exactly from --checkpoint");
  c->add_option("--stop-after", o->stop_after,
                "stop (with a checkpoint) after this many steps; 0: run to --steps")
      ->capture_default_str();
  c->add_option("--seed", o->seed, "seed of the batches and the adapters' init")
      ->capture_default_str();
  c->add_option("--threads", o->threads, "CPU threads (0: all)")->capture_default_str();
  c->add_option("--quantize", o->quantize,
                "QLoRA: quantize the base's Linear weights and embedding")
      ->check(CLI::IsMember(kiln::models::quantized_weight_dtype_names()));
  c->add_option("--precision", o->precision,
                "matmul precision: f32 or bf16 (bf16 operands, f32 accumulation; trained "
                "weights, gradients and AdamW state stay f32; the saved files are f32)")
      ->check(CLI::IsMember({"f32", "bf16"}))
      ->capture_default_str();
  return {c, [o] { return run(*o); }};
}

}  // namespace lm
