// The op parameters the CUDA launchers read, by meaning. Every read of
// TensorNode::p in src/backends/cuda goes through here, so a change of how
// params are stored (positional p.i[]/p.f[] today) is an edit of this file only.
#pragma once
#include <cstdint>

#include "kiln/tensor.h"

namespace kiln::cuda::prm {

inline int64_t axis(const TensorNode* n) { return n->p.i[0]; }          // SUM MAX ARGMAX; -1: all
inline int cmp_mode(const TensorNode* n) { return int(n->p.i[0]); }      // CMP: 0 eq .. 5 ge
inline float fill_value(const TensorNode* n) { return n->p.f[0]; }      // FILL, PAD
inline uint64_t rand_seed(const TensorNode* n) { return uint64_t(n->p.i[0]); }
inline float rand_p(const TensorNode* n) { return n->p.f[0]; }
inline float pow_exp(const TensorNode* n) { return n->p.f[0]; }
inline float scale_mul(const TensorNode* n) { return n->p.f[0]; }       // SCALE: f0*x + f1
inline float scale_add(const TensorNode* n) { return n->p.f[1]; }
inline float clamp_lo(const TensorNode* n) { return n->p.f[0]; }
inline float clamp_hi(const TensorNode* n) { return n->p.f[1]; }
inline float leaky_slope(const TensorNode* n) { return n->p.f[0]; }
inline float softmax_scale(const TensorNode* n) { return n->p.f[0]; }
inline bool softmax_causal(const TensorNode* n) { return n->p.i[0] != 0; }
inline int64_t one_hot_classes(const TensorNode* n) { return n->p.i[0]; }
inline const char* one_hot_op_name(const TensorNode* n) { return n->p.i[1] == 1 ? "cross_entropy" : "one_hot"; }
inline int concat_dim(const TensorNode* n) { return int(n->p.i[0]); }
inline int64_t pad_before(const TensorNode* n, int d) { return n->p.i[2 * d]; }

// IM2COL/COL2IM/CONV2D* (dilated) and pooling (dilation 1).
struct Window {
  int64_t kh, kw, sh, sw, ph, pw, dh = 1, dw = 1;
};
inline Window window(const TensorNode* n, bool dilated) {
  Window w{n->p.i[0], n->p.i[1], n->p.i[2], n->p.i[3], n->p.i[4], n->p.i[5]};
  if (dilated) {
    w.dh = n->p.i[6];
    w.dw = n->p.i[7];
  }
  return w;
}

}  // namespace kiln::cuda::prm
