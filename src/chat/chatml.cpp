// The ChatML template (kiln/chat.h).
#include "kiln/chat.h"

namespace kiln::chat {

std::string_view chatml_template() {
  return "{%- for message in messages %}"
         "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + "
         "'\\n' }}"
         "{%- endfor %}"
         "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}";
}

}  // namespace kiln::chat
