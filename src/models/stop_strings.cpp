// StopStrings: text streamed until the first stop string, which is never shown.
#include <algorithm>

#include "kiln/error.h"
#include "kiln/sampling.h"

namespace kiln::models {

StopStrings::StopStrings(std::vector<std::string> stops) : stops_(std::move(stops)) {
  for (const std::string& s : stops_)
    if (s.empty()) fail("stop strings", "a stop string is empty");
}

std::string StopStrings::feed(std::string_view text) {
  if (stopped_) return {};
  pending_.append(text);
  size_t first = std::string::npos;
  for (const std::string& s : stops_) first = std::min(first, pending_.find(s));
  if (first != std::string::npos) {
    std::string out = pending_.substr(0, first);
    pending_.clear();
    stopped_ = true;
    return out;
  }
  // Hold back the longest tail that a stop string starts with.
  size_t hold = 0;
  for (const std::string& s : stops_)
    for (size_t k = std::min(s.size() - 1, pending_.size()); k > hold; --k)
      if (pending_.compare(pending_.size() - k, k, s, 0, k) == 0) {
        hold = k;
        break;
      }
  std::string out = pending_.substr(0, pending_.size() - hold);
  pending_.erase(0, pending_.size() - hold);
  return out;
}

std::string StopStrings::flush() {
  std::string out;
  out.swap(pending_);
  return stopped_ ? std::string() : out;
}

}  // namespace kiln::models
