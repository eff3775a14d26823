// Chat-template figures (docs/benchmarks.md): rendering a 20-turn conversation
// with Qwen3's chat template, and rendering plus tokenizing it, which is what
// a chat turn costs before the model runs.
//   bash scripts/get-tokenizers.sh
//   build/release/bench/bench_chat [--dir=data/tokenizers/qwen3] [benchmark flags]
#include <benchmark/benchmark.h>

#include <cstring>
#include <string>

#include "kiln/chat.h"
#include "kiln/tokenizer.h"

namespace {

std::string g_dir = KILN_SOURCE_DIR "/data/tokenizers/qwen3";

// A system turn and 20 user/assistant turns of a sentence or two each.
std::string conversation() {
  std::string j = R"({"messages": [{"role": "system", "content": "You are a helpful assistant."})";
  for (int k = 0; k < 20; ++k) {
    const bool user = k % 2 == 0;
    j += R"(, {"role": ")";
    j += user ? "user" : "assistant";
    j += R"(", "content": ")";
    j += user ? "Can you tell me more about step " + std::to_string(k / 2 + 1) +
                    " of the recipe, please?"
              : "Sure. In step " + std::to_string(k / 2 + 1) +
                    ", whisk the eggs with the sugar until pale,\\nthen fold in the flour gently.";
    j += R"("})";
  }
  return j + "]}";
}

void BM_Render20Turns(benchmark::State& state) {
  const auto t = kiln::chat::ChatTemplate::load(g_dir);
  const std::string request = conversation();
  size_t bytes = 0;
  for (auto _ : state) {
    std::string prompt = t.apply(request, true);
    bytes = prompt.size();
    benchmark::DoNotOptimize(prompt);
  }
  state.counters["prompt_bytes"] = double(bytes);
}
BENCHMARK(BM_Render20Turns)->Unit(benchmark::kMicrosecond);

void BM_RenderAndTokenize20Turns(benchmark::State& state) {
  const auto t = kiln::chat::ChatTemplate::load(g_dir);
  const kiln::Tokenizer tok = kiln::Tokenizer::load(g_dir);
  const std::string request = conversation();
  size_t ids = 0;
  for (auto _ : state) {
    std::vector<int32_t> out = tok.encode(t.apply(request, true), false);
    ids = out.size();
    benchmark::DoNotOptimize(out);
  }
  state.counters["prompt_tokens"] = double(ids);
}
BENCHMARK(BM_RenderAndTokenize20Turns)->Unit(benchmark::kMicrosecond);

}  // namespace

int main(int argc, char** argv) {
  for (int k = 1; k < argc; ++k)
    if (std::strncmp(argv[k], "--dir=", 6) == 0) {
      g_dir = argv[k] + 6;
      for (int j = k; j + 1 < argc; ++j) argv[j] = argv[j + 1];
      --argc;
      break;
    }
  benchmark::Initialize(&argc, argv);
  benchmark::RunSpecifiedBenchmarks();
  return 0;
}
