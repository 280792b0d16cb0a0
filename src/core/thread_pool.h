// A small persistent thread pool for the CPU backend: parallel_for over an index
// range, split into one contiguous chunk per thread (llama.cpp's ggml threadpool
// does the same for its matmuls). The calling thread takes part in the work.
#pragma once
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace dhs {

class ThreadPool {
 public:
  // n_threads == 0: one per hardware thread.
  explicit ThreadPool(int n_threads = 0);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int n_threads() const { return n_threads_; }

  // Calls fn(begin, end, thread_idx) on disjoint chunks covering [0, n).
  // Chunks are multiples of `grain` (except the last). Blocks until done.
  void parallel_for(int64_t n, const std::function<void(int64_t, int64_t, int)>& fn,
                    int64_t grain = 1);

  // Process-wide pool used by the CPU backend.
  static ThreadPool& global();
  // Resize the global pool (call before first use; e.g. from --threads). At most one thread
  // per hardware thread: more only time-slice the same cores, and the spin-waits of
  // parallel_for then make a decode step several times slower (-t 8 on 2 cores: ~7x).
  // Returns the pool size it will use (n_threads <= 0: all hardware threads).
  static int set_global_threads(int n_threads);
  // std::thread::hardware_concurrency(), or 1 when unknown.
  static int hardware_threads();

 private:
  void worker(int idx);

  int n_threads_;
  std::vector<std::thread> workers_;
  std::mutex mu_;
  std::condition_variable cv_start_, cv_done_;
  const std::function<void(int64_t, int64_t, int)>* job_ = nullptr;
  int64_t job_n_ = 0, job_grain_ = 1;
  uint64_t generation_ = 0;
  bool stop_ = false;
  std::atomic<uint64_t> generation_atomic_{0};
  std::atomic<int> pending_atomic_{0};
  std::atomic<bool> stop_atomic_{false};
};

}  // namespace dhs
