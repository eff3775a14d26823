// Batched decoding (kiln/generate.h's BatchGenerator) on a random model shaped
// like SmolLM2-135M (llama_shape.h): aggregate tokens/s of S concurrent greedy
// streams decoded together (one forward pass per step for all of them, each
// weight read once per step) against one stream alone (Generator, the
// one-sequence path).
//
//   bench_batch_generate [--streams 4] [--tokens 64] [--prompt 32] [--threads 2]
//                        [--layers 30] [--weights f32|q8_0|q4_0] [--rounds 3] [--cpu-time]
//
// Prints one line: single-stream decode tokens/s, the batch's aggregate decode
// tokens/s (S x steps / seconds of the steps, prompts excluded), and the ratio
// of the two, medians of `rounds` alternated runs. --cpu-time: per process CPU
// second instead of per second (for a loaded machine).
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <memory>
#include <string>
#include <vector>

#include "bench_args.h"
#include "kiln/kiln.h"
#include "llama_shape.h"

namespace {

using bench::arg;
using bench::sarg;

int32_t argmax(std::span<const float> v) {
  return int32_t(std::max_element(v.begin(), v.end()) - v.begin());
}

// Wall time, or with --cpu-time the process's CPU time (all threads): on a
// loaded machine the work a step costs, not the share of the cores it got.
bool g_cpu_time = false;
double now() {
  if (!g_cpu_time)
    return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch())
        .count();
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return double(ts.tv_sec) + 1e-9 * double(ts.tv_nsec);
}

}  // namespace

int main(int argc, char** argv) {
  const int64_t streams = arg(argc, argv, "--streams", 4), tokens = arg(argc, argv, "--tokens", 64);
  const int64_t prompt = arg(argc, argv, "--prompt", 32);
  const int64_t rounds = std::max<int64_t>(1, arg(argc, argv, "--rounds", 3));
  for (int i = 1; i < argc; ++i) g_cpu_time = g_cpu_time || std::strcmp(argv[i], "--cpu-time") == 0;
  const int threads = int(std::max<int64_t>(1, arg(argc, argv, "--threads", 2)));
  const kiln::models::ModelConfig cfg = bench::smollm2_135m_shape(arg(argc, argv, "--layers", 30));
  const int64_t V = cfg.llama->vocab_size;

  kiln::Context ctx;
  kiln::CpuBackend cpu(threads);
  kiln::models::ModelOptions mo;
  mo.max_seq_len = 1024;
  const std::string wt = sarg(argc, argv, "--weights", "f32");
  if (const auto wd = kiln::models::quantized_weight_dtype_named(wt)) mo.weight_dtype = *wd;
  else if (wt != "f32") {
    std::fprintf(stderr, "bench_batch_generate: --weights must be f32, q8_0 or q4_0\n");
    return 2;
  }
  auto model = kiln::models::make_model(ctx, cfg, mo);
  model->allocate(cpu);
  model->init(1);
  // Stream s's prompt: different ids per stream.
  auto prompt_of = [&](int64_t s) {
    std::vector<int32_t> ids(static_cast<size_t>(prompt));
    for (int64_t i = 0; i < prompt; ++i) ids[size_t(i)] = int32_t((i * 7919 + s * 104729) % V);
    return ids;
  };

  // One stream alone (Generator's decode steps) and S streams together
  // (BatchGenerator), alternated `rounds` times after a warm-up of each
  // (graphs, memory); medians of each.
  kiln::models::Generator gen(*model, cpu);
  kiln::models::BatchGenerator batch(*model, cpu, streams);
  // Generator's decode steps, timed like the batch's.
  auto single_run = [&] {
    gen.reset();
    std::span<const float> l = gen.prefill(prompt_of(0));
    const double t0 = now();
    for (int64_t t = 0; t + 1 < tokens; ++t) l = gen.step(argmax(l));
    return double(tokens - 1) / (now() - t0);
  };
  auto batched = [&] {
    std::vector<int64_t> seqs;
    for (int64_t s = 0; s < streams; ++s) seqs.push_back(batch.start(prompt_of(s)));
    std::vector<kiln::models::BatchGenerator::Token> step(static_cast<size_t>(streams));
    const double t0 = now();
    for (int64_t t = 0; t + 1 < tokens; ++t) {
      for (int64_t s = 0; s < streams; ++s)
        step[size_t(s)] = {seqs[size_t(s)], argmax(batch.logits(seqs[size_t(s)]))};
      batch.step(step);
    }
    const double sec = now() - t0;
    for (int64_t s : seqs) batch.finish(s);
    return double(streams * (tokens - 1)) / sec;
  };
  single_run();
  batched();
  std::vector<double> singles, aggregates;
  for (int64_t r = 0; r < rounds; ++r) {
    singles.push_back(single_run());
    aggregates.push_back(batched());
  }
  auto median = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
  };
  const double single = median(singles), aggregate = median(aggregates);
  std::printf(
      "weights=%s layers=%lld threads=%d clock=%s prompt=%lld decode_tokens=%lld "
      "single_tokens_per_s=%.2f "
      "streams=%lld aggregate_tokens_per_s=%.2f speedup=%.2f rounds=%lld batch_graphs=%zu\n",
      wt.c_str(), (long long)cfg.llama->num_hidden_layers, threads, g_cpu_time ? "cpu" : "wall",
      (long long)prompt, (long long)tokens, single, (long long)streams, aggregate,
      aggregate / single, (long long)rounds, batch.graphs());
  return 0;
}
