// What kiln-lm chat and serve share: a model's chat template (its directory's
// tokenizer_config.json / chat_template.jinja, or the GGUF file's metadata) and
// the token ids that end an assistant's reply.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "kiln/chat.h"
#include "kiln/models.h"
#include "kiln/tokenizer.h"

namespace lm {

// `name`: which of a list of named templates ("" : "default").
kiln::chat::ChatTemplate load_chat_template(const std::string& model, const std::string& name);

// The model's eos ids (generation_config.json), the tokenizer's eos and the
// special token the template ends an assistant's turn with (<|im_end|>,
// <|eot_id|>, ...), sorted. Errors (naming `command` and `model_path`) when
// there is none: replies could not end.
std::vector<int64_t> reply_end_ids(const kiln::models::CausalLM& model, const kiln::Tokenizer& tok,
                                   const kiln::chat::ChatTemplate& tmpl, const char* command,
                                   const std::string& model_path);

}  // namespace lm
