// Small helpers shared by the file formats of the io layer: whole reads at an
// offset, opening a file for reading, and kiln tensors as little-endian bytes.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "kiln/tensor.h"

namespace kiln::io {

// pread until n bytes are read; false on an error or the end of the file.
bool pread_all(int fd, void* dst, size_t n, uint64_t offset);

// Opens a regular file read-only and returns its descriptor and size;
// kiln::Error("[component] path: cannot open: ...") otherwise.
int open_for_reading(const std::string& path, const char* component, uint64_t* size);

// A tensor's values as contiguous little-endian bytes (Tensor::get).
std::vector<uint8_t> tensor_bytes(const Tensor& t);
// Writes bytes (t.nbytes() of them, contiguous) into t (Tensor::set; views work).
void set_tensor_bytes(Tensor t, const std::vector<uint8_t>& bytes);
// t's memory when it is contiguous host memory (a file can be read straight into
// it, with no staging copy); nullptr otherwise.
void* host_data(const Tensor& t);

}  // namespace kiln::io
