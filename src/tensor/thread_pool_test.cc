#include "tensor/thread_pool.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <random>
#include <thread>
#include <vector>

namespace kvllm {
namespace {

TEST(ThreadPoolTest, SizeCountsTheCaller) {
  EXPECT_EQ(ThreadPool(1).size(), 1);
  EXPECT_EQ(ThreadPool(3).size(), 3);
  const int hw = static_cast<int>(std::thread::hardware_concurrency());
  EXPECT_EQ(ThreadPool(0).size(), hw > 0 ? hw : 1);
}

TEST(ThreadPoolTest, EveryTaskRunsExactlyOnceOnAValidThread) {
  for (int n_threads : {1, 2, 3, 4}) {
    ThreadPool pool(n_threads);
    for (int64_t n_tasks : {1, 2, 3, 5, 64, 1000}) {
      std::vector<std::atomic<int>> runs(n_tasks);
      std::atomic<bool> bad_thread{false};
      pool.ParallelFor(n_tasks, [&](int64_t task, int thread) {
        runs[task].fetch_add(1, std::memory_order_relaxed);
        if (thread < 0 || thread >= pool.size()) bad_thread = true;
      });
      for (int64_t t = 0; t < n_tasks; ++t) {
        EXPECT_EQ(runs[t].load(), 1) << "threads=" << n_threads << " task " << t;
      }
      EXPECT_FALSE(bad_thread);
    }
  }
}

TEST(ThreadPoolTest, TasksRunOnceWhileThreadsTakeFromEachOthersShares) {
  // More threads than CPUs and uneven tasks: shares run out at different times, and threads
  // that wake late find theirs taken, call after call.
  ThreadPool pool(5);
  for (int call = 0; call < 2000; ++call) {
    const int64_t n_tasks = call % 37 + 2;
    std::vector<std::atomic<int>> runs(n_tasks);
    pool.ParallelFor(n_tasks, [&](int64_t task, int) {
      if (task % 7 == 0) std::this_thread::yield();
      runs[task].fetch_add(1, std::memory_order_relaxed);
    });
    for (int64_t t = 0; t < n_tasks; ++t) ASSERT_EQ(runs[t].load(), 1) << "call " << call;
  }
}

TEST(ThreadPoolTest, ASlowThreadsShareIsTakenByTheOthers) {
  // Thread 0's first task blocks until some other thread has run a task of thread 0's share
  // (the first half): only taking from another's share gets there.
  ThreadPool pool(2);
  std::atomic<bool> taken{false};
  pool.ParallelFor(8, [&](int64_t task, int thread) {
    if (thread != 0 && task < 4) taken = true;
    if (thread == 0 && task == 0) {
      for (int i = 0; i < 20000 && !taken; ++i) {
        std::this_thread::sleep_for(std::chrono::microseconds(100));
      }
    }
  });
  EXPECT_TRUE(taken.load());
}

TEST(ThreadPoolTest, MoreTasksThanAShareHoldsRunInBatches) {
  ThreadPool pool(2);
  constexpr int64_t kTasks = (int64_t{1} << 22) + 5;  // past a share's 22-bit task numbers
  std::vector<uint8_t> runs(kTasks);
  pool.ParallelFor(kTasks, [&](int64_t task, int) { ++runs[task]; });
  int64_t once = 0;
  for (uint8_t r : runs) once += r == 1;
  EXPECT_EQ(once, kTasks);
}

TEST(ThreadPoolTest, ZeroTasksRunsNothing) {
  ThreadPool pool(3);
  int calls = 0;
  pool.ParallelFor(0, [&](int64_t, int) { ++calls; });
  pool.ParallelFor(-1, [&](int64_t, int) { ++calls; });
  EXPECT_EQ(calls, 0);
}

TEST(ThreadPoolTest, OneTaskRunsOnTheCaller) {
  ThreadPool pool(3);
  const std::thread::id caller = std::this_thread::get_id();
  std::thread::id ran_on;
  int thread_index = -1;
  pool.ParallelFor(1, [&](int64_t, int thread) {
    ran_on = std::this_thread::get_id();
    thread_index = thread;
  });
  EXPECT_EQ(ran_on, caller);
  EXPECT_EQ(thread_index, 0);
}

TEST(ThreadPoolTest, ThreadIndexIdentifiesOneThread) {
  // Per-thread scratch relies on an index never being used by two threads at once.
  ThreadPool pool(3);
  std::vector<std::atomic<int>> in_use(pool.size());
  std::atomic<bool> overlap{false};
  for (int round = 0; round < 50; ++round) {
    pool.ParallelFor(64, [&](int64_t, int thread) {
      if (in_use[thread].fetch_add(1) != 0) overlap = true;
      std::this_thread::yield();
      in_use[thread].fetch_sub(1);
    });
  }
  EXPECT_FALSE(overlap);
}

TEST(ThreadPoolTest, ManyConsecutiveCallsComplete) {
  ThreadPool pool(3);
  std::atomic<int64_t> sum{0};
  constexpr int kCalls = 10000;
  for (int call = 0; call < kCalls; ++call) {
    pool.ParallelFor(4, [&](int64_t task, int) { sum.fetch_add(task + 1); });
  }
  EXPECT_EQ(sum.load(), int64_t{kCalls} * 10);
}

TEST(ThreadPoolTest, CallsAfterWorkersFellAsleep) {
  // Long enough gaps that the workers stop polling and block in the kernel; each call's
  // tasks take long enough that a woken worker gets some (the caller would run them all
  // alone if the worker were never woken).
  ThreadPool pool(2);
  std::atomic<int> on_worker{0};
  for (int call = 0; call < 5; ++call) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
    std::atomic<int> count{0};
    pool.ParallelFor(8, [&](int64_t, int thread) {
      std::this_thread::sleep_for(std::chrono::milliseconds(2));  // 16 ms a call, alone
      count.fetch_add(1);
      if (thread == 1) on_worker.fetch_add(1);
    });
    EXPECT_EQ(count.load(), 8);
  }
  EXPECT_GT(on_worker.load(), 0);
}

TEST(ThreadPoolTest, WaitsForSlowTasksOnOtherThreads) {
  // Tasks outlast the caller's polling, so it has to sleep until the last one finishes.
  ThreadPool pool(3);
  for (int call = 0; call < 3; ++call) {
    std::vector<std::atomic<bool>> finished(6);
    pool.ParallelFor(6, [&](int64_t task, int) {
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
      finished[task] = true;
    });
    for (const auto& f : finished) EXPECT_TRUE(f.load());
  }
}

TEST(ThreadPoolTest, CallsAtGapsAroundThePollingTimeComplete) {
  // Gaps and tasks near the 50 us a thread polls before it sleeps, so that workers and the
  // caller keep falling asleep just as they are woken; with a second pool asleep beside
  // this one, whose waits share this one's futex bucket in the standard library.
  ThreadPool other(2);
  other.ParallelFor(2, [](int64_t, int) {});
  ThreadPool pool(2);
  std::mt19937 rng(7);
  std::uniform_int_distribution<int> us(0, 120);
  for (int call = 0; call < 400; ++call) {
    const auto gap = std::chrono::microseconds(us(rng));
    const auto start = std::chrono::steady_clock::now();
    while (std::chrono::steady_clock::now() - start < gap) {
    }
    const auto work = std::chrono::microseconds(us(rng));
    std::atomic<int> count{0};
    pool.ParallelFor(4, [&](int64_t task, int) {
      if (task == 3) std::this_thread::sleep_for(work);
      count.fetch_add(1);
    });
    ASSERT_EQ(count.load(), 4);
  }
}

TEST(ThreadPoolTest, DestroysIdleAndUnusedPools) {
  { ThreadPool unused(4); }
  ThreadPool pool(2);
  pool.ParallelFor(3, [](int64_t, int) {});
}

}  // namespace
}  // namespace kvllm
