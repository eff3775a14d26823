// libFuzzer target for the GGUF reader: any input either parses or throws
// kiln::Error; then all metadata is printed and typed reads are tried, every
// tensor is read as bytes and, when small, loaded into a kiln tensor (or, when
// block-quantized, dequantized).
//   cmake --preset fuzz && cmake --build --preset fuzz
//   build/fuzz/tests/fuzz/kiln_fuzz_gguf tests/fuzz/corpus/gguf -max_total_time=600
#include "fuzz_util.h"
#include "kiln/io.h"
#include "kiln/kiln.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static kiln::CpuBackend cpu(1);
  const std::string& path = kiln_fuzz::input_path(data, size);
  try {
    kiln::GgufFile f(path);
    for (const auto& [key, value] : f.metadata()) {
      (void)value.str();
      if (f.find(key) != &value) std::abort();
      try {
        (void)value.as_int();
      } catch (const kiln::Error&) {}
      try {
        (void)value.as_floats();
      } catch (const kiln::Error&) {}
    }
    for (const kiln::GgufTensorInfo& t : f.tensors()) {
      if (f.read_bytes(t.name).size() != t.nbytes) std::abort();
      if (t.nbytes > 4096) continue;
      if (t.quantized()) {  // block data: dequantized, never loaded into a tensor
        if (kiln::gguf_dequantize(t, f.read_bytes(t.name)).size() != size_t(t.shape.numel()))
          std::abort();
        continue;
      }
      kiln::Context ctx;
      kiln::Tensor dst = ctx.tensor(t.dtype, t.shape, "dst");
      auto buf = kiln::allocate_tensors(ctx, cpu);
      f.load(dst, t.name);
    }
  } catch (const kiln::Error&) {}
  return 0;
}
