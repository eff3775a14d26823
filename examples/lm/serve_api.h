// kiln-lm serve's subset of OpenAI's API: reading a request body into what
// the scheduler runs, with OpenAI-style errors for bad requests, and the
// response objects (whole and streamed chunks).
#pragma once
#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "kiln/chat.h"
#include "kiln/sampling.h"

namespace lm::serve {

using Json = nlohmann::ordered_json;

// A request the server refuses: HTTP `status`, OpenAI's error object.
struct RequestError : std::runtime_error {
  RequestError(int status, const std::string& message, std::string param = {})
      : std::runtime_error(message), status(status), param(std::move(param)) {}
  int status;
  std::string param;  // the offending field, when there is one
};

// {"error": {"message", "type": "invalid_request_error" (4xx) or "server_error", "param", "code"}}
Json error_body(int status, const std::string& message, const std::string& param = {});

struct Request {
  bool chat = false;  // /v1/chat/completions (else /v1/completions)
  bool stream = false, include_usage = false;
  std::string prompt;                 // the rendered conversation, or the completion prompt
  std::vector<int32_t> prompt_ids;    // /v1/completions given token ids (prompt then empty)
  std::optional<int64_t> max_tokens;  // max_tokens / max_completion_tokens
  kiln::models::SamplingConfig sampling;
  std::vector<std::string> stop;
};

// Reads a /v1/chat/completions (chat: renders messages, tools and the other
// template variables with `tmpl`) or /v1/completions body. `defaults`: the
// sampling settings fields left out get (seed: random unless given). Throws
// RequestError: malformed JSON, a field of the wrong type or out of range,
// n != 1, no messages / prompt, a template error.
Request parse_request(const std::string& body, bool chat,
                      const kiln::models::SamplingConfig& defaults,
                      const kiln::chat::ChatTemplate* tmpl);

// Response objects. `id`: "chatcmpl-..." or "cmpl-...".
struct Reply {
  std::string id, model;
  int64_t created = 0, prompt_tokens = 0, completion_tokens = 0;
  int64_t cached_tokens = 0;  // of the prompt's, reused from a finished request
};
Json usage(const Reply& r);
Json whole_response(const Request& q, const Reply& r, const std::string& text,
                    const std::string& finish_reason);
// A streamed chunk: `text` (and on the first chat chunk the role), or the
// last one with `finish_reason`.
Json stream_chunk(const Request& q, const Reply& r, const std::string& text,
                  const std::string* finish_reason, bool first);

}  // namespace lm::serve
