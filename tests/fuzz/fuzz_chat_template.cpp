// libFuzzer target for the chat-template renderer: the input is template
// text (a downloaded model's chat_template). It either parses or throws
// kiln::Error; a template that parses renders a fixed conversation (tools,
// tool calls, odd content) under small limits, which must end in output or a
// kiln::Error, never a crash or a hang.
//   cmake --preset fuzz && cmake --build --preset fuzz
//   build/fuzz/tests/fuzz/kiln_fuzz_chat_template tests/fuzz/corpus/chat_template
//   -max_total_time=600
#include <cstdint>
#include <string_view>

#include "kiln/chat.h"
#include "kiln/error.h"

namespace {
constexpr std::string_view kConversation = R"({
  "messages": [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Weather in {{ city }}? \u00e9\ud83d\ude00\n"},
    {"role": "assistant", "content": null, "tool_calls": [
      {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris", "n": 2.5}}}]},
    {"role": "tool", "content": "22 C"},
    {"role": "assistant", "content": "", "reasoning_content": "think"},
    {"role": "user", "content": ["a", 1, true]}
  ],
  "tools": [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}],
  "add_generation_prompt": true, "enable_thinking": false,
  "bos_token": "<s>", "eos_token": "</s>"
})";
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view input(reinterpret_cast<const char*>(data), size);
  kiln::chat::Limits limits;
  limits.max_steps = 200000;
  limits.max_depth = 50;
  limits.max_output = 1 << 20;
  limits.now = [] { return std::time_t(0); };
  try {
    kiln::chat::Template t(input, "fuzz input");
    (void)t.render(kConversation, limits);
  } catch (const kiln::Error&) {}
  return 0;
}
