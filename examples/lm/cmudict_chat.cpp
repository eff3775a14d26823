// kiln-lm cmudict-chat: the CMU Pronouncing Dictionary as JSONL conversations
// (cmudict.h) for kiln-lm finetune and eval-chat: held-out words (a hash of
// the word picks them) in one file, the rest in the other, each file in the
// order of the words' hashes (so a --val-split of it is a random sample).
//   kiln-lm cmudict-chat --dict data/cmudict/dict.txt --train train.jsonl --held held.jsonl
//                        [--held-per-mille 20] [--train-words N]
#include <algorithm>
#include <cstdio>
#include <fstream>
#include <memory>
#include <string>

#include "cmudict.h"
#include "commands.h"
#include "kiln/error.h"
#include "lm_model.h"

namespace lm {
namespace {

constexpr const char* kCmudictCmd = "kiln-lm cmudict-chat";

struct CmudictChatOptions {
  std::string dict, train, held;
  int held_per_mille = 20;
  int64_t train_words = 0;
};

// Writes entries (sorted by the hash that orders them) as JSONL.
void write_conversations(const std::string& path, const std::vector<CmudictEntry>& entries) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) kiln::fail(kCmudictCmd, "cannot write ", path);
  for (const CmudictEntry& e : entries) out << cmudict_conversation(e) << '\n';
  out.flush();
  if (!out) kiln::fail(kCmudictCmd, "write to ", path, " failed");
}

int run_cmudict_chat(const CmudictChatOptions& o) {
  const Cmudict d = parse_cmudict(read_text(o.dict, kCmudictCmd), o.dict);
  std::vector<CmudictEntry> train, held;
  for (const CmudictEntry& e : d.entries)
    (cmudict_held_out(e.word, o.held_per_mille) ? held : train).push_back(e);
  // File order says nothing of the split: the words' hashes order both files.
  auto by_hash = [](const CmudictEntry& a, const CmudictEntry& b) {
    const uint64_t ha = cmudict_hash(a.word), hb = cmudict_hash(b.word);
    return ha != hb ? ha < hb : a.word < b.word;
  };
  std::sort(train.begin(), train.end(), by_hash);
  std::sort(held.begin(), held.end(), by_hash);
  const size_t all_train = train.size();
  if (o.train_words > 0 && size_t(o.train_words) < train.size())
    train.resize(size_t(o.train_words));
  write_conversations(o.train, train);
  write_conversations(o.held, held);
  std::printf(
      "%s: %zu words (%lld other pronunciations and %lld non-word entries left out): %zu train "
      "(of %zu) in %s, %zu held out in %s\n",
      kCmudictCmd, d.entries.size(), (long long)d.alternates, (long long)d.skipped, train.size(),
      all_train, o.train.c_str(), held.size(), o.held.c_str());
  return 0;
}

}  // namespace

Command add_cmudict_chat(CLI::App& app) {
  auto o = std::make_shared<CmudictChatOptions>();
  CLI::App* c = app.add_subcommand(
      "cmudict-chat", "the CMU Pronouncing Dictionary as JSONL conversations (train, held out)");
  c->add_option("--dict", o->dict, "CMUdict's dict.txt (scripts/get-cmudict.sh)")->required();
  c->add_option("--train", o->train, "JSONL file of the training words")->required();
  c->add_option("--held", o->held, "JSONL file of the held-out words")->required();
  c->add_option("--held-per-mille", o->held_per_mille, "held-out words per 1000 (by hash)")
      ->check(CLI::Range(1, 999))
      ->capture_default_str();
  c->add_option("--train-words", o->train_words,
                "keep only this many training words (the first by hash; 0: all)")
      ->capture_default_str();
  return {c, [o] { return run_cmudict_chat(*o); }};
}

}  // namespace lm
