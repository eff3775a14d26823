// State dicts: named tensors in a model file, safetensors or GGUF, behind one
// format-neutral API (the format is picked by the file's extension).
//
//   std::vector<kiln::NamedTensor> sd = {{"fc1.weight", w1}, {"fc1.bias", b1}};
//   kiln::save_state_dict("model.safetensors", sd, {{"epoch", "3"}});  // atomic
//
//   auto f = kiln::open_state_dict("model.safetensors");  // parsed and validated
//   for (const kiln::TensorInfo& t : f->tensors()) ...      // names, dtypes, shapes
//   f->check("fc1.weight", w1);   // throws what read() would throw, reads nothing
//   f->read("fc1.weight", w1);    // dtype and shape must match; w1 needs memory
//
// To load all or nothing, check() every tensor first, then read() them: only an
// I/O error (the file truncated in place while reading) can stop the reads
// part way.
//
// Formats: `.safetensors` (kiln/safetensors.h: the Hugging Face format PyTorch,
// JAX and MLX exchange weights in) and `.gguf` (kiln/io.h: ggml's format). Any
// other extension is a kiln::Error naming the supported ones. Errors name the
// file and the tensor: "[safetensors] model.safetensors: tensor 'fc1.weight' is
// F32 [10, 784] in the file but target #0 'w1' is f32 [784, 10]".
//
// Metadata is a string -> string map. safetensors stores exactly that (its
// `__metadata__`); in GGUF each entry is a string value, and reading a GGUF file
// gives its string values as they are and other values in GgufValue::str() form.
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "kiln/tensor.h"

namespace kiln {

struct NamedTensor {
  std::string name;
  Tensor tensor;
};

// A tensor described in a model file.
struct TensorInfo {
  std::string name;
  DType dtype = DType::f32;   // kiln's dtype (meaningful when loadable())
  Shape shape;                // kiln's shape, outermost first (meaningful when loadable())
  std::string file_dtype;     // the dtype as the file names it: "F32", "F64", "bf16", ...
  std::vector<int64_t> dims;  // the file's shape, outermost first, any rank
  uint64_t nbytes = 0;        // bytes of data in the file
  std::string unsupported;  // why kiln cannot load it ("dtype F64 is not supported by kiln"); empty
                            // if it can
  bool loadable() const { return unsupported.empty(); }
};

// One open model file, parsed and validated when it is opened. The file stays
// open (reads use its descriptor: replacing the file meanwhile is harmless).
class StateDictReader {
 public:
  virtual ~StateDictReader() = default;
  virtual const std::string& path() const = 0;
  virtual const std::vector<TensorInfo>& tensors() const = 0;         // in file order
  virtual const TensorInfo* find(const std::string& name) const = 0;  // nullptr when absent
  virtual const std::map<std::string, std::string>& metadata() const = 0;
  // Throws the kiln::Error read(name, dst) would throw before reading anything:
  // no such tensor, a dtype kiln cannot load, another dtype or shape than dst's,
  // or dst without memory.
  virtual void check(const std::string& name, Tensor dst) const = 0;
  // Copies the tensor into dst (any layout, views included). Shapes must be
  // equal; GGUF files also accept leading dims of size 1 on either side ([1, 10]
  // into [10]), since ggml drops them and kiln stores a scalar as [1].
  virtual void read(const std::string& name, Tensor dst) const = 0;
  // The tensor's data as stored (little-endian, contiguous, outermost dim
  // first), for any dtype the format has, loadable or not.
  virtual std::vector<uint8_t> read_bytes(const std::string& name) const = 0;
};

// Opens `path` by its extension: ".safetensors" or ".gguf".
std::unique_ptr<StateDictReader> open_state_dict(const std::string& path);

// Writes `tensors` (each must have memory; names unique and non-empty) and
// `metadata` to `path` in the format of its extension, atomically (a temporary
// file, fsync, rename; see kiln/io.h). f32, f16, bf16 and i32 tensors.
void save_state_dict(const std::string& path, std::span<const NamedTensor> tensors,
                     const std::map<std::string, std::string>& metadata = {});

// Loads the named tensors from `path` (either format), all or nothing: every one
// is checked (present, dtype, shape, memory) before any is written. Tensors of
// the file that were not asked for are left alone; their names are returned.
std::vector<std::string> load_state_dict(const std::string& path,
                                         std::span<const NamedTensor> tensors);

}  // namespace kiln
