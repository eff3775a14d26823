// GGUF files (ggml's model format, version 3): metadata key/values and named
// tensors. Used for model weights and training checkpoints.
//
//   GgufWriter w;
//   w.set("kiln.model", "fc");
//   w.set("kiln.step", int64_t(1200));
//   w.add_tensor(fc1_weight);           // by its name, data read at save()
//   w.save("model.gguf");               // atomic: temp file, fsync, rename
//
//   GgufFile f("model.gguf");           // parses and validates everything
//   int64_t step = f.get("kiln.step").as_int();
//   f.load(fc1_weight);                 // by name; dtype and shape are checked
//
// Shapes are kiln's (outermost first); GGUF stores dims innermost first and the
// conversion happens here. Tensor types: f32, f16, bf16, i32, and ggml's
// block-quantized types of kiln/quant_types.def (Q8_0, Q4_0, Q4_1, Q5_0, Q5_1,
// Q2_K .. Q6_K as kiln's q8_0, q4_0, ...: loaded and saved as they are;
// gguf_dequantize gives their f32 values).
// Every count, length and offset of a file is checked against its size before
// anything is allocated: a corrupt or truncated file throws
// kiln::Error("[gguf] <file>: ...").
#pragma once
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "kiln/tensor.h"

namespace kiln {

// GGUF metadata value types (the numbers are the file format's).
enum class GgufType : uint32_t {
  u8 = 0,
  i8 = 1,
  u16 = 2,
  i16 = 3,
  u32 = 4,
  i32 = 5,
  f32 = 6,
  boolean = 7,
  string = 8,
  array = 9,
  u64 = 10,
  i64 = 11,
  f64 = 12,
};
const char* gguf_type_name(GgufType t);

// One metadata value: a scalar, a string, or an array (of scalars, strings or
// arrays). Construct from the C++ type that names the GGUF type you want:
// GgufValue(int32_t(3)) is an i32, GgufValue(3.0f) an f32, GgufValue("x") a string,
// GgufValue(std::vector<int64_t>{...}) an array of i64.
class GgufValue {
 public:
  GgufValue() : GgufValue(uint8_t(0)) {}
  GgufValue(uint8_t v);
  GgufValue(int8_t v);
  GgufValue(uint16_t v);
  GgufValue(int16_t v);
  GgufValue(uint32_t v);
  GgufValue(int32_t v);
  GgufValue(uint64_t v);
  GgufValue(int64_t v);
  GgufValue(float v);
  GgufValue(double v);
  GgufValue(bool v);
  GgufValue(std::string v);
  GgufValue(const char* v) : GgufValue(std::string(v)) {}
  GgufValue(std::span<const uint8_t> v);
  GgufValue(std::span<const int8_t> v);
  GgufValue(std::span<const uint16_t> v);
  GgufValue(std::span<const int16_t> v);
  GgufValue(std::span<const uint32_t> v);
  GgufValue(std::span<const int32_t> v);
  GgufValue(std::span<const uint64_t> v);
  GgufValue(std::span<const int64_t> v);
  GgufValue(std::span<const float> v);
  GgufValue(std::span<const double> v);
  GgufValue(const std::vector<bool>& v);
  GgufValue(std::vector<std::string> v);
  template <class T>
  GgufValue(const std::vector<T>& v) : GgufValue(std::span<const T>(v)) {}
  // An array of arrays (GGUF allows nesting; every element must be an array).
  static GgufValue array_of(std::vector<GgufValue> arrays);

  GgufType type() const { return type_; }
  bool is_array() const { return type_ == GgufType::array; }
  GgufType elem_type() const { return elem_; }  // arrays: their elements' type
  size_t size() const;                          // array length; 1 for scalars
  bool operator==(const GgufValue& o) const;

  // Reads, converting where no information is lost; otherwise kiln::Error. A
  // value read from a file names the file and its key in that error:
  // "[gguf] model.gguf: metadata 'kiln.opt.step' is string, not an integer".
  int64_t as_int() const;    // any integer type or bool
  uint64_t as_uint() const;  // any integer type >= 0, or bool
  double as_float() const;   // f32, f64 or any integer type
  bool as_bool() const;
  const std::string& as_string() const;
  std::vector<int64_t> as_ints() const;   // arrays of integers
  std::vector<double> as_floats() const;  // arrays of numbers
  const std::vector<std::string>& as_strings() const;
  const std::vector<GgufValue>& as_arrays() const;
  std::string str() const;  // short human-readable form for messages and dumps

  // Raw little-endian element bytes of numeric/bool scalars and arrays.
  const std::vector<uint8_t>& raw() const { return raw_; }

 private:
  friend struct GgufValueAccess;
  std::string subject() const;  // what errors call this value
  std::string where_;           // "<file>: metadata '<key>'" for values read from a file
  GgufType type_ = GgufType::u8;
  GgufType elem_ = GgufType::u8;
  size_t count_ = 1;
  std::vector<uint8_t> raw_;          // numeric and bool payloads
  std::vector<std::string> strings_;  // string, or array of strings
  std::vector<GgufValue> arrays_;     // array of arrays
};

// Writes a GGUF v3 file. Tensors added as kiln Tensors are read (Tensor::get)
// when save() runs, so the file holds their values at that time.
class GgufWriter {
 public:
  // Sets (or replaces) a metadata key. "general.alignment" must be a u32 power of 2
  // of at most 65536 (the reader refuses larger ones).
  void set(const std::string& key, GgufValue value);
  void set_alignment(uint32_t alignment);  // default 32, at most 65536
  // A kiln tensor under `name` (default: the tensor's own name).
  void add_tensor(Tensor t, const std::string& name = {});
  // Raw data (contiguous, kiln shape order); copied.
  void add_tensor_data(const std::string& name, DType dtype, const Shape& shape,
                       std::span<const uint8_t> bytes);
  // Block-quantized data of ggml type `ggml_type` (a row of kiln/quant_types.def,
  // e.g. Q8_0 = 8, Q4_K = 12): whole blocks along the innermost dim of `shape`,
  // as ggml lays them out; copied. Same as add_tensor_data with that dtype.
  void add_tensor_quantized(const std::string& name, uint32_t ggml_type, const Shape& shape,
                            std::span<const uint8_t> blocks);
  size_t n_tensors() const { return tensors_.size(); }
  const std::vector<std::pair<std::string, GgufValue>>& metadata() const { return kv_; }

  // Writes `path` atomically: a temporary file next to it
  // (`path.tmp-<host>-<pid>-XXXXXX`) is written, flushed and fsync'ed, then
  // renamed over `path`. On any error the temporary file is removed, `path` is
  // untouched and kiln::Error is thrown. Temporary files that earlier saves of
  // `path` left when they were killed are removed first, when stale: their
  // process is gone (same host) or they are over 24 hours old.
  void save(const std::string& path) const;

 private:
  struct Entry {
    std::string name;
    DType dtype;
    Shape shape;
    Tensor tensor;               // when set, data comes from here at save()
    std::vector<uint8_t> bytes;  // otherwise from here
  };
  uint32_t alignment() const;
  std::vector<std::pair<std::string, GgufValue>> kv_;
  std::vector<Entry> tensors_;
  std::unordered_set<std::string> names_;  // of tensors_, for the duplicate check
};

// A tensor described in a GGUF file.
struct GgufTensorInfo {
  std::string name;
  DType dtype = DType::f32;  // q8_0, q4_k, ... for block-quantized data (loads into such tensors)
  uint32_t ggml_type = 0;    // the file's type number
  // ggml's name ("Q8_0", "Q4_K", ...) for block-quantized data (whole blocks
  // along the innermost dim; see gguf_dequantize); empty for f32, f16, bf16, i32.
  std::string quant;
  bool quantized() const { return !quant.empty(); }
  Shape shape;          // kiln order (outermost first)
  uint64_t offset = 0;  // absolute byte offset of the data in the file
  uint64_t nbytes = 0;
};

// The values of a tensor's data as stored (GgufFile::read_bytes) as f32: f32,
// f16, bf16, and the block-quantized types (dequantized as ggml does).
// kiln::Error when the byte count does not fit the tensor or the type is i32.
std::vector<float> gguf_dequantize(const GgufTensorInfo& t, std::span<const uint8_t> bytes);

// A parsed GGUF file. The constructor reads and validates the header, metadata and
// tensor descriptors (not the tensor data); the file stays open for load().
class GgufFile {
 public:
  explicit GgufFile(const std::string& path);
  ~GgufFile();
  GgufFile(GgufFile&&) noexcept;
  GgufFile& operator=(GgufFile&&) noexcept;
  GgufFile(const GgufFile&) = delete;
  GgufFile& operator=(const GgufFile&) = delete;

  const std::string& path() const { return path_; }
  uint32_t version() const { return version_; }
  uint32_t alignment() const { return alignment_; }
  uint64_t file_size() const { return file_size_; }
  uint64_t data_offset() const { return data_offset_; }  // start of the tensor data

  // Metadata in file order.
  const std::vector<std::pair<std::string, GgufValue>>& metadata() const { return kv_; }
  const GgufValue* find(std::string_view key) const;  // nullptr when absent
  const GgufValue& get(std::string_view key) const;   // kiln::Error when absent
  bool has(std::string_view key) const { return find(key) != nullptr; }

  const std::vector<GgufTensorInfo>& tensors() const { return tensors_; }
  const GgufTensorInfo* find_tensor(std::string_view name) const;
  const GgufTensorInfo& tensor_info(std::string_view name) const;  // kiln::Error when absent

  // The tensor's bytes as stored (contiguous, little-endian, kiln shape order).
  std::vector<uint8_t> read_bytes(std::string_view name) const;
  // Copies the named tensor into t (which must have memory). The dtype must match
  // and the shapes must be equal up to leading dims of size 1 ([1, 10] loads into
  // [10]: ggml drops them when it writes files).
  void load(Tensor t, std::string_view name) const;
  void load(Tensor t) const { load(t, t.name()); }
  // Throws the kiln::Error load(t, name) would throw before reading (no such
  // tensor, another dtype or shape, no memory) and reads nothing: check every
  // tensor first, then load, and a bad file changes nothing.
  void check_load(Tensor t, std::string_view name) const;

 private:
  void parse();
  void read_at(uint64_t offset, void* dst, size_t n) const;
  std::string path_;
  int fd_ = -1;
  uint64_t file_size_ = 0;
  uint32_t version_ = 0;
  uint32_t alignment_ = 32;
  uint64_t data_offset_ = 0;
  std::vector<std::pair<std::string, GgufValue>> kv_;
  std::vector<GgufTensorInfo> tensors_;
  // Lookups by name are hashed: reading every tensor of a file by name is
  // linear in the number of tensors, not quadratic.
  std::unordered_map<std::string, size_t> key_index_, tensor_index_;
};

}  // namespace kiln
