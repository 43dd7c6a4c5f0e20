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

// A thread's range of tasks as one word: the job number in the high bits, then the range's
// begin and end, so a claim (one compare-exchange) also proves that neither the job nor the
// range changed since the word was read.
constexpr int kTaskBits = 22;
constexpr int64_t kMaxTasks = (int64_t{1} << kTaskBits) - 1;  // per job; more run in batches
constexpr uint64_t kTaskMask = kMaxTasks;

struct Range {
  uint64_t job;
  int64_t begin, end;
};
constexpr uint64_t Pack(uint64_t job, int64_t begin, int64_t end) {
  return job << (2 * kTaskBits) | static_cast<uint64_t>(begin) << kTaskBits |
         static_cast<uint64_t>(end);
}
constexpr Range Unpack(uint64_t word) {
  return {word >> (2 * kTaskBits), static_cast<int64_t>(word >> kTaskBits & kTaskMask),
          static_cast<int64_t>(word & kTaskMask)};
}

}  // namespace

// Protocol. The caller publishes a job (fn, n_tasks) by giving every thread a contiguous
// share of the tasks under a new job number, runs its own share, then takes tasks from the
// others' until none is left, and waits only for tasks that other threads have claimed: a
// worker that is slow to wake (the machine may be oversubscribed) never delays the caller, it
// just finds its share taken. Every share is empty once a job is done, so a non-empty one is
// always the current job's; a thread reads fn only after seeing one and acts only after a
// claim on that very word succeeds. All of this relies on the sequentially consistent default
// ordering of the atomics involved.
struct ThreadPool::Impl {
  explicit Impl(int n_threads) : size(n_threads), shares(n_threads) {}

  // Runs the tasks of the thread's own share front to back, a few at a time, then takes the
  // back half of the largest share left and makes it its own, until every share is empty.
  // Contiguous shares keep each thread's reads of a decode matmul one stream, where claims
  // scattered through the matrix restarted the hardware prefetcher at every claim
  // (docs/performance.md); taking from others' shares keeps the threads finishing together
  // when one of them is slowed by other processes.
  void RunTasks(int thread) {
    std::atomic<uint64_t>& own = shares[thread].word;
    int64_t ran = 0;
    for (;;) {
      uint64_t word = own.load();
      const Range r = Unpack(word);
      if (r.begin == r.end) {
        if (Steal(thread, r.job)) continue;
        // Counted once, on the way out: a count per claim moved the line between the cores
        // every few tasks, a locked instruction each time in the middle of a stream of reads.
        if (ran > 0 && tasks_done.fetch_add(ran) + ran == n_tasks.load() &&
            caller_asleep.load()) {
          tasks_done.notify_one();
        }
        return;
      }
      // A few at a time: each claim is a compare-exchange on a line others only read when
      // they run out, and what is left stays for them to take.
      const int64_t take = std::max<int64_t>(1, (r.end - r.begin) / 8);
      if (!own.compare_exchange_weak(word, Pack(r.job, r.begin + take, r.end))) continue;
      const auto* job_fn = fn.load();
      for (int64_t task = r.begin; task < r.begin + take; ++task) (*job_fn)(task, thread);
      ran += take;
    }
  }

  // Moves the back half of the largest other share of job_now, the job of the thread's own
  // share when it was read empty, into its own; false when there is none. Only that job's
  // shares: the caller writes every share when it publishes a job, and would overwrite a
  // range taken from a share it published first into one it had not reached yet.
  bool Steal(int thread, uint64_t job_now) {
    for (;;) {
      int victim = -1;
      uint64_t victim_word = 0;
      Range r{job_now, 0, 0};  // the victim's share
      for (int t = 0; t < size; ++t) {
        if (t == thread) continue;
        const uint64_t w = shares[t].word.load();
        const Range share = Unpack(w);
        if (share.job == job_now && share.end - share.begin > r.end - r.begin) {
          victim = t;
          victim_word = w;
          r = share;
        }
      }
      if (victim < 0) return false;
      const int64_t split = r.end - (r.end - r.begin + 1) / 2;
      if (!shares[victim].word.compare_exchange_weak(victim_word, Pack(r.job, r.begin, split))) {
        continue;
      }
      // Nobody writes an empty share but its owner, and the job cannot end before the tasks
      // taken here have run.
      shares[thread].word.store(Pack(r.job, split, r.end));
      return true;
    }
  }

  void WorkerMain(int thread) {
    uint32_t seen = 0;
    for (;;) {
      if (!SpinUntil([&] { return wake.load() != seen; })) {
        asleep.fetch_add(1);
        wake.wait(seen);
        asleep.fetch_sub(1);
      }
      seen = wake.load();
      if (stop.load()) return;
      RunTasks(thread);
    }
  }

  // Own cache lines: a thread's claims write its share, every finished task tasks_done,
  // while idle workers poll wake.
  struct alignas(64) Share {
    std::atomic<uint64_t> word{0};
  };

  const int size;
  std::vector<std::thread> workers;
  std::atomic<const FunctionRef<void(int64_t, int)>*> fn{nullptr};
  std::atomic<int64_t> n_tasks{0};
  std::atomic<bool> stop{false};
  uint64_t job = 0;  // the caller's: the number of the last job published
  std::vector<Share> shares;
  alignas(64) std::atomic<int64_t> tasks_done{0};
  alignas(64) std::atomic<uint32_t> wake{0};  // bumped once per job; sleepers wait on it
  // Who may be asleep in wait(). std::atomic's notify makes a futex call whenever any thread
  // of the process waits on an address of the same hash bucket, and libstdc++ puts every
  // 64-byte-aligned address in one bucket: one sleeping worker of another pool (a second
  // engine, the bench's probe) cost every job of this one two system calls. A notify happens
  // only where one of these is set; each is set before its wait() reads the value it waits
  // on, and the notifier changes that value before reading these (all sequentially
  // consistent), so a sleeper is never missed.
  std::atomic<int> asleep{0};  // workers
  std::atomic<bool> caller_asleep{false};
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

void ThreadPool::ParallelFor(int64_t n_tasks, FunctionRef<void(int64_t task, int thread)> fn) {
  if (n_tasks <= 0) return;
  if (impl_->workers.empty() || n_tasks == 1) {
    for (int64_t task = 0; task < n_tasks; ++task) fn(task, 0);
    return;
  }
  if (n_tasks > kMaxTasks) {  // in batches that fit a share's word
    for (int64_t first = 0; first < n_tasks; first += kMaxTasks) {
      const int64_t first_task = first;
      ParallelFor(std::min(kMaxTasks, n_tasks - first),
                  [&fn, first_task](int64_t task, int thread) { fn(first_task + task, thread); });
    }
    return;
  }
  Impl& p = *impl_;
  // Every share is empty here (the last job is done): nothing can be claimed while the job's
  // fields change. The job number wraps after 2^20 jobs; a thread would have to stall across
  // exactly that many between reading a share and claiming from it for a stale claim to match.
  p.job = (p.job + 1) & ((uint64_t{1} << (64 - 2 * kTaskBits)) - 1);
  p.fn.store(&fn);
  p.n_tasks.store(n_tasks);
  p.tasks_done.store(0);
  for (int t = 0; t < p.size; ++t) {
    p.shares[t].word.store(Pack(p.job, n_tasks * t / p.size, n_tasks * (t + 1) / p.size));
  }
  p.wake.fetch_add(1);
  if (p.asleep.load() > 0) p.wake.notify_all();
  p.RunTasks(0);
  if (!SpinUntil([&] { return p.tasks_done.load() == n_tasks; })) {
    p.caller_asleep.store(true);
    for (int64_t done; (done = p.tasks_done.load()) != n_tasks;) p.tasks_done.wait(done);
    p.caller_asleep.store(false);
  }
}

}  // namespace kvllm
