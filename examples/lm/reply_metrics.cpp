// Exact match and unit error rate of replies (reply_metrics.h).
#include "reply_metrics.h"

#include <algorithm>

namespace lm {

std::vector<std::string_view> reply_units(std::string_view text) {
  std::vector<std::string_view> units;
  auto space = [](char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; };
  size_t i = 0;
  while (i < text.size()) {
    while (i < text.size() && space(text[i])) ++i;
    size_t j = i;
    while (j < text.size() && !space(text[j])) ++j;
    if (j > i) units.push_back(text.substr(i, j - i));
    i = j;
  }
  return units;
}

int64_t unit_edit_distance(std::string_view hyp, std::string_view ref) {
  const std::vector<std::string_view> h = reply_units(hyp), r = reply_units(ref);
  // One row of the dynamic program: row[j] = distance of h[0..i) to r[0..j).
  std::vector<int64_t> row(r.size() + 1);
  for (size_t j = 0; j <= r.size(); ++j) row[j] = int64_t(j);
  for (size_t i = 1; i <= h.size(); ++i) {
    int64_t diag = row[0];  // distance of h[0..i-1) to r[0..j-1)
    row[0] = int64_t(i);
    for (size_t j = 1; j <= r.size(); ++j) {
      const int64_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diag + (h[i - 1] == r[j - 1] ? 0 : 1)});
      diag = up;
    }
  }
  return row[r.size()];
}

void ReplyScores::add(std::string_view hyp, std::string_view ref) {
  const int64_t d = unit_edit_distance(hyp, ref);
  ++examples;
  if (d == 0) ++exact;
  edits += d;
  ref_units += int64_t(reply_units(ref).size());
}

}  // namespace lm
