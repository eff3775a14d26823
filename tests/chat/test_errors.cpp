// Bad and hostile templates: every refusal is a kiln::Error that names what is
// wrong and its line; limits stop endless loops, recursion and output floods.
#include <gtest/gtest.h>

#include <string>

#include "kiln/chat.h"
#include "kiln/error.h"

namespace {

// The message of the kiln::Error that parsing and rendering `src` throws.
std::string error_of(std::string_view src, std::string_view vars = "{}",
                     const kiln::chat::Limits& limits = {}) {
  try {
    kiln::chat::Template(src).render(vars, limits);
  } catch (const kiln::Error& e) {
    return e.what();
  }
  return "(no error)";
}

#define EXPECT_ERROR(src, ...) EXPECT_THAT_ERROR(error_of(src), __VA_ARGS__)
void EXPECT_THAT_ERROR(const std::string& msg, std::initializer_list<const char*> parts) {
  for (const char* p : parts)
    EXPECT_NE(msg.find(p), std::string::npos) << "'" << p << "' not in: " << msg;
}

TEST(ChatErrors, UnsupportedConstructsNameThemAndTheirLine) {
  EXPECT_ERROR("a\nb\n{% include 'x.j2' %}", {"line 3", "unsupported tag {% include %}"});
  EXPECT_ERROR("{% extends 'base' %}", {"line 1", "extends"});
  EXPECT_ERROR("\n{% call foo() %}{% endcall %}", {"line 2", "call"});
  EXPECT_ERROR("{% frobnicate %}", {"unknown tag {% frobnicate %}"});
  EXPECT_ERROR("\n\n{{ x | frobnicate }}", {"line 3", "unknown filter 'frobnicate'"});
  EXPECT_ERROR("{{ x is frobnicated }}", {"unknown test 'frobnicated'"});
  EXPECT_ERROR("{{ 'a'.zfill(3) }}", {"unsupported string method 'zfill'"});
  EXPECT_ERROR("{{ 'a %s' % 1 }}", {"printf-style"});
  EXPECT_ERROR("{% for x in xs recursive %}{% endfor %}", {"recursive"});
}

TEST(ChatErrors, SyntaxErrorsHaveLines) {
  EXPECT_ERROR("ok\n{% if x %}never closed", {"line 2", "missing {% endif %}"});
  EXPECT_ERROR("{{ 1 + }}", {"line 1", "unexpected }}"});
  EXPECT_ERROR("\n{{ 'open", {"line 2", "string literal is never closed"});
  EXPECT_ERROR("{{ x ", {"never closed"});
  EXPECT_ERROR("{# comment", {"comment"});
  EXPECT_ERROR("{% endfor %}", {"unexpected {% endfor %}"});
  EXPECT_ERROR("{% for x in y %}\n{% else %}\n{% else %}{% endfor %}",
               {"line 3", "unexpected {% else %}"});
  EXPECT_ERROR("{% break %}", {"outside a for loop"});
  EXPECT_ERROR("{{ a $ b }}", {"unexpected character '$'"});
  EXPECT_ERROR("{{ 99999999999999999999 }}", {"too large"});
}

TEST(ChatErrors, RuntimeErrors) {
  EXPECT_ERROR("{{ raise_exception('Roles must alternate') }}", {"line 1", "Roles must alternate"});
  EXPECT_ERROR("\n{{ nofunc(1) }}", {"line 2", "'nofunc' is undefined"});
  EXPECT_ERROR("{{ 1 / 0 }}", {"division by zero"});
  EXPECT_ERROR("{{ 'a' + 1 }}", {"unsupported operand types for +: str and int"});
  EXPECT_ERROR("{{ 9223372036854775807 + 1 }}", {"integer overflow"});
  EXPECT_ERROR("{% set x = {} %}{% set x.a = 1 %}", {"not a namespace"});
  EXPECT_ERROR("{% for a, b in [[1, 2, 3]] %}{% endfor %}", {"cannot unpack 3 values"});
  EXPECT_ERROR("{{ 5 | length }}", {"has no length"});
  EXPECT_ERROR("{{ 'x' in none }}", {"argument of type NoneType is not iterable"});
}

TEST(ChatErrors, BadVariablesJson) {
  EXPECT_NE(error_of("x", "[1]").find("expected a JSON object"), std::string::npos);
  EXPECT_NE(error_of("x", "{").find("not valid JSON"), std::string::npos);
  std::string deep(1000, '[');
  EXPECT_NE(error_of("x", "{\"a\": " + deep + std::string(1000, ']') + "}").find("nested deeper"),
            std::string::npos);
}

TEST(ChatErrors, EndlessLoopStopsAtTheStepLimit) {
  kiln::chat::Limits limits;
  limits.max_steps = 100000;
  const std::string msg =
      error_of("{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}",
               "{}", limits);
  EXPECT_NE(msg.find("Limits::max_steps"), std::string::npos) << msg;
}

// Each iteration copies a 32 MB string: few steps each, but the copies cost
// steps in proportion to their size, so this ends at the step limit quickly.
TEST(ChatErrors, CopyingBigValuesInALoopStopsAtTheStepLimit) {
  const std::string msg = error_of(
      "{% set ns = namespace(s='x' * 33554432) %}{% for i in range(1000000) %}{% if ns.s %}{% "
      "endif %}{% endfor %}");
  EXPECT_NE(msg.find("Limits::max_steps"), std::string::npos) << msg;
}

TEST(ChatErrors, EndlessRecursionStopsAtTheDepthLimit) {
  const std::string msg = error_of("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}\n{{ f(0) }}");
  EXPECT_NE(msg.find("Limits::max_depth"), std::string::npos) << msg;
}

TEST(ChatErrors, OutputFloodStopsAtTheSizeLimit) {
  kiln::chat::Limits limits;
  limits.max_output = 1 << 20;
  EXPECT_NE(error_of("{% for i in range(100000) %}0123456789abcdef{% endfor %}", "{}", limits)
                .find("Limits::max_output"),
            std::string::npos);
  EXPECT_NE(error_of("{{ 'x' * 100000000 }}", "{}", limits).find("Limits::max_output"),
            std::string::npos);
  EXPECT_NE(error_of("{{ range(1000000000000) | length }}", "{}", limits).find("limits"),
            std::string::npos);
  // Powers are by squaring: a huge exponent of 1 is quick, not 10**18 steps.
  EXPECT_EQ(kiln::chat::Template("{{ 1 ** 1000000000000000000 }}x").render("{}"), "1x");
}

TEST(ChatErrors, DeepNestingIsRefusedNotAStackOverflow) {
  EXPECT_NE(error_of("{{ " + std::string(100000, '(') + "1" + std::string(100000, ')') + " }}")
                .find("nested too deeply"),
            std::string::npos);
  std::string chain = "{{ 1";
  for (int k = 0; k < 100000; ++k) chain += " + 1";
  EXPECT_NE(error_of(chain + " }}").find("nested too deeply"), std::string::npos);
  std::string ifs;
  for (int k = 0; k < 10000; ++k) ifs += "{% if true %}";
  EXPECT_NE(error_of(ifs).find("nested too deeply"), std::string::npos);
}

TEST(ChatErrors, ChatTemplateConfig) {
  using kiln::chat::ChatTemplate;
  auto msg = [](std::string_view config, const std::string& name = "") {
    try {
      ChatTemplate::from_config(config, {}, name);
    } catch (const kiln::Error& e) {
      return std::string(e.what());
    }
    return std::string("(no error)");
  };
  EXPECT_NE(msg("{}").find("has no chat_template"), std::string::npos);
  EXPECT_NE(msg(R"({"chat_template": 3})").find("string or a list"), std::string::npos);
  const char* named =
      R"({"chat_template": [{"name": "default", "template": "d"}, {"name": "tool_use", "template": "t"}]})";
  EXPECT_NE(msg(named, "rag").find("(it has: default, tool_use)"), std::string::npos);
  EXPECT_EQ(ChatTemplate::from_config(named, {}, "tool_use").apply(R"({"messages": []})", false),
            "t");
  EXPECT_EQ(ChatTemplate::from_config(named).apply(R"({"messages": []})", false), "d");
  const auto jinja =
      ChatTemplate::from_config("", "{{ messages | length }}{{ add_generation_prompt }}");
  EXPECT_EQ(jinja.apply(R"({"messages": [1]})", true), "1True");
  try {
    jinja.apply(R"({"mesages": []})", true);
    FAIL();
  } catch (const kiln::Error& e) {
    EXPECT_NE(std::string(e.what()).find("needs \"messages\""), std::string::npos);
  }
}

}  // namespace
