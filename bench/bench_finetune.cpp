// Fine-tuning figures (docs/benchmarks.md, "Fine-tuning"): SmolLM2-135M's
// shape (bench/llama_shape.h) with random f32 weights, one training
// configuration per process (peak RSS is per process):
//   --mode lora   LoRA adapters (r 8, alpha 16) on q,k,v,o,gate,up,down, the
//                 base frozen (no gradients, no AdamW state for it);
//   --mode full   every weight trained;
//   --mode qlora  LoRA on a Q4_0 base: ModelOptions::weight_dtype q4_0, the
//                 layers' Linear weights and the tied embedding / head q4_0
//                 and frozen (norms f32), as kiln-lm finetune --quantize.
// AdamW, next-token cross-entropy, batch x seq random token windows; one
// untimed warm-up step, then --steps timed ones. Prints
//   finetune: mode=lora ... tokens_per_s=… step_s=… peak_rss_mb=…
// (peak RSS of the whole process: weights, gradients, optimizer state,
// activations). bench/finetune_pytorch.py is the PyTorch 1.13 counterpart.
//   build/release/bench/bench_finetune [--mode lora] [--threads 2] [--steps 3]
//       [--batch 1] [--seq 256] [--layers 30] [--r 8] [--checkpointing]
// (not a Google Benchmark program: it ignores the --benchmark_* flags that
// scripts/bench.sh passes to every program).
#include <sys/resource.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "kiln/kiln.h"
#include "kiln/token_train.h"
#include "llama_shape.h"

namespace {

struct Args {
  std::string mode = "lora";
  int threads = 2;
  int64_t steps = 3, batch = 1, seq = 256, layers = 30, r = 8;
  float alpha = 16;
  bool checkpointing = false;
};

[[noreturn]] void usage(const char* what) {
  std::fprintf(stderr,
               "bench_finetune: %s\nusage: bench_finetune [--mode lora|full|qlora] [--threads N] "
               "[--steps N] [--batch N] [--seq N] [--layers N] [--r N] [--alpha X] "
               "[--checkpointing]\n",
               what);
  std::exit(2);
}

Args parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    const std::string s = argv[i];
    auto value = [&]() -> const char* {
      if (i + 1 >= argc) usage(("missing value after " + s).c_str());
      return argv[++i];
    };
    if (s == "--mode") a.mode = value();
    else if (s == "--threads") a.threads = std::atoi(value());
    else if (s == "--steps") a.steps = std::atoll(value());
    else if (s == "--batch") a.batch = std::atoll(value());
    else if (s == "--seq") a.seq = std::atoll(value());
    else if (s == "--layers") a.layers = std::atoll(value());
    else if (s == "--r") a.r = std::atoll(value());
    else if (s == "--alpha") a.alpha = float(std::atof(value()));
    else if (s == "--checkpointing") a.checkpointing = true;
    else if (s.rfind("--benchmark", 0) == 0) continue;  // scripts/bench.sh passes these to all
    else usage(("unknown argument " + s).c_str());
  }
  if (a.mode != "lora" && a.mode != "full" && a.mode != "qlora")
    usage("--mode must be lora, full or qlora");
  if (a.threads < 1 || a.steps < 1 || a.batch < 1 || a.seq < 1 || a.layers < 1 || a.r < 1)
    usage("--threads, --steps, --batch, --seq, --layers and --r must be >= 1");
  return a;
}

double peak_rss_mb() {
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  return double(ru.ru_maxrss) / 1024.0;  // KiB on Linux
}

}  // namespace

int main(int argc, char** argv) {
  const Args a = parse(argc, argv);
  try {
    kiln::Context ctx;
    kiln::CpuBackend cpu(a.threads);
    const kiln::models::ModelConfig cfg = bench::smollm2_135m_shape(a.layers);
    kiln::models::ModelOptions mo;
    if (a.mode == "qlora") mo.weight_dtype = kiln::models::ModelOptions::WeightDType::q4_0;
    auto model = kiln::models::make_model(ctx, cfg, mo);
    model->allocate(cpu);
    model->init(1);
    if (a.mode != "full") {
      kiln::nn::LoraConfig lc;
      lc.r = a.r;
      lc.alpha = a.alpha;
      lc.target_modules = {"q_proj",    "k_proj",  "v_proj",   "o_proj",
                           "gate_proj", "up_proj", "down_proj"};
      kiln::nn::add_lora(*model, cpu, lc, "default", 2);
    }
    int64_t trained = 0;
    for (const kiln::Tensor& p : model->parameters())
      if (p.requires_grad()) trained += p.numel();

    const int64_t B = a.batch, T = a.seq, V = cfg.llama->vocab_size;
    model->train();
    kiln::Tensor ids = ctx.input(kiln::i32, {B, T}, "ids");
    kiln::Tensor labels = ctx.input(kiln::i32, {B, T}, "labels");
    kiln::Tensor logits = (*model)(ids);
    kiln::OptimizerParams p;
    p.adamw.lr = 1e-4f;
    kiln::OptConfig oc = kiln::next_token_opt_config(*model, ids, logits, labels, 0.0f);
    oc.schedule = kiln::schedule::constant(p);
    oc.checkpointing = a.checkpointing;
    oc.backends = {&cpu};
    kiln::OptContext opt(oc);

    // The windows finetune_pytorch.py uses: id i = (i * 7919 + 13) mod vocab.
    std::vector<int32_t> x(size_t(B * T)), y(size_t(B * T));
    for (int64_t i = 0; i < B * T; ++i) {
      x[size_t(i)] = int32_t((i * 7919 + 13) % V);
      y[size_t(i)] = int32_t(((i + 1) * 7919 + 13) % V);
    }
    opt.inputs().set(x);
    opt.labels().set(y);
    opt.train_batch();  // warm-up: first touch of every buffer
    const auto t0 = std::chrono::steady_clock::now();
    double loss = 0;
    for (int64_t s = 0; s < a.steps; ++s) loss = opt.train_batch();
    const double secs =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::printf(
        "finetune: mode=%s layers=%lld r=%lld batch=%lld seq=%lld steps=%lld threads=%d "
        "checkpointing=%d trained_params=%lld loss=%.4f step_s=%.3f tokens_per_s=%.1f "
        "peak_rss_mb=%.1f\n",
        a.mode.c_str(), (long long)a.layers, (long long)(a.mode == "full" ? 0 : a.r), (long long)B,
        (long long)T, (long long)a.steps, a.threads, int(a.checkpointing), (long long)trained, loss,
        secs / double(a.steps), double(a.steps * B * T) / secs, peak_rss_mb());
  } catch (const kiln::Error& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 1;
  }
  return 0;
}
