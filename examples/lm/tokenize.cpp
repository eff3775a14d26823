// kiln-lm tokenize: encodes a text (a file, or every *.txt of a directory, each
// file one document) with a tokenizer.json (file or directory) or a GGUF
// file's vocabulary. Prints the number of ids, or with --ids the ids one a line
// (an empty line between documents); the throughput goes to stderr.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "commands.h"
#include "kiln/error.h"
#include "kiln/io.h"
#include "kiln/tokenizer.h"

namespace lm {

namespace {

namespace fs = std::filesystem;

struct TokenizeOptions {
  std::string tokenizer, text;
  bool ids = false, no_special = false;
  int threads = 1;
};

std::string read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) kiln::fail("kiln-lm tokenize", "cannot open ", path);
  std::ostringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

std::vector<std::string> documents(const std::string& path) {
  if (!fs::exists(path)) kiln::fail("kiln-lm tokenize", "--text ", path, " does not exist");
  if (!fs::is_directory(path)) return {read_file(path)};
  std::vector<std::string> names, docs;
  for (const auto& e : fs::directory_iterator(path))
    if (e.path().extension() == ".txt") names.push_back(e.path().string());
  if (names.empty()) kiln::fail("kiln-lm tokenize", "--text ", path, " has no *.txt files");
  std::sort(names.begin(), names.end());
  for (const auto& n : names) docs.push_back(read_file(n));
  return docs;
}

kiln::Tokenizer load(const std::string& path) {
  if (fs::path(path).extension() == ".gguf")
    return kiln::Tokenizer::from_gguf(kiln::GgufFile(path));
  return kiln::Tokenizer::load(path);
}

int run(const TokenizeOptions& o) {
  using Clock = std::chrono::steady_clock;
  auto t0 = Clock::now();
  kiln::Tokenizer tok = load(o.tokenizer);
  double load_s = std::chrono::duration<double>(Clock::now() - t0).count();
  std::vector<std::string> docs = documents(o.text);
  size_t bytes = 0;
  for (const auto& d : docs) bytes += d.size();
  t0 = Clock::now();
  auto ids = tok.encode_batch(docs, !o.no_special, o.threads);
  double s = std::chrono::duration<double>(Clock::now() - t0).count();
  size_t n = 0;
  for (const auto& v : ids) n += v.size();
  if (o.ids) {
    std::string out;
    for (size_t k = 0; k < ids.size(); ++k) {
      if (k > 0) out += '\n';
      for (int32_t id : ids[k]) (out += std::to_string(id)) += '\n';
    }
    std::fwrite(out.data(), 1, out.size(), stdout);
  } else {
    std::printf("%zu\n", n);
  }
  std::fprintf(stderr,
               "%zu tokens from %zu bytes (%zu document%s) in %.3f s: %.1f MB/s on %d thread%s; "
               "load %.0f ms\n",
               n, bytes, docs.size(), docs.size() == 1 ? "" : "s", s,
               s > 0 ? double(bytes) / s / 1e6 : 0.0, o.threads, o.threads == 1 ? "" : "s",
               load_s * 1e3);
  return 0;
}

}  // namespace

Command add_tokenize(CLI::App& app) {
  auto o = std::make_shared<TokenizeOptions>();
  CLI::App* s = app.add_subcommand("tokenize", "token ids of a text, or their count");
  s->add_option("--tokenizer", o->tokenizer,
                "tokenizer.json, a directory holding it, or a .gguf file")
      ->required();
  s->add_option("--text", o->text, "a text file, or a directory of *.txt documents")->required();
  s->add_flag("--ids", o->ids, "print the ids, one a line, instead of their count");
  s->add_flag("--no-special", o->no_special,
              "without the special tokens the post-processor adds (BOS)");
  s->add_option("--threads", o->threads, "threads (documents are encoded in parallel)")
      ->check(CLI::Range(1, 1024));
  return {s, [o] { return run(*o); }};
}

}  // namespace lm
