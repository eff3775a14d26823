// CausalLM: constant tables placed next to the params, and make_model.
#include <algorithm>

#include "kiln/ext/alloc.h"
#include "kiln/models.h"
#include "models/architecture.h"

namespace kiln::models {

Tensor CausalLM::constant(const Shape& shape, std::vector<float> values, const std::string& name) {
  KILN_ASSERT(int64_t(values.size()) == shape.numel());
  Tensor t = ctx().tensor(f32, shape, name);
  constants_.emplace_back(t, std::move(values));
  return t;
}

void CausalLM::allocate(Backend& backend) {
  Module::allocate(backend);
  std::vector<TensorNode*> unplaced;
  for (auto& [t, v] : constants_)
    if (!t.has_data()) unplaced.push_back(t.node());
  if (unplaced.empty()) return;
  BufferType& bt = backend.buffer_type();
  TensorAllocator measure(bt);
  for (TensorNode* t : unplaced) measure.alloc(t);
  constant_storage_ = bt.alloc(std::max(measure.high_water(), bt.alignment()));
  TensorAllocator place(*constant_storage_);
  for (TensorNode* t : unplaced) place.place(t);
  for (auto& [t, v] : constants_) t.set(v);
}

void CausalLM::check_allocated() const {
  for (const auto& [t, v] : constants_)
    if (!t.has_data())
      fail("models", type_name(), ": its constant tables have no memory: call allocate(backend) ",
           "(or load_pretrained) before building graphs");
}

Tensor CausalLM::forward_packed(Tensor, Tensor, Tensor) {
  fail("models", type_name(),
       ": packed examples (forward_packed) are not supported; pad each example to its own row "
       "instead (kiln-lm finetune --no-packing)");
}

std::unique_ptr<CausalLM> make_model(Context& ctx, const ModelConfig& cfg,
                                     const ModelOptions& opt) {
  return detail::architecture_of(cfg)->make(ctx, cfg, opt);
}

}  // namespace kiln::models
