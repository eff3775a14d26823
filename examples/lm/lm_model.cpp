#include "lm_model.h"

#include <sys/resource.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "kiln/error.h"
#include "kiln/io.h"
#include "kiln/lora.h"

namespace lm {

namespace fs = std::filesystem;

bool has_quantized_tensors(const std::string& gguf) {
  const kiln::GgufFile f(gguf);  // named: a temporary would die before the loop
  for (const kiln::GgufTensorInfo& t : f.tensors())
    if (t.quantized()) return true;
  return false;
}

bool is_gguf_file(const std::string& path) {
  if (!fs::is_regular_file(path)) return false;
  std::ifstream in(path, std::ios::binary);
  char magic[4] = {};
  in.read(magic, 4);
  return in && std::string_view(magic, 4) == "GGUF";
}

kiln::Tokenizer load_tokenizer(const std::string& path) {
  if (!is_gguf_file(path)) return kiln::Tokenizer::load(path);
  const kiln::GgufFile f(path);
  if (!f.has("tokenizer.ggml.model"))
    kiln::fail("kiln-lm", path, " holds no tokenizer (tokenizer.ggml.*): give --tokenizer");
  return kiln::Tokenizer::from_gguf(f);
}

std::unique_ptr<LoadedModel> load_model(const std::string& path, int threads, int64_t max_seq_len,
                                        const std::string& adapter,
                                        kiln::models::ModelOptions::WeightDType weights) {
  const auto t0 = std::chrono::steady_clock::now();
  auto m = std::make_unique<LoadedModel>();
  m->cpu = std::make_unique<kiln::CpuBackend>(threads);
  kiln::models::ModelOptions opt;
  opt.max_seq_len = max_seq_len;
  opt.weight_dtype = weights;
  const bool dir = fs::is_directory(path);
  // A GGUF file's quantized tensors run as stored (matmul reads the blocks).
  if (!dir && fs::is_regular_file(path) &&
      weights == kiln::models::ModelOptions::WeightDType::f32 && has_quantized_tensors(path))
    opt.weight_dtype = kiln::models::ModelOptions::WeightDType::stored;
  m->model = kiln::models::load(m->ctx, *m->cpu, path, opt);  // directory: HF; file: GGUF
  if (dir) {
    if (fs::exists(fs::path(path) / "tokenizer.json")) m->tokenizer = kiln::Tokenizer::load(path);
  } else {
    kiln::GgufFile f(path);
    if (f.has("tokenizer.ggml.model")) m->tokenizer = kiln::Tokenizer::from_gguf(f);
  }
  if (!adapter.empty()) {
    if (!fs::exists(adapter))
      kiln::fail("kiln-lm", "--adapter ", adapter,
                 " does not exist (a PEFT LoRA directory or a GGUF adapter file)");
    kiln::models::load_lora(*m->model, *m->cpu, adapter);
    kiln::nn::merge_lora(*m->model);  // generation then runs the plain layers
  }
  m->load_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return m;
}

std::unique_ptr<LoadedModel> load_model_with_precision(const std::string& path, int threads,
                                                       int64_t max_seq_len,
                                                       const std::string& adapter,
                                                       const std::string& precision) {
  using WD = kiln::models::ModelOptions::WeightDType;
  if (precision != "bf16") return load_model(path, threads, max_seq_len, adapter);
  // A quantized file keeps its blocks (the quantized products have their own path).
  const bool quantized = !fs::is_directory(path) && fs::exists(path) && has_quantized_tensors(path);
  std::unique_ptr<LoadedModel> m =
      load_model(path, threads, max_seq_len, adapter, quantized ? WD::f32 : WD::bf16);
  m->ctx.set_matmul_precision(kiln::bf16);  // before any graph is built
  return m;
}

void add_precision_option(CLI::App* app, std::string& precision) {
  app->add_option("--precision", precision,
                  "f32, or bf16: matrices held in bf16 (half the memory and bytes per token; "
                  "a GGUF file with Q8_0/Q4_0 tensors is loaded as stored), products on bf16 "
                  "operands with f32 accumulation")
      ->check(CLI::IsMember({"f32", "bf16"}))
      ->capture_default_str();
}

std::vector<int32_t> parse_ids(const std::string& text, const std::string& what) {
  std::vector<int32_t> ids;
  std::string cur;
  auto flush = [&] {
    if (cur.empty()) return;
    size_t used = 0;
    long long v = 0;
    try {
      v = std::stoll(cur, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used != cur.size() || v < 0 || v > INT32_MAX)
      kiln::fail("kiln-lm", what, ": '", cur, "' is not a token id (a number >= 0)");
    ids.push_back(int32_t(v));
    cur.clear();
  };
  for (char c : text) {
    if (c == ',' || c == ' ' || c == '\n' || c == '\t') flush();
    else cur += c;
  }
  flush();
  if (ids.empty()) kiln::fail("kiln-lm", what, " holds no token ids");
  return ids;
}

std::string read_text(const std::string& path, const std::string& cmd) {
  std::ifstream f(path, std::ios::binary);
  if (!f) kiln::fail(cmd.c_str(), "cannot open ", path);
  std::ostringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

std::vector<uint32_t> document_ids(const kiln::Tokenizer& tok, const std::vector<std::string>& docs,
                                   int threads) {
  const auto bos = tok.bos_id(), eos = tok.eos_id();
  std::vector<uint32_t> ids;
  for (const std::vector<int32_t>& d : tok.encode_batch(docs, false, threads)) {
    if (bos) ids.push_back(uint32_t(*bos));
    ids.insert(ids.end(), d.begin(), d.end());
    if (eos) ids.push_back(uint32_t(*eos));
  }
  return ids;
}

void copy_tokenizer_files(const std::string& path, const fs::path& out_dir) {
  const bool is_dir = fs::is_directory(path);
  const fs::path dir = is_dir ? fs::path(path) : fs::path(path).parent_path();
  const fs::path json = is_dir ? dir / "tokenizer.json" : fs::path(path);
  // Saved as tokenizer.json whatever the file was called: the name that
  // load_model and Tokenizer::load(dir) look for.
  if (fs::exists(json))
    fs::copy_file(json, out_dir / "tokenizer.json", fs::copy_options::overwrite_existing);
  if (fs::exists(dir / "tokenizer_config.json"))
    fs::copy_file(dir / "tokenizer_config.json", out_dir / "tokenizer_config.json",
                  fs::copy_options::overwrite_existing);
}

double peak_rss_mb() {
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  return double(ru.ru_maxrss) / 1024.0;  // KiB on Linux
}

}  // namespace lm
