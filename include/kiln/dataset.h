// Dataset: n samples of data and labels held compactly on the host, shuffled in
// shards with a seed, copied batch by batch into graph inputs.
//
//   Dataset ds(60000, {28, 28}, DataType::u8, {}, DataType::i32, /*shard_size=*/10);
//   std::span<uint8_t> pixels = ds.data<uint8_t>();    // fill samples
//   std::span<int32_t> classes = ds.labels<int32_t>();
//   auto [train, val] = ds.split(0.05);                 // index ranges
//   ds.shuffle(seed, train);                            // once per epoch
//   for (int64_t b = 0; b < ds.n_batches(500, train); ++b)
//     ds.get_batch(images, targets, b, train);          // images f32 [500, 784]
//
// Storage types are separate from kiln's DType so data can stay small in memory
// (MNIST: u8, 47 MB instead of 188 MB as f32); conversion to the inputs' dtype
// happens per batch. u8 data becomes floats scaled by data_scale() (1/255 unless
// changed), so pixels land in [0, 1].
#pragma once
#include <cstdint>
#include <random>
#include <span>
#include <utility>
#include <vector>

#include "kiln/tensor.h"

namespace kiln {

enum class DataType : uint8_t { u8, i32, f32 };
size_t data_type_size(DataType t);
const char* data_type_name(DataType t);

// Positions [begin, end) in a dataset's current (shuffled) order.
struct SampleRange {
  int64_t begin = 0;
  int64_t end = 0;
  int64_t size() const { return end - begin; }
  // Full batches of `batch_size` in the range (a remainder is not used).
  int64_t n_batches(int64_t batch_size) const { return batch_size > 0 ? size() / batch_size : 0; }
  // Samples left over after the full batches (they form one partial batch).
  int64_t remainder(int64_t batch_size) const { return batch_size > 0 ? size() % batch_size : 0; }
  bool operator==(const SampleRange&) const = default;
};

class Dataset {
 public:
  // n_samples samples, each with sample_shape data elements and label_shape label
  // elements (a scalar {} for one class id; {0} for a dataset without labels).
  // n_samples must be a multiple of shard_size: shuffling moves whole shards.
  Dataset(int64_t n_samples, const Shape& sample_shape, DataType data_type,
          const Shape& label_shape = {}, DataType label_type = DataType::i32,
          int64_t shard_size = 1);

  int64_t size() const { return n_; }
  const Shape& sample_shape() const { return sample_shape_; }
  const Shape& label_shape() const { return label_shape_; }
  DataType data_type() const { return data_type_; }
  DataType label_type() const { return label_type_; }
  int64_t sample_numel() const { return sample_numel_; }
  int64_t label_numel() const { return label_numel_; }
  bool has_labels() const { return label_numel_ > 0; }
  int64_t shard_size() const { return shard_size_; }
  int64_t n_shards() const { return n_ / shard_size_; }

  // Storage in sample order (sample i at [i * numel, (i + 1) * numel)). T must be
  // the storage type: uint8_t for u8, int32_t for i32, float for f32.
  template <class T>
  std::span<T> data();
  template <class T>
  std::span<const T> data() const;
  template <class T>
  std::span<T> labels();
  template <class T>
  std::span<const T> labels() const;

  // Factor applied when data is converted to a floating-point tensor.
  float data_scale() const { return data_scale_; }
  void set_data_scale(float s) { data_scale_ = s; }

  // Order. Positions map to samples through a permutation of shards, the
  // identity until shuffled.
  SampleRange all() const { return {0, n_}; }
  int64_t sample_at(int64_t position) const;
  void reset_order();
  // Permutes the shards inside `range` (its ends must lie on shard boundaries);
  // positions outside it keep their samples. Same seed and order => same result
  // on every platform (only the engine's raw output is used, no std distribution).
  void shuffle(std::mt19937_64& rng, SampleRange range);
  void shuffle(uint64_t seed, SampleRange range);
  void shuffle(uint64_t seed) { shuffle(seed, all()); }

  // Splits the positions into a training range (first) and a validation range
  // (last) holding about val_fraction of the samples. The training range's size
  // is rounded down to a multiple of `multiple_of` (e.g. the logical batch size)
  // and of the shard size, so shuffling it never mixes in validation samples.
  std::pair<SampleRange, SampleRange> split(double val_fraction, int64_t multiple_of = 1) const;

  // Copies batch `batch_index` of `range` into graph inputs. The batch size is
  // data.size(0); data must hold batch * sample_numel elements (any shape with that
  // leading dim: [B, 784] and [B, 1, 28, 28] both take 28x28 samples) of dtype
  // f32/f16/bf16 (converted, u8 scaled) or i32 (from u8/i32 storage). labels may be
  // undefined (skipped); integer class labels also fill an f32 [B, C] tensor as
  // one-hot rows. batch_index may be n_batches() when the range has a remainder:
  // that partial batch fills the first remainder() rows and repeats its last
  // sample in the other rows (evaluation ignores them). Returns the number of
  // real samples in the batch (B, or the remainder for the partial one).
  int64_t n_batches(int64_t batch_size, SampleRange range) const;
  int64_t get_batch(Tensor data, Tensor labels, int64_t batch_index, SampleRange range) const;
  int64_t get_batch(Tensor data, Tensor labels, int64_t batch_index) const {
    return get_batch(data, labels, batch_index, all());
  }

 private:
  int64_t n_ = 0;
  Shape sample_shape_, label_shape_;
  DataType data_type_, label_type_;
  int64_t sample_numel_ = 0, label_numel_ = 0;
  int64_t shard_size_ = 1;
  float data_scale_ = 1.0f;
  std::vector<uint8_t> data_, labels_;
  std::vector<int64_t> shard_order_;
};

}  // namespace kiln
