// Indexing and data movement: ONE_HOT, EMBEDDING, SCATTER_ADD_ROWS (index ops:
// they record bad indices in the node's error slot, see launch.h) and CONCAT,
// PAD, REPEAT, REPEAT_BACK. dst is contiguous; sources have any strides; the
// data-movement ops copy elements of 2 or 4 bytes whatever their dtype.
//
// SCATTER_ADD_ROWS sums without float atomics, as a segmented sum: the value
// positions k are sorted by their row (cub's radix sort, stable, so each row's
// positions stay in increasing k), each row finds its segment by binary search,
// and thread (row, column) adds its segment's values in order. Every dst
// element is the sum over k in increasing order from 0, as on the CPU (the same
// bits), and the work is O(indices + dst) instead of every thread scanning every
// index.
// REPEAT_BACK sums each dst element's tiles in row-major tile order (the CPU's).
#include <cstring>
#include <cub/device/device_radix_sort.cuh>

#include "backends/cuda/common.cuh"
#include "backends/cuda/params.h"
#include "kiln/error.h"
#include "kiln/ext/tensor_node.h"

namespace kiln::cuda {
namespace {

// Dims [0, nd-1) of t (rows of its last dim): row r -> byte offset of its first element.
Idx rows_idx(const TensorNode* t) {
  Shape o;
  int64_t st[kMaxDims] = {};
  for (int d = 0; d + 1 < t->shape.ndim(); ++d) {
    st[d] = t->stride[size_t(d)];
    o.push_back(t->shape[d]);
  }
  Idx x = make_idx(o, st, 1);
  x.dense = 0;
  return x;
}
int64_t last_stride(const TensorNode* t) {
  return t->shape.ndim() ? t->stride[size_t(t->shape.ndim() - 1)] : int64_t(t->elem_size());
}

__global__ void k_one_hot(const char* lab, Idx li, int64_t classes, float* out, int64_t n,
                          unsigned long long* err) {
  KILN_GRID_LOOP(i, n) {
    const int64_t k = i / classes, j = i % classes;
    const int32_t v = ldi(lab, li.off(k));
    if (v < 0 || v >= classes) {
      if (j == 0) report_bad(err, k);
      out[i] = 0.0f;
    } else {
      out[i] = v == j ? 1.0f : 0.0f;
    }
  }
}

__global__ void k_get_rows(const char* table, int64_t rs, int64_t cs, int64_t rows, const char* ind,
                           Idx ii, int64_t dim, int es, char* out, int64_t n,
                           unsigned long long* err) {
  KILN_GRID_LOOP(i, n) {
    const int64_t k = i / dim, c = i % dim;
    const int32_t r = ldi(ind, ii.off(k));
    if (r < 0 || r >= rows) {
      if (c == 0) report_bad(err, k);
      continue;
    }
    copy_elem(out + i * es, table + r * rs + c * cs, es);
  }
}

// keys[k] = the row of value k (rows for a bad index, sorting after all rows),
// pos[k] = k.
__global__ void k_row_keys(const char* ind, Idx ii, int64_t count, int64_t rows, uint32_t* keys,
                           int32_t* pos, unsigned long long* err) {
  KILN_GRID_LOOP(k, count) {
    const int32_t v = ldi(ind, ii.off(k));
    const bool bad = v < 0 || v >= rows;
    if (bad) report_bad(err, k);
    keys[k] = bad ? uint32_t(rows) : uint32_t(v);
    pos[k] = int32_t(k);
  }
}

// start[r] = first sorted position whose key is >= r, r in [0, rows].
__global__ void k_row_starts(const uint32_t* keys, int64_t count, int64_t rows, int32_t* start) {
  KILN_GRID_LOOP(r, rows + 1) {
    int64_t lo = 0, hi = count;
    while (lo < hi) {
      const int64_t mid = (lo + hi) / 2;
      if (int64_t(keys[mid]) < r) lo = mid + 1;
      else hi = mid;
    }
    start[r] = int32_t(lo);
  }
}

// out[r, c] = sum of value row pos[j], column c, for j in row r's segment, in order.
__global__ void k_segment_sum(const char* vals, Idx vrow, int64_t vs, const int32_t* pos,
                              const int32_t* start, int64_t rows, int64_t dim, float* out) {
  KILN_GRID_LOOP(i, rows * dim) {
    const int64_t r = i / dim, c = i % dim;
    float acc = 0.0f;
    for (int32_t j = start[r]; j < start[r + 1]; ++j) acc += ldf(vals, vrow.off(pos[j]) + c * vs);
    out[i] = acc;
  }
}

// The scratch of SCATTER_ADD_ROWS, in order, each 256-byte aligned.
struct ScatterScratch {
  int64_t count = 0, rows = 0;
  int bits = 1;         // key bits the sort looks at (keys are <= rows)
  size_t sort_tmp = 0;  // cub's temporary storage
  static size_t up(size_t b) { return (b + 255) / 256 * 256; }
  size_t keys() const { return up(size_t(count) * 4); }  // each of keys, keys', pos, pos'
  size_t starts() const { return up(size_t(rows + 1) * 4); }
  size_t total() const { return 4 * keys() + starts() + up(sort_tmp); }
};

ScatterScratch scatter_scratch(const TensorNode* dst) {
  ScatterScratch s;
  s.count = dst->src[1]->numel();
  s.rows = dst->shape[0];
  if (s.count > INT_MAX || s.rows >= INT_MAX)
    fail("scatter_add_rows", "more than 2^31 indices or rows on CUDA: ", s.count, " indices, ",
         s.rows, " rows");
  while (s.bits < 32 && (int64_t(1) << s.bits) <= s.rows) ++s.bits;
  if (s.count > 0)
    check(cub::DeviceRadixSort::SortPairs(nullptr, s.sort_tmp, static_cast<uint32_t*>(nullptr),
                                          static_cast<uint32_t*>(nullptr),
                                          static_cast<int32_t*>(nullptr),
                                          static_cast<int32_t*>(nullptr), int(s.count), 0, s.bits),
          "scatter_add_rows: sizing the sort");
  return s;
}

void scatter_add_rows(TensorNode* dst, const Launch& L) {
  const TensorNode *vals = dst->src[0], *ind = dst->src[1];
  const int64_t rows = dst->shape[0], dim = dst->shape[1];
  const ScatterScratch sc = scatter_scratch(dst);
  if (sc.count == 0) {
    check(cudaMemsetAsync(dst->data, 0, dst->nbytes(), L.stream), "scatter_add_rows: zero dst");
    return;
  }
  char* p = L.ws;
  auto* keys = reinterpret_cast<uint32_t*>(p);
  auto* keys_sorted = reinterpret_cast<uint32_t*>(p += sc.keys());
  auto* pos = reinterpret_cast<int32_t*>(p += sc.keys());
  auto* pos_sorted = reinterpret_cast<int32_t*>(p += sc.keys());
  auto* start = reinterpret_cast<int32_t*>(p += sc.keys());
  void* tmp = p + sc.starts();
  size_t tmp_bytes = sc.sort_tmp;
  k_row_keys<<<grid_for(sc.count), kThreads, 0, L.stream>>>(
      static_cast<const char*>(ind->data), idx_of(ind), sc.count, rows, keys, pos, L.err);
  check_launch("scatter_add_rows");
  check(cub::DeviceRadixSort::SortPairs(tmp, tmp_bytes, keys, keys_sorted, pos, pos_sorted,
                                        int(sc.count), 0, sc.bits, L.stream),
        "scatter_add_rows: sorting the indices");
  k_row_starts<<<grid_for(rows + 1), kThreads, 0, L.stream>>>(keys_sorted, sc.count, rows, start);
  check_launch("scatter_add_rows");
  k_segment_sum<<<grid_for(rows * dim), kThreads, 0, L.stream>>>(
      static_cast<const char*>(vals->data), rows_idx(vals), last_stride(vals), pos_sorted, start,
      rows, dim, static_cast<float*>(dst->data));
  check_launch("scatter_add_rows");
}

// Multi-index helpers over up to 4 dims.
struct Geo {
  int nd;
  int64_t shape[kMaxDims];  // dst's
  int64_t s0[kMaxDims];     // byte strides of the first source
  int64_t s1[kMaxDims];     // source shape (PAD, REPEAT, REPEAT_BACK)
  int64_t aux[kMaxDims];    // PAD: before per dim
};

__device__ inline void unravel(int64_t i, const Geo& g, int64_t* idx) {
  for (int d = g.nd - 1; d >= 0; --d) {
    idx[d] = i % g.shape[d];
    i /= g.shape[d];
  }
}

// CONCAT's parts (2 to kMaxSrc): part k fills [end[k - 1], end[k]) of dim.
struct ConcatGeo {
  int nd, n, dim;
  int64_t shape[kMaxDims];        // dst's
  int64_t st[kMaxSrc][kMaxDims];  // byte strides of each part
  int64_t end[kMaxSrc];           // where each part ends along dim
  const char* p[kMaxSrc];
};

__global__ void k_concat(ConcatGeo g, int es, char* out, int64_t n) {
  KILN_GRID_LOOP(i, n) {
    int64_t idx[kMaxDims];
    int64_t r = i;
    for (int d = g.nd - 1; d >= 0; --d) {
      idx[d] = r % g.shape[d];
      r /= g.shape[d];
    }
    int k = 0;  // by position: concat({x, x}) has one source twice
    while (k + 1 < g.n && idx[g.dim] >= g.end[k]) ++k;
    if (k > 0) idx[g.dim] -= g.end[k - 1];
    int64_t off = 0;
    for (int d = 0; d < g.nd; ++d) off += idx[d] * g.st[k][d];
    copy_elem(out + i * es, g.p[k] + off, es);
  }
}

__global__ void k_pad(const char* x, Geo g, uint32_t bits, int es, char* out, int64_t n) {
  KILN_GRID_LOOP(i, n) {
    int64_t idx[kMaxDims];
    unravel(i, g, idx);
    bool inside = true;
    int64_t off = 0;
    for (int d = 0; d < g.nd; ++d) {
      const int64_t j = idx[d] - g.aux[d];
      inside = inside && j >= 0 && j < g.s1[d];
      off += j * g.s0[d];
    }
    if (inside) {
      copy_elem(out + i * es, x + off, es);
    } else if (es == 4) {
      *reinterpret_cast<uint32_t*>(out + i * es) = bits;
    } else {
      *reinterpret_cast<uint16_t*>(out + i * es) = uint16_t(bits);
    }
  }
}

__global__ void k_repeat(const char* x, Geo g, int es, char* out, int64_t n) {
  KILN_GRID_LOOP(i, n) {
    int64_t idx[kMaxDims];
    unravel(i, g, idx);
    int64_t off = 0;
    for (int d = 0; d < g.nd; ++d) off += (idx[d] % g.s1[d]) * g.s0[d];
    copy_elem(out + i * es, x + off, es);
  }
}

// dst[j] = sum over the tiles t (row-major over all dims) of g[j + t * dst.shape].
__global__ void k_repeat_back(const char* src, Geo g, int64_t tiles, float* out, int64_t n) {
  KILN_GRID_LOOP(i, n) {
    int64_t idx[kMaxDims];
    unravel(i, g, idx);
    float acc = 0.0f;
    for (int64_t t = 0; t < tiles; ++t) {
      int64_t rem = t, off = 0;
      for (int d = g.nd - 1; d >= 0; --d) {
        const int64_t reps = g.s1[d] / g.shape[d];
        off += (idx[d] + (rem % reps) * g.shape[d]) * g.s0[d];
        rem /= reps;
      }
      acc += ldf(src, off);
    }
    out[i] = acc;
  }
}

Geo geo_of(const TensorNode* dst) {
  Geo g{};
  g.nd = dst->shape.ndim();
  for (int d = 0; d < g.nd; ++d) g.shape[d] = dst->shape[d];
  return g;
}

}  // namespace

void index_ops(TensorNode* dst, const Launch& L) {
  switch (dst->op) {
    case Op::ONE_HOT: {
      const TensorNode* lab = dst->src[0];
      const int64_t classes = prm::one_hot_classes(dst), n = dst->numel();
      if (n == 0) return;
      k_one_hot<<<grid_for(n), kThreads, 0, L.stream>>>(static_cast<const char*>(lab->data),
                                                        idx_of(lab), classes,
                                                        static_cast<float*>(dst->data), n, L.err);
      return check_launch("one_hot");
    }
    case Op::EMBEDDING: {
      const TensorNode *table = dst->src[0], *ind = dst->src[1];
      const int64_t dim = table->shape[1], n = ind->numel() * dim;
      if (n == 0) return;
      k_get_rows<<<grid_for(n), kThreads, 0, L.stream>>>(
          static_cast<const char*>(table->data), table->stride[0], table->stride[1],
          table->shape[0], static_cast<const char*>(ind->data), idx_of(ind), dim,
          int(table->elem_size()), static_cast<char*>(dst->data), n, L.err);
      return check_launch("embedding");
    }
    case Op::SCATTER_ADD_ROWS:
      if (dst->numel() == 0) return;
      return scatter_add_rows(dst, L);
    default: fail("cuda", "index_ops got ", op_name(dst->op));
  }
}

size_t index_workspace(const TensorNode* dst) {
  if (dst->op != Op::SCATTER_ADD_ROWS || dst->numel() == 0) return 0;
  return scatter_scratch(dst).total();
}

void layout_ops(TensorNode* dst, const Launch& L) {
  const int64_t n = dst->numel();
  if (n == 0) return;
  const TensorNode* a = dst->src[0];
  const int es = int(dst->elem_size());
  char* out = static_cast<char*>(dst->data);
  const char* ap = static_cast<const char*>(a->data);
  Geo g = geo_of(dst);
  switch (dst->op) {
    case Op::CONCAT: {
      ConcatGeo c{};
      c.nd = g.nd;
      c.n = dst->n_src;
      c.dim = prm::concat_dim(dst);
      int64_t end = 0;
      for (int d = 0; d < g.nd; ++d) c.shape[d] = g.shape[d];
      for (int k = 0; k < c.n; ++k) {
        const TensorNode* x = dst->src[k];
        for (int d = 0; d < g.nd; ++d) c.st[k][d] = x->stride[size_t(d)];
        end += x->shape[c.dim];
        c.end[k] = end;
        c.p[k] = static_cast<const char*>(x->data);
      }
      k_concat<<<grid_for(n), kThreads, 0, L.stream>>>(c, es, out, n);
      return check_launch("concat");
    }
    case Op::PAD:
      for (int d = 0; d < g.nd; ++d) {
        g.s0[d] = a->stride[size_t(d)];
        g.s1[d] = a->shape[d];
        g.aux[d] = prm::pad_before(dst, d);
      }
      k_pad<<<grid_for(n), kThreads, 0, L.stream>>>(
          ap, g, fill_bits(dst->dtype, prm::pad_value(dst)), es, out, n);
      return check_launch("pad");
    case Op::REPEAT:
      for (int d = 0; d < g.nd; ++d) {
        g.s0[d] = a->stride[size_t(d)];
        g.s1[d] = a->shape[d];
      }
      k_repeat<<<grid_for(n), kThreads, 0, L.stream>>>(ap, g, es, out, n);
      return check_launch("repeat");
    case Op::REPEAT_BACK: {
      int64_t tiles = 1;
      for (int d = 0; d < g.nd; ++d) {
        g.s0[d] = a->stride[size_t(d)];
        g.s1[d] = a->shape[d];
        tiles *= a->shape[d] / dst->shape[d];
      }
      k_repeat_back<<<grid_for(n), kThreads, 0, L.stream>>>(ap, g, tiles,
                                                            reinterpret_cast<float*>(out), n);
      return check_launch("repeat_back");
    }
    default: fail("cuda", "layout_ops got ", op_name(dst->op));
  }
}

OpKernel index_kernel(Op op) {
  switch (op) {
    case Op::ONE_HOT:
      return {[](const TensorNode* n) {
                return n->dtype == DType::f32 && n->src[0]->dtype == DType::i32;
              },
              index_ops, nullptr, true};
    case Op::EMBEDDING:
      return {[](const TensorNode* n) {
                return n->src[0]->shape.ndim() == 2 && n->src[1]->dtype == DType::i32 &&
                       n->dtype == n->src[0]->dtype;
              },
              index_ops, nullptr, true};
    case Op::SCATTER_ADD_ROWS:
      return {[](const TensorNode* n) {
                return n->dtype == DType::f32 && n->src[0]->dtype == DType::f32 &&
                       n->src[1]->dtype == DType::i32;
              },
              index_ops, index_workspace, true};
    case Op::CONCAT:
      return {[](const TensorNode* n) {
                for (int k = 0; k < n->n_src; ++k)
                  if (n->src[k]->dtype != n->dtype) return false;
                return true;
              },
              layout_ops};
    case Op::PAD:
    case Op::REPEAT:
      return {[](const TensorNode* n) { return n->src[0]->dtype == n->dtype; }, layout_ops};
    case Op::REPEAT_BACK: return {all_f32, layout_ops};
    default: return {};
  }
}

}  // namespace kiln::cuda
