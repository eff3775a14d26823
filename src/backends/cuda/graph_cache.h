// Internal: CUDA graphs of node lists the backend has run before.
//
// A node list is identified by its signature: every node's identity, memory,
// op, params, shape and strides and those of its sources, plus the backend's
// scratch addresses: everything a launcher bakes into its launches. Data is
// not part of it (kernels read it at run time), so a training step whose
// per-step values are tensor data replays the same graph. The first run of a
// signature runs eagerly, the second is captured and launched, later ones
// replay (decide()). A capture that fails marks the signature as eager-only.
//
// The cache keeps at most `capacity` signatures (CudaOptions::max_graphs) and
// drops the least recently used one beyond that. A training step split by the
// scheduler around ops CUDA lacks is one node list per CUDA split, every step
// in the same order: with fewer entries than splits, each list would be dropped
// before it came back and nothing would ever replay (evictions() counts drops).
#pragma once
#include <cuda_runtime.h>

#include <cstdint>
#include <functional>
#include <list>
#include <vector>

#include "kiln/ext/tensor_node.h"
#include "kiln/tensor.h"

namespace kiln::cuda {

class GraphCache {
 public:
  enum class Action { eager, capture, replay };
  struct Entry {
    std::vector<int64_t> sig;
    int runs = 0;
    bool capturable = true;
    cudaGraphExec_t exec = nullptr;
  };

  static constexpr size_t kDefaultCapacity = 256;
  explicit GraphCache(size_t capacity = kDefaultCapacity)
      : capacity_(capacity < 1 ? 1 : capacity) {}
  ~GraphCache() { clear(); }
  GraphCache(const GraphCache&) = delete;
  GraphCache& operator=(const GraphCache&) = delete;

  static std::vector<int64_t> signature(const std::vector<TensorNode*>& nodes, const void* ws,
                                        const void* err, bool tf32);
  // The entry for sig (most recently used first); created when new, dropping
  // the least recently used entry when the cache is full.
  Entry& lookup(std::vector<int64_t> sig);
  // What a run does: replay a captured graph; capture when the list ran before
  // (so a list seen once, e.g. an evaluation pass, costs no capture); else eager.
  static Action decide(int earlier_runs, bool captured, bool capturable) {
    if (captured) return Action::replay;
    return earlier_runs >= 1 && capturable ? Action::capture : Action::eager;
  }
  // decide() for e's next run, which it counts.
  static Action next_run(Entry& e) {
    const Action a = decide(e.runs, e.exec != nullptr, e.capturable);
    ++e.runs;
    return a;
  }
  // Captures launch() (which enqueues on `stream`) into e.exec. On failure the
  // capture is ended and discarded, e is marked eager-only, and the exception
  // (or a kiln::Error for a CUDA error) propagates.
  void capture(Entry& e, cudaStream_t stream, const std::function<void()>& launch);
  void clear();  // destroys every graph (scratch moved: the graphs point at the old one)
  size_t size() const { return entries_.size(); }
  size_t capacity() const { return capacity_; }
  int64_t evictions() const { return evictions_; }

 private:
  size_t capacity_;
  int64_t evictions_ = 0;
  std::list<Entry> entries_;
};

}  // namespace kiln::cuda
