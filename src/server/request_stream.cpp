// RequestStream (request_stream.h).
#include "server/request_stream.h"

namespace dhs::server {

RequestStream::RequestStream() : st_(std::make_shared<State>()) {}

RequestSink RequestStream::sink() const {
  return [st = st_](const RequestEvent& ev) {
    {
      std::lock_guard<std::mutex> lock(st->mu);
      StreamUpdate& p = st->pending;
      p.text += ev.text;
      p.n_prompt = ev.n_prompt;
      p.n_generated = ev.n_generated;
      if (ev.finished) {
        p.finished = true;
        p.finish_reason = ev.finish_reason;
        p.error = ev.error;
      }
      st->has_pending = true;
    }
    st->cv.notify_one();
  };
}

bool RequestStream::take(StreamUpdate& out, std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(st_->mu);
  if (!st_->cv.wait_for(lock, timeout, [&] { return st_->has_pending; })) return false;
  out = std::move(st_->pending);
  st_->pending = StreamUpdate{};
  st_->has_pending = false;
  if (out.finished) st_->finished_taken = true;
  return true;
}

bool RequestStream::done() const {
  std::lock_guard<std::mutex> lock(st_->mu);
  return st_->finished_taken;
}

}  // namespace dhs::server
