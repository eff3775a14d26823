// libFuzzer target for the safetensors reader: any input either parses or
// throws kiln::Error; then every tensor is read as bytes and, when kiln can hold
// it and it is small, loaded into a kiln tensor. Crashes, sanitizer reports,
// other exceptions and allocations over libFuzzer's -rss_limit_mb are findings.
//   cmake --preset fuzz && cmake --build --preset fuzz
//   build/fuzz/tests/fuzz/kiln_fuzz_safetensors tests/fuzz/corpus/safetensors -max_total_time=600
#include "fuzz_util.h"
#include "kiln/kiln.h"
#include "kiln/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static kiln::CpuBackend cpu(1);
  const std::string& path = kiln_fuzz::input_path(data, size);
  try {
    kiln::SafetensorsFile f(path);
    for (const auto& [k, v] : f.metadata()) (void)(k.size() + v.size());
    for (const kiln::TensorInfo& t : f.tensors()) {
      if (f.read_bytes(t.name).size() != t.nbytes) std::abort();
      if (!t.loadable() || t.nbytes > 4096) continue;
      kiln::Context ctx;
      kiln::Tensor dst = ctx.tensor(t.dtype, t.shape, "dst");
      auto buf = kiln::allocate_tensors(ctx, cpu);
      f.read(t.name, dst);
    }
  } catch (const kiln::Error&) {}
  return 0;
}
