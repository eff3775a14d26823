// Communicator: MPI_COMM_WORLD (duplicated) under an MPI launcher, else one
// process. Every blocking operation is a non-blocking MPI call plus a wait with
// a deadline, so a rank that died or hangs ends the job with a message instead
// of stalling the others forever.
#include <algorithm>
#include <atomic>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <thread>
#include <vector>

#include "dist/comm_impl.h"
#include "kiln/backend.h"
#include "kiln/ext/tensor_node.h"

namespace kiln::dist {

namespace {

double timeout_from_env() {
  const char* s = std::getenv("KILN_DIST_TIMEOUT");
  if (!s || !*s) return 300;
  char* end = nullptr;
  const double v = std::strtod(s, &end);
  if (*end) fail("dist", "KILN_DIST_TIMEOUT must be a number of seconds, got '", s, "'");
  return v;
}

#if KILN_HAVE_MPI
// Communicators alive, and whether kiln initialized MPI (then the last one
// destroyed finalizes it).
std::mutex g_mu;
int g_live = 0;
bool g_owns_mpi = false;

MPI_Datatype mpi_type(Elem e) {
  switch (e) {
    case Elem::f32: return MPI_FLOAT;
    case Elem::f64: return MPI_DOUBLE;
    case Elem::i32: return MPI_INT;
    case Elem::byte: return MPI_BYTE;
  }
  return MPI_BYTE;
}
#endif

size_t elem_size(Elem e) { return e == Elem::f64 ? 8 : e == Elem::byte ? 1 : 4; }

// MPI counts are int: longer arrays go in pieces.
constexpr size_t kMaxCount = size_t(1) << 30;

}  // namespace

bool mpi_built() { return KILN_HAVE_MPI != 0; }

bool launched_by_mpi() {
  for (const char* v :
       {"OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_SIZE", "PMI_RANK", "MV2_COMM_WORLD_SIZE"})
    if (std::getenv(v)) return true;
  return false;
}

// ---------------------------------------------------------------------------
// Impl: non-blocking collectives.

Request Communicator::Impl::iallreduce(void* data, size_t count, Elem e) {
  Request r = kNoRequest;
#if KILN_HAVE_MPI
  if (size > 1 && count > 0) {
    KILN_ASSERT(count <= kMaxCount);
    std::lock_guard<std::mutex> lk(mu);
    MPI_Iallreduce(MPI_IN_PLACE, data, int(count), mpi_type(e), MPI_SUM, comm, &r);
  }
#endif
  return r;
}

Request Communicator::Impl::ibcast(void* data, size_t bytes, int root) {
  Request r = kNoRequest;
#if KILN_HAVE_MPI
  if (size > 1 && bytes > 0) {
    KILN_ASSERT(bytes <= kMaxCount);
    std::lock_guard<std::mutex> lk(mu);
    MPI_Ibcast(data, int(bytes), MPI_BYTE, root, comm, &r);
  }
#endif
  return r;
}

Request Communicator::Impl::ibarrier() {
  Request r = kNoRequest;
#if KILN_HAVE_MPI
  if (size > 1) {
    std::lock_guard<std::mutex> lk(mu);
    MPI_Ibarrier(comm, &r);
  }
#endif
  return r;
}

bool Communicator::Impl::test(Request& r) {
  if (r == kNoRequest) return true;
#if KILN_HAVE_MPI
  int done = 0;
  std::lock_guard<std::mutex> lk(mu);
  MPI_Test(&r, &done, MPI_STATUS_IGNORE);
  return done != 0;
#else
  return true;
#endif
}

void Communicator::Impl::wait(Request& r, const char* what) {
  const Clock::time_point t0 = Clock::now();
  // Spin first (a collective on one machine takes microseconds), then yield the
  // core to the ranks that still compute (the test machine oversubscribes).
  for (int i = 0; !test(r); ++i) {
    if (i > 1000) std::this_thread::yield();
    if ((i & 255) == 0 && timeout > 0 && seconds_since(t0) > timeout) timed_out(what);
  }
}

void Communicator::Impl::abort(const std::string& message, int code) {
  std::fprintf(stderr, "[dist] rank %d of %d: %s\n", rank, size, message.c_str());
  std::fflush(stderr);
#if KILN_HAVE_MPI
  if (mpi) MPI_Abort(comm, code);  // ends every rank (mpirun kills the others)
#endif
  std::_Exit(code);
}

void Communicator::Impl::timed_out(const char* what) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%g", timeout);
  abort(std::string(what) + " did not complete within " + buf +
            " s (KILN_DIST_TIMEOUT): another rank has died or stopped; aborting the job",
        1);
}

// ---------------------------------------------------------------------------
// Communicator.

Communicator::Communicator() : impl_(std::make_unique<Impl>()) {
  Impl& s = *impl_;
  s.timeout = timeout_from_env();
#if KILN_HAVE_MPI
  std::lock_guard<std::mutex> lk(g_mu);
  int inited = 0, finalized = 0;
  MPI_Initialized(&inited);
  MPI_Finalized(&finalized);
  // A plain start (no launcher) stays one process: MPI's singleton start would
  // spawn a daemon for nothing, and as root Open MPI refuses it.
  if (!inited && !launched_by_mpi()) return;
  if (finalized)
    fail("dist", "MPI is already finalized: create communicators before the last one is destroyed");
  int provided = MPI_THREAD_SINGLE;
  if (!inited) {
    MPI_Init_thread(nullptr, nullptr, MPI_THREAD_SERIALIZED, &provided);
    g_owns_mpi = true;
  } else {
    MPI_Query_thread(&provided);
  }
  s.threads_ok = provided >= MPI_THREAD_SERIALIZED;
  MPI_Comm_dup(MPI_COMM_WORLD, &s.comm);
  MPI_Comm_rank(s.comm, &s.rank);
  MPI_Comm_size(s.comm, &s.size);
  s.mpi = true;
  ++g_live;
#endif
}

Communicator::~Communicator() {
#if KILN_HAVE_MPI
  Impl& s = *impl_;
  if (!s.mpi) return;
  std::lock_guard<std::mutex> lk(g_mu);
  MPI_Comm_free(&s.comm);
  if (--g_live == 0 && g_owns_mpi) {
    MPI_Finalize();
    g_owns_mpi = false;
  }
#endif
}

int Communicator::rank() const { return impl_->rank; }
int Communicator::size() const { return impl_->size; }
bool Communicator::uses_mpi() const { return impl_->mpi; }
double Communicator::timeout() const { return impl_->timeout; }
void Communicator::set_timeout(double seconds) { impl_->timeout = seconds; }

void Communicator::barrier() {
  Request r = impl_->ibarrier();
  impl_->wait(r, "barrier");
}

void Communicator::broadcast(std::span<std::byte> bytes, int root) {
  Impl& s = *impl_;
  if (root < 0 || root >= s.size)
    fail("dist", "broadcast root ", root, " is not a rank of ", s.size);
  for (size_t off = 0; off < bytes.size(); off += kMaxCount) {
    Request r = s.ibcast(bytes.data() + off, std::min(kMaxCount, bytes.size() - off), root);
    s.wait(r, "broadcast");
  }
}

void Communicator::broadcast(Tensor t, int root) {
  if (!t.defined()) fail("dist", "broadcast of an undefined tensor");
  TensorNode* n = t.node();
  if (!n->data || !n->buffer)
    fail("dist", "broadcast: tensor ", t.label(), " ", t.shape().str(), " has no memory");
  if (!n->is_contiguous())
    fail("dist", "broadcast: tensor ", t.label(), " ", t.shape().str(), " is not contiguous");
  if (size() == 1) return;
  if (n->buffer->is_host()) {
    broadcast(std::span<std::byte>(static_cast<std::byte*>(n->data), n->nbytes()), root);
    return;
  }
  std::vector<std::byte> host(n->nbytes());
  n->buffer->get(n, host.data(), 0, host.size());
  broadcast(std::span<std::byte>(host), root);
  n->buffer->set(n, host.data(), 0, host.size());
}

namespace {
void reduce_host(Communicator::Impl& s, void* data, size_t count, Elem e) {
  char* p = static_cast<char*>(data);
  for (size_t off = 0; off < count; off += kMaxCount) {
    Request r = s.iallreduce(p + off * elem_size(e), std::min(kMaxCount, count - off), e);
    s.wait(r, "allreduce");
  }
}
}  // namespace

void Communicator::allreduce(std::span<float> v, ReduceOp op) {
  reduce_host(*impl_, v.data(), v.size(), Elem::f32);
  if (op == ReduceOp::mean && size() > 1)
    for (float& x : v) x /= float(size());
}

void Communicator::allreduce(std::span<double> v, ReduceOp op) {
  reduce_host(*impl_, v.data(), v.size(), Elem::f64);
  if (op == ReduceOp::mean && size() > 1)
    for (double& x : v) x /= double(size());
}

void Communicator::allreduce(Tensor t, ReduceOp op) {
  if (!t.defined()) fail("dist", "allreduce of an undefined tensor");
  TensorNode* n = t.node();
  if (t.dtype() != f32 && !(t.dtype() == i32 && op == ReduceOp::sum))
    fail("dist", "allreduce ", op == ReduceOp::sum ? "sum" : "mean", " takes f32",
         op == ReduceOp::sum ? " or i32" : "", " tensors, but ", t.label(), " ", t.shape().str(),
         " is ", dtype_name(t.dtype()));
  if (!n->data || !n->buffer)
    fail("dist", "allreduce: tensor ", t.label(), " ", t.shape().str(), " has no memory");
  if (!n->is_contiguous())
    fail("dist", "allreduce: tensor ", t.label(), " ", t.shape().str(), " is not contiguous");
  if (size() == 1) return;
  const Elem e = t.dtype() == f32 ? Elem::f32 : Elem::i32;
  if (n->buffer->is_host()) {
    if (e == Elem::f32) {
      allreduce(std::span<float>(static_cast<float*>(n->data), size_t(t.numel())), op);
    } else {
      reduce_host(*impl_, n->data, size_t(t.numel()), e);
    }
    return;
  }
  // Device memory goes through the host (NCCL would reduce it in place).
  std::vector<std::byte> host(n->nbytes());
  n->buffer->get(n, host.data(), 0, host.size());
  if (e == Elem::f32) {
    allreduce(std::span<float>(reinterpret_cast<float*>(host.data()), size_t(t.numel())), op);
  } else {
    reduce_host(*impl_, host.data(), size_t(t.numel()), e);
  }
  n->buffer->set(n, host.data(), 0, host.size());
}

void Communicator::abort(const std::string& message, int code) { impl_->abort(message, code); }

}  // namespace kiln::dist
