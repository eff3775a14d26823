// Harness plumbing (instantiating cases, values in and out, comparisons) and the
// eval and backend checks.
#include "ops/harness/check.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <map>
#include <sstream>

#include "kiln/ext/tensor_node.h"
#include "ops/harness/session.h"

namespace kiln::test {

namespace {

uint64_t hash_name(const std::string& s, uint64_t salt) {
  uint64_t h = 1469598103934665603ull ^ salt;
  for (unsigned char ch : s) h = (h ^ ch) * 1099511628211ull;
  return h;
}

Shape stored_shape(const Input& x) {
  Shape s = x.shape;
  const int nd = s.ndim();
  switch (x.layout) {
    case Layout::contig: break;
    case Layout::transposed: std::swap(s[nd - 2], s[nd - 1]); break;
    case Layout::permuted:
      for (int d = 0; d < nd; ++d) s[d] = x.shape[nd - 1 - d];
      break;
    case Layout::narrowed: s[nd - 1] += 3; break;
    case Layout::expanded: s = x.stored; break;
  }
  return s;
}

Tensor apply_layout(Tensor leaf, const Input& x) {
  const int nd = x.shape.ndim();
  switch (x.layout) {
    case Layout::contig: return leaf;
    case Layout::transposed: return leaf.transpose(-2, -1);
    case Layout::permuted:
      switch (nd) {
        case 2: return leaf.permute({1, 0});
        case 3: return leaf.permute({2, 1, 0});
        case 4: return leaf.permute({3, 2, 1, 0});
        default: return leaf;
      }
    case Layout::narrowed: return leaf.narrow(nd - 1, 1, x.shape[nd - 1]);
    case Layout::expanded: return leaf.expand(x.shape);
  }
  return leaf;
}

std::string index_str(const Shape& s, int64_t k) {
  std::string r = "[";
  std::vector<int64_t> idx(size_t(s.ndim()));
  for (int d = s.ndim() - 1; d >= 0; --d) {
    idx[size_t(d)] = k % s[d];
    k /= s[d];
  }
  for (size_t d = 0; d < idx.size(); ++d) r += (d ? ", " : "") + std::to_string(idx[d]);
  return r + "]";
}

// The first node whose CPU value disagrees with the reference evaluated on the
// CPU's own inputs of that node: points at the kernel (or composite step) to blame.
std::string localize(const Graph& g, const Tol& tol) {
  for (TensorNode* n : g.nodes()) {
    if (op_kind(n->op) == OpKind::ALIAS) continue;  // src0 was updated in place
    RefValues local;
    for (int i = 0; i < n->n_src; ++i) local[n->src[i]] = download(Tensor(n->src[i]));
    const RefValue want = ref_eval_node(n, local);
    const std::string e = compare(want, download(Tensor(n)), tol, "");
    if (!e.empty())
      return "first node that disagrees given its own CPU inputs: node #" + std::to_string(n->id) +
             " " + op_name(n->op) + " " + n->shape.str() +
             (n->name.empty() ? "" : " '" + n->name + "'") + e;
  }
  return "every node agrees with the reference given its own CPU inputs (error accumulates)";
}

}  // namespace

Built instantiate(const Case& c, Context& ctx, bool as_params) {
  Built b;
  for (const Input& x : c.inputs) {
    const Shape st = stored_shape(x);
    const bool param = as_params && x.diff && x.dtype == DType::f32;
    Tensor leaf = param ? ctx.param(x.dtype, st, x.name) : ctx.input(x.dtype, st, x.name);
    b.leaves.push_back(leaf);
    b.views.push_back(apply_layout(leaf, x));
  }
  b.out = c.build(ctx, b.views);
  return b;
}

namespace {

// The blocks of every quantized row case_values made, by dtype and the row's
// dequantized values: upload() writes these blocks, as quantizing the
// dequantized values again need not give them back (Q3_K's and Q5_K's scale
// searches can pick another scale for them).
std::map<std::pair<DType, std::vector<float>>, std::vector<uint8_t>>& quantized_rows() {
  static std::map<std::pair<DType, std::vector<float>>, std::vector<uint8_t>> rows;
  return rows;
}

// v's rows of k values quantized (ggml's reference formulas) and dequantized
// in place; their blocks remembered for upload().
void quantize_rows(DType t, std::vector<double>& v, int64_t k) {
  std::vector<float> row(static_cast<size_t>(k)), back(row.size());
  std::vector<uint8_t> q(dtype_row_bytes(t, k));
  for (size_t r = 0; k > 0 && r < v.size() / size_t(k); ++r) {
    for (int64_t c = 0; c < k; ++c) row[size_t(c)] = float(v[r * size_t(k) + size_t(c)]);
    quantize_row(t, row.data(), q.data(), k);
    dequantize_row(t, q.data(), back.data(), k);
    for (int64_t c = 0; c < k; ++c) v[r * size_t(k) + size_t(c)] = back[size_t(c)];
    quantized_rows()[{t, back}] = q;
  }
}

// The blocks of a quantized tensor holding values v (rows of k).
std::vector<uint8_t> blocks_of(DType t, const std::vector<double>& v, int64_t k) {
  std::vector<uint8_t> out;
  std::vector<float> row(static_cast<size_t>(k));
  std::vector<uint8_t> q(dtype_row_bytes(t, k));
  for (size_t r = 0; k > 0 && r < v.size() / size_t(k); ++r) {
    for (int64_t c = 0; c < k; ++c) row[size_t(c)] = float(v[r * size_t(k) + size_t(c)]);
    const auto it = quantized_rows().find({t, row});
    if (it != quantized_rows().end()) q = it->second;
    else quantize_row(t, row.data(), q.data(), k);
    out.insert(out.end(), q.begin(), q.end());
  }
  return out;
}

}  // namespace

std::vector<std::vector<double>> case_values(const Case& c) {
  std::vector<std::vector<double>> vals;
  for (size_t i = 0; i < c.inputs.size(); ++i) {
    const Input& x = c.inputs[i];
    Rng rng(hash_name(c.name, i));
    std::vector<double> v = x.gen(stored_shape(x), rng);
    if (is_quantized(x.dtype))
      quantize_rows(x.dtype, v, stored_shape(x)[stored_shape(x).ndim() - 1]);
    for (double& e : v)
      if (!is_quantized(x.dtype))
        e = x.dtype == DType::f32 ? double(float(e)) : ref_round_to(x.dtype, e);
    vals.push_back(std::move(v));
  }
  return vals;
}

void upload(Tensor t, const std::vector<double>& v) {
  KILN_ASSERT(int64_t(v.size()) == t.numel());
  if (is_quantized(t.dtype())) {  // the blocks case_values made for these values
    t.set(blocks_of(t.dtype(), v, t.shape()[t.ndim() - 1]));
    return;
  }
  switch (t.dtype()) {
    case DType::f32:
    default: t.set(std::vector<float>(v.begin(), v.end())); break;
    case DType::f16:
    case DType::bf16: {
      std::vector<uint16_t> h(v.size());
      for (size_t k = 0; k < v.size(); ++k)
        h[k] = t.dtype() == DType::f16 ? f32_to_f16(float(v[k])) : f32_to_bf16(float(v[k]));
      t.set(h);
      break;
    }
    case DType::i32: {
      std::vector<int32_t> q(v.size());
      for (size_t k = 0; k < v.size(); ++k) q[k] = int32_t(v[k]);
      t.set(q);
      break;
    }
  }
}

RefValue download(Tensor t) {
  RefValue r;
  r.dtype = t.dtype();
  r.shape = t.shape();
  switch (t.dtype()) {
    case DType::f32:
    default:  // quantized: dequantized
      for (float x : t.get<float>()) r.v.push_back(x);
      break;
    case DType::f16:
      for (uint16_t x : t.get<uint16_t>()) r.v.push_back(f16_to_f32(x));
      break;
    case DType::bf16:
      for (uint16_t x : t.get<uint16_t>()) r.v.push_back(bf16_to_f32(x));
      break;
    case DType::i32:
      for (int32_t x : t.get<int32_t>()) r.v.push_back(x);
      break;
  }
  return r;
}

bool verbose() {
  static const bool v = [] {
    const char* e = std::getenv("KILN_OPS_VERBOSE");
    return e && *e && *e != '0';
  }();
  return v;
}

std::string compare(const RefValue& ref, const RefValue& got, const Tol& tol,
                    const std::string& what, double* worst_out) {
  std::ostringstream os;
  os.precision(9);
  if (!(ref.shape == got.shape) || ref.v.size() != got.v.size()) {
    os << what << ": shape " << got.shape.str() << ", expected " << ref.shape.str();
    return os.str();
  }
  if (ref.dtype != got.dtype) {
    os << what << ": dtype " << dtype_name(got.dtype) << ", expected " << dtype_name(ref.dtype);
    return os.str();
  }
  double scale = 1.0;
  for (double r : ref.v)
    if (std::isfinite(r)) scale = std::max(scale, std::fabs(r));
  int64_t bad = 0, worst = -1;
  double worst_ratio = 0;
  for (size_t k = 0; k < ref.v.size(); ++k) {
    const double r = ref.v[k], g = got.v[k];
    double ratio;
    if (std::isnan(r) || std::isinf(r)) {
      ratio = (g == r || (std::isnan(r) && std::isnan(g))) ? 0.0 : INFINITY;
    } else {
      const double bound = tol.abs * scale + tol.rel * std::fabs(r);
      const double err = std::fabs(g - r);
      ratio = err <= bound ? err / bound : (std::isnan(err) ? INFINITY : err / bound);
    }
    if (ratio > 1.0) ++bad;
    if (worst < 0 || ratio > worst_ratio) worst_ratio = ratio, worst = int64_t(k);
  }
  if (worst_out) *worst_out = worst_ratio;
  if (bad == 0) return {};
  const double r = ref.v[size_t(worst)], g = got.v[size_t(worst)];
  os << what << ": " << bad << " of " << ref.v.size() << " elements " << ref.shape.str()
     << " out of tolerance (abs " << tol.abs << " x max(1, max|ref|)=" << scale << ", rel "
     << tol.rel << "); worst at " << index_str(ref.shape, worst) << ": got " << g << ", expected "
     << r << " (error " << std::fabs(g - r) << ", " << worst_ratio << "x the bound)";
  return os.str();
}

std::string compare_exact(const RefValue& want, const RefValue& got, const std::string& what) {
  if (!(want.shape == got.shape) || want.v.size() != got.v.size())
    return what + ": shape " + got.shape.str() + ", expected " + want.shape.str();
  for (size_t k = 0; k < want.v.size(); ++k) {
    const double w = want.v[k], g = got.v[k];
    if (w == g || (std::isnan(w) && std::isnan(g))) continue;
    std::ostringstream os;
    os.precision(9);
    os << what << ": not bit-identical; first difference at " << index_str(want.shape, int64_t(k))
       << ": " << g << " vs " << w;
    return os.str();
  }
  return {};
}

// ---- Session ----

Session::Session(const Case& cs, bool grad) : c(cs), grad_mode(grad) {
  b = instantiate(c, ctx, grad);
  values = case_values(c);
  if (!grad) {
    g = Graph::forward(b.out);
    return;
  }
  if (b.out.dtype() != DType::f32)
    throw RefError("grad case output must be f32, is " + std::string(dtype_name(b.out.dtype())));
  for (size_t i = 0; i < c.inputs.size(); ++i)
    if (b.leaves[i].has_flag(kFlagParam)) params.push_back(i);
  R = ctx.input(DType::f32, b.out.shape(), "R");
  loss = sum(mul(b.out, R));
  g = Graph::forward(loss);
  g.backward(loss);
  // R: random magnitudes and signs so that no gradient component cancels.
  Input r = in("R", R.shape(), gen::magnitude(0.25, 1.0));
  Case tmp;
  tmp.name = c.name + "/R";
  tmp.inputs = {r};
  r_values = case_values(tmp)[0];
  RefValues vals = leaf_values();
  fill_leaves(g, vals);
  ref_eval(std::span<TensorNode* const>(g.nodes().data(), g.n_forward()), vals);
  const std::vector<double>& out = vals.at(b.out.node()).v;
  for (size_t k = 0; k < out.size(); ++k)
    if (std::isinf(out[k])) r_values[k] = 0;
}

void Session::allocate(Backend& be) {
  guarded = be.buffer_type().is_host();
  buf = guarded ? mem.allocate(ctx, be) : allocate_tensors(ctx, be);
  for (size_t i = 0; i < b.leaves.size(); ++i) upload(b.leaves[i], values[i]);
  if (R.defined()) upload(R, leaf_values().at(R.node()).v);
}

void Session::run(Backend& be) {
  be.compute(g);
  if (!guarded) return;
  const std::string e = mem.check();
  if (!e.empty()) throw RefError(std::string(be.name()) + " run of the graph: " + e);
}

std::string Session::run_checked(Backend& be) {
  if (!guarded) {
    be.compute(g);
    return {};
  }
  return test::run_checked(g, be, mem);
}

RefValues Session::leaf_values() const {
  RefValues vals;
  for (size_t i = 0; i < b.leaves.size(); ++i) {
    RefValue& v = vals[b.leaves[i].node()];
    v.dtype = b.leaves[i].dtype();
    v.shape = b.leaves[i].shape();
    v.v = values[i];
  }
  if (R.defined()) {
    RefValue& v = vals[R.node()];
    v.shape = R.shape();
    v.v = r_values;
  }
  return vals;
}

void fill_leaves(const Graph& g, RefValues& vals) {
  auto give = [&](TensorNode* n) {
    if (n->op != Op::NONE || vals.count(n)) return;
    RefValue v;
    if (n->flags & kFlagGradAcc) {
      v.dtype = n->dtype;
      v.shape = n->shape;
      v.v.assign(size_t(n->numel()), 0.0);
    } else if (n->data) {
      v = download(Tensor(n));
    } else {
      throw RefError("leaf node #" + std::to_string(n->id) + " '" + n->name + "' " +
                     n->shape.str() + " has no value");
    }
    vals[n] = std::move(v);
  };
  for (TensorNode* n : g.leafs()) give(n);
  for (TensorNode* n : g.nodes())
    for (int i = 0; i < n->n_src; ++i) give(n->src[i]);
}

// ---- checks ----

CheckResult check_eval(const Case& c, Backend* be) {
  return guarded([&](CheckResult& r) {
    Session s(c, false);
    CpuBackend cpu1(1);
    Backend& cpu = be ? *be : cpu1;
    s.allocate(cpu);
    const std::string mem_error = s.run_checked(cpu);
    if (!mem_error.empty()) return r.fail(mem_error);
    const RefValue got = download(s.b.out);
    RefValues vals = s.leaf_values();
    fill_leaves(s.g, vals);
    ref_eval(s.g.nodes(), vals);
    const RefValue& want = vals.at(s.b.out.node());
    double worst = 0;
    const std::string e = compare(want, got, c.tol, "CPU output vs double reference", &worst);
    if (!e.empty()) r.fail(e + "\n  " + localize(s.g, c.tol));
    if (verbose()) r.notes += "eval: worst error " + std::to_string(worst) + " x bound\n";
    if (c.spec) {
      // The inputs as the build function saw them, before any in-place op ran.
      std::vector<RefValue> ins;
      for (const Tensor& v : s.b.views) {
        RefValues before = s.leaf_values();
        if (v.op() != Op::NONE) ref_eval(Graph::forward(v).nodes(), before);
        ins.push_back(before.at(v.node()));
      }
      const std::string se = c.spec(ins, want);
      if (!se.empty()) r.fail(se);
    }
  });
}

namespace {

// Output (and, in grad mode, every param's gradient) of one run on a backend.
std::vector<RefValue> run_outputs(const Case& c, Backend& be, bool grad) {
  Session s(c, grad);
  s.allocate(be);
  s.run(be);
  std::vector<RefValue> outs{download(s.b.out)};
  for (size_t i : s.params) {
    Tensor gp = s.g.grad(s.b.leaves[i]);
    if (gp.defined()) outs.push_back(download(gp));
  }
  return outs;
}

}  // namespace

CheckResult check_backend(const Case& c, const BackendSpec& spec) {
  return guarded([&](CheckResult& r) {
    auto base = test_backends()[0].make();
    auto other = spec.make();
    for (int mode = 0; mode < (c.grad ? 2 : 1); ++mode) {
      const bool grad = mode == 1;
      const std::vector<RefValue> want = run_outputs(c, *base, grad);
      const std::vector<RefValue> got = run_outputs(c, *other, grad);
      for (size_t k = 0; k < want.size() && k < got.size(); ++k) {
        const std::string what = std::string(spec.name) + (grad ? " grad-mode " : " ") +
                                 (k == 0 ? "output" : "gradient " + std::to_string(k)) + " vs " +
                                 test_backends()[0].name;
        Tol t = grad && k > 0 ? c.grad_tol : c.tol;
        t.abs *= spec.tol_scale;
        t.rel *= spec.tol_scale;
        const std::string e =
            spec.bitwise ? compare_exact(want[k], got[k], what) : compare(want[k], got[k], t, what);
        if (!e.empty()) r.fail(e);
      }
      if (want.size() != got.size()) r.fail("different number of gradients");
    }
  });
}

}  // namespace kiln::test
