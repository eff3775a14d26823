// Copies and constants: COPY (with dtype conversion), FULL, RAND_MASK.
#include <cstring>

#include "backends/cpu/kernels/common.h"
#include "backends/cpu/kernels/kernels.h"
#include "kiln/ext/rng.h"
#include "kiln/ext/tensor_node.h"

namespace kiln::cpu {

namespace {

// Byte offset of row r (a row: the last dim) of n, whose leading dims are
// walked in row-major order with their strides.
int64_t row_offset(const TensorNode* n, int64_t r) {
  int64_t off = 0;
  for (int d = n->shape.ndim() - 2; d >= 0; --d) {
    off += (r % n->shape[d]) * n->stride[d];
    r /= n->shape[d];
  }
  return off;
}

// Quantize (f32 -> q8_0/q4_0) or dequantize (q -> f32) row by row; the
// quantized side's rows are whole blocks (the builder checked it), the f32
// side has any strides.
void copy_quantized(TensorNode* dst, const TensorNode* src, ThreadCtx& t) {
  const int nd = src->shape.ndim();
  const int64_t k = src->shape[nd - 1], rows = k > 0 ? src->numel() / k : 0;
  const Range r = thread_range(t, rows, k, 1);
  if (r.empty()) return;
  const bool quantize = is_quantized(dst->dtype);
  const TensorNode* f = quantize ? src : dst;  // the f32 side
  const int64_t fs = f->stride[nd - 1];
  float* tmp = fs == 4 ? nullptr : static_cast<float*>(t.scratch(size_t(k) * sizeof(float)));
  for (int64_t i = r.begin; i < r.end; ++i) {
    char* s = static_cast<char*>(src->data) + row_offset(src, i);
    char* d = static_cast<char*>(dst->data) + row_offset(dst, i);
    if (quantize) {
      const float* x = reinterpret_cast<const float*>(s);
      if (tmp) {
        for (int64_t c = 0; c < k; ++c) std::memcpy(tmp + c, s + c * fs, 4);
        x = tmp;
      }
      quantize_row(dst->dtype, x, d, k);
    } else {
      dequantize_row(src->dtype, s, tmp ? tmp : reinterpret_cast<float*>(d), k);
      if (tmp)
        for (int64_t c = 0; c < k; ++c) std::memcpy(d + c * fs, tmp + c, 4);
    }
  }
}

// n bytes from s to d, which do not overlap, for the short runs of a permuted
// copy (a [B, H, T, E] attention output to [B, T, H, E]: runs of E elements):
// whole vectors and a masked tail in line, where a memmove call per run cost
// as much as the bytes it moved.
inline void copy_run(char* d, const char* s, int64_t n) {
#if defined(__AVX512BW__)
  for (; n >= 64; n -= 64, d += 64, s += 64) _mm512_storeu_si512(d, _mm512_loadu_si512(s));
  if (n > 0) {
    const __mmask64 m = (__mmask64(1) << n) - 1;
    _mm512_mask_storeu_epi8(d, m, _mm512_maskz_loadu_epi8(m, s));
  }
#else
  std::memcpy(d, s, size_t(n));
#endif
}

// Runs up to this many bytes go through copy_run.
constexpr int64_t kShortRunBytes = 512;

}  // namespace

// dst = convert(src0). src0 has any strides and dtype; dst is contiguous with the
// same number of elements (its shape may differ: a copy that feeds a reshape), or
// has src0's shape and any strides. Elements go in src0's row-major order.
// Quantized tensors convert to and from f32 only, with src0's shape.
void kernel_COPY(TensorNode* dst, ThreadCtx& t) {
  const TensorNode* src = dst->src[0];
  if (is_quantized(dst->dtype) || is_quantized(src->dtype)) {
    KILN_ASSERT(dst->shape == src->shape);
    copy_quantized(dst, src, t);
    return;
  }
  const int64_t n = src->numel();
  Range r = thread_range(t, n, 1, 64);
  if (r.empty()) return;
  const Strides ds =
      dst->shape == src->shape ? dst->stride : dense_strides(src->shape, int64_t(dst->elem_size()));
  auto L = make_layout<2>(src->shape, {ds, src->stride});
  const DType dt = dst->dtype, st = src->dtype;
  const int64_t es = int64_t(dst->elem_size());
  for_each_run(L, {(char*)dst->data, (char*)src->data}, r.begin, r.end,
               [&](const Ptrs<2>& p, int64_t len, const Steps<2>& step) {
                 const int64_t bytes = len * es;
                 if (dt == st && step[0] == es && step[1] == es && bytes <= kShortRunBytes &&
                     (p[0] + bytes <= p[1] || p[1] + bytes <= p[0]))
                   copy_run(p[0], p[1], bytes);
                 else convert(p[1], st, step[1], p[0], dt, step[0], len);
               });
}

// Every element = f[0] (converted to dst's dtype; i32 truncates).
void kernel_FULL(TensorNode* dst, ThreadCtx& t) {
  const int64_t n = dst->numel();
  Range r = thread_range(t, n, 1, 64);
  if (r.empty()) return;
  const DType dt = dst->dtype;
  const int64_t es = int64_t(dst->elem_size());
  alignas(4) unsigned char pat[4] = {};
  store_f32(pat, dt, op_params<Op::FULL>(*dst).value);
  const bool zero = std::memcmp(pat, "\0\0\0\0", size_t(es)) == 0;
  auto L = make_layout<1>(dst->shape, {dst->stride});
  for_each_run(L, {(char*)dst->data}, r.begin, r.end,
               [&](const Ptrs<1>& p, int64_t len, const Steps<1>& st) {
                 if (st[0] == es && zero) {
                   std::memset(p[0], 0, size_t(len * es));
                 } else if (st[0] == es && es == 4) {
                   uint32_t v;
                   std::memcpy(&v, pat, 4);
                   std::fill_n((uint32_t*)p[0], len, v);
                 } else if (st[0] == es) {
                   uint16_t v;
                   std::memcpy(&v, pat, 2);
                   std::fill_n((uint16_t*)p[0], len, v);
                 } else {
                   for (int64_t i = 0; i < len; ++i) std::memcpy(p[0] + i * st[0], pat, size_t(es));
                 }
               });
}

// dst[k] = rng_uniform(seed, k) < f[0] ? 1 : 0 for linear index k, with seed =
// The seed param xor element 0 of the optional i32 seed tensor (sign-extended to 64 bits).
void kernel_RAND_MASK(TensorNode* dst, ThreadCtx& t) {
  const int64_t n = dst->numel();
  Range r = thread_range(t, n, 8, 64);
  if (r.empty()) return;
  const RandMaskParams prm = op_params<Op::RAND_MASK>(*dst);
  uint64_t seed = uint64_t(prm.seed);
  if (dst->n_src > 0 && dst->src[0] != nullptr) {
    int32_t s;
    std::memcpy(&s, dst->src[0]->data, 4);
    seed ^= uint64_t(int64_t(s));
  }
  const float p = prm.keep;
  auto L = make_layout<1>(dst->shape, {dst->stride});
  int64_t k = r.begin;
  for_each_run(L, {(char*)dst->data}, r.begin, r.end,
               [&](const Ptrs<1>& ptr, int64_t len, const Steps<1>& st) {
                 for (int64_t i = 0; i < len; ++i, ++k) {
                   float v = detail::rng_uniform(seed, uint64_t(k)) < p ? 1.0f : 0.0f;
                   std::memcpy(ptr[0] + i * st[0], &v, 4);
                 }
               });
}

}  // namespace kiln::cpu
