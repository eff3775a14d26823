// What the Llama benchmarks share (bench_lm, bench_generate, bench_load): the
// SmolLM2-135M-shaped config they build with random weights, and the one
// streaming-read probe whose GB/s the generation figures are compared with.
#pragma once
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <thread>
#include <vector>

#include "kiln/models.h"

#if defined(__AVX512F__)
#include <immintrin.h>
#endif

namespace bench {

// SmolLM2-135M's shape: 30 layers, 576 wide, 9 heads, 3 KV heads, MLP 1536,
// vocabulary 49152, tied head (538 MB of f32 weights). `layers` shrinks it.
inline kiln::models::ModelConfig smollm2_135m_shape(int64_t layers = 30) {
  kiln::models::LlamaConfig c;
  c.model_type = "llama";
  c.vocab_size = 49152;
  c.hidden_size = 576;
  c.intermediate_size = 1536;
  c.num_hidden_layers = layers;
  c.num_attention_heads = 9;
  c.num_key_value_heads = 3;
  c.head_dim = 64;
  c.max_position_embeddings = 8192;
  c.rms_norm_eps = 1e-5;
  c.rope_theta = 100000.0;
  c.tie_word_embeddings = true;
  kiln::models::ModelConfig cfg;
  cfg.model_type = "llama";
  cfg.llama = c;
  cfg.generation.eos_token_ids = {0};
  cfg.generation.bos_token_id = 0;
  return cfg;
}

// A Llama of `layers` layers of width 4 (9 tensors a layer, plus the tied
// embedding and the final norm): many tensors, few bytes, for timing and
// testing loading (bench_load_layers, tests/models/test_load.cpp).
inline kiln::models::ModelConfig tiny_llama(int64_t layers) {
  kiln::models::LlamaConfig c;
  c.vocab_size = 8;
  c.hidden_size = 4;
  c.intermediate_size = 4;
  c.num_hidden_layers = layers;
  c.num_attention_heads = 1;
  c.num_key_value_heads = 1;
  c.head_dim = 4;
  c.max_position_embeddings = 16;
  c.tie_word_embeddings = true;
  kiln::models::ModelConfig cfg;
  cfg.model_type = "llama";
  cfg.llama = c;
  return cfg;
}

// SmolLM2-135M's shape scaled by 4/3 so that every weight row is whole blocks
// of 256 (the k-quants' block; 576 is not a multiple of 256): 768 wide, 12
// heads of 64, 4 KV heads, MLP 2048, vocabulary 49152, tied head, 30 layers
// (226M params: 904 MB in f32).
inline kiln::models::ModelConfig smollm2_k256_shape(int64_t layers = 30) {
  kiln::models::ModelConfig cfg = smollm2_135m_shape(layers);
  kiln::models::LlamaConfig& c = *cfg.llama;
  c.hidden_size = 768;
  c.intermediate_size = 2048;
  c.num_attention_heads = 12;
  c.num_key_value_heads = 4;
  return cfg;
}

// Bytes of all the model's params (each once: a tied head reads the embedding).
inline int64_t param_bytes(const kiln::nn::Module& model) {
  int64_t bytes = 0;
  for (const auto& [name, t] : model.named_parameters())
    bytes += int64_t(kiln::dtype_row_bytes(t.dtype(), t.numel()));
  return bytes;
}

// GB/s (1e9 bytes) of a streaming read of `bytes` on `threads` threads, each
// summing its contiguous part (first-touched by itself); best of 3 after a warm-up.
inline double stream_read_gbs(int threads, int64_t bytes) {
  const int64_t n = bytes / int64_t(sizeof(float)) / 64 * 64;
  float* p = static_cast<float*>(std::aligned_alloc(64, size_t(n) * sizeof(float)));
  if (!p) return 0;
  auto part = [&](int t, int64_t& i0, int64_t& i1) {
    i0 = n / 64 * t / threads * 64;
    i1 = n / 64 * (t + 1) / threads * 64;
  };
  auto on_threads = [&](auto f) {
    std::vector<std::thread> ts;
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < threads; ++i) ts.emplace_back(f, i);
    for (auto& t : ts) t.join();
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  };
  on_threads([&](int t) {
    int64_t i0, i1;
    part(t, i0, i1);
    for (int64_t i = i0; i < i1; ++i) p[i] = float(i & 7);
  });
  std::vector<float> sink(static_cast<size_t>(threads));
  double best = 0;
  for (int rep = 0; rep < 4; ++rep) {
    const double s = on_threads([&](int t) {
      int64_t i0, i1;
      part(t, i0, i1);
#if defined(__AVX512F__)
      __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
      for (int64_t i = i0; i < i1; i += 64) {
        a0 = _mm512_add_ps(a0, _mm512_load_ps(p + i));
        a1 = _mm512_add_ps(a1, _mm512_load_ps(p + i + 16));
        a2 = _mm512_add_ps(a2, _mm512_load_ps(p + i + 32));
        a3 = _mm512_add_ps(a3, _mm512_load_ps(p + i + 48));
      }
      sink[size_t(t)] =
          _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(a0, a1), _mm512_add_ps(a2, a3)));
#else
      float a[8] = {};
      for (int64_t i = i0; i < i1; i += 8)
        for (int k = 0; k < 8; ++k) a[k] += p[i + k];
      sink[size_t(t)] = a[0] + a[1] + a[2] + a[3] + a[4] + a[5] + a[6] + a[7];
#endif
    });
    if (rep > 0) best = std::max(best, double(n) * sizeof(float) / s / 1e9);  // rep 0: warm-up
  }
  std::free(p);
  if (sink[0] == 12345.0f) std::printf("(unlikely)\n");
  return best;
}

// The bytes of the probe the Llama benchmarks use (well beyond any cache).
constexpr int64_t kStreamBytes = int64_t(1250) << 20;

}  // namespace bench
