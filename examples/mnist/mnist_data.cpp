// IDX loader for MNIST. IDX files are big-endian: a u32 magic (0x0803 = 2051
// for u8 3-dim images, 0x0801 = 2049 for u8 1-dim labels), one u32 per dim, then
// the u8 values.
#include "mnist_data.h"

#include <sys/stat.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <memory>
#include <vector>

#include "kiln/error.h"

namespace mnist {

namespace {

constexpr uint32_t kImagesMagic = 2051;
constexpr uint32_t kLabelsMagic = 2049;
constexpr const char* kHint = "; run scripts/get-mnist.sh to download it";

struct FileCloser {
  void operator()(std::FILE* f) const { std::fclose(f); }
};
using File = std::unique_ptr<std::FILE, FileCloser>;

template <class... Parts>
[[noreturn]] void bad(const std::string& path, const Parts&... parts) {
  kiln::fail("mnist", path, ": ", parts..., kHint);
}

// Opens an IDX file and reads its header: magic and `n_dims` dims.
struct Idx {
  File file;
  uint64_t size = 0;
  uint32_t dims[3] = {};
};

Idx open_idx(const std::string& path, uint32_t magic, int n_dims, const char* kind) {
  Idx idx;
  idx.file.reset(std::fopen(path.c_str(), "rb"));
  if (!idx.file) {
    if (errno == ENOENT) bad(path, "file not found");
    bad(path, "cannot open: ", std::strerror(errno));
  }
  struct stat st;
  if (::fstat(fileno(idx.file.get()), &st) != 0 || !S_ISREG(st.st_mode))
    bad(path, "not a regular file");
  idx.size = uint64_t(st.st_size);
  const uint64_t header = 4 + 4 * uint64_t(n_dims);
  if (idx.size < header)
    bad(path, "only ", idx.size, " bytes, too short for an IDX ", kind, " file");
  uint8_t h[16];
  if (std::fread(h, 1, header, idx.file.get()) != header) bad(path, "cannot read the header");
  auto be32 = [&](int i) {
    return uint32_t(h[i]) << 24 | uint32_t(h[i + 1]) << 16 | uint32_t(h[i + 2]) << 8 |
           uint32_t(h[i + 3]);
  };
  const uint32_t m = be32(0);
  if (m != magic)
    bad(path, "magic number is ", m, ", expected ", magic, " (an IDX ", kind, " file)");
  for (int d = 0; d < n_dims; ++d) idx.dims[d] = be32(4 + 4 * d);
  return idx;
}

void read_exact(const std::string& path, std::FILE* f, void* dst, size_t n) {
  if (n && std::fread(dst, 1, n, f) != n) bad(path, "cannot read ", n, " bytes of data");
}

}  // namespace

kiln::Dataset load_idx(const std::string& images_path, const std::string& labels_path,
                       int64_t shard_size) {
  Idx img = open_idx(images_path, kImagesMagic, 3, "images");
  const uint64_t n = img.dims[0];
  if (img.dims[1] != uint32_t(kRows) || img.dims[2] != uint32_t(kCols))
    bad(images_path, "images are ", img.dims[1], "x", img.dims[2], ", expected ", kRows, "x",
        kCols);
  const uint64_t pixels = uint64_t(kRows) * kCols;
  if (img.size != 16 + n * pixels)
    bad(images_path, "file has ", img.size, " bytes but ", n, " images of ", kRows, "x", kCols,
        " need ", 16 + n * pixels, " (truncated or damaged)");

  Idx lab = open_idx(labels_path, kLabelsMagic, 1, "labels");
  if (lab.dims[0] != n)
    kiln::fail("mnist", images_path, " has ", n, " images but ", labels_path, " has ", lab.dims[0],
               " labels", kHint);
  if (lab.size != 8 + n)
    bad(labels_path, "file has ", lab.size, " bytes but ", n, " labels need ", 8 + n,
        " (truncated or damaged)");

  if (shard_size < 1 || int64_t(n) % shard_size != 0)
    kiln::fail("mnist", images_path, ": ", n, " samples are not a multiple of shard_size ",
               shard_size);
  kiln::Dataset ds(int64_t(n), {kRows, kCols}, kiln::DataType::u8, {}, kiln::DataType::i32,
                   shard_size);
  std::span<uint8_t> data = ds.data<uint8_t>();
  read_exact(images_path, img.file.get(), data.data(), data.size());

  std::vector<uint8_t> raw(n);
  read_exact(labels_path, lab.file.get(), raw.data(), raw.size());
  std::span<int32_t> labels = ds.labels<int32_t>();
  for (uint64_t i = 0; i < n; ++i) {
    if (raw[i] >= kClasses)
      bad(labels_path, "label ", i, " is ", int(raw[i]), ", not a digit 0..9");
    labels[i] = raw[i];
  }
  return ds;
}

namespace {
std::string join(const std::string& dir, const char* name) {
  if (dir.empty()) return name;
  return dir.back() == '/' ? dir + name : dir + "/" + name;
}
}  // namespace

kiln::Dataset load_train(const std::string& dir, int64_t shard_size) {
  return load_idx(join(dir, kTrainImages), join(dir, kTrainLabels), shard_size);
}

kiln::Dataset load_test(const std::string& dir, int64_t shard_size) {
  return load_idx(join(dir, kTestImages), join(dir, kTestLabels), shard_size);
}

}  // namespace mnist
