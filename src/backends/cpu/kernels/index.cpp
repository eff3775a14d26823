// Indexing and data-movement kernels: ONE_HOT, EMBEDDING (f32, f16, bf16 or
// q8_0 / q4_0 tables), SCATTER_ADD_ROWS, CONCAT, PAD, REPEAT, REPEAT_BACK. dst
// is contiguous; sources may have any strides. Work is split by whole output
// rows (or columns), each output element is written by one thread in a fixed
// order, so results do not depend on the thread count. Index/label range
// errors are found by every thread scanning all indices first, so the reported
// position is the first bad one whatever the thread count (and no thread writes
// before the check).
#include <algorithm>
#include <cstring>

#include "backends/cpu/kernels/common.h"
#include "backends/cpu/kernels/kernels.h"
#include "kiln/dtype.h"
#include "kiln/ext/tensor_node.h"

namespace kiln::cpu {

namespace {

// Thread t's items of [0, n), each costing about `cost` cheap operations; small
// jobs stay on fewer threads (common.h). Item values never depend on the split.
std::pair<int64_t, int64_t> items(const ThreadCtx& t, int64_t n, int64_t cost) {
  const Range r = thread_range(t, n, std::max<int64_t>(cost, 1), 1);
  return {r.begin, std::max(r.begin, r.end)};
}

int64_t last_dim(const TensorNode* n) {
  return n->shape.ndim() > 0 ? n->shape[n->shape.ndim() - 1] : 1;
}
int64_t last_stride(const TensorNode* n) {
  return n->shape.ndim() > 0 ? n->stride[n->shape.ndim() - 1] : int64_t(n->elem_size());
}

// Byte offset of element `i` (row-major linear index) of n.
int64_t elem_offset(const TensorNode* n, int64_t i) {
  int64_t off = 0;
  for (int d = n->shape.ndim() - 1; d >= 0; --d) {
    off += (i % n->shape[d]) * n->stride[d];
    i /= n->shape[d];
  }
  return off;
}

// Byte offset of row `r` (all dims but the last, row-major) of n.
int64_t row_offset(const TensorNode* n, int64_t r) {
  int64_t off = 0;
  for (int d = n->shape.ndim() - 2; d >= 0; --d) {
    off += (r % n->shape[d]) * n->stride[d];
    r /= n->shape[d];
  }
  return off;
}

// Multi-index (dims [0, nd-1)) of row r of a shape.
void row_index(const Shape& s, int64_t r, int64_t* idx) {
  for (int d = s.ndim() - 2; d >= 0; --d) {
    idx[d] = r % s[d];
    r /= s[d];
  }
}

// Reads the i32 element `k` of an index tensor (any strides).
struct IndexReader {
  const TensorNode* n;
  bool contiguous;
  explicit IndexReader(const TensorNode* t) : n(t), contiguous(t->is_contiguous()) {}
  int32_t operator()(int64_t k) const {
    const char* p = static_cast<const char*>(n->data) + (contiguous ? k * 4 : elem_offset(n, k));
    int32_t v;
    std::memcpy(&v, p, 4);
    return v;
  }
};

// Position of the first index outside [0, limit), or -1.
int64_t first_bad_index(const IndexReader& rd, int64_t count, int64_t limit) {
  for (int64_t k = 0; k < count; ++k) {
    const int32_t v = rd(k);
    if (v < 0 || v >= limit) return k;
  }
  return -1;
}

// Copies n elements of es bytes from a strided source into contiguous d.
void copy_elems(char* d, const char* s, int64_t n, int64_t sstride, size_t es) {
  if (sstride == int64_t(es)) {
    std::memcpy(d, s, size_t(n) * es);
  } else if (es == 4) {
    for (int64_t i = 0; i < n; ++i) std::memcpy(d + i * 4, s + i * sstride, 4);
  } else {
    for (int64_t i = 0; i < n; ++i) std::memcpy(d + i * es, s + i * sstride, es);
  }
}

// The fill value of PAD as the bit pattern of dst's dtype.
uint32_t fill_bits(DType t, float v) {
  uint32_t b = 0;
  switch (t) {
    case DType::f32: std::memcpy(&b, &v, 4); break;
    case DType::i32: {
      const int32_t iv = int32_t(v);
      std::memcpy(&b, &iv, 4);
      break;
    }
    case DType::f16: b = f32_to_f16(v); break;
    case DType::bf16: b = f32_to_bf16(v); break;
    default: break;  // quantized: PAD refuses quantized tensors
  }
  return b;
}

void fill_elems(char* d, int64_t n, uint32_t bits, size_t es) {
  if (es == 4) {
    uint32_t* p = reinterpret_cast<uint32_t*>(d);
    std::fill(p, p + n, bits);
  } else {
    uint16_t* p = reinterpret_cast<uint16_t*>(d);
    std::fill(p, p + n, uint16_t(bits));
  }
}

}  // namespace

void kernel_ONE_HOT(TensorNode* dst, ThreadCtx& t) {
  const TensorNode* labels = dst->src[0];
  const OneHotParams prm = op_params<Op::ONE_HOT>(*dst);
  const int64_t classes = prm.classes, count = labels->numel();
  const IndexReader rd(labels);
  const auto [k0, k1] = items(t, count, classes);
  if (k0 >= k1) return;  // some thread has work, and it reports bad labels
  const int64_t bad = first_bad_index(rd, count, classes);
  if (bad >= 0)
    fail(prm.for_cross_entropy ? "cross_entropy" : "one_hot", "label ", rd(bad), " at position ",
         bad, " is out of range [0, ", classes, ")");
  float* out = static_cast<float*>(dst->data);
  std::fill(out + k0 * classes, out + k1 * classes, 0.0f);
  for (int64_t k = k0; k < k1; ++k) out[k * classes + rd(k)] = 1.0f;
}

void kernel_EMBEDDING(TensorNode* dst, ThreadCtx& t) {
  const TensorNode* table = dst->src[0];
  const IndexReader rd(dst->src[1]);
  const int64_t rows = table->shape[0], dim = table->shape[1], count = dst->src[1]->numel();
  if (count == 0 || dim == 0) return;
  // A quantized table's row is split only between its blocks (dim is whole blocks).
  const int64_t unit = dtype_block_elems(table->dtype), units = dim / unit;
  // Few rows (e.g. one token at inference): also split each row into column blocks.
  int64_t nb = 1;
  if (count < t.nth)
    nb = std::clamp<int64_t>((t.nth + count - 1) / count, 1, std::min(units, (dim + 255) / 256));
  const auto [u0, u1] = items(t, count * nb, dim / nb);
  if (u0 >= u1) return;  // some thread has work, and it reports bad indices
  const int64_t bad = first_bad_index(rd, count, rows);
  if (bad >= 0)
    fail("embedding", "index ", rd(bad), " at position ", bad, " is out of range for ", rows,
         " rows");
  const int64_t ed = int64_t(dst->elem_size());
  for (int64_t u = u0; u < u1; ++u) {
    const int64_t k = u / nb, b = u % nb;
    const int64_t c0 = units * b / nb * unit, c1 = units * (b + 1) / nb * unit;
    // Quantized: stride[1] is one block, so this is block c0 / unit of the row.
    const char* src = static_cast<const char*>(table->data) + rd(k) * table->stride[0] +
                      c0 / unit * table->stride[1];
    char* d = static_cast<char*>(dst->data) + (k * dim + c0) * ed;
    if (is_quantized(table->dtype)) {  // the row's blocks, dequantized (dst is f32)
      dequantize_row(table->dtype, src, reinterpret_cast<float*>(d), c1 - c0);
    } else {  // an f16/bf16 table gives f32 rows (convert copies when the dtypes agree)
      convert(src, table->dtype, table->stride[1], d, dst->dtype, ed, c1 - c0);
    }
  }
}

void kernel_SCATTER_ADD_ROWS(TensorNode* dst, ThreadCtx& t) {
  const TensorNode* vals = dst->src[0];
  const IndexReader rd(dst->src[1]);
  const int64_t rows = dst->shape[0], dim = dst->shape[1], count = dst->src[1]->numel();
  float* out = static_cast<float*>(dst->data);
  const int64_t vs = last_stride(vals);
  // Every element is summed over k in increasing order, so both splits below give
  // the same bits. Wide rows: each thread owns a block of columns of every row
  // (balanced whatever the indices). Narrow rows: each thread owns a block of rows.
  // Threads used: enough for the adds and the zeroing of dst (common.h).
  const int nth = useful_threads(1, t.nth, count * dim + rows * dim);
  if (t.ith >= nth) return;
  const bool by_cols = dim >= 16 * int64_t(nth);
  int64_t c0 = 0, c1 = dim, v0 = 0, v1 = rows;
  if (by_cols) {
    const Range r = split_range(dim, t.ith, nth, 16);
    c0 = r.begin;
    c1 = r.end;
  } else {
    const Range r = split_range(rows, t.ith, nth);
    v0 = r.begin;
    v1 = r.end;
  }
  if (c0 >= c1 || v0 >= v1) return;
  const int64_t bad = first_bad_index(rd, count, rows);
  if (bad >= 0)
    fail("scatter_add_rows", "index ", rd(bad), " at position ", bad, " is out of range for ", rows,
         " rows");
  for (int64_t v = v0; v < v1; ++v) std::fill(out + v * dim + c0, out + v * dim + c1, 0.0f);
  for (int64_t k = 0; k < count; ++k) {
    const int64_t v = rd(k);
    if (v < v0 || v >= v1) continue;
    const char* src = static_cast<const char*>(vals->data) + row_offset(vals, k);
    float* d = out + v * dim;
    if (vs == 4) {
      const float* s = reinterpret_cast<const float*>(src);
      for (int64_t c = c0; c < c1; ++c) d[c] += s[c];
    } else {
      for (int64_t c = c0; c < c1; ++c) {
        float x;
        std::memcpy(&x, src + c * vs, 4);
        d[c] += x;
      }
    }
  }
}

// Strided copies of the parts (2 to kMaxSrc) into consecutive slabs of dim,
// each walked as runs (dims merged where both sides are contiguous), the
// elements of all parts split over the threads as one range.
void kernel_CONCAT(TensorNode* dst, ThreadCtx& t) {
  const int dim = int(op_params<Op::CONCAT>(*dst).dim);
  const int64_t es = int64_t(dst->elem_size());
  const Strides ds = dense_strides(dst->shape, es);
  const Range r = thread_range(t, dst->numel(), 1, 64);
  if (r.empty()) return;
  int64_t start = 0;  // the part's first element in the split range
  int64_t slab = 0;   // the part's first index along dim
  for (int k = 0; k < dst->n_src; ++k) {
    const TensorNode* x = dst->src[k];
    const int64_t lo = std::max(r.begin, start), hi = std::min(r.end, start + x->numel());
    if (lo < hi) {
      char* base = static_cast<char*>(dst->data) + slab * ds[dim];
      const auto L = make_layout<2>(x->shape, {ds, x->stride});
      for_each_run(L, {base, static_cast<char*>(x->data)}, lo - start, hi - start,
                   [&](const Ptrs<2>& p, int64_t len, const Steps<2>& st) {
                     if (st[0] == es && st[1] == es) std::memcpy(p[0], p[1], size_t(len * es));
                     else
                       for (int64_t i = 0; i < len; ++i)
                         std::memcpy(p[0] + i * st[0], p[1] + i * st[1], size_t(es));
                   });
    }
    start += x->numel();
    slab += x->shape[dim];
  }
}

void kernel_PAD(TensorNode* dst, ThreadCtx& t) {
  const TensorNode* x = dst->src[0];
  const int nd = dst->shape.ndim();
  const int64_t cols = last_dim(dst), rows = dst->numel() / std::max<int64_t>(cols, 1);
  const size_t es = dst->elem_size();
  const PadParams p = op_params<Op::PAD>(*dst);
  const uint32_t bits = fill_bits(dst->dtype, p.value);
  const int64_t before = nd > 0 ? p.before[size_t(nd - 1)] : 0, xcols = last_dim(x);
  const auto [r0, r1] = items(t, rows, cols);
  int64_t idx[kMaxDims] = {};
  for (int64_t r = r0; r < r1; ++r) {
    row_index(dst->shape, r, idx);
    char* d = static_cast<char*>(dst->data) + r * cols * int64_t(es);
    bool inside = true;
    int64_t off = 0;
    for (int k = 0; k < nd - 1; ++k) {
      const int64_t j = idx[k] - p.before[size_t(k)];
      inside = inside && j >= 0 && j < x->shape[k];
      off += j * x->stride[k];
    }
    if (!inside) {
      fill_elems(d, cols, bits, es);
      continue;
    }
    fill_elems(d, before, bits, es);
    copy_elems(d + before * int64_t(es), static_cast<const char*>(x->data) + off, xcols,
               last_stride(x), es);
    fill_elems(d + (before + xcols) * int64_t(es), cols - before - xcols, bits, es);
  }
}

void kernel_REPEAT(TensorNode* dst, ThreadCtx& t) {
  const TensorNode* x = dst->src[0];
  const int nd = dst->shape.ndim();
  const int64_t cols = last_dim(dst), rows = dst->numel() / std::max<int64_t>(cols, 1);
  const int64_t xcols = last_dim(x);
  const size_t es = dst->elem_size();
  const size_t row_bytes = size_t(xcols) * es;
  const auto [r0, r1] = items(t, rows, cols);
  int64_t idx[kMaxDims] = {};
  for (int64_t r = r0; r < r1; ++r) {
    row_index(dst->shape, r, idx);
    int64_t off = 0;
    for (int k = 0; k < nd - 1; ++k) off += (idx[k] % x->shape[k]) * x->stride[k];
    char* d = static_cast<char*>(dst->data) + r * cols * int64_t(es);
    copy_elems(d, static_cast<const char*>(x->data) + off, xcols, last_stride(x), es);
    for (int64_t c = xcols; c < cols; c += xcols) std::memcpy(d + c * int64_t(es), d, row_bytes);
  }
}

void kernel_REPEAT_BACK(TensorNode* dst, ThreadCtx& t) {
  const TensorNode* g = dst->src[0];
  const int nd = dst->shape.ndim();
  const int64_t cols = last_dim(dst), rows = dst->numel() / std::max<int64_t>(cols, 1);
  const int64_t reps_last = last_dim(g) / std::max<int64_t>(cols, 1), gs = last_stride(g);
  int64_t tiles = 1;  // tiles over the outer dims
  for (int k = 0; k < nd - 1; ++k) tiles *= g->shape[k] / dst->shape[k];
  const auto [r0, r1] = items(t, rows, cols * tiles * reps_last);
  int64_t idx[kMaxDims] = {}, tile[kMaxDims] = {};
  for (int64_t r = r0; r < r1; ++r) {
    row_index(dst->shape, r, idx);
    float* y = static_cast<float*>(dst->data) + r * cols;
    std::fill(y, y + cols, 0.0f);
    for (int k = 0; k < nd - 1; ++k) tile[k] = 0;
    for (int64_t tt = 0; tt < tiles; ++tt) {
      int64_t off = 0;
      for (int k = 0; k < nd - 1; ++k) off += (idx[k] + tile[k] * dst->shape[k]) * g->stride[k];
      const char* src = static_cast<const char*>(g->data) + off;
      for (int64_t tl = 0; tl < reps_last; ++tl) {
        const char* s = src + tl * cols * gs;
        if (gs == 4) {
          const float* sp = reinterpret_cast<const float*>(s);
          for (int64_t c = 0; c < cols; ++c) y[c] += sp[c];
        } else {
          for (int64_t c = 0; c < cols; ++c) {
            float v;
            std::memcpy(&v, s + c * gs, 4);
            y[c] += v;
          }
        }
      }
      for (int k = nd - 2; k >= 0; --k) {  // next tile (row-major)
        if (++tile[k] < g->shape[k] / dst->shape[k]) break;
        tile[k] = 0;
      }
    }
  }
}

}  // namespace kiln::cpu
