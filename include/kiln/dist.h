// Distributed data-parallel training (docs/design.md, layer "distributed"): a
// communicator over MPI and a ParallelHook (kiln/opt.h) that averages gradients
// across processes in buckets, overlapped with the backward pass. See
// docs/distributed.md.
//
//   kiln::dist::Communicator comm;          // the MPI job under mpirun, else this process alone
//   kiln::dist::DataParallel dp(comm);
//   kiln::OptContext opt({.inputs = x, .outputs = logits, .parallel = &dp});
//   kiln::kaiming_uniform(w1, 784, 1); ...  // rank 0's values are broadcast
//   kiln::fit(opt, data, {.epochs = 10});   // each rank takes its slice of every batch
//   if (comm.rank() == 0) opt.save("model.gguf");  // save() alone already writes on rank 0 only
//
//   mpirun -np 4 ./train                    // 4 processes, 4x the batch per step
//
// Built with MPI when CMake finds it (option KILN_MPI; mpi_built() tells).
// Without MPI, or in a process not started by an MPI launcher, the communicator
// is a single process (rank 0 of 1) and everything below works unchanged.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "kiln/opt.h"
#include "kiln/tensor.h"

namespace kiln::dist {

enum class ReduceOp : uint8_t { sum, mean };

// Built with MPI (KILN_MPI and MPI found)?
bool mpi_built();
// Does the environment show an MPI launcher (mpirun/mpiexec, srun with PMI/PMIx)?
bool launched_by_mpi();

// Every process of the job (MPI_COMM_WORLD, duplicated so kiln's messages never
// mix with the program's own). Creating one is collective: every rank creates
// its communicators in the same order. The first one initializes MPI (thread
// level MPI_THREAD_SERIALIZED) when the process was started by an MPI launcher
// and nobody initialized it yet; the last one destroyed then finalizes it.
//
// Blocking operations wait at most timeout() seconds for the other ranks; then
// the communicator prints "[dist] rank R of N: ... did not complete within T s"
// and aborts the whole job (MPI_Abort), since a rank that died or hangs would
// otherwise stall the others forever. Open MPI's mpirun itself ends the job
// when a rank exits with an error or is killed.
class Communicator {
 public:
  Communicator();
  ~Communicator();
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;

  int rank() const;
  int size() const;
  bool is_root() const { return rank() == 0; }
  bool uses_mpi() const;  // false: a single process without MPI

  // Default: the environment variable KILN_DIST_TIMEOUT (seconds), else 300.
  // <= 0 waits forever.
  double timeout() const;
  void set_timeout(double seconds);

  void barrier();
  // From `root` to every rank, in place. Tensors: any dtype, contiguous, with memory.
  void broadcast(Tensor t, int root = 0);
  void broadcast(std::span<std::byte> bytes, int root = 0);
  // Elementwise over ranks, in place (every rank gets the result). Tensors: f32
  // or i32 (mean: f32 only), contiguous, with memory (any backend's buffer).
  void allreduce(Tensor t, ReduceOp op = ReduceOp::sum);
  void allreduce(std::span<float> values, ReduceOp op = ReduceOp::sum);
  void allreduce(std::span<double> values, ReduceOp op = ReduceOp::sum);

  // Prints "[dist] rank R of N: message" on stderr and ends every rank of the
  // job with `code` (a single process just exits).
  [[noreturn]] void abort(const std::string& message, int code = 1);

  struct Impl;
  Impl& impl() { return *impl_; }

 private:
  std::unique_ptr<Impl> impl_;
};

struct DataParallelOptions {
  // Gradients are reduced in buckets of about this many bytes: consecutive
  // gradients in backward order, contiguous in memory, so a bucket is one
  // in-place allreduce. Small buckets start earlier (more overlap) but pay the
  // per-message latency more often (docs/distributed.md).
  size_t bucket_bytes = size_t(1) << 20;
  // Start each bucket's allreduce as soon as the backward pass has finished its
  // gradients (true), or all of them after the backward pass (false: no overlap).
  bool overlap = true;
  // Who drives the non-blocking allreduces: a communication thread that starts
  // and progresses them while the backward pass computes (MPI progresses only
  // inside MPI calls), or the training thread between backward segments. The
  // thread needs MPI_THREAD_SERIALIZED; with less, the caller drives them.
  bool progress_thread = true;
};

// Where the time went, summed over optimizer steps since the last reset.
struct DataParallelStats {
  int64_t steps = 0;
  int64_t buckets = 0;        // allreduces started
  double bytes = 0;           // reduced by this rank (gradients, padding included)
  double reduce_seconds = 0;  // first bucket started .. last bucket done, per step
  double wait_seconds = 0;    // finish_grads() blocked (communication not hidden)
  // Share of the reduction hidden behind the backward pass.
  double overlap() const { return reduce_seconds > 0 ? 1.0 - wait_seconds / reduce_seconds : 0.0; }
};

// The ParallelHook that kiln::OptContext uses for data-parallel training over
// a Communicator (one DataParallel per OptContext). With one rank every call is
// free.
class DataParallel : public ParallelHook {
 public:
  explicit DataParallel(Communicator& comm, DataParallelOptions o = {});
  ~DataParallel() override;
  DataParallel(const DataParallel&) = delete;
  DataParallel& operator=(const DataParallel&) = delete;

  int rank() const override;
  int size() const override;
  std::vector<size_t> attach(std::span<const Tensor> grads) override;
  void grads_ready(size_t count) override;
  void finish_grads() override;
  void broadcast(std::span<const Tensor> tensors) override;
  void sum(std::span<double> values) override;

  Communicator& comm();
  size_t n_buckets() const;
  size_t n_packed_buckets()
      const;  // buckets copied through a fusion buffer (not contiguous host memory)
  const DataParallelStats& stats() const;
  void reset_stats();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace kiln::dist
