// CMUdict as conversations (cmudict.h).
#include "cmudict.h"

#include <array>
#include <nlohmann/json.hpp>

#include "kiln/error.h"

namespace lm {
namespace {

bool cmudict_plain_word(std::string_view w) {
  if (w.empty() || w[0] < 'A' || w[0] > 'Z') return false;
  for (char c : w)
    if (!((c >= 'A' && c <= 'Z') || c == '\'' || c == '.' || c == '-')) return false;
  return true;
}

}  // namespace

uint64_t cmudict_hash(std::string_view word) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : word) {
    h ^= c;
    h *= 1099511628211ull;
  }
  return h;
}

Cmudict parse_cmudict(std::string_view text, const std::string& file) {
  Cmudict d;
  int64_t line_no = 0;
  while (!text.empty()) {
    const size_t nl = text.find('\n');
    std::string_view line = text.substr(0, nl);
    text = nl == std::string_view::npos ? std::string_view() : text.substr(nl + 1);
    ++line_no;
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (line.empty() || line.starts_with(";;;")) continue;
    const size_t sep = line.find("  ");
    if (sep == std::string_view::npos || sep == 0)
      kiln::fail("cmudict", file, ":", line_no, ": not 'WORD  PHONEMES' (two spaces between)");
    const std::string_view word = line.substr(0, sep);
    std::string_view phones = line.substr(sep + 2);
    while (!phones.empty() && phones.front() == ' ') phones.remove_prefix(1);
    while (!phones.empty() && phones.back() == ' ') phones.remove_suffix(1);
    if (phones.empty()) kiln::fail("cmudict", file, ":", line_no, ": '", word, "' has no phonemes");
    if (word.back() == ')' && word.find('(') != std::string_view::npos) {
      ++d.alternates;  // WORD(1): another pronunciation of a word already read
      continue;
    }
    if (!cmudict_plain_word(word)) {
      ++d.skipped;
      continue;
    }
    d.entries.push_back({std::string(word), std::string(phones)});
  }
  return d;
}

bool cmudict_held_out(std::string_view word, int per_mille) {
  return int(cmudict_hash(word) % 1000) < per_mille;
}

std::string cmudict_question(std::string_view word) {
  static constexpr std::array<std::string_view, 4> kPhrasings = {
      "How do you pronounce '%'?", "What are the phonemes of '%'?", "Pronounce '%' in ARPAbet.",
      "Give the pronunciation of '%'."};
  // The upper bits: the split uses the low ones (modulo 1000).
  const std::string_view p = kPhrasings[(cmudict_hash(word) >> 40) % kPhrasings.size()];
  const size_t at = p.find('%');
  std::string q(p.substr(0, at));
  q += word;
  q += p.substr(at + 1);
  return q;
}

std::string cmudict_conversation(const CmudictEntry& e) {
  const nlohmann::json j = {{"messages",
                             {{{"role", "user"}, {"content", cmudict_question(e.word)}},
                              {{"role", "assistant"}, {"content", e.phones}}}}};
  return j.dump();
}

}  // namespace lm
