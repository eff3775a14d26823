// Module::save / load: a model's params as one model file, by name, through
// the format-neutral kiln/state_dict.h (safetensors or GGUF by extension).
// Which names, strictness and the no-partial-load guarantee are the module's.
#include <algorithm>
#include <unordered_set>

#include "kiln/ext/alloc.h"
#include "kiln/nn.h"
#include "kiln/state_dict.h"

namespace kiln::nn {

namespace {

// Host tensors shaped like `like`, in one buffer that `staging` does not own
// (the returned buffer must outlive the tensors' use).
std::unique_ptr<Buffer> host_copies_of(const std::vector<NamedTensor>& like, Context& staging,
                                       std::vector<Tensor>& out) {
  for (const NamedTensor& t : like)
    out.push_back(staging.tensor(t.tensor.dtype(), t.tensor.shape(), t.name));
  BufferType& host = host_buffer_type();
  TensorAllocator measure(host);
  for (const Tensor& t : out) measure.alloc(t.node());
  std::unique_ptr<Buffer> buf = host.alloc(std::max(measure.high_water(), host.alignment()));
  TensorAllocator place(*buf);
  for (const Tensor& t : out) place.place(t.node());
  return buf;
}

// "[2, 2]": the file's shape, for tensors kiln cannot load too (any rank).
std::string file_shape(const TensorInfo& t) {
  std::string s = "[";
  for (size_t i = 0; i < t.dims.size(); ++i) s += (i ? ", " : "") + std::to_string(t.dims[i]);
  return s + "]";
}

}  // namespace

void Module::save(const std::string& path) const {
  std::vector<NamedTensor> tensors;
  for (auto& [name, t] : state_dict()) {
    if (!t.has_data())
      fail("nn", "save ", path, ": param '", name, "' has no memory (allocate the model first)");
    tensors.push_back({name, t});
  }
  save_state_dict(path, tensors);
}

Module::LoadResult Module::load(const std::string& path, bool strict) {
  const auto params = state_dict();
  for (auto& [name, t] : params)
    if (!t.has_data())
      fail("nn", "load ", path, ": param '", name, "' has no memory: call allocate(backend) first");
  // Opening parses and validates the whole header (offsets, sizes, names)
  // before anything is read.
  const std::unique_ptr<StateDictReader> file = open_state_dict(path);

  // 1. Check every name, dtype and shape; the reader's check() throws what
  // its read() would, naming the file, the tensor and both shapes.
  LoadResult res;
  std::vector<NamedTensor> todo;
  for (auto& [name, t] : params) {
    if (!file->find(name)) {
      if (strict)
        fail("nn", "load ", path, ": the file has no '", name, "' ", t.shape().str(),
             " (strict load; strict=false loads the rest)");
      res.missing.push_back(name);
      continue;
    }
    file->check(name, t);
    todo.push_back({name, t});
  }
  std::unordered_set<std::string> in_model;
  for (auto& [name, t] : params) in_model.insert(name);
  for (const TensorInfo& f : file->tensors())
    if (!in_model.count(f.name)) {
      if (strict)
        fail("nn", "load ", path, ": unexpected '", f.name, "' ", file_shape(f),
             " in the file (strict load; strict=false ignores it)");
      res.unexpected.push_back(f.name);
    }

  // 2. Read everything into host staging tensors, so a failure while reading
  // (a file cut short since it was opened) leaves the params untouched.
  Context staging;
  std::vector<Tensor> tmp;
  const std::unique_ptr<Buffer> buf = host_copies_of(todo, staging, tmp);
  for (size_t i = 0; i < todo.size(); ++i) file->read(todo[i].name, tmp[i]);

  // 3. Copy into the params.
  for (size_t i = 0; i < todo.size(); ++i) copy_tensor(tmp[i].node(), todo[i].tensor.node());
  return res;
}

}  // namespace kiln::nn
