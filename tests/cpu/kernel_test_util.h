// Helpers for testing CPU kernels directly: hand-made TensorNodes over owned
// memory (dense or arbitrary strided views), a reference element accessor that
// follows numpy broadcasting, and a runner over a ThreadPool of n threads.
#pragma once
#include <cmath>
#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <random>
#include <vector>

#include "backends/cpu/kernels/kernels.h"
#include "backends/cpu/thread_pool.h"
#include "kiln/dtype.h"
#include "kiln/ext/op_params.h"
#include "kiln/tensor.h"

namespace kiln::kernel_test {

using Kernel = void (*)(TensorNode*, cpu::ThreadCtx&);
using Strides = std::array<int64_t, kMaxDims>;

inline cpu::ThreadPool& pool(int n) {
  static std::map<int, std::unique_ptr<cpu::ThreadPool>> pools;
  auto& p = pools[n];
  if (!p) p = std::make_unique<cpu::ThreadPool>(n);
  return *p;
}
inline void run(Kernel k, TensorNode* dst, int nth) {
  pool(nth).run([&](cpu::ThreadCtx& t) { k(dst, t); });
}

inline Strides dense(const Shape& s, size_t es) {
  Strides st{};
  int64_t acc = int64_t(es);
  for (int d = s.ndim() - 1; d >= 0; --d) st[d] = acc, acc *= s[d];
  return st;
}

// Owns nodes and their memory.
class Nodes {
 public:
  TensorNode* make(DType t, const Shape& s) {
    mems_.emplace_back(size_t(s.numel()) * dtype_size(t) / 4 + 16, 0u);
    TensorNode& n = nodes_.emplace_back();
    n.dtype = t;
    n.shape = s;
    n.stride = dense(s, dtype_size(t));
    n.data = mems_.back().data();
    return &n;
  }
  // A view of base's memory: shape s, byte strides st, element offset.
  TensorNode* view(TensorNode* base, const Shape& s, const Strides& st, int64_t offs = 0) {
    TensorNode& n = nodes_.emplace_back();
    n.dtype = base->dtype;
    n.shape = s;
    n.stride = st;
    n.data = (char*)base->data + offs * int64_t(base->elem_size());
    return &n;
  }
  // The transpose of the last two dims of a new dense tensor of shape
  // [..., s[-1], s[-2]] — a non-contiguous view with shape s.
  TensorNode* transposed(DType t, const Shape& s) {
    Shape bs = s;
    int nd = s.ndim();
    std::swap(bs[nd - 1], bs[nd - 2]);
    TensorNode* b = make(t, bs);
    Strides st = b->stride;
    std::swap(st[nd - 1], st[nd - 2]);
    return view(b, s, st);
  }
  // p: the op's struct from kiln/ext/op_params.h (or raw OpParamBytes).
  template <class P = NoParams>
  TensorNode* op(Op op, DType t, const Shape& s, std::initializer_list<TensorNode*> srcs,
                 const P& p = {}) {
    TensorNode* n = make(t, s);
    n->op = op;
    n->params = detail::pack_params(p);
    for (TensorNode* x : srcs) n->src[n->n_src++] = x;
    return n;
  }

 private:
  std::deque<TensorNode> nodes_;
  std::deque<std::vector<uint32_t>> mems_;
};

inline int64_t offset(const TensorNode* n, const int64_t* idx) {
  int64_t o = 0;
  for (int d = 0; d < n->shape.ndim(); ++d) o += idx[d] * n->stride[d];
  return o;
}
// Element of n at the multi-index idx of a shape `out` it broadcasts to.
inline int64_t bcast_offset(const TensorNode* n, const Shape& out, const int64_t* idx) {
  int64_t o = 0;
  const int off = out.ndim() - n->shape.ndim();
  for (int d = 0; d < n->shape.ndim(); ++d)
    if (n->shape[d] != 1) o += idx[d + off] * n->stride[d];
  return o;
}
inline float load(const TensorNode* n, int64_t byte_off) {
  const char* p = (const char*)n->data + byte_off;
  switch (n->dtype) {
    case DType::f32: {
      float v;
      std::memcpy(&v, p, 4);
      return v;
    }
    case DType::i32: {
      int32_t v;
      std::memcpy(&v, p, 4);
      return float(v);
    }
    case DType::f16: {
      uint16_t v;
      std::memcpy(&v, p, 2);
      return f16_to_f32(v);
    }
    case DType::bf16: {
      uint16_t v;
      std::memcpy(&v, p, 2);
      return bf16_to_f32(v);
    }
  }
  return 0;
}
inline void unravel(const Shape& s, int64_t i, int64_t* idx) {
  for (int d = s.ndim() - 1; d >= 0; --d) idx[d] = i % s[d], i /= s[d];
}
inline float at(const TensorNode* n, int64_t linear) {
  int64_t idx[kMaxDims] = {};
  unravel(n->shape, linear, idx);
  return load(n, offset(n, idx));
}
inline float at_bcast(const TensorNode* n, const Shape& out, int64_t linear) {
  int64_t idx[kMaxDims] = {};
  unravel(out, linear, idx);
  return load(n, bcast_offset(n, out, idx));
}
inline void set(TensorNode* n, int64_t linear, float v) {
  int64_t idx[kMaxDims] = {};
  unravel(n->shape, linear, idx);
  char* p = (char*)n->data + offset(n, idx);
  switch (n->dtype) {
    case DType::f32: std::memcpy(p, &v, 4); break;
    case DType::i32: {
      int32_t i = int32_t(v);
      std::memcpy(p, &i, 4);
      break;
    }
    case DType::f16: {
      uint16_t h = f32_to_f16(v);
      std::memcpy(p, &h, 2);
      break;
    }
    case DType::bf16: {
      uint16_t h = f32_to_bf16(v);
      std::memcpy(p, &h, 2);
      break;
    }
  }
}
inline void fill_random(TensorNode* n, float lo, float hi, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(lo, hi);
  for (int64_t i = 0; i < n->numel(); ++i) set(n, i, u(rng));
}
inline std::vector<float> values(const TensorNode* n) {
  std::vector<float> v(size_t(n->numel()));
  for (int64_t i = 0; i < n->numel(); ++i) v[size_t(i)] = at(n, i);
  return v;
}
inline bool same_bits(float a, float b) { return std::memcmp(&a, &b, 4) == 0; }

}  // namespace kiln::kernel_test
