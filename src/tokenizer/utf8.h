// UTF-8 and Unicode helpers of the tokenizer.
#pragma once
#include <cstdint>
#include <string>
#include <string_view>

namespace kiln::tok {

// Decodes the character at s[i] (valid UTF-8) and advances i past it.
char32_t next_char(std::string_view s, size_t& i);
void append_utf8(std::string& out, char32_t c);

// Length of the longest valid UTF-8 prefix of s (s.size() when all of it is valid).
size_t valid_utf8_prefix(std::string_view s);
// s with every maximal invalid subpart replaced by U+FFFD (the WHATWG decoder's
// rule, which JavaScript's TextDecoder and Rust's from_utf8_lossy follow).
std::string repair_utf8(std::string_view s);

bool is_whitespace(char32_t c);   // Unicode White_Space (Rust's char::is_whitespace)
bool is_numeric(char32_t c);      // general category Nd, Nl or No
bool is_punctuation(char32_t c);  // ASCII punctuation or category P*
bool is_alphanumeric(char32_t c);

// GPT-2's byte-level alphabet: byte b is written as the character byte_char(b).
char32_t byte_char(uint8_t b);
// The byte a character of that alphabet stands for, or -1.
int char_byte(char32_t c);
// The raw bytes of a byte-level token, false if a character is not in the alphabet.
bool byte_level_decode(std::string_view token, std::string& out);
std::string byte_level_encode(std::string_view raw);

}  // namespace kiln::tok
