// `dhisparse serve`'s transport: an OpenAI-compatible HTTP server over cpp-httplib (a thread per
// open connection from a fixed pool; docs/serving.md has the measurement that chose it). Routes:
// /v1/models, /v1/completions, /v1/chat/completions (JSON or SSE), /health, /metrics, /tokenize,
// /detokenize, /version. It listens before the model has loaded (/health answers 503 until
// set_model) and shuts down in order: refuse new requests, let running ones finish for a while,
// abort the rest, close.
#pragma once
#include <memory>

#include "server/metrics.h"
#include "server/served_model.h"
#include "server/server_options.h"

namespace dhs::server {

class HttpServer {
 public:
  explicit HttpServer(ServerOptions opts);
  ~HttpServer();
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  // Binds host:port (port 0: a free one); throws dhs::Error when it cannot. Returns the port.
  int bind();
  // Serves in the calling thread until shutdown(). Precondition: bind() succeeded.
  void serve();
  // The model requests go to from now on (it must outlive the server's serving). Until then
  // /health and every model route answer 503.
  void set_model(ServedModel* model);
  // From any thread (a signal watcher): new requests get 503; running and waiting ones get
  // timeout_s to finish, then are aborted (streams end with finish_reason "abort"); the
  // scheduler stops; serve() returns. Idempotent.
  void shutdown(double timeout_s);
  HttpCounters counters() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace dhs::server
