// Dataset: compact host storage, shard shuffling, splits and batch copies.
#include "kiln/dataset.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>
#include <type_traits>

#include "kiln/error.h"
#include "kiln/ext/tensor_node.h"
#include "opt/uniform_below.h"

namespace kiln {

size_t data_type_size(DataType t) {
  switch (t) {
    case DataType::u8: return 1;
    case DataType::i32: return 4;
    case DataType::f32: return 4;
  }
  return 0;
}

const char* data_type_name(DataType t) {
  switch (t) {
    case DataType::u8: return "u8";
    case DataType::i32: return "i32";
    case DataType::f32: return "f32";
  }
  return "?";
}

namespace {

template <class T>
constexpr DataType data_type_of() {
  if constexpr (std::is_same_v<T, uint8_t>) return DataType::u8;
  else if constexpr (std::is_same_v<T, int32_t>) return DataType::i32;
  else if constexpr (std::is_same_v<T, float>) return DataType::f32;
  else static_assert(sizeof(T) == 0, "Dataset storage is uint8_t, int32_t or float");
}

// n * numel * size bytes, with overflow checks (a user error, not an invariant).
size_t storage_bytes(int64_t n, int64_t numel, DataType t, const char* what) {
  int64_t elems = 0;
  if (__builtin_mul_overflow(n, numel, &elems) ||
      elems > std::numeric_limits<int64_t>::max() / int64_t(data_type_size(t)))
    fail("dataset", n, " samples of ", numel, " ", what, " elements are too many");
  return size_t(elems) * data_type_size(t);
}

}  // namespace

Dataset::Dataset(int64_t n_samples, const Shape& sample_shape, DataType data_type,
                 const Shape& label_shape, DataType label_type, int64_t shard_size)
    : n_(n_samples),
      sample_shape_(sample_shape),
      label_shape_(label_shape),
      data_type_(data_type),
      label_type_(label_type),
      sample_numel_(sample_shape.numel()),
      label_numel_(label_shape.numel()),
      shard_size_(shard_size) {
  if (n_samples < 0) fail("dataset", "the number of samples must be >= 0, got ", n_samples);
  if (sample_numel_ <= 0)
    fail("dataset", "a sample needs at least one element, sample shape is ", sample_shape.str());
  if (shard_size < 1) fail("dataset", "shard_size must be >= 1, got ", shard_size);
  if (n_samples % shard_size != 0)
    fail("dataset", n_samples, " samples are not a multiple of shard_size ", shard_size,
         " (shuffling moves whole shards)");
  data_.resize(storage_bytes(n_samples, sample_numel_, data_type, "data"));
  labels_.resize(storage_bytes(n_samples, label_numel_, label_type, "label"));
  data_scale_ = data_type == DataType::u8 ? 1.0f / 255.0f : 1.0f;
  reset_order();
}

template <class T>
std::span<T> Dataset::data() {
  if (data_type_of<T>() != data_type_)
    fail("dataset", "data is stored as ", data_type_name(data_type_), ", not ",
         data_type_name(data_type_of<T>()));
  return {reinterpret_cast<T*>(data_.data()), data_.size() / sizeof(T)};
}

template <class T>
std::span<const T> Dataset::data() const {
  return const_cast<Dataset*>(this)->data<T>();
}

template <class T>
std::span<T> Dataset::labels() {
  if (data_type_of<T>() != label_type_)
    fail("dataset", "labels are stored as ", data_type_name(label_type_), ", not ",
         data_type_name(data_type_of<T>()));
  return {reinterpret_cast<T*>(labels_.data()), labels_.size() / sizeof(T)};
}

template <class T>
std::span<const T> Dataset::labels() const {
  return const_cast<Dataset*>(this)->labels<T>();
}

#define KILN_DATASET_STORAGE(T)                         \
  template std::span<T> Dataset::data<T>();             \
  template std::span<const T> Dataset::data<T>() const; \
  template std::span<T> Dataset::labels<T>();           \
  template std::span<const T> Dataset::labels<T>() const;
KILN_DATASET_STORAGE(uint8_t)
KILN_DATASET_STORAGE(int32_t)
KILN_DATASET_STORAGE(float)
#undef KILN_DATASET_STORAGE

int64_t Dataset::sample_at(int64_t position) const {
  if (position < 0 || position >= n_)
    fail("dataset", "position ", position, " is outside [0, ", n_, ")");
  return shard_order_[size_t(position / shard_size_)] * shard_size_ + position % shard_size_;
}

void Dataset::reset_order() {
  shard_order_.resize(size_t(n_shards()));
  std::iota(shard_order_.begin(), shard_order_.end(), int64_t(0));
}

void Dataset::shuffle(std::mt19937_64& rng, SampleRange range) {
  if (range.begin < 0 || range.end > n_ || range.begin > range.end)
    fail("dataset", "shuffle range [", range.begin, ", ", range.end, ") is not inside [0, ", n_,
         ")");
  if (range.begin % shard_size_ != 0 || range.end % shard_size_ != 0)
    fail("dataset", "shuffle range [", range.begin, ", ", range.end,
         ") must start and end on shard boundaries (shard_size ", shard_size_, ")");
  int64_t* first = shard_order_.data() + range.begin / shard_size_;
  const int64_t count = range.size() / shard_size_;
  for (int64_t i = count - 1; i > 0; --i) {  // Fisher-Yates
    int64_t j = int64_t(detail::uniform_below(rng, uint64_t(i) + 1));
    std::swap(first[i], first[j]);
  }
}

void Dataset::shuffle(uint64_t seed, SampleRange range) {
  std::mt19937_64 rng(seed);
  shuffle(rng, range);
}

std::pair<SampleRange, SampleRange> Dataset::split(double val_fraction, int64_t multiple_of) const {
  if (!(val_fraction >= 0.0 && val_fraction < 1.0))
    fail("dataset", "split: the validation fraction must be in [0, 1), got ", val_fraction);
  if (multiple_of < 1) fail("dataset", "split: multiple_of must be >= 1, got ", multiple_of);
  const int64_t step = std::lcm(multiple_of, shard_size_);
  int64_t n_train = int64_t(std::floor((1.0 - val_fraction) * double(n_) + 1e-9));
  n_train = std::min(n_train, n_) / step * step;
  if (n_train == 0 && n_ > 0)
    fail("dataset", "split(", val_fraction, ") of ", n_, " samples in multiples of ", step,
         " leaves no training samples");
  return {SampleRange{0, n_train}, SampleRange{n_train, n_}};
}

int64_t Dataset::n_batches(int64_t batch_size, SampleRange range) const {
  if (batch_size < 1) fail("dataset", "batch size must be >= 1, got ", batch_size);
  return range.n_batches(batch_size);
}

namespace {

// Storage element i as double (exact for u8/i32/f32) and as int (integers only).
double value_at(const uint8_t* base, DataType t, int64_t i) {
  switch (t) {
    case DataType::u8: return base[i];
    case DataType::i32: {
      int32_t v;
      std::memcpy(&v, base + 4 * i, 4);
      return v;
    }
    case DataType::f32: {
      float v;
      std::memcpy(&v, base + 4 * i, 4);
      return v;
    }
  }
  return 0;
}

// Gathers `count` elements per sample for the samples in `rows` and converts them
// to the tensor's dtype (scale applies to float targets only).
struct Gather {
  const uint8_t* storage;
  DataType type;
  int64_t numel;  // elements per sample
  const std::vector<int64_t>& rows;
  float scale;

  template <class V, class F>
  std::vector<V> convert(F&& f) const {
    std::vector<V> out(size_t(rows.size() * numel));
    V* o = out.data();
    const size_t esize = data_type_size(type);
    for (int64_t r : rows) {
      const uint8_t* s = storage + size_t(r * numel) * esize;
      if (type == DataType::u8) {
        for (int64_t k = 0; k < numel; ++k) *o++ = f(float(s[k]));
      } else if (type == DataType::f32) {
        const float* sf = reinterpret_cast<const float*>(s);
        for (int64_t k = 0; k < numel; ++k) *o++ = f(sf[k]);
      } else {
        const int32_t* si = reinterpret_cast<const int32_t*>(s);
        for (int64_t k = 0; k < numel; ++k) *o++ = f(float(si[k]));
      }
    }
    return out;
  }

  void into(Tensor t, const char* what) const {
    const float sc = scale;
    switch (t.dtype()) {
      case DType::f32: t.set<float>(convert<float>([sc](float v) { return v * sc; })); break;
      case DType::f16:
        t.set<uint16_t>(convert<uint16_t>([sc](float v) { return f32_to_f16(v * sc); }));
        break;
      case DType::bf16:
        t.set<uint16_t>(convert<uint16_t>([sc](float v) { return f32_to_bf16(v * sc); }));
        break;
      case DType::i32: {
        if (type == DataType::f32)
          fail("dataset", what, " are stored as f32 and cannot fill the i32 tensor ", t.label(),
               " ", t.shape().str());
        std::vector<int32_t> out(size_t(rows.size() * numel));
        size_t o = 0;
        for (int64_t r : rows)
          for (int64_t k = 0; k < numel; ++k)
            out[o++] = int32_t(value_at(storage, type, r * numel + k));
        t.set<int32_t>(out);
        break;
      }
      default:  // quantized
        fail("dataset", what, " cannot fill the quantized tensor ", t.label(), " ",
             t.shape().str());
    }
  }
};

std::string label_of(const Tensor& t, const char* role) {
  return std::string(role) + " " + t.label() + " " + t.shape().str();
}

}  // namespace

int64_t Dataset::get_batch(Tensor data, Tensor labels, int64_t batch_index,
                           SampleRange range) const {
  if (!data.defined()) fail("dataset", "get_batch: the data tensor is undefined");
  if (range.begin < 0 || range.end > n_ || range.begin > range.end)
    fail("dataset", "get_batch: range [", range.begin, ", ", range.end, ") is not inside [0, ", n_,
         ")");
  if (data.ndim() < 1) fail("dataset", "get_batch: ", label_of(data, "data"), " has no batch dim");
  const int64_t batch = data.size(0);
  if (batch < 1) fail("dataset", "get_batch: ", label_of(data, "data"), " has an empty batch dim");
  if (data.numel() != batch * sample_numel_)
    fail("dataset", "get_batch: ", label_of(data, "data"), " holds ", data.numel(),
         " elements but a batch of ", batch, " samples of ", sample_shape_.str(), " has ",
         batch * sample_numel_);
  const int64_t nb = range.n_batches(batch) + (range.remainder(batch) > 0 ? 1 : 0);
  if (batch_index < 0 || batch_index >= nb)
    fail("dataset", "get_batch: batch ", batch_index, " is outside [0, ", nb, "): the range has ",
         range.size(), " samples, batches of ", batch);
  const int64_t real = std::min(batch, range.size() - batch_index * batch);

  std::vector<int64_t> rows(static_cast<size_t>(batch));
  for (int64_t i = 0; i < batch; ++i)
    rows[size_t(i)] = sample_at(range.begin + batch_index * batch + std::min(i, real - 1));

  // Check the labels before writing anything, so an error leaves both tensors as they were.
  bool one_hot = false;
  if (labels.defined()) {
    if (!has_labels())
      fail("dataset", "get_batch: the dataset has no labels but a labels tensor was given");
    if (labels.ndim() < 1 || labels.size(0) != batch)
      fail("dataset", "get_batch: ", label_of(labels, "labels"), " must have batch size ", batch,
           " as its first dim (like ", label_of(data, "data"), ")");
    const bool int_storage = label_type_ != DataType::f32;
    one_hot = int_storage && label_numel_ == 1 && is_floating(labels.dtype()) &&
              labels.ndim() == 2 && labels.size(1) > 1;
    if (!one_hot && labels.numel() != batch * label_numel_)
      fail("dataset", "get_batch: ", label_of(labels, "labels"), " holds ", labels.numel(),
           " elements but a batch of ", batch, " labels of ", label_shape_.str(), " has ",
           batch * label_numel_);
  }

  if (!data.has_data())
    fail("dataset", "get_batch: ", label_of(data, "data"), " has no memory yet");
  if (labels.defined() && !labels.has_data())
    fail("dataset", "get_batch: ", label_of(labels, "labels"), " has no memory yet");
  std::vector<float> hot;
  if (one_hot) {
    const int64_t classes = labels.size(1);
    hot.assign(size_t(batch * classes), 0.0f);
    for (int64_t i = 0; i < batch; ++i) {
      const double c = value_at(labels_.data(), label_type_, rows[size_t(i)]);
      if (c < 0 || c >= double(classes))
        fail("dataset", "get_batch: sample ", rows[size_t(i)], " has class ", c, " but ",
             label_of(labels, "labels"), " has ", classes, " classes");
      hot[size_t(i * classes + int64_t(c))] = 1.0f;
    }
  }

  Gather{data_.data(), data_type_, sample_numel_, rows, data_scale_}.into(data, "data");
  if (!labels.defined()) return real;
  if (!one_hot) {
    Gather{labels_.data(), label_type_, label_numel_, rows, 1.0f}.into(labels, "labels");
    return real;
  }
  if (labels.dtype() == DType::f32) {
    labels.set<float>(hot);
  } else {
    std::vector<uint16_t> h(hot.size());
    for (size_t k = 0; k < hot.size(); ++k)
      h[k] = labels.dtype() == DType::f16 ? f32_to_f16(hot[k]) : f32_to_bf16(hot[k]);
    labels.set<uint16_t>(h);
  }
  return real;
}

}  // namespace kiln
