// A GGUF file's chat template and special tokens, as llama.cpp writes them.
#include <gtest/gtest.h>

#include <unistd.h>

#include <filesystem>
#include <string>
#include <vector>

#include "kiln/chat.h"
#include "kiln/error.h"
#include "kiln/io.h"

namespace {

std::string write_gguf(const std::string& name, bool with_named, int64_t bos_id) {
  kiln::GgufWriter w;
  w.set("tokenizer.chat_template",
        "{{ bos_token }}{% for m in messages %}{{ m.content }}{{ eos_token }}{% endfor %}");
  if (with_named) w.set("tokenizer.chat_template.tool_use", "tools:{{ tools | length }}");
  w.set("tokenizer.ggml.tokens", std::vector<std::string>{"<unk>", "<s>", "</s>", "a"});
  w.set("tokenizer.ggml.bos_token_id", uint32_t(bos_id));
  w.set("tokenizer.ggml.eos_token_id", uint32_t(2));
  const std::string path = (std::filesystem::temp_directory_path() /
                            ("kiln_chat_" + name + "_" + std::to_string(::getpid()) + ".gguf"))
                               .string();
  w.save(path);
  return path;
}

TEST(ChatGguf, TemplateAndSpecialTokens) {
  const std::string path = write_gguf("ok", true, 1);
  const kiln::GgufFile file(path);
  const auto t = kiln::chat::ChatTemplate::from_gguf(file);
  EXPECT_EQ(t.apply(R"({"messages": [{"content": "x"}, {"content": "y"}]})", false),
            "<s>x</s>y</s>");
  EXPECT_EQ(kiln::chat::ChatTemplate::from_gguf(file, "tool_use")
                .apply(R"({"messages": [], "tools": [1, 2]})", true),
            "tools:2");
  try {
    kiln::chat::ChatTemplate::from_gguf(file, "rag");
    FAIL();
  } catch (const kiln::Error& e) {
    EXPECT_NE(std::string(e.what()).find("tokenizer.chat_template.rag"), std::string::npos)
        << e.what();
  }
  std::filesystem::remove(path);
}

TEST(ChatGguf, TokenIdBeyondTheVocabulary) {
  const std::string path = write_gguf("bad", false, 99);
  const kiln::GgufFile file(path);
  try {
    kiln::chat::ChatTemplate::from_gguf(file);
    FAIL();
  } catch (const kiln::Error& e) {
    EXPECT_NE(std::string(e.what()).find("beyond the vocabulary"), std::string::npos) << e.what();
  }
  std::filesystem::remove(path);
}

}  // namespace
