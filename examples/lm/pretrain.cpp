// kiln-lm pretrain: trains a small Llama-architecture model from scratch with a
// real tokenizer (default: data/tokenizers/llama2, a 32k SentencePiece-style BPE
// whose ids are Mistral-7B's, e.g. "▁the" = 272) on a text corpus
// (default: the State of the Union addresses) and saves it as a Hugging Face
// directory (LlamaForCausalLM's layout) that load_pretrained and kiln-lm generate read:
// config.json, generation_config.json, model.safetensors and the tokenizer's
// tokenizer.json / tokenizer_config.json. --gguf also writes a GGUF file with
// the vocabulary that llama.cpp runs.
//
// The loop is kiln::train_on_tokens (kiln/token_train.h), as kiln-gpt's: AdamW,
// linear warm-up then cosine decay, validation loss and a checkpoint (weights,
// AdamW state, step) every --eval-interval iterations, exact --resume. Ends with
//   val_loss=… train_tokens_per_s=… train_time_s=… peak_rss_mb=…
// (the peak RSS when training ended, before the saved files are checked).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "../gpt/report.h"
#include "commands.h"
#include "kiln/kiln.h"
#include "kiln/nn/init.h"
#include "kiln/token_train.h"
#include "kiln/tokenizer.h"
#include "lm_model.h"

namespace lm {

namespace {

namespace fs = std::filesystem;
using kiln::Tensor;

struct PretrainOptions {
  std::string tokenizer = "data/tokenizers/llama2", data = "data/sotu", out = "out/lm";
  std::string checkpoint, cache, gguf;  // empty: derived from out / none
  int64_t hidden = 128, layers = 4, heads = 4, kv_heads = 4, intermediate = 384, block = 128;
  int64_t batch = 8, iters = 1000, warmup = 100, eval_interval = 100, eval_windows = 96;
  int64_t stop_after = 0;
  float lr = 2e-3f, min_lr = 2e-4f, beta1 = 0.9f, beta2 = 0.95f, weight_decay = 0.1f, clip = 1.0f;
  uint64_t seed = 1337;
  int threads = 2;
  bool resume = false;
  std::string precision = "f32";  // matmul precision (Context::set_matmul_precision)
  kiln::DType matmul_precision() const { return precision == "bf16" ? kiln::bf16 : kiln::f32; }
};

constexpr int64_t kEvalBatch = 8;  // validation windows per forward pass

kiln::models::ModelConfig model_config(const PretrainOptions& o, const kiln::Tokenizer& tok) {
  kiln::models::LlamaConfig c;
  c.model_type = "llama";
  c.vocab_size = tok.vocab_size();
  c.hidden_size = o.hidden;
  c.intermediate_size = o.intermediate;
  c.num_hidden_layers = o.layers;
  c.num_attention_heads = o.heads;
  c.num_key_value_heads = o.kv_heads;
  if (o.heads < 1 || o.hidden % o.heads != 0)
    kiln::fail("kiln-lm pretrain", "--heads ", o.heads, " must divide --hidden ", o.hidden);
  if (o.heads % o.kv_heads != 0)
    kiln::fail("kiln-lm pretrain", "--kv-heads ", o.kv_heads, " must divide --heads ", o.heads);
  c.head_dim = o.hidden / o.heads;
  if (c.head_dim % 2 != 0)
    kiln::fail("kiln-lm pretrain", "the head dim --hidden / --heads = ", c.head_dim,
               " must be even (RoPE rotates pairs)");
  c.max_position_embeddings = o.block;  // the context it is trained on
  c.rms_norm_eps = 1e-5;
  c.rope_theta = 10000.0;
  c.tie_word_embeddings = true;  // half the embedding parameters at this size
  kiln::models::ModelConfig cfg;
  cfg.model_type = "llama";
  cfg.llama = c;
  if (tok.bos_id()) cfg.generation.bos_token_id = *tok.bos_id();
  if (tok.eos_id()) cfg.generation.eos_token_ids = {*tok.eos_id()};
  return cfg;
}

// Hugging Face's Llama init (normal, std 0.02, for every matrix; norms 1), with
// GPT-2's 1/sqrt(2 layers) on the projections that write into the residual stream.
void init_llama(kiln::models::CausalLM& model, int64_t layers, uint64_t seed) {
  model.init(seed);  // RMSNorm weights 1
  const float residual_std = 0.02f / std::sqrt(2.0f * float(layers));
  uint64_t i = 0;
  for (auto& [name, t] : model.named_parameters()) {
    ++i;
    if (t.ndim() < 2) continue;
    const bool residual = name.find("o_proj.weight") != std::string::npos ||
                          name.find("down_proj.weight") != std::string::npos;
    kiln::init_normal(t, 0.0f, residual ? residual_std : 0.02f, seed * 1000003 + i);
  }
}

// The corpus as documents "BOS text EOS": the token cache holds "text EOS" per
// document; a BOS before each lets the model see the token generation starts with.
kiln::TokenDataset corpus_with_bos(const kiln::Tokenizer& tok, const PretrainOptions& o,
                                   const std::string& cache) {
  kiln::TokenCache c = kiln::cached_corpus_tokens(tok, o.data, cache, o.threads);
  std::fprintf(stderr, "corpus: %zu tokens (%s %s)\n", c.ids.size(),
               c.rebuilt ? "encoded into" : "read from", cache.c_str());
  if (c.vocab_size > 65536)
    kiln::fail("kiln-lm pretrain", "a vocabulary of ", c.vocab_size,
               " tokens: pretrain holds ids as u16 (at most 65536)");
  std::vector<uint16_t> ids;
  ids.reserve(c.ids.size() + 256);
  const auto bos = tok.bos_id(), eos = tok.eos_id();
  if (bos) ids.push_back(uint16_t(*bos));
  for (size_t i = 0; i < c.ids.size(); ++i) {
    ids.push_back(uint16_t(c.ids[i]));
    if (bos && eos && int32_t(c.ids[i]) == *eos && i + 1 < c.ids.size())
      ids.push_back(uint16_t(*bos));
  }
  return kiln::TokenDataset(std::move(ids), c.vocab_size);
}

// Logits of `model` (eval mode) for one batch of ids [B, T], in a graph of their own.
std::vector<float> logits_of(kiln::models::CausalLM& model, kiln::Backend& backend,
                             const std::vector<int32_t>& ids, int64_t B, int64_t T) {
  model.eval();
  Tensor x = model.ctx().input(kiln::i32, {B, T}, "check_ids");
  Tensor logits = model(x);
  kiln::Graph g = kiln::Graph::forward(logits);
  // Only the tensors of this graph lack memory (the training graphs have theirs).
  std::unique_ptr<kiln::Buffer> buf = kiln::allocate_tensors(model.ctx(), backend);
  x.set(ids);
  backend.compute(g);
  return logits.get<float>();
}

// The saved files must give the trained model back: the logits of a validation
// batch computed from them equal the ones in memory. Returns the largest
// difference relative to the largest logit.
double reload_difference(const std::vector<float>& want, kiln::models::CausalLM& loaded,
                         kiln::Backend& backend, const std::vector<int32_t>& ids, int64_t B,
                         int64_t T, const std::string& what) {
  const std::vector<float> got = logits_of(loaded, backend, ids, B, T);
  double diff = 0, scale = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    diff = std::max(diff, double(std::fabs(want[i] - got[i])));
    scale = std::max(scale, double(std::fabs(want[i])));
  }
  const double rel = diff / std::max(scale, 1e-30);
  if (!(rel <= 1e-5))
    kiln::fail("kiln-lm pretrain", what, " gives other logits than the trained model (max |diff| ",
               diff, " of max |logit| ", scale, ")");
  return rel;
}

int run(PretrainOptions o) {
  if (!fs::exists(o.data) || fs::is_empty(o.data))
    kiln::fail("kiln-lm pretrain", "--data ", o.data,
               " is missing or empty (fetch the corpus with: bash scripts/get-sotu.sh)");
  if (!fs::exists(o.tokenizer))
    kiln::fail("kiln-lm pretrain", "--tokenizer ", o.tokenizer,
               " is missing (fetch it with: bash scripts/get-tokenizers.sh)");
  const fs::path out(o.out);
  const fs::path parent = out.parent_path().empty() ? fs::path(".") : out.parent_path();
  fs::create_directories(parent);
  if (o.checkpoint.empty()) o.checkpoint = out.string() + ".ckpt.gguf";
  if (o.cache.empty())
    o.cache = (parent / (fs::path(o.data).filename().string() + "." +
                         fs::path(o.tokenizer).filename().string() + ".tok"))
                  .string();

  kiln::Tokenizer tok = kiln::Tokenizer::load(o.tokenizer);
  kiln::TokenDataset corpus = corpus_with_bos(tok, o, o.cache);
  auto [train_split, val_split] = corpus.split(0.9);

  const kiln::models::ModelConfig cfg = model_config(o, tok);
  const std::string cfg_json = kiln::models::config_json(cfg);
  kiln::Context ctx;
  ctx.set_matmul_precision(o.matmul_precision());
  kiln::CpuBackend cpu(o.threads);
  std::unique_ptr<kiln::models::CausalLM> model = kiln::models::make_model(ctx, cfg);
  model->allocate(cpu);
  init_llama(*model, o.layers, o.seed);
  int64_t n_params = 0;
  for (const Tensor& t : model->parameters()) n_params += t.shape().numel();
  std::fprintf(stderr,
               "model: llama, %lld layers, hidden %lld, %lld heads, vocab %lld: %.2fM params\n",
               (long long)o.layers, (long long)o.hidden, (long long)o.heads,
               (long long)cfg.llama->vocab_size, double(n_params) / 1e6);

  const int64_t B = o.batch, T = o.block, V = cfg.llama->vocab_size;
  Tensor ids = ctx.input(kiln::i32, {B, T}, "ids");
  Tensor targets = ctx.input(kiln::i32, {B, T}, "targets");
  Tensor logits = (*model)(ids);
  kiln::OptimizerParams p;
  p.adamw.lr = o.lr;
  p.adamw.beta1 = o.beta1;
  p.adamw.beta2 = o.beta2;
  kiln::OptConfig oc = kiln::next_token_opt_config(*model, ids, logits, targets, o.weight_decay);
  oc.clip_grad_norm = o.clip;
  oc.schedule = kiln::schedule::cosine(p, o.warmup, o.min_lr, o.iters);
  oc.backends = {&cpu};
  kiln::OptContext opt(oc);
  kiln::TokenLossEvaluator eval(*model, kEvalBatch, T, cpu);

  if (o.resume) {
    // The checkpoint must be of this model: same config (and so same shapes).
    kiln::GgufFile f(o.checkpoint);
    const kiln::GgufValue* saved = f.find("kiln.lm.config");
    if (!saved || saved->as_string() != cfg_json)
      kiln::fail("kiln-lm pretrain", o.checkpoint,
                 ": was written for another model config; resume with the same model options");
  }
  const std::string csv = gpt::sibling(o.out, ".csv"), svg = gpt::sibling(o.out, ".svg");
  std::vector<gpt::Row> rows;
  if (o.resume) rows = gpt::read_csv(csv);
  kiln::TokenTrainOptions to;
  to.iters = o.iters;
  to.stop_after = o.stop_after;
  to.eval_interval = o.eval_interval;
  to.eval_windows = o.eval_windows;
  to.seed = o.seed;
  to.checkpoint = o.checkpoint;
  to.checkpoint_metadata = {{"kiln.lm.config", cfg_json}};
  to.resume = o.resume;
  to.label = "pretrain";
  to.on_eval = [&](const kiln::TokenTrainEval& e) {
    rows.push_back({e.iter, e.train_loss, e.val_loss, e.lr, e.seconds});
    gpt::write_csv(csv, rows);
    gpt::write_svg(svg, rows,
                   "kiln-lm pretrain: llama, " + std::to_string(o.layers) + " layers, " +
                       std::to_string(o.hidden) + " wide, vocab " + std::to_string(V));
  };
  const kiln::TokenTrainResult r = kiln::train_on_tokens(opt, eval, train_split, val_split, to);
  const double train_rss_mb = peak_rss_mb();  // before the export checks add their graphs

  kiln::models::save_pretrained(*model, o.out);
  copy_tokenizer_files(o.tokenizer, out);
  if (!o.gguf.empty()) kiln::models::save_gguf(*model, o.gguf, &tok);

  // Check what was written against the model in memory (one validation batch).
  std::vector<int32_t> check_ids(size_t(kEvalBatch * T));
  for (size_t i = 0; i < check_ids.size(); ++i) check_ids[i] = int32_t(val_split.id(int64_t(i)));
  const std::vector<float> want = logits_of(*model, cpu, check_ids, kEvalBatch, T);
  {
    kiln::Context ctx2;  // the same matmul precision: the same products, bit for bit
    ctx2.set_matmul_precision(o.matmul_precision());
    auto loaded = kiln::models::load_pretrained(ctx2, cpu, o.out);
    const double d = reload_difference(want, *loaded, cpu, check_ids, kEvalBatch, T, o.out);
    std::fprintf(stderr, "saved %s (Hugging Face directory): reloaded logits differ by %.3g\n",
                 o.out.c_str(), d);
  }
  if (!o.gguf.empty()) {
    kiln::Context ctx3;
    ctx3.set_matmul_precision(o.matmul_precision());
    auto loaded = kiln::models::load_gguf(ctx3, cpu, o.gguf);
    const double d = reload_difference(want, *loaded, cpu, check_ids, kEvalBatch, T, o.gguf);
    std::fprintf(stderr, "saved %s (GGUF with the vocabulary): reloaded logits differ by %.3g\n",
                 o.gguf.c_str(), d);
  }
  std::printf("val_loss=%.4f train_tokens_per_s=%.0f train_time_s=%.2f peak_rss_mb=%.1f\n",
              r.val_loss, r.tokens_per_s, r.train_time_s, train_rss_mb);
  return 0;
}

}  // namespace

Command add_pretrain(CLI::App& app) {
  auto o = std::make_shared<PretrainOptions>();
  CLI::App* s = app.add_subcommand(
      "pretrain", "train a small Llama model from scratch and save it as a Hugging Face directory");
  s->add_option("--tokenizer", o->tokenizer,
                "tokenizer.json or its directory (bash scripts/get-tokenizers.sh)")
      ->capture_default_str();
  s->add_option("--data", o->data, "corpus: a directory of *.txt (bash scripts/get-sotu.sh)")
      ->capture_default_str();
  s->add_option("--out", o->out, "the Hugging Face directory written at the end")
      ->capture_default_str();
  s->add_option("--checkpoint", o->checkpoint,
                "checkpoint written at every evaluation (default: <out>.ckpt.gguf)");
  s->add_option("--cache", o->cache,
                "token cache of the corpus (default: <out's dir>/<data>.<tokenizer>.tok)");
  s->add_option("--gguf", o->gguf, "also write a GGUF file with the vocabulary (llama.cpp)");
  s->add_option("--hidden", o->hidden)->capture_default_str()->check(CLI::PositiveNumber);
  s->add_option("--layers", o->layers)->capture_default_str()->check(CLI::PositiveNumber);
  s->add_option("--heads", o->heads)->capture_default_str()->check(CLI::PositiveNumber);
  s->add_option("--kv-heads", o->kv_heads, "key/value heads (fewer: grouped-query attention)")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  s->add_option("--intermediate", o->intermediate, "MLP width")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  s->add_option("--block", o->block, "tokens per training window (the context)")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  s->add_option("--batch", o->batch)->capture_default_str()->check(CLI::PositiveNumber);
  s->add_option("--iters", o->iters)->capture_default_str()->check(CLI::PositiveNumber);
  s->add_option("--lr", o->lr)->capture_default_str();
  s->add_option("--min-lr", o->min_lr)->capture_default_str();
  s->add_option("--warmup", o->warmup)->capture_default_str();
  s->add_option("--beta1", o->beta1)->capture_default_str();
  s->add_option("--beta2", o->beta2)->capture_default_str();
  s->add_option("--weight-decay", o->weight_decay)->capture_default_str();
  s->add_option("--clip", o->clip, "gradient clipping at this global norm (0: off)")
      ->capture_default_str();
  s->add_option("--eval-interval", o->eval_interval, "iterations between validation + checkpoint")
      ->capture_default_str();
  s->add_option("--eval-windows", o->eval_windows, "validation windows (a multiple of 8)")
      ->capture_default_str();
  s->add_option("--stop-after", o->stop_after,
                "stop (with a checkpoint) after this many iterations; 0: run to --iters")
      ->capture_default_str();
  s->add_flag("--resume", o->resume, "continue from the checkpoint (weights, AdamW state, step)");
  s->add_option("--seed", o->seed, "seed of the init and the batches")->capture_default_str();
  s->add_option("--precision", o->precision,
                "matmul precision: f32 or bf16 (bf16 operands, f32 accumulation; weights, "
                "gradients and AdamW state stay f32; the saved model is f32)")
      ->check(CLI::IsMember({"f32", "bf16"}))
      ->capture_default_str();
  s->add_option("--threads", o->threads)->capture_default_str()->check(CLI::Range(1, 1024));
  return {s, [o] { return run(*o); }};
}

}  // namespace lm
