// Pre-tokenizers: each step splits every piece further (Hugging Face
// tokenizers' PreTokenizedString::split), with the split behaviours of
// tokenizers' SplitDelimiterBehavior.
#include <algorithm>
#include <utility>

#include "tokenizer/model.h"
#include "tokenizer/utf8.h"

namespace kiln::tok {

namespace {

struct Span {
  size_t begin, end;
  bool match;
};

// Covers the whole piece with spans (gaps and matches, in order, none empty)
// from a list of matches, then applies the behaviour and appends the pieces.
void apply_behavior(std::string_view piece, std::vector<Span>& spans, SplitBehavior behavior,
                    bool invert, std::vector<std::string_view>& out) {
  if (invert)
    for (Span& s : spans) s.match = !s.match;
  std::vector<Span> merged;
  switch (behavior) {
    case SplitBehavior::Removed:
      for (const Span& s : spans)
        if (!s.match) merged.push_back(s);
      break;
    case SplitBehavior::Isolated: merged = spans; break;
    case SplitBehavior::MergedWithPrevious: {
      bool prev_match = false;
      for (const Span& s : spans) {
        if (s.match && !prev_match && !merged.empty()) merged.back().end = s.end;
        else merged.push_back(s);
        prev_match = s.match;
      }
      break;
    }
    case SplitBehavior::MergedWithNext: {
      bool prev_match = false;
      for (size_t k = spans.size(); k-- > 0;) {
        const Span& s = spans[k];
        if (s.match && !prev_match && !merged.empty()) merged.back().begin = s.begin;
        else merged.push_back(s);
        prev_match = s.match;
      }
      std::reverse(merged.begin(), merged.end());
      break;
    }
    case SplitBehavior::Contiguous: {
      bool prev_match = false;
      for (const Span& s : spans) {
        if (s.match == prev_match && !merged.empty()) merged.back().end = s.end;
        else merged.push_back(s);
        prev_match = s.match;
      }
      break;
    }
  }
  for (const Span& s : merged)
    if (s.end > s.begin) out.push_back(piece.substr(s.begin, s.end - s.begin));
}

// Matches as spans: gaps between them are non-matches.
struct SpanBuilder {
  std::vector<Span> spans;
  size_t prev = 0;
  void match(size_t b, size_t e) {
    if (b > prev) spans.push_back({prev, b, false});
    if (e > b) spans.push_back({b, e, true});
    prev = e;
  }
  void finish(size_t size) {
    if (size > prev) spans.push_back({prev, size, false});
  }
};

void regex_spans(const Regex& re, std::string_view piece, SpanBuilder& sb) {
  size_t pos = 0, b, e;
  while (pos <= piece.size() && re.find(piece, pos, &b, &e)) {
    sb.match(b, e);
    // An empty match moves on by one character.
    pos = e > b ? e : e + (e < piece.size() ? utf8_len(static_cast<unsigned char>(piece[e])) : 1);
  }
  sb.finish(piece.size());
}

void literal_spans(std::string_view lit, std::string_view piece, SpanBuilder& sb) {
  if (!lit.empty())
    for (size_t at = piece.find(lit); at != std::string_view::npos;
         at = piece.find(lit, at + lit.size()))
      sb.match(at, at + lit.size());
  sb.finish(piece.size());
}

// Each character for which pred holds is a match of its own.
template <class Pred>
void char_spans(std::string_view piece, SpanBuilder& sb, Pred pred) {
  for (size_t i = 0; i < piece.size();) {
    size_t b = i;
    if (pred(next_char(piece, i))) sb.match(b, i);
  }
  sb.finish(piece.size());
}

void split_step(const PreTokenizer& s, std::string_view piece, Pieces& p,
                std::vector<std::string_view>& out, bool first_piece) {
  SpanBuilder sb;
  switch (s.kind) {
    case PreTokenizer::Split:
      if (s.regex) regex_spans(*s.regex, piece, sb);
      else literal_spans(s.literal, piece, sb);
      apply_behavior(piece, sb.spans, s.behavior, s.invert, out);
      return;
    case PreTokenizer::ByteLevel:
      if (s.add_prefix_space && (piece.empty() || piece[0] != ' ')) {
        std::string& r = p.arena.emplace_back(1, ' ');
        r.append(piece);
        piece = r;
      }
      if (!s.regex) {
        out.push_back(piece);
        return;
      }
      regex_spans(*s.regex, piece, sb);
      apply_behavior(piece, sb.spans, SplitBehavior::Isolated, false, out);
      return;
    case PreTokenizer::Metaspace: {
      std::string r;
      r.reserve(piece.size() + s.replacement.size());
      bool prepend =
          s.prepend == PreTokenizer::Always || (s.prepend == PreTokenizer::First && first_piece);
      size_t from = 0;
      for (size_t at; (at = piece.find(' ', from)) != std::string_view::npos; from = at + 1) {
        r.append(piece.substr(from, at - from));
        r += s.replacement;
      }
      r.append(piece.substr(from));
      if (prepend && r.compare(0, s.replacement.size(), s.replacement) != 0)
        r.insert(0, s.replacement);
      p.arena.push_back(std::move(r));
      std::string_view v = p.arena.back();
      if (!s.metaspace_split) {
        out.push_back(v);
        return;
      }
      literal_spans(s.replacement, v, sb);
      apply_behavior(v, sb.spans, SplitBehavior::MergedWithNext, false, out);
      return;
    }
    case PreTokenizer::Digits:
      char_spans(piece, sb, [](char32_t c) { return is_numeric(c); });
      apply_behavior(piece, sb.spans,
                     s.individual_digits ? SplitBehavior::Isolated : SplitBehavior::Contiguous,
                     false, out);
      return;
    case PreTokenizer::Punctuation:
      char_spans(piece, sb, [](char32_t c) { return is_punctuation(c); });
      apply_behavior(piece, sb.spans, s.behavior, false, out);
      return;
    case PreTokenizer::Whitespace:  // the matches of \w+|[^\w\s]+, nothing else
      regex_spans(*s.regex, piece, sb);
      apply_behavior(piece, sb.spans, SplitBehavior::Removed, true, out);
      return;
    case PreTokenizer::WhitespaceSplit:
      char_spans(piece, sb, [](char32_t c) { return is_whitespace(c); });
      apply_behavior(piece, sb.spans, SplitBehavior::Removed, false, out);
      return;
  }
}

}  // namespace

void pre_tokenize(const std::vector<PreTokenizer>& steps, Pieces& p, bool first_section) {
  std::vector<std::string_view> next;
  for (const PreTokenizer& s : steps) {
    next.clear();
    next.reserve(p.views.size() * 2);
    for (size_t k = 0; k < p.views.size(); ++k)
      split_step(s, p.views[k], p, next, first_section && k == 0);
    std::swap(p.views, next);
  }
}

}  // namespace kiln::tok
