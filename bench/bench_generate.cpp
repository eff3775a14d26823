// Decoding speed with the KV cache (kiln/generate.h) on a random model shaped
// like SmolLM2-135M (30 layers, hidden 576, 9 heads, 3 key/value heads, MLP 1536,
// vocabulary 49152, tied head: 538 MB of f32 weights), and the fraction of the
// machine's memory bandwidth that speed is. Decoding at batch 1 reads every
// weight once per token, so tokens/s x bytes per token is the bandwidth used;
// the bandwidth is measured here with bench_lm's streaming read (llama_shape.h).
//
//   bench_generate [--tokens 64] [--prompt 32] [--threads 0] [--layers 30]
//                  [--weights f32|q8_0|q4_0|q4_k|q6_k|...] [--shape smollm2|k256]
//                  [--save FILE.gguf]
// (--weights TYPE, any type of kiln/quant_types.def: ModelOptions::weight_dtype,
// so the layers' Linear weights and the tied embedding / head are quantized
// and frozen; norms stay f32; a matrix whose rows are not whole blocks of the
// type stays f32. Decoding then reads each layer's blocks, one embedding row
// and the head's blocks per token. --shape k256: SmolLM2-135M's shape scaled
// to 768 wide (llama_shape.h), where every row is whole blocks of 256, so the
// k-quants apply to every matrix; with smollm2's 576 only ffn_down would.
// --save writes the model (blocks as they are, no vocabulary) for
// scripts/bench-llamacpp-decode.mjs to time the same file in llama.cpp.)
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
#include <string>
#include <thread>
#include <vector>

#include "bench_args.h"
#include "kiln/kiln.h"
#include "llama_shape.h"
#include "placeholder_vocab.h"

namespace {

using bench::arg;
using bench::sarg;

}  // namespace

int main(int argc, char** argv) {
  const int64_t tokens = arg(argc, argv, "--tokens", 64), prompt = arg(argc, argv, "--prompt", 32);
  int threads = int(arg(argc, argv, "--threads", 0));
  if (threads <= 0) threads = int(std::max(1u, std::thread::hardware_concurrency()));
  const std::string shape = sarg(argc, argv, "--shape", "smollm2");
  if (shape != "smollm2" && shape != "k256") {
    std::fprintf(stderr, "bench_generate: --shape must be smollm2 or k256\n");
    return 2;
  }
  const int64_t layers = arg(argc, argv, "--layers", 30);
  const kiln::models::ModelConfig cfg =
      shape == "k256" ? bench::smollm2_k256_shape(layers) : bench::smollm2_135m_shape(layers);
  const kiln::models::LlamaConfig& c = *cfg.llama;

  kiln::Context ctx;
  kiln::CpuBackend cpu(threads);
  kiln::models::ModelOptions mo;
  mo.max_seq_len = 2048;
  // --weights q8_0|q4_0: the Linear weights and the tied embedding / head
  // quantized by make_model (init() then writes quantized values).
  const std::string wt = sarg(argc, argv, "--weights", "f32");
  if (const auto wd = kiln::models::quantized_weight_dtype_named(wt)) mo.weight_dtype = *wd;
  else if (wt != "f32") {
    std::fprintf(stderr,
                 "bench_generate: --weights must be f32 or a quantized type (q8_0, q4_k, ...)\n");
    return 2;
  }
  auto model = kiln::models::make_model(ctx, cfg, mo);
  model->allocate(cpu);
  model->init(1);
  const int64_t weight_bytes = bench::param_bytes(*model);  // read once per token
  if (const std::string save = sarg(argc, argv, "--save", ""); !save.empty())
    bench::save_with_placeholder_vocab(*model, save, c.vocab_size);

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
  const double bw = bench::stream_read_gbs(threads, bench::kStreamBytes);
  std::printf(
      "weights=%s shape=%s layers=%lld threads=%d prompt=%lld prompt_tokens_per_s=%.1f "
      "decode_tokens=%lld "
      "decode_tokens_per_s=%.2f weight_mb=%.1f weights_gb_per_s=%.2f read_bandwidth_gb_per_s=%.2f "
      "fraction=%.3f graphs=%zu context_nodes_per_graph=%zu\n",
      wt.c_str(), shape.c_str(), (long long)c.num_hidden_layers, threads, (long long)prompt,
      r.stats.prompt_tokens_per_s(), (long long)r.stats.decode_steps, tps,
      double(weight_bytes) / 1e6, used, bw, used / bw, gen.graphs(), nodes_per_graph);
  return 0;
}
