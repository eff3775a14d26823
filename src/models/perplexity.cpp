// Perplexity over consecutive windows: one forward graph per window length (the
// full window, and the shorter last one), the mean cross-entropy of each
// window's next-token predictions computed in the graph.
#include <chrono>
#include <cmath>
#include <map>

#include "kiln/ext/alloc.h"
#include "kiln/generate.h"

namespace kiln::models {

PerplexityResult perplexity(CausalLM& model, Backend& backend, std::span<const int32_t> ids,
                            int64_t window) {
  const auto t0 = std::chrono::steady_clock::now();
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
