// Module::save / load: a model's params as one file, by name. The file access
// is the three functions below (GGUF through kiln/io.h today); everything else
// (which names, the checks, no partial loads) is the module's.
#include <algorithm>
#include <unordered_map>
#include <unordered_set>

#include "kiln/alloc.h"
#include "kiln/io.h"
#include "kiln/nn.h"

namespace kiln::nn {

namespace {

struct FileTensor {
  std::string name;
  DType dtype;
  Shape shape;
};

bool is_gguf(const std::string& path) {
  return path.size() >= 5 && path.compare(path.size() - 5, 5, ".gguf") == 0;
}

void check_format(const std::string& what, const std::string& path) {
  if (!is_gguf(path)) fail("nn", what, " ", path, ": unknown model file extension (use .gguf)");
}

}  // namespace

void Module::save(const std::string& path) const {
  check_format("save", path);
  GgufWriter w;
  for (auto& [name, t] : state_dict()) {
    if (!t.has_data())
      fail("nn", "save ", path, ": param '", name, "' has no memory (allocate the model first)");
    w.add_tensor(t, name);
  }
  w.save(path);
}

Module::LoadResult Module::load(const std::string& path, bool strict) {
  check_format("load", path);
  const auto params = state_dict();
  for (auto& [name, t] : params)
    if (!t.has_data())
      fail("nn", "load ", path, ": param '", name, "' has no memory: call allocate(backend) first");
  GgufFile file(path);  // validates the whole header before anything is read
  std::vector<FileTensor> in_file;
  for (const GgufTensorInfo& i : file.tensors()) in_file.push_back({i.name, i.dtype, i.shape});

  // 1. Check every name, shape and dtype.
  std::unordered_map<std::string, const FileTensor*> by_name;
  for (const FileTensor& f : in_file) by_name.emplace(f.name, &f);
  LoadResult res;
  std::vector<std::pair<std::string, Tensor>> todo;
  for (auto& [name, t] : params) {
    auto it = by_name.find(name);
    if (it == by_name.end()) {
      if (strict)
        fail("nn", "load ", path, ": the file has no '", name, "' ", t.shape().str(),
             " (strict load; strict=false loads the rest)");
      res.missing.push_back(name);
      continue;
    }
    const FileTensor& f = *it->second;
    if (!(f.shape == t.shape()))
      fail("nn", "load ", path, ": '", name, "' is ", f.shape.str(), " in the file but ",
           t.shape().str(), " in the model");
    if (f.dtype != t.dtype())
      fail("nn", "load ", path, ": '", name, "' is ", dtype_name(f.dtype), " in the file but ",
           dtype_name(t.dtype()), " in the model");
    todo.emplace_back(name, t);
  }
  std::unordered_set<std::string> in_model;
  for (auto& [name, t] : params) in_model.insert(name);
  for (const FileTensor& f : in_file)
    if (!in_model.count(f.name)) {
      if (strict)
        fail("nn", "load ", path, ": unexpected '", f.name, "' ", f.shape.str(),
             " in the file (strict load; strict=false ignores it)");
      res.unexpected.push_back(f.name);
    }

  // 2. Read everything into host staging tensors, so a failure while reading
  // (a file cut short since it was opened) leaves the params untouched.
  Context staging;
  std::vector<Tensor> tmp;
  for (auto& [name, t] : todo) tmp.push_back(staging.tensor(t.dtype(), t.shape(), name));
  BufferType& host = host_buffer_type();
  TensorAllocator measure(host);
  for (const Tensor& t : tmp) measure.alloc(t.node());
  std::unique_ptr<Buffer> buf = host.alloc(std::max(measure.high_water(), host.alignment()));
  TensorAllocator place(*buf);
  for (const Tensor& t : tmp) place.place(t.node());
  for (size_t i = 0; i < todo.size(); ++i) file.load(tmp[i], todo[i].first);

  // 3. Copy into the params.
  for (size_t i = 0; i < todo.size(); ++i) copy_tensor(tmp[i].node(), todo[i].second.node());
  return res;
}

}  // namespace kiln::nn
