// Internal: CUDA graphs of node lists the backend has run before.
//
// A node list is identified by its signature: every node's identity, memory,
// op, params, shape and strides and those of its sources, plus the backend's
// scratch addresses: everything a launcher bakes into its launches. Data is
// not part of it (kernels read it at run time), so a training step whose
// per-step values are tensor data replays the same graph. The first run of a
// signature runs eagerly, the second is captured and launched, later ones
// replay. A capture that fails marks the signature as eager-only.
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

  explicit GraphCache(size_t capacity = 16) : capacity_(capacity) {}
  ~GraphCache() { clear(); }
  GraphCache(const GraphCache&) = delete;
  GraphCache& operator=(const GraphCache&) = delete;

  static std::vector<int64_t> signature(const std::vector<TensorNode*>& nodes, const void* ws,
                                        const void* err, bool tf32);
  // The entry for sig (most recently used first); created when new.
  Entry& lookup(std::vector<int64_t> sig);
  static Action action(const Entry& e) {
    if (e.exec) return Action::replay;
    return e.runs >= 1 && e.capturable ? Action::capture : Action::eager;
  }
  // Captures launch() (which enqueues on `stream`) into e.exec. On failure the
  // capture is ended and discarded, e is marked eager-only, and the exception
  // (or a kiln::Error for a CUDA error) propagates.
  void capture(Entry& e, cudaStream_t stream, const std::function<void()>& launch);
  void clear();  // destroys every graph (scratch moved: the graphs point at the old one)

 private:
  size_t capacity_;
  std::list<Entry> entries_;
};

}  // namespace kiln::cuda
