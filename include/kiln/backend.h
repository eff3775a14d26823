// The backend interface (docs/design.md, principle 5): a BufferType makes Buffers (one
// block of device memory each); a Backend runs graphs on tensors that live in its
// buffers. Every backend implements this same small surface.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "kiln/graph_passes.h"
#include "kiln/tensor.h"

namespace kiln {

class Graph;
class Context;
class BufferType;

// A buffer detaches its tensors when it is destroyed: every tensor of a living
// Context whose memory lies in it (views included) gets data = buffer = null, so
// has_data() is false and computing on it throws instead of using freed memory.
// Whoever points a tensor into a buffer calls track() (allocators do).
class Buffer {
 public:
  Buffer() = default;
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  virtual ~Buffer();
  virtual BufferType& type() const = 0;
  virtual void* base() = 0;
  virtual size_t size() const = 0;
  // Byte ranges [offset, offset+n) of tensor t's memory (t->data must lie in this buffer).
  virtual void set(TensorNode* t, const void* src, size_t offset, size_t n) = 0;
  virtual void get(const TensorNode* t, void* dst, size_t offset, size_t n) const = 0;
  virtual void memset(TensorNode* t, uint8_t value, size_t offset, size_t n) = 0;
  virtual void clear(uint8_t value) = 0;  // the whole buffer
  // Copies src's bytes (src contiguous, in any buffer) into dst (contiguous, in
  // this buffer) without a host round trip, when this buffer can (a device
  // buffer reading another of its kind); false: copy_tensor goes through the host.
  virtual bool copy_from(const TensorNode* /*src*/, TensorNode* /*dst*/) { return false; }
  bool is_host() const;

  // Records that tensors of t's Context point into this buffer (see above).
  void track(const TensorNode* t);

 private:
  struct User {
    Context* ctx;
    std::weak_ptr<const void> life;
  };
  std::vector<User> users_;  // contexts with tensors in this buffer (usually one)
};

class BufferType {
 public:
  virtual ~BufferType() = default;
  virtual const char* name() const = 0;
  virtual size_t alignment() const = 0;
  virtual size_t max_size() const { return SIZE_MAX; }
  // Bytes tensor t needs in a buffer of this type (may pad).
  virtual size_t alloc_size(const TensorNode* t) const;  // default: t's bytes, unpadded
  virtual bool is_host() const = 0;
  [[nodiscard]] virtual std::unique_ptr<Buffer> alloc(size_t size) = 0;
};

// Host (malloc'ed, aligned) memory: used by the CPU and BLAS backends.
BufferType& host_buffer_type();

// A host buffer over `size` bytes at `base` that it does not allocate or free
// (ggml's "buffer from host pointer"): a memory-mapped model file, say. Its type
// is host_buffer_type(), so every host backend computes on tensors placed in it.
// `owner` (may be null) is kept until the buffer is destroyed, so the memory
// lives as long as any tensor can reach it. Tensors pointed into it must be
// aligned as their kernels need (their element size on the CPU) and must be
// track()ed like any other buffer's.
[[nodiscard]] std::unique_ptr<Buffer> host_buffer_from_ptr(void* base, size_t size,
                                                           std::shared_ptr<void> owner = {});

class Backend {
 public:
  virtual ~Backend() = default;
  virtual const char* name() const = 0;
  virtual BufferType& buffer_type() = 0;
  virtual bool supports_op(const TensorNode* node) const = 0;
  // Whether this backend has kernels for the nodes graph pass `p` makes (a
  // MATMUL with a bias source, a bf16 store, ...): OptContext and Generator run
  // a pass only where the backend says yes. Default: no pass.
  virtual bool supports_pass(GraphPass /*p*/) const { return false; }
  // The passes of `wanted` this backend supports.
  GraphPasses supported_passes(GraphPasses wanted) const;
  // Runs the given nodes in order (every tensor must have memory). Throws
  // kiln::Error for errors found in the data (e.g. an index out of range).
  virtual void compute(std::span<TensorNode* const> nodes) = 0;
  void compute(const Graph& g);
  virtual void synchronize() {}
};

// Copies src's elements into dst (same shape and dtype; any buffers/backends).
void copy_tensor(const TensorNode* src, TensorNode* dst);

// Gives every tensor of `ctx` that has no memory yet a place in one new buffer of
// `backend` (zero-filled), and points views at their sources. The simple
// allocator: no reuse, for running graphs before the graph allocator. Call again
// after building more tensors; it allocates only the new ones. Empty tensors get
// a (distinct) place too. Keep the buffer as long as the tensors are used: when
// it is destroyed they lose their memory (has_data() is false again).
[[nodiscard]] std::unique_ptr<Buffer> allocate_tensors(Context& ctx, Backend& backend);

namespace detail {
// A kiln::Error "[compute] ..." when node n or one of its sources has no memory
// (never allocated, or its buffer was destroyed). Backends call it per node.
void check_memory(const TensorNode* n);
}  // namespace detail

}  // namespace kiln
