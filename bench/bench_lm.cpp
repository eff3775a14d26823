// Language-model inference figures (docs/benchmarks.md, "Llama inference"):
// SmolLM2-135M's shape (30 layers, 576 wide, 9 heads, 3 KV heads, 1536 MLP,
// 49152 vocabulary, tied head) built in-process with random weights, f32, on
// the CPU backend, next to the machine limits measured in the same run:
//   fma_peak     GFLOP/s of a register-only FMA loop on the same threads (the
//                widest vectors kiln's kernels use), the prefill's ceiling;
//   stream_read  GB/s of a streaming read of 1.25 GB on the same threads;
//   weights      bytes of weights one generated token reads (every parameter
//                once: the tied head reads the whole embedding table), so
//                stream_read / weights is the memory-bound ceiling of
//                generation at batch 1;
//   prefill      one forward of --prefill tokens (logits of every position, as
//                the PyTorch reference), best of --repeats: tokens/s and GFLOP/s
//                (the linear layers, the head and causal attention's useful
//                products) as a fraction of fma_peak.
// --profile runs the prefill graph node by node and prints the time per op
// (KILN_PROFILE_SHAPES=1: per op and output shape). --cpu-time times the
// prefill and the profile in process CPU time instead of wall time (for a
// loaded machine, with --threads 1; the fraction then is not the quiet one).
//
//   build/release/bench/bench_lm [--threads 2] [--prefill 512] [--repeats 3] [--profile]
//   [--cpu-time]
// (not a Google Benchmark program: it ignores the --benchmark_* flags that
// scripts/bench.sh passes to every program).
//
// Generation with a KV cache (tokens/s at batch 1) comes from the generation
// API (kiln-lm generate); this program prints its ceiling and marks the place.
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "kiln/ext/alloc.h"
#include "kiln/ext/tensor_node.h"
#include "kiln/kiln.h"
#include "kiln/models.h"
#include "llama_shape.h"

#if defined(__AVX512F__) || defined(__AVX__)
#include <immintrin.h>
#endif

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// The clock of the prefill and profile timings: wall time, or with --cpu-time
// the process's CPU time (on a machine shared with other work, at --threads 1,
// time the process was descheduled does not count).
bool g_cpu_time = false;
double now_s() {
  if (!g_cpu_time) return std::chrono::duration<double>(Clock::now().time_since_epoch()).count();
  timespec ts;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return double(ts.tv_sec) + 1e-9 * double(ts.tv_nsec);
}

// Runs f(thread index) on n threads at once and returns the wall time.
template <class F>
double on_threads(int n, F f) {
  std::vector<std::thread> ts;
  const auto t0 = Clock::now();
  for (int i = 0; i < n; ++i) ts.emplace_back(f, i);
  for (auto& t : ts) t.join();
  return seconds_since(t0);
}

// ---- FMA peak: 16 independent accumulators, enough to cover the FMA latency
// times the FMA ports of current x86 cores.
#if defined(__AVX512F__)
using V = __m512;
constexpr int kLanes = 16;
inline V vset(float x) { return _mm512_set1_ps(x); }
inline V vfma(V a, V b, V c) { return _mm512_fmadd_ps(a, b, c); }
inline float vsum(V a) { return _mm512_reduce_add_ps(a); }
#elif defined(__AVX2__) && defined(__FMA__)
using V = __m256;
constexpr int kLanes = 8;
inline V vset(float x) { return _mm256_set1_ps(x); }
inline V vfma(V a, V b, V c) { return _mm256_fmadd_ps(a, b, c); }
inline float vsum(V a) {
  alignas(32) float f[8];
  _mm256_store_ps(f, a);
  return f[0] + f[1] + f[2] + f[3] + f[4] + f[5] + f[6] + f[7];
}
#else
struct V {
  float v;
};
constexpr int kLanes = 1;
inline V vset(float x) { return {x}; }
inline V vfma(V a, V b, V c) { return {a.v * b.v + c.v}; }
inline float vsum(V a) { return a.v; }
#endif

double fma_peak_gflops(int threads) {
  constexpr int kAcc = 16;
  const int64_t iters = 20'000'000;
  std::vector<float> sink(static_cast<size_t>(threads));
  double best = 0;
  for (int rep = 0; rep < 3; ++rep) {
    const double s = on_threads(threads, [&](int t) {
      V acc[kAcc];
      for (int i = 0; i < kAcc; ++i) acc[i] = vset(float(i + t));
      const V a = vset(0.999999f), b = vset(1e-7f);
      for (int64_t k = 0; k < iters; ++k)
        for (int i = 0; i < kAcc; ++i) acc[i] = vfma(acc[i], a, b);
      float r = 0;
      for (int i = 0; i < kAcc; ++i) r += vsum(acc[i]);
      sink[size_t(t)] = r;
    });
    best = std::max(best, double(threads) * double(iters) * kAcc * kLanes * 2 / s / 1e9);
  }
  if (sink[0] == 12345.0f) std::printf("(unlikely)\n");
  return best;
}

// ---- the model
// Multiply-adds x 2 of one forward of T tokens: every linear layer and the head
// on each token, and causal attention's q k^T and p v over the visible keys.
double forward_flops(const kiln::models::LlamaConfig& c, int64_t T) {
  const double h = double(c.hidden_size), hd = double(c.head_dim);
  const double q = double(c.num_attention_heads) * hd, kv = double(c.num_key_value_heads) * hd;
  const double per_layer = h * q + 2 * h * kv + q * h + 3 * h * double(c.intermediate_size);
  const double linear = double(c.num_hidden_layers) * per_layer + h * double(c.vocab_size);
  const double visible = double(T) * double(T + 1) / 2;  // (query, key) pairs
  const double attention =
      double(c.num_hidden_layers) * double(c.num_attention_heads) * visible * hd * 2;
  return 2 * (double(T) * linear + attention);
}

struct Args {
  int threads = 2;
  int64_t prefill = 512;
  int repeats = 3;
  bool profile = false;
  bool cpu_time = false;
};

Args parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    const std::string s = argv[i];
    auto next = [&]() -> const char* {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "bench_lm: %s needs a value\n", s.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (s == "--threads") a.threads = std::atoi(next());
    else if (s == "--prefill") a.prefill = std::atoll(next());
    else if (s == "--repeats") a.repeats = std::atoi(next());
    else if (s == "--profile") a.profile = true;
    else if (s == "--cpu-time") a.cpu_time = true;
    else if (s.rfind("--benchmark", 0) == 0) continue;  // scripts/bench.sh passes these to all
    else {
      std::fprintf(
          stderr,
          "usage: bench_lm [--threads N] [--prefill T] [--repeats R] [--profile] [--cpu-time]\n");
      std::exit(2);
    }
  }
  if (a.threads < 1 || a.prefill < 1 || a.repeats < 1) {
    std::fprintf(stderr, "bench_lm: threads, prefill and repeats must be >= 1\n");
    std::exit(2);
  }
  return a;
}

// Time per op of the graph run node by node (one pool dispatch each).
void profile(kiln::CpuBackend& cpu, const kiln::Graph& g, double total_s) {
  using kiln::detail::TensorNode;
  const auto& nodes = g.nodes();
  const bool per_shape = std::getenv("KILN_PROFILE_SHAPES") != nullptr;
  std::map<std::string, double> ms;
  std::map<std::string, int> count;
  for (TensorNode* n : nodes) {
    const double t0 = now_s();
    cpu.compute(std::span<TensorNode* const>(&n, 1));
    std::string key = kiln::op_name(n->op);
    if (per_shape) key += " " + n->shape.str();
    ms[key] += (now_s() - t0) * 1e3;
    ++count[key];
  }
  std::vector<std::pair<double, std::string>> rows;
  double sum = 0;
  for (auto& [k, v] : ms) rows.emplace_back(v, k), sum += v;
  std::sort(rows.rbegin(), rows.rend());
  std::printf("profile: node by node %.1f ms (whole graph %.1f ms)\n", sum, total_s * 1e3);
  for (auto& [v, k] : rows)
    if (v >= 0.05)
      std::printf("  %-40s %8.2f ms %5.1f%%  x%d\n", k.c_str(), v, 100 * v / sum, count[k]);
}

}  // namespace

int main(int argc, char** argv) {
  const Args a = parse(argc, argv);
  g_cpu_time = a.cpu_time;
  const kiln::models::ModelConfig cfg = bench::smollm2_135m_shape();
  const kiln::models::LlamaConfig& lc = *cfg.llama;

  std::printf("bench_lm: SmolLM2-135M shape, random weights, f32, %d threads\n", a.threads);
  const double peak = fma_peak_gflops(a.threads);
  const double bw = bench::stream_read_gbs(a.threads, bench::kStreamBytes);
  std::printf("fma_peak_gflops=%.1f stream_read_gbs=%.2f\n", peak, bw);

  kiln::Context ctx;
  kiln::CpuBackend cpu(a.threads);
  kiln::models::ModelOptions opt;
  opt.max_seq_len = std::max<int64_t>(a.prefill, 2048);
  auto model = kiln::models::make_llama(ctx, cfg, opt);
  model->allocate(cpu);
  model->init(1);
  model->eval();

  // Every parameter is read once per generated token (the tied head reads the
  // whole embedding table; with an untied one the table would count one row).
  int64_t param_bytes = 0;
  for (const auto& [name, p] : model->named_parameters())
    param_bytes += p.numel() * int64_t(kiln::dtype_size(p.dtype()));
  const double weights = double(param_bytes);
  std::printf("weights_bytes_per_token=%.0f generation_ceiling_tokens_per_s=%.2f\n", weights,
              bw * 1e9 / weights);

  const int64_t T = a.prefill;
  kiln::Tensor ids = ctx.input(kiln::i32, {1, T}, "input_ids");
  kiln::Tensor logits = (*model)(ids);
  kiln::Graph g = kiln::Graph::forward(logits);
  kiln::GraphAllocator galloc(cpu.buffer_type());
  galloc.alloc(g);
  std::vector<int32_t> tok(static_cast<size_t>(T));
  for (int64_t i = 0; i < T; ++i) tok[size_t(i)] = int32_t((i * 7919 + 13) % lc.vocab_size);
  ids.set(tok);
  cpu.compute(g);  // warm-up: pages, caches
  double best = 1e30;
  for (int r = 0; r < a.repeats; ++r) {
    const double t0 = now_s();
    cpu.compute(g);
    best = std::min(best, now_s() - t0);
  }
  const double flops = forward_flops(lc, T);
  std::printf(
      "prefill: tokens=%lld seconds=%.4f tokens_per_s=%.1f gflop=%.2f gflops=%.1f "
      "peak_fraction=%.3f graph_nodes=%zu activations_mb=%.1f\n",
      static_cast<long long>(T), best, double(T) / best, flops / 1e9, flops / best / 1e9,
      flops / best / 1e9 / peak, g.nodes().size(), double(galloc.buffer_size()) / 1e6);

  // ---- generation (KV cache, batch 1, greedy) is measured by bench_generate
  // (kiln/generate.h); scripts/bench-lm.sh runs both. Here: its memory-bound ceiling.
  std::printf("generation ceiling %.2f tokens/s, 85%% of it %.2f (decode speed: bench_generate)\n",
              bw * 1e9 / weights, 0.85 * bw * 1e9 / weights);

  if (a.profile) profile(cpu, g, best);
  return 0;
}
