// Loading time against the number of tensors (docs/benchmarks.md, "Loading
// models"): Llamas of N tiny layers (width 4, 9 tensors a layer) are written as
// a Hugging Face directory and as a GGUF file, then loaded (models::load) and
// timed. Linear loading keeps the time per tensor flat as N grows; a quadratic
// step shows as a time per tensor that grows with N. Also times refusing a
// config of 100000 layers over files of 2 (the layer check before building).
//   build/release/bench/bench_load_layers [--layers 575,1150,2300,4600]
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "kiln/kiln.h"
#include "kiln/models.h"
#include "llama_shape.h"

namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// Seconds to load `path` (the best of `reps`), and the tensors it has.
double time_load(const std::string& path, int reps, size_t* tensors) {
  double best = 1e30;
  for (int r = 0; r < reps; ++r) {
    kiln::Context ctx;
    kiln::CpuBackend cpu(1);
    const auto t0 = Clock::now();
    auto model = kiln::models::load(ctx, cpu, path, {.max_seq_len = 4});
    best = std::min(best, seconds_since(t0));
    *tensors = model->named_parameters().size();
  }
  return best;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<int64_t> layers = {575, 1150, 2300, 4600};
  for (int i = 1; i + 1 < argc; i += 2)
    if (std::string(argv[i]) == "--layers") {
      layers.clear();
      std::stringstream ss(argv[i + 1]);
      for (std::string x; std::getline(ss, x, ',');) layers.push_back(std::atoll(x.c_str()));
    }
  const fs::path dir =
      fs::temp_directory_path() / ("kiln-bench-load-layers-" + std::to_string(getpid()));
  std::printf("| layers | tensors | HF dir s | HF us/tensor | GGUF s | GGUF us/tensor |\n");
  std::printf("|---|---|---|---|---|---|\n");
  for (int64_t L : layers) {
    fs::create_directories(dir);
    {
      kiln::Context ctx;
      kiln::CpuBackend cpu(1);
      auto model = kiln::models::make_model(ctx, bench::tiny_llama(L), {.max_seq_len = 4});
      model->allocate(cpu);
      model->init(1);
      kiln::models::save_pretrained(*model, (dir / "hf").string());
      kiln::models::save_gguf(*model, (dir / "m.gguf").string());
    }
    size_t n = 0;
    const double hf = time_load((dir / "hf").string(), 3, &n);
    const double gguf = time_load((dir / "m.gguf").string(), 3, &n);
    std::printf("| %lld | %zu | %.3f | %.1f | %.3f | %.1f |\n", static_cast<long long>(L), n, hf,
                1e6 * hf / double(n), gguf, 1e6 * gguf / double(n));
    std::fflush(stdout);
    fs::remove_all(dir);
  }
  // A config of 100000 layers over files of 2: refused before anything is built.
  fs::create_directories(dir);
  {
    kiln::Context ctx;
    kiln::CpuBackend cpu(1);
    auto model = kiln::models::make_model(ctx, bench::tiny_llama(2), {.max_seq_len = 4});
    model->allocate(cpu);
    kiln::models::save_pretrained(*model, (dir / "hf").string());
  }
  const std::string cfg_path = (dir / "hf" / "config.json").string();
  std::ifstream in(cfg_path);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const std::string field = "\"num_hidden_layers\": 2";
  text.replace(text.find(field), field.size(), "\"num_hidden_layers\": 100000");
  std::ofstream(cfg_path) << text;
  kiln::Context ctx;
  kiln::CpuBackend cpu(1);
  const auto t0 = Clock::now();
  try {
    kiln::models::load(ctx, cpu, (dir / "hf").string());
    std::printf("num_hidden_layers 100000 over 2 layers: loaded?!\n");
  } catch (const kiln::Error& e) {
    std::printf("num_hidden_layers 100000 over 2 layers: refused in %.4f s: %s\n",
                seconds_since(t0), e.what());
  }
  fs::remove_all(dir);
  return 0;
}
