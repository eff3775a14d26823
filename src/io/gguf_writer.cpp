// GgufWriter: builds a GGUF v3 file and saves it atomically (temp file + rename).
#include <algorithm>
#include <cerrno>
#include <cstring>
#include <set>
#include <unordered_set>

#include "io/atomic_file.h"
#include "io/gguf_format.h"
#include "io/io_util.h"

namespace kiln {

namespace {

// Appends little-endian fields to a byte vector (the header and metadata are
// small; tensor data is streamed separately).
struct Out {
  std::vector<uint8_t> b;
  void bytes(const void* p, size_t n) {
    if (n == 0) return;
    const size_t old = b.size();
    b.resize(old + n);
    std::memcpy(b.data() + old, p, n);
  }
  void u32(uint32_t v) { bytes(&v, 4); }
  void u64(uint64_t v) { bytes(&v, 8); }
  void str(const std::string& s) {
    u64(s.size());
    bytes(s.data(), s.size());
  }
};

// A value's payload: everything after its type tag.
void write_payload(Out& out, const GgufValue& v) {
  if (!v.is_array()) {
    if (v.type() == GgufType::string) out.str(v.as_string());
    else out.bytes(v.raw().data(), v.raw().size());
    return;
  }
  out.u32(uint32_t(v.elem_type()));
  out.u64(v.size());
  if (v.elem_type() == GgufType::string) {
    for (const std::string& s : GgufValueAccess::strings(v)) out.str(s);
  } else if (v.elem_type() == GgufType::array) {
    for (const GgufValue& a : GgufValueAccess::arrays(v)) write_payload(out, a);
  } else {
    out.bytes(v.raw().data(), v.raw().size());
  }
}

int depth_of(const GgufValue& v) {
  if (!v.is_array() || v.elem_type() != GgufType::array) return v.is_array() ? 1 : 0;
  int d = 0;
  for (const GgufValue& a : GgufValueAccess::arrays(v)) d = std::max(d, depth_of(a));
  return d + 1;
}

}  // namespace

void GgufWriter::set(const std::string& key, GgufValue value) {
  if (key.empty()) fail("gguf", "metadata keys must not be empty");
  if (key.size() > gguf::kMaxKeyLength)
    fail("gguf", "metadata key of ", key.size(), " bytes is longer than ", gguf::kMaxKeyLength);
  if (key == gguf::kAlignmentKey) {
    if (value.type() != GgufType::u32 || !gguf::is_power_of_two(value.as_uint()) ||
        value.as_uint() > gguf::kMaxAlignment)
      fail("gguf", key, " must be a u32 power of 2 of at most ", gguf::kMaxAlignment,
           " (64 KiB), got ", gguf_type_name(value.type()), " ", value.str());
  }
  if (depth_of(value) > gguf::kMaxArrayDepth)
    fail("gguf", "metadata '", key, "' nests arrays more than ", gguf::kMaxArrayDepth, " deep");
  for (auto& kv : kv_) {
    if (kv.first == key) {
      kv.second = std::move(value);
      return;
    }
  }
  kv_.emplace_back(key, std::move(value));
}

void GgufWriter::set_alignment(uint32_t alignment) {
  set(gguf::kAlignmentKey, GgufValue(alignment));
}

uint32_t GgufWriter::alignment() const {
  for (const auto& kv : kv_)
    if (kv.first == gguf::kAlignmentKey) return uint32_t(kv.second.as_uint());
  return gguf::kDefaultAlignment;
}

namespace {
void check_tensor_name(const std::string& name, const std::unordered_set<std::string>& existing) {
  if (name.empty())
    fail("gguf", "a tensor needs a name to be saved (Tensor::set_name or the name argument)");
  if (name.size() > gguf::kMaxWriteNameLength)
    fail("gguf", "tensor name '", name, "' has ", name.size(), " bytes; GGUF allows at most ",
         gguf::kMaxWriteNameLength);
  if (existing.count(name)) fail("gguf", "tensor '", name, "' was added twice");
}
}  // namespace

void GgufWriter::add_tensor(Tensor t, const std::string& name) {
  if (!t.defined()) fail("gguf", "add_tensor: the tensor is undefined");
  std::string n = name.empty() ? t.name() : name;
  check_tensor_name(n, names_);
  names_.insert(n);
  tensors_.push_back(Entry{std::move(n), t.dtype(), t.shape(), t, {}});
}

void GgufWriter::add_tensor_data(const std::string& name, DType dtype, const Shape& shape,
                                 std::span<const uint8_t> bytes) {
  check_tensor_name(name, names_);
  const int64_t block = dtype_block_elems(dtype);
  if (is_quantized(dtype) && (shape.ndim() == 0 || shape[shape.ndim() - 1] % block != 0))
    fail("gguf", "tensor '", name, "' is ", dtype_name(dtype), " ", shape.str(),
         ": its innermost dim must be a multiple of the block size ", block);
  const uint64_t want = uint64_t(shape.numel()) / uint64_t(block) * dtype_size(dtype);
  if (bytes.size() != want)
    fail("gguf", "tensor '", name, "' is ", dtype_name(dtype), " ", shape.str(), " (", want,
         " bytes) but ", bytes.size(), " bytes were given");
  names_.insert(name);
  tensors_.push_back(Entry{name, dtype, shape, Tensor(), {bytes.begin(), bytes.end()}});
}

void GgufWriter::add_tensor_quantized(const std::string& name, uint32_t ggml_type,
                                      const Shape& shape, std::span<const uint8_t> blocks) {
  const QuantType* q = quant_type_of_gguf(ggml_type);
  if (!q)
    fail("gguf", "tensor '", name, "': ggml type ", ggml_type,
         " is not a block-quantized type kiln writes (", gguf::known_ggml_types(), ")");
  add_tensor_data(name, q->dtype, shape, blocks);
}

void GgufWriter::save(const std::string& path) const {
  // Everything that can be checked is checked before the temporary file exists.
  for (const Entry& e : tensors_) {
    if (e.tensor.defined() && !e.tensor.has_data())
      fail("gguf", path, ": tensor '", e.name, "' ", e.shape.str(),
           " has no data: allocate it (and set its values) before saving");
  }
  const uint64_t align = alignment();

  Out head;
  head.bytes(gguf::kMagic, 4);
  head.u32(gguf::kVersion);
  head.u64(tensors_.size());
  head.u64(kv_.size());
  for (const auto& [key, value] : kv_) {
    head.str(key);
    head.u32(uint32_t(value.type()));
    write_payload(head, value);
  }
  uint64_t offset = 0;
  for (const Entry& e : tensors_) {
    head.str(e.name);
    const int nd = e.shape.ndim();
    head.u32(uint32_t(nd == 0 ? 1 : nd));
    if (nd == 0) head.u64(1);  // a scalar is stored as [1]: ggml has no 0-dim tensors
    for (int d = nd - 1; d >= 0; --d) head.u64(uint64_t(e.shape[d]));  // innermost first
    head.u32(gguf::ggml_type_of(e.dtype));
    head.u64(offset);
    const uint64_t size =
        uint64_t(e.shape.numel()) / uint64_t(dtype_block_elems(e.dtype)) * dtype_size(e.dtype);
    offset = gguf::align_up(offset + size, align);
  }
  head.b.resize(gguf::align_up(head.b.size(), align), 0);

  io::AtomicFile out(path, "gguf");
  out.write(head.b.data(), head.b.size());
  for (const Entry& e : tensors_) {
    std::vector<uint8_t> from_tensor;
    if (e.tensor.defined()) from_tensor = io::tensor_bytes(e.tensor);
    const std::vector<uint8_t>& data = e.tensor.defined() ? from_tensor : e.bytes;
    out.write(data.data(), data.size());
    out.write_zeros(gguf::align_up(data.size(), align) - data.size());
  }
  out.commit();
}

}  // namespace kiln
