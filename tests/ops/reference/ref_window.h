// Window helpers shared by the references of the window ops (ref_conv.cpp,
// ref_pool.cpp): the window parameters, the output size (floor), a check, and
// the row-major position of (n, c, h, w).
#pragma once
#include <cstdint>

#include "ops/reference/reference.h"

namespace kiln::test::ref_window {

struct RefWin {
  int64_t KH, KW, SH, SW, PH, PW, DH = 1, DW = 1;
};

inline RefWin conv_params(const Conv2dParams& p) {
  return {p.kh, p.kw, p.sh, p.sw, p.ph, p.pw, p.dh, p.dw};
}
inline RefWin pool_params(const Pool2dParams& p) { return {p.kh, p.kw, p.sh, p.sw, p.ph, p.pw}; }

inline int64_t out_size(int64_t in, int64_t k, int64_t s, int64_t p, int64_t d) {
  return (in + 2 * p - d * (k - 1) - 1) / s + 1;
}

inline void check_win(const TensorNode* n, const RefWin& w) {
  if (w.KH < 1 || w.KW < 1 || w.SH < 1 || w.SW < 1 || w.PH < 0 || w.PW < 0 || w.DH < 1 || w.DW < 1)
    ref_fail(n, "bad window params");
}

inline int64_t at4(const Shape& s, int64_t n, int64_t c, int64_t h, int64_t w) {
  return ((n * s[1] + c) * s[2] + h) * s[3] + w;
}

}  // namespace kiln::test::ref_window
