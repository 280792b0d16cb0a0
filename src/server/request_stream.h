// One request's events, from the scheduler thread to the HTTP thread that answers it: the sink
// copies and notifies (sinks must be short), the HTTP thread waits and takes everything that
// arrived since its last look as one update (so a slow reader gets fewer, larger chunks).
#pragma once
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>

#include "dhisparse/scheduler.h"

namespace dhs::server {

// What arrived since the last take.
struct StreamUpdate {
  std::string text;
  bool finished = false;
  std::string finish_reason;  // when finished
  std::string error;          // finish_reason "error"
  int64_t n_prompt = 0, n_generated = 0;
};

class RequestStream {
 public:
  RequestStream();
  // The scheduler's side. The sink keeps the stream's state alive, so it may outlive this object.
  RequestSink sink() const;
  // Waits up to `timeout` for an event (or the finish); true with `out` filled when one came.
  bool take(StreamUpdate& out, std::chrono::milliseconds timeout);
  // Every event taken and the last had finished = true.
  bool done() const;

 private:
  struct State {
    std::mutex mu;
    std::condition_variable cv;
    StreamUpdate pending;
    bool has_pending = false;
    bool finished_taken = false;
  };
  std::shared_ptr<State> st_;
};

}  // namespace dhs::server
