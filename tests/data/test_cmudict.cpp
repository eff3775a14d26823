// kiln-lm's README chat job: CMUdict's lines as conversations and the split
// into training and held-out words (examples/lm/cmudict.cpp), and the scores
// kiln-lm eval-chat prints (examples/lm/reply_metrics.cpp) on fixed strings.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <set>
#include <string>

#include "cmudict.h"
#include "common/error_check.h"
#include "reply_metrics.h"

namespace {

TEST(Cmudict, ParsesFirstPronunciationsSkipsAlternatesAndPunctuation) {
  const std::string text =
      ";;; a comment\n"
      "A  AH0\n"
      "A(1)  EY1\n"
      "\"CLOSE-QUOTE  K L OW1 Z K W OW1 T\n"
      "ADDISON  AE1 D IH0 S AH0 N\r\n"
      "\n"
      "A.'S  EY1 Z\n"
      "ABLE-BODIED  EY1 B AH0 L B AA1 D IY0 D";  // no final newline
  const lm::Cmudict d = lm::parse_cmudict(text, "dict.txt");
  ASSERT_EQ(d.entries.size(), 4u);
  EXPECT_EQ(d.entries[0].word, "A");
  EXPECT_EQ(d.entries[0].phones, "AH0");
  EXPECT_EQ(d.entries[1].word, "ADDISON");
  EXPECT_EQ(d.entries[1].phones, "AE1 D IH0 S AH0 N");  // the \r is not a phoneme
  EXPECT_EQ(d.entries[2].word, "A.'S");
  EXPECT_EQ(d.entries[3].phones, "EY1 B AH0 L B AA1 D IY0 D");
  EXPECT_EQ(d.alternates, 1);
  EXPECT_EQ(d.skipped, 1);
}

TEST(Cmudict, BadLinesNameTheFileAndLine) {
  EXPECT_KILN_ERROR(lm::parse_cmudict("A  AH0\nADDISON AE1 D\n", "dict.txt"), "cmudict",
                    "dict.txt:2: not 'WORD  PHONEMES'");
  EXPECT_KILN_ERROR(lm::parse_cmudict("A  AH0\n\nB  \n", "dict.txt"), "cmudict",
                    "dict.txt:3: 'B' has no phonemes");
}

TEST(Cmudict, SplitByHashIsDeterministicAndNearTheRateAsked) {
  EXPECT_EQ(lm::cmudict_hash("ADDISON"), lm::cmudict_hash("ADDISON"));
  EXPECT_NE(lm::cmudict_hash("ADDISON"), lm::cmudict_hash("ADDISSON"));
  int held = 0;
  const int n = 20000;
  for (int k = 0; k < n; ++k) {
    std::string w = "W";
    for (int x = k; x > 0; x /= 26) w += char('A' + x % 26);
    held += lm::cmudict_held_out(w, 20) ? 1 : 0;
  }
  // 2% of 20000 = 400; a binomial's standard deviation here is about 20.
  EXPECT_GT(held, 300);
  EXPECT_LT(held, 500);
  EXPECT_FALSE(lm::cmudict_held_out("ADDISON", 0));
}

TEST(Cmudict, ConversationIsAUserQuestionAndTheAssistantsPhonemes) {
  const std::string q = lm::cmudict_question("ADDISON");
  EXPECT_EQ(q, lm::cmudict_question("ADDISON"));  // deterministic
  EXPECT_NE(q.find("'ADDISON'"), std::string::npos) << q;
  // The phrasings differ between words (four of them, picked by hash).
  std::set<std::string> phrasings;
  for (const char* w : {"A", "B", "C", "D", "E", "F", "G", "H", "I", "J", "K", "L"}) {
    std::string p = lm::cmudict_question(w);
    p.erase(p.find(std::string("'") + w + "'"), 3);
    phrasings.insert(p);
  }
  EXPECT_GE(phrasings.size(), 3u);
  const nlohmann::json j =
      nlohmann::json::parse(lm::cmudict_conversation({"A.'S", "EY1 Z"}));  // quote in the word
  ASSERT_EQ(j["messages"].size(), 2u);
  EXPECT_EQ(j["messages"][0]["role"], "user");
  EXPECT_EQ(j["messages"][0]["content"], lm::cmudict_question("A.'S"));
  EXPECT_EQ(j["messages"][1]["role"], "assistant");
  EXPECT_EQ(j["messages"][1]["content"], "EY1 Z");
}

TEST(ReplyMetrics, EditDistanceOverUnits) {
  EXPECT_EQ(lm::unit_edit_distance("AE1 D IH0 S AH0 N", "AE1 D IH0 S AH0 N"), 0);
  EXPECT_EQ(lm::unit_edit_distance(" AE1  D IH0 S AH0 N\n", "AE1 D IH0 S AH0 N"), 0);
  EXPECT_EQ(lm::unit_edit_distance("AE1 D IH1 S AH0 N", "AE1 D IH0 S AH0 N"), 1);    // stress
  EXPECT_EQ(lm::unit_edit_distance("AE1 D IH0 S N", "AE1 D IH0 S AH0 N"), 1);        // deletion
  EXPECT_EQ(lm::unit_edit_distance("AE1 D D IH0 S AH0 N", "AE1 D IH0 S AH0 N"), 1);  // insertion
  EXPECT_EQ(lm::unit_edit_distance("", "AE1 D IH0"), 3);
  EXPECT_EQ(lm::unit_edit_distance("AE1 D IH0", ""), 3);
  EXPECT_EQ(lm::unit_edit_distance("N AH0 S IH0 D AE1", "AE1 D IH0 S AH0 N"), 6);  // reversed
  EXPECT_EQ(lm::unit_edit_distance("K AE1 T", "K AE1 T S"), 1);
  EXPECT_EQ(lm::unit_edit_distance("AE1D", "AE1 D"), 2);  // units, not characters
}

TEST(ReplyMetrics, ExactMatchAndErrorRateSumOverExamples) {
  lm::ReplyScores s;
  s.add("AE1 D IH0 S AH0 N", "AE1 D IH0 S AH0 N");  // exact, 0 of 6
  s.add("K AE1 T", "K AE1 T S");                    // 1 of 4
  s.add("", "EY1 Z");                               // 2 of 2
  s.add("B IY1 B IY1 B IY1", "B IY1");              // 4 of 2: over 100% for this one
  EXPECT_EQ(s.examples, 4);
  EXPECT_EQ(s.exact, 1);
  EXPECT_EQ(s.edits, 7);
  EXPECT_EQ(s.ref_units, 14);
  EXPECT_DOUBLE_EQ(s.exact_match(), 0.25);
  EXPECT_DOUBLE_EQ(s.unit_error_rate(), 0.5);
  EXPECT_EQ(lm::ReplyScores().unit_error_rate(), 0.0);
}

}  // namespace
