// Case registry, value generators and input helpers.
#include "ops/harness/case.h"

#include <algorithm>
#include <cmath>
#include <sstream>

#include "kiln/ext/rng.h"

namespace kiln::test {

uint64_t Rng::next() {
  s_ += 0x9E3779B97F4A7C15ull;
  return kiln::detail::splitmix64(s_);
}
double Rng::uniform() { return double(next() >> 11) * (1.0 / 9007199254740992.0); }
double Rng::uniform(double lo, double hi) { return lo + (hi - lo) * uniform(); }
int64_t Rng::integer(int64_t lo, int64_t hi) {
  return lo + int64_t(next() % uint64_t(hi - lo + 1));
}

namespace gen {

Gen uniform(double lo, double hi) {
  return [=](const Shape& s, Rng& r) {
    std::vector<double> v(size_t(s.numel()));
    for (double& e : v) e = r.uniform(lo, hi);
    return v;
  };
}

Gen away_from(double lo, double hi, std::vector<double> kinks, double margin) {
  return [=](const Shape& s, Rng& r) {
    std::vector<double> v(size_t(s.numel()));
    for (double& e : v) {
      for (;;) {  // rejection sampling: the ranges used leave plenty of room
        e = r.uniform(lo, hi);
        bool ok = true;
        for (double k : kinks) ok = ok && std::fabs(e - k) >= margin;
        if (ok) break;
      }
    }
    return v;
  };
}

Gen magnitude(double lo, double hi) {
  return [=](const Shape& s, Rng& r) {
    std::vector<double> v(size_t(s.numel()));
    for (double& e : v) e = r.uniform(lo, hi) * (r.next() & 1 ? 1.0 : -1.0);
    return v;
  };
}

Gen distinct(double lo, double hi) {
  return [=](const Shape& s, Rng& r) {
    const size_t n = size_t(s.numel());
    std::vector<double> v(n);
    // Evenly spaced values (with a small jitter), then a Fisher-Yates shuffle.
    const double step = (hi - lo) / double(std::max<size_t>(n, 1));
    for (size_t k = 0; k < n; ++k) v[k] = lo + step * (double(k) + 0.25 + 0.5 * r.uniform());
    for (size_t k = n; k > 1; --k) std::swap(v[k - 1], v[size_t(r.integer(0, int64_t(k) - 1))]);
    return v;
  };
}

Gen integers(int64_t lo, int64_t hi) {
  return [=](const Shape& s, Rng& r) {
    std::vector<double> v(size_t(s.numel()));
    for (double& e : v) e = double(r.integer(lo, hi));
    return v;
  };
}

Gen choice(std::vector<double> set) {
  return [set = std::move(set)](const Shape& s, Rng& r) {
    std::vector<double> v(size_t(s.numel()));
    for (double& e : v) e = set[size_t(r.integer(0, int64_t(set.size()) - 1))];
    return v;
  };
}

Gen values(std::vector<double> vals) {
  return [vals = std::move(vals)](const Shape& s, Rng&) {
    std::vector<double> v(size_t(s.numel()));
    for (size_t k = 0; k < v.size(); ++k) v[k] = vals[k % vals.size()];
    return v;
  };
}

Gen prob_rows(double lo) {
  return [=](const Shape& s, Rng& r) {
    std::vector<double> v(size_t(s.numel()));
    const int64_t C = s.ndim() ? s[s.ndim() - 1] : 1;
    for (size_t row = 0; row * size_t(C) < v.size(); ++row) {
      double sum = 0;
      for (int64_t c = 0; c < C; ++c) sum += v[row * size_t(C) + size_t(c)] = r.uniform(lo, 1.0);
      for (int64_t c = 0; c < C; ++c) v[row * size_t(C) + size_t(c)] /= sum;
    }
    return v;
  };
}

}  // namespace gen

Case make_case(std::string name, std::vector<Op> ops, std::vector<Input> inputs, BuildFn build,
               bool grad) {
  Case c;
  c.name = std::move(name);
  c.ops = std::move(ops);
  c.inputs = std::move(inputs);
  c.build = std::move(build);
  c.grad = grad;
  return c;
}

Input in(std::string name, Shape shape, Gen g) {
  Input x;
  x.name = std::move(name);
  x.shape = shape;
  x.gen = std::move(g);
  return x;
}

Input in_i32(std::string name, Shape shape, Gen g) {
  Input x = in(std::move(name), shape, std::move(g));
  x.dtype = DType::i32;
  x.diff = false;
  return x;
}

Input constant(Input x) {
  x.diff = false;
  return x;
}

Input as(Input x, DType t) {
  x.dtype = t;
  if (t != DType::f32) x.diff = false;
  return x;
}

Input with(Input x, Layout l) {
  x.layout = l;
  return x;
}

Input expanded(Input x, Shape stored) {
  x.layout = Layout::expanded;
  x.stored = stored;
  return x;
}

const char* layout_name(Layout l) {
  switch (l) {
    case Layout::contig: return "contiguous";
    case Layout::transposed: return "transposed";
    case Layout::permuted: return "permuted";
    case Layout::narrowed: return "narrowed";
    case Layout::expanded: return "expanded";
  }
  return "?";
}

std::vector<Case> make_cases(Sz z) {
  // One list per op family (cases_<family>.cpp), then the thread-count cases,
  // which span families.
  struct List {
    const char* family;
    void (*add)(std::vector<Case>&, Sz);
  };
  static const List lists[] = {
      {"views", add_views_cases},     {"copy", add_copy_cases},
      {"binary", add_binary_cases},   {"unary", add_unary_cases},
      {"reduce", add_reduce_cases},   {"matmul", add_matmul_cases},
      {"softmax", add_softmax_cases}, {"index", add_index_cases},
      {"conv", add_conv_cases},       {"pool", add_pool_cases},
      {"norm", add_norm_cases},       {"attention", add_attention_cases},
      {"loss", add_loss_cases},       {"optim", add_optim_cases},
      {"", add_thread_cases},
  };
  std::vector<Case> cs;
  for (const List& l : lists) {
    const size_t first = cs.size();
    l.add(cs, z);
    for (size_t i = first; i < cs.size(); ++i) cs[i].family = l.family;
  }
  return cs;
}

const std::vector<Case>& all_cases() {
  static const std::vector<Case> cases = make_cases(Sz{false});
  return cases;
}

const Case* find_case(const std::string& name) {
  for (const Case& c : all_cases())
    if (c.name == name) return &c;
  return nullptr;
}

RefValue ref_value(const Shape& s, std::vector<double> v) {
  RefValue r;
  r.shape = s;
  r.v = std::move(v);
  return r;
}

std::string spec_compare(const RefValue& want, const RefValue& got, double tol) {
  if (!(want.shape == got.shape))
    return "spec: output shape " + got.shape.str() + ", expected " + want.shape.str();
  double scale = 1.0;
  for (double w : want.v) scale = std::max(scale, std::fabs(w));
  for (size_t k = 0; k < want.v.size(); ++k) {
    const double w = want.v[k], g = got.v[k];
    const bool both_inf = std::isinf(w) && w == g;
    if (!both_inf && !(std::fabs(w - g) <= tol * scale)) {
      std::ostringstream os;
      os.precision(10);
      os << "spec: element " << k << " of the graph's value is " << g << " but the API promises "
         << w << " (composite built wrongly?)";
      return os.str();
    }
  }
  return {};
}

}  // namespace kiln::test
