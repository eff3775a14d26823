// Helpers for the scheduler tests: a device-like test backend (its own,
// non-host memory; only some ops), a CPU backend that checks it is never handed
// device memory, small training models, and comparisons.
#pragma once
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "kiln/context.h"
#include "kiln/cpu.h"
#include "kiln/ext/sched.h"
#include "kiln/graph.h"
#include "kiln/ops.h"

namespace sched_test {

using namespace kiln;

// Memory that only the test backend may touch: malloc'ed, but not host-flagged,
// so the scheduler must copy in and out through set()/get().
class DeviceBuffer final : public Buffer {
 public:
  DeviceBuffer(BufferType& type, size_t size) : type_(type), size_(size) {
    data_ = size ? std::aligned_alloc(32, (size + 31) / 32 * 32) : nullptr;
    if (data_) std::memset(data_, 0xA5, size);  // garbage until written
  }
  ~DeviceBuffer() override { std::free(data_); }
  BufferType& type() const override { return type_; }
  void* base() override { return data_; }
  size_t size() const override { return size_; }
  void set(TensorNode* t, const void* src, size_t off, size_t n) override {
    ++n_set;
    std::memcpy(static_cast<char*>(t->data) + off, src, n);
  }
  void get(const TensorNode* t, void* dst, size_t off, size_t n) const override {
    ++n_get;
    std::memcpy(dst, static_cast<const char*>(t->data) + off, n);
  }
  void memset(TensorNode* t, uint8_t v, size_t off, size_t n) override {
    std::memset(static_cast<char*>(t->data) + off, v, n);
  }
  void clear(uint8_t v) override {
    if (data_) std::memset(data_, v, size_);
  }
  static inline int n_set = 0, n_get = 0;  // transfers so far (all device buffers)

 private:
  BufferType& type_;
  size_t size_;
  void* data_ = nullptr;
};

class DeviceBufferType final : public BufferType {
 public:
  const char* name() const override { return "test-device"; }
  size_t alignment() const override { return 32; }
  bool is_host() const override { return false; }
  std::unique_ptr<Buffer> alloc(size_t size) override {
    return std::make_unique<DeviceBuffer>(*this, size);
  }
};

inline DeviceBufferType& device_buffer_type() {
  static DeviceBufferType t;
  return t;
}

// Memory a node reads or writes: the owner's buffer.
inline const Buffer* buffer_of(const TensorNode* t) {
  while (t->view_src) t = t->view_src;
  return t->buffer;
}

// Runs only `ops` (with the CPU kernels) on device memory (or, with
// host_memory, on host memory like the BLAS backend), and checks that every
// tensor it touches lives there.
class SubsetBackend final : public Backend {
 public:
  explicit SubsetBackend(std::set<Op> ops, bool host_memory = false, int threads = 1)
      : ops_(std::move(ops)), host_(host_memory), cpu_(threads) {}
  const char* name() const override { return host_ ? "HOSTSUB" : "TEST"; }
  BufferType& buffer_type() override { return host_ ? host_buffer_type() : device_buffer_type(); }
  bool supports_op(const TensorNode* n) const override {
    const OpKind k = op_kind(n->op);
    return k == OpKind::LEAF || k == OpKind::VIEW || ops_.count(n->op) != 0;
  }
  using Backend::compute;
  void compute(std::span<TensorNode* const> nodes) override {
    for (const TensorNode* n : nodes) {
      if (!supports_op(n))
        throw std::runtime_error(std::string("TEST got unsupported op ") + op_name(n->op));
      check(n);
      for (int i = 0; i < n->n_src; ++i)
        if (n->src[i]) check(n->src[i]);
    }
    ++n_computes;
    cpu_.compute(nodes);
  }
  int n_computes = 0;

 private:
  void check(const TensorNode* t) {
    const Buffer* b = buffer_of(t);
    if (!b || &b->type() != &buffer_type())
      throw std::runtime_error("TEST backend handed tensor #" + std::to_string(t->id) + " (" +
                               op_name(t->op) + ") outside device memory");
  }
  std::set<Op> ops_;
  bool host_;
  CpuBackend cpu_;
};

// The CPU backend, refusing device memory (catches a missing copy).
class CheckedCpu final : public Backend {
 public:
  explicit CheckedCpu(int threads = 1) : cpu_(threads) {}
  const char* name() const override { return "CPU"; }
  BufferType& buffer_type() override { return cpu_.buffer_type(); }
  bool supports_op(const TensorNode* n) const override { return cpu_.supports_op(n); }
  using Backend::compute;
  void compute(std::span<TensorNode* const> nodes) override {
    for (const TensorNode* n : nodes) {
      for (int i = -1; i < n->n_src; ++i) {
        const TensorNode* t = i < 0 ? n : n->src[i];
        if (!t) continue;
        const Buffer* b = buffer_of(t);
        if (!b || !b->is_host())
          throw std::runtime_error("CPU backend handed tensor #" + std::to_string(t->id) + " (" +
                                   op_name(t->op) + ") outside host memory");
      }
    }
    cpu_.compute(nodes);
  }

 private:
  CpuBackend cpu_;
};

// A training graph (forward + backward) and the tensors a test reads.
struct Model {
  std::unique_ptr<Context> ctx = std::make_unique<Context>();
  Graph graph;
  Tensor x, labels, loss, logits;
  std::vector<Tensor> params;
  std::vector<Tensor> grads() const {
    std::vector<Tensor> g;
    for (const Tensor& p : params) g.push_back(graph.grad(p));
    return g;
  }
};

// MLP: in -> hidden (relu) -> classes, cross-entropy loss.
Model make_mlp(int64_t batch, int64_t in, int64_t hidden, int64_t classes);
// Small CNN: conv3x3(pad 1) + relu + maxpool2 -> conv3x3 + relu -> linear.
Model make_cnn(int64_t batch, int64_t channels, int64_t hw, int64_t classes);
// Deterministic inputs, labels and params (call after allocation).
void fill(Model& m, uint32_t seed);

std::vector<float> values(Tensor t);
// Largest |a-b| relative to the largest |a| (a = reference).
double rel_diff(const std::vector<float>& a, const std::vector<float>& b);

}  // namespace sched_test
