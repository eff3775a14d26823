// Internal: the CUDA backend's buffer type (one per device).
#pragma once
#include <memory>
#include <string>

#include "kiln/backend.h"

namespace kiln::cuda {

inline constexpr int kMaxDevices = 16;

class DeviceBufferType final : public BufferType {
 public:
  explicit DeviceBufferType(int device);
  const char* name() const override { return name_.c_str(); }
  size_t alignment() const override;
  bool is_host() const override { return false; }
  std::unique_ptr<Buffer> alloc(size_t size) override;
  int device() const { return device_; }

 private:
  int device_;
  std::string name_;
};

DeviceBufferType& device_buffer_type(int device);
bool is_device_buffer_type(const BufferType& t);

}  // namespace kiln::cuda
