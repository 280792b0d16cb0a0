// What `dhisparse serve` configures in the HTTP front end (src/server/); the engine and
// scheduler options travel separately (EngineOptions, SchedulerOptions).
#pragma once
#include <cstddef>
#include <string>

namespace dhs::server {

struct ServerOptions {
  std::string host = "127.0.0.1";
  int port = 8000;                   // 0: any free port (tests)
  std::string api_key;               // non-empty: every /v1 route wants "Authorization: Bearer KEY"
  std::string served_model_name;     // the name /v1/models lists and requests may give
  std::string version = "dhisparse"; // what /version answers
  size_t max_body_bytes = size_t{8} << 20;  // larger bodies get 413
  // HTTP worker threads. cpp-httplib gives each open connection a thread for its lifetime, so this
  // bounds the connections served at once (SSE streams included); a thread blocked on a condition
  // variable costs no CPU (docs/serving.md has the measurement). 0: max_num_seqs + max_waiting + 64.
  int http_threads = 0;
  int read_timeout_s = 10;           // a stalled request (no byte for this long) is dropped
  // A connection with no request begun for this long is closed. cpp-httplib waits this long for a
  // fresh connection's first request as well as between kept-alive requests, so its default (5 s)
  // dropped, unanswered, clients slow to send on a loaded host (CI: 64 requests at once on 2 busy
  // cores); it is the read timeout's bound instead.
  int keep_alive_timeout_s = 10;
  int body_timeout_s = 20;           // a request body not whole after this long gets 408, then close
  int write_timeout_s = 10;          // a client that stops reading its stream is dropped after this
  double shutdown_timeout_s = 10.0;  // SIGTERM: running requests get this long to finish, then abort
};

}  // namespace dhs::server
