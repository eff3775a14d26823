#include "backends/cpu/thread_pool.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <mutex>
#include <new>
#include <thread>
#include <vector>

#if defined(__x86_64__) || defined(__i386__)
#include "backends/cpu/intrinsics.h"
#endif
#if defined(__linux__)
#include <sys/mman.h>
#endif

namespace kiln::cpu {

namespace {

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  _mm_pause();
#elif defined(__aarch64__)
  asm volatile("yield" ::: "memory");
#endif
}

using Clock = std::chrono::steady_clock;

// How long a thread spins before it sleeps (futex, via std::atomic::wait).
// Spinning keeps back-to-back runs and barriers cheap; sleeping keeps an idle
// pool off the CPU. An idle worker waiting for the next run spins kIdleSpinNs
// (long enough to bridge the gap between graph runs of a training loop: waking
// a sleeping worker costs 50-250 us on this VM).
// Waits inside a run (barriers, the caller joining the workers) adapt their
// spin budget per thread between kMinSpinNs and kMaxSpinNs: it doubles when a
// wait ends while spinning (unless a yield made it last over twice the
// budget: then it halves), and when it ends in sleep it halves, unless the
// thread waited for arrived within twice the budget (barriers know: a thread
// that wakes a sleeper stamps the time it arrived), then it doubles too. So
// when waits are a little longer than the budget (uneven nodes, small nodes
// run by one thread) the budget grows instead of collapsing into a sleep and a
// 50-250 us wake-up per barrier; when the threads share a core with each other
// or with other processes (the thread waited for is descheduled, spinning only
// delays it) waits are long and fall back to sleeping quickly. Past
// kYieldAfterNs of a wait every spin also yields the core, for the same reason
// (on a loaded 2-core machine a first yield at 20-50 us instead made kiln-gpt's
// training step 1.4-1.9x slower).
constexpr int64_t kIdleSpinNs = 1'000'000;
constexpr int64_t kMaxSpinNs = 200'000;
constexpr int64_t kMinSpinNs = 2'000;
constexpr int64_t kYieldAfterNs = 5'000;

int64_t now_ns() { return Clock::now().time_since_epoch().count(); }

// Waits until pred(word) holds: spins for up to *budget_ns, then sleeps on the
// word. `sleepers` counts sleeping threads so that a waker can skip the notify
// syscall: a waker stores to the word (seq_cst) and then calls wake() below.
// With adapt, *budget_ns is updated as described above; arrived_ns (or null)
// is where the waker stamps its arrival before it wakes a sleeper.
template <class T, class Pred>
T wait_until(std::atomic<T>& word, std::atomic<int>& sleepers, int64_t* budget_ns, bool adapt,
             const std::atomic<int64_t>* arrived_ns, WaitStats* st, Pred pred) {
  T cur;
  for (int i = 0; i < 64; ++i) {  // fast path: no clock reads
    if (pred(cur = word.load(std::memory_order_acquire))) {
      if (st) st->fast++;
      return cur;
    }
    cpu_relax();
  }
  const auto start = Clock::now();
  const auto limit = std::chrono::nanoseconds(*budget_ns);
  for (uint32_t i = 0;; ++i) {
    if (pred(cur = word.load(std::memory_order_acquire))) {
      const int64_t ns = (Clock::now() - start).count();
      // Far past the budget while spinning: a yield lost the core to another
      // process for a time slice. Sleeping sooner gives the core away without
      // that (and a woken sleeper is scheduled promptly).
      if (adapt)
        *budget_ns = ns <= 2 * *budget_ns ? std::min(*budget_ns * 2, kMaxSpinNs)
                                          : std::max(*budget_ns / 2, kMinSpinNs);
      if (st) {
        (ns > kYieldAfterNs ? st->yielded : st->spun)++;
        st->spin_ns += ns;
      }
      return cur;
    }
    cpu_relax();
    if ((i & 31) == 31) {
      const auto waited = Clock::now() - start;
      if (waited > limit) break;
      // Past the first few microseconds, let another runnable thread on this
      // core go first (e.g. the one being waited for, when the scheduler put
      // both on one core); returns at once when there is none.
      if (waited > std::chrono::nanoseconds(kYieldAfterNs)) std::this_thread::yield();
    }
  }
  // Dekker with wake(): either we see the new value or the waker sees us.
  sleepers.fetch_add(1, std::memory_order_seq_cst);
  while (!pred(cur = word.load(std::memory_order_seq_cst)))
    word.wait(cur, std::memory_order_seq_cst);
  sleepers.fetch_sub(1, std::memory_order_relaxed);
  if (adapt) {
    // How long the wait needed to be: to the waker's stamp; a stamp from
    // before this wait (the value came as we went to sleep) means ~the budget.
    const int64_t t0 = start.time_since_epoch().count();
    const int64_t at = arrived_ns ? arrived_ns->load(std::memory_order_relaxed) : 0;
    const int64_t needed = !arrived_ns ? INT64_MAX : at > t0 ? at - t0 : *budget_ns;
    *budget_ns = needed <= 2 * *budget_ns ? std::min(*budget_ns * 2, kMaxSpinNs)
                                          : std::max(*budget_ns / 2, kMinSpinNs);
  }
  if (st) {
    st->slept++;
    st->sleep_ns += (Clock::now() - start).count();
  }
  return cur;
}

template <class T>
void wake(std::atomic<T>& word, std::atomic<int>& sleepers,
          std::atomic<int64_t>* arrived_ns = nullptr) {
  if (sleepers.load(std::memory_order_seq_cst) > 0) {
    if (arrived_ns) arrived_ns->store(now_ns(), std::memory_order_relaxed);
    word.notify_all();
  }
}

// Thrown by barrier() on the threads of a run in which another thread threw;
// swallowed by the pool.
struct RunAborted {};

// Barrier: each thread publishes how many barriers of the current run it has
// reached in its own cache line and waits for everyone else's count to catch
// up (one line transfer per pair of threads, no shared counter). A thread that
// leaves a run by an exception stores kAborted, which releases and aborts
// everyone waiting for it.
struct alignas(64) Arrival {
  std::atomic<uint32_t> count{0};
  std::atomic<int> sleepers{0};
  std::atomic<int64_t> woke_at{0};  // now_ns() when this thread last woke a sleeper
};
constexpr uint32_t kAborted = ~uint32_t(0);

}  // namespace

struct PoolState {
  int n = 1;
  std::vector<std::unique_ptr<ThreadCtx>> ctx;
  std::unique_ptr<Arrival[]> arrival;
  std::vector<std::thread> workers;

  // Published by run() before gen is bumped.
  const std::function<void(ThreadCtx&)>* fn = nullptr;
  bool stop = false;
  std::exception_ptr exc;  // first exception of the run (guarded by `threw`)

  alignas(64) std::atomic<uint32_t> gen{0};  // bumped once per run
  std::atomic<int> gen_sleepers{0};
  alignas(64) std::atomic<int> pending{0};  // workers still running fn
  std::atomic<int> pending_sleepers{0};
  alignas(64) std::atomic<bool> threw{false};
  std::mutex run_m;
  ThreadCtx::Buffer shared;
  std::unique_ptr<WorkCounter[]> counters;  // ThreadCtx::work_counters: 2 sets of n

  void call(ThreadCtx& c) {
    try {
      (*fn)(c);
      return;
    } catch (const RunAborted&) {
    } catch (...) {
      if (!threw.exchange(true, std::memory_order_acq_rel)) exc = std::current_exception();
    }
    // Release (and abort) everyone waiting for this thread at a barrier.
    Arrival& a = arrival[c.ith];
    a.count.store(kAborted, std::memory_order_seq_cst);
    a.count.notify_all();
  }

  void worker_main(int ith) {
    uint32_t seen = 0;
    for (;;) {
      int64_t budget = kIdleSpinNs;
      seen = wait_until(gen, gen_sleepers, &budget, false, nullptr, nullptr,
                        [seen](uint32_t g) { return g != seen; });
      if (stop) return;
      call(*ctx[ith]);
      if (pending.fetch_sub(1, std::memory_order_seq_cst) == 1) wake(pending, pending_sleepers);
    }
  }

  // Publishes a new generation (after fn/stop were set) and wakes sleepers.
  void publish() {
    gen.fetch_add(1, std::memory_order_seq_cst);
    wake(gen, gen_sleepers);
  }
};

// ---------------------------------------------------------------------------
// ThreadCtx

void* ThreadCtx::Buffer::get(size_t bytes) {
  if (bytes <= size && ptr) return ptr;
  std::free(ptr);
  ptr = nullptr;
  size = 0;
  size_t want = bytes + bytes / 4;  // some headroom against repeated small growth
  if (want < 4096) want = 4096;
  const size_t huge = size_t(2) << 20;
  const size_t align = want >= huge ? huge : 64;
  want = (want + align - 1) / align * align;
  ptr = std::aligned_alloc(align, want);
  if (!ptr) throw std::bad_alloc();
#if defined(__linux__) && defined(MADV_HUGEPAGE)
  if (align == huge) madvise(ptr, want, MADV_HUGEPAGE);  // fewer TLB misses in GEMM packing
#endif
  size = want;
  return ptr;
}

ThreadCtx::Buffer::~Buffer() { std::free(ptr); }

ThreadCtx::~ThreadCtx() = default;

void ThreadCtx::barrier() {
  if (nth <= 1 || !pool_) return;
  Arrival* arr = pool_->arrival.get();
  const uint32_t e = ++barriers_;
  arr[ith].count.store(e, std::memory_order_seq_cst);
  wake(arr[ith].count, arr[ith].sleepers, &arr[ith].woke_at);
  for (int j = 0; j < nth; ++j) {
    if (j == ith) continue;
    const uint32_t c = wait_until(arr[j].count, arr[j].sleepers, &spin_ns_, true, &arr[j].woke_at,
                                  &stats_, [e](uint32_t v) { return v >= e; });
    if (c == kAborted) throw RunAborted{};
  }
}

void* ThreadCtx::scratch(size_t bytes) { return scratch_.get(bytes); }

void* ThreadCtx::shared_scratch(size_t bytes) {
  if (nth <= 1 || !pool_) return own_shared_.get(bytes);
  barrier();  // nobody still reads the previous contents
  if (ith == 0) pool_->shared.get(bytes);
  barrier();
  return pool_->shared.ptr;
}

WorkCounter* ThreadCtx::work_counters() {
  if (nth <= 1 || !pool_) {
    own_counter_.next.store(0, std::memory_order_relaxed);
    return &own_counter_;
  }
  WorkCounter* sets = pool_->counters.get();
  const uint32_t call = counter_calls_++;
  WorkCounter* mine = sets + size_t(call % 2) * size_t(nth);
  if (call == 0) {
    if (ith == 0)
      for (int i = 0; i < 2 * nth; ++i) sets[i].next.store(0, std::memory_order_relaxed);
    barrier();
  } else {
    // The previous call's set: everyone passed the barrier that ended it.
    sets[size_t((call + 1) % 2) * size_t(nth) + size_t(ith)].next.store(0,
                                                                        std::memory_order_relaxed);
  }
  return mine;
}

// ---------------------------------------------------------------------------
// ThreadPool

ThreadPool::ThreadPool(int n_threads) : s_(std::make_unique<PoolState>()) {
  if (n_threads < 1) n_threads = 1;
  s_->n = n_threads;
  for (int i = 0; i < n_threads; ++i) {
    auto c = std::make_unique<ThreadCtx>();
    c->ith = i;
    c->nth = n_threads;
    c->pool_ = s_.get();
    s_->ctx.push_back(std::move(c));
  }
  s_->arrival = std::make_unique<Arrival[]>(n_threads);
  s_->counters = std::make_unique<WorkCounter[]>(2 * size_t(n_threads));
  s_->workers.reserve(n_threads - 1);
  for (int i = 1; i < n_threads; ++i) {
    PoolState* s = s_.get();
    s_->workers.emplace_back([s, i] { s->worker_main(i); });
  }
}

ThreadPool::~ThreadPool() {
  if (const char* e = std::getenv("KILN_POOL_STATS"); e && *e && *e != '0') {
    for (const auto& c : s_->ctx) {
      const WaitStats& w = c->stats_;
      std::fprintf(stderr,
                   "kiln pool thread %d: barrier waits %llu: fast %llu, spun %llu (<=5us), "
                   "spun+yield %llu, slept %llu; spinning %.3f ms, sleeping %.3f ms\n",
                   c->ith, (unsigned long long)(w.fast + w.spun + w.yielded + w.slept),
                   (unsigned long long)w.fast, (unsigned long long)w.spun,
                   (unsigned long long)w.yielded, (unsigned long long)w.slept, w.spin_ns * 1e-6,
                   w.sleep_ns * 1e-6);
    }
  }
  {
    std::lock_guard<std::mutex> lk(s_->run_m);
    s_->stop = true;
    s_->publish();
  }
  for (auto& w : s_->workers) w.join();
}

int ThreadPool::size() const { return s_->n; }

void ThreadPool::run(const std::function<void(ThreadCtx&)>& fn) {
  PoolState& s = *s_;
  std::lock_guard<std::mutex> lk(s.run_m);
  if (s.n == 1) {
    fn(*s.ctx[0]);
    return;
  }
  s.fn = &fn;
  s.exc = nullptr;
  s.threw.store(false, std::memory_order_relaxed);
  for (int i = 0; i < s.n; ++i) {  // barrier counts restart with each run
    s.arrival[i].count.store(0, std::memory_order_relaxed);
    s.ctx[i]->barriers_ = 0;
    s.ctx[i]->counter_calls_ = 0;
  }
  s.pending.store(s.n - 1, std::memory_order_relaxed);
  s.publish();

  s.call(*s.ctx[0]);
  wait_until(s.pending, s.pending_sleepers, &s.ctx[0]->spin_ns_, true, nullptr, nullptr,
             [](int p) { return p == 0; });
  s.fn = nullptr;
  if (s.exc) {
    std::exception_ptr e = std::move(s.exc);
    s.exc = nullptr;
    std::rethrow_exception(e);
  }
}

int default_thread_count() {
  unsigned n = std::thread::hardware_concurrency();
  return n == 0 ? 1 : int(n);
}

}  // namespace kiln::cpu
