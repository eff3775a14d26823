// CudaBackend (kiln/cuda.h): one CUDA stream and cuBLAS handle per backend,
// scratch memory sized before any launch (so a node list can be captured),
// CUDA graphs of repeated node lists, and index errors read back after a run.
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <string>
#include <vector>

#include "backends/cuda/cublas_api.h"
#include "backends/cuda/cuda_buffer.h"
#include "backends/cuda/graph_cache.h"
#include "backends/cuda/launch.h"
#include "backends/cuda/params.h"
#include "kiln/cuda.h"
#include "kiln/ext/tensor_node.h"

namespace kiln {

using cuda::check;

namespace {

// cuBLAS's own scratch. Set explicitly so that cuBLAS never allocates while a
// graph is captured (NVIDIA's advice for Hopper: 32 MiB).
constexpr size_t kBlasWorkspace = size_t(32) << 20;

size_t round_up(size_t x, size_t to) { return (x + to - 1) / to * to; }

// Byte offset of element `i` (row-major) of t.
int64_t element_offset(const TensorNode* t, int64_t i) {
  int64_t off = 0;
  for (int d = t->shape.ndim() - 1; d >= 0; --d) {
    off += (i % t->shape[d]) * t->stride[size_t(d)];
    i /= t->shape[d];
  }
  return off;
}

bool profile_from_env() {
  const char* e = std::getenv("KILN_CUDA_PROFILE");
  return e && std::string(e) != "0" && *e;
}

}  // namespace

struct CudaBackend::Impl {
  explicit Impl(const CudaOptions& o) : opt(o), graphs(size_t(std::max(o.max_graphs, 1))) {
    opt.profile = opt.profile || profile_from_env();
  }
  // Frees whatever was created, also when the constructor stopped half way.
  ~Impl() {
    if (opt.profile && !op_times.empty())
      std::fprintf(stderr, "kiln CUDA profile (GPU time per op, dtype, shape):\n%s",
                   report().c_str());
    if (!stream && !blas && !blas_ws && !ws && !err) return;
    cudaSetDevice(opt.device);
    if (stream) cudaStreamSynchronize(stream);
    for (cudaEvent_t e : events) cudaEventDestroy(e);
    graphs.clear();
    if (blas) cuda::cublas().destroy(blas);
    if (blas_ws) cudaFree(blas_ws);
    if (ws) cudaFree(ws);
    if (err) cudaFree(err);
    if (stream) cudaStreamDestroy(stream);
    cudaGetLastError();  // errors while tearing down are not this process's next error
  }
  Impl(const Impl&) = delete;
  Impl& operator=(const Impl&) = delete;

  CudaOptions opt;
  cudaStream_t stream = nullptr;
  cublasHandle_t blas = nullptr;
  void* blas_ws = nullptr;
  void* ws = nullptr;  // shared scratch of the launchers (launch.h)
  size_t ws_size = 0;
  unsigned long long* err = nullptr;  // one error slot per index-checking node
  size_t err_slots = 0;
  cuda::GraphCache graphs;
  Stats stats;
  std::vector<TensorNode*> work;     // compute nodes of the current call
  std::vector<TensorNode*> checked;  // its index-checking nodes, in slot order
  // CudaOptions::profile: two events per node of a call, reused; sums per key.
  std::vector<cudaEvent_t> events;
  struct OpTime {
    double ms = 0;
    int64_t calls = 0;
  };
  std::map<std::string, OpTime> op_times;

  std::string report() const {
    std::vector<std::pair<std::string, OpTime>> rows(op_times.begin(), op_times.end());
    std::sort(rows.begin(), rows.end(),
              [](const auto& a, const auto& b) { return a.second.ms > b.second.ms; });
    double total = 0;
    for (const auto& r : rows) total += r.second.ms;
    std::string out;
    char line[256];
    std::snprintf(line, sizeof line, "%10.3f ms in all\n", total);
    out += line;
    for (const auto& [key, t] : rows) {
      std::snprintf(line, sizeof line, "%10.3f %8lld %9.4f  %s\n", t.ms, (long long)t.calls,
                    t.ms / double(t.calls), key.c_str());
      out += line;
    }
    return out;
  }

  // Makes the scratch and error slots large enough (outside any capture).
  void reserve(size_t ws_need, size_t slots) {
    if (ws_need > ws_size) {
      check(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
      graphs.clear();  // they point at the old scratch
      if (ws) cudaFree(ws);
      ws = nullptr;
      ws_size = 0;
      const size_t size = round_up(ws_need, size_t(1) << 20);
      check(cudaMalloc(&ws, size), "allocating the CUDA backend's scratch");
      ws_size = size;
    }
    if (slots > err_slots) {
      check(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
      graphs.clear();
      if (err) cudaFree(err);
      err = nullptr;
      err_slots = 0;
      const size_t n = std::max<size_t>(slots, 64);
      check(cudaMalloc(reinterpret_cast<void**>(&err), n * sizeof(unsigned long long)),
            "allocating the CUDA backend's error slots");
      err_slots = n;
    }
  }

  void launch_all(bool timed = false) {
    if (!checked.empty())
      check(cudaMemsetAsync(err, 0xff, checked.size() * sizeof(unsigned long long), stream),
            "cudaMemsetAsync (error slots)");  // all ones = cuda::kNoError
    while (timed && events.size() < 2 * work.size()) {
      cudaEvent_t e = nullptr;
      check(cudaEventCreate(&e), "cudaEventCreate");
      events.push_back(e);
    }
    size_t slot = 0;
    for (size_t i = 0; i < work.size(); ++i) {
      TensorNode* n = work[i];
      cuda::Launch L{stream, blas, opt.allow_tf32, static_cast<char*>(ws), ws_size, nullptr};
      if (cuda::checks_indices(n->op)) L.err = err + slot++;
      if (timed) check(cudaEventRecord(events[2 * i], stream), "cudaEventRecord");
      cuda::run_node(n, L);
      if (timed) check(cudaEventRecord(events[2 * i + 1], stream), "cudaEventRecord");
    }
    if (!timed) return;
    check(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
    for (size_t i = 0; i < work.size(); ++i) {
      float ms = 0;
      check(cudaEventElapsedTime(&ms, events[2 * i], events[2 * i + 1]), "cudaEventElapsedTime");
      const TensorNode* n = work[i];
      OpTime& t =
          op_times[std::string(op_name(n->op)) + " " + dtype_name(n->dtype) + " " + n->shape.str()];
      t.ms += ms;
      ++t.calls;
    }
  }

  // Index errors of the run just enqueued: waits for it, then throws the CPU
  // kernels' message for the first node with a bad index.
  void raise_index_errors() {
    std::vector<unsigned long long> got(checked.size());
    check(cudaMemcpy(got.data(), err, got.size() * sizeof(unsigned long long),
                     cudaMemcpyDeviceToHost),
          "reading the index error slots");
    for (size_t k = 0; k < checked.size(); ++k) {
      if (got[k] == cuda::kNoError) continue;
      const TensorNode* n = checked[k];
      const int64_t pos = int64_t(got[k]);
      const TensorNode* ind = n->op == Op::ONE_HOT ? n->src[0] : n->src[1];
      int32_t v = 0;
      check(cudaMemcpy(&v, static_cast<const char*>(ind->data) + element_offset(ind, pos), 4,
                       cudaMemcpyDeviceToHost),
            "reading a bad index");
      switch (n->op) {
        case Op::ONE_HOT:
          fail(cuda::prm::one_hot_op_name(n), "label ", v, " at position ", pos,
               " is out of range [0, ", cuda::prm::one_hot_classes(n), ")");
        case Op::EMBEDDING:
          fail("embedding", "index ", v, " at position ", pos, " is out of range for ",
               n->src[0]->shape[0], " rows");
        case Op::CROSS_ENTROPY:
        case Op::CROSS_ENTROPY_BACK:
          fail("cross_entropy", "label ", v, " at position ", pos, " is out of range [0, ",
               n->src[0]->shape[1], ")");
        default:
          fail("scatter_add_rows", "index ", v, " at position ", pos, " is out of range for ",
               n->shape[0], " rows");
      }
    }
  }
};

CudaBackend::CudaBackend(CudaOptions opt) : impl_(std::make_unique<Impl>(opt)) {
  Impl& m = *impl_;
  if (opt.max_graphs < 1) fail("cuda", "max_graphs must be at least 1, got ", opt.max_graphs);
  const int count = cuda_device_count();
  if (opt.device < 0 || opt.device >= count) {
    const std::string why = cuda_unavailable_reason();
    fail("cuda", "device ", opt.device, " does not exist (", count, " CUDA device",
         count == 1 ? "" : "s", why.empty() ? "" : ": " + why, ")");
  }
  check(cudaSetDevice(opt.device), "cudaSetDevice");
  // A blocking stream: the legacy default stream (buffer reads and writes) waits for it.
  check(cudaStreamCreate(&m.stream), "cudaStreamCreate");
  cuda::check_blas(cuda::cublas().create(&m.blas), "cublasCreate");
  cuda::check_blas(cuda::cublas().set_stream(m.blas, m.stream), "cublasSetStream");
  check(cudaMalloc(&m.blas_ws, kBlasWorkspace), "allocating cuBLAS's workspace");
  // After cublasSetStream, which resets the workspace to cuBLAS's own pool.
  cuda::check_blas(cuda::cublas().set_workspace(m.blas, m.blas_ws, kBlasWorkspace),
                   "cublasSetWorkspace");
}

CudaBackend::~CudaBackend() = default;  // Impl frees the device resources

BufferType& CudaBackend::buffer_type() { return cuda::device_buffer_type(impl_->opt.device); }

const CudaOptions& CudaBackend::options() const { return impl_->opt; }

bool CudaBackend::supports(const TensorNode* node) { return cuda::supported(node); }

CudaBackend::Stats CudaBackend::stats() const {
  Stats s = impl_->stats;
  s.evictions = impl_->graphs.evictions();
  return s;
}

std::string CudaBackend::profile_report() const {
  return impl_->opt.profile ? impl_->report() : std::string();
}

void CudaBackend::synchronize() {
  check(cudaSetDevice(impl_->opt.device), "cudaSetDevice");
  check(cudaStreamSynchronize(impl_->stream), "cudaStreamSynchronize");
}

void CudaBackend::compute(std::span<TensorNode* const> nodes) {
  Impl& m = *impl_;
  check(cudaSetDevice(m.opt.device), "cudaSetDevice");
  m.work.clear();
  m.checked.clear();
  size_t ws_need = 0;
  for (TensorNode* n : nodes) {
    const OpKind kind = op_kind(n->op);
    if (kind == OpKind::LEAF || kind == OpKind::VIEW) continue;
    detail::check_memory(n);
    if (!cuda::supported(n))
      fail("cuda", "node ", n->label(), " (", op_name(n->op), " ", dtype_name(n->dtype),
           n->shape.str(),
           ") is not supported by the CUDA backend: run the graph with a kiln::Scheduler that has "
           "a CPU "
           "backend after it");
    if (n->numel() == 0) continue;
    m.work.push_back(n);
    if (cuda::checks_indices(n->op)) m.checked.push_back(n);
    ws_need = std::max(ws_need, cuda::workspace_bytes(n));
  }
  if (m.work.empty()) return;
  m.reserve(ws_need, m.checked.size());

  if (!m.opt.graphs || m.opt.profile) {
    m.launch_all(m.opt.profile);
    ++m.stats.eager;
  } else {
    cuda::GraphCache::Entry& e =
        m.graphs.lookup(cuda::GraphCache::signature(m.work, m.ws, m.err, m.opt.allow_tf32));
    switch (cuda::GraphCache::next_run(e)) {
      case cuda::GraphCache::Action::eager:
        m.launch_all();
        ++m.stats.eager;
        break;
      case cuda::GraphCache::Action::capture:
        try {
          m.graphs.capture(e, m.stream, [&] { m.launch_all(); });
          ++m.stats.captures;
        } catch (const Error&) {
          // Not capturable after all: run it as it is (a genuine error throws again).
          m.launch_all();
          ++m.stats.eager;
          break;
        }
        [[fallthrough]];
      case cuda::GraphCache::Action::replay:
        check(cudaGraphLaunch(e.exec, m.stream), "cudaGraphLaunch");
        ++m.stats.replays;
        break;
    }
  }
  if (!m.checked.empty()) m.raise_index_errors();
}

int cuda_device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return n;
}

std::string cuda_unavailable_reason() {
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) {
    cudaGetLastError();
    return std::string("no usable CUDA device: cudaGetDeviceCount failed with ") +
           cudaGetErrorName(e) + " (" + cudaGetErrorString(e) + ")";
  }
  if (n == 0) return "no CUDA device found (cudaGetDeviceCount returned 0)";
  return "";
}

std::string cuda_description(int device) {
  cudaDeviceProp p{};
  check(cudaGetDeviceProperties(&p, device), "cudaGetDeviceProperties");
  int rt = 0;
  cudaRuntimeGetVersion(&rt);
  char buf[96];
  std::snprintf(buf, sizeof buf, " (sm_%d%d, %.1f GiB), CUDA runtime %d.%d", p.major, p.minor,
                double(p.totalGlobalMem) / double(1 << 30), rt / 1000, (rt % 1000) / 10);
  return std::string(p.name) + buf;
}

}  // namespace kiln
