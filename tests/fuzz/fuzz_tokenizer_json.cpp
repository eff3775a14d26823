// libFuzzer target for the tokenizer.json reader: any input either loads or
// throws kiln::Error; a tokenizer that loads encodes a fixed text and the input
// itself (invalid UTF-8 included), and decodes what it encoded, which must not
// crash, hang or throw anything but kiln::Error.
//   cmake --preset fuzz && cmake --build --preset fuzz
//   build/fuzz/tests/fuzz/kiln_fuzz_tokenizer_json tests/fuzz/corpus/tokenizer_json
//   -max_total_time=600
#include <cstdint>
#include <string_view>

#include "kiln/error.h"
#include "kiln/tokenizer.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view input(reinterpret_cast<const char*>(data), size);
  try {
    kiln::Tokenizer tok = kiln::Tokenizer::from_json(input, {}, "fuzz input");
    for (std::string_view text :
         {std::string_view("Hello, world! 123  \n\t<s> caf\xC3\xA9 \xF0\x9F\x98\x80 \xFF"),
          input.substr(0, 2048)}) {
      std::vector<int32_t> ids = tok.encode(text, true);
      (void)tok.decode(ids);
      kiln::StreamDecoder stream(tok);
      for (int32_t id : ids) (void)stream.push(id);
      (void)stream.flush();
    }
  } catch (const kiln::Error&) {}
  return 0;
}
