// Param groups for weight decay (nanoGPT's configure_optimizers rule).
#include "kiln/ext/tensor_node.h"
#include "kiln/opt.h"

namespace kiln {

std::vector<ParamGroup> weight_decay_groups(const nn::Module& model, float weight_decay) {
  ParamGroup decay{{}, weight_decay}, no_decay{{}, 0.0f};
  for (const Tensor& p : model.parameters())
    if (p.requires_grad()) (p.ndim() >= 2 ? decay : no_decay).params.push_back(p);
  std::vector<ParamGroup> out;
  for (ParamGroup* g : {&decay, &no_decay})
    if (!g->params.empty()) out.push_back(std::move(*g));
  return out;
}

}  // namespace kiln
