// Checks shared by the window ops' builders (conv.cpp, pool.cpp): the output size
// of a sliding window, floor((in + 2p - d(k-1) - 1) / s) + 1 (an error when it is
// <= 0), and the [N, C, H, W] input.
#pragma once
#include "kiln/ext/op_builder.h"
#include "kiln/ops.h"

namespace kiln::detail {

inline int64_t window_out_size(const char* op, const char* what, int64_t in, int64_t k, int64_t s,
                               int64_t p, int64_t d, const Shape& xs) {
  const int64_t num = in + 2 * p - d * (k - 1) - 1;
  const int64_t o = (num >= 0 ? num / s : -((-num + s - 1) / s)) + 1;  // floor division
  if (o <= 0)
    fail(op, "output ", what, " would be ", o, " for input ", xs.str(), " (", what, " ", in,
         ", kernel ", k, ", stride ", s, ", padding ", p, ", dilation ", d, ")");
  return o;
}

inline void check_nchw(const char* op, Tensor x) {
  detail::check_float32(op, "x", x);
  if (x.ndim() != 4) fail(op, "x must be [N, C, H, W], got ", x.shape().str());
}

}  // namespace kiln::detail
