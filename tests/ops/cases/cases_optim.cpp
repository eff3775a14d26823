// Cases: optimizer steps (AdamW, SGD with/without momentum, Nesterov), in place on
// the param and rewriting their state. The *_state outputs concatenate the updated
// param with the state tensors read after the step; specs check torch.optim
// semantics with the hyper-parameters made by adamw_hyper / sgd_hyper.
#include <cmath>

#include "kiln/opt.h"
#include "ops/harness/case.h"

namespace kiln::test {

namespace {

using X = const std::vector<Tensor>&;

// The hp input of a step (kiln/ext/op_params.h's layout).
template <class H>
Input hp_input(const H& h) {
  const auto v = hyper_values(h);
  return in("hp", {hyper_floats<H>}, gen::values(std::vector<double>(v.begin(), v.end())));
}

// torch.optim.AdamW, step t: decoupled weight decay, bias-corrected moments.
SpecFn adamw_spec(AdamWParams p, int64_t t, double gscale, bool state) {
  return [=](const std::vector<RefValue>& in, const RefValue& out) {
    const RefValue &w = in[0], &g = in[1], &m0 = in[2], &v0 = in[3];
    const double b1 = p.beta1, b2 = p.beta2, lr = p.lr;
    const size_t n = w.v.size();
    std::vector<double> pw(n), m(n), v(n);
    for (size_t k = 0; k < n; ++k) {
      const double gk = g.v[k] * gscale;
      m[k] = b1 * m0.v[k] + (1 - b1) * gk;
      v[k] = b2 * v0.v[k] + (1 - b2) * gk * gk;
      const double mh = m[k] / (1 - std::pow(b1, double(t))),
                   vh = v[k] / (1 - std::pow(b2, double(t)));
      pw[k] =
          w.v[k] - lr * double(p.weight_decay) * w.v[k] - lr * mh / (std::sqrt(vh) + double(p.eps));
    }
    std::vector<double> want = pw;
    Shape s = w.shape;
    if (state) {
      want.insert(want.end(), m.begin(), m.end());
      want.insert(want.end(), v.begin(), v.end());
      s[0] *= 3;
    }
    return spec_compare(ref_value(s, want), out);
  };
}

// torch.optim.SGD (L2 weight decay, momentum with dampening, Nesterov).
SpecFn sgd_spec(SgdParams p, bool first, double gscale, bool has_buf) {
  return [=](const std::vector<RefValue>& in, const RefValue& out) {
    const RefValue &w = in[0], &g = in[1];
    const size_t n = w.v.size();
    std::vector<double> pw(n), buf(n);
    for (size_t k = 0; k < n; ++k) {
      double d = g.v[k] * gscale + double(p.weight_decay) * w.v[k];
      if (has_buf) {
        buf[k] = first ? d : double(p.momentum) * in[2].v[k] + (1 - double(p.dampening)) * d;
        d = p.nesterov ? d + double(p.momentum) * buf[k] : buf[k];
      }
      pw[k] = w.v[k] - double(p.lr) * d;
    }
    Shape s = w.shape;
    if (has_buf) {
      pw.insert(pw.end(), buf.begin(), buf.end());
      s[0] *= 2;
    }
    return spec_compare(ref_value(s, pw), out);
  };
}

void add_adamw(std::vector<Case>& cs, int64_t R, int64_t C, const std::string& suffix) {
  AdamWParams p;
  p.lr = 0.05f;
  p.weight_decay = 0.1f;
  const int64_t t = 3;
  const float gscale = 0.5f;
  std::vector<Input> ins = {
      in("param", {R, C}), in("grad", {R, C}), in("m", {R, C}, gen::uniform(-0.1, 0.1)),
      in("v", {R, C}, gen::uniform(0.01, 0.5)), hp_input(adamw_hyper(p, t, gscale))};
  for (Input& x : ins) x.diff = false;
  Case c = make_case(
      "adamw_step" + suffix, {Op::ADAMW_STEP}, ins,
      [](Context&, X x) { return adamw_step(x[0], x[1], x[2], x[3], x[4]); }, false);
  c.spec = adamw_spec(p, t, gscale, false);
  cs.push_back(c);
  Case st = make_case(
      "adamw_step_state" + suffix, {Op::ADAMW_STEP}, ins,
      [](Context&, X x) {
        Tensor s = adamw_step(x[0], x[1], x[2], x[3], x[4]);
        return concat({s, x[2], x[3]}, 0);  // m and v as rewritten by the step
      },
      false);
  st.spec = adamw_spec(p, t, gscale, true);
  cs.push_back(st);
}

// Multi-tensor AdamW over flat buffers: segments with gaps in both the param
// and the state (elements there must stay as they are), two groups with their
// own weight decay and gradient scale, a one-element segment. `k` scales the
// lengths (large: split over threads).
void add_adamw_multi(std::vector<Case>& cs, int64_t k, const std::string& suffix) {
  struct Seg {
    int64_t po, so, len, group;
  };
  const std::vector<Seg> segs = {{0, 0, 37 * k, 0},
                                 {40 * k, 48 * k, 100 * k, 1},
                                 {150 * k, 160 * k, 1, 0},
                                 {200 * k, 161 * k, 90 * k, 1}};
  const int64_t P = 300 * k, N = 260 * k;
  AdamWParams a;
  a.lr = 0.05f;
  a.weight_decay = 0.1f;
  AdamWParams b = a;
  b.weight_decay = 0.0f;
  const int64_t t = 3;
  const AdamWHyper h[2] = {adamw_hyper(a, t, 0.5f), adamw_hyper(b, t, 0.25f)};
  std::vector<double> hv, sv;
  for (const AdamWHyper& x : h)
    for (float f : hyper_values(x)) hv.push_back(f);
  for (const Seg& g : segs)
    for (int64_t f : {g.po, g.so, g.len, g.group}) sv.push_back(double(f));
  std::vector<Input> ins = {in("param", {P}),
                            in("grad", {N}),
                            in("m", {N}, gen::uniform(-0.1, 0.1)),
                            in("v", {N}, gen::uniform(0.01, 0.5)),
                            in("hp", {2, hyper_floats<AdamWHyper>}, gen::values(hv)),
                            in_i32("segs", {int64_t(segs.size()), 4}, gen::values(sv))};
  for (Input& x : ins) x.diff = false;
  // Independent of the reference: each segment is one adamw_step (adamw_spec's
  // formula) on its slices; the rest keeps its input values.
  auto spec = [=](bool state) {
    return [=](const std::vector<RefValue>& in, const RefValue& out) {
      std::vector<double> w = in[0].v, m = in[2].v, v = in[3].v;
      for (const Seg& g : segs) {
        const AdamWParams& p = g.group == 0 ? a : b;
        const double gs = g.group == 0 ? 0.5 : 0.25, b1 = p.beta1, b2 = p.beta2;
        for (int64_t j = 0; j < g.len; ++j) {
          const size_t i = size_t(g.po + j), s = size_t(g.so + j);
          const double gk = in[1].v[s] * gs;
          m[s] = b1 * m[s] + (1 - b1) * gk;
          v[s] = b2 * v[s] + (1 - b2) * gk * gk;
          const double mh = m[s] / (1 - std::pow(b1, double(t))),
                       vh = v[s] / (1 - std::pow(b2, double(t)));
          w[i] = w[i] - double(p.lr) * double(p.weight_decay) * w[i] -
                 double(p.lr) * mh / (std::sqrt(vh) + double(p.eps));
        }
      }
      if (state) {
        w.insert(w.end(), m.begin(), m.end());
        w.insert(w.end(), v.begin(), v.end());
      }
      return spec_compare(ref_value(Shape{int64_t(w.size())}, w), out);
    };
  };
  auto step = [](X x) { return adamw_step_multi(x[0], x[1], x[2], x[3], x[4], x[5]); };
  Case c = make_case(
      "adamw_step_multi" + suffix, {Op::ADAMW_STEP_MULTI}, ins,
      [step](Context&, X x) { return step(x); }, false);
  c.spec = spec(false);
  cs.push_back(c);
  Case st = make_case(
      "adamw_step_multi_state" + suffix, {Op::ADAMW_STEP_MULTI}, ins,
      [step](Context&, X x) {
        return concat({step(x), x[2], x[3]}, 0);
      },
      false);
  st.spec = spec(true);
  cs.push_back(st);
}

void add_sgd(std::vector<Case>& cs, int64_t R, int64_t C, const std::string& suffix) {
  struct Sg {
    const char* name;
    float momentum, dampening, wd;
    bool nesterov, first, buf;
    Layout grad_layout;
  };
  const Sg sgs[] = {
      {"sgd_step", 0, 0, 0.01f, false, false, false, Layout::contig},
      {"sgd_step_momentum", 0.9f, 0.1f, 0.01f, false, false, true, Layout::transposed},
      {"sgd_step_nesterov_first", 0.8f, 0, 0, true, true, true, Layout::contig},
      {"sgd_step_nesterov", 0.8f, 0, 0.05f, true, false, true, Layout::contig},
  };
  for (const Sg& sg : sgs) {
    SgdParams p;
    p.lr = 0.1f;
    p.momentum = sg.momentum;
    p.dampening = sg.dampening;
    p.weight_decay = sg.wd;
    p.nesterov = sg.nesterov;
    const float gscale = 0.25f;
    std::vector<Input> ins = {in("param", {R, C}), with(in("grad", {R, C}), sg.grad_layout)};
    if (sg.buf) ins.push_back(in("buf", {R, C}, gen::uniform(-0.2, 0.2)));
    ins.push_back(hp_input(sgd_hyper(p, sg.first, gscale)));
    for (Input& x : ins) x.diff = false;
    const bool buf = sg.buf;
    Case c = make_case(
        sg.name + suffix, {Op::SGD_STEP}, ins,
        [buf](Context&, X x) {
          if (!buf) return sgd_step(x[0], x[1], Tensor(), x[2]);
          return concat({sgd_step(x[0], x[1], x[2], x[3]), x[2]}, 0);
        },
        false);
    c.spec = sgd_spec(p, sg.first, gscale, buf);
    cs.push_back(c);
  }
}

// Strided state and gradients (views of every kind except for the param, which
// must not be a view); outputs are the param only.
void add_strided(std::vector<Case>& cs, Sz z) {
  const Shape s{z(5, 512), z(7, 1024)};
  AdamWParams p;
  p.lr = 0.01f;
  p.weight_decay = 0.1f;
  auto adamw = [](Context&, X x) { return adamw_step(x[0], x[1], x[2], x[3], x[4]); };
  std::vector<Input> xs{in("param", s),
                        with(in("grad", s, gen::uniform(-2, 2)), Layout::transposed),
                        with(in("m", s, gen::uniform(-0.5, 0.5)), Layout::narrowed),
                        with(in("v", s, gen::uniform(0.01, 1.0)), Layout::permuted),
                        hp_input(adamw_hyper(p, 3, 0.5f))};
  for (Input& x : xs) x.diff = false;
  Case c = make_case("adamw_step_strided_state", {Op::ADAMW_STEP}, xs, adamw, false);
  c.spec = adamw_spec(p, 3, 0.5, false);
  cs.push_back(c);
  // A broadcast gradient (stride 0) is read-only: allowed.
  xs = {in("param", s), expanded(in("grad", s, gen::uniform(-2, 2)), Shape{1, s[1]}),
        in("m", s, gen::uniform(-0.5, 0.5)), in("v", s, gen::uniform(0.01, 1.0)),
        hp_input(adamw_hyper(p, 3, 0.25f))};
  for (Input& x : xs) x.diff = false;
  Case b = make_case("adamw_step_bcast_grad", {Op::ADAMW_STEP}, xs, adamw, false);
  b.spec = adamw_spec(p, 3, 0.25, false);
  cs.push_back(b);
  SgdParams q;
  q.lr = 0.05f;
  q.momentum = 0.8f;
  q.weight_decay = 0.01f;
  q.nesterov = true;
  xs = {in("param", s), with(in("grad", s, gen::uniform(-2, 2)), Layout::permuted),
        with(in("buf", s, gen::uniform(-1, 1)), Layout::narrowed),
        hp_input(sgd_hyper(q, false, 0.5f))};
  for (Input& x : xs) x.diff = false;
  Case n = make_case(
      "sgd_step_nesterov_strided_state", {Op::SGD_STEP}, xs,
      [](Context&, X x) { return sgd_step(x[0], x[1], x[2], x[3]); }, false);
  n.spec = [q](const std::vector<RefValue>& in, const RefValue& out) {
    RefValue w = in[0];
    for (size_t k = 0; k < w.v.size(); ++k) {
      const double d = in[1].v[k] * 0.5 + double(q.weight_decay) * in[0].v[k];
      const double buf = double(q.momentum) * in[2].v[k] + d;
      w.v[k] = in[0].v[k] - double(q.lr) * (d + double(q.momentum) * buf);
    }
    return spec_compare(w, out);
  };
  cs.push_back(n);
}

}  // namespace

void add_optim_cases(std::vector<Case>& cs, Sz z) {
  add_strided(cs, z);
  add_adamw(cs, z(3, 1024), z(37, 4096), "");
  add_sgd(cs, z(3, 1024), z(37, 4096), "");
  // Large enough to be split over threads.
  add_adamw(cs, z(96, 2048), z(1031, 4096), "_mt");
  add_adamw_multi(cs, 1, "");
  add_adamw_multi(cs, z(64, 256), "_mt");
  add_sgd(cs, z(96, 2048), z(1031, 4096), "_mt");
}

}  // namespace kiln::test
