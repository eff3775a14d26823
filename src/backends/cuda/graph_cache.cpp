// GraphCache (graph_cache.h): signatures, capture and the LRU list of graphs.
#include "backends/cuda/graph_cache.h"

#include <cstring>

#include "backends/cuda/launch.h"
#include "kiln/error.h"
#include "kiln/ext/tensor_node.h"

namespace kiln::cuda {

namespace {

void add_tensor(std::vector<int64_t>& s, const TensorNode* t) {
  s.push_back(reinterpret_cast<intptr_t>(t));
  s.push_back(reinterpret_cast<intptr_t>(t->data));
  s.push_back(int64_t(t->op) << 8 | int64_t(t->dtype));
  s.push_back(t->shape.ndim());
  for (int d = 0; d < t->shape.ndim(); ++d) {
    s.push_back(t->shape[d]);
    s.push_back(t->stride[size_t(d)]);
  }
}

}  // namespace

std::vector<int64_t> GraphCache::signature(const std::vector<TensorNode*>& nodes, const void* ws,
                                           const void* err, bool tf32) {
  std::vector<int64_t> s;
  s.reserve(nodes.size() * 40 + 3);
  s.push_back(reinterpret_cast<intptr_t>(ws));
  s.push_back(reinterpret_cast<intptr_t>(err));
  s.push_back(tf32);
  for (const TensorNode* n : nodes) {
    add_tensor(s, n);
    // The parameter bytes (kiln/ext/op_params.h), 8 at a time.
    static_assert(sizeof(n->params.bytes) % 8 == 0);
    for (size_t k = 0; k < sizeof(n->params.bytes); k += 8) {
      int64_t v;
      std::memcpy(&v, n->params.bytes + k, 8);
      s.push_back(v);
    }
    s.push_back(n->n_src);
    for (int i = 0; i < n->n_src; ++i) {
      if (n->src[i]) add_tensor(s, n->src[i]);
      else s.push_back(0);
    }
  }
  return s;
}

GraphCache::Entry& GraphCache::lookup(std::vector<int64_t> sig) {
  for (auto it = entries_.begin(); it != entries_.end(); ++it) {
    if (it->sig == sig) {
      entries_.splice(entries_.begin(), entries_, it);
      return entries_.front();
    }
  }
  if (entries_.size() >= capacity_) {
    if (entries_.back().exec) cudaGraphExecDestroy(entries_.back().exec);
    entries_.pop_back();
    ++evictions_;
  }
  entries_.emplace_front();
  entries_.front().sig = std::move(sig);
  return entries_.front();
}

void GraphCache::capture(Entry& e, cudaStream_t stream, const std::function<void()>& launch) {
  // Thread-local mode: other threads' CUDA calls (another backend, a buffer
  // read) are not forbidden while this thread captures.
  check(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), "cudaStreamBeginCapture");
  cudaGraph_t graph = nullptr;
  try {
    launch();
  } catch (...) {
    cudaStreamEndCapture(stream, &graph);
    if (graph) cudaGraphDestroy(graph);
    cudaGetLastError();
    e.capturable = false;
    throw;
  }
  const cudaError_t end = cudaStreamEndCapture(stream, &graph);
  if (end != cudaSuccess || !graph) {
    cudaGetLastError();
    e.capturable = false;
    check(end == cudaSuccess ? cudaErrorStreamCaptureInvalidated : end, "cudaStreamEndCapture");
  }
  const cudaError_t inst = cudaGraphInstantiate(&e.exec, graph, 0);
  cudaGraphDestroy(graph);
  if (inst != cudaSuccess) {
    e.exec = nullptr;
    e.capturable = false;
    check(inst, "cudaGraphInstantiate");
  }
}

void GraphCache::clear() {
  for (Entry& e : entries_)
    if (e.exec) cudaGraphExecDestroy(e.exec);
  entries_.clear();
}

}  // namespace kiln::cuda
