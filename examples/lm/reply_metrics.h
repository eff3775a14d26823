// Scores of generated replies against references, unit by unit (units: the
// whitespace-separated words of a reply, e.g. ARPAbet phonemes): exact-match
// rate and the unit error rate (edit distance / reference length, summed over
// the examples: the phoneme error rate of grapheme-to-phoneme work, the word
// error rate of speech recognition). kiln-lm eval-chat prints them.
#pragma once
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace lm {

// The whitespace-separated units of `text`.
std::vector<std::string_view> reply_units(std::string_view text);

// Levenshtein distance between the units of `hyp` and `ref` (insertions,
// deletions and substitutions of whole units cost 1 each).
int64_t unit_edit_distance(std::string_view hyp, std::string_view ref);

struct ReplyScores {
  int64_t examples = 0, exact = 0;
  int64_t edits = 0, ref_units = 0;  // summed over the examples
  // Adds one reply: exact when its units equal the reference's (so spacing
  // and a trailing newline do not count).
  void add(std::string_view hyp, std::string_view ref);
  double exact_match() const { return examples ? double(exact) / double(examples) : 0.0; }
  // Edits per reference unit; can exceed 1 (a long wrong reply).
  double unit_error_rate() const { return ref_units ? double(edits) / double(ref_units) : 0.0; }
};

}  // namespace lm
