// kiln-lm serve's requests and responses (serve_api.h).
#include "serve_api.h"

#include <cmath>
#include <limits>
#include <random>

#include "kiln/error.h"

namespace lm::serve {
namespace {

[[noreturn]] void bad(const std::string& param, const std::string& message) {
  throw RequestError(400, message, param);
}

const Json* field(const Json& body, const char* name) {
  auto it = body.find(name);
  return it == body.end() || it->is_null() ? nullptr : &*it;
}

std::optional<double> number(const Json& body, const char* name, double lo, double hi) {
  const Json* v = field(body, name);
  if (!v) return std::nullopt;
  if (!v->is_number())
    bad(name, std::string("'") + name + "' must be a number, got " + v->type_name());
  const double x = v->get<double>();
  if (!(x >= lo && x <= hi))
    bad(name, std::string("'") + name + "' must be between " + Json(lo).dump() + " and " +
                  Json(hi).dump() + ", got " + v->dump());
  return x;
}

std::optional<int64_t> integer(const Json& body, const char* name, int64_t lo, int64_t hi) {
  const Json* v = field(body, name);
  if (!v) return std::nullopt;
  if (!v->is_number_integer())
    bad(name, std::string("'") + name + "' must be an integer, got " + v->dump());
  if (v->is_number_unsigned() && v->get<uint64_t>() > uint64_t(hi))
    bad(name, std::string("'") + name + "' must be at most " + std::to_string(hi));
  const int64_t x = v->get<int64_t>();
  if (x < lo || x > hi)
    bad(name, std::string("'") + name + "' must be between " + std::to_string(lo) + " and " +
                  std::to_string(hi) + ", got " + v->dump());
  return x;
}

std::optional<bool> boolean(const Json& body, const char* name) {
  const Json* v = field(body, name);
  if (!v) return std::nullopt;
  if (!v->is_boolean())
    bad(name, std::string("'") + name + "' must be a boolean, got " + v->dump());
  return v->get<bool>();
}

void expect_string(const Json& body, const char* name) {
  const Json* v = field(body, name);
  if (v && !v->is_string())
    bad(name, std::string("'") + name + "' must be a string, got " + v->type_name());
}

// OpenAI's content: a string, or a list of {"type": "text", "text": ...}
// parts (joined); null for an assistant turn that only calls tools.
Json content_text(const Json& content, size_t i) {
  const std::string where = "messages[" + std::to_string(i) + "].content";
  if (content.is_null() || content.is_string()) return content;
  if (!content.is_array()) bad(where, "'" + where + "' must be a string or a list of text parts");
  std::string text;
  for (const Json& part : content) {
    if (!part.is_object() || part.value("type", "") != "text" || !part.contains("text") ||
        !part["text"].is_string())
      bad(where, "'" + where + "' may only hold {\"type\": \"text\", \"text\": ...} parts");
    text += part["text"].get<std::string>();
  }
  return text;
}

std::string render(const Json& body, const kiln::chat::ChatTemplate& tmpl) {
  const Json* messages = field(body, "messages");
  if (!messages) bad("messages", "'messages' is required");
  if (!messages->is_array() || messages->empty())
    bad("messages", "'messages' must be a non-empty list of messages");
  Json vars = Json::object();
  if (const Json* kw = field(body, "chat_template_kwargs")) {
    if (!kw->is_object()) bad("chat_template_kwargs", "'chat_template_kwargs' must be an object");
    vars = *kw;
  }
  Json msgs = Json::array();
  for (size_t i = 0; i < messages->size(); ++i) {
    const Json& m = (*messages)[i];
    const std::string where = "messages[" + std::to_string(i) + "]";
    if (!m.is_object()) bad(where, "'" + where + "' must be an object");
    if (!m.contains("role") || !m["role"].is_string())
      bad(where + ".role", "'" + where + ".role' must be a string");
    Json out = m;
    if (m.contains("content")) out["content"] = content_text(m["content"], i);
    else if (!m.contains("tool_calls"))
      bad(where + ".content", "'" + where + ".content' is required");
    msgs.push_back(std::move(out));
  }
  vars["messages"] = std::move(msgs);
  if (const Json* tools = field(body, "tools")) {
    if (!tools->is_array()) bad("tools", "'tools' must be a list");
    vars["tools"] = *tools;
  }
  try {
    return tmpl.apply(vars.dump(), true);
  } catch (const kiln::Error& e) {
    bad("messages", std::string("the chat template could not render these messages: ") + e.what());
  }
}

}  // namespace

Json error_body(int status, const std::string& message, const std::string& param) {
  return {{"error",
           {{"message", message},
            {"type", status < 500 ? "invalid_request_error" : "server_error"},
            {"param", param.empty() ? Json(nullptr) : Json(param)},
            {"code", nullptr}}}};
}

Request parse_request(const std::string& text, bool chat,
                      const kiln::models::SamplingConfig& defaults,
                      const kiln::chat::ChatTemplate* tmpl) {
  Json body;
  try {
    body = Json::parse(text);
  } catch (const Json::exception& e) {
    bad("", std::string("the body is not valid JSON: ") + e.what());
  }
  if (!body.is_object()) bad("", "the body must be a JSON object");
  Request q;
  q.chat = chat;
  expect_string(body, "model");
  expect_string(body, "user");
  q.stream = boolean(body, "stream").value_or(false);
  if (const Json* so = field(body, "stream_options")) {
    if (!so->is_object()) bad("stream_options", "'stream_options' must be an object");
    q.include_usage = boolean(*so, "include_usage").value_or(false);
  }
  if (const auto n = integer(body, "n", 1, 128); n && *n != 1)
    bad("n", "'n' must be 1: kiln-lm serve returns one choice per request");
  const int64_t most = int64_t(1) << 40;
  q.max_tokens = integer(body, chat ? "max_completion_tokens" : "max_tokens", 1, most);
  if (!q.max_tokens) q.max_tokens = integer(body, "max_tokens", 1, most);
  q.sampling = defaults;
  if (const auto t = number(body, "temperature", 0, 2)) q.sampling.temperature = float(*t);
  if (const auto p = number(body, "top_p", 0, 1)) {
    if (*p <= 0) bad("top_p", "'top_p' must be more than 0");
    q.sampling.top_p = float(*p);
  }
  if (const auto p = number(body, "presence_penalty", -2, 2))
    q.sampling.presence_penalty = float(*p);
  if (const auto p = number(body, "frequency_penalty", -2, 2))
    q.sampling.frequency_penalty = float(*p);
  const auto seed = integer(body, "seed", std::numeric_limits<int64_t>::min(),
                            std::numeric_limits<int64_t>::max());
  q.sampling.seed = seed ? uint64_t(*seed) : std::random_device{}();
  if (const Json* lb = field(body, "logit_bias")) {
    if (!lb->is_object()) bad("logit_bias", "'logit_bias' must be an object of token id: bias");
    for (auto it = lb->begin(); it != lb->end(); ++it) {
      int32_t id = -1;
      try {
        size_t used = 0;
        id = int32_t(std::stol(it.key(), &used));
        if (used != it.key().size()) id = -1;
      } catch (const std::exception&) {}
      if (id < 0) bad("logit_bias", "'logit_bias' key '" + it.key() + "' is not a token id");
      const auto b = number(*lb, it.key().c_str(), -100, 100);
      if (!b) bad("logit_bias", "'logit_bias' value of '" + it.key() + "' must be a number");
      q.sampling.logit_bias.emplace_back(id, float(*b));
    }
  }
  if (const Json* stop = field(body, "stop")) {
    if (stop->is_string()) q.stop.push_back(stop->get<std::string>());
    else if (stop->is_array() && stop->size() <= 4) {
      for (const Json& s : *stop) {
        if (!s.is_string()) bad("stop", "'stop' must be a string or a list of up to 4 strings");
        q.stop.push_back(s.get<std::string>());
      }
    } else {
      bad("stop", "'stop' must be a string or a list of up to 4 strings");
    }
    for (const std::string& s : q.stop)
      if (s.empty()) bad("stop", "'stop' strings must not be empty");
  }
  if (chat) {
    q.prompt = render(body, *tmpl);
    return q;
  }
  if (boolean(body, "echo").value_or(false)) bad("echo", "'echo' is not supported");
  const Json* prompt = field(body, "prompt");
  if (!prompt) bad("prompt", "'prompt' is required");
  if (prompt->is_array() && prompt->size() == 1 && (*prompt)[0].is_string()) prompt = &(*prompt)[0];
  if (prompt->is_string()) {
    q.prompt = prompt->get<std::string>();
  } else if (prompt->is_array() && !prompt->empty()) {
    for (const Json& id : *prompt) {
      if (!id.is_number_integer() || id.get<int64_t>() < 0 ||
          id.get<int64_t>() > std::numeric_limits<int32_t>::max())
        bad("prompt", "'prompt' must be a string, a list of one string or a list of token ids");
      q.prompt_ids.push_back(int32_t(id.get<int64_t>()));
    }
  } else {
    bad("prompt", "'prompt' must be a string, a list of one string or a list of token ids");
  }
  if (q.prompt.empty() && q.prompt_ids.empty()) bad("prompt", "'prompt' is empty");
  return q;
}

Json usage(const Reply& r) {
  return {{"prompt_tokens", r.prompt_tokens},
          {"completion_tokens", r.completion_tokens},
          {"total_tokens", r.prompt_tokens + r.completion_tokens},
          {"prompt_tokens_details", {{"cached_tokens", r.cached_tokens}}}};
}

Json whole_response(const Request& q, const Reply& r, const std::string& text,
                    const std::string& finish_reason) {
  Json choice = {{"index", 0}};
  if (q.chat) choice["message"] = {{"role", "assistant"}, {"content", text}};
  else choice["text"] = text;
  choice["logprobs"] = nullptr;
  choice["finish_reason"] = finish_reason;
  return {{"id", r.id},
          {"object", q.chat ? "chat.completion" : "text_completion"},
          {"created", r.created},
          {"model", r.model},
          {"choices", Json::array({choice})},
          {"usage", usage(r)}};
}

Json stream_chunk(const Request& q, const Reply& r, const std::string& text,
                  const std::string* finish_reason, bool first) {
  Json choice = {{"index", 0}};
  if (q.chat) {
    Json delta = Json::object();
    if (first) delta["role"] = "assistant";
    if (!finish_reason) delta["content"] = text;
    choice["delta"] = delta;
  } else {
    choice["text"] = text;
  }
  choice["logprobs"] = nullptr;
  choice["finish_reason"] = finish_reason ? Json(*finish_reason) : Json(nullptr);
  return {{"id", r.id},
          {"object", q.chat ? "chat.completion.chunk" : "text_completion"},
          {"created", r.created},
          {"model", r.model},
          {"choices", Json::array({choice})}};
}

}  // namespace lm::serve
