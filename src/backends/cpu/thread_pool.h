// kiln::cpu::ThreadPool: a persistent pool of worker threads (created once) that
// runs one function on every thread at a time, plus a cheap spin barrier for
// the threads of a run.
//
//   ThreadPool pool(2);
//   pool.run([&](ThreadCtx& t) {
//     for (node : graph) { node.compute(t.ith, t.nth); t.barrier(); }
//   });
//
// Between runs the workers spin for 1 ms (so back-to-back runs are cheap) and
// then sleep on a futex (std::atomic::wait), so an idle pool uses no CPU.
#pragma once
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>

namespace kiln::cpu {

class ThreadPool;
struct PoolState;  // thread_pool.cpp

// How this thread's barrier waits ended: at once (the others were there),
// spinning, spinning past the yield point, or asleep on the futex. Printed per
// thread when a pool is destroyed with KILN_POOL_STATS=1 set.
struct WaitStats {
  uint64_t fast = 0, spun = 0, yielded = 0, slept = 0;
  int64_t spin_ns = 0, sleep_ns = 0;
};

// A work-stealing counter, one cache line each (see ThreadCtx::work_counters).
struct alignas(64) WorkCounter {
  std::atomic<int64_t> next{0};
};

// One per thread; the pool passes each thread its own ThreadCtx. A standalone,
// default-constructed ThreadCtx (ith = 0, nth = 1, no pool) is valid too: its
// barrier() is a no-op, so code written for the pool also runs single-threaded.
class alignas(64) ThreadCtx {
 public:
  int ith = 0, nth = 1;  // this thread's index, number of threads

  ThreadCtx() = default;
  ~ThreadCtx();
  ThreadCtx(const ThreadCtx&) = delete;
  ThreadCtx& operator=(const ThreadCtx&) = delete;

  // All nth threads of the current run meet here; no-op when nth == 1. Each
  // thread bumps its own arrival counter and spins on the others' (after an
  // adaptive 2-200 us of waiting it sleeps on a futex instead). Memory written
  // before the barrier by any thread is visible after it on every thread. If
  // another thread of the run has thrown, barrier() throws an internal
  // exception that unwinds this thread out of the run as well (the pool
  // swallows it and rethrows the original exception on the caller).
  void barrier();

  // Per-thread scratch: 64-byte aligned, at least `bytes` long, grows when asked
  // for more, kept across runs; contents unspecified. Valid until this
  // thread's next scratch() call, which any kernel (e.g. gemm) may make: do
  // not hold it across calls into other kernels.
  void* scratch(size_t bytes);

  // One scratch buffer shared by all threads of the pool (same pointer on every
  // thread); 64-byte aligned, at least `bytes` long, contents unspecified.
  // Collective: every thread of the run must call it with the same `bytes`
  // (it contains two barriers). Valid until the next shared_scratch() call.
  void* shared_scratch(size_t bytes);

  // nth counters, all 0, for the threads of a collective call to claim work
  // units from (counter i: thread i's units; a thread done with its own takes
  // the others'), without the barrier that zeroing them would need. Every
  // thread of the run must call it once at the start of the call, and the
  // call must end with barrier() (gemm does). Two sets alternate: the set of
  // call n is zeroed, slot by slot, by each thread at the start of call n + 1
  // (everyone is done with it: they all passed the barrier ending call n), so
  // it is zero again before anyone reaches call n + 2. The first call of a run
  // zeroes both sets itself, behind one barrier (a run that threw may have
  // left them dirty). A standalone context (nth == 1) gets its own counter.
  WorkCounter* work_counters();

 private:
  friend class ThreadPool;
  friend struct PoolState;
  struct Buffer {
    void* ptr = nullptr;
    size_t size = 0;
    void* get(size_t bytes);
    ~Buffer();
  };
  PoolState* pool_ = nullptr;   // null for a standalone context
  uint32_t barriers_ = 0;       // barriers reached in the current run
  uint32_t counter_calls_ = 0;  // work_counters() calls in the current run
  int64_t spin_ns_ = 50'000;    // adaptive spin budget of this thread's waits
  WaitStats stats_;
  Buffer scratch_;
  Buffer own_shared_;        // shared_scratch() of a standalone context
  WorkCounter own_counter_;  // work_counters() of a standalone context
};

class ThreadPool {
 public:
  // n_threads >= 1; the calling thread is thread 0, so n_threads-1 workers are
  // created.
  explicit ThreadPool(int n_threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const;

  // Runs fn on every thread (caller = thread 0) and returns when all have
  // returned. If fn throws on any thread, the first exception is rethrown on the
  // caller after all threads returned. Runs from different caller threads are
  // serialized; calling run() from inside fn is not allowed (it deadlocks).
  void run(const std::function<void(ThreadCtx&)>& fn);

 private:
  std::unique_ptr<PoolState> s_;
};

int default_thread_count();  // hardware_concurrency, at least 1

}  // namespace kiln::cpu
