// HttpServer (http_server.h): routes, the OpenAI handlers, streaming, shutdown.
//
// Threads: cpp-httplib's pool runs each connection's requests; a streaming response keeps its
// thread for the stream's life, blocked on its RequestStream between events (no CPU), so the
// pool is sized for every stream that can be open at once (ServerOptions::http_threads). The
// scheduler's thread only copies events into RequestStreams.
#include "server/http_server.h"

#include <httplib.h>
#include <sys/socket.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <memory>
#include <cstdio>
#include <mutex>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "core/error.h"
#include "server/connection_socket.h"
#include "server/openai_protocol.h"
#include "server/sse_stream.h"

namespace dhs::server {

using nlohmann::json;

namespace {

// How often a waiting stream looks at whether its client is still there.
constexpr auto kPoll = std::chrono::milliseconds(200);

int64_t unix_now() {
  return std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count();
}

// Comparison whose time does not depend on where the strings differ.
bool same_secret(const std::string& a, const std::string& b) {
  unsigned char diff = a.size() == b.size() ? 0 : 1;
  for (size_t i = 0; i < a.size(); ++i) diff |= static_cast<unsigned char>(a[i] ^ b[i % std::max<size_t>(b.size(), 1)]);
  return diff == 0;
}

void reply_json(httplib::Response& res, int status, const json& j) {
  res.status = status;
  res.set_content(dump_json(j), "application/json");
}

void reply_error(httplib::Response& res, const ApiError& e) { reply_json(res, e.status, error_json(e)); }

// An error after which the connection must end: the rest of the request (a body past its deadline,
// or one we will not read) must not be parsed as the next request. The socket's reading side is
// shut once the answer is written (connection_socket.h): before it, httplib would take the
// connection for closed and not answer.
void reply_error_and_close(const httplib::Request& req, httplib::Response& res, const ApiError& e) {
  res.status = e.status;
  res.set_header("Connection", "close");
  auto body = std::make_shared<const std::string>(dump_json(error_json(e)));
  res.set_content_provider(body->size(), "application/json",
                           [body, local = req.local_addr, lport = req.local_port, remote = req.remote_addr,
                            rport = req.remote_port](size_t offset, size_t length, httplib::DataSink& sink) {
                             if (!sink.write(body->data() + offset, length)) return false;
                             if (offset + length == body->size()) stop_reading_connection(local, lport, remote, rport);
                             return true;
                           });
}

struct Route {
  std::string path;
  std::vector<std::string> methods;
};

}  // namespace

struct HttpServer::Impl {
  ServerOptions opts;
  httplib::Server svr;
  std::atomic<ServedModel*> model{nullptr};
  int listen_fd = -1;  // the listening socket (HttpServer::bind widens its backlog)
  std::set<std::string> routed_paths;  // filled by route() before the server starts; read only after
  std::atomic<bool> shutting_down{false};
  std::atomic<bool> stopped{false};
  std::mutex shutdown_mu;
  int64_t started_at = unix_now();

  std::atomic<uint64_t> n_http{0}, n_client_errors{0}, n_disconnects{0};
  std::atomic<int64_t> n_open_streams{0};
  std::atomic<int64_t> n_generating{0};  // generate handlers and streams not yet released

  std::mutex rng_mu;
  std::mt19937_64 rng{std::random_device{}()};

  explicit Impl(ServerOptions o) : opts(std::move(o)) {}

  uint64_t random_u64() {
    std::lock_guard<std::mutex> lock(rng_mu);
    return rng();
  }
  std::string make_id(Endpoint ep) {
    char buf[40];
    std::snprintf(buf, sizeof buf, "%016llx%016llx", static_cast<unsigned long long>(random_u64()),
                  static_cast<unsigned long long>(random_u64()));
    return (ep == Endpoint::ChatCompletions ? "chatcmpl-" : "cmpl-") + std::string(buf);
  }

  // The model, or a 503 written to res.
  ServedModel* ready(httplib::Response& res) {
    if (shutting_down) {
      reply_error(res, ApiError{503, "the server is shutting down", ""});
      return nullptr;
    }
    ServedModel* m = model.load();
    if (!m) reply_error(res, ApiError{503, "the model is still loading", ""});
    return m;
  }

  void install_routes();
  void route(const Route& r, const httplib::Server::Handler& h);
  bool authorized(const httplib::Request& req, httplib::Response& res) const;
  std::optional<ApiError> read_body(const httplib::ContentReader& reader, httplib::Response& res,
                                    std::string& body) const;

  void health(const httplib::Request&, httplib::Response& res);
  void models(const httplib::Request&, httplib::Response& res);
  void metrics(const httplib::Request&, httplib::Response& res);
  void tokenize(const httplib::Request& req, httplib::Response& res);
  void detokenize(const httplib::Request& req, httplib::Response& res);
  void generate(Endpoint ep, const httplib::Request& req, httplib::Response& res);
  void answer_whole(ServedModel& m, const ResponseMeta& meta, uint64_t id, RequestStream& stream,
                    const httplib::Request& req, httplib::Response& res);
  void answer_stream(ServedModel& m, const ResponseMeta& meta, bool include_usage, uint64_t id,
                     std::shared_ptr<RequestStream> stream, httplib::Response& res);
  HttpCounters counters() const {
    return HttpCounters{n_http.load(), n_client_errors.load(), n_disconnects.load(), n_open_streams.load()};
  }
};

bool HttpServer::Impl::authorized(const httplib::Request& req, httplib::Response& res) const {
  if (opts.api_key.empty() || req.path.rfind("/v1", 0) != 0) return true;
  const std::string h = req.get_header_value("Authorization");
  const std::string prefix = "Bearer ";
  if (h.size() > prefix.size() && h.compare(0, prefix.size(), prefix) == 0 &&
      same_secret(h.substr(prefix.size()), opts.api_key))
    return true;
  res.set_header("WWW-Authenticate", "Bearer");
  reply_error(res, ApiError{401, "a valid API key is required (Authorization: Bearer KEY)", ""});
  return false;
}

// The whole body, read by us rather than by httplib so that it has a deadline: httplib's read
// timeout is per read, which a client sending a byte a second passes forever, and such a client
// would also hold shutdown (which joins the connection threads) without bound.
std::optional<ApiError> HttpServer::Impl::read_body(const httplib::ContentReader& reader, httplib::Response& res,
                                                    std::string& body) const {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(opts.body_timeout_s);
  bool late = false, stopping = false;
  const bool ok = reader([&](const char* data, size_t n) {
    if (shutting_down) return !(stopping = true);
    if (std::chrono::steady_clock::now() > deadline) return !(late = true);
    body.append(data, n);
    return true;
  });
  if (ok) {
    // JSON text has no raw NUL anywhere (control characters in strings are escaped), and
    // nlohmann's parser takes one as the end of the input: '{...}\0garbage' must not parse.
    if (body.find('\0') != std::string::npos)
      return ApiError{400, "the request body is not valid JSON: it contains a NUL byte", ""};
    return std::nullopt;
  }
  if (late) return ApiError{408, "the request body did not arrive within " + std::to_string(opts.body_timeout_s) + " s", ""};
  if (stopping) return ApiError{503, "the server is shutting down", ""};
  if (res.status == 413) return ApiError{413, "the request body is too large", ""};
  return ApiError{400, "the request body could not be read (stalled past the read timeout, cut short or malformed)", ""};
}

// Every method on a known path reaches this wrapper (after its body is read, so that the
// connection stays in step): a method the route does not take gets 405, then the key check.
void HttpServer::Impl::route(const Route& r, const httplib::Server::Handler& h) {
  auto wrapped = [this, r, h](const httplib::Request& req, httplib::Response& res) {
    if (std::find(r.methods.begin(), r.methods.end(), req.method) == r.methods.end()) {
      std::string allow;
      for (const auto& m : r.methods) allow += (allow.empty() ? "" : ", ") + m;
      res.set_header("Allow", allow);
      reply_error(res, ApiError{405, "method " + req.method + " is not allowed on " + r.path + " (allowed: " + allow + ")", ""});
      return;
    }
    if (!authorized(req, res)) return;
    try {
      h(req, res);
    } catch (const std::exception& e) {
      // Client mistakes are answered before this; what lands here is the server's own failure.
      std::fprintf(stderr, "serve: %s %s failed: %s\n", req.method.c_str(), req.path.c_str(), e.what());
      reply_error(res, ApiError{500, std::string("internal error: ") + e.what(), ""});
    }
  };
  auto with_body = [this, wrapped](const httplib::Request& req, httplib::Response& res,
                                   const httplib::ContentReader& reader) {
    httplib::Request full = req;
    if (auto e = read_body(reader, res, full.body)) {
      return reply_error_and_close(req, res, *e);
    }
    wrapped(full, res);
  };
  const std::string pattern = r.path;  // literal paths: no regex metacharacters in them
  routed_paths.insert(pattern);
  svr.Get(pattern, wrapped);  // GET and OPTIONS with a body are refused before it is read (install_routes)
  svr.Options(pattern, wrapped);
  svr.Post(pattern, with_body);
  svr.Put(pattern, with_body);
  svr.Patch(pattern, with_body);
  svr.Delete(pattern, with_body);
}

void HttpServer::Impl::install_routes() {
  route({"/health", {"GET"}}, [this](const auto& q, auto& s) { health(q, s); });
  route({"/version", {"GET"}}, [this](const auto&, auto& s) { reply_json(s, 200, json{{"version", opts.version}}); });
  route({"/metrics", {"GET"}}, [this](const auto& q, auto& s) { metrics(q, s); });
  route({"/tokenize", {"POST"}}, [this](const auto& q, auto& s) { tokenize(q, s); });
  route({"/detokenize", {"POST"}}, [this](const auto& q, auto& s) { detokenize(q, s); });
  route({"/v1/models", {"GET"}}, [this](const auto& q, auto& s) { models(q, s); });
  route({"/v1/completions", {"POST"}}, [this](const auto& q, auto& s) { generate(Endpoint::Completions, q, s); });
  route({"/v1/chat/completions", {"POST"}},
        [this](const auto& q, auto& s) { generate(Endpoint::ChatCompletions, q, s); });

  // Whatever httplib answers itself (404 unknown path, 413 body too large, 400 unparsable
  // request) gets OpenAI's error object too.
  svr.set_error_handler(httplib::Server::HandlerWithResponse([](const httplib::Request& req, httplib::Response& res) {
    if (!res.body.empty() || res.content_provider_) return httplib::Server::HandlerResponse::Unhandled;
    std::string msg;
    switch (res.status) {
      case 404: msg = "no route " + req.method + " " + req.path; break;
      case 413: msg = "the request body is too large"; break;
      case 414: msg = "the request URI is too long"; break;
      default: msg = "the request could not be served (HTTP " + std::to_string(res.status) + ")";
    }
    reply_error(res, ApiError{res.status, msg, ""});
    return httplib::Server::HandlerResponse::Handled;
  }));
  // A body that httplib would read itself escapes the body deadline: one on GET, OPTIONS or HEAD
  // (none of our routes takes one), or any on a path we do not route. Refused before it is read.
  svr.set_pre_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
    const bool has_body = req.has_header("Transfer-Encoding") ||
                          (req.has_header("Content-Length") && req.get_header_value("Content-Length") != "0");
    if (!has_body) return httplib::Server::HandlerResponse::Unhandled;
    if (routed_paths.count(req.path) == 0) {
      reply_error_and_close(req, res, ApiError{404, "no route " + req.method + " " + req.path, ""});
      return httplib::Server::HandlerResponse::Handled;
    }
    const bool reads_own_body = req.method == "POST" || req.method == "PUT" || req.method == "PATCH" || req.method == "DELETE";
    if (reads_own_body) return httplib::Server::HandlerResponse::Unhandled;
    reply_error_and_close(req, res, ApiError{400, req.method + " takes no request body", ""});
    return httplib::Server::HandlerResponse::Handled;
  });
  svr.set_exception_handler([](const httplib::Request&, httplib::Response& res, std::exception_ptr) {
    reply_error(res, ApiError{500, "internal error", ""});
  });
  svr.set_post_routing_handler([this](const httplib::Request&, httplib::Response& res) {
    ++n_http;
    if (res.status >= 400 && res.status < 500) ++n_client_errors;
  });
}

void HttpServer::Impl::health(const httplib::Request&, httplib::Response& res) {
  if (!ready(res)) return;
  res.status = 200;
}

void HttpServer::Impl::models(const httplib::Request&, httplib::Response& res) {
  ServedModel* m = ready(res);
  if (!m) return;
  const json card = {{"id", opts.served_model_name}, {"object", "model"},  {"created", started_at},
                     {"owned_by", "dhisparse"},      {"root", opts.served_model_name}, {"parent", nullptr},
                     {"max_model_len", m->max_model_len()}};
  reply_json(res, 200, json{{"object", "list"}, {"data", json::array({card})}});
}

void HttpServer::Impl::metrics(const httplib::Request&, httplib::Response& res) {
  ServedModel* m = model.load();
  if (!m) {
    reply_error(res, ApiError{503, "the model is still loading", ""});
    return;
  }
  res.status = 200;
  res.set_content(render_metrics(m->scheduler().stats(), opts.served_model_name, counters()),
                  "text/plain; version=0.0.4; charset=utf-8");
}

void HttpServer::Impl::tokenize(const httplib::Request& req, httplib::Response& res) {
  ServedModel* m = ready(res);
  if (!m) return;
  TokenizeRequest tr;
  if (auto e = parse_tokenize_request(req.body, tr)) return reply_error(res, *e);
  std::vector<int32_t> ids;
  try {
    ids = tr.chat ? m->tokenize_chat(tr.messages) : m->tokenize(tr.prompt, tr.add_special);
  } catch (const Error& e) {
    return reply_error(res, ApiError{400, e.what(), tr.chat ? "messages" : "prompt"});
  }
  reply_json(res, 200, json{{"count", ids.size()}, {"max_model_len", m->max_model_len()}, {"tokens", ids}});
}

void HttpServer::Impl::detokenize(const httplib::Request& req, httplib::Response& res) {
  ServedModel* m = ready(res);
  if (!m) return;
  std::vector<int32_t> ids;
  if (auto e = parse_detokenize_request(req.body, ids)) return reply_error(res, *e);
  for (const int32_t id : ids)
    if (id < 0 || id >= m->vocab_size())
      return reply_error(res, ApiError{400, "token id " + std::to_string(id) + " is outside the vocabulary", "tokens"});
  reply_json(res, 200, json{{"prompt", m->detokenize(ids)}});
}

void HttpServer::Impl::generate(Endpoint ep, const httplib::Request& req, httplib::Response& res) {
  ServedModel* m = ready(res);
  if (!m) return;
  CompletionRequest cr;
  if (auto e = parse_completion_request(ep, req.body, cr)) return reply_error(res, *e);
  if (!cr.model.empty() && cr.model != opts.served_model_name)
    return reply_error(res, ApiError{404, "The model `" + cr.model + "` does not exist.", "model"});
  std::vector<int32_t> prompt;
  try {
    if (ep == Endpoint::ChatCompletions)
      prompt = m->tokenize_chat(cr.messages);
    else
      prompt = cr.prompt_is_ids ? std::move(cr.prompt_ids) : m->tokenize(cr.prompt_text, true);
  } catch (const Error& e) {
    // The chat template's raise_exception (roles out of order, ...) is the client's to fix.
    return reply_error(res, ApiError{400, e.what(), ep == Endpoint::ChatCompletions ? "messages" : "prompt"});
  }
  if (auto e = fit_context(cr, prompt, m->vocab_size(), m->max_model_len())) return reply_error(res, *e);
  if (!cr.seed_given) cr.options.sampling.seed = random_u64();

  auto stream = std::make_shared<RequestStream>();
  const SubmitResult sr = m->scheduler().submit(RequestParams{std::move(prompt), cr.options}, stream->sink());
  switch (sr.status) {
    case SubmitStatus::Accepted: break;
    case SubmitStatus::Invalid: return reply_error(res, ApiError{400, sr.error, ""});
    case SubmitStatus::QueueFull:
      return reply_error(res, ApiError{429, "too many requests are waiting (--max-waiting); retry later", ""});
    case SubmitStatus::ShuttingDown: return reply_error(res, ApiError{503, "the server is shutting down", ""});
  }
  const ResponseMeta meta{ep, make_id(ep), unix_now(), opts.served_model_name};
  if (cr.stream)
    answer_stream(*m, meta, cr.include_usage, sr.id, std::move(stream), res);
  else
    answer_whole(*m, meta, sr.id, *stream, req, res);
}

void HttpServer::Impl::answer_whole(ServedModel& m, const ResponseMeta& meta, uint64_t id, RequestStream& stream,
                                    const httplib::Request& req, httplib::Response& res) {
  // The scheduler ends every accepted request (shutdown aborts what is left), so this returns.
  // A client that leaves meanwhile is noticed on the connection's socket (connection_socket.h)
  // at the next poll: its request is cancelled, as a stream's is, and the pages go back.
  ++n_generating;
  const int fd = find_connection_socket(req.local_addr, req.local_port, req.remote_addr, req.remote_port);
  bool cancelled = false;
  auto next_check = std::chrono::steady_clock::now() + kPoll;
  StreamUpdate all, u;
  while (!all.finished) {
    const bool got = stream.take(u, kPoll);
    if (!cancelled && fd >= 0 && std::chrono::steady_clock::now() >= next_check) {
      next_check = std::chrono::steady_clock::now() + kPoll;
      if (peer_has_closed(fd)) {
        m.scheduler().cancel(id);
        cancelled = true;
        ++n_disconnects;
      }
    }
    if (!got) continue;
    all.text += u.text;
    all.n_prompt = u.n_prompt;
    all.n_generated = u.n_generated;
    all.finished = u.finished;
    all.finish_reason = u.finish_reason;
    all.error = u.error;
  }
  --n_generating;
  if (all.finish_reason == "error")
    return reply_error(res, ApiError{500, all.error.empty() ? "the engine failed on this request" : all.error, ""});
  reply_json(res, 200, response_json(meta, all.text, all.finish_reason, all.n_prompt, all.n_generated));
}

void HttpServer::Impl::answer_stream(ServedModel& m, const ResponseMeta& meta, bool include_usage, uint64_t id,
                                     std::shared_ptr<RequestStream> stream, httplib::Response& res) {
  ++n_generating;
  ++n_open_streams;
  res.status = 200;
  res.set_header("Cache-Control", "no-cache");
  auto sse = std::make_shared<SseStream>(meta, include_usage);
  auto opened = std::make_shared<bool>(false);
  res.set_chunked_content_provider(
      // Exactly this type: httplib compresses every other text/* for a client that accepts gzip,
      // and a gzipped stream reaches the client only as the compressor's buffer fills.
      "text/event-stream",
      [stream, sse, opened](size_t, httplib::DataSink& sink) {
        if (!*opened) {
          *opened = true;
          const std::string head = sse->open();
          if (!head.empty() && !sink.write(head.data(), head.size())) return false;
        }
        StreamUpdate u;
        // Nothing yet: return to httplib (which ends the loop on server stop) after checking
        // that the client is still there; a closed socket ends the stream and cancels.
        if (!stream->take(u, kPoll)) return sink.is_writable();
        const std::string ev = sse->events(u);
        if (!ev.empty() && !sink.write(ev.data(), ev.size())) return false;
        if (u.finished) sink.done();
        return true;
      },
      [this, &m, stream, id](bool) {
        // Runs when the response is destroyed, however the stream ended.
        if (!stream->done()) {
          m.scheduler().cancel(id);
          ++n_disconnects;
        }
        --n_open_streams;
        --n_generating;
      });
}

HttpServer::HttpServer(ServerOptions opts) : impl_(std::make_unique<Impl>(std::move(opts))) {
  Impl& s = *impl_;
  const int n_threads = std::max(4, s.opts.http_threads);
  s.svr.new_task_queue = [n_threads] { return new httplib::ThreadPool(static_cast<size_t>(n_threads)); };
  s.svr.set_payload_max_length(s.opts.max_body_bytes);
  s.svr.set_read_timeout(s.opts.read_timeout_s, 0);
  s.svr.set_write_timeout(s.opts.write_timeout_s, 0);
  s.svr.set_keep_alive_max_count(1000);
  s.svr.set_keep_alive_timeout(s.opts.keep_alive_timeout_s);
  s.svr.set_tcp_nodelay(true);  // an SSE chunk is small and should leave at once
  // httplib's own options for the listening socket, and its descriptor kept (the last one made
  // is the one bound).
  s.svr.set_socket_options([&s](socket_t sock) {
    httplib::default_socket_options(sock);
    s.listen_fd = static_cast<int>(sock);
  });
  s.install_routes();
}

HttpServer::~HttpServer() { shutdown(0.0); }

int HttpServer::bind() {
  Impl& s = *impl_;
  if (s.opts.port == 0) {
    const int p = s.svr.bind_to_any_port(s.opts.host);
    if (p <= 0) throw Error("cannot listen on " + s.opts.host + " (any port)");
    s.opts.port = p;
  } else if (!s.svr.bind_to_port(s.opts.host, s.opts.port)) {
    throw Error("cannot listen on " + s.opts.host + ":" + std::to_string(s.opts.port) +
                " (in use, or not an address of this machine)");
  }
  // cpp-httplib 0.11 listens with a backlog of 5 (CPPHTTPLIB_LISTEN_BACKLOG, compiled into the
  // Debian library): when many clients connect at once and the accept thread is slow to run (a
  // loaded host), handshakes overflow the queue and some connections end unanswered (CI: httpx
  // ReadErrors with 64 requests at once beside another test). listen() again on the bound socket
  // only changes its backlog (Linux); the kernel caps it at net.core.somaxconn.
  if (s.listen_fd < 0 || ::listen(s.listen_fd, SOMAXCONN) != 0)
    throw Error("cannot widen the listen backlog of " + s.opts.host + ":" + std::to_string(s.opts.port));
  return s.opts.port;
}

void HttpServer::serve() { impl_->svr.listen_after_bind(); }

void HttpServer::set_model(ServedModel* model) { impl_->model.store(model); }

void HttpServer::shutdown(double timeout_s) {
  Impl& s = *impl_;
  std::lock_guard<std::mutex> lock(s.shutdown_mu);
  if (s.stopped) return;
  s.shutting_down = true;
  using Clock = std::chrono::steady_clock;
  if (ServedModel* m = s.model.load()) {
    const auto deadline = Clock::now() + std::chrono::duration<double>(std::max(0.0, timeout_s));
    while (Clock::now() < deadline) {
      const SchedulerStats st = m->scheduler().stats();
      if (st.n_running + st.n_waiting == 0) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    m->scheduler().stop(/*drain=*/false);  // aborts what is left; each sink gets its "abort"
  }
  // Let handlers and streams write their last events (bounded: a stalled reader is dropped
  // by the write timeout anyway).
  const auto flush_until = Clock::now() + std::chrono::seconds(2);
  while (s.n_generating.load() > 0 && Clock::now() < flush_until)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  s.svr.stop();
  s.stopped = true;
}

HttpCounters HttpServer::counters() const { return impl_->counters(); }

}  // namespace dhs::server
