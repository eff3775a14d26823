// A safetensors file a PyTorch reference script wrote for a test (the expected
// tensors of tests/models/make_fixtures.py, tests/nn/make_moe_fixture.py):
// F32 and I32 tensors by name, and the error measure the tests compare with.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "kiln/safetensors.h"

namespace kiln_test {

class SafetensorsFixture {
 public:
  explicit SafetensorsFixture(const std::string& path) : f_(path) {}
  bool has(const std::string& name) const { return f_.find(name) != nullptr; }
  std::vector<float> floats(const std::string& name) const { return values<float>(name); }
  std::vector<int32_t> ints(const std::string& name) const { return values<int32_t>(name); }
  std::vector<int64_t> dims(const std::string& name) const { return f_.find(name)->dims; }
  std::vector<std::string> names() const {
    std::vector<std::string> out;
    for (const kiln::TensorInfo& t : f_.tensors()) out.push_back(t.name);
    return out;
  }

 private:
  template <typename T>
  std::vector<T> values(const std::string& name) const {
    const std::vector<uint8_t> b = f_.read_bytes(name);
    std::vector<T> v(b.size() / sizeof(T));
    std::memcpy(v.data(), b.data(), v.size() * sizeof(T));
    return v;
  }
  kiln::SafetensorsFile f_;
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

}  // namespace kiln_test
