// Host memory buffers: one aligned allocation; set/get/memset are memcpy/memset.
#include <cstdlib>
#include <cstring>

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

bool Buffer::is_host() const { return type().is_host(); }

}  // namespace kiln
