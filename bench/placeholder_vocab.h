// save_gguf with a placeholder vocabulary, so that llama.cpp (which needs one
// to load a file) runs a model that has none: programs then pass token ids,
// never text. Used by bench_generate --save and the tests/llamacpp model writers.
#pragma once
#include <cstdio>
#include <string>
#include <vector>

#include "kiln/io.h"
#include "kiln/kiln.h"
#include "kiln/models.h"

namespace bench {

// save_gguf, plus a placeholder SentencePiece vocabulary of vocab tokens
// (<unk>, <s>, </s>, the 256 byte tokens, then "t<i>"), which llama.cpp needs
// to load a file; the benchmark passes token ids, never text.
inline void save_with_placeholder_vocab(const kiln::models::CausalLM& model,
                                        const std::string& path, int64_t vocab) {
  kiln::models::save_gguf(model, path + ".novocab");
  {
    const kiln::GgufFile f(path + ".novocab");
    kiln::GgufWriter w;
    for (const auto& [k, v] : f.metadata())
      if (k.rfind("tokenizer.", 0) != 0) w.set(k, v);
    std::vector<std::string> tokens;
    std::vector<float> scores;
    std::vector<int32_t> types;
    for (int64_t i = 0; i < vocab; ++i) {
      char b[16];
      if (i < 3) tokens.emplace_back(i == 0 ? "<unk>" : i == 1 ? "<s>" : "</s>");
      else if (i < 259)
        std::snprintf(b, sizeof b, "<0x%02X>", unsigned(i - 3)), tokens.emplace_back(b);
      else tokens.push_back("t" + std::to_string(i));
      scores.push_back(-float(i));
      types.push_back(i == 0 ? 2 : i < 3 ? 3 : i < 259 ? 6 : 1);  // unknown, control, byte, normal
    }
    w.set("tokenizer.ggml.model", "llama");
    w.set("tokenizer.ggml.tokens", std::move(tokens));
    w.set("tokenizer.ggml.scores", scores);
    w.set("tokenizer.ggml.token_type", types);
    w.set("tokenizer.ggml.bos_token_id", uint32_t(1));
    w.set("tokenizer.ggml.eos_token_id", uint32_t(2));
    for (const kiln::GgufTensorInfo& t : f.tensors()) {
      const std::vector<uint8_t> raw = f.read_bytes(t.name);
      if (t.quantized()) w.add_tensor_quantized(t.name, t.ggml_type, t.shape, raw);
      else w.add_tensor_data(t.name, t.dtype, t.shape, raw);
    }
    w.save(path);
  }
  std::remove((path + ".novocab").c_str());
}

// A random model of `cfg` (weights from `seed`) written with the placeholder
// vocabulary: the files the llama.cpp checks run (tests/llamacpp).
inline void save_random_model(const kiln::models::ModelConfig& cfg, const std::string& path,
                              uint64_t seed) {
  kiln::Context ctx;
  kiln::CpuBackend cpu(2);
  auto model = kiln::models::make_model(ctx, cfg);
  model->allocate(cpu);
  model->init(seed);
  save_with_placeholder_vocab(*model, path, model->vocab_size());
}

}  // namespace bench
