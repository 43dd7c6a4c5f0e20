#include "tensor/thread_pool.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <thread>
#include <vector>

#include "base/status.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

namespace kvllm {

namespace {

// How long a waiting thread polls before it sleeps in the kernel. A decode step issues its
// ParallelFor calls microseconds apart, so a short poll saves a futex wake-up per call; the
// bound keeps an idle pool from burning a CPU that other processes share.
constexpr auto kSpinTime = std::chrono::microseconds(50);

void CpuRelax() {
#if defined(__x86_64__) || defined(__i386__)
  _mm_pause();
#else
  std::this_thread::yield();
#endif
}

// Polls until done() holds or kSpinTime has passed; returns done().
template <class Done>
bool SpinUntil(Done done) {
  const auto deadline = std::chrono::steady_clock::now() + kSpinTime;
  for (;;) {
    // Reading the clock costs about as much as a few pauses, so check it every 64 polls.
    for (int i = 0; i < 64; ++i) {
      if (done()) return true;
      CpuRelax();
    }
    if (std::chrono::steady_clock::now() >= deadline) return done();
  }
}

// The task counter word: job number in the high bits, next task index in the low bits, so a
// claim (one compare-exchange) also proves the job has not changed since it was read.
constexpr int kIndexBits = 40;
constexpr uint64_t kIndexMask = (uint64_t{1} << kIndexBits) - 1;
// An index no job reaches: the word holds it while the caller swaps in the next job.
constexpr uint64_t kClosed = kIndexMask;

}  // namespace

// Protocol. The caller publishes a job (fn, n_tasks) under a new job number, runs tasks
// itself, then waits only for tasks that other threads have claimed: a worker that is slow to
// wake (the machine may be oversubscribed) never delays the caller, it just finds no task
// left. Workers may read a job's fields while the caller replaces them, but they only act on
// what they read after a successful claim, which fails once the job has changed. All of this
// relies on the sequentially consistent default ordering of the atomics involved.
struct ThreadPool::Impl {
  explicit Impl(int n_threads) : size(n_threads) {}

  // Claims and runs tasks of the current job until none is left. A claim takes a share of
  // the tasks left (guided scheduling): every claim and every count of finished tasks moves a
  // cache line between the cores, so claims are made few, while the last ones are single
  // tasks that let the threads finish together.
  void RunTasks(int thread) {
    for (;;) {
      uint64_t word = task_word.load();
      const auto* job_fn = fn.load();
      const int64_t job_tasks = n_tasks.load();
      const auto index = static_cast<int64_t>(word & kIndexMask);
      if (index >= job_tasks) return;
      const int64_t take = std::max<int64_t>(1, (job_tasks - index) / (2 * int64_t{size}));
      if (!task_word.compare_exchange_weak(word, word + static_cast<uint64_t>(take))) continue;
      for (int64_t task = index; task < index + take; ++task) (*job_fn)(task, thread);
      if (tasks_done.fetch_add(take) + take == job_tasks) tasks_done.notify_one();
    }
  }

  void WorkerMain(int thread) {
    uint32_t seen = 0;
    for (;;) {
      if (!SpinUntil([&] { return wake.load() != seen; })) wake.wait(seen);
      seen = wake.load();
      if (stop.load()) return;
      RunTasks(thread);
    }
  }

  const int size;
  std::vector<std::thread> workers;
  std::atomic<const std::function<void(int64_t, int)>*> fn{nullptr};
  std::atomic<int64_t> n_tasks{0};
  std::atomic<bool> stop{false};
  // Own cache lines: every claim writes task_word and every finished task tasks_done, while
  // idle workers poll wake.
  alignas(64) std::atomic<uint64_t> task_word{kClosed};
  alignas(64) std::atomic<int64_t> tasks_done{0};
  alignas(64) std::atomic<uint32_t> wake{0};  // bumped once per job; sleepers wait on it
};

ThreadPool::ThreadPool(int n_threads) {
  KVLLM_CHECK(n_threads >= 0);
  if (n_threads == 0) n_threads = static_cast<int>(std::thread::hardware_concurrency());
  if (n_threads == 0) n_threads = 1;  // the count is unknown on this platform
  impl_ = new Impl(n_threads);
  impl_->workers.reserve(n_threads - 1);
  for (int t = 1; t < n_threads; ++t) {
    impl_->workers.emplace_back([impl = impl_, t] { impl->WorkerMain(t); });
  }
}

ThreadPool::~ThreadPool() {
  impl_->stop.store(true);
  impl_->wake.fetch_add(1);
  impl_->wake.notify_all();
  for (std::thread& w : impl_->workers) w.join();
  delete impl_;
}

int ThreadPool::size() const { return impl_->size; }

void ThreadPool::ParallelFor(int64_t n_tasks,
                             const std::function<void(int64_t task, int thread)>& fn) {
  if (n_tasks <= 0) return;
  if (impl_->workers.empty() || n_tasks == 1) {
    for (int64_t task = 0; task < n_tasks; ++task) fn(task, 0);
    return;
  }
  KVLLM_CHECK(static_cast<uint64_t>(n_tasks) < kClosed);
  Impl& p = *impl_;
  // Close the counter before touching the job so that no claim can succeed against a
  // half-written job, then open it under the next job number. The number wraps after 2^24
  // jobs; a worker would have to stall across exactly that many for a stale claim to match.
  const uint64_t job = (p.task_word.load() >> kIndexBits) + 1;
  p.task_word.store((job << kIndexBits) | kClosed);
  p.fn.store(&fn);
  p.n_tasks.store(n_tasks);
  p.tasks_done.store(0);
  p.task_word.store(job << kIndexBits);
  p.wake.fetch_add(1);
  p.wake.notify_all();  // a no-op unless some worker is asleep
  p.RunTasks(0);
  if (!SpinUntil([&] { return p.tasks_done.load() == n_tasks; })) {
    for (int64_t done; (done = p.tasks_done.load()) != n_tasks;) p.tasks_done.wait(done);
  }
}

}  // namespace kvllm
