// Shared helpers of the model tests: fixture paths, the expected tensors the
// PyTorch reference wrote (tests/models/make_fixtures.py), and running a model.
#pragma once
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "kiln/ext/alloc.h"
#include "kiln/kiln.h"

namespace kiln::test {

inline std::string fixture_dir(const std::string& name) {
  return std::string(KILN_SOURCE_DIR) + "/tests/models/fixtures/" + name;
}

// expected.safetensors (or another file the reference wrote, e.g.
// generation.safetensors) of a fixture: F32 and I32 tensors by name.
class Expected {
 public:
  explicit Expected(const std::string& fixture, const std::string& file = "expected.safetensors")
      : f_(fixture_dir(fixture) + "/" + file) {}
  bool has(const std::string& name) const { return f_.find(name) != nullptr; }
  std::vector<float> floats(const std::string& name) const {
    const std::vector<uint8_t> b = f_.read_bytes(name);
    std::vector<float> v(b.size() / 4);
    std::memcpy(v.data(), b.data(), b.size());
    return v;
  }
  std::vector<int32_t> ints(const std::string& name) const {
    const std::vector<uint8_t> b = f_.read_bytes(name);
    std::vector<int32_t> v(b.size() / 4);
    std::memcpy(v.data(), b.data(), b.size());
    return v;
  }
  std::vector<int64_t> dims(const std::string& name) const { return f_.find(name)->dims; }
  std::vector<std::string> names() const {
    std::vector<std::string> out;
    for (const TensorInfo& t : f_.tensors()) out.push_back(t.name);
    return out;
  }

 private:
  SafetensorsFile f_;
};

// max |got - want| / max |want|: the error relative to the tensor's scale.
inline double rel_error(const std::vector<float>& got, const std::vector<float>& want) {
  EXPECT_EQ(got.size(), want.size());
  double err = 0, scale = 0;
  for (size_t i = 0; i < got.size() && i < want.size(); ++i) {
    err = std::max(err, double(std::fabs(got[i] - want[i])));
    scale = std::max(scale, double(std::fabs(want[i])));
  }
  return scale > 0 ? err / scale : err;
}

// Logits of `model` for the fixture's input_ids ([B, T]), computed on the CPU.
inline std::vector<float> run_logits(Context& ctx, models::CausalLM& model, const Expected& e) {
  const std::vector<int64_t> d = e.dims("input_ids");
  Tensor ids = ctx.input(i32, {d[0], d[1]}, "input_ids");
  model.eval();
  Tensor logits = model(ids);
  EXPECT_EQ(logits.shape(), Shape({d[0], d[1], model.vocab_size()}));
  Graph g = Graph::forward(logits);
  CpuBackend cpu(1);
  GraphAllocator galloc(cpu.buffer_type());
  galloc.alloc(g);
  ids.set(e.ints("input_ids"));
  cpu.compute(g);
  return logits.get<float>();
}

}  // namespace kiln::test
