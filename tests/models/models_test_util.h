// Shared helpers of the model tests: fixture paths, the expected tensors the
// PyTorch reference wrote (tests/models/make_fixtures.py), and running a model.
#pragma once
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "common/safetensors_fixture.h"
#include "kiln/ext/alloc.h"
#include "kiln/kiln.h"

namespace kiln::test {

inline std::string fixture_dir(const std::string& name) {
  return std::string(KILN_SOURCE_DIR) + "/tests/models/fixtures/" + name;
}

// expected.safetensors (or another file the reference wrote, e.g.
// generation.safetensors) of a fixture: F32 and I32 tensors by name.
class Expected : public kiln_test::SafetensorsFixture {
 public:
  explicit Expected(const std::string& fixture, const std::string& file = "expected.safetensors")
      : SafetensorsFixture(fixture_dir(fixture) + "/" + file) {}
};

using kiln_test::rel_error;

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
