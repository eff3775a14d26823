// Model loading figures (docs/benchmarks.md): a random model of SmolLM2-135M's
// shape (30 layers, 576 wide, 9 heads, 3 KV heads, MLP 1536, vocab 49152, tied,
// f32: 538 MB of weights) is written as a Hugging Face directory and as a GGUF
// file into a temporary directory; then each of {safetensors, GGUF} x {mmap on,
// off} is loaded in a fresh process (this program exec'ed with --load), which
// reports the load time, its peak RSS (VmHWM: the load alone, nothing of the
// parent) against the weight bytes, and the first and second forward pass over
// `--tokens` tokens (the first one faults the mapped pages in). The same model
// quantized with llama.cpp's Q4_K_M recipe (save_gguf's "q4_k_m") is loaded as
// stored (WeightDType::stored): the blocks matmul reads in place.
//   build/dev/bench/bench_load [--tokens 32] [--threads 1] [--dir DIR (kept)]
// The files are read from the page cache (just written): warm-cache figures.
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "kiln/ext/alloc.h"
#include "kiln/kiln.h"
#include "kiln/models.h"
#include "llama_shape.h"

namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// A field of /proc/self/status in MiB (VmHWM, VmRSS, RssFile, RssAnon; kB there).
double status_mb(const char* field) {
  std::ifstream in("/proc/self/status");
  std::string line;
  const std::string key = std::string(field) + ":";
  while (std::getline(in, line))
    if (line.rfind(key, 0) == 0) return std::atof(line.c_str() + key.size()) / 1024.0;
  return -1;
}

// Writes the random model (in a child process, so that this one's RSS stays
// small for the children it starts).
void write_model(const std::string& dir) {
  const pid_t pid = fork();
  if (pid < 0) throw std::runtime_error("fork failed");
  if (pid == 0) {
    int rc = 0;
    try {
      kiln::Context ctx;
      kiln::CpuBackend cpu;
      auto model = kiln::models::make_model(ctx, bench::smollm2_135m_shape());
      model->allocate(cpu);
      model->init(1234);
      kiln::models::save_pretrained(*model, dir + "/hf");
      kiln::models::save_gguf(*model, dir + "/model.gguf");
      kiln::models::save_gguf(*model, dir + "/model-q4_k_m.gguf", nullptr, "q4_k_m");
    } catch (const std::exception& e) {
      std::fprintf(stderr, "writing the model failed: %s\n", e.what());
      rc = 1;
    }
    std::fflush(nullptr);
    _exit(rc);
  }
  int status = 0;
  waitpid(pid, &status, 0);
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
    throw std::runtime_error("writing the model failed");
}

// The --load mode: one load and two forward passes, one table row.
int load_once(const std::string& format, const std::string& path, bool mmap, int64_t tokens,
              int threads) {
  const double rss_start = status_mb("VmRSS");
  kiln::Context ctx;
  kiln::CpuBackend cpu(threads);
  kiln::models::ModelOptions opt;
  opt.mmap = mmap;
  const bool q4km = format == "gguf-q4_k_m";
  if (q4km) opt.weight_dtype = kiln::models::ModelOptions::WeightDType::stored;
  const auto t0 = Clock::now();
  auto model = format != "hf" ? kiln::models::load_gguf(ctx, cpu, path, opt)
                              : kiln::models::load_pretrained(ctx, cpu, path, opt);
  const double load_s = seconds_since(t0);
  const double hwm_load = status_mb("VmHWM");
  const double weights_mb = double(model->load_stats.bytes_read) / (1024.0 * 1024.0);
  const double mapped_mb = double(model->load_stats.bytes_mapped) / (1024.0 * 1024.0);
  model->eval();
  kiln::Tensor ids = ctx.input(kiln::i32, {1, tokens}, "input_ids");
  kiln::Tensor logits = (*model)(ids);
  kiln::Graph g = kiln::Graph::forward(logits);
  kiln::GraphAllocator galloc(cpu.buffer_type());
  galloc.alloc(g);
  std::vector<int32_t> x(static_cast<size_t>(tokens));
  for (size_t i = 0; i < x.size(); ++i) x[i] = int32_t((i * 7919) % 49152);
  ids.set(x);
  double fwd[2];
  for (double& s : fwd) {
    const auto t1 = Clock::now();
    cpu.compute(g);
    s = seconds_since(t1);
  }
  const float check = logits.get<float>()[0];
  const double hwm = status_mb("VmHWM");
  std::printf(
      "| %-11s | %-4s | %7.3f | %9.0f | %6.0f | %9.0f | %7.3f | %7.3f | %9.0f | %5.2f | %7.0f | "
      "%7.0f |%s\n",
      q4km               ? "GGUF Q4_K_M"
      : format == "gguf" ? "GGUF"
                         : "safetensors",
      mmap ? "on" : "off", load_s, weights_mb, mapped_mb, hwm_load, fwd[0], fwd[1], hwm,
      hwm / weights_mb, status_mb("RssFile"), status_mb("RssAnon"),
      std::isfinite(check) ? "" : " (non-finite logits!)");
  std::fprintf(stderr, "  (RSS at process start: %.0f MiB)\n", rss_start);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  int64_t tokens = 32;
  int threads = 1;
  std::string dir;
  std::string mode, format, path;
  bool mmap = true;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "%s needs a value\n", a.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--tokens") tokens = std::atoll(next().c_str());
    else if (a == "--threads") threads = std::atoi(next().c_str());
    else if (a == "--dir") dir = next();
    else if (a == "--load") {
      mode = "load";
      format = next();
      path = next();
    } else if (a == "--mmap") mmap = next() != "0";
    else if (a.rfind("--benchmark_", 0) == 0) continue;  // scripts/bench.sh's, for the others
    else {
      std::fprintf(stderr,
                   "usage: bench_load [--tokens N] [--threads N] [--dir DIR]\n"
                   "       bench_load --load hf|gguf|gguf-q4_k_m PATH [--mmap 0|1] [--tokens N] "
                   "[--threads N]\n");
      return 2;
    }
  }
  try {
    if (mode == "load") return load_once(format, path, mmap, tokens, threads);
    const bool temp = dir.empty();
    if (temp) {
      std::string tmpl = (fs::temp_directory_path() / "kiln-bench-load-XXXXXX").string();
      if (!mkdtemp(tmpl.data())) throw std::runtime_error("mkdtemp failed");
      dir = tmpl;
    }
    if (!fs::exists(dir + "/model-q4_k_m.gguf")) {
      const auto t0 = Clock::now();
      write_model(dir);
      std::fprintf(stderr, "wrote the model into %s in %.1f s\n", dir.c_str(), seconds_since(t0));
    }
    std::printf(
        "| format | mmap | load s | weights MiB | mapped MiB | peak RSS after load MiB | 1st "
        "forward s | 2nd forward s | peak RSS MiB | peak / weights | RssFile MiB | RssAnon MiB |\n"
        "|---|---|---|---|---|---|---|---|---|---|---|---|\n");
    std::fflush(stdout);
    for (const char* f : {"hf", "gguf", "gguf-q4_k_m"})
      for (const char* m : {"1", "0"}) {
        const std::string name = f;
        const std::string p = name == "hf"     ? dir + "/hf"
                              : name == "gguf" ? dir + "/model.gguf"
                                               : dir + "/model-q4_k_m.gguf";
        const std::string tok = std::to_string(tokens), th = std::to_string(threads);
        const pid_t pid = fork();
        if (pid < 0) throw std::runtime_error("fork failed");
        if (pid == 0) {
          // A fresh process image: its peak RSS (VmHWM) is the load's alone.
          execl("/proc/self/exe", "bench_load", "--load", f, p.c_str(), "--mmap", m, "--tokens",
                tok.c_str(), "--threads", th.c_str(), (char*)nullptr);
          _exit(127);
        }
        int status = 0;
        waitpid(pid, &status, 0);
        if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
          std::fprintf(stderr, "the --load %s run (mmap %s) failed\n", f, m);
      }
    if (temp) fs::remove_all(dir);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_load: %s\n", e.what());
    return 1;
  }
  return 0;
}
