// Device buffers: one cudaMalloc'ed block each (never managed memory).
//
// set/get/memset/clear and device-to-device copies go through the legacy
// default stream (cudaMemcpy, cudaMemset), which waits for the work queued on
// every blocking stream, the CUDA backend's included: reading a tensor right
// after compute() sees its result, and a write before compute() lands before
// the kernels that read it.
#include <cuda_runtime.h>

#include <array>
#include <memory>
#include <mutex>

#include "backends/cuda/cuda_buffer.h"
#include "backends/cuda/launch.h"
#include "kiln/error.h"
#include "kiln/ext/tensor_node.h"

namespace kiln::cuda {

namespace {

constexpr size_t kAlignment = 256;  // cudaMalloc's own alignment; vector loads of any width

class DeviceBuffer final : public Buffer {
 public:
  DeviceBuffer(DeviceBufferType& type, size_t size) : type_(type), size_(size) {
    if (size == 0) return;
    check(cudaSetDevice(type.device()), "cudaSetDevice");
    const cudaError_t e = cudaMalloc(&data_, size);
    if (e != cudaSuccess) {
      cudaGetLastError();  // an allocation failure is not sticky; clear it
      fail("alloc", "out of CUDA device memory allocating ", size, " bytes on device ",
           type.device(), " (", cudaGetErrorString(e), ")");
    }
  }
  ~DeviceBuffer() override {
    if (data_) cudaFree(data_);  // errors ignored: may run after the runtime shut down
  }
  BufferType& type() const override { return type_; }
  void* base() override { return data_; }
  size_t size() const override { return size_; }
  void set(TensorNode* t, const void* src, size_t offset, size_t n) override {
    if (n)
      check(cudaMemcpy(static_cast<char*>(t->data) + offset, src, n, cudaMemcpyHostToDevice),
            "set: cudaMemcpy");
  }
  void get(const TensorNode* t, void* dst, size_t offset, size_t n) const override {
    if (n)
      check(cudaMemcpy(dst, static_cast<const char*>(t->data) + offset, n, cudaMemcpyDeviceToHost),
            "get: cudaMemcpy");
  }
  void memset(TensorNode* t, uint8_t value, size_t offset, size_t n) override {
    if (n) check(cudaMemset(static_cast<char*>(t->data) + offset, value, n), "memset: cudaMemset");
  }
  void clear(uint8_t value) override {
    if (data_) check(cudaMemset(data_, value, size_), "clear: cudaMemset");
  }
  bool copy_from(const TensorNode* src, TensorNode* dst) override {
    if (!src->buffer || src->buffer->is_host() || !is_device_buffer_type(src->buffer->type()))
      return false;
    const size_t n = src->nbytes();
    if (n) check(cudaMemcpy(dst->data, src->data, n, cudaMemcpyDeviceToDevice), "copy: cudaMemcpy");
    return true;
  }

 private:
  DeviceBufferType& type_;
  size_t size_;
  void* data_ = nullptr;
};

}  // namespace

DeviceBufferType::DeviceBufferType(int device)
    : device_(device), name_("cuda" + std::to_string(device)) {}

size_t DeviceBufferType::alignment() const { return kAlignment; }

std::unique_ptr<Buffer> DeviceBufferType::alloc(size_t size) {
  return std::make_unique<DeviceBuffer>(*this, size);
}

DeviceBufferType& device_buffer_type(int device) {
  static std::array<std::unique_ptr<DeviceBufferType>, kMaxDevices> types;
  static std::mutex mu;
  if (device < 0 || device >= kMaxDevices) fail("cuda", "device ", device, " is out of range");
  std::lock_guard<std::mutex> lock(mu);
  if (!types[size_t(device)]) types[size_t(device)] = std::make_unique<DeviceBufferType>(device);
  return *types[size_t(device)];
}

bool is_device_buffer_type(const BufferType& t) {
  return dynamic_cast<const DeviceBufferType*>(&t) != nullptr;
}

}  // namespace kiln::cuda
