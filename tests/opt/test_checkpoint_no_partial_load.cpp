// Loading a checkpoint is all or nothing: a file whose tensor
// has the right element count but another shape ([16, 3] saved as [3, 16], a
// bias [16] saved as [2, 8]), another dtype, or is missing, is refused before
// any byte is written. Params, optimizer state and counters stay byte for byte
// as they were. Before the fix the loader compared element counts only and
// wrote the params that came before the bad tensor.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <functional>

#include "opt_test_util.h"

namespace kiln::test {
namespace {

namespace fs = std::filesystem;

std::vector<uint8_t> bytes_of(Tensor t) {
  const std::vector<float> v = t.get<float>();
  std::vector<uint8_t> out(v.size() * sizeof(float));
  if (!v.empty()) std::memcpy(out.data(), v.data(), out.size());
  return out;
}

// Everything a load may change: each param and its optimizer state, and the counters.
struct Snapshot {
  std::vector<std::vector<uint8_t>> tensors;
  int64_t step = 0, epoch = 0;
  bool operator==(const Snapshot&) const = default;
};

Snapshot snapshot(const OptContext& opt, const Mlp& mlp) {
  Snapshot s;
  for (const Tensor& p : mlp.params()) {
    s.tensors.push_back(bytes_of(p));
    const OptimizerState st = opt.state(p);
    s.tensors.push_back(bytes_of(st.m));
    s.tensors.push_back(bytes_of(st.v));
  }
  s.step = opt.step();
  s.epoch = opt.epoch();
  return s;
}

// A copy of the checkpoint at `from` with one tensor changed by `edit` (which
// may change its dtype and shape, or drop it by returning false).
using Edit = std::function<bool(const std::string& name, DType& dtype, Shape& shape)>;
void rewrite(const std::string& from, const std::string& to, const Edit& edit) {
  GgufFile f(from);
  GgufWriter w;
  for (const auto& [key, value] : f.metadata()) w.set(key, value);
  for (const GgufTensorInfo& t : f.tensors()) {
    DType dtype = t.dtype;
    Shape shape = t.shape;
    if (!edit(t.name, dtype, shape)) continue;
    w.add_tensor_data(t.name, dtype, shape, f.read_bytes(t.name));
  }
  w.save(to);
}

TEST(CheckpointLoad, MismatchedFileChangesNothing) {
  const fs::path dir =
      fs::temp_directory_path() / ("kiln_opt_noload_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  const std::string good = (dir / "good.gguf").string(), bad = (dir / "bad.gguf").string();

  Dataset data = make_blobs(120, 1);
  Mlp mlp(30);  // w1 [2, 16], b1 [16], w2 [16, 3], b2 [3]
  OptConfig cfg = mlp.config(60);
  cfg.optimizer = OptimizerType::adamw;
  OptContext opt(cfg);
  mlp.init(1);
  FitOptions o;
  o.epochs = 1;
  o.progress = false;
  o.val_split = 0;
  fit(opt, data, o);
  opt.save(good);
  o.epochs = 2;       // fit resumes at the context's epoch: one more epoch
  fit(opt, data, o);  // now the context differs from the file in every tensor
  const Snapshot before = snapshot(opt, mlp);
  ASSERT_NE(before.step, GgufFile(good).get("kiln.opt.step").as_int());

  struct Case {
    const char* what;
    std::string tensor;  // the error must name it
    Edit edit;
  };
  const std::vector<Case> cases = {
      {"param transposed, same element count", "w2",
       [](const std::string& n, DType&, Shape& s) {
         if (n == "w2") s = Shape{3, 16};
         return true;
       }},
      {"bias [16] saved as [2, 8]", "b1",
       [](const std::string& n, DType&, Shape& s) {
         if (n == "b1") s = Shape{2, 8};
         return true;
       }},
      {"optimizer state of the last param reshaped", "b2.opt.v",
       [](const std::string& n, DType&, Shape& s) {
         if (n == "b2.opt.v") s = Shape{3, 1};
         return true;
       }},
      {"optimizer state with another dtype", "w2.opt.m",
       [](const std::string& n, DType& d, Shape&) {
         if (n == "w2.opt.m") d = i32;
         return true;
       }},
      {"optimizer state missing", "b2.opt.m",
       [](const std::string& n, DType&, Shape&) { return n != "b2.opt.m"; }},
  };
  for (const Case& c : cases) {
    rewrite(good, bad, c.edit);
    try {
      opt.load(bad);
      ADD_FAILURE() << c.what << ": no error";
    } catch (const Error& e) {
      const std::string msg = e.what();
      EXPECT_NE(msg.find("'" + c.tensor + "'"), std::string::npos) << c.what << ": " << msg;
      EXPECT_NE(msg.find(bad), std::string::npos) << c.what << ": " << msg;
    }
    EXPECT_TRUE(snapshot(opt, mlp) == before) << c.what << ": the failed load changed the context";
  }
  // The unmodified file still loads, and does change the context.
  opt.load(good);
  EXPECT_FALSE(snapshot(opt, mlp) == before);
  fs::remove_all(dir);
}

}  // namespace
}  // namespace kiln::test
