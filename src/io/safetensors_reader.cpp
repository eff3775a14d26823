// SafetensorsFile: parses and validates a safetensors file (kiln/safetensors.h).
//
// Order of the checks: the header length against the cap and the file size
// (before the header is allocated), the JSON (duplicate keys and nesting deeper
// than the format's are refused while parsing), each entry's fields, then the
// byte ranges of all tensors together. The JSON library is used only here: it
// is a build-time dependency of the io layer, not of kiln's headers.
#include <unistd.h>

#include <algorithm>
#include <limits>
#include <set>
#include <vector>

#include <nlohmann/json.hpp>

#include "io/io_util.h"
#include "io/safetensors_format.h"
#include "kiln/ext/tensor_node.h"
#include "kiln/safetensors.h"

namespace kiln {

namespace {

// A map-backed object: ordered_json looks up each key it inserts in a list,
// which made a header of 20k tensors quadratic to parse. The header's order of
// tensors is kept by the parser (Parser::order).
using Json = nlohmann::json;
namespace st = safetensors;

// The deepest the format nests: root { tensor { shape [ ] } }.
constexpr int kMaxDepth = 3;

struct Entry {
  TensorInfo info;
  uint64_t begin = 0, end = 0;
};

class Parser {
  // The events of the header's JSON: depth, duplicate keys, the root's keys.
  struct Scan : nlohmann::json_sax<Json> {
    explicit Scan(Parser& p) : p(p) {}
    Parser& p;
    std::vector<std::set<std::string>> open;  // keys seen in each open object
    int depth = 0;
    bool enter() {
      if (++depth > kMaxDepth)
        p.corrupt("the header nests deeper than the format (", kMaxDepth, " levels)");
      return true;
    }
    bool start_object(std::size_t) override {
      open.emplace_back();
      return enter();
    }
    bool end_object() override {
      open.pop_back();
      --depth;
      return true;
    }
    bool start_array(std::size_t) override { return enter(); }
    bool end_array() override {
      --depth;
      return true;
    }
    bool key(string_t& k) override {
      if (!open.back().insert(k).second)
        p.corrupt(depth == 1 ? "tensor '" : "key '", k, "' appears twice in the header");
      if (depth == 1) p.order_.push_back(k);
      return true;
    }
    bool null() override { return true; }
    bool boolean(bool) override { return true; }
    bool number_integer(number_integer_t) override { return true; }
    bool number_unsigned(number_unsigned_t) override { return true; }
    bool number_float(number_float_t, const string_t&) override { return true; }
    bool string(string_t&) override { return true; }
    bool binary(binary_t&) override { return true; }
    bool parse_error(std::size_t, const std::string&,
                     const nlohmann::detail::exception& e) override {
      p.corrupt("the header is not valid JSON: ", e.what());
    }
  };

 public:
  Parser(const std::string& path, uint64_t data_size) : path_(path), data_size_(data_size) {}

  template <class... Parts>
  [[noreturn]] void corrupt(const Parts&... parts) const {
    fail("safetensors", path_, ": ", parts...);
  }

  Json parse(const std::string& header) {
    // A first pass over the events refuses nesting deeper than the format and
    // duplicate keys (the JSON library would keep one of them silently) and
    // records the tensors' order; the second builds the object. (A parse
    // callback would do both in one pass, but the library then scans the whole
    // root after every entry: quadratic in the number of tensors.)
    Scan scan(*this);
    try {
      Json::sax_parse(header, &scan);
      return Json::parse(header);
    } catch (const Json::exception& e) {
      corrupt("the header is not valid JSON: ", e.what());
    }
  }

  // The root's keys (tensor names and __metadata__) in the header's order.
  const std::vector<std::string>& order() const { return order_; }

  uint64_t uint_field(const Json& v, const std::string& what) const {
    if (!v.is_number_unsigned()) corrupt(what, " must be a non-negative integer, got ", v.dump());
    return v.get<uint64_t>();
  }

  Entry tensor(const std::string& name, const Json& v) const {
    const std::string what = "tensor '" + name + "'";
    if (!v.is_object()) corrupt(what, " must be an object, got ", v.dump());
    for (const auto& [key, value] : v.items())
      if (key != "dtype" && key != "shape" && key != "data_offsets")
        corrupt(what, " has an unknown field '", key,
                "' (the format has dtype, shape, data_offsets)");
    for (const char* field : {"dtype", "shape", "data_offsets"})
      if (!v.contains(field)) corrupt(what, " has no ", field);

    Entry e;
    e.info.name = name;
    const Json& dt = v["dtype"];
    if (!dt.is_string()) corrupt(what, " has a dtype that is not a string: ", dt.dump());
    e.info.file_dtype = dt.get<std::string>();
    const st::DTypeInfo* dtype = st::find_dtype(e.info.file_dtype);
    if (!dtype) corrupt(what, " has an unknown dtype '", e.info.file_dtype, "'");

    const Json& shape = v["shape"];
    if (!shape.is_array()) corrupt(what, " has a shape that is not an array: ", shape.dump());
    // Every partial product of the dims (zeros skipped: a 0 must not hide an
    // overflow of the others) times the element's bits fits in int64.
    const uint64_t max = uint64_t(std::numeric_limits<int64_t>::max());
    uint64_t nonzero = 1, numel = 1, bits = 0;
    for (size_t d = 0; d < shape.size(); ++d) {
      const uint64_t n = uint_field(shape[d], what + " shape[" + std::to_string(d) + "]");
      numel *= n;  // cannot overflow once the non-zero product is checked
      e.info.dims.push_back(int64_t(n > max ? max : n));
      if (n == 0) continue;
      if (__builtin_mul_overflow(nonzero, n, &nonzero) ||
          __builtin_mul_overflow(nonzero, uint64_t(dtype->bits), &bits) || bits > max)
        corrupt(what, " has a shape too large: ", shape.dump(), " overflows 64 bits");
    }
    bits = numel * dtype->bits;
    if (bits % 8 != 0)
      corrupt(what, " is ", numel, " elements of ", dtype->name, " (", dtype->bits,
              " bits each), not a whole number of bytes");
    e.info.nbytes = bits / 8;

    const Json& offsets = v["data_offsets"];
    if (!offsets.is_array() || offsets.size() != 2)
      corrupt(what, " has data_offsets ", offsets.dump(), "; it must be [begin, end]");
    e.begin = uint_field(offsets[0], what + " data_offsets[0]");
    e.end = uint_field(offsets[1], what + " data_offsets[1]");
    if (e.end < e.begin)
      corrupt(what, " has data_offsets [", e.begin, ", ", e.end, "] that end before they begin");
    if (e.end > data_size_)
      corrupt(what, " has data_offsets [", e.begin, ", ", e.end,
              "] past the end of the data section (", data_size_, " bytes)");
    if (e.end - e.begin != e.info.nbytes)
      corrupt(what, " is ", dtype->name, " ", shape.dump(), " (", e.info.nbytes,
              " bytes) but data_offsets [", e.begin, ", ", e.end, "] hold ", e.end - e.begin,
              " bytes");

    if (!dtype->kiln) {
      e.info.unsupported = "dtype " + std::string(dtype->name) +
                           " is not supported by kiln (kiln tensors load F32, F16, BF16 and I32; "
                           "read_bytes() gives the raw data)";
    } else if (e.info.dims.size() > size_t(kMaxDims)) {
      e.info.unsupported = "it has " + std::to_string(e.info.dims.size()) +
                           " dims; kiln tensors have at most " + std::to_string(kMaxDims);
    } else {
      e.info.dtype = *dtype->kiln;
      for (int64_t d : e.info.dims) e.info.shape.push_back(d);
    }
    return e;
  }

  std::map<std::string, std::string> metadata(const Json& v) const {
    if (!v.is_object()) corrupt(st::kMetadataKey, " must be an object of strings, got ", v.dump());
    std::map<std::string, std::string> out;
    for (const auto& [key, value] : v.items()) {
      if (!value.is_string())
        corrupt(st::kMetadataKey, " '", key, "' must be a string, got ", value.dump());
      out.emplace(key, value.get<std::string>());
    }
    return out;
  }

  // The tensors' bytes lie back to back from offset 0 and fill the data section.
  void check_layout(const std::vector<Entry>& entries) const {
    std::vector<const Entry*> order;
    for (const Entry& e : entries) order.push_back(&e);
    std::sort(order.begin(), order.end(), [](const Entry* a, const Entry* b) {
      return a->begin != b->begin ? a->begin < b->begin : a->end < b->end;
    });
    uint64_t at = 0;
    const Entry* prev = nullptr;
    for (const Entry* e : order) {
      if (e->begin < at)
        corrupt("tensors '", prev->info.name, "' [", prev->begin, ", ", prev->end, ") and '",
                e->info.name, "' [", e->begin, ", ", e->end, ") overlap");
      if (e->begin > at)
        corrupt("the data section has a gap: bytes [", at, ", ", e->begin, ") before tensor '",
                e->info.name, "' belong to no tensor");
      at = e->end;
      prev = e;
    }
    if (at != data_size_)
      corrupt("the data section has ", data_size_, " bytes but the tensors cover only the first ",
              at, " (trailing bytes belong to no tensor)");
  }

 private:
  const std::string& path_;
  uint64_t data_size_;
  std::vector<std::string> order_;
};

}  // namespace

SafetensorsFile::SafetensorsFile(const std::string& path) : path_(path) {
  uint64_t file_size = 0;
  fd_ = io::open_for_reading(path, "safetensors", &file_size);
  try {
    auto corrupt = [&](const auto&... parts) { fail("safetensors", path_, ": ", parts...); };
    if (file_size < 8)
      corrupt("not a safetensors file: ", file_size,
              " bytes, fewer than the 8 of the header length");
    uint8_t len_bytes[8];
    if (!io::pread_all(fd_, len_bytes, 8, 0)) corrupt("cannot read the header length");
    header_size_ = 0;
    for (int i = 7; i >= 0; --i) header_size_ = header_size_ << 8 | len_bytes[i];  // little-endian
    if (header_size_ > kSafetensorsMaxHeader)
      corrupt("header length ", header_size_, " is over kiln's limit of ", kSafetensorsMaxHeader,
              " bytes");
    if (header_size_ > file_size - 8)
      corrupt("truncated: the header length is ", header_size_, " but only ", file_size - 8,
              " bytes follow it");
    if (header_size_ < 2)
      corrupt("the header (", header_size_, " bytes) is too short for a JSON object");
    std::string header(header_size_, '\0');
    if (!io::pread_all(fd_, header.data(), header.size(), 8)) corrupt("cannot read the header");
    if (header[0] != '{') corrupt("the header does not start with '{' (not a safetensors file?)");

    Parser p(path_, file_size - 8 - header_size_);
    const Json root = p.parse(header);
    if (!root.is_object()) corrupt("the header is not a JSON object");
    std::vector<Entry> entries;
    entries.reserve(root.size());
    for (const std::string& key : p.order()) {
      const Json& value = root.at(key);
      if (key == safetensors::kMetadataKey) metadata_ = p.metadata(value);
      else entries.push_back(p.tensor(key, value));
    }
    p.check_layout(entries);
    tensors_.reserve(entries.size());
    for (Entry& e : entries) {
      index_.emplace(e.info.name, tensors_.size());
      begin_.push_back(e.begin);
      tensors_.push_back(std::move(e.info));
    }
  } catch (...) {
    ::close(fd_);
    throw;
  }
}

SafetensorsFile::~SafetensorsFile() { ::close(fd_); }

const TensorInfo* SafetensorsFile::find(const std::string& name) const {
  auto it = index_.find(name);
  return it == index_.end() ? nullptr : &tensors_[it->second];
}

const TensorInfo& SafetensorsFile::info(const std::string& name) const {
  if (const TensorInfo* t = find(name)) return *t;
  fail("safetensors", path_, ": no tensor named '", name, "' (the file has ", tensors_.size(),
       " tensors)");
}

std::pair<uint64_t, uint64_t> SafetensorsFile::data_offsets(const std::string& name) const {
  const TensorInfo& t = info(name);
  const uint64_t begin = begin_[size_t(&t - tensors_.data())];
  return {begin, begin + t.nbytes};
}

std::vector<uint8_t> SafetensorsFile::read_bytes(const std::string& name) const {
  const TensorInfo& t = info(name);
  const uint64_t at = data_offset() + data_offsets(name).first;
  std::vector<uint8_t> out(t.nbytes);
  if (!io::pread_all(fd_, out.data(), out.size(), at))
    fail("safetensors", path_, ": cannot read the ", t.nbytes, " bytes of tensor '", name,
         "' at offset ", at, " (did the file change while reading?)");
  return out;
}

namespace {
std::string describe_file(const TensorInfo& t) {
  std::string s = t.file_dtype + " [";
  for (size_t i = 0; i < t.dims.size(); ++i) s += (i ? ", " : "") + std::to_string(t.dims[i]);
  return s + "]";
}
}  // namespace

void SafetensorsFile::check(const std::string& name, Tensor dst) const {
  if (!dst.defined())
    fail("safetensors", path_, ": tensor '", name, "': the target tensor is undefined");
  const TensorInfo& t = info(name);
  if (!t.loadable())
    fail("safetensors", path_, ": cannot load tensor '", name, "': ", t.unsupported);
  const std::string target = "target " + dst.label();
  if (t.dtype != dst.dtype() || t.shape != dst.shape())
    fail("safetensors", path_, ": tensor '", name, "' is ", describe_file(t), " in the file but ",
         target, " is ", dtype_name(dst.dtype()), " ", dst.shape().str());
  if (!dst.has_data())
    fail("safetensors", path_, ": cannot load tensor '", name, "': ", target,
         " has no memory yet (allocate it first)");
}

void SafetensorsFile::read(const std::string& name, Tensor dst) const {
  check(name, dst);
  if (void* p = io::host_data(dst)) {  // host memory: no staging copy
    const TensorInfo& t = info(name);
    const uint64_t at = data_offset() + data_offsets(name).first;
    if (!io::pread_all(fd_, p, t.nbytes, at))
      fail("safetensors", path_, ": cannot read the ", t.nbytes, " bytes of tensor '", name,
           "' at offset ", at, " (did the file change while reading?)");
    return;
  }
  io::set_tensor_bytes(dst, read_bytes(name));
}

}  // namespace kiln
