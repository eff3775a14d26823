// Internal to the CUDA backend: the host-side decisions of its GEMMs, kept free
// of CUDA so that tests check them on machines without a GPU.
//
//   gemm_read      how cuBLAS reads a row-major operand view in place, if it can
//   matmul_prep    which MATMUL operands need a dense copy first, and in what dtype
//   matrix_view    whether dims of a conv tensor are a GEMM matrix as they lie
#pragma once
#include <algorithm>
#include <climits>
#include <cstdint>

#include "kiln/dtype.h"

namespace kiln::cuda {

// cuBLAS's reading of a row-major rows x cols operand with element strides
// (rs, cs), as the first factor of C^T = B^T A^T (matmul.cu): `transpose` is
// CUBLAS_OP_T, `ld` its leading dimension.
struct GemmRead {
  bool transpose = false;
  int64_t ld = 0;
};

// False when cuBLAS cannot read the view in place: no unit stride in either
// dim, or a leading dimension below the matrix extent (0 for a broadcast row).
inline bool gemm_read(int64_t rows, int64_t cols, int64_t rs, int64_t cs, GemmRead* out) {
  if (cols == 1 || cs == 1) {
    const int64_t ld = rows == 1 ? std::max<int64_t>(cols, 1) : rs;
    if (ld >= std::max<int64_t>(cols, 1) && ld <= INT_MAX) {
      *out = {false, ld};
      return true;
    }
  }
  if (rows == 1 || rs == 1) {
    const int64_t ld = cols == 1 ? std::max<int64_t>(rows, 1) : cs;
    if (ld >= std::max<int64_t>(rows, 1) && ld <= INT_MAX) {
      *out = {true, ld};
      return true;
    }
  }
  return false;
}

inline bool gemm_layout_readable(int64_t rows, int64_t cols, int64_t rs, int64_t cs) {
  GemmRead r;
  return gemm_read(rows, cols, rs, cs, &r);
}

// Whether an operand's batch dims (all but its last two; nd dims, element
// strides) can be stepped by cuBLAS's one batch stride: after dropping size-1
// dims, each dim's stride is the next one's times that one's size. Otherwise
// matmul.cu loops over the outer batch dims, one cuBLAS call each: the
// attention scores of a [64, 6, 256, 64] head view of a qkv tensor were 64
// calls of 6 small products per matmul. A dense copy (a few microseconds)
// makes it one call of 384. A batch dim that is a broadcast (stride 0) keeps
// the loop: its copy would multiply the operand's memory.
inline bool batch_dims_one_run(int nd, const int64_t* shape, const int64_t* stride) {
  int64_t inner_stride = -1, inner_size = 1;
  for (int d = nd - 3; d >= 0; --d) {
    if (shape[d] == 1) continue;
    if (stride[d] == 0) return true;  // a broadcast: leave it to the loop
    if (inner_stride >= 0 && stride[d] != inner_stride * inner_size) return false;
    inner_stride = stride[d];
    inner_size = shape[d];
  }
  return true;
}

// What MATMUL does with an operand before cuBLAS: nothing (read in place), a
// dense copy in its own dtype (a layout cuBLAS cannot read), or a dense f32
// copy (its dtype differs from the other operand's). cuBLAS takes one input
// type for both operands and only layouts gemm_read accepts.
enum class Prep { none, dense, to_f32 };
struct MatmulPrep {
  Prep a = Prep::none, b = Prep::none;
};

inline MatmulPrep matmul_prep(DType ta, bool a_readable, DType tb, bool b_readable) {
  MatmulPrep p;
  if (ta == tb) {  // one type already: copy only what cannot be read, keeping the dtype
    p.a = a_readable ? Prep::none : Prep::dense;
    p.b = b_readable ? Prep::none : Prep::dense;
    return p;
  }
  // Mixed: both end up f32; an f32 operand is copied only when unreadable.
  p.a = ta != DType::f32 ? Prep::to_f32 : a_readable ? Prep::none : Prep::dense;
  p.b = tb != DType::f32 ? Prep::to_f32 : b_readable ? Prep::none : Prep::dense;
  return p;
}

// The dtype cuBLAS sees for an operand of dtype t after p.
inline DType prepared_dtype(DType t, Prep p) { return p == Prep::to_f32 ? DType::f32 : t; }

// A [rows, cols] f32 matrix view of dims (rd, rd+1, ...) of a tensor (columns =
// the later dims merged row-major), element row stride rs and stride bs between
// consecutive indices of dim 0 (when rd == 1): the view conv.cu hands cuBLAS.
struct MatrixView {
  int64_t rows = 0, cols = 0, rs = 0, bs = 0;
};

// The view of an f32 tensor of `nd` dims (shape, byte strides) in place, or
// false when it needs a dense copy: another dtype, later dims that do not
// merge, or a row stride cuBLAS cannot take (0 when dim rd is a broadcast, e.g.
// the gradient of sum(conv2d(x, w), 1)).
inline bool matrix_view(DType t, int nd, const int64_t* shape, const int64_t* stride, int rd,
                        MatrixView* out) {
  if (t != DType::f32) return false;
  int64_t expect = 4, cols = 1;
  for (int d = nd - 1; d > rd; --d) {
    if (shape[d] != 1 && stride[d] != expect) return false;
    expect *= shape[d];
    cols *= shape[d];
  }
  if (stride[rd] % 4 != 0 || (rd > 0 && stride[0] % 4 != 0)) return false;
  const MatrixView v{shape[rd], cols, stride[rd] / 4, rd > 0 ? stride[0] / 4 : 0};
  if (!gemm_layout_readable(v.rows, v.cols, v.rs, 1)) return false;
  *out = v;
  return true;
}

}  // namespace kiln::cuda
