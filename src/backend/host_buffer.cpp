// Host memory buffers: one aligned allocation, or memory someone else owns
// (host_buffer_from_ptr); set/get/memset are memcpy/memset.
#include <cstdlib>
#include <cstring>
#include <utility>

#include "kiln/backend.h"
#include "kiln/ext/tensor_node.h"

namespace kiln {

namespace {

constexpr size_t kHostAlignment = 64;  // a cache line / one AVX-512 register

class HostBuffer final : public Buffer {
 public:
  HostBuffer(BufferType& type, size_t size) : type_(type), size_(size) {
    const size_t rounded = (size + kHostAlignment - 1) / kHostAlignment * kHostAlignment;
    data_ = rounded ? std::aligned_alloc(kHostAlignment, rounded) : nullptr;
    if (rounded && !data_) fail("alloc", "out of host memory allocating ", size, " bytes");
  }
  ~HostBuffer() override { std::free(data_); }
  BufferType& type() const override { return type_; }
  void* base() override { return data_; }
  size_t size() const override { return size_; }
  void set(TensorNode* t, const void* src, size_t offset, size_t n) override {
    std::memcpy(static_cast<char*>(t->data) + offset, src, n);
  }
  void get(const TensorNode* t, void* dst, size_t offset, size_t n) const override {
    std::memcpy(dst, static_cast<const char*>(t->data) + offset, n);
  }
  void memset(TensorNode* t, uint8_t value, size_t offset, size_t n) override {
    std::memset(static_cast<char*>(t->data) + offset, value, n);
  }
  void clear(uint8_t value) override {
    if (data_) std::memset(data_, value, size_);
  }

 private:
  BufferType& type_;
  size_t size_;
  void* data_ = nullptr;
};

// Host memory the buffer does not allocate: `owner` keeps it alive (a file
// mapping, say) until the buffer is gone.
class ForeignHostBuffer final : public Buffer {
 public:
  ForeignHostBuffer(void* base, size_t size, std::shared_ptr<void> owner)
      : base_(base), size_(size), owner_(std::move(owner)) {}
  BufferType& type() const override { return host_buffer_type(); }
  void* base() override { return base_; }
  size_t size() const override { return size_; }
  void set(TensorNode* t, const void* src, size_t offset, size_t n) override {
    std::memcpy(static_cast<char*>(t->data) + offset, src, n);
  }
  void get(const TensorNode* t, void* dst, size_t offset, size_t n) const override {
    std::memcpy(dst, static_cast<const char*>(t->data) + offset, n);
  }
  void memset(TensorNode* t, uint8_t value, size_t offset, size_t n) override {
    std::memset(static_cast<char*>(t->data) + offset, value, n);
  }
  void clear(uint8_t value) override {
    if (base_) std::memset(base_, value, size_);
  }

 private:
  void* base_;
  size_t size_;
  std::shared_ptr<void> owner_;
};

class HostBufferType final : public BufferType {
 public:
  const char* name() const override { return "host"; }
  size_t alignment() const override { return kHostAlignment; }
  bool is_host() const override { return true; }
  std::unique_ptr<Buffer> alloc(size_t size) override {
    return std::make_unique<HostBuffer>(*this, size);
  }
};

}  // namespace

BufferType& host_buffer_type() {
  static HostBufferType type;
  return type;
}

std::unique_ptr<Buffer> host_buffer_from_ptr(void* base, size_t size, std::shared_ptr<void> owner) {
  if (!base && size) fail("alloc", "host_buffer_from_ptr: null memory of ", size, " bytes");
  return std::make_unique<ForeignHostBuffer>(base, size, std::move(owner));
}

bool Buffer::is_host() const { return type().is_host(); }

}  // namespace kiln
