#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <set>
#include <stdexcept>
#include <thread>
#include <vector>

#include "backends/cpu/thread_pool.h"

using kiln::cpu::ThreadCtx;
using kiln::cpu::ThreadPool;

TEST(ThreadPool, EveryThreadRunsOnce) {
  for (int n : {1, 2, 3, 4}) {
    ThreadPool pool(n);
    EXPECT_EQ(pool.size(), n);
    std::vector<std::atomic<int>> hits(n);
    std::atomic<int> bad_nth{0};
    pool.run([&](ThreadCtx& t) {
      if (t.nth != n) bad_nth++;
      hits[t.ith]++;
    });
    EXPECT_EQ(bad_nth.load(), 0);
    for (int i = 0; i < n; ++i) EXPECT_EQ(hits[i].load(), 1) << "thread " << i;
  }
}

TEST(ThreadPool, CallerIsThreadZero) {
  ThreadPool pool(3);
  const auto caller = std::this_thread::get_id();
  std::vector<std::thread::id> ids(3);
  pool.run([&](ThreadCtx& t) { ids[t.ith] = std::this_thread::get_id(); });
  EXPECT_EQ(ids[0], caller);
  EXPECT_EQ(std::set<std::thread::id>(ids.begin(), ids.end()).size(), 3u);
}

TEST(ThreadPool, BarriersOrderWork) {
  for (int n : {2, 3}) {
    ThreadPool pool(n);
    constexpr int kRounds = 1000;
    std::vector<int> slot(n, -1);
    std::atomic<int> errors{0};
    pool.run([&](ThreadCtx& t) {
      for (int r = 0; r < kRounds; ++r) {
        slot[t.ith] = r;  // plain writes, ordered by the barriers
        t.barrier();
        for (int i = 0; i < t.nth; ++i)
          if (slot[i] != r) errors++;
        t.barrier();
      }
    });
    EXPECT_EQ(errors.load(), 0) << "n=" << n;
  }
}

TEST(ThreadPool, ManyRunsInARow) {
  ThreadPool pool(2);
  std::atomic<int64_t> sum{0};
  for (int r = 0; r < 20000; ++r) pool.run([&](ThreadCtx& t) { sum += t.ith + 1; });
  EXPECT_EQ(sum.load(), 20000 * 3);
}

TEST(ThreadPool, RunsAfterWorkersWentToSleep) {
  ThreadPool pool(3);
  std::atomic<int> count{0};
  for (int r = 0; r < 5; ++r) {
    std::this_thread::sleep_for(std::chrono::milliseconds(3));  // past the 1 ms idle spin
    pool.run([&](ThreadCtx& t) {
      t.barrier();
      count++;
    });
  }
  EXPECT_EQ(count.load(), 15);
}

TEST(ThreadPool, ExceptionOnWorkerPropagates) {
  ThreadPool pool(2);
  EXPECT_THROW(pool.run([](ThreadCtx& t) {
    if (t.ith == 1) throw std::runtime_error("worker failed");
  }),
               std::runtime_error);
  // The pool is still usable.
  std::atomic<int> count{0};
  pool.run([&](ThreadCtx&) { count++; });
  EXPECT_EQ(count.load(), 2);
}

TEST(ThreadPool, ExceptionOnCallerPropagatesAfterAllReturned) {
  ThreadPool pool(3);
  std::atomic<int> finished{0};
  try {
    pool.run([&](ThreadCtx& t) {
      if (t.ith == 0) throw std::logic_error("caller failed");
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
      finished++;
    });
    FAIL() << "no exception";
  } catch (const std::logic_error& e) {
    EXPECT_STREQ(e.what(), "caller failed");
    EXPECT_EQ(finished.load(), 2);  // workers had returned before the rethrow
  }
}

TEST(ThreadPool, ExceptionWhileOthersWaitAtBarrier) {
  ThreadPool pool(3);
  for (int r = 0; r < 50; ++r) {
    EXPECT_THROW(pool.run([](ThreadCtx& t) {
      if (t.ith == 2) throw std::runtime_error("boom");
      for (int i = 0; i < 10; ++i) t.barrier();  // would deadlock without abort
    }),
                 std::runtime_error);
  }
  std::atomic<int> count{0};
  pool.run([&](ThreadCtx& t) {
    t.barrier();
    count++;
  });
  EXPECT_EQ(count.load(), 3);
}

TEST(ThreadPool, ExceptionAtRandomPointsNeverDeadlocks) {
  ThreadPool pool(4);
  for (int r = 0; r < 200; ++r) {
    const int who = r % 4, when = (r * 7) % 13;
    EXPECT_THROW(pool.run([&](ThreadCtx& t) {
      for (int i = 0; i < 20; ++i) {
        if (t.ith == who && i == when) throw std::runtime_error("x");
        t.barrier();
      }
    }),
                 std::runtime_error);
  }
  std::atomic<int> count{0};  // barriers work again afterwards
  pool.run([&](ThreadCtx& t) {
    for (int i = 0; i < 100; ++i) t.barrier();
    count++;
  });
  EXPECT_EQ(count.load(), 4);
}

TEST(ThreadPool, FirstExceptionWins) {
  ThreadPool pool(2);
  for (int r = 0; r < 20; ++r) {
    try {
      pool.run([](ThreadCtx& t) { throw std::runtime_error(t.ith == 0 ? "a" : "b"); });
      FAIL();
    } catch (const std::runtime_error& e) {
      const std::string w = e.what();
      EXPECT_TRUE(w == "a" || w == "b");
    }
  }
}

TEST(ThreadPool, PoolOfOne) {
  ThreadPool pool(1);
  EXPECT_EQ(pool.size(), 1);
  int calls = 0;
  pool.run([&](ThreadCtx& t) {
    EXPECT_EQ(t.ith, 0);
    EXPECT_EQ(t.nth, 1);
    t.barrier();  // no-op
    calls++;
  });
  EXPECT_EQ(calls, 1);
  EXPECT_THROW(pool.run([](ThreadCtx&) { throw std::runtime_error("x"); }), std::runtime_error);
}

TEST(ThreadPool, StandaloneCtx) {
  ThreadCtx t;
  EXPECT_EQ(t.ith, 0);
  EXPECT_EQ(t.nth, 1);
  t.barrier();
  void* p = t.scratch(100);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(p) % 64, 0u);
  void* s = t.shared_scratch(100);
  EXPECT_NE(s, nullptr);
  EXPECT_NE(s, p);
}

TEST(ThreadPool, ScratchAlignedGrowsAndIsKept) {
  ThreadPool pool(2);
  std::vector<void*> first(2), second(2), big(2);
  pool.run([&](ThreadCtx& t) {
    first[t.ith] = t.scratch(1000);
    static_cast<char*>(first[t.ith])[999] = 1;
  });
  pool.run([&](ThreadCtx& t) { second[t.ith] = t.scratch(500); });
  pool.run([&](ThreadCtx& t) {
    big[t.ith] = t.scratch(10 << 20);
    static_cast<char*>(big[t.ith])[(10 << 20) - 1] = 1;
  });
  for (int i = 0; i < 2; ++i) {
    EXPECT_EQ(reinterpret_cast<uintptr_t>(first[i]) % 64, 0u);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(big[i]) % 64, 0u);
    EXPECT_EQ(first[i], second[i]);  // kept across runs, no shrink
  }
  EXPECT_NE(first[0], first[1]);
  EXPECT_NE(big[0], big[1]);
}

TEST(ThreadPool, SharedScratchIsShared) {
  ThreadPool pool(3);
  std::vector<void*> p(3);
  std::atomic<int> errors{0};
  pool.run([&](ThreadCtx& t) {
    int* s = static_cast<int*>(t.shared_scratch(3 * sizeof(int)));
    p[t.ith] = s;
    s[t.ith] = t.ith + 10;
    t.barrier();
    for (int i = 0; i < 3; ++i)
      if (s[i] != i + 10) errors++;
  });
  EXPECT_EQ(errors.load(), 0);
  EXPECT_EQ(p[0], p[1]);
  EXPECT_EQ(p[0], p[2]);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(p[0]) % 64, 0u);
}

// Each call claims units (some per thread, stolen by whoever is free) from its
// work counters; every unit must be claimed exactly once, call after call,
// run after run, and after a run that threw with counters half used.
TEST(ThreadPool, WorkCountersClaimEveryUnitOnce) {
  constexpr int kThreads = 3, kCalls = 300;
  ThreadPool pool(kThreads);
  auto units_of = [](int call, int i) { return (call * 7 + i * 3) % 11; };  // some 0
  std::vector<std::atomic<int>> claims(kCalls * kThreads * 11);
  auto one_call = [&](ThreadCtx& t, int call) {
    kiln::cpu::WorkCounter* c = t.work_counters();
    for (int v = 0; v < t.nth; ++v) {
      const int i = (t.ith + v) % t.nth;
      for (int64_t u; (u = c[i].next.fetch_add(1)) < units_of(call, i);) {
        claims[(call * kThreads + i) * 11 + u]++;
        if ((u + t.ith) % 4 == 0) std::this_thread::yield();  // let others steal
      }
    }
    t.barrier();
  };
  for (int run = 0; run < 3; ++run) {
    for (auto& c : claims) c = 0;
    if (run == 1) {  // a run that throws in its second call, after claiming
      EXPECT_THROW(pool.run([&](ThreadCtx& t) {
        one_call(t, 0);
        kiln::cpu::WorkCounter* c = t.work_counters();
        c[t.ith].next.fetch_add(1);
        if (t.ith == 1) throw std::runtime_error("boom");
        t.barrier();
      }),
                   std::runtime_error);
      for (auto& c : claims) c = 0;
    }
    pool.run([&](ThreadCtx& t) {
      for (int call = 0; call < kCalls; ++call) one_call(t, call);
    });
    int wrong = 0;
    for (int call = 0; call < kCalls; ++call)
      for (int i = 0; i < kThreads; ++i)
        for (int u = 0; u < 11; ++u)
          wrong += claims[(call * kThreads + i) * 11 + u] != (u < units_of(call, i) ? 1 : 0);
    EXPECT_EQ(wrong, 0) << "run " << run;
  }
  ThreadCtx alone;  // standalone: one counter, zeroed on every call
  alone.work_counters()->next = 5;
  EXPECT_EQ(alone.work_counters()->next.load(), 0);
}

TEST(ThreadPool, DefaultThreadCount) { EXPECT_GE(kiln::cpu::default_thread_count(), 1); }
