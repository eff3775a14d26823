// Gradient stores (docs/design.md, "Training"): gradients keyed by parameter,
// gathered from any number of backward passes over any graphs, then applied by
// one optimizer step.
//
//   kiln::GradStore grads;                      // empty
//   for (auto& [graph, loss] : passes) {        // graphs sharing weights
//     cpu.compute(graph);                       // forward + backward
//     grads.merge(kiln::GradStore(graph));      // adds where both hold a param
//     graph.reset_grads();
//   }
//   grads.clip(1.0f);                           // global L2 norm <= 1
//   kiln::Optimizer opt(model.parameters(), cpu, {.type = kiln::OptimizerType::adamw});
//   opt.step(grads);                            // one step on the summed gradient
//
// A store keeps its gradients on the host in f32, one array per param; keys are
// tensor identity (the param's node), so two graphs built from one Context that
// read the same weight add into one entry. A non-linear optimizer (AdamW) stepped
// once on the sum differs from stepping once per pass: the reason to gather.
#pragma once
#include <cstdint>
#include <span>
#include <unordered_map>
#include <utility>
#include <vector>

#include "kiln/backend.h"
#include "kiln/graph.h"
#include "kiln/opt.h"
#include "kiln/tensor.h"

namespace kiln {

class GradStore {
 public:
  GradStore() = default;  // empty
  // The gradients a computed backward pass left in `g`'s accumulators (every
  // param with one). The accumulators are read, not reset.
  explicit GradStore(const Graph& g);

  // Adds `grad` to param's entry (created at zero when absent). `grad` is f32 of
  // param's shape: a host array, or a tensor with memory.
  void add(Tensor param, std::span<const float> grad);
  void add(Tensor param, Tensor grad);
  // Adds every gradient of `other`; params only one store holds are copied.
  void merge(const GradStore& other);

  bool contains(Tensor param) const;
  // The gradient of param; throws kiln::Error "[grad_store] ..." when absent.
  std::span<const float> get(Tensor param) const;
  std::span<float> get(Tensor param);
  // Takes param's gradient out of the store (empty vector when absent).
  std::vector<float> remove(Tensor param);
  // The params held, in the order they were first added.
  std::vector<Tensor> params() const;
  size_t size() const { return entries_.size(); }
  bool empty() const { return entries_.empty(); }

  void scale(float factor);  // every gradient *= factor
  void clear();              // forgets every param
  // The L2 norm over all gradients together (computed in double).
  double norm() const;
  // torch.nn.utils.clip_grad_norm_: when norm() > max_norm, scales every
  // gradient by max_norm / (norm + 1e-6). Returns the norm before clipping.
  double clip(float max_norm);

 private:
  struct Entry {
    Tensor param;
    std::vector<float> grad;
  };
  Entry& entry(Tensor param);
  const Entry* find(Tensor param) const;
  std::vector<Entry> entries_;                              // in order of first add
  std::unordered_map<const TensorNode*, size_t> index_of_;  // param node -> entry
};

// Options of a stand-alone Optimizer. `schedule` gives each step's parameters
// (empty: schedule::constant()); AdamW's bias corrections count the steps each
// param took (PyTorch's per-param state['step']).
struct OptimizerOptions {
  OptimizerType type = OptimizerType::adamw;
  ScheduleFn schedule;
};

// AdamW or SGD (kiln's *_STEP ops) applied to params from a GradStore, for
// training loops that run their own graphs instead of an OptContext. It keeps
// the optimizer state (and a staging tensor per param for its gradient) in one
// buffer of `backend`; params must have memory that backend computes on.
// Frozen params (Tensor::requires_grad false) among `params` are left out.
class Optimizer {
 public:
  Optimizer(std::vector<Tensor> params, Backend& backend, OptimizerOptions opt = {});
  ~Optimizer();
  Optimizer(const Optimizer&) = delete;
  Optimizer& operator=(const Optimizer&) = delete;

  // One optimizer step: each param the store holds is updated from its
  // gradient; params it does not hold are left alone (PyTorch skips params
  // without a gradient). A param of the store this optimizer does not own is a
  // kiln::Error "[optimizer] ...".
  void step(const GradStore& grads);
  int64_t steps() const { return steps_; }  // step() calls so far
  // The param's optimizer state: m and v (AdamW) or buf (SGD with momentum).
  OptimizerState state(Tensor param) const;
  const std::vector<Tensor>& params() const { return params_; }

 private:
  size_t index(Tensor param) const;
  std::vector<Tensor> params_, grads_, hp_, steps_nodes_;
  std::vector<OptimizerState> state_;
  std::vector<int64_t> param_steps_;
  std::unordered_map<const TensorNode*, size_t> index_of_;
  Backend& backend_;
  OptimizerOptions opt_;
  std::unique_ptr<Buffer> buffer_;
  int64_t steps_ = 0;
};

}  // namespace kiln
