// The scale searches of ggml's k-quant reference quantizers: each takes one
// group of n values and picks a scale (and a min) and the group's quants.
// Their f32 arithmetic follows ggml's step by step (the order of every sum and
// product), because the searches compare errors: one ulp of difference can
// pick another candidate and change the bytes.
#pragma once
#include <cstdint>

namespace kiln::quant {

// Groups whose largest magnitude is below this are all zero (ggml's GROUP_MAX_EPS).
inline constexpr float kGroupMaxEps = 1e-15f;

// Symmetric quants in [0, 2 nmax): x ~ scale * (L - nmax), weighted by x^2;
// tries 18 scales around nmax / max|x| and keeps the best least-squares fit
// (ggml's make_qx_quants with rmse_type 1, no importance weights).
float search_symmetric(int n, int nmax, const float* x, int8_t* L);

// Symmetric quants for Q3_K: starts from nmax / max|x| and moves single quants
// while the weighted fit improves (ggml's make_q3_quants with do_rmse). L gets
// values in [0, 2 nmax) (all 0 for an all-zero group).
float search_symmetric_q3(int n, int nmax, const float* x, int8_t* L);

// Asymmetric quants in [0, nmax]: x ~ scale * L - the_min (the_min >= 0),
// errors weighted by `weights` (absolute when use_mad, else squared); tries
// nstep + 1 ranges (ggml's make_qkx2_quants). `aux` is n bytes of scratch.
float search_scale_min(int n, int nmax, const float* x, const float* weights, uint8_t* L,
                       float* the_min, uint8_t* aux, float rmin, float rdelta, int nstep,
                       bool use_mad);

}  // namespace kiln::quant
