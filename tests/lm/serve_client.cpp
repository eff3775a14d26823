// kiln-lm serve end to end, as a client (cpp-httplib's) of a running server
// (serve_check.sh starts it): replies equal kiln's one-sequence Generator on
// the same rendered prompt (what kiln-lm generate runs): greedy ones whole
// and streamed and a completion, and seeded sampled ones for 4 clients at
// once; a repeated prompt reuses the finished request's cache (all but its
// last token) and still replies the same; every kind of bad request gets an
// OpenAI-style 4xx error and the server goes on serving; a streaming client
// that disconnects frees its sequence.
//   kiln_serve_client PORT MODEL_DIR
#include <httplib.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "chat_setup.h"
#include "kiln/chat.h"
#include "kiln/cpu.h"
#include "kiln/generate.h"
#include "kiln/tokenizer.h"

namespace {

using Json = nlohmann::ordered_json;

int failures = 0;

void check(bool ok, const std::string& what) {
  if (ok) return;
  ++failures;
  std::fprintf(stderr, "FAIL: %s\n", what.c_str());
}

struct Expected {
  std::string text, finish_reason;
  int64_t prompt_tokens = 0, completion_tokens = 0;
};

struct Reference {
  kiln::Context ctx;
  kiln::CpuBackend cpu{1};
  std::unique_ptr<kiln::models::CausalLM> model;
  kiln::Tokenizer tok;
  kiln::chat::ChatTemplate tmpl;
  std::vector<int64_t> ends;
  Reference(const std::string& dir, int64_t ctx_len)
      : model(kiln::models::load_pretrained(ctx, cpu, dir, {.max_seq_len = ctx_len})),
        tok(kiln::Tokenizer::load(dir)),
        tmpl(lm::load_chat_template(dir, "")),
        ends(lm::reply_end_ids(*model, tok, tmpl, "serve_client", dir)) {}

  // Decoding of `ids` as the server runs it (greedy when `seed` < 0, else
  // temperature 1 with that seed): ends at a reply-end id (not in the text)
  // or after max_tokens.
  Expected run(const std::vector<int32_t>& ids, int64_t max_tokens, int64_t seed) {
    kiln::models::Generator gen(*model, cpu, {.max_seq_len = model->max_seq_len()});
    kiln::models::GenerateOptions o;
    o.max_new_tokens = max_tokens;
    o.sampling = kiln::models::default_sampling(model->config().generation, {});
    o.sampling.temperature = seed < 0 ? 0.0f : 1.0f;
    o.sampling.top_p = 1;
    o.sampling.seed = uint64_t(std::max<int64_t>(seed, 0));
    o.eos_token_ids = ends;
    const kiln::models::GenerationResult r = gen.generate(ids, o);
    Expected e;
    kiln::StreamDecoder dec(tok, true);
    for (int32_t id : r.ids)
      if (std::find(ends.begin(), ends.end(), int64_t(id)) == ends.end()) e.text += dec.push(id);
    e.text += dec.flush();
    e.finish_reason = r.stop == kiln::models::StopReason::eos ? "stop" : "length";
    e.prompt_tokens = int64_t(ids.size());
    e.completion_tokens = int64_t(r.ids.size());
    return e;
  }
  Expected chat(const std::string& user, int64_t max_tokens, int64_t seed = -1) {
    const Json req = {{"messages", {{{"role", "user"}, {"content", user}}}}};
    return run(tok.encode(tmpl.apply(req.dump(), true), false), max_tokens, seed);
  }
  Expected completion(const std::string& prompt, int64_t max_tokens) {
    return run(tok.encode(prompt, true), max_tokens, -1);
  }
};

// A greedy request, or with `seed` >= 0 one sampled at temperature 1.
Json chat_body(const std::string& user, int64_t max_tokens, bool stream, int64_t seed = -1) {
  Json b = {{"model", "tiny"},
            {"messages", {{{"role", "user"}, {"content", user}}}},
            {"max_tokens", max_tokens},
            {"temperature", seed < 0 ? 0 : 1},
            {"top_p", 1},
            {"stream", stream},
            {"stream_options", {{"include_usage", true}}}};
  if (seed >= 0) b["seed"] = seed;
  return b;
}

// The text, finish reason and usage of a response (whole or server-sent events).
struct Got {
  int status = 0;
  std::string text, finish_reason;
  int64_t prompt_tokens = -1, completion_tokens = -1, cached_tokens = -1;
  bool done = false;  // [DONE] seen (streams)
};

Got read_response(const httplib::Result& res, bool chat, bool stream) {
  Got g;
  if (!res) return g;
  g.status = res->status;
  if (res->status != 200) return g;
  auto take_choice = [&](const Json& c) {
    if (stream && chat) {
      if (c["delta"].contains("content")) g.text += c["delta"]["content"].get<std::string>();
    } else if (chat) {
      g.text += c["message"]["content"].get<std::string>();
    } else {
      g.text += c["text"].get<std::string>();
    }
    if (!c["finish_reason"].is_null()) g.finish_reason = c["finish_reason"];
  };
  auto take = [&](const Json& j) {
    for (const Json& c : j["choices"]) take_choice(c);
    if (j.contains("usage")) {
      g.prompt_tokens = j["usage"]["prompt_tokens"];
      g.completion_tokens = j["usage"]["completion_tokens"];
      g.cached_tokens = j["usage"]["prompt_tokens_details"]["cached_tokens"];
    }
  };
  if (!stream) {
    take(Json::parse(res->body));
    return g;
  }
  size_t at = 0;
  while (at < res->body.size()) {
    size_t end = res->body.find("\n\n", at);
    if (end == std::string::npos) end = res->body.size();
    const std::string event = res->body.substr(at, end - at);
    at = end + 2;
    if (event.rfind("data: ", 0) != 0) continue;  // comments (": waiting")
    const std::string data = event.substr(6);
    if (data == "[DONE]") g.done = true;
    else take(Json::parse(data));
  }
  return g;
}

void compare(const Got& g, const Expected& e, const std::string& what, bool stream) {
  check(g.status == 200, what + ": status " + std::to_string(g.status));
  check(g.text == e.text, what + ": text '" + g.text + "', want '" + e.text + "'");
  check(g.finish_reason == e.finish_reason,
        what + ": finish_reason '" + g.finish_reason + "', want '" + e.finish_reason + "'");
  check(g.prompt_tokens == e.prompt_tokens, what + ": prompt_tokens " +
                                                std::to_string(g.prompt_tokens) + ", want " +
                                                std::to_string(e.prompt_tokens));
  check(g.completion_tokens == e.completion_tokens,
        what + ": completion_tokens " + std::to_string(g.completion_tokens) + ", want " +
            std::to_string(e.completion_tokens));
  if (stream) check(g.done, what + ": no data: [DONE]");
}

httplib::Result post(httplib::Client& c, const std::string& path, const std::string& body) {
  return c.Post(path.c_str(), body, "application/json");
}

void expect_error(httplib::Client& c, const std::string& path, const std::string& body, int status,
                  const std::string& needle) {
  const auto res = post(c, path, body);
  const std::string what = "bad request " + body.substr(0, 80);
  if (!res) {
    check(false, what + ": no response");
    return;
  }
  check(res->status == status, what + ": status " + std::to_string(res->status));
  try {
    const Json j = Json::parse(res->body);
    check(j["error"]["type"] == "invalid_request_error", what + ": error type " + res->body);
    const std::string m = j["error"]["message"];
    check(m.find(needle) != std::string::npos,
          what + ": message '" + m + "' lacks '" + needle + "'");
  } catch (const std::exception& e) {
    check(false, what + ": body is not error JSON: " + res->body);
  }
}

int64_t health_active(httplib::Client& c) {
  const auto res = c.Get("/health");
  if (!res || res->status != 200) return -1;
  return Json::parse(res->body)["requests_active"].get<int64_t>();
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 4) {
    std::fprintf(stderr, "usage: kiln_serve_client PORT MODEL_DIR CTX\n");
    return 2;
  }
  const int port = std::atoi(argv[1]);
  Reference ref(argv[2], std::atoll(argv[3]));
  httplib::Client c("127.0.0.1", port);
  c.set_read_timeout(120, 0);

  // The cheap endpoints.
  auto h = c.Get("/health");
  check(h && h->status == 200 && Json::parse(h->body)["status"] == "ok", "GET /health");
  auto models = c.Get("/v1/models");
  check(
      models && models->status == 200 && Json::parse(models->body)["data"][0]["object"] == "model",
      "GET /v1/models");

  // One request, whole and streamed; a completion. The second request's
  // prompt is the first's, whose tokens the finished sequence's cache row
  // kept: all but its last token are reused (usage.prompt_tokens_details),
  // and the reply is still the fresh Generator's.
  const Expected e0 = ref.chat("Hello there", 8);
  const Got g0 = read_response(
      post(c, "/v1/chat/completions", chat_body("Hello there", 8, false).dump()), true, false);
  compare(g0, e0, "chat", false);
  check(g0.cached_tokens == 0,
        "chat: " + std::to_string(g0.cached_tokens) + " cached tokens on a fresh server");
  const Got g1 = read_response(
      post(c, "/v1/chat/completions", chat_body("Hello there", 8, true).dump()), true, true);
  compare(g1, e0, "chat stream (its prompt reused)", true);
  check(g1.cached_tokens == e0.prompt_tokens - 1,
        "chat stream: " + std::to_string(g1.cached_tokens) + " cached tokens, want " +
            std::to_string(e0.prompt_tokens - 1));
  const Json comp = {{"prompt", "Once upon a time"}, {"max_tokens", 6}, {"temperature", 0}};
  compare(read_response(post(c, "/v1/completions", comp.dump()), false, false),
          ref.completion("Once upon a time", 6), "completion", false);

  // Four clients at once (two streaming), each its own conversation, sampled
  // with its own seed (a tiny model's greedy replies may all be alike, and
  // then a mixed-up reply would go unseen).
  const std::vector<std::string> users = {"The cat sat", "A second question here",
                                          "Tell me a story", "Why"};
  std::vector<Expected> want;
  for (size_t i = 0; i < users.size(); ++i)
    want.push_back(ref.chat(users[i], 12, 100 + int64_t(i)));
  check(want[0].text != want[1].text || want[1].text != want[2].text,
        "the sampled references are all alike: the check below would not see a mix-up");
  std::vector<Got> got(users.size());
  std::vector<std::thread> clients;
  for (size_t i = 0; i < users.size(); ++i)
    clients.emplace_back([&, i] {
      httplib::Client ci("127.0.0.1", port);
      ci.set_read_timeout(120, 0);
      const bool stream = i % 2 == 1;
      got[i] = read_response(post(ci, "/v1/chat/completions",
                                  chat_body(users[i], 12, stream, 100 + int64_t(i)).dump()),
                             true, stream);
    });
  for (auto& t : clients) t.join();
  for (size_t i = 0; i < users.size(); ++i)
    compare(got[i], want[i], "concurrent client " + std::to_string(i), i % 2 == 1);

  // Bad requests: 4xx with OpenAI's error object.
  const std::string chat = "/v1/chat/completions";
  expect_error(c, chat, "{not json", 400, "not valid JSON");
  expect_error(c, chat, R"({"messages": "hi"})", 400, "'messages'");
  expect_error(c, chat, R"({"messages": [{"role": 3, "content": "x"}]})", 400, "role");
  expect_error(c, chat, R"({"messages": [{"role": "user", "content": "x"}], "max_tokens": "5"})",
               400, "'max_tokens' must be an integer");
  expect_error(c, chat, R"({"messages": [{"role": "user", "content": "x"}], "temperature": "hot"})",
               400, "'temperature' must be a number");
  expect_error(c, chat, R"({"messages": [{"role": "user", "content": "x"}], "stop": 5})", 400,
               "'stop'");
  expect_error(c, chat, R"({"messages": [{"role": "user", "content": "x"}], "n": 2})", 400,
               "'n' must be 1");
  expect_error(c, chat, R"({"messages": [{"role": "user", "content": "x"}], "stream": "yes"})", 400,
               "'stream' must be a boolean");
  std::string long_text;
  for (int i = 0; i < 3000; ++i) long_text += "word ";
  expect_error(c, chat, chat_body(long_text, 4, false).dump(), 400, "too long for the context");
  expect_error(c, chat, R"({"messages": [{"role": "system", "content": "x"}]})", 400,
               "no system messages");  // the template raises
  expect_error(c, "/v1/completions", R"({"prompt": 5})", 400, "'prompt'");
  expect_error(c, "/v1/completions", R"({"prompt": [1, 99999999]})", 400, "vocabulary");
  auto missing = c.Get("/v1/nothing");
  check(missing && missing->status == 404 &&
            Json::parse(missing->body)["error"]["type"] == "invalid_request_error",
        "GET /v1/nothing: 404 with an error object");

  // A streaming client that goes away after its first event frees its sequence.
  {
    httplib::Client cd("127.0.0.1", port);
    httplib::Request req;
    req.method = "POST";
    req.path = "/v1/chat/completions";
    Json body = chat_body("Go on for a long time", 1000, true);
    body["temperature"] = 1;
    for (int64_t id : ref.ends) body["logit_bias"][std::to_string(id)] = -100;  // no early end
    req.body = body.dump();
    req.set_header("Content-Type", "application/json");
    int events = 0;
    req.content_receiver = [&](const char*, size_t, uint64_t, uint64_t) { return ++events < 2; };
    httplib::Response res;
    httplib::Error err;
    cd.send(req, res, err);
    check(events >= 1, "disconnecting client: no event before it left");
  }
  int64_t active = -1;
  for (int i = 0; i < 100 && active != 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    active = health_active(c);
  }
  check(active == 0, "the disconnected client's request still holds a sequence");

  // Still serving, with the same answers.
  compare(read_response(post(c, chat, chat_body("Hello there", 8, false).dump()), true, false), e0,
          "chat after the bad requests", false);
  if (failures) {
    std::fprintf(stderr, "%d checks failed\n", failures);
    return 1;
  }
  std::printf("serve client: all checks passed\n");
  return 0;
}
