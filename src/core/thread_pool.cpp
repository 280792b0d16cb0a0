#include "core/thread_pool.h"

#include <immintrin.h>

#include <algorithm>
#include <memory>

namespace dhs {

namespace {
std::unique_ptr<ThreadPool>& global_slot() {
  static std::unique_ptr<ThreadPool> pool;
  return pool;
}
int g_requested_threads = 0;

// The chunk of [0, n) that thread `idx` of `n_threads` owns, in units of grain.
void chunk_of(int64_t n, int64_t grain, int idx, int n_threads, int64_t* b, int64_t* e) {
  const int64_t n_units = (n + grain - 1) / grain;
  const int64_t per = n_units / n_threads, extra = n_units % n_threads;
  const int64_t ub = idx * per + std::min<int64_t>(idx, extra);
  const int64_t ue = ub + per + (idx < extra ? 1 : 0);
  *b = std::min(n, ub * grain);
  *e = std::min(n, ue * grain);
}
}  // namespace

ThreadPool::ThreadPool(int n_threads) {
  if (n_threads <= 0) n_threads = hardware_threads();
  n_threads_ = n_threads;
  for (int i = 1; i < n_threads_; ++i) workers_.emplace_back([this, i] { worker(i); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    stop_ = true;
    stop_atomic_.store(true);
  }
  cv_start_.notify_all();
  for (auto& t : workers_) t.join();
}

void ThreadPool::worker(int idx) {
  uint64_t seen = 0;
  for (;;) {
    // Spin briefly before sleeping: a decode step issues a few hundred short
    // parallel_for calls, and a condition-variable wake-up each time (tens of
    // microseconds) would cost more than the work.
    for (int spin = 0; spin < 2000 && generation_atomic_.load(std::memory_order_acquire) == seen &&
                       !stop_atomic_.load(std::memory_order_relaxed);
         ++spin) {
      _mm_pause();
    }
    const std::function<void(int64_t, int64_t, int)>* job;
    int64_t n, grain;
    {
      std::unique_lock<std::mutex> lk(mu_);
      cv_start_.wait(lk, [&] { return stop_ || generation_ != seen; });
      if (stop_) return;
      seen = generation_;
      job = job_;
      n = job_n_;
      grain = job_grain_;
    }
    int64_t b, e;
    chunk_of(n, grain, idx, n_threads_, &b, &e);
    if (b < e) (*job)(b, e, idx);
    if (pending_atomic_.fetch_sub(1, std::memory_order_acq_rel) == 1) {
      std::lock_guard<std::mutex> lk(mu_);
      cv_done_.notify_one();
    }
  }
}

void ThreadPool::parallel_for(int64_t n, const std::function<void(int64_t, int64_t, int)>& fn,
                              int64_t grain) {
  if (n <= 0) return;
  grain = std::max<int64_t>(grain, 1);
  if (n_threads_ == 1 || n <= grain) {
    fn(0, n, 0);
    return;
  }
  {
    std::lock_guard<std::mutex> lk(mu_);
    job_ = &fn;
    job_n_ = n;
    job_grain_ = grain;
    pending_atomic_.store(n_threads_ - 1, std::memory_order_relaxed);
    ++generation_;
    generation_atomic_.store(generation_, std::memory_order_release);
  }
  cv_start_.notify_all();
  int64_t b, e;
  chunk_of(n, grain, 0, n_threads_, &b, &e);
  if (b < e) fn(b, e, 0);
  for (int spin = 0; spin < 2000 && pending_atomic_.load(std::memory_order_acquire) != 0; ++spin) _mm_pause();
  std::unique_lock<std::mutex> lk(mu_);
  cv_done_.wait(lk, [&] { return pending_atomic_.load(std::memory_order_acquire) == 0; });
  job_ = nullptr;
}

ThreadPool& ThreadPool::global() {
  auto& p = global_slot();
  if (!p) p = std::make_unique<ThreadPool>(g_requested_threads);
  return *p;
}

int ThreadPool::hardware_threads() { return static_cast<int>(std::max(1u, std::thread::hardware_concurrency())); }

int ThreadPool::set_global_threads(int n_threads) {
  const int n = n_threads <= 0 ? hardware_threads() : std::min(n_threads, hardware_threads());
  g_requested_threads = n;
  global_slot().reset();
  return n;
}

}  // namespace dhs
