// Random graphs for the allocator tests. Each step picks an op and operands from
// the tensors built so far (recent ones more often, so chains form and in-place
// reuse happens, but older ones too, so tensors get several consumers and long
// lives). A builder that rejects a random combination just skips the step.
#include <random>
#include <unordered_set>

#include "alloc_check.h"
#include "kiln/ext/tensor_node.h"

using namespace kiln;

namespace alloc_test {

namespace {

class Gen {
 public:
  Gen(uint64_t seed, bool backward, Context& ctx) : rng_(seed), backward_(backward), ctx_(ctx) {}

  int uni(int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng_); }
  bool coin(double p = 0.5) { return std::bernoulli_distribution(p)(rng_); }

  Shape random_shape() {
    Shape s;
    const int nd = uni(1, 4);
    for (int i = 0; i < nd; ++i) s.push_back(uni(1, 5));
    return s;
  }

  Tensor new_leaf(const Shape& s) {
    Tensor t;
    const int kind = backward_ ? (coin(0.7) ? 1 : 0) : uni(0, 2);
    if (kind == 1) t = ctx_.param(f32, s, "p" + std::to_string(leaves.size()));
    else if (kind == 0) t = ctx_.input(f32, s, "x" + std::to_string(leaves.size()));
    else t = ctx_.tensor(f32, s, "c" + std::to_string(leaves.size()));
    leaves.push_back(t);
    pool.push_back(t);
    return t;
  }

  // Recent tensors are likelier.
  Tensor pick() {
    const int n = int(pool.size());
    if (coin(0.6)) return pool[size_t(std::max(0, n - uni(1, 3)))];
    return pool[size_t(uni(0, n - 1))];
  }

  static bool broadcastable(const Shape& a, const Shape& b) {
    const int n = std::max(a.ndim(), b.ndim());
    for (int i = 0; i < n; ++i) {
      const int ia = i - (n - a.ndim()), ib = i - (n - b.ndim());
      const int64_t da = ia >= 0 ? a[ia] : 1, db = ib >= 0 ? b[ib] : 1;
      if (da != db && da != 1 && db != 1) return false;
    }
    return true;
  }

  Tensor partner_for(Tensor a) {
    std::vector<Tensor> c;
    for (const Tensor& t : pool)
      if (t.dtype() == f32 && broadcastable(a.shape(), t.shape())) c.push_back(t);
    if (!c.empty() && coin(0.8)) return c[size_t(uni(0, int(c.size()) - 1))];
    Shape s;  // a fresh leaf broadcast along the leading dims
    for (int i = uni(0, a.ndim() - 1); i < a.ndim(); ++i) s.push_back(coin(0.3) ? 1 : a.shape()[i]);
    if (s.ndim() == 0) s.push_back(a.shape()[a.ndim() - 1]);
    return new_leaf(s);
  }

  Tensor unary(Tensor x) {
    switch (uni(0, 21)) {
      case 0: return relu(x);
      case 1: return neg(x);
      case 2: return tanh(x);
      case 3: return sigmoid(x);
      case 4: return scale(x, 0.5f, 0.25f);
      case 5: return sqr(x);
      case 6: return gelu(x);
      case 7: return silu(x);
      case 8: return abs(x);
      case 9: return leaky_relu(x, 0.1f);
      // The other in-place-able unary ops, on inputs kept in their domain.
      case 10: return exp(tanh(x));
      case 11: return log(sigmoid(x));
      case 12: return sqrt(abs(x));
      case 13: return sin(x);
      case 14: return cos(x);
      case 15: return pow(x, 2.0f);
      case 16: return clamp(x, -0.5f, 0.5f);
      case 17: return erf(x);
      case 18: return backward_ ? softplus(x) : sign(x);
      case 19: return gelu(x, GeluApprox::tanh);
      case 20: return div(x, sigmoid(x) + 0.5f);
      default: return softplus(x);
    }
  }

  Tensor view(Tensor x) {
    const Shape& s = x.shape();
    const int nd = x.ndim();
    switch (uni(0, 4)) {
      case 0: {  // reshape: split or merge dims (copies when not contiguous)
        const int64_t n = x.numel();
        Shape r;
        if (coin() || nd == 1) {
          int64_t first = 1;
          for (int64_t d = 2; d <= n; ++d)
            if (n % d == 0 && coin(0.5)) {
              first = d;
              break;
            }
          r = {first, n / first};
        } else {
          r.push_back(n);
        }
        return x.reshape(r);
      }
      case 1:
        if (nd < 2) return x.reshape({1, s[0]}).expand({int64_t(uni(2, 3)), s[0]});
        return x.transpose(uni(0, nd - 1), uni(0, nd - 1));
      case 2: {
        const int d = uni(0, nd - 1);
        const int64_t len = uni(1, int(s[d]));
        return x.narrow(d, uni(0, int(s[d] - len)), len);
      }
      case 3: {  // expand a size-1 dim, or a new leading one
        Shape e = s;
        bool any = false;
        for (int i = 0; i < nd; ++i)
          if (e[i] == 1 && coin(0.7)) {
            e[i] = uni(2, 4);
            any = true;
          }
        if (!any && nd < 4) {
          Shape f;
          f.push_back(uni(2, 3));
          for (int64_t d : s) f.push_back(d);
          e = f;
        }
        return x.expand(e);
      }
      default:
        if (nd == 3) return x.permute({2, 0, 1});
        if (nd == 4) return x.permute({1, 3, 0, 2});
        return x.T();
    }
  }

  Tensor matmul_with(Tensor a) {
    if (a.ndim() < 2) a = a.reshape({1, a.shape()[0]});
    const int64_t k = a.shape()[a.ndim() - 1];
    for (const Tensor& t : pool)
      if (t.ndim() == 2 && t.shape()[0] == k && t.dtype() == f32 && coin(0.5)) return matmul(a, t);
    if (a.ndim() == 2 && coin(0.5)) return matmul(a, a.T());  // two edges from one node
    Tensor b = new_leaf({k, int64_t(uni(1, 5))});
    if (!backward_ && coin(0.3)) return matmul(a.to(f16), b.to(f16));
    return matmul(a, b);
  }

  Tensor reduce(Tensor x) {
    const int nd = x.ndim();
    switch (uni(0, 3)) {
      case 0: return sum(x, uni(0, nd - 1), coin());
      case 1: return max(x, uni(0, nd - 1), coin());
      case 2: return mean(x, -1, true);
      default: return sum(x);
    }
  }

  Tensor step() {
    Tensor x = pick();
    if (x.ndim() == 0) return coin() ? unary(x) : x.reshape({1});  // scalars (full reductions)
    switch (uni(0, 11)) {
      case 0:
      case 1:
      case 2: return unary(x);
      case 3:
      case 4: {
        Tensor y = coin(0.15) ? x : partner_for(x);
        switch (uni(0, 2)) {
          case 0: return add(x, y);
          case 1: return sub(x, y);
          default: return mul(x, y);
        }
      }
      case 5:
      case 6: return view(x);
      case 7: return matmul_with(x);
      case 8: return reduce(x);
      case 9: {
        SoftmaxOptions o;
        o.causal = x.ndim() >= 2 && coin(0.3);
        return coin(0.7) ? softmax(x, o) : log_softmax(x, o);
      }
      case 10: return concat({x, coin() ? x : unary(x)}, uni(0, x.ndim() - 1));
      default: return x.node()->is_contiguous() ? unary(x) : x.contiguous();
    }
  }

  std::vector<Tensor> pool, leaves;

 private:
  std::mt19937_64 rng_;
  bool backward_;
  Context& ctx_;
};

}  // namespace

RandomGraph make_random_graph(uint64_t seed, bool backward) {
  RandomGraph rg;
  rg.ctx = std::make_unique<Context>();
  Gen gen(seed, backward, *rg.ctx);
  const int n_leaves = gen.uni(1, 3);
  for (int i = 0; i < n_leaves; ++i) gen.new_leaf(gen.random_shape());
  const int n_steps = gen.uni(10, 120);
  for (int i = 0; i < n_steps; ++i) {
    try {
      Tensor t = gen.step();
      if (t.numel() > 4096) continue;  // keep the test fast
      gen.pool.push_back(t);
    } catch (const Error&) {
      // an invalid random combination: try something else
    }
  }
  // Outputs: the last tensor, a few results nothing consumed (so most of what was
  // built is in the graph) and sometimes any tensor (a view, a leaf, a tensor
  // that is also read by later nodes).
  std::vector<Tensor> outs{gen.pool.back()};
  std::unordered_set<const TensorNode*> consumed;
  for (const Tensor& t : gen.pool)
    for (int i = 0; i < t.node()->n_src; ++i) consumed.insert(t.node()->src[i]);
  for (const Tensor& t : gen.pool)
    if (!consumed.count(t.node()) && !(t == outs[0]) && outs.size() < 4 && gen.coin(0.6))
      outs.push_back(t);
  if (gen.coin(0.5)) outs.push_back(gen.pick());
  if (backward) {
    Tensor loss = sum(outs[0]);
    for (size_t i = 1; i < outs.size(); ++i) loss = loss + mean(outs[i]) * 0.5f;
    outs.insert(outs.begin(), loss);
    rg.loss = loss;
  }
  rg.graph = Graph::forward(outs.front());
  for (size_t i = 1; i < outs.size(); ++i) rg.graph.expand(outs[i]);
  if (backward) {
    try {
      rg.graph.backward(rg.loss);
      for (const Tensor& l : gen.leaves)
        if (l.has_flag(kFlagParam) && rg.graph.grad(l).defined())
          rg.grads.push_back(rg.graph.grad(l));
    } catch (const Error&) {
      rg.loss = Tensor();  // no param reaches the loss: a forward-only graph
    }
  }
  rg.outputs = outs;
  rg.leaves = gen.leaves;
  return rg;
}

void fill_leaves(const RandomGraph& rg, uint64_t seed) {
  std::mt19937 rng{uint32_t(seed)};
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  for (const Tensor& l : rg.leaves) {
    if (!l.has_data()) continue;  // not part of the graph
    std::vector<float> v(size_t(l.numel()));
    for (float& x : v) x = u(rng);
    Tensor(l).set(v);
  }
}

}  // namespace alloc_test
