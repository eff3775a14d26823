// The reference's dispatch (generated from ops.def) and shared helpers.
#include "ops/reference/reference.h"

#include <cmath>
#include <sstream>

#include "kiln/dtype.h"
#include "kiln/ext/tensor_node.h"

namespace kiln::test {

namespace {

using RefFn = RefValue (*)(const RefArgs&);

// One entry per op, in enum order; a missing ref_<ENUM> does not link.
constexpr RefFn kRefTable[] = {
#define KILN_OP(e, family, kind, inplace, grad) &ref_##e,
#include "kiln/ops.def"
#undef KILN_OP
};
static_assert(sizeof(kRefTable) / sizeof(kRefTable[0]) == size_t(Op::COUNT));

std::string node_label(const TensorNode* n) {
  std::ostringstream os;
  os << "[" << op_name(n->op) << "]";
  if (!n->name.empty()) os << " '" << n->name << "'";
  return os.str();
}

}  // namespace

const RefValue& RefArgs::in(int i) const {
  if (i >= n_src || src[i] == nullptr) ref_fail(node, "source " + std::to_string(i) + " missing");
  return *src[i];
}

void ref_fail(const TensorNode* node, const std::string& msg) {
  throw RefError("reference " + node_label(node) + " node #" + std::to_string(node->id) + ": " +
                 msg);
}

void ref_check_shape(const TensorNode* node, const Shape& expected) {
  if (!(node->shape == expected))
    ref_fail(node,
             "node shape is " + node->shape.str() + " but by definition it is " + expected.str());
}

RefValue ref_out(const TensorNode* node) {
  RefValue r;
  r.dtype = node->dtype;
  r.shape = node->shape;
  r.v.assign(size_t(node->shape.numel()), 0.0);
  return r;
}

RefValue ref_out(const TensorNode* node, const Shape& expected) {
  ref_check_shape(node, expected);
  return ref_out(node);
}

bool Index::next() {
  for (int d = shape.ndim() - 1; d >= 0; --d) {
    if (++i[d] < shape[d]) return true;
    i[d] = 0;
  }
  return false;
}

int64_t ref_linear(const Shape& s, const int64_t* idx) {
  int64_t l = 0;
  for (int d = 0; d < s.ndim(); ++d) l = l * s[d] + idx[d];
  return l;
}

double ref_bcast_at(const RefValue& v, const int64_t* out_idx, int out_nd) {
  const int nd = v.shape.ndim();
  int64_t idx[kMaxDims] = {};
  for (int d = 0; d < nd; ++d) {
    const int od = out_nd - nd + d;
    idx[d] = v.shape[d] == 1 ? 0 : out_idx[od];
  }
  return v.v[size_t(ref_linear(v.shape, idx))];
}

Shape ref_bcast_shape(const TensorNode* node, const Shape& a, const Shape& b) {
  const int nd = std::max(a.ndim(), b.ndim());
  Shape r;
  for (int d = 0; d < nd; ++d) {
    const int da = d - (nd - a.ndim()), db = d - (nd - b.ndim());
    const int64_t x = da >= 0 ? a[da] : 1, y = db >= 0 ? b[db] : 1;
    if (x != y && x != 1 && y != 1)
      ref_fail(node, "cannot broadcast " + a.str() + " with " + b.str());
    r.push_back(x == 1 ? y : x);
  }
  return r;
}

double ref_round_to(DType t, double x) {
  switch (t) {
    case DType::f32: return x;  // the reference keeps double precision for f32
    case DType::f16: return f16_to_f32(f32_to_f16(float(x)));
    case DType::bf16: return bf16_to_f32(f32_to_bf16(float(x)));
    case DType::i32: return std::trunc(x);
    default: break;  // quantized: by rows only, ref_round_rows_to
  }
  return x;
}

void ref_round_rows_to(DType t, std::vector<double>& v, int64_t k) {
  std::vector<float> row(static_cast<size_t>(k)), back(static_cast<size_t>(k));
  std::vector<uint8_t> q(dtype_row_bytes(t, k));
  for (size_t r = 0; k > 0 && r < v.size() / size_t(k); ++r) {
    for (int64_t c = 0; c < k; ++c) row[size_t(c)] = float(v[r * size_t(k) + size_t(c)]);
    quantize_row(t, row.data(), q.data(), k);
    dequantize_row(t, q.data(), back.data(), k);
    for (int64_t c = 0; c < k; ++c) v[r * size_t(k) + size_t(c)] = back[size_t(c)];
  }
}

RefValue ref_eval_node(const TensorNode* node, const RefValues& vals,
                       std::vector<std::pair<const TensorNode*, RefValue>>* writes) {
  RefArgs a;
  a.node = node;
  a.n_src = node->n_src;
  for (int i = 0; i < node->n_src; ++i) {
    auto it = vals.find(node->src[i]);
    if (it == vals.end())
      ref_fail(node, "source " + std::to_string(i) + " (node #" + std::to_string(node->src[i]->id) +
                         ", " + op_name(node->src[i]->op) + ") has no value");
    a.src[i] = &it->second;
  }
  RefValue r = kRefTable[size_t(node->op)](a);
  if (!(r.shape == node->shape) || r.v.size() != size_t(node->shape.numel()))
    ref_fail(node, "reference produced shape " + r.shape.str() + " for a node of shape " +
                       node->shape.str());
  r.dtype = node->dtype;
  if (writes) *writes = std::move(a.writes);
  return r;
}

void ref_eval(std::span<TensorNode* const> nodes, RefValues& vals) {
  std::vector<std::pair<const TensorNode*, RefValue>> writes;
  for (TensorNode* n : nodes) {
    RefValue r = ref_eval_node(n, vals, &writes);
    if (op_kind(n->op) == OpKind::ALIAS && n->n_src > 0) vals[n->src[0]] = r;
    for (auto& [t, v] : writes) vals[t] = std::move(v);
    vals[n] = std::move(r);
  }
}

}  // namespace kiln::test
