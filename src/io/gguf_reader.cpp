// GgufFile: parses and validates a GGUF file; loads tensors into kiln tensors.
//
// Every count, length, dim and offset read from the file is checked against the
// bytes that are left before anything is allocated for it, so a corrupt or
// truncated file ends in kiln::Error, never in a crash or a huge allocation.
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <limits>

#include "io/gguf_format.h"
#include "io/io_util.h"

namespace kiln {

namespace {

using io::pread_all;

// Sequential, bounds-checked, buffered reads of the header region.
class Cursor {
 public:
  Cursor(int fd, uint64_t size, const std::string& path) : fd_(fd), size_(size), path_(path) {}
  uint64_t pos() const { return pos_; }
  uint64_t remaining() const { return size_ - pos_; }

  template <class... Parts>
  [[noreturn]] void corrupt(const Parts&... parts) const {
    fail("gguf", path_, ": ", parts...);
  }

  void read(void* dst, uint64_t n, const std::string& what) {
    if (n > remaining())
      corrupt("truncated: ", what, " needs ", n, " bytes at offset ", pos_, " but the file has ",
              size_, " bytes");
    auto* out = static_cast<uint8_t*>(dst);
    while (n > 0) {
      if (buf_pos_ == buf_len_) fill();
      uint64_t take = std::min<uint64_t>(n, buf_len_ - buf_pos_);
      std::memcpy(out, buf_ + buf_pos_, take);
      out += take;
      buf_pos_ += take;
      pos_ += take;
      n -= take;
    }
  }
  uint32_t u32(const std::string& what) {
    uint32_t v;
    read(&v, 4, what);
    return v;
  }
  uint64_t u64(const std::string& what) {
    uint64_t v;
    read(&v, 8, what);
    return v;
  }
  std::string str(const std::string& what, uint64_t max_len) {
    uint64_t len = u64(what + " length");
    if (len > max_len) corrupt(what, " has length ", len, " (at most ", max_len, " allowed)");
    if (len > remaining())
      corrupt("truncated: ", what, " has length ", len, " but only ", remaining(),
              " bytes are left at offset ", pos_);
    std::string s(len, '\0');
    read(s.data(), len, what);
    return s;
  }

 private:
  void fill() {
    size_t want = size_t(std::min<uint64_t>(sizeof(buf_), remaining()));
    if (!pread_all(fd_, buf_, want, pos_))
      corrupt("read error at offset ", pos_, " (did the file change while reading?)");
    buf_pos_ = 0;
    buf_len_ = want;
  }
  int fd_;
  uint64_t size_;
  const std::string& path_;
  uint64_t pos_ = 0;
  uint8_t buf_[1 << 16];
  size_t buf_pos_ = 0, buf_len_ = 0;
};

GgufType read_type(Cursor& c, const std::string& what) {
  uint32_t t = c.u32(what + " type");
  if (!gguf::valid_type(t)) c.corrupt(what, " has an unknown value type ", t);
  return GgufType(t);
}

void check_bools(Cursor& c, const std::vector<uint8_t>& raw, const std::string& what) {
  for (uint8_t b : raw)
    if (b > 1) c.corrupt(what, " is a bool with byte value ", int(b), " (must be 0 or 1)");
}

GgufValue read_array(Cursor& c, const std::string& what, int depth);

GgufValue read_value(Cursor& c, GgufType t, const std::string& what, int depth) {
  if (t == GgufType::array) return read_array(c, what, depth + 1);
  if (t == GgufType::string) return GgufValue(c.str(what, std::numeric_limits<uint64_t>::max()));
  std::vector<uint8_t> raw(gguf::fixed_size(t));
  c.read(raw.data(), raw.size(), what);
  if (t == GgufType::boolean) check_bools(c, raw, what);
  return GgufValueAccess::make(t, t, 1, std::move(raw), {}, {});
}

GgufValue read_array(Cursor& c, const std::string& what, int depth) {
  if (depth > gguf::kMaxArrayDepth)
    c.corrupt(what, " nests arrays more than ", gguf::kMaxArrayDepth, " deep");
  GgufType elem = read_type(c, what + " element");
  uint64_t n = c.u64(what + " array length");
  if (n > c.remaining() / gguf::min_size(elem))
    c.corrupt(what, " is an array of ", n, " ", gguf_type_name(elem), " but only ", c.remaining(),
              " bytes are left at offset ", c.pos());
  std::vector<uint8_t> raw;
  std::vector<std::string> strings;
  std::vector<GgufValue> arrays;
  if (elem == GgufType::string) {
    strings.reserve(n);
    for (uint64_t i = 0; i < n; ++i)
      strings.push_back(c.str(what + "[" + std::to_string(i) + "]", c.remaining()));
  } else if (elem == GgufType::array) {
    arrays.reserve(n);
    for (uint64_t i = 0; i < n; ++i)
      arrays.push_back(read_array(c, what + "[" + std::to_string(i) + "]", depth + 1));
  } else {
    raw.resize(n * gguf::fixed_size(elem));
    c.read(raw.data(), raw.size(), what);
    if (elem == GgufType::boolean) check_bools(c, raw, what);
  }
  return GgufValueAccess::make(GgufType::array, elem, n, std::move(raw), std::move(strings),
                               std::move(arrays));
}

std::string describe(const GgufTensorInfo& t) {
  return "'" + t.name + "' (" + dtype_name(t.dtype) + " " + t.shape.str() + ")";
}

}  // namespace

GgufFile::GgufFile(const std::string& path) : path_(path) {
  fd_ = io::open_for_reading(path, "gguf", &file_size_);
  try {
    parse();
  } catch (...) {
    ::close(fd_);
    fd_ = -1;
    throw;
  }
}

GgufFile::~GgufFile() {
  if (fd_ >= 0) ::close(fd_);
}

GgufFile::GgufFile(GgufFile&& o) noexcept { *this = std::move(o); }

GgufFile& GgufFile::operator=(GgufFile&& o) noexcept {
  if (this != &o) {
    if (fd_ >= 0) ::close(fd_);
    path_ = std::move(o.path_);
    fd_ = std::exchange(o.fd_, -1);
    file_size_ = o.file_size_;
    version_ = o.version_;
    alignment_ = o.alignment_;
    data_offset_ = o.data_offset_;
    kv_ = std::move(o.kv_);
    tensors_ = std::move(o.tensors_);
    key_index_ = std::move(o.key_index_);
    tensor_index_ = std::move(o.tensor_index_);
  }
  return *this;
}

void GgufFile::parse() {
  Cursor c(fd_, file_size_, path_);
  if (file_size_ < 4) c.corrupt("not a GGUF file (only ", file_size_, " bytes)");
  char magic[4];
  c.read(magic, 4, "magic");
  if (std::memcmp(magic, gguf::kMagic, 4) != 0) c.corrupt("not a GGUF file (wrong magic)");
  version_ = c.u32("version");
  // Version 2 has the same layout as 3 (3 only added big-endian files).
  if (version_ != 2 && version_ != 3)
    c.corrupt("unsupported GGUF version ", version_, " (kiln reads versions 2 and 3)");
  const uint64_t n_tensors = c.u64("tensor count");
  const uint64_t n_kv = c.u64("metadata count");
  // Smallest entries: a key-value is a key length + type + 1 byte; a tensor info
  // is a name length + n_dims + type + offset.
  if (n_kv > c.remaining() / 13)
    c.corrupt("metadata count ", n_kv, " cannot fit in the ", c.remaining(), " bytes left");
  if (n_tensors > c.remaining() / 24)
    c.corrupt("tensor count ", n_tensors, " cannot fit in the ", c.remaining(), " bytes left");

  kv_.reserve(n_kv);
  key_index_.reserve(n_kv);
  for (uint64_t i = 0; i < n_kv; ++i) {
    const std::string what = "metadata key " + std::to_string(i);
    std::string key = c.str(what, gguf::kMaxKeyLength);
    const std::string vwhat = "metadata '" + key + "'";
    GgufType t = read_type(c, vwhat);
    GgufValue v = read_value(c, t, vwhat, 0);
    if (!key_index_.emplace(key, kv_.size()).second)
      c.corrupt("metadata key '", key, "' appears twice");
    GgufValueAccess::set_where(v, path_ + ": " + vwhat);
    kv_.emplace_back(std::move(key), std::move(v));
  }

  alignment_ = gguf::kDefaultAlignment;
  if (const GgufValue* a = find(gguf::kAlignmentKey)) {
    if (a->type() != GgufType::u32 || !gguf::is_power_of_two(a->as_uint()) ||
        a->as_uint() > gguf::kMaxAlignment)
      c.corrupt(gguf::kAlignmentKey, " must be a u32 power of 2 of at most ", gguf::kMaxAlignment,
                " (64 KiB), got ", gguf_type_name(a->type()), " ", a->str());
    alignment_ = uint32_t(a->as_uint());
  }

  tensors_.reserve(n_tensors);
  tensor_index_.reserve(n_tensors);
  for (uint64_t i = 0; i < n_tensors; ++i) {
    GgufTensorInfo t;
    t.name = c.str("tensor " + std::to_string(i) + " name", gguf::kMaxNameLength);
    const std::string what = "tensor '" + t.name + "'";
    if (!tensor_index_.emplace(t.name, tensors_.size()).second) c.corrupt(what, " appears twice");
    const uint32_t nd = c.u32(what + " n_dims");
    if (nd > uint32_t(kMaxDims)) c.corrupt(what, " has ", nd, " dims (at most ", kMaxDims, ")");
    uint64_t dims[kMaxDims] = {};
    for (uint32_t d = 0; d < nd; ++d) dims[d] = c.u64(what + " dims");
    t.ggml_type = c.u32(what + " type");
    const std::optional<DType> dt = gguf::dtype_of_ggml(t.ggml_type);
    if (!dt)
      c.corrupt(what, " has ggml type ", t.ggml_type, ", which kiln does not read (",
                gguf::known_ggml_types(), ")");
    t.dtype = *dt;
    const bool blocks = is_quantized(t.dtype);
    const uint64_t block_elems = uint64_t(dtype_block_elems(t.dtype));
    if (blocks) {
      t.quant = quant_type(t.dtype).gguf_name;
      if (nd == 0 || dims[0] % block_elems != 0)
        c.corrupt(what, " is ", t.quant, " but its innermost dim (", nd ? dims[0] : uint64_t(0),
                  ") is not a multiple of the block size ", block_elems);
    }
    // Bytes per element for the overflow checks; quantized data takes fewer.
    const uint64_t esize = blocks ? 2 : uint64_t(dtype_size(t.dtype));
    t.offset = c.u64(what + " offset");
    // Sizes: every partial product of the dims, in any order, and its size in
    // bytes must fit in int64 (Shape::numel and byte strides multiply them). A
    // zero dim makes the element count 0 but must not hide an overflow of the
    // others ([0, 2^40, 2^40]), so the product skips zeros.
    uint64_t nonzero = 1, numel = 1;
    const uint64_t max = uint64_t(std::numeric_limits<int64_t>::max());
    for (uint32_t d = 0; d < nd; ++d) {
      numel *= dims[d];  // cannot overflow when the product of the non-zero dims does not
      if (dims[d] == 0) continue;
      if (__builtin_mul_overflow(nonzero, dims[d], &nonzero) ||
          __builtin_mul_overflow(nonzero, esize, &t.nbytes) || t.nbytes > max)
        c.corrupt(what, " has dims too large: their product overflows 64 bits (dim ", d, " is ",
                  dims[d], ")");
    }
    t.nbytes = blocks ? numel / block_elems * dtype_size(t.dtype) : numel * esize;
    if (t.nbytes > file_size_)
      c.corrupt(what, " has ", numel, " elements, more than the file (", file_size_,
                " bytes) can hold");
    for (int d = int(nd) - 1; d >= 0; --d) t.shape.push_back(int64_t(dims[d]));  // outermost first
    tensors_.push_back(std::move(t));
  }

  data_offset_ = gguf::align_up(c.pos(), alignment_);
  std::vector<const GgufTensorInfo*> by_offset;
  for (GgufTensorInfo& t : tensors_) {
    if (t.offset % alignment_ != 0)
      c.corrupt("tensor ", describe(t), " has offset ", t.offset,
                ", not a multiple of the alignment ", alignment_);
    const uint64_t avail = file_size_ > data_offset_ ? file_size_ - data_offset_ : 0;
    if (t.offset > avail || t.nbytes > avail - t.offset)
      c.corrupt("truncated: tensor ", describe(t), " needs bytes [", data_offset_ + t.offset, ", ",
                data_offset_ + t.offset + t.nbytes, ") but the file has ", file_size_, " bytes");
    t.offset += data_offset_;
    by_offset.push_back(&t);
  }
  std::sort(by_offset.begin(), by_offset.end(),
            [](const GgufTensorInfo* a, const GgufTensorInfo* b) { return a->offset < b->offset; });
  for (size_t i = 1; i < by_offset.size(); ++i) {
    const GgufTensorInfo& a = *by_offset[i - 1];
    const GgufTensorInfo& b = *by_offset[i];
    if (a.offset + a.nbytes > b.offset)
      c.corrupt("tensors ", describe(a), " and ", describe(b), " overlap");
  }
}

const GgufValue* GgufFile::find(std::string_view key) const {
  auto it = key_index_.find(std::string(key));
  return it == key_index_.end() ? nullptr : &kv_[it->second].second;
}

const GgufValue& GgufFile::get(std::string_view key) const {
  if (const GgufValue* v = find(key)) return *v;
  fail("gguf", path_, ": no metadata key '", key, "'");
}

const GgufTensorInfo* GgufFile::find_tensor(std::string_view name) const {
  auto it = tensor_index_.find(std::string(name));
  return it == tensor_index_.end() ? nullptr : &tensors_[it->second];
}

const GgufTensorInfo& GgufFile::tensor_info(std::string_view name) const {
  if (const GgufTensorInfo* t = find_tensor(name)) return *t;
  fail("gguf", path_, ": no tensor named '", name, "' (the file has ", tensors_.size(),
       " tensors)");
}

void GgufFile::read_at(uint64_t offset, void* dst, size_t n) const {
  if (!pread_all(fd_, dst, n, offset))
    fail("gguf", path_, ": cannot read ", n, " bytes at offset ", offset,
         " (did the file change while reading?)");
}

std::vector<uint8_t> GgufFile::read_bytes(std::string_view name) const {
  const GgufTensorInfo& t = tensor_info(name);
  std::vector<uint8_t> out(t.nbytes);
  read_at(t.offset, out.data(), out.size());
  return out;
}

namespace {
// Shapes equal after dropping leading dims of size 1.
bool same_shape(const Shape& a, const Shape& b) {
  auto strip = [](const Shape& s) {
    int i = 0;
    while (i < s.ndim() && s[i] == 1) ++i;
    return i;
  };
  int ia = strip(a), ib = strip(b);
  if (a.ndim() - ia != b.ndim() - ib) return false;
  for (; ia < a.ndim(); ++ia, ++ib)
    if (a[ia] != b[ib]) return false;
  return true;
}

}  // namespace

void GgufFile::check_load(Tensor t, std::string_view name) const {
  if (!t.defined()) fail("gguf", path_, ": load of '", name, "' into an undefined tensor");
  const GgufTensorInfo& info = tensor_info(name);
  const std::string target = "target " + t.label();
  if (info.quantized() && t.dtype() != info.dtype)
    fail("gguf", path_, ": tensor '", info.name, "' is ", info.quant, " ", info.shape.str(),
         " (block-quantized) but ", target, " is ", dtype_name(t.dtype()), ": load it into a ",
         dtype_name(info.dtype), " tensor, or read it with read_bytes() and ", "gguf_dequantize()");
  if (info.dtype != t.dtype() || !same_shape(info.shape, t.shape()))
    fail("gguf", path_, ": tensor '", info.name, "' is ", dtype_name(info.dtype), " ",
         info.shape.str(), " in the file but ", target, " is ", dtype_name(t.dtype()), " ",
         t.shape().str());
  if (!t.has_data())
    fail("gguf", path_, ": cannot load '", info.name, "': ", target,
         " has no memory yet (allocate it first)");
}

void GgufFile::load(Tensor t, std::string_view name) const {
  check_load(t, name);
  if (void* p = io::host_data(t)) {  // host memory: no staging copy
    const GgufTensorInfo& info = tensor_info(name);
    read_at(info.offset, p, info.nbytes);
    return;
  }
  io::set_tensor_bytes(t, read_bytes(name));
}

}  // namespace kiln
