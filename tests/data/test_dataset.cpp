// Dataset: batches hold the right samples in order and after shuffling, shuffles
// are seeded permutations of shards, u8 data is scaled, sizes are checked.
#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <numeric>
#include <set>

#include "common/error_check.h"
#include "kiln/dataset.h"
#include "kiln/kiln.h"

using namespace kiln;

namespace {

// Sample i has data values i*numel + k (mod 256 for u8) and label i % classes.
Dataset numbered(int64_t n, int64_t shard = 1, DataType dt = DataType::f32) {
  Dataset ds(n, {2, 3}, dt, {}, DataType::i32, shard);
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t k = 0; k < 6; ++k) {
      const int64_t v = i * 6 + k;
      if (dt == DataType::f32) ds.data<float>()[size_t(v)] = float(v);
      else if (dt == DataType::i32) ds.data<int32_t>()[size_t(v)] = int32_t(v);
      else ds.data<uint8_t>()[size_t(v)] = uint8_t(v % 256);
    }
    ds.labels<int32_t>()[size_t(i)] = int32_t(i % 10);
  }
  return ds;
}

// Sample ids in a batch, read back from the data tensor (first element / 6).
std::vector<int64_t> ids_of(const Tensor& data) {
  std::vector<float> v = data.get<float>();
  std::vector<int64_t> ids;
  for (size_t r = 0; r < v.size() / 6; ++r) ids.push_back(int64_t(v[r * 6]) / 6);
  return ids;
}

struct Inputs {
  Context ctx;
  Tensor data, labels;
  CpuBackend cpu{1};
  std::unique_ptr<Buffer> buf;
  Inputs(int64_t batch, DType dt = f32, Shape data_shape = {}, Shape label_shape = {}) {
    data = ctx.input(dt, data_shape.ndim() ? data_shape : Shape{batch, 6}, "images");
    labels = ctx.input(i32, label_shape.ndim() ? label_shape : Shape{batch}, "targets");
    buf = allocate_tensors(ctx, cpu);
  }
};

}  // namespace

TEST(Dataset, BatchesHoldConsecutiveSamplesBeforeShuffling) {
  Dataset ds = numbered(12);
  Inputs in(4);
  EXPECT_EQ(ds.n_batches(4, ds.all()), 3);
  for (int64_t b = 0; b < 3; ++b) {
    ds.get_batch(in.data, in.labels, b);
    std::vector<int64_t> want{4 * b, 4 * b + 1, 4 * b + 2, 4 * b + 3};
    EXPECT_EQ(ids_of(in.data), want);
    std::vector<int32_t> labels = in.labels.get<int32_t>();
    for (int k = 0; k < 4; ++k) EXPECT_EQ(labels[size_t(k)], int32_t(want[size_t(k)] % 10));
  }
  // Every element of the sample, in order.
  ds.get_batch(in.data, in.labels, 1);
  std::vector<float> v = in.data.get<float>();
  for (size_t k = 0; k < v.size(); ++k) EXPECT_EQ(v[k], float(24 + k));
}

TEST(Dataset, ShuffleIsASeededPermutationOfShards) {
  Dataset ds = numbered(60, /*shard=*/5);
  Inputs in(10);
  auto epoch_order = [&] {
    std::vector<int64_t> order;
    for (int64_t b = 0; b < ds.n_batches(10, ds.all()); ++b) {
      ds.get_batch(in.data, in.labels, b);
      for (int64_t id : ids_of(in.data)) order.push_back(id);
    }
    return order;
  };
  ds.shuffle(42);
  std::vector<int64_t> first = epoch_order();
  // Every sample exactly once per epoch.
  std::vector<int64_t> sorted = first;
  std::sort(sorted.begin(), sorted.end());
  for (int64_t i = 0; i < 60; ++i) EXPECT_EQ(sorted[size_t(i)], i);
  // Shards stay whole: positions 5k..5k+4 hold one shard in order.
  for (size_t s = 0; s < 12; ++s) {
    EXPECT_EQ(first[s * 5] % 5, 0);
    for (size_t k = 1; k < 5; ++k) EXPECT_EQ(first[s * 5 + k], first[s * 5] + int64_t(k));
  }
  std::vector<int64_t> identity(60);
  std::iota(identity.begin(), identity.end(), 0);
  EXPECT_NE(first, identity);
  // Same seed from the same start => same order; another seed => another order.
  ds.reset_order();
  ds.shuffle(42);
  EXPECT_EQ(epoch_order(), first);
  ds.reset_order();
  ds.shuffle(43);
  EXPECT_NE(epoch_order(), first);
  // A shared engine gives a new permutation each epoch, reproducibly.
  std::mt19937_64 rng_a(7), rng_b(7);
  Dataset other = numbered(60, 5);
  ds.reset_order();
  for (int e = 0; e < 3; ++e) {
    ds.shuffle(rng_a, ds.all());
    other.shuffle(rng_b, other.all());
    for (int64_t p = 0; p < 60; ++p) EXPECT_EQ(ds.sample_at(p), other.sample_at(p));
  }
}

TEST(Dataset, ShufflingIsUnbiasedEnough) {
  // Over many seeds each of 4 shards lands at position 0 about a quarter of the time.
  Dataset ds = numbered(4);
  int counts[4] = {};
  for (uint64_t seed = 0; seed < 4000; ++seed) {
    ds.reset_order();
    ds.shuffle(seed);
    counts[ds.sample_at(0)]++;
  }
  for (int c : counts) EXPECT_NEAR(c, 1000, 150);
}

TEST(Dataset, SplitAndShufflingOnlyTheTrainingRange) {
  Dataset ds = numbered(100, /*shard=*/2);
  auto [train, val] = ds.split(0.05, /*multiple_of=*/10);
  EXPECT_EQ(train, (SampleRange{0, 90}));  // 95 rounded down to a multiple of 10
  EXPECT_EQ(val, (SampleRange{90, 100}));
  auto [t2, v2] = ds.split(0.25);
  EXPECT_EQ(t2.end, 74);  // 75 rounded down to the shard size 2
  EXPECT_EQ(v2.size(), 26);
  ds.shuffle(5, train);
  for (int64_t p = 90; p < 100; ++p) EXPECT_EQ(ds.sample_at(p), p);  // validation untouched
  std::set<int64_t> seen;
  for (int64_t p = 0; p < 90; ++p) seen.insert(ds.sample_at(p));
  EXPECT_EQ(seen.size(), 90u);
  EXPECT_EQ(*seen.rbegin(), 89);
  // Batches of the validation range come from its positions.
  Inputs in(5);
  ds.get_batch(in.data, in.labels, 1, val);
  EXPECT_EQ(ids_of(in.data), (std::vector<int64_t>{95, 96, 97, 98, 99}));
  EXPECT_EQ(ds.n_batches(5, val), 2);
  EXPECT_THROW(ds.get_batch(in.data, in.labels, 2, val), Error);
  EXPECT_THROW(ds.split(1.0), Error);
  EXPECT_THROW(ds.split(-0.1), Error);
  EXPECT_THROW(ds.split(0.995, 10), Error);                // nothing left to train on
  EXPECT_THROW(ds.shuffle(1, SampleRange{1, 10}), Error);  // not on shard boundaries
  EXPECT_THROW(ds.shuffle(1, SampleRange{0, 101}), Error);
}

TEST(Dataset, U8IsScaledToUnitRangeAndConvertedToEveryDtype) {
  Dataset ds(2, {3}, DataType::u8);
  std::vector<uint8_t> px{0, 128, 255, 51, 102, 204};
  std::copy(px.begin(), px.end(), ds.data<uint8_t>().begin());
  EXPECT_FLOAT_EQ(ds.data_scale(), 1.0f / 255.0f);
  Context ctx;
  Tensor f = ctx.input(f32, {2, 3});
  Tensor h = ctx.input(f16, {2, 3});
  Tensor bf = ctx.input(bf16, {2, 1, 3});  // any shape with the batch dim first
  Tensor ints = ctx.input(i32, {2, 3});
  CpuBackend cpu(1);
  auto buf = allocate_tensors(ctx, cpu);
  ds.get_batch(f, Tensor(), 0);
  std::vector<float> v = f.get<float>();
  for (size_t k = 0; k < 6; ++k) EXPECT_FLOAT_EQ(v[k], float(px[k]) / 255.0f);
  EXPECT_EQ(v[2], 1.0f);
  ds.get_batch(h, Tensor(), 0);
  std::vector<uint16_t> hv = h.get<uint16_t>();
  for (size_t k = 0; k < 6; ++k) EXPECT_NEAR(f16_to_f32(hv[k]), float(px[k]) / 255.0f, 1e-3);
  ds.get_batch(bf, Tensor(), 0);
  std::vector<uint16_t> bv = bf.get<uint16_t>();
  for (size_t k = 0; k < 6; ++k) EXPECT_NEAR(bf16_to_f32(bv[k]), float(px[k]) / 255.0f, 1e-2);
  ds.get_batch(ints, Tensor(), 0);  // integer targets take the raw values
  EXPECT_EQ(ints.get<int32_t>(), (std::vector<int32_t>{0, 128, 255, 51, 102, 204}));
  ds.set_data_scale(1.0f);
  ds.get_batch(f, Tensor(), 0);
  EXPECT_EQ(f.get<float>()[2], 255.0f);
}

TEST(Dataset, LabelsAsClassIdsOneHotOrFloatVectors) {
  Dataset ds = numbered(4);
  Context ctx;
  Tensor x = ctx.input(f32, {2, 2, 3});
  Tensor ids = ctx.input(i32, {2});
  Tensor hot = ctx.input(f32, {2, 10});
  Tensor narrow_hot = ctx.input(f32, {2, 3});
  CpuBackend cpu(1);
  auto buf = allocate_tensors(ctx, cpu);
  ds.get_batch(x, ids, 1);
  EXPECT_EQ(ids.get<int32_t>(), (std::vector<int32_t>{2, 3}));
  ds.get_batch(x, hot, 1);
  std::vector<float> h = hot.get<float>();
  for (int r = 0; r < 2; ++r)
    for (int c = 0; c < 10; ++c) EXPECT_EQ(h[size_t(r * 10 + c)], c == r + 2 ? 1.0f : 0.0f);
  std::string e =
      kiln_test::error_message([&] { ds.get_batch(x, narrow_hot, 1); });  // class 3 of 3
  EXPECT_NE(e.find("has class 3"), std::string::npos) << e;

  Dataset reg(3, {1}, DataType::f32, {2}, DataType::f32);
  for (int k = 0; k < 6; ++k) reg.labels<float>()[size_t(k)] = float(k) * 0.5f;
  Context c2;
  Tensor in = c2.input(f32, {3, 1});
  Tensor target = c2.input(f32, {3, 2});
  Tensor wrong = c2.input(i32, {3, 2});
  auto b2 = allocate_tensors(c2, cpu);
  reg.get_batch(in, target, 0);
  EXPECT_EQ(target.get<float>(), (std::vector<float>{0, 0.5f, 1, 1.5f, 2, 2.5f}));
  EXPECT_THROW(reg.get_batch(in, wrong, 0), Error);  // f32 labels cannot become i32
}

TEST(Dataset, SizeMismatchesAreClearErrors) {
  Dataset ds = numbered(8);
  Context ctx;
  Tensor bad_numel = ctx.input(f32, {4, 5}, "images");
  Tensor good = ctx.input(f32, {4, 6}, "images");
  Tensor bad_labels = ctx.input(i32, {3}, "targets");
  Tensor no_batch = ctx.input(f32, {}, "scalar");
  Tensor unallocated;
  CpuBackend cpu(1);
  auto buf = allocate_tensors(ctx, cpu);
  Tensor late = ctx.input(f32, {4, 6}, "late");  // no memory
  std::string e = kiln_test::error_message([&] { ds.get_batch(bad_numel, Tensor(), 0); });
  EXPECT_EQ(e, "[dataset] get_batch: data " + bad_numel.label() +
                   " [4, 5] holds 20 elements but a batch of 4 samples of [2, 3] has 24");
  e = kiln_test::error_message([&] { ds.get_batch(good, bad_labels, 0); });
  EXPECT_NE(e.find("labels " + bad_labels.label() + " [3] must have batch size 4"),
            std::string::npos)
      << e;
  e = kiln_test::error_message([&] { ds.get_batch(good, Tensor(), 2); });
  EXPECT_NE(e.find("batch 2 is outside [0, 2)"), std::string::npos) << e;
  EXPECT_THROW(ds.get_batch(no_batch, Tensor(), 0), Error);
  EXPECT_THROW(ds.get_batch(unallocated, Tensor(), 0), Error);
  e = kiln_test::error_message([&] { ds.get_batch(late, Tensor(), 0); });
  EXPECT_NE(e.find("no memory"), std::string::npos) << e;
  EXPECT_THROW(ds.data<uint8_t>(), Error);                                    // stored as f32
  EXPECT_THROW(ds.labels<float>(), Error);                                    // stored as i32
  EXPECT_THROW(Dataset(10, {3}, DataType::u8, {}, DataType::i32, 3), Error);  // 10 % 3
  EXPECT_THROW(Dataset(10, {0}, DataType::u8), Error);
  EXPECT_THROW(Dataset(-1, {3}, DataType::u8), Error);
  EXPECT_THROW(Dataset(int64_t(1) << 40, {int64_t(1) << 40}, DataType::f32), Error);
  Dataset unlabeled(4, {6}, DataType::f32, {0});
  EXPECT_FALSE(unlabeled.has_labels());
  Tensor labels4 = ctx.input(i32, {4});
  auto buf2 = allocate_tensors(ctx, cpu);
  EXPECT_THROW(unlabeled.get_batch(good, labels4, 0), Error);
  unlabeled.get_batch(good, Tensor(), 0);
}

TEST(Dataset, ErrorLeavesInputsUnchanged) {
  Dataset ds = numbered(4);
  Context ctx;
  Tensor x = ctx.input(f32, {2, 6});
  Tensor hot = ctx.input(f32, {2, 3});
  CpuBackend cpu(1);
  auto buf = allocate_tensors(ctx, cpu);
  x.set(std::vector<float>(12, -1.0f));
  EXPECT_THROW(ds.get_batch(x, hot, 1), Error);  // class 3 does not fit in 3 classes
  EXPECT_EQ(x.get<float>(), std::vector<float>(12, -1.0f));
}
