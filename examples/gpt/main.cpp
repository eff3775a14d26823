// kiln-gpt: trains nanoGPT's character-level (byte) model on the State of the
// Union corpus (docs/gpt.md), evaluates it, and samples text from it.
//
//   kiln-gpt train  [--iters 2000 ...]      -> out/gpt.gguf (+ .csv, .svg curves)
//                   [--backend cuda]        on the GPU (eval and sample run on the CPU)
//                   [--tf32]                f32 matmuls on TF32 tensor cores (cuda; off by default)
//   kiln-gpt eval   [--model out/gpt.gguf]  validation loss of a saved model
//   kiln-gpt sample [--prompt "..." --tokens 200 --temperature 0.8 --top-k 40]
//
// train ends with one summary line
//   val_loss=… train_tokens_per_s=… train_time_s=… peak_rss_mb=… planned_mb=…
// (tokens/s counted after the first 10 iterations). The defaults are nanoGPT's
// CPU recipe: 4 layers, 4 heads, 128 wide, block 64, batch 12, AdamW lr 1e-3,
// betas (0.9, 0.99), weight decay 0.1 on matrices, clipping at norm 1, 100
// warm-up steps then cosine decay to 1e-4 at the last iteration.
// Exit status: 0 on success, 1 on a kiln::Error (message on stderr), 2 on a bad
// command line.
#include <sys/resource.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "gpt_model.h"
#include "kiln/kiln.h"
#include "kiln/nn.h"
#include "kiln/token_dataset.h"
#include "kiln/token_train.h"
#include "kv_cache.h"
#include "report.h"

namespace {

using kiln::Tensor;
using Clock = std::chrono::steady_clock;

struct Options {
  gpt::GptConfig model;
  std::string data = "data/sotu", out = "out/gpt.gguf";
  int64_t batch = 12, iters = 2000, warmup = 100, eval_interval = 250, eval_windows = 200;
  int64_t stop_after = 0;  // iterations in this run (0: up to --iters); --resume continues
  float lr = 1e-3f, min_lr = 1e-4f, beta1 = 0.9f, beta2 = 0.99f, weight_decay = 0.1f, clip = 1.0f;
  uint64_t seed = 1337;
  int threads = 2;
  std::string backend = "cpu";  // train: kiln::make_backends names ("cuda": the GPU, CPU fallback)
  bool resume = false;
  bool tf32 = false;                 // train --backend cuda: f32 matmuls on TF32 tensor cores
  std::string precision = "f32";     // train, eval: matmul precision (kiln/context.h)
  std::vector<std::string> no_pass;  // train: graph passes left out (kiln/graph_passes.h)
  // sample
  std::string prompt = "\n";
  int64_t tokens = 300, top_k = 40;
  float temperature = 0.8f;
  bool no_cache = false, check_cache = false;
};

const char* kFetchHint = "bash scripts/get-sotu.sh";
constexpr int64_t kEvalBatch = 8;  // validation windows per forward pass

// The default graph passes of `kind` without those named by --no-pass.
kiln::GraphPasses passes_without(const std::vector<std::string>& names, kiln::GraphKind kind) {
  kiln::GraphPasses s = kiln::GraphPasses::defaults(kind);
  for (const std::string& n : names) {
    const kiln::GraphPasses off = kiln::GraphPasses::parse(n);
    for (const kiln::GraphPassInfo& i : kiln::graph_pass_table())
      if (off.has(i.pass)) s = s.without(i.pass);
  }
  return s;
}

double peak_rss_mb() {
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  return double(ru.ru_maxrss) / 1024.0;  // KiB on Linux
}

// The config is stored in the model file, so eval and sample rebuild the same model.
std::vector<std::pair<std::string, kiln::GgufValue>> config_metadata(const gpt::GptConfig& c) {
  return {{"gpt.n_layer", c.n_layer}, {"gpt.n_head", c.n_head}, {"gpt.n_embd", c.n_embd},
          {"gpt.block", c.block},     {"gpt.vocab", c.vocab},   {"gpt.bias", c.bias}};
}

gpt::GptConfig config_from(const kiln::GgufFile& f) {
  gpt::GptConfig c;
  c.n_layer = f.get("gpt.n_layer").as_int();
  c.n_head = f.get("gpt.n_head").as_int();
  c.n_embd = f.get("gpt.n_embd").as_int();
  c.block = f.get("gpt.block").as_int();
  c.vocab = f.get("gpt.vocab").as_int();
  c.bias = f.get("gpt.bias").as_bool();
  return c;
}

int train(const Options& o) {
  kiln::TokenDataset corpus = kiln::load_text_corpus(o.data, kFetchHint);
  auto [train_split, val_split] = corpus.split(0.9);

  kiln::Context ctx;
  if (o.precision == "bf16") ctx.set_matmul_precision(kiln::bf16);
  gpt::Gpt model(ctx, o.model);
  // The first backend holds the weights and runs what it can; with "cuda" alone
  // the CPU runs the ops it lacks (kiln/registry.h, host_fallback).
  std::vector<std::unique_ptr<kiln::Backend>> owned = kiln::make_backends(
      o.backend, {.n_threads = o.threads, .host_fallback = true, .tf32 = o.tf32});
  // Timings compare only at one TF32 setting: say which (docs/cuda.md).
  if (o.backend.find("cuda") != std::string::npos)
    std::fprintf(stderr, "kiln-gpt: cuda f32 matmuls %s\n",
                 o.tf32 ? "on TF32 (--tf32)" : "in full f32");
  std::vector<kiln::Backend*> backends;
  for (auto& b : owned) backends.push_back(b.get());
  model.allocate(*backends[0]);
  model.init_gpt(o.seed);

  const int64_t B = o.batch, T = o.model.block, V = o.model.vocab;
  Tensor idx = ctx.input(kiln::i32, {B, T}, "idx");
  Tensor targets = ctx.input(kiln::i32, {B, T}, "targets");
  Tensor logits = model(idx);
  kiln::OptimizerParams p;
  p.adamw.lr = o.lr;
  p.adamw.beta1 = o.beta1;
  p.adamw.beta2 = o.beta2;
  kiln::OptConfig oc = kiln::next_token_opt_config(model, idx, logits, targets, o.weight_decay);
  oc.clip_grad_norm = o.clip;
  oc.schedule = kiln::schedule::cosine(p, o.warmup, o.min_lr, o.iters);
  oc.backends = backends;
  oc.passes = passes_without(o.no_pass, kiln::GraphKind::training);
  kiln::OptContext opt(oc);
  kiln::TokenLossEvaluator eval(model, kEvalBatch, T, backends,
                                passes_without(o.no_pass, kiln::GraphKind::inference));

  std::filesystem::create_directories(std::filesystem::path(o.out).parent_path().empty()
                                          ? std::filesystem::path(".")
                                          : std::filesystem::path(o.out).parent_path());
  const std::string csv = gpt::sibling(o.out, ".csv"), svg = gpt::sibling(o.out, ".svg");
  std::vector<gpt::Row> rows;
  if (o.resume) rows = gpt::read_csv(csv);

  kiln::TokenTrainOptions to;
  to.iters = o.iters;
  to.stop_after = o.stop_after;
  to.eval_interval = o.eval_interval;
  to.eval_windows = o.eval_windows;
  to.seed = o.seed;
  to.checkpoint = o.out;
  to.checkpoint_metadata = config_metadata(o.model);
  to.resume = o.resume;
  to.on_eval = [&](const kiln::TokenTrainEval& e) {
    rows.push_back({e.iter, e.train_loss, e.val_loss, e.lr, e.seconds});
    gpt::write_csv(csv, rows);
    gpt::write_svg(svg, rows,
                   "kiln-gpt: " + std::to_string(o.model.n_layer) + " layers, " +
                       std::to_string(o.model.n_embd) + " wide, block " + std::to_string(T));
  };
  const kiln::TokenTrainResult r = kiln::train_on_tokens(opt, eval, train_split, val_split, to);
  // planned_mb: the training graph's planned buffer (activations and temporaries).
  std::printf(
      "val_loss=%.4f train_tokens_per_s=%.0f train_time_s=%.2f peak_rss_mb=%.1f planned_mb=%.2f\n",
      r.val_loss, r.tokens_per_s, r.train_time_s, peak_rss_mb(),
      double(opt.memory_plan().buffer_size) / 1e6);
  return 0;
}

// Builds the model a file describes and loads its weights.
struct Loaded {
  kiln::Context ctx;
  std::unique_ptr<gpt::Gpt> model;
  kiln::CpuBackend cpu;
  Loaded(const std::string& path, int threads) : cpu(threads) {
    kiln::GgufFile f(path);
    model = std::make_unique<gpt::Gpt>(ctx, config_from(f));
    model->allocate(cpu);
    for (auto& [name, t] : model->named_parameters()) f.load(t, name);
    model->eval();
  }
};

int evaluate(const Options& o) {
  kiln::TokenDataset corpus = kiln::load_text_corpus(o.data, kFetchHint);
  auto [train_split, val_split] = corpus.split(0.9);
  Loaded m(o.out, o.threads);
  kiln::TokenLossEvaluator eval(*m.model, kEvalBatch, m.model->config().block, m.cpu);
  std::printf("val_loss=%.4f\n", eval.loss(val_split, o.eval_windows));
  return 0;
}

// Next token from logits: temperature, then the top k, then a draw.
int sample_token(const float* logits, int64_t vocab, float temperature, int64_t top_k,
                 std::mt19937_64& rng) {
  std::vector<double> p(static_cast<size_t>(vocab));
  for (int64_t i = 0; i < vocab; ++i)
    p[size_t(i)] = double(logits[i]) / std::max(1e-6f, temperature);
  if (top_k > 0 && top_k < vocab) {
    std::vector<double> sorted = p;
    std::nth_element(sorted.begin(), sorted.begin() + (top_k - 1), sorted.end(), std::greater<>());
    const double kth = sorted[size_t(top_k - 1)];
    for (double& v : p)
      if (v < kth) v = -INFINITY;
  }
  const double mx = *std::max_element(p.begin(), p.end());
  for (double& v : p) v = std::exp(v - mx);
  std::discrete_distribution<int> d(p.begin(), p.end());
  return d(rng);
}

// Generation at batch 1. By default with the KV cache (kv_cache.h): each new
// byte runs the model for that one position. --no-cache recomputes a batch-1
// graph over the whole block for every byte instead (positions after the
// current length are ignored by the causal mask); --check-cache does both and
// fails when their logits differ. When the context fills the block, it is cut
// to its last block/2 bytes and the cache refilled from them in one batched
// pass (KvDecoder::prefill), as is the prompt.
int sample(const Options& o) {
  Loaded m(o.out, o.threads);
  const gpt::GptConfig& c = m.model->config();
  std::vector<int32_t> tokens(o.prompt.begin(), o.prompt.end());
  for (int32_t& t : tokens) t &= 0xff;
  if (tokens.empty()) tokens.push_back('\n');
  size_t start = tokens.size() > size_t(c.block) ? tokens.size() - size_t(c.block / 2) : 0;

  // The full-context graph (--no-cache, --check-cache).
  Tensor idx, logits;
  std::unique_ptr<kiln::Buffer> full_buf;
  kiln::Graph full;
  std::vector<float> full_row;
  if (o.no_cache || o.check_cache) {
    idx = m.ctx.input(kiln::i32, {1, c.block}, "idx");
    logits = m.model->forward(idx);
    full_buf = kiln::allocate_tensors(m.ctx, m.cpu);
    full = kiln::Graph::forward(logits);
  }
  auto recompute = [&]() -> const float* {
    const size_t len = tokens.size() - start;
    std::vector<int32_t> window(size_t(c.block), 0);
    std::copy(tokens.begin() + std::ptrdiff_t(start), tokens.end(), window.begin());
    idx.set<int32_t>(window);
    m.cpu.compute(full);
    const std::vector<float> all = logits.get<float>();
    full_row.assign(all.begin() + std::ptrdiff_t((len - 1) * size_t(c.vocab)),
                    all.begin() + std::ptrdiff_t(len * size_t(c.vocab)));
    return full_row.data();
  };
  std::unique_ptr<gpt::KvDecoder> dec;
  const float* cached = nullptr;
  auto refill = [&] {
    cached =
        dec->prefill(std::vector<int32_t>(tokens.begin() + std::ptrdiff_t(start), tokens.end()));
  };
  if (!o.no_cache) {
    dec = std::make_unique<gpt::KvDecoder>(*m.model, m.cpu);
    refill();
  }

  std::mt19937_64 rng(o.seed);
  double worst = 0;
  std::fwrite(o.prompt.data(), 1, o.prompt.size(), stdout);
  const auto t0 = Clock::now();
  for (int64_t n = 0; n < o.tokens; ++n) {
    const float* lg = o.no_cache ? recompute() : cached;
    if (o.check_cache) {
      const float* ref = recompute();
      for (int64_t v = 0; v < c.vocab; ++v)
        worst = std::max(worst, double(std::fabs(ref[v] - cached[v])));
    }
    const int next = sample_token(lg, c.vocab, o.temperature, o.top_k, rng);
    tokens.push_back(next);
    std::fputc(next, stdout);
    if (tokens.size() - start > size_t(c.block)) {
      start = tokens.size() - size_t(c.block / 2);
      if (dec) refill();
    } else if (dec) {
      cached = dec->step(next);
    }
  }
  const double secs = std::chrono::duration<double>(Clock::now() - t0).count();
  std::fputc('\n', stdout);
  std::fprintf(stderr, "sample: %lld bytes in %.3f s (%.0f tokens/s, %s)\n", (long long)o.tokens,
               secs, double(o.tokens) / secs, o.no_cache ? "full recompute" : "KV cache");
  if (o.check_cache) {
    std::fprintf(stderr, "check-cache: max |logit difference| cache vs full recompute = %.3g\n",
                 worst);
    if (!(worst <= 1e-3))
      kiln::fail("gpt", "KV-cache logits differ from full recompute by ", worst);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  CLI::App app{"kiln-gpt: a byte-level GPT on the State of the Union corpus (docs/gpt.md)"};
  app.require_subcommand(1);
  auto common = [&o](CLI::App* s) {
    s->add_option("--data", o.data, "corpus directory (bash scripts/get-sotu.sh)")
        ->capture_default_str();
    s->add_option("--model,--out", o.out, "model file (GGUF)")->capture_default_str();
    s->add_option("--threads", o.threads, "CPU threads (sample: 1 unless given)")
        ->capture_default_str();
    s->add_option("--seed", o.seed, "seed (init and batches; sampling)")->capture_default_str();
    s->add_option("--eval-windows", o.eval_windows, "validation windows (a multiple of 8)")
        ->capture_default_str();
  };
  CLI::App* tr = app.add_subcommand("train", "train a model from scratch (or --resume)");
  common(tr);
  tr->add_option("--precision", o.precision,
                 "matmul precision: f32 or bf16 (bf16 operands, f32 accumulation; weights, "
                 "gradients and AdamW state stay f32)")
      ->check(CLI::IsMember({"f32", "bf16"}))
      ->capture_default_str();
  tr->add_option("--backend", o.backend,
                 "backends by name, most preferred first: cpu, blas, cuda, \"cuda,cpu\" "
                 "(an accelerator alone gets the CPU after it)")
      ->capture_default_str();
  tr->add_flag("--tf32", o.tf32,
               "with --backend cuda: f32 matmuls on TF32 tensor cores (faster, ~1e-3 relative "
               "error; PyTorch's torch.backends.cuda.matmul.allow_tf32); default full f32");
  tr->add_option("--n-layer", o.model.n_layer)->capture_default_str();
  tr->add_option("--n-head", o.model.n_head)->capture_default_str();
  tr->add_option("--n-embd", o.model.n_embd)->capture_default_str();
  tr->add_option("--block", o.model.block)->capture_default_str();
  tr->add_option("--dropout", o.model.dropout)->capture_default_str();
  tr->add_option("--batch", o.batch)->capture_default_str();
  tr->add_option("--iters", o.iters)->capture_default_str();
  tr->add_option("--lr", o.lr)->capture_default_str();
  tr->add_option("--min-lr", o.min_lr)->capture_default_str();
  tr->add_option("--warmup", o.warmup)->capture_default_str();
  tr->add_option("--beta1", o.beta1)->capture_default_str();
  tr->add_option("--beta2", o.beta2)->capture_default_str();
  tr->add_option("--weight-decay", o.weight_decay)->capture_default_str();
  tr->add_option("--clip", o.clip, "gradient clipping at this global norm (0: off)")
      ->capture_default_str();
  tr->add_option("--eval-interval", o.eval_interval, "iterations between validation + checkpoint")
      ->capture_default_str();
  tr->add_option("--stop-after", o.stop_after,
                 "stop (with a checkpoint) after this many iterations; 0: run to --iters")
      ->capture_default_str();
  tr->add_flag("--resume", o.resume, "continue from --out (weights, optimizer state, step)");
  tr->add_option("--no-pass", o.no_pass,
                 "leave out this graph pass (repeatable; fuse_bias, fuse_residual, "
                 "bf16_grad_sums, bf16_gelu_inputs, fuse_casts, fold_casts: "
                 "include/kiln/graph_passes.h)");
  CLI::App* ev = app.add_subcommand("eval", "validation loss of a saved model");
  common(ev);
  CLI::App* sa = app.add_subcommand("sample", "generate text from a saved model");
  common(sa);
  sa->add_option("--prompt", o.prompt)->capture_default_str();
  sa->add_option("--tokens", o.tokens, "bytes to generate")->capture_default_str();
  sa->add_option("--temperature", o.temperature)->capture_default_str();
  sa->add_option("--top-k", o.top_k, "0: all")->capture_default_str();
  sa->add_flag("--no-cache", o.no_cache,
               "recompute the whole context for every byte (no KV cache)");
  sa->add_flag("--check-cache", o.check_cache, "also recompute, and fail when the logits differ");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  }
  try {
    if (tr->parsed()) return train(o);
    if (ev->parsed()) return evaluate(o);
    // A decode step is ~2 MFLOP: a second thread costs more in barriers than it
    // gains (docs/benchmarks.md, sampling), so sampling defaults to one.
    if (sa->get_option("--threads")->count() == 0) o.threads = 1;
    return sample(o);
  } catch (const kiln::Error& e) {
    std::fprintf(stderr, "\nerror: %s\n", e.what());
    return 1;
  }
}
