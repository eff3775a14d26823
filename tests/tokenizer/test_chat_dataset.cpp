// Chat data for fine-tuning (kiln/chat_dataset.h) on the real Llama-3 and
// Qwen3 tokenizers and chat templates (data/tokenizers: tokenizer.json and the
// chat_template of tokenizer_config.json): the trained tokens of a multi-turn
// conversation decode to exactly each assistant reply and its end-of-turn
// marker, nothing else; errors name the file and line.
#include <fstream>

#include "common/error_check.h"
#include "common/temp_dir.h"
#include "kiln/kiln.h"
#include "tokenizer/tokenizer_test_util.h"

namespace {

using kiln::ChatExample;
using kiln::TrainOn;

// A real chat template of tests/chat/fixtures/templates.json by name.
kiln::chat::ChatTemplate fixture_template(const std::string& name) {
  const nlohmann::json fx = nlohmann::json::parse(
      kiln_test::read_bytes(kiln_test::source_dir() + "/tests/chat/fixtures/templates.json"));
  return kiln::chat::ChatTemplate::from_config(fx["templates"][name]["config"].dump());
}
kiln::chat::ChatTemplate llama32_template() { return fixture_template("llama3.2"); }

struct Model {
  kiln::Tokenizer tok;
  kiln::chat::ChatTemplate tmpl;
  // data/tokenizers/<name>'s tokenizer and chat template (for llama3: the
  // original Llama 3 template, which always ends with the generation prompt).
  explicit Model(const std::string& name)
      : tok(kiln::Tokenizer::load(kiln_test::tokenizer_dir(name))),
        tmpl(kiln::chat::ChatTemplate::load(kiln_test::tokenizer_dir(name))) {}
  Model(const std::string& name, kiln::chat::ChatTemplate t)
      : tok(kiln::Tokenizer::load(kiln_test::tokenizer_dir(name))), tmpl(std::move(t)) {}
  ChatExample example(const std::string& json, TrainOn on = TrainOn::assistant) const {
    return kiln::tokenize_chat_example(json, tok, &tmpl, on, "test.jsonl:1");
  }
};

// The trained tokens as runs of consecutive ids, each decoded.
std::vector<std::string> trained_runs(const kiln::Tokenizer& tok, const ChatExample& e) {
  std::vector<std::string> runs;
  for (size_t k = 0; k < e.ids.size();) {
    if (!e.trained[k]) {
      ++k;
      continue;
    }
    size_t end = k;
    while (end < e.ids.size() && e.trained[end]) ++end;
    runs.push_back(tok.decode(std::span(e.ids).subspan(k, end - k)));
    k = end;
  }
  return runs;
}

// One JSONL line.
const char* kMultiTurn = R"({"messages": [{"role": "system", "content": "Be brief."}, )"
                         R"({"role": "user", "content": "How do you pronounce 'ADDISON'?"}, )"
                         R"({"role": "assistant", "content": "AE1 D IH0 S AH0 N"}, )"
                         R"({"role": "user", "content": "And 'ZEBRA'?"}, )"
                         R"({"role": "assistant", "content": "Z IY1 B R AH0"}]})";

TEST(ChatDataset, Llama32TrainsExactlyTheAssistantTurns) {
  const Model m("llama3", llama32_template());
  const ChatExample e = m.example(kMultiTurn);
  ASSERT_EQ(e.ids.size(), e.trained.size());
  // Each reply and the end-of-turn token that closes it; no header, no user text.
  EXPECT_EQ(trained_runs(m.tok, e),
            (std::vector<std::string>{"AE1 D IH0 S AH0 N<|eot_id|>", "Z IY1 B R AH0<|eot_id|>"}));
  // The ids are the whole rendered conversation's, as inference would see them.
  EXPECT_EQ(e.ids, m.tok.encode(m.tmpl.apply(kMultiTurn, false), false));
  // --train-on all: every token.
  const ChatExample all = m.example(kMultiTurn, TrainOn::all);
  EXPECT_EQ(all.ids, e.ids);
  EXPECT_EQ(all.trained_count(), int64_t(e.ids.size()) - 1);
  EXPECT_LT(e.trained_count(), all.trained_count());
}

// The original Llama 3 template writes the generation prompt after every
// conversation, add_generation_prompt or not: it is not the last reply's.
TEST(ChatDataset, Llama3TemplateThatAlwaysAppendsTheGenerationPrompt) {
  const Model m("llama3");
  const ChatExample e = m.example(kMultiTurn);
  EXPECT_EQ(trained_runs(m.tok, e),
            (std::vector<std::string>{"AE1 D IH0 S AH0 N<|eot_id|>", "Z IY1 B R AH0<|eot_id|>"}));
  EXPECT_EQ(m.tok.decode(std::span(e.ids).last(5)),
            "<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n");
}

// ChatML (Qwen2.5's template, with the Qwen tokenizer of Qwen3: the same
// vocabulary and special tokens): each reply with its <|im_end|> and newline.
TEST(ChatDataset, Qwen25ChatMLTrainsExactlyTheAssistantTurns) {
  const Model m("qwen3", fixture_template("qwen2.5"));
  const ChatExample e = m.example(kMultiTurn);
  EXPECT_EQ(trained_runs(m.tok, e), (std::vector<std::string>{"AE1 D IH0 S AH0 N<|im_end|>\n",
                                                              "Z IY1 B R AH0<|im_end|>\n"}));
  EXPECT_EQ(e.ids, m.tok.encode(m.tmpl.apply(kMultiTurn, false), false));
}

TEST(ChatDataset, Qwen3TrainsTheReplyOfASingleTurn) {
  const Model m("qwen3");
  const ChatExample e = m.example(
      R"({"messages": [{"role": "user", "content": "Spell 'cat'."},
                       {"role": "assistant", "content": "C A T"}]})");
  // Qwen3 writes an empty thinking block into the last reply: it is the reply's.
  EXPECT_EQ(trained_runs(m.tok, e),
            (std::vector<std::string>{"<think>\n\n</think>\n\nC A T<|im_end|>\n"}));
}

// Qwen3 renders an earlier reply without the thinking block it gives the same
// reply as the last message: the turn's end cannot be found by prefixes. An
// error naming the line and the turn, never a wrong mask.
TEST(ChatDataset, Qwen3MultiTurnIsRefusedNotMismasked) {
  const Model m("qwen3");
  EXPECT_KILN_ERROR(m.example(kMultiTurn), "chat data", "test.jsonl:1", "messages[:3]",
                    "not a prefix", "the end of assistant turn messages[2]");
}

// A ChatML template that renders the last reply with an empty thinking block
// and earlier ones without (as Qwen3's does), each reply inside a
// {% generation %} block (as the training templates TRL uses mark them):
// prefixes cannot find the turns, the blocks can.
const char* kMarkedChatML =
    R"({"chat_template": "{% for m in messages %}{% if m.role == 'assistant' %})"
    R"(<|im_start|>assistant\n{% generation %}{% if loop.last %}<think>\n\n</think>\n\n{% endif %})"
    R"({{ m.content }}<|im_end|>{% endgeneration %}{{ '\n' }})"
    R"({% else %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endif %}{% endfor %})"
    R"({% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"})";

TEST(ChatDataset, GenerationBlocksMarkTheTrainedTokens) {
  const Model m("qwen3", kiln::chat::ChatTemplate::from_config(kMarkedChatML));
  ASSERT_TRUE(m.tmpl.jinja().has_generation_blocks());
  const ChatExample e = m.example(kMultiTurn);
  EXPECT_EQ(trained_runs(m.tok, e),
            (std::vector<std::string>{"AE1 D IH0 S AH0 N<|im_end|>",
                                      "<think>\n\n</think>\n\nZ IY1 B R AH0<|im_end|>"}));
  EXPECT_EQ(e.ids, m.tok.encode(m.tmpl.apply(kMultiTurn, false), false));
  // A conversational prompt/completion: only the completion's block is trained.
  const ChatExample pc = m.example(
      R"({"prompt": [{"role": "user", "content": "How do you pronounce 'ADDISON'?"},
                     {"role": "assistant", "content": "AE1 D IH0 S AH0 N"},
                     {"role": "user", "content": "And 'ZEBRA'?"}],
          "completion": [{"role": "assistant", "content": "Z IY1 B R AH0"}]})");
  EXPECT_EQ(trained_runs(m.tok, pc),
            (std::vector<std::string>{"<think>\n\n</think>\n\nZ IY1 B R AH0<|im_end|>"}));
}

TEST(ChatDataset, ToolsReachTheTemplate) {
  const Model m("llama3", llama32_template());
  const std::string json =
      R"({"tools": [{"type": "function", "function": {"name": "lookup", "description": "d",
          "parameters": {"type": "object", "properties": {}}}}],
        "messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"}]})";
  const ChatExample e = m.example(json);
  EXPECT_NE(m.tok.decode(e.ids).find("lookup"), std::string::npos);
  EXPECT_EQ(trained_runs(m.tok, e), (std::vector<std::string>{"Hello<|eot_id|>"}));
}

TEST(ChatDataset, PromptCompletionAndText) {
  const Model m("llama3", llama32_template());
  // Strings: plain text, the completion and EOS trained.
  const ChatExample pc = m.example(R"({"prompt": "2 + 2 =", "completion": " 4"})");
  EXPECT_EQ(trained_runs(m.tok, pc), (std::vector<std::string>{" 4<|end_of_text|>"}));
  std::vector<int32_t> want = m.tok.encode("2 + 2 =", true);
  for (int32_t id : m.tok.encode(" 4", false)) want.push_back(id);
  want.push_back(*m.tok.eos_id());
  EXPECT_EQ(pc.ids, want);
  // Message lists: a conversation whose completion is trained.
  const ChatExample conv = m.example(
      R"({"prompt": [{"role": "user", "content": "Hi"}],
          "completion": [{"role": "assistant", "content": "Hello"}]})");
  EXPECT_EQ(trained_runs(m.tok, conv), (std::vector<std::string>{"Hello<|eot_id|>"}));
  // Text: every token but the first (which is no token's label).
  const ChatExample t = m.example(R"({"text": "plain words"})");
  EXPECT_EQ(t.trained_count(), int64_t(t.ids.size()) - 1);
}

TEST(ChatDataset, ErrorsNameTheFileAndLine) {
  const Model m("llama3");
  kiln_test::TempDir dir;
  auto load_lines = [&](const std::string& text) {
    const std::string path = dir.file("data.jsonl");
    std::ofstream(path, std::ios::binary) << text;
    return kiln::load_chat_jsonl(path, m.tok, &m.tmpl, {});
  };
  const std::string ok = R"({"text": "fine words"})";
  EXPECT_KILN_ERROR(load_lines(ok + "\n\n{\"text\": \n"), "chat data", "data.jsonl:3", "bad JSON");
  EXPECT_KILN_ERROR(load_lines(ok + "\n" + R"({"messages": [{"role": "wizard", "content": "x"}]})"),
                    "chat data", "data.jsonl:2", "unknown role \"wizard\"");
  EXPECT_KILN_ERROR(load_lines(R"({"messages": []})"), "chat data", "data.jsonl:1", "empty");
  EXPECT_KILN_ERROR(load_lines(R"({"messages": [{"role": "user", "content": "x"}]})"), "chat data",
                    "data.jsonl:1", "no assistant message");
  EXPECT_KILN_ERROR(load_lines(R"({"prompt": "x"})"), "chat data", "data.jsonl:1", "completion");
  EXPECT_KILN_ERROR(load_lines(R"({"content": "x"})"), "chat data", "data.jsonl:1", "expected");
  // No template: conversations are refused, plain text is not.
  const std::string path = dir.file("conv.jsonl");
  std::ofstream(path, std::ios::binary) << kMultiTurn;
  EXPECT_KILN_ERROR(kiln::load_chat_jsonl(path, m.tok, nullptr, {}), "chat data", "conv.jsonl:1",
                    "chat template");
}

TEST(ChatDataset, LongExamplesAreSkippedAndCountedOrTruncated) {
  const Model m("llama3");
  kiln_test::TempDir dir;
  const std::string path = dir.file("d.jsonl");
  const std::string longer = R"({"messages": [{"role": "user", "content": "a b c d e f g h i j"}, )"
                             R"({"role": "assistant", "content": "k l m n o p q r s t"}]})";
  std::ofstream(path, std::ios::binary) << R"({"text": "short text"})"
                                        << "\n"
                                        << longer << "\n"
                                        << R"({"text": "also short"})"
                                        << "\n";
  const int64_t n = int64_t(m.example(longer).ids.size());
  kiln::ChatDataOptions o;
  o.max_tokens = n - 3;
  const kiln::ChatDataset skipped = kiln::load_chat_jsonl(path, m.tok, &m.tmpl, o);
  EXPECT_EQ(skipped.size(), 2);
  EXPECT_EQ(skipped.skipped_lines, std::vector<int64_t>{2});
  EXPECT_EQ(skipped.examples[1].line, 3);
  o.truncate = true;
  const kiln::ChatDataset cut = kiln::load_chat_jsonl(path, m.tok, &m.tmpl, o);
  ASSERT_EQ(cut.size(), 3);
  EXPECT_EQ(cut.truncated, 1);
  EXPECT_EQ(int64_t(cut.examples[1].ids.size()), n - 3);
  EXPECT_EQ(cut.longest(), n - 3);
  // Cut before the reply starts: nothing left to train on, so skipped.
  o.max_tokens = 8;
  const kiln::ChatDataset none = kiln::load_chat_jsonl(path, m.tok, &m.tmpl, o);
  EXPECT_EQ(none.skipped_lines, std::vector<int64_t>{2});
  EXPECT_EQ(none.truncated, 0);
}

TEST(ChatDataset, BatchesShiftLabelsMaskAndPad) {
  const Model m("llama3");
  kiln::ChatDataset d;
  d.file = "mem.jsonl";
  d.examples.push_back(m.example(kMultiTurn));
  const ChatExample& e = d.examples[0];
  const int64_t T = int64_t(e.ids.size()) + 2;  // two padded positions
  kiln::Context ctx;
  kiln::Tensor x = ctx.input(kiln::i32, {2, T}, "x"), y = ctx.input(kiln::i32, {2, T}, "y");
  kiln::CpuBackend cpu(1);
  auto buf = kiln::allocate_tensors(ctx, cpu);
  const std::vector<int64_t> rows = {0, -1};
  d.write_batch(rows, x, y);
  const std::vector<int32_t> xs = x.get<int32_t>(), ys = y.get<int32_t>();
  int64_t counted = 0;
  for (int64_t p = 0; p < T; ++p) {
    const size_t k = size_t(p);
    if (p + 1 < int64_t(e.ids.size())) {
      EXPECT_EQ(xs[k], e.ids[k]);
      EXPECT_EQ(ys[k], e.trained[k + 1] ? e.ids[k + 1] : kiln::kIgnoreIndex) << p;
    } else {
      EXPECT_EQ(ys[k], kiln::kIgnoreIndex) << p;
    }
    counted += ys[k] != kiln::kIgnoreIndex;
    EXPECT_EQ(ys[size_t(T + p)], kiln::kIgnoreIndex);  // the padding row
  }
  EXPECT_EQ(counted, e.trained_count());
  kiln::Tensor small = ctx.input(kiln::i32, {1, 4}, "s"), small_y = ctx.input(kiln::i32, {1, 4});
  EXPECT_KILN_ERROR(d.write_batch(std::vector<int64_t>{0}, small, small_y), "chat data",
                    "mem.jsonl", "window of 4");
}

TEST(ChatDataset, TrainingRowsVisitEveryExampleOncePerEpoch) {
  kiln::ChatDataset d;
  d.examples.resize(7);
  std::vector<int> seen(7, 0);
  // Steps of 2 batches of 3: 6 rows a step; 7 steps = 42 rows = 6 epochs.
  for (int64_t step = 0; step < 7; ++step)
    for (int64_t k = 0; k < 2; ++k)
      for (int64_t r : d.training_rows(5, step, 2, k, 3)) ++seen[size_t(r)];
  for (int c : seen) EXPECT_EQ(c, 6);
  EXPECT_EQ(d.training_rows(5, 3, 2, 1, 3), d.training_rows(5, 3, 2, 1, 3));
  EXPECT_NE(d.training_rows(5, 0, 1, 0, 7), d.training_rows(6, 0, 1, 0, 7));
}

}  // namespace
