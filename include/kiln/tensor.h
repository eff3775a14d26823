// The Tensor handle users hold, shapes and the op enum. The metadata behind a
// handle (TensorNode, owned by a Context) is extension API: kiln/ext/tensor_node.h.
#pragma once
#include <array>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "kiln/dtype.h"
#include "kiln/error.h"

namespace kiln {

inline constexpr int kMaxDims = 4;
// Optimizer steps read param, grad, two moments, hyper-params; ATTENTION_BACK
// q, k, v, out, d out, packed examples' segment ids and a dropout seed tensor.
inline constexpr int kMaxSrc = 7;

enum class Op : uint8_t {
#define KILN_OP(e, family, kind, inplace, grad) e,
#include "kiln/ops.def"
#undef KILN_OP
  COUNT
};
enum class OpKind : uint8_t { LEAF, VIEW, ALIAS, COMPUTE };

const char* op_name(Op op);    // the enumerator in lower case: Op::LEAKY_RELU -> "leaky_relu"
const char* op_family(Op op);  // the op's family (ops.def): Op::LEAKY_RELU -> "unary"
OpKind op_kind(Op op);
bool op_can_inplace(Op op);
bool op_has_grad(Op op);

// A shape of 0..4 dims, outermost first (PyTorch order).
class Shape {
 public:
  Shape() = default;
  Shape(std::initializer_list<int64_t> dims);
  explicit Shape(std::span<const int64_t> dims);
  int ndim() const { return n_; }
  int64_t operator[](int i) const { return d_[i]; }
  int64_t& operator[](int i) { return d_[i]; }
  // The element count; a kiln::Error "[op] ..." (op: "shape" for numel()) when it
  // does not fit in int64 (dims are multiplied with overflow checks).
  int64_t numel() const { return checked_numel("shape"); }
  int64_t checked_numel(const char* op) const;
  const int64_t* begin() const { return d_.data(); }
  const int64_t* end() const { return d_.data() + n_; }
  bool operator==(const Shape& o) const;
  std::string str() const;  // "[2, 3]"
  void push_back(int64_t v);

 private:
  int n_ = 0;
  std::array<int64_t, kMaxDims> d_{};
};

enum TensorFlag : uint32_t {
  kFlagInput = 1u << 0,
  kFlagOutput = 1u << 1,
  kFlagParam = 1u << 2,
  kFlagLoss = 1u << 3,
  kFlagGrad = 1u << 4,        // a gradient (never gets a gradient itself)
  kFlagGradAcc = 1u << 5,     // a persistent gradient accumulator of a param
  kFlagCheckpoint = 1u << 6,  // kept for the backward pass, which recomputes what feeds it
  kFlagFrozen = 1u << 7,      // a param that gets no gradient (Tensor::set_requires_grad(false))
};

class Context;
class Buffer;

namespace detail {

// A context's liveness token (Context::life()): Tensor and Graph hold it weakly
// and throw a kiln::Error when it has expired, instead of reading freed nodes.
using LifeToken = std::shared_ptr<const void>;
// The token of nodes that belong to no Context (tests, a scheduler's own copies):
// it never expires.
const LifeToken& immortal_life();
[[noreturn]] void fail_dead_context(const char* what);

struct TensorNode;  // the metadata behind a Tensor: kiln/ext/tensor_node.h

}  // namespace detail
using detail::TensorNode;

// A cheap, copyable handle to a TensorNode. Operators and free functions in
// kiln/ops.h build new nodes; nothing is computed until a backend runs a Graph.
// The handle does not keep its Context alive: once the Context is destroyed,
// every use except defined() and == throws kiln::Error "[tensor] ... destroyed".
class Tensor {
 public:
  Tensor() = default;
  explicit Tensor(TensorNode* n);
  // The node (null for an undefined handle); throws when its Context is gone.
  TensorNode* node() const {
    if (n_ && life_.expired()) detail::fail_dead_context("tensor");
    return n_;
  }
  bool defined() const { return n_ != nullptr; }
  explicit operator bool() const { return defined(); }
  bool operator==(const Tensor& o) const { return n_ == o.n_; }

  DType dtype() const;
  const Shape& shape() const;
  int ndim() const;
  int64_t size(int dim) const;  // negative dims count from the end
  int64_t numel() const;
  Op op() const;
  const std::string& name() const;
  std::string label() const;  // "#12 'fc1.weight'", "#12" when unnamed
  Tensor& set_name(std::string name);
  bool has_flag(TensorFlag f) const;
  Context& ctx() const;
  // PyTorch's requires_grad: true for a param (Context::param) that is not
  // frozen. A frozen param is still a param (kept, saved, loaded) but
  // Graph::backward builds no gradient, accumulator or optimizer state for it;
  // gradients still flow through it to what lies below. Read when a backward
  // pass is built: freezing changes backward passes built afterwards.
  // set_requires_grad(true) on a tensor that is not a param throws kiln::Error.
  bool requires_grad() const;
  Tensor& set_requires_grad(bool on);

  // Views and copies (PyTorch names).
  [[nodiscard]] Tensor reshape(const Shape& s) const;  // copies first when not contiguous
  [[nodiscard]] Tensor view(const Shape& s) const;     // never copies; errors when not contiguous
  [[nodiscard]] Tensor permute(std::initializer_list<int> axes) const;
  [[nodiscard]] Tensor transpose(int d0, int d1) const;
  [[nodiscard]] Tensor T() const { return transpose(-2, -1); }
  [[nodiscard]] Tensor narrow(int dim, int64_t start, int64_t length) const;
  [[nodiscard]] Tensor expand(const Shape& s) const;
  [[nodiscard]] Tensor contiguous() const;
  [[nodiscard]] Tensor to(DType t) const;

  // Data access once the tensor has memory (see kiln/backend.h). Element type must
  // match the dtype (uint16_t for f16/bf16). set/get work on non-contiguous views.
  // A quantized (q8_0/q4_0) tensor, contiguous, takes float (quantized on set,
  // dequantized on get) or uint8_t (its blocks' bytes as stored, nbytes of them).
  bool has_data() const;
  template <class V>
  void set(std::span<const V> values);
  template <class V>
  void set(const std::vector<V>& values) {
    set(std::span<const V>(values));
  }
  template <class V>
  void set(std::initializer_list<V> values) {
    set(std::span<const V>(values.begin(), values.size()));
  }
  template <class V>
  [[nodiscard]] std::vector<V> get() const;
  [[nodiscard]] float item() const;  // a one-element f32/i32 tensor's value as float
  void fill_zero();

 private:
  TensorNode* n_ = nullptr;
  std::weak_ptr<const void> life_;  // the Context's token (see Context::life)
};

namespace detail {
// Adds flags to t's node (graph building and tests; programs mark tensors through
// Context::input/param and Graph).
void set_flags(Tensor t, uint32_t f);
}  // namespace detail

}  // namespace kiln
