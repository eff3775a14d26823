// kiln_greedy_probe: kiln's side of the llama.cpp comparison
// (tests/llamacpp/check.mjs). Loads a model (a Hugging Face directory with its
// tokenizer files, or a GGUF file with its vocabulary), encodes the prompt with
// the model's tokenizer (BOS included), and decodes greedily by recomputing the
// whole sequence each step (no KV cache, so nothing but the forward pass is
// compared). Prints one JSON object:
//   {"prompt_ids": [...], "ids": [...], "text": "...",
//    "top": [[[id, prob], ...] per step]}   (the `top` most probable next tokens)
//   kiln_greedy_probe MODEL PROMPT TOKENS [TOP]
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "kiln/ext/alloc.h"
#include "kiln/kiln.h"
#include "kiln/tokenizer.h"

namespace {

std::string json_string(const std::string& s) {
  std::string o = "\"";
  for (unsigned char c : s) {
    if (c == '"' || c == '\\') {
      o += '\\';
      o += char(c);
    } else if (c < 0x20) {
      char b[8];
      std::snprintf(b, sizeof b, "\\u%04x", c);
      o += b;
    } else {
      o += char(c);
    }
  }
  return o + "\"";
}

int run(const std::string& path, const std::string& prompt, int64_t n_new, int64_t top) {
  kiln::Context ctx;
  kiln::CpuBackend cpu(2);
  const bool gguf = std::filesystem::path(path).extension() == ".gguf";
  std::unique_ptr<kiln::models::CausalLM> model =
      gguf ? kiln::models::load_gguf(ctx, cpu, path)
           : kiln::models::load_pretrained(ctx, cpu, path);
  kiln::Tokenizer tok =
      gguf ? kiln::Tokenizer::from_gguf(kiln::GgufFile(path)) : kiln::Tokenizer::load(path);
  model->eval();
  std::vector<int32_t> ids = tok.encode(prompt, true);
  const std::vector<int32_t> prompt_ids = ids;
  const int64_t L = int64_t(ids.size()) + n_new, V = model->vocab_size();
  if (L > model->max_seq_len())
    kiln::fail("greedy_probe", "prompt + tokens = ", L, " > the model's ", model->max_seq_len());
  kiln::Tensor x = ctx.input(kiln::i32, {1, L}, "ids");
  kiln::Tensor logits = (*model)(x);
  kiln::Graph g = kiln::Graph::forward(logits);
  kiln::GraphAllocator galloc(cpu.buffer_type());
  galloc.alloc(g);
  std::string tops = "[";
  for (int64_t step = 0; step < n_new; ++step) {
    std::vector<int32_t> padded(size_t(L), 0);  // later positions do not reach earlier ones
    std::copy(ids.begin(), ids.end(), padded.begin());
    x.set(padded);
    cpu.compute(g);
    const std::vector<float> all = logits.get<float>();
    const float* row = all.data() + (ids.size() - 1) * size_t(V);
    const double mx = *std::max_element(row, row + V);
    double z = 0;
    for (int64_t v = 0; v < V; ++v) z += std::exp(double(row[v]) - mx);
    std::vector<int32_t> order(static_cast<size_t>(V));
    for (int32_t v = 0; v < int32_t(V); ++v) order[size_t(v)] = v;
    std::partial_sort(order.begin(), order.begin() + top, order.end(), [&](int32_t a, int32_t b) {
      return row[a] > row[b] || (row[a] == row[b] && a < b);
    });
    tops += step ? ",[" : "[";
    for (int64_t k = 0; k < top; ++k) {
      const int32_t v = order[size_t(k)];
      char b[64];
      std::snprintf(b, sizeof b, "%s[%d,%.6g]", k ? "," : "", v, std::exp(double(row[v]) - mx) / z);
      tops += b;
    }
    tops += "]";
    ids.push_back(order[0]);
  }
  tops += "]";
  auto list = [](const std::vector<int32_t>& v, size_t from) {
    std::string s = "[";
    for (size_t i = from; i < v.size(); ++i) s += (i > from ? "," : "") + std::to_string(v[i]);
    return s + "]";
  };
  const std::vector<int32_t> generated(ids.begin() + std::ptrdiff_t(prompt_ids.size()), ids.end());
  std::printf("{\"prompt_ids\": %s, \"ids\": %s, \"text\": %s, \"top\": %s}\n",
              list(prompt_ids, 0).c_str(), list(generated, 0).c_str(),
              json_string(tok.decode(generated)).c_str(), tops.c_str());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 4) {
    std::fprintf(stderr, "usage: kiln_greedy_probe MODEL PROMPT TOKENS [TOP]\n");
    return 2;
  }
  try {
    return run(argv[1], argv[2], std::stoll(argv[3]), argc > 4 ? std::stoll(argv[4]) : 5);
  } catch (const kiln::Error& e) {
    std::fprintf(stderr, "kiln_greedy_probe: %s\n", e.what());
    return 1;
  }
}
