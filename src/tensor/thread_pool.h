// ThreadPool: a fixed set of worker threads that live as long as the pool; the caller's thread
// takes part as worker 0. ParallelFor blocks until every task has run. No thread is created
// and nothing is allocated per call. Idle workers poll for a few tens of microseconds, then
// sleep on a futex, so an idle pool costs no CPU.
//
// Thread safety: a pool is driven by one caller thread at a time (calls from several threads
// must be serialized by the user). fn runs concurrently on up to size() threads, must not
// throw, and must not call ParallelFor on the same pool. size() may be called from any thread.
#pragma once

#include <cstdint>
#include "base/function_ref.h"

namespace kvllm {

class ThreadPool {
 public:
  // n_threads >= 1 counts the caller; 0 means one per online CPU.
  explicit ThreadPool(int n_threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const;
  // Runs fn(task, thread) for task in [0, n_tasks); thread in [0, size()) identifies the worker
  // (for per-thread scratch). Each thread starts on its own contiguous share of the tasks,
  // in order, and then takes the back half of the largest share left, so tasks next to each
  // other mostly run on one thread, one after another.
  void ParallelFor(int64_t n_tasks, FunctionRef<void(int64_t task, int thread)> fn);

 private:
  struct Impl;
  Impl* impl_;
};

}  // namespace kvllm
