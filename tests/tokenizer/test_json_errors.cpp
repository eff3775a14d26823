// tokenizer.json components kiln lacks, and broken files, are refused with an
// error naming the component, never skipped.
#include "common/error_check.h"
#include "kiln/tokenizer.h"
#include "tokenizer/tokenizer_test_util.h"

namespace {

// A tiny byte-level-free BPE tokenizer.json with the given extra top-level parts.
std::string tiny(const std::string& extra, const std::string& model_extra = "") {
  return R"({"model": {"type": "BPE", "vocab": {"a": 0, "b": 1, "ab": 2, "c": 3, "<unk>": 4}, "merges": ["a b"],
            "unk_token": "<unk>")" +
         model_extra + "}" + extra + "}";
}

TEST(TokenizerJson, TinyTokenizerWorks) {
  kiln::Tokenizer t = kiln::Tokenizer::from_json(tiny(""));
  EXPECT_EQ(t.encode("abcab"), (std::vector<int32_t>{2, 3, 2}));
  EXPECT_EQ(t.encode("abz"), (std::vector<int32_t>{2, 4}));  // unknown character -> <unk>
  EXPECT_EQ(t.decode(std::vector<int32_t>{2, 3}), "abc");
}

TEST(TokenizerJson, MergesInBothForms) {
  std::string pairs =
      R"({"model": {"type": "BPE", "vocab": {"a": 0, "b": 1, "ab": 2, "c": 3, "abc": 4},
                          "merges": [["a", "b"], ["ab", "c"]]}})";
  std::string strings =
      R"({"model": {"type": "BPE", "vocab": {"a": 0, "b": 1, "ab": 2, "c": 3, "abc": 4},
                            "merges": ["a b", "ab c"]}})";
  EXPECT_EQ(kiln::Tokenizer::from_json(pairs).encode("abcab"), (std::vector<int32_t>{4, 2}));
  EXPECT_EQ(kiln::Tokenizer::from_json(strings).encode("abcab"), (std::vector<int32_t>{4, 2}));
}

TEST(TokenizerJson, SplitBehaviours) {
  auto ids = [](const std::string& behavior, bool invert) {
    std::string j =
        R"({"model": {"type": "BPE", "vocab": {"a": 0, "-": 1, "a-": 2, "-a": 3}, "merges": ["a -", "- a"]},
                        "pre_tokenizer": {"type": "Split", "pattern": {"String": "-"}, "behavior": ")" +
        behavior + R"(", "invert": )" + (invert ? "true" : "false") + "}}";
    return kiln::Tokenizer::from_json(j).encode("a-a");
  };
  EXPECT_EQ(ids("Removed", false), (std::vector<int32_t>{0, 0}));
  EXPECT_EQ(ids("Isolated", false), (std::vector<int32_t>{0, 1, 0}));
  EXPECT_EQ(ids("MergedWithPrevious", false), (std::vector<int32_t>{2, 0}));
  EXPECT_EQ(ids("MergedWithNext", false), (std::vector<int32_t>{0, 3}));
  EXPECT_EQ(ids("Contiguous", false), (std::vector<int32_t>{0, 1, 0}));
  EXPECT_EQ(ids("Removed", true),
            (std::vector<int32_t>{1}));  // the inverted pattern's matches are removed
}

TEST(TokenizerJson, AddedTokenStripping) {
  std::string j = R"({"model": {"type": "BPE", "vocab": {"a": 0, " ": 1}, "merges": []},
    "added_tokens": [{"id": 2, "content": "<x>", "lstrip": true, "rstrip": true, "special": true},
                     {"id": 3, "content": "w", "single_word": true, "special": true}]})";
  kiln::Tokenizer t = kiln::Tokenizer::from_json(j);
  // The spaces around <x> go with it.
  EXPECT_EQ(t.encode("a  <x>  a"), (std::vector<int32_t>{0, 2, 0}));
  EXPECT_EQ(t.encode("a w a"), (std::vector<int32_t>{0, 1, 3, 1, 0}));
  // Inside a word "w" is not split out as an added token; BPE then finds it in
  // the vocabulary, which holds the added tokens too (as in the reference).
  EXPECT_EQ(t.encode("aw"), (std::vector<int32_t>{0, 3}));
}

TEST(TokenizerJson, NormalizersAndDigits) {
  std::string j =
      R"({"model": {"type": "BPE", "vocab": {"a": 0, "1": 1, "2": 2, "12": 3, "x": 4}, "merges": ["1 2"]},
    "normalizer": {"type": "Sequence", "normalizers": [{"type": "NFKC"}, {"type": "Lowercase"},
                   {"type": "Strip", "strip_left": true, "strip_right": true},
                   {"type": "Replace", "pattern": {"Regex": "b+"}, "content": "x"}]},
    "pre_tokenizer": {"type": "Digits", "individual_digits": true}})";
  kiln::Tokenizer t = kiln::Tokenizer::from_json(j);
  // NFKC makes the fullwidth digits ASCII; Lowercase makes A a; Strip drops the spaces.
  EXPECT_EQ(t.encode("  A\xEF\xBC\x91\xEF\xBC\x92 bbb "), (std::vector<int32_t>{0, 1, 2, 4}));
}

TEST(TokenizerJson, RefusesWhatItLacks) {
  EXPECT_KILN_ERROR(kiln::Tokenizer::from_json(R"({"model": {"type": "WordPiece", "vocab": {}}})"),
                    "tokenizer", "model 'WordPiece'", "not supported");
  EXPECT_KILN_ERROR(
      kiln::Tokenizer::from_json(tiny(R"(, "normalizer": {"type": "BertNormalizer"})")),
      "tokenizer", "normalizer 'BertNormalizer'", "not supported");
  EXPECT_KILN_ERROR(
      kiln::Tokenizer::from_json(tiny(R"(, "pre_tokenizer": {"type": "CharDelimiterSplit"})")),
      "tokenizer", "pre_tokenizer 'CharDelimiterSplit'");
  EXPECT_KILN_ERROR(kiln::Tokenizer::from_json(tiny(R"(, "decoder": {"type": "WordPiece"})")),
                    "tokenizer", "decoder 'WordPiece'");
  EXPECT_KILN_ERROR(
      kiln::Tokenizer::from_json(tiny(R"(, "post_processor": {"type": "BertProcessing"})")),
      "tokenizer", "post_processor 'BertProcessing'");
  EXPECT_KILN_ERROR(kiln::Tokenizer::from_json(tiny("", R"(, "dropout": 0.1)")), "tokenizer",
                    "dropout");
  EXPECT_KILN_ERROR(kiln::Tokenizer::from_json(tiny("", R"(, "continuing_subword_prefix": "##")")),
                    "tokenizer", "continuing_subword_prefix");
}

TEST(TokenizerJson, RefusesBrokenFiles) {
  EXPECT_KILN_ERROR(kiln::Tokenizer::from_json("{\"model\": "), "tokenizer", "not valid JSON");
  EXPECT_KILN_ERROR(kiln::Tokenizer::from_json(
                        R"({"model": {"type": "BPE", "vocab": {"a": 0}, "merges": ["a b"]}})"),
                    "tokenizer", "merge number 1", "'b' is not in the vocabulary");
  EXPECT_KILN_ERROR(kiln::Tokenizer::from_json(
                        R"({"model": {"type": "BPE", "vocab": {"a": 0}, "merges": ["a b c"]}})"),
                    "tokenizer", "merge number 1");
  EXPECT_KILN_ERROR(kiln::Tokenizer::from_json(
                        R"({"model": {"type": "BPE", "vocab": {"a": "x"}, "merges": []}})"),
                    "tokenizer", "model.vocab");
  EXPECT_KILN_ERROR(kiln::Tokenizer::from_json(
                        R"({"model": {"type": "BPE", "vocab": {"a": 2000000000}, "merges": []}})"),
                    "tokenizer", "far beyond");
  EXPECT_KILN_ERROR(kiln::Tokenizer::from_json(R"({"model": {"type": "BPE", "vocab": {}}})"),
                    "tokenizer", "no 'merges'");
  EXPECT_KILN_ERROR(kiln::Tokenizer::from_json(tiny(
                        R"(, "pre_tokenizer": {"type": "Split", "pattern": {"Regex": "(a"}})")),
                    "tokenizer", "does not compile");
  EXPECT_KILN_ERROR(kiln::Tokenizer::load("/nonexistent/tokenizer.json"), "tokenizer",
                    "does not exist");
}

}  // namespace

namespace {

// Pieces a pre-tokenizer makes, read back through a vocabulary of single
// characters where every merge joins a whole piece: ids of "a", "▁", ",", ...
std::vector<std::string> pieces(const std::string& pre, const std::string& text) {
  // Each character of the text is a token; decode each id back to see the pieces
  // through a decoder-free byte-level-free model with no merges.
  std::string vocab = R"({"a": 0, "b": 1, ",": 2, " ": 3, "1": 4, "2": 5, "\u2581": 6, "!": 7})";
  kiln::Tokenizer t =
      kiln::Tokenizer::from_json(R"({"model": {"type": "BPE", "vocab": )" + vocab +
                                 R"(, "merges": []}, "pre_tokenizer": )" + pre + "}");
  std::vector<std::string> out;
  for (int32_t id : t.encode(text)) out.push_back(t.id_to_token(id));
  return out;
}

}  // namespace

TEST(TokenizerJson, MetaspacePrependSchemes) {
  using V = std::vector<std::string>;
  const std::string m = "\xE2\x96\x81";
  EXPECT_EQ(pieces(R"({"type": "Metaspace", "replacement": "\u2581", "prepend_scheme": "always"})",
                   "a b"),
            (V{m, "a", m, "b"}));
  EXPECT_EQ(
      pieces(R"({"type": "Metaspace", "replacement": "\u2581", "prepend_scheme": "never"})", "a b"),
      (V{"a", m, "b"}));
  // "first": only the text's first section gets the prefix, not the one after an added token.
  std::string j =
      R"({"model": {"type": "BPE", "vocab": {"a": 0, "\u2581": 1, "\u2581a": 2}, "merges": ["\u2581 a"]},
    "added_tokens": [{"id": 3, "content": "<x>", "special": true}],
    "pre_tokenizer": {"type": "Metaspace", "replacement": "\u2581", "prepend_scheme": "first", "split": true}})";
  kiln::Tokenizer t = kiln::Tokenizer::from_json(j);
  EXPECT_EQ(t.encode("a<x>a"), (std::vector<int32_t>{2, 3, 0}));
}

TEST(TokenizerJson, PunctuationAndWhitespace) {
  using V = std::vector<std::string>;
  EXPECT_EQ(pieces(R"({"type": "Punctuation", "behavior": "Isolated"})", "ab,!"),
            (V{"a", "b", ",", "!"}));
  EXPECT_EQ(pieces(R"({"type": "Punctuation", "behavior": "Removed"})", "ab,!"), (V{"a", "b"}));
  EXPECT_EQ(pieces(R"({"type": "Whitespace"})", "ab , 12"), (V{"a", "b", ",", "1", "2"}));
  EXPECT_EQ(pieces(R"({"type": "WhitespaceSplit"})", " a  b "), (V{"a", "b"}));
  EXPECT_EQ(pieces(R"({"type": "Digits", "individual_digits": false})", "a12"), (V{"a", "1", "2"}));
}

TEST(TokenizerJson, ByteFallbackDecodesBytesAndMarksBadOnes) {
  std::string j =
      R"({"model": {"type": "BPE", "vocab": {"<unk>": 0, "a": 1, "<0xC3>": 2, "<0xA9>": 3, "<0xFF>": 4},
    "merges": [], "unk_token": "<unk>", "byte_fallback": true},
    "decoder": {"type": "Sequence", "decoders": [{"type": "ByteFallback"}, {"type": "Fuse"}]}})";
  kiln::Tokenizer t = kiln::Tokenizer::from_json(j);
  EXPECT_EQ(t.encode("a\xC3\xA9"),
            (std::vector<int32_t>{1, 2, 3}));  // é is not a token: its bytes are
  EXPECT_EQ(t.encode("\xE4\xB8\xAD"),
            (std::vector<int32_t>{0}));  // 中: a byte has no token -> <unk>
  EXPECT_EQ(t.decode(std::vector<int32_t>{1, 2, 3}), "a\xC3\xA9");
  EXPECT_EQ(t.decode(std::vector<int32_t>{2, 4, 1}),
            "\xEF\xBF\xBD\xEF\xBF\xBD"
            "a");  // one U+FFFD per bad byte
}
