// libFuzzer target for kiln::models' JSON readers (config.json,
// generation_config.json, model.safetensors.index.json, a LoRA adapter's
// adapter_config.json): any input either parses or throws kiln::Error. A config
// that parses is written back (config_json, lora_config_json) and must parse
// again to the same text.
//   cmake --preset fuzz && cmake --build --preset fuzz
//   build/fuzz/tests/fuzz/kiln_fuzz_model_config tests/fuzz/corpus/model_config -max_total_time=600
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "kiln/lora.h"
#include "kiln/models.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  try {
    const kiln::models::ModelConfig cfg = kiln::models::parse_config(text, "config.json");
    const std::string out = kiln::models::config_json(cfg);
    if (kiln::models::config_json(kiln::models::parse_config(out, "written")) != out) std::abort();
  } catch (const kiln::Error&) {}
  try {
    kiln::models::GenerationConfig g;
    kiln::models::parse_generation_config(text, "generation_config.json", g);
  } catch (const kiln::Error&) {}
  try {
    (void)kiln::models::parse_shard_index(text, "model.safetensors.index.json");
  } catch (const kiln::Error&) {}
  try {
    const auto lora = kiln::models::parse_lora_config(text, "adapter_config.json");
    const std::string out = kiln::models::lora_config_json(lora);
    if (kiln::models::lora_config_json(kiln::models::parse_lora_config(out, "written")) != out)
      std::abort();
  } catch (const kiln::Error&) {}
  return 0;
}
