// kiln::models::resize_token_embeddings: a model with more (or fewer) token
// rows, for tokens added to its tokenizer.
#include <algorithm>
#include <map>

#include "kiln/error.h"
#include "kiln/models.h"

namespace kiln::models {

std::unique_ptr<CausalLM> resize_token_embeddings(Context& ctx, Backend& backend,
                                                  const CausalLM& model, int64_t vocab_size) {
  if (vocab_size < 1) fail("models", "resize_token_embeddings: vocab_size ", vocab_size, " < 1");
  ModelConfig cfg = model.config();
  const int64_t old_vocab = model.vocab_size();
  if (cfg.llama) cfg.llama->vocab_size = vocab_size;
  else if (cfg.gpt2) cfg.gpt2->vocab_size = vocab_size;
  else fail("models", "resize_token_embeddings: the model's config has no architecture");
  std::unique_ptr<CausalLM> out = make_model(ctx, cfg);
  out->allocate(backend);
  std::map<std::string, Tensor> old;
  for (const auto& [name, t] : model.named_base_parameters()) old.emplace(name, t);
  for (auto [name, t] : out->named_base_parameters()) {
    const auto it = old.find(name);
    if (it == old.end())
      fail("models", "resize_token_embeddings: the resized model has a param '", name,
           "' the model lacks");
    const Tensor src = it->second;
    if (src.dtype() != f32)
      fail("models", "resize_token_embeddings: param '", name, "' is ", dtype_name(src.dtype()),
           ", not f32 (resize the f32 model, then quantize)");
    std::vector<float> v = src.get<float>();
    if (src.shape() == t.shape()) {
      t.set(v);
      continue;
    }
    // A param with a row per token: [vocab, width].
    if (src.ndim() != 2 || t.ndim() != 2 || src.size(0) != old_vocab || t.size(0) != vocab_size ||
        src.size(1) != t.size(1))
      fail("models", "resize_token_embeddings: param '", name, "' has shape ", src.shape().str(),
           " in the model and ", t.shape().str(), " in the resized one: not a row per token");
    const int64_t width = t.size(1), keep = std::min(old_vocab, vocab_size);
    std::vector<double> mean(size_t(width), 0.0);
    for (int64_t r = 0; r < old_vocab; ++r)
      for (int64_t c = 0; c < width; ++c) mean[size_t(c)] += v[size_t(r * width + c)];
    v.resize(size_t(vocab_size * width));
    for (int64_t r = keep; r < vocab_size; ++r)
      for (int64_t c = 0; c < width; ++c)
        v[size_t(r * width + c)] = float(mean[size_t(c)] / double(old_vocab));
    t.set(v);
  }
  return out;
}

}  // namespace kiln::models
