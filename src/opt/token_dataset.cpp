// TokenDataset: byte tokens or u16/u32 token ids in shared storage, random and
// consecutive next-token windows, and the text-corpus loader (docs/gpt.md).
#include "kiln/token_dataset.h"

#include <algorithm>
#include <climits>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <system_error>

#include "kiln/error.h"
#include "kiln/ext/tensor_node.h"
#include "opt/uniform_below.h"

namespace kiln {

namespace {

constexpr const char* kTokenDatasetOp = "token_dataset";

std::string describe(const Tensor& t, const char* role) {
  return std::string(role) + " " + t.label() + " " + t.shape().str();
}

// Batch size and block of an inputs tensor: B = size(0), T = numel / B.
std::pair<int64_t, int64_t> batch_and_block(const Tensor& inputs) {
  if (!inputs.defined()) fail(kTokenDatasetOp, "the inputs tensor is undefined");
  if (inputs.ndim() < 1 || inputs.size(0) < 1 || inputs.numel() % inputs.size(0) != 0 ||
      inputs.numel() / inputs.size(0) < 1)
    fail(kTokenDatasetOp, describe(inputs, "inputs"), " must be [B, T] with B, T >= 1");
  return {inputs.size(0), inputs.numel() / inputs.size(0)};
}

// vocab_size within what the id width holds, and every id below it.
template <class T>
void check_ids(const std::vector<T>& ids, int64_t vocab, int64_t max_vocab) {
  if (vocab < 1 || vocab > max_vocab)
    fail(kTokenDatasetOp, "vocab_size ", vocab, " is outside [1, ", max_vocab, "] for ",
         sizeof(T) * 8, "-bit ids");
  for (size_t i = 0; i < ids.size(); ++i)
    if (int64_t(ids[i]) >= vocab)
      fail(kTokenDatasetOp, "id ", uint64_t(ids[i]), " at position ", i,
           " is not below vocab_size ", vocab);
}

// Rows of inputs (and labels, when y is not null) from the windows at `offsets`.
template <class T>
void copy_windows(const T* tok, std::span<const int64_t> offsets, int64_t block, int32_t* x,
                  int32_t* y) {
  constexpr uint64_t kMaxI32 = uint64_t(INT32_MAX);
  for (size_t b = 0; b < offsets.size(); ++b) {
    const T* w = tok + offsets[b];
    if constexpr (sizeof(T) == 4)
      for (int64_t t = 0; t <= block; ++t)
        if (w[t] > kMaxI32)
          fail(kTokenDatasetOp, "id ", uint64_t(w[t]), " at token ", offsets[b] + t,
               " does not fit the i32 inputs (ids must be below 2^31 to be batched)");
    int32_t* xr = x + int64_t(b) * block;
    for (int64_t t = 0; t < block; ++t) xr[t] = int32_t(w[t]);
    if (y) {
      int32_t* yr = y + int64_t(b) * block;
      for (int64_t t = 0; t < block; ++t) yr[t] = int32_t(w[t + 1]);
    }
  }
}

// Shared storage of `v`; `base` is set to its first element.
template <class T>
std::shared_ptr<const void> share(std::vector<T> v, const void*& base) {
  auto p = std::make_shared<const std::vector<T>>(std::move(v));
  base = p->data();
  return p;
}

}  // namespace

TokenDataset::TokenDataset(std::vector<uint8_t> tokens) : end_(int64_t(tokens.size())) {
  data_ = share(std::move(tokens), base_);
}

TokenDataset::TokenDataset(std::vector<uint16_t> ids, int64_t vocab_size)
    : width_(2), vocab_(vocab_size), end_(int64_t(ids.size())) {
  check_ids(ids, vocab_size, int64_t(1) << 16);
  data_ = share(std::move(ids), base_);
}

TokenDataset::TokenDataset(std::vector<uint32_t> ids, int64_t vocab_size)
    : width_(4), vocab_(vocab_size), end_(int64_t(ids.size())) {
  check_ids(ids, vocab_size, int64_t(1) << 32);
  data_ = share(std::move(ids), base_);
}

TokenDataset TokenDataset::range(int64_t begin, int64_t end) const {
  TokenDataset r = *this;
  r.begin_ = begin;
  r.end_ = end;
  return r;
}

uint32_t TokenDataset::id(int64_t i) const {
  if (i < 0 || i >= size()) fail(kTokenDatasetOp, "token ", i, " is outside [0, ", size(), ")");
  const int64_t at = begin_ + i;
  switch (width_) {
    case 1: return static_cast<const uint8_t*>(base_)[at];
    case 2: return static_cast<const uint16_t*>(base_)[at];
    default: return static_cast<const uint32_t*>(base_)[at];
  }
}

std::span<const uint8_t> TokenDataset::tokens() const {
  if (width_ != 1)
    fail(kTokenDatasetOp, "tokens() is the byte view; this dataset holds ", width_ * 8,
         "-bit ids (use id())");
  if (!base_) return {};
  return {static_cast<const uint8_t*>(base_) + begin_, size_t(end_ - begin_)};
}

std::pair<TokenDataset, TokenDataset> TokenDataset::split(double train_fraction) const {
  if (!(train_fraction >= 0.0 && train_fraction <= 1.0))
    fail(kTokenDatasetOp, "split: train_fraction must be in [0, 1], got ", train_fraction);
  const int64_t n_train = int64_t(std::floor(double(size()) * train_fraction));
  const int64_t cut = begin_ + n_train;
  return {range(begin_, cut), range(cut, end_)};
}

int64_t TokenDataset::random_offset(std::mt19937_64& rng, int64_t block) const {
  if (block < 1) fail(kTokenDatasetOp, "block must be >= 1, got ", block);
  if (size() < block + 1)
    fail(kTokenDatasetOp, "a window of block+1 = ", block + 1, " tokens does not fit in ", size(),
         " tokens");
  return int64_t(detail::uniform_below(rng, uint64_t(size() - block)));
}

void TokenDataset::sample_batch(Tensor inputs, Tensor labels, std::mt19937_64& rng) const {
  const auto [batch, block] = batch_and_block(inputs);
  std::vector<int64_t> offsets(static_cast<size_t>(batch));
  for (int64_t& o : offsets) o = random_offset(rng, block);
  write_windows(inputs, labels, offsets);
}

int64_t TokenDataset::n_windows(int64_t block) const {
  if (block < 1) fail(kTokenDatasetOp, "block must be >= 1, got ", block);
  return size() / (block + 1);
}

int64_t TokenDataset::n_batches(int64_t batch, int64_t block) const {
  if (batch < 1) fail(kTokenDatasetOp, "batch must be >= 1, got ", batch);
  return n_windows(block) / batch;
}

void TokenDataset::get_batch(Tensor inputs, Tensor labels, int64_t batch_index) const {
  const auto [batch, block] = batch_and_block(inputs);
  const int64_t nb = n_batches(batch, block);
  if (batch_index < 0 || batch_index >= nb)
    fail(kTokenDatasetOp, "get_batch: batch ", batch_index, " is outside [0, ", nb, "): ", size(),
         " tokens hold ", n_windows(block), " windows of ", block + 1, " tokens, batches of ",
         batch);
  std::vector<int64_t> offsets(static_cast<size_t>(batch));
  for (int64_t b = 0; b < batch; ++b) offsets[size_t(b)] = (batch_index * batch + b) * (block + 1);
  write_windows(inputs, labels, offsets);
}

void TokenDataset::write_windows(Tensor inputs, Tensor labels,
                                 std::span<const int64_t> offsets) const {
  const auto [batch, block] = batch_and_block(inputs);
  if (inputs.dtype() != DType::i32)
    fail(kTokenDatasetOp, describe(inputs, "inputs"), " must be i32");
  if (int64_t(offsets.size()) != batch)
    fail(kTokenDatasetOp, offsets.size(), " window offsets for ", describe(inputs, "inputs"),
         " (batch ", batch, ")");
  if (labels.defined()) {
    if (labels.dtype() != DType::i32)
      fail(kTokenDatasetOp, describe(labels, "labels"), " must be i32");
    if (labels.numel() != inputs.numel())
      fail(kTokenDatasetOp, describe(labels, "labels"), " must hold B*T = ", inputs.numel(),
           " elements like ", describe(inputs, "inputs"));
    if (!labels.has_data()) fail(kTokenDatasetOp, describe(labels, "labels"), " has no memory yet");
  }
  if (!inputs.has_data()) fail(kTokenDatasetOp, describe(inputs, "inputs"), " has no memory yet");
  for (int64_t o : offsets)
    if (o < 0 || o + block + 1 > size())
      fail(kTokenDatasetOp, "window [", o, ", ", o + block + 1, ") is outside the ", size(),
           " tokens");
  std::vector<int32_t> x(size_t(batch * block)), y;
  if (labels.defined()) y.resize(x.size());
  int32_t* yp = labels.defined() ? y.data() : nullptr;
  switch (width_) {
    case 1:
      copy_windows(static_cast<const uint8_t*>(base_) + begin_, offsets, block, x.data(), yp);
      break;
    case 2:
      copy_windows(static_cast<const uint16_t*>(base_) + begin_, offsets, block, x.data(), yp);
      break;
    default:
      copy_windows(static_cast<const uint32_t*>(base_) + begin_, offsets, block, x.data(), yp);
  }
  inputs.set<int32_t>(x);
  if (labels.defined()) labels.set<int32_t>(y);
}

TokenDataset load_text_corpus(const std::string& dir, const std::string& fetch_hint) {
  namespace fs = std::filesystem;
  const std::string hint = fetch_hint.empty() ? "" : "; run `" + fetch_hint + "` to fetch it";
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) fail("corpus", dir, ": directory not found", hint);
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const fs::path& p = e.path();
    if (p.extension() == ".txt" && e.is_regular_file()) names.push_back(p.filename().string());
  }
  if (ec) fail("corpus", dir, ": cannot list the directory: ", ec.message());
  if (names.empty()) fail("corpus", dir, ": no .txt files", hint);
  std::sort(names.begin(), names.end());  // byte order of the names
  std::vector<uint8_t> bytes;
  uintmax_t total = 0;  // reserve once: no reallocation peak on a large corpus
  for (const std::string& name : names) {
    const uintmax_t n = fs::file_size(fs::path(dir) / name, ec);
    if (ec) break;  // the read below reports it
    total += n + 1;
  }
  if (!ec) bytes.reserve(size_t(total));
  for (const std::string& name : names) {
    const std::string path = (fs::path(dir) / name).string();
    std::ifstream f(path, std::ios::binary | std::ios::ate);
    if (!f) fail("corpus", path, ": cannot open");
    const std::streamoff n = f.tellg();
    if (n < 0) fail("corpus", path, ": cannot read its size");
    const size_t at = bytes.size();
    bytes.resize(at + size_t(n) + 1);
    f.seekg(0);
    if (!f.read(reinterpret_cast<char*>(bytes.data() + at), n))
      fail("corpus", path, ": read failed");
    bytes[at + size_t(n)] = '\n';
  }
  return TokenDataset(std::move(bytes));
}

}  // namespace kiln
