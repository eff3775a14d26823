// kiln-lm finetune: fine-tunes a Hugging Face model directory on a text, with
// LoRA adapters (default; saved in PEFT's layout) or every weight (--full;
// saved as a Hugging Face directory). AdamW with linear warm-up and cosine
// decay, validation loss on the last --val-split of the text.
//   kiln-lm finetune --model DIR --data FILE|DIR --out DIR [--lora-r 8]
//       [--lora-alpha 16] [--lora-dropout 0] [--targets q_proj,v_proj,...] [--full]
//       [--quantize q8_0|q4_0]
//       [--tokenizer FILE|DIR | --bytes] [--steps 100] [--batch 4] [--seq 64]
//       [--lr 2e-4] [--warmup 10] [--eval-every 20] [--eval-batches 4] [--threads N]
// Ends with "val_loss_start=… val_loss=… trained_params=… train_time_s=…".
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "commands.h"
#include "kiln/kiln.h"

namespace lm {

namespace {

namespace fs = std::filesystem;
using kiln::Tensor;

struct FinetuneOptions {
  std::string model, data, out, tokenizer;
  bool bytes = false, full = false;
  int64_t lora_r = 8;
  float lora_alpha = 16, lora_dropout = 0;
  std::string targets = "q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj";
  int64_t steps = 100, batch = 4, seq = 64, warmup = 10, eval_every = 20, eval_batches = 4;
  float lr = 2e-4f, min_lr = 0, weight_decay = 0, val_split = 0.1f;
  uint64_t seed = 1;
  int threads = 0;
  std::string quantize;  // q8_0 / q4_0: QLoRA, adapters on a quantized, frozen base
};

constexpr const char* kCmd = "kiln-lm finetune";

std::string read_text(const std::string& path) {
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
  std::string text;
  for (const std::string& f : files) {
    std::ifstream in(f, std::ios::binary);
    std::ostringstream ss;
    ss << in.rdbuf();
    text += ss.str();
    text += '\n';
  }
  return text;
}

kiln::TokenDataset tokens(const FinetuneOptions& o) {
  const std::string text = read_text(o.data);
  if (o.bytes) return kiln::TokenDataset(std::vector<uint8_t>(text.begin(), text.end()));
  const std::string tok_path = o.tokenizer.empty() ? o.model : o.tokenizer;
  kiln::Tokenizer tok = kiln::Tokenizer::load(tok_path);
  const std::vector<int32_t> ids = tok.encode(text);
  std::vector<uint32_t> u(ids.begin(), ids.end());
  return kiln::TokenDataset(std::move(u), tok.vocab_size());
}

std::vector<std::string> split_list(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  for (std::string item; std::getline(ss, item, ',');)
    if (!item.empty()) out.push_back(item);
  return out;
}

int run(const FinetuneOptions& o) {
  using Clock = std::chrono::steady_clock;
  if (o.steps < 1 || o.batch < 1 || o.seq < 1 || o.eval_every < 1 || o.eval_batches < 1)
    kiln::fail(kCmd, "--steps, --batch, --seq, --eval-every and --eval-batches must be >= 1");
  if (!(o.val_split > 0 && o.val_split < 1)) kiln::fail(kCmd, "--val-split must be in (0, 1)");
  kiln::TokenDataset data = tokens(o);
  auto [train, val] = data.split(1.0 - o.val_split);
  const int64_t B = o.batch, T = o.seq;
  if (val.n_batches(B, T) < o.eval_batches || train.size() < T + 1)
    kiln::fail(kCmd, "--data has ", data.size(), " tokens: too few for ", o.eval_batches,
               " validation batches of ", B, " x ", T, " (lower --eval-batches, --batch, --seq)");

  kiln::Context ctx;
  kiln::CpuBackend cpu(o.threads);
  if (o.full && !o.quantize.empty())
    kiln::fail(kCmd, "--quantize trains LoRA adapters on a frozen quantized base, not --full");
  kiln::models::ModelOptions mo;
  if (!o.quantize.empty())
    mo.weight_dtype = o.quantize == "q8_0" ? kiln::models::ModelOptions::WeightDType::q8_0
                                           : kiln::models::ModelOptions::WeightDType::q4_0;
  auto model = kiln::models::load_pretrained(ctx, cpu, o.model, mo);
  const int64_t V = model->vocab_size();
  if (data.vocab_size() > V)
    kiln::fail(kCmd, "the data's vocabulary (", data.vocab_size(), ") is larger than the model's (",
               V, ")");
  if (T > model->max_seq_len())
    kiln::fail(kCmd, "--seq ", T, " is longer than the model takes (", model->max_seq_len(), ")");
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
  std::fprintf(stderr, "%s: %lld of %lld params trained (%.2f%%)\n", kCmd, (long long)trained,
               (long long)total, 100.0 * double(trained) / double(total));

  // Validation graph (no dropout) first, then the training graph.
  model->eval();
  Tensor vids = ctx.input(kiln::i32, {B, T}, "val_ids");
  Tensor vlabels = ctx.input(kiln::i32, {B, T}, "val_labels");
  Tensor vlogits = (*model)(vids);
  kiln::OptConfig vc;
  vc.inputs = vids;
  vc.outputs = vlogits;
  vc.labels = vlabels;
  vc.loss = kiln::LossKind::user;
  vc.user_loss = kiln::cross_entropy(vlogits.reshape({B * T, V}), vlabels.reshape({B * T}));
  vc.model = model.get();
  vc.forward_only = true;
  vc.backends = {&cpu};
  kiln::OptContext vopt(vc);
  auto val_loss = [&] {
    double sum = 0;
    for (int64_t b = 0; b < o.eval_batches; ++b) {
      val.get_batch(vopt.inputs(), vopt.labels(), b);
      sum += vopt.eval_batch();
    }
    return sum / double(o.eval_batches);
  };

  model->train();
  Tensor ids = ctx.input(kiln::i32, {B, T}, "ids");
  Tensor labels = ctx.input(kiln::i32, {B, T}, "labels");
  Tensor logits = (*model)(ids);
  kiln::OptimizerParams p;
  p.adamw.lr = o.lr;
  kiln::OptConfig oc = kiln::next_token_opt_config(*model, ids, logits, labels, o.weight_decay);
  oc.schedule = kiln::schedule::cosine(p, o.warmup, o.min_lr, o.steps);
  oc.backends = {&cpu};
  kiln::OptContext opt(oc);

  const double start = val_loss();
  std::fprintf(stderr, "step 0: val_loss %.4f\n", start);
  double last = start, interval = 0;
  int64_t n = 0;
  const auto t0 = Clock::now();
  for (int64_t s = 0; s < o.steps; ++s) {
    std::mt19937_64 rng(o.seed * 0x9E3779B97F4A7C15ull + uint64_t(s));
    train.sample_batch(opt.inputs(), opt.labels(), rng);
    interval += opt.train_batch();
    ++n;
    if ((s + 1) % o.eval_every == 0 || s + 1 == o.steps) {
      last = val_loss();
      std::fprintf(stderr, "step %lld: train_loss %.4f val_loss %.4f lr %.2e\n", (long long)(s + 1),
                   interval / double(n), last, opt.last_params().lr());
      interval = 0, n = 0;
    }
  }
  const double secs = std::chrono::duration<double>(Clock::now() - t0).count();
  if (o.full) kiln::models::save_pretrained(*model, o.out);
  else kiln::models::save_lora(*model, o.out, "default", o.model);
  std::printf("val_loss_start=%.4f val_loss=%.4f trained_params=%lld train_time_s=%.2f\n", start,
              last, (long long)trained, secs);
  return 0;
}

}  // namespace

Command add_finetune(CLI::App& app) {
  auto o = std::make_shared<FinetuneOptions>();
  CLI::App* c = app.add_subcommand(
      "finetune", "fine-tune a Hugging Face model on a text: LoRA (PEFT files) or --full");
  c->add_option("--model", o->model, "Hugging Face model directory")->required();
  c->add_option("--data", o->data, "text file, or directory of *.txt")->required();
  c->add_option("--out", o->out, "output: adapter directory (LoRA) or model directory (--full)")
      ->required();
  c->add_option("--tokenizer", o->tokenizer, "tokenizer.json (file or directory); default --model");
  c->add_flag("--bytes", o->bytes, "train on the text's bytes (ids 0..255), no tokenizer");
  c->add_flag("--full", o->full, "train every weight instead of LoRA adapters");
  c->add_option("--lora-r", o->lora_r, "LoRA rank");
  c->add_option("--lora-alpha", o->lora_alpha, "LoRA alpha (scaling alpha / r)");
  c->add_option("--lora-dropout", o->lora_dropout, "dropout on the adapters' input");
  c->add_option("--targets", o->targets, "comma-separated module names to adapt");
  c->add_option("--steps", o->steps, "optimizer steps");
  c->add_option("--batch", o->batch, "sequences per step");
  c->add_option("--seq", o->seq, "tokens per sequence");
  c->add_option("--lr", o->lr, "peak learning rate (AdamW)");
  c->add_option("--min-lr", o->min_lr, "learning rate at the end of the cosine");
  c->add_option("--warmup", o->warmup, "linear warm-up steps");
  c->add_option("--weight-decay", o->weight_decay, "AdamW weight decay of matrices");
  c->add_option("--val-split", o->val_split, "fraction of the text held out for validation");
  c->add_option("--eval-every", o->eval_every, "steps between validation losses");
  c->add_option("--eval-batches", o->eval_batches, "validation batches per evaluation");
  c->add_option("--seed", o->seed, "seed of the batches and the adapters' init");
  c->add_option("--threads", o->threads, "CPU threads (0: all)");
  c->add_option("--quantize", o->quantize, "QLoRA: quantize the base's Linear weights")
      ->check(CLI::IsMember({"q8_0", "q4_0"}));
  return {c, [o] { return run(*o); }};
}

}  // namespace lm
