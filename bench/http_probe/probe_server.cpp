// The HTTP probe's server: the real HttpServer (src/server) over a fake model whose scheduler
// thread emits one token per running request every 1/rate seconds, the token's text being the
// emit time on CLOCK_MONOTONIC. A client (probe_client.py) opens many streams and measures how
// late each token arrives; this process prints, on SIGTERM, how late its own ticks fired (a
// scheduler starved by HTTP threads would fire late). Usage:
//   http_probe_server PORT RATE_HZ HTTP_THREADS
#include <signal.h>
#include <time.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <mutex>
#include <thread>
#include <vector>

#include "server/http_server.h"
#include "server/served_model.h"

namespace {

double mono_now() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

class TickScheduler final : public dhs::Scheduler {
 public:
  explicit TickScheduler(double rate_hz) : period_(1.0 / rate_hz) {}
  ~TickScheduler() override { stop(false); }
  const dhs::SchedulerOptions& options() const override { return opt_; }
  dhs::SubmitResult submit(dhs::RequestParams p, dhs::RequestSink sink) override {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopping_) return {dhs::SubmitStatus::ShuttingDown, 0, "stopping"};
    const uint64_t id = ++next_id_;
    reqs_[id] = Req{std::move(sink), static_cast<int64_t>(p.prompt.size()), p.options.max_tokens, 0};
    return {dhs::SubmitStatus::Accepted, id, ""};
  }
  void cancel(uint64_t id) override {
    std::lock_guard<std::mutex> lock(mu_);
    cancelled_.push_back(id);
  }
  bool step() override { return false; }
  void start() override {
    loop_ = std::thread([this] { run(); });
  }
  void stop(bool) override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stopping_ = true;
    }
    if (loop_.joinable()) loop_.join();
  }
  dhs::SchedulerStats stats() const override {
    std::lock_guard<std::mutex> lock(mu_);
    dhs::SchedulerStats s;
    s.n_running = static_cast<int64_t>(reqs_.size());
    s.n_finished_abort = n_abort_;
    return s;
  }
  std::vector<double> lateness() const {
    std::lock_guard<std::mutex> lock(mu_);
    return late_;
  }

 private:
  struct Req {
    dhs::RequestSink sink;
    int64_t n_prompt, max_tokens, n_gen;
  };
  void run() {
    double next = mono_now() + period_;
    for (;;) {
      const double wait = next - mono_now();
      if (wait > 0) std::this_thread::sleep_for(std::chrono::duration<double>(wait));
      const double t = mono_now();
      std::vector<std::pair<dhs::RequestSink*, dhs::RequestEvent>> out;
      {
        std::lock_guard<std::mutex> lock(mu_);
        late_.push_back(t - next);
        for (uint64_t id : cancelled_) {
          auto it = reqs_.find(id);
          if (it == reqs_.end()) continue;
          dhs::RequestEvent ev;
          ev.id = id;
          ev.finished = true;
          ev.finish_reason = "abort";
          it->second.sink(ev);
          reqs_.erase(it);
          ++n_abort_;
        }
        cancelled_.clear();
        if (stopping_) {
          for (auto& [id, r] : reqs_) {
            dhs::RequestEvent ev;
            ev.id = id;
            ev.finished = true;
            ev.finish_reason = "abort";
            r.sink(ev);
          }
          reqs_.clear();
          return;
        }
        char buf[32];
        std::snprintf(buf, sizeof buf, " %.6f", t);
        for (auto it = reqs_.begin(); it != reqs_.end();) {
          Req& r = it->second;
          dhs::RequestEvent ev;
          ev.id = it->first;
          ev.text = buf;
          ev.tokens = {1};
          ev.n_prompt = r.n_prompt;
          ev.n_generated = ++r.n_gen;
          ev.finished = r.n_gen >= r.max_tokens;
          if (ev.finished) ev.finish_reason = "length";
          r.sink(ev);  // a RequestStream sink: copy + notify, as the real scheduler calls it
          it = ev.finished ? reqs_.erase(it) : std::next(it);
        }
      }
      next += period_;
    }
  }
  dhs::SchedulerOptions opt_;
  double period_;
  mutable std::mutex mu_;
  std::map<uint64_t, Req> reqs_;
  std::vector<uint64_t> cancelled_;
  std::vector<double> late_;
  uint64_t next_id_ = 0, n_abort_ = 0;
  bool stopping_ = false;
  std::thread loop_;
};

class FakeModel final : public dhs::server::ServedModel {
 public:
  explicit FakeModel(TickScheduler& s) : s_(s) {}
  std::vector<int32_t> tokenize(const std::string& text, bool) const override {
    return std::vector<int32_t>(std::max<size_t>(1, text.size() / 4), 1);
  }
  std::vector<int32_t> tokenize_chat(const std::vector<dhs::ChatMessage>& m) const override { return {1, 2, 3}; }
  std::string detokenize(const std::vector<int32_t>& ids) const override { return std::string(ids.size(), 'x'); }
  int32_t vocab_size() const override { return 1000; }
  int64_t max_model_len() const override { return 1 << 20; }
  dhs::Scheduler& scheduler() override { return s_; }

 private:
  TickScheduler& s_;
};

double quantile(std::vector<double> v, double q) {
  if (v.empty()) return 0.0;
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<size_t>(q * static_cast<double>(v.size())))];
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 4) {
    std::fprintf(stderr, "usage: http_probe_server PORT RATE_HZ HTTP_THREADS\n");
    return 2;
  }
  sigset_t sigs;
  sigemptyset(&sigs);
  sigaddset(&sigs, SIGTERM);
  sigaddset(&sigs, SIGINT);
  pthread_sigmask(SIG_BLOCK, &sigs, nullptr);
  signal(SIGPIPE, SIG_IGN);

  TickScheduler sched(std::atof(argv[2]));
  FakeModel model(sched);
  dhs::server::ServerOptions o;
  o.port = std::atoi(argv[1]);
  o.served_model_name = "probe";
  o.http_threads = std::atoi(argv[3]);
  dhs::server::HttpServer http(o);
  http.bind();
  sched.start();
  http.set_model(&model);
  std::thread listener([&] { http.serve(); });
  int sig = 0;
  sigwait(&sigs, &sig);
  http.shutdown(0.0);
  listener.join();
  const std::vector<double> late = sched.lateness();
  std::printf("{\"ticks\": %zu, \"tick_late_p50_ms\": %.3f, \"tick_late_p99_ms\": %.3f, \"tick_late_max_ms\": %.3f}\n",
              late.size(), 1e3 * quantile(late, 0.5), 1e3 * quantile(late, 0.99), 1e3 * quantile(late, 1.0));
  return 0;
}
