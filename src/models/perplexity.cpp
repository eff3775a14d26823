// Perplexity over consecutive windows: one forward graph per window length (the
// full window, and the shorter last one), the mean cross-entropy of each
// window's next-token predictions computed in the graph. KL divergence against
// a base model: both models' logits of each window, compared on the host.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <map>

#include "kiln/ext/alloc.h"
#include "kiln/generate.h"

namespace kiln::models {

namespace {

// The window length (0: the model's max_seq_len), checked with the ids.
int64_t checked_window(const CausalLM& model, std::span<const int32_t> ids, int64_t window) {
  const int64_t n = int64_t(ids.size()), V = model.vocab_size();
  if (window == 0) window = model.max_seq_len();
  if (window < 2 || window > model.max_seq_len())
    fail("perplexity", "window of ", window, " tokens: need 2..", model.max_seq_len(),
         " (the model's max_seq_len)");
  if (n < 2) fail("perplexity", "need at least 2 tokens, got ", n);
  for (int64_t i = 0; i < n; ++i)
    if (ids[size_t(i)] < 0 || ids[size_t(i)] >= V)
      fail("perplexity", "token id ", ids[size_t(i)], " (at index ", i,
           ") is outside the model's vocabulary of ", V, " ids");
  return window;
}

// A model's logits of windows: one graph per window length.
class WindowLogits {
 public:
  WindowLogits(CausalLM& model, Backend& backend) : model_(model), backend_(backend) {
    model.eval();
  }
  // [len, V]: row t predicts token t + 1 of `ids`.
  std::vector<float> operator()(std::span<const int32_t> ids) {
    const int64_t len = int64_t(ids.size());
    G& g = graphs_[len];
    if (!g.graph.size()) {
      g.ids = model_.ctx().input(i32, {1, len}, "kl.ids");
      g.logits = model_(g.ids);
      g.graph = Graph::forward(g.logits);
      g.alloc = std::make_unique<GraphAllocator>(backend_.buffer_type());
      g.alloc->alloc(g.graph);
    }
    g.ids.set<int32_t>(ids);
    backend_.compute(g.graph);
    return g.logits.get<float>();
  }

 private:
  struct G {
    Tensor ids, logits;
    Graph graph;
    std::unique_ptr<GraphAllocator> alloc;
  };
  CausalLM& model_;
  Backend& backend_;
  std::map<int64_t, G> graphs_;
};

// log-softmax of a row, in double.
void log_softmax(const float* x, int64_t V, std::vector<double>& out) {
  const double mx = *std::max_element(x, x + V);
  double z = 0;
  for (int64_t v = 0; v < V; ++v) z += std::exp(double(x[v]) - mx);
  const double lse = mx + std::log(z);
  out.resize(size_t(V));
  for (int64_t v = 0; v < V; ++v) out[size_t(v)] = double(x[v]) - lse;
}

}  // namespace

KlDivergenceResult kl_divergence(CausalLM& model, CausalLM& base, Backend& backend,
                                 std::span<const int32_t> ids, int64_t window) {
  const auto t0 = std::chrono::steady_clock::now();
  const int64_t V = model.vocab_size();
  if (base.vocab_size() != V)
    fail("perplexity", "the base model has ", base.vocab_size(), " tokens, the model ", V);
  window = checked_window(model, ids,
                          std::min(window ? window : model.max_seq_len(), base.max_seq_len()));
  WindowLogits lm(model, backend), lb(base, backend);
  KlDivergenceResult r;
  double kl = 0, nll = 0, base_nll = 0;
  int64_t same = 0;
  std::vector<double> pm, pb;
  const int64_t n = int64_t(ids.size());
  for (int64_t start = 0; start + 1 < n; start += window) {
    const auto w = ids.subspan(size_t(start), size_t(std::min(window, n - start)));
    const std::vector<float> xm = lm(w), xb = lb(w);
    for (size_t t = 0; t + 1 < w.size(); ++t) {
      const float* rm = xm.data() + t * size_t(V);
      const float* rb = xb.data() + t * size_t(V);
      log_softmax(rm, V, pm);
      log_softmax(rb, V, pb);
      double k = 0;
      for (int64_t v = 0; v < V; ++v)
        k += std::exp(pb[size_t(v)]) * (pb[size_t(v)] - pm[size_t(v)]);
      kl += k;
      r.max_kl = std::max(r.max_kl, k);
      same += std::max_element(rm, rm + V) - rm == std::max_element(rb, rb + V) - rb;
      nll -= pm[size_t(w[t + 1])];
      base_nll -= pb[size_t(w[t + 1])];
      ++r.predicted;
    }
  }
  r.mean_kl = kl / double(r.predicted);
  r.top1_agreement = double(same) / double(r.predicted);
  r.perplexity = std::exp(nll / double(r.predicted));
  r.base_perplexity = std::exp(base_nll / double(r.predicted));
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return r;
}

PerplexityResult perplexity(CausalLM& model, Backend& backend, std::span<const int32_t> ids,
                            int64_t window) {
  const auto t0 = std::chrono::steady_clock::now();
  const int64_t n = int64_t(ids.size()), V = model.vocab_size();
  window = checked_window(model, ids, window);
  model.eval();
  struct WindowGraph {
    Tensor ids, labels, loss;
    Graph graph;
    std::unique_ptr<GraphAllocator> alloc;
  };
  std::map<int64_t, WindowGraph> graphs;  // by window length
  Context& ctx = model.ctx();
  PerplexityResult r;
  double nll = 0;
  for (int64_t start = 0; start + 1 < n; start += window) {
    const int64_t len = std::min(window, n - start);
    WindowGraph& g = graphs[len];
    if (!g.graph.size()) {
      g.ids = ctx.input(i32, {1, len}, "ppl.ids");
      g.labels = ctx.input(i32, {len - 1}, "ppl.labels");
      Tensor logits = model(g.ids).reshape({len, V}).narrow(0, 0, len - 1);
      g.loss = cross_entropy(logits, g.labels);
      g.graph = Graph::forward(g.loss);
      g.alloc = std::make_unique<GraphAllocator>(backend.buffer_type());
      g.alloc->alloc(g.graph);
    }
    g.ids.set<int32_t>(ids.subspan(size_t(start), size_t(len)));
    g.labels.set<int32_t>(ids.subspan(size_t(start + 1), size_t(len - 1)));
    backend.compute(g.graph);
    nll += double(g.loss.item()) * double(len - 1);
    r.predicted += len - 1;
    ++r.windows;
  }
  r.mean_nll = nll / double(r.predicted);
  r.perplexity = std::exp(r.mean_nll);
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return r;
}

}  // namespace kiln::models
