// Host round trips of one training step, counted by a fake device backend
// (issue 44's target: at most one per step, the loss read for logging). The
// fake runs the CPU's kernels on host memory but says its buffers are not the
// host's, so everything that would cross the bus on a GPU goes through its
// Buffer's set / get / memset, which it counts, as it counts compute calls (on
// CUDA each is a separate launch sequence, with a synchronisation between the
// two graphs of a step). Needs no device.
//
//   HostSyncs.KilnGptTrainingStep   kiln-gpt's model at the GPU recipe's depth
//        (6 layers: 76 params, 19 dropout layers), AdamW with two weight-decay
//        groups and clipping: today's counts per step, per-param against
//        multi-tensor steps (docs/cuda.md, "Host round trips")
#include <gtest/gtest.h>

#include <iostream>
#include <memory>
#include <vector>

#include "gpt_model.h"  // examples/gpt
#include "kiln/kiln.h"

namespace kiln::test {
namespace {

struct SyncCounts {
  int64_t sets = 0, gets = 0, memsets = 0, computes = 0;
};

class CountingBuffer final : public Buffer {
 public:
  CountingBuffer(BufferType& type, std::unique_ptr<Buffer> inner, SyncCounts& c)
      : type_(type), inner_(std::move(inner)), c_(c) {}
  BufferType& type() const override { return type_; }
  void* base() override { return inner_->base(); }
  size_t size() const override { return inner_->size(); }
  void set(TensorNode* t, const void* src, size_t offset, size_t n) override {
    ++c_.sets;
    inner_->set(t, src, offset, n);
  }
  void get(const TensorNode* t, void* dst, size_t offset, size_t n) const override {
    ++c_.gets;
    inner_->get(t, dst, offset, n);
  }
  void memset(TensorNode* t, uint8_t value, size_t offset, size_t n) override {
    ++c_.memsets;
    inner_->memset(t, value, offset, n);
  }
  void clear(uint8_t value) override { inner_->clear(value); }  // allocation time only

 private:
  BufferType& type_;
  std::unique_ptr<Buffer> inner_;
  SyncCounts& c_;
};

class CountingBufferType final : public BufferType {
 public:
  explicit CountingBufferType(SyncCounts& c) : c_(c) {}
  const char* name() const override { return "counting"; }
  size_t alignment() const override { return host_buffer_type().alignment(); }
  bool is_host() const override { return false; }  // a device's, as far as callers know
  std::unique_ptr<Buffer> alloc(size_t size) override {
    return std::make_unique<CountingBuffer>(*this, host_buffer_type().alloc(size), c_);
  }

 private:
  SyncCounts& c_;
};

class CountingBackend final : public Backend {
 public:
  SyncCounts counts;
  const char* name() const override { return "counting"; }
  BufferType& buffer_type() override { return type_; }
  bool supports_op(const TensorNode* n) const override { return cpu_.supports_op(n); }
  using Backend::compute;
  void compute(std::span<TensorNode* const> nodes) override {
    ++counts.computes;
    cpu_.compute(nodes);
  }

 private:
  CpuBackend cpu_{1};
  CountingBufferType type_{counts};
};

// One training step's counts after two warm-up steps (the batch upload, two
// sets the caller makes, left out).
SyncCounts step_counts(bool multi, size_t* n_params, size_t* n_seeds) {
  Context ctx;
  gpt::GptConfig c;
  c.n_layer = 6;  // the GPU recipe's depth (76 params), small widths
  c.n_head = 2;
  c.n_embd = 32;
  c.block = 16;
  c.vocab = 48;
  c.dropout = 0.2f;
  gpt::Gpt model(ctx, c);
  CountingBackend fake;
  model.allocate(fake);
  model.init_gpt(1);
  const int64_t B = 2;
  Tensor idx = ctx.input(i32, {B, c.block}, "idx"), targets = ctx.input(i32, {B, c.block}, "t");
  OptConfig oc = next_token_opt_config(model, idx, model(idx), targets, 0.1f);
  oc.clip_grad_norm = 1.0f;
  oc.backends = {&fake};
  oc.multi_tensor = multi;
  oc.passes = GraphPasses{};  // a device backend's program (no CPU-only rewrites)
  OptContext opt(oc);
  *n_params = opt.params().size();
  *n_seeds = model.dropout_seeds().size();
  std::vector<int32_t> ids(static_cast<size_t>(B * c.block));
  SyncCounts got;
  for (int step = 0; step < 3; ++step) {
    for (size_t i = 0; i < ids.size(); ++i) ids[i] = int32_t((i * 7 + size_t(step)) % 48);
    idx.set(ids);
    targets.set(ids);
    fake.counts = {};
    opt.train_batch();
    got = fake.counts;
  }
  return got;
}

TEST(HostSyncs, KilnGptTrainingStep) {
  size_t params = 0, seeds = 0;
  const SyncCounts per = step_counts(false, &params, &seeds);
  const SyncCounts multi = step_counts(true, &params, &seeds);
  std::cout << "host round trips per training step (" << params << " params, " << seeds
            << " dropout seeds, 2 groups, clipping):\n"
            << "  per-param:    " << per.sets << " uploads, " << per.gets << " reads, "
            << per.memsets << " fills, " << per.computes << " compute calls\n"
            << "  multi-tensor: " << multi.sets << " uploads, " << multi.gets << " reads, "
            << multi.memsets << " fills, " << multi.computes << " compute calls\n";
  ASSERT_EQ(params, 76u);
  ASSERT_EQ(seeds, 19u);
  // Today: one upload per dropout seed and one per hp tensor (one per group,
  // multi-tensor: one for all), the loss read, one fill per gradient (multi:
  // one), and two compute calls (forward + backward, then the optimizer).
  EXPECT_EQ(per.sets, int64_t(seeds) + 2);
  EXPECT_EQ(multi.sets, int64_t(seeds) + 1);
  EXPECT_EQ(per.gets, 1);
  EXPECT_EQ(multi.gets, 1);
  EXPECT_EQ(per.memsets, int64_t(params));
  EXPECT_EQ(multi.memsets, 1);
  EXPECT_EQ(per.computes, 2);
  EXPECT_EQ(multi.computes, 2);
}

}  // namespace
}  // namespace kiln::test
