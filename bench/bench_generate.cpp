// Decoding speed with the KV cache (kiln/generate.h) on a random model shaped
// like SmolLM2-135M (30 layers, hidden 576, 9 heads, 3 key/value heads, MLP 1536,
// vocabulary 49152, tied head: 538 MB of f32 weights), and the fraction of the
// machine's memory bandwidth that speed is. Decoding at batch 1 reads every
// weight once per token, so tokens/s x bytes per token is the bandwidth used;
// the bandwidth is measured here with a multi-threaded streaming read.
//
//   bench_generate [--tokens 64] [--prompt 32] [--threads 0] [--layers 30]
//
// Prints one line per run: prompt tokens/s, decode tokens/s, weight bytes read
// per token, read bandwidth, achieved fraction of it.
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <numeric>
#include <string>
#include <thread>
#include <vector>

#include "kiln/kiln.h"

namespace {

using Clock = std::chrono::steady_clock;

// GB/s (1e9 bytes) of reading a 1 GiB array with `threads` threads (best of 5).
double read_bandwidth(int threads) {
  const size_t n = (size_t(1) << 30) / sizeof(uint64_t);
  std::vector<uint64_t> a(n);
  for (size_t i = 0; i < n; ++i) a[i] = i;
  std::vector<uint64_t> sums(size_t(threads) * 8);
  double best = 0;
  for (int rep = 0; rep < 5; ++rep) {
    const auto t0 = Clock::now();
    std::vector<std::thread> ts;
    for (int t = 0; t < threads; ++t)
      ts.emplace_back([&, t] {
        const size_t b = n * size_t(t) / size_t(threads), e = n * size_t(t + 1) / size_t(threads);
        uint64_t s = 0;
        for (size_t i = b; i < e; ++i) s += a[i];
        sums[size_t(t) * 8] = s;
      });
    for (auto& t : ts) t.join();
    const double sec = std::chrono::duration<double>(Clock::now() - t0).count();
    best = std::max(best, double(n * sizeof(uint64_t)) / sec / 1e9);
  }
  if (std::accumulate(sums.begin(), sums.end(), uint64_t(0)) == 42) std::puts("");
  return best;
}

int64_t arg(int argc, char** argv, const char* name, int64_t def) {
  for (int i = 1; i + 1 < argc; ++i)
    if (std::strcmp(argv[i], name) == 0) return std::atoll(argv[i + 1]);
  return def;
}

}  // namespace

int main(int argc, char** argv) {
  const int64_t tokens = arg(argc, argv, "--tokens", 64), prompt = arg(argc, argv, "--prompt", 32);
  int threads = int(arg(argc, argv, "--threads", 0));
  if (threads <= 0) threads = int(std::max(1u, std::thread::hardware_concurrency()));
  kiln::models::ModelConfig cfg;
  cfg.model_type = "llama";
  kiln::models::LlamaConfig c;
  c.vocab_size = 49152, c.hidden_size = 576, c.intermediate_size = 1536;
  c.num_hidden_layers = arg(argc, argv, "--layers", 30);
  c.num_attention_heads = 9, c.num_key_value_heads = 3, c.head_dim = 64;
  c.max_position_embeddings = 8192, c.rms_norm_eps = 1e-5, c.rope_theta = 100000;
  c.tie_word_embeddings = true;
  cfg.llama = c;

  kiln::Context ctx;
  kiln::CpuBackend cpu(threads);
  kiln::models::ModelOptions mo;
  mo.max_seq_len = 2048;
  auto model = kiln::models::make_model(ctx, cfg, mo);
  model->allocate(cpu);
  model->init(1);
  int64_t weight_bytes = 0;  // each parameter once (the tied head reads the embedding)
  for (const auto& [name, t] : model->named_parameters()) weight_bytes += t.numel() * 4;

  kiln::models::Generator gen(*model, cpu);
  std::vector<int32_t> ids(static_cast<size_t>(prompt));
  for (int64_t i = 0; i < prompt; ++i) ids[size_t(i)] = int32_t((i * 7919) % c.vocab_size);
  kiln::models::GenerateOptions o;
  o.max_new_tokens = tokens;
  o.sampling.temperature = 0;
  o.ignore_eos = true;
  const size_t nodes_before = ctx.size();
  gen.generate(ids, o);  // warm-up: builds the graphs, touches the memory
  const size_t nodes_per_graph = (ctx.size() - nodes_before) / std::max<size_t>(gen.graphs(), 1);
  const kiln::models::GenerationResult r = gen.generate(ids, o);
  const double tps = r.stats.decode_tokens_per_s();
  const double used = tps * double(weight_bytes) / 1e9;
  const double bw = read_bandwidth(threads);
  std::printf(
      "layers=%lld threads=%d prompt=%lld prompt_tokens_per_s=%.1f decode_tokens=%lld "
      "decode_tokens_per_s=%.2f weight_mb=%.1f weights_gb_per_s=%.2f read_bandwidth_gb_per_s=%.2f "
      "fraction=%.3f graphs=%zu context_nodes_per_graph=%zu\n",
      (long long)c.num_hidden_layers, threads, (long long)prompt, r.stats.prompt_tokens_per_s(),
      (long long)r.stats.decode_steps, tps, double(weight_bytes) / 1e6, used, bw, used / bw,
      gen.graphs(), nodes_per_graph);
  return 0;
}
