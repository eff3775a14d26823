// Context: owns the metadata of every tensor built from it (an arena; node
// addresses are stable). It holds no tensor data: backends' buffers do.
#pragma once
#include <memory>
#include <string>

#include "kiln/tensor.h"

namespace kiln {

class Context {
 public:
  Context();
  ~Context();
  Context(const Context&) = delete;
  Context& operator=(const Context&) = delete;

  // Leaves. `input` is data the user writes each run, `param` is trained (gets a
  // gradient in Graph::backward), `tensor` is a plain leaf (constants, state).
  Tensor input(DType t, const Shape& s, std::string name = {});
  Tensor param(DType t, const Shape& s, std::string name = {});
  Tensor tensor(DType t, const Shape& s, std::string name = {});

  // Mixed precision: the dtype that `matmul` (and what is built on it:
  // nn::Linear, the backward pass's products) computes in, for the matmuls built
  // from now on. f32 (the default): operands as given. bf16: each f32 operand
  // is first cast to bf16 (`x.to(bf16)`, a COPY node the planner and the
  // backward pass see), the product accumulates in f32 and its result is f32;
  // params stay f32 (the master copy the optimizer updates) and their bf16
  // copies are recomputed from them every forward pass. Other dtypes throw.
  void set_matmul_precision(DType t);
  DType matmul_precision() const { return matmul_precision_; }

  size_t size() const;
  TensorNode* node(size_t i);

  // Used by op builders: a new contiguous node (strides set from the shape).
  TensorNode* new_node(DType t, const Shape& s, Op op);

  // Expires when this context is destroyed. Tensor and Graph handles hold it
  // weakly (and throw on use after that); a Buffer holds it weakly to skip the
  // tensors of dead contexts when it detaches its tensors.
  const detail::LifeToken& life() const { return life_; }

 private:
  struct Nodes;  // a deque of TensorNode (kiln/ext/tensor_node.h): stable addresses
  std::unique_ptr<Nodes> nodes_;
  detail::LifeToken life_ = std::make_shared<int>(0);
  DType matmul_precision_ = DType::f32;
};

}  // namespace kiln
