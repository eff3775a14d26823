// Decoders: the chain a tokenizer.json's "decoder" describes, over the tokens'
// strings (Hugging Face tokenizers' Decoder::decode_chain).
#include "kiln/error.h"
#include "tokenizer/model.h"
#include "tokenizer/utf8.h"

namespace kiln::tok {

namespace {

void replace_in(std::string& t, const Decoder& d) {
  std::string out;
  size_t pos = 0;
  if (d.regex) {
    size_t b, e;
    while (pos < t.size() && d.regex->find(t, pos, &b, &e) && e > b) {
      out.append(t, pos, b - pos);
      out += d.content;
      pos = e;
    }
  } else if (!d.literal.empty()) {
    for (size_t at; (at = t.find(d.literal, pos)) != std::string::npos;
         pos = at + d.literal.size()) {
      out.append(t, pos, at - pos);
      out += d.content;
    }
  } else {
    return;
  }
  out.append(t, pos, std::string::npos);
  t = std::move(out);
}

// <0xAB> -> 0xAB, or -1.
int byte_token(const std::string& t) {
  if (t.size() != 6 || t.compare(0, 3, "<0x") != 0 || t[5] != '>') return -1;
  auto hex = [](char c) {
    return c >= '0' && c <= '9'   ? c - '0'
           : c >= 'A' && c <= 'F' ? c - 'A' + 10
           : c >= 'a' && c <= 'f' ? c - 'a' + 10
                                  : -1;
  };
  int h = hex(t[3]), l = hex(t[4]);
  return h < 0 || l < 0 ? -1 : h * 16 + l;
}

void byte_fallback(std::vector<std::string>& tokens) {
  std::vector<std::string> out;
  std::string bytes;
  size_t nbytes = 0;
  auto flush = [&] {
    if (nbytes == 0) return;
    if (valid_utf8_prefix(bytes) == bytes.size()) {
      out.push_back(bytes);
    } else {
      for (size_t k = 0; k < nbytes; ++k) out.emplace_back("\xEF\xBF\xBD");  // one U+FFFD per byte
    }
    bytes.clear();
    nbytes = 0;
  };
  for (std::string& t : tokens) {
    int b = byte_token(t);
    if (b >= 0) {
      bytes += char(b);
      ++nbytes;
    } else {
      flush();
      out.push_back(std::move(t));
    }
  }
  flush();
  tokens = std::move(out);
}

void strip(std::string& t, const std::string& c, int start, int stop) {
  if (c.empty()) return;
  size_t b = 0, e = t.size();
  for (int k = 0; k < start && t.compare(b, c.size(), c) == 0 && b + c.size() <= e; ++k)
    b += c.size();
  for (int k = 0; k < stop && e >= b + c.size() && t.compare(e - c.size(), c.size(), c) == 0; ++k)
    e -= c.size();
  t = t.substr(b, e - b);
}

}  // namespace

void decode_chain(const Decoder& d, std::vector<std::string>& tokens) {
  switch (d.kind) {
    case Decoder::Replace:
      for (std::string& t : tokens) replace_in(t, d);
      return;
    case Decoder::ByteFallback: byte_fallback(tokens); return;
    case Decoder::Fuse: {
      std::string all;
      for (const std::string& t : tokens) all += t;
      tokens.assign(1, std::move(all));
      return;
    }
    case Decoder::Strip:
      for (std::string& t : tokens) strip(t, d.content, d.start, d.stop);
      return;
    case Decoder::Metaspace:
      for (size_t i = 0; i < tokens.size(); ++i) {
        std::string out;
        const std::string& t = tokens[i];
        for (size_t at = 0;;) {
          size_t next = d.replacement.empty() ? std::string::npos : t.find(d.replacement, at);
          out.append(t, at, next == std::string::npos ? std::string::npos : next - at);
          if (next == std::string::npos) break;
          if (!(i == 0 && d.prepend)) out += ' ';
          at = next + d.replacement.size();
        }
        tokens[i] = std::move(out);
      }
      return;
    case Decoder::ByteLevel: {
      std::string raw;
      for (const std::string& t : tokens)
        if (!byte_level_decode(t, raw)) raw += t;
      tokens.assign(1, repair_utf8(raw));
      return;
    }
    case Decoder::Sequence:
      for (const Decoder& s : d.steps) decode_chain(s, tokens);
      return;
  }
}

}  // namespace kiln::tok
