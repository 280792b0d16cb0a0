// `dhisparse serve` in-process on the default model (CPU): the real HttpServer and scheduler,
// an httplib client. Non-streaming and streaming completions and chat (the streamed text equals
// the whole greedy answer), the error statuses (401, 404, 405, 413, 429, 400 past the context),
// a client leaving mid-stream cancels its request, and after every test the KV pool is empty
// and its accounting holds.
#include <gtest/gtest.h>
#include <httplib.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <memory>
#include <string>
#include <thread>

#include <nlohmann/json.hpp>

#include "dhisparse/engine.h"
#include "dhisparse/scheduler.h"
#include "server/http_server.h"
#include "server/served_model.h"
#include "test_paths.h"

using nlohmann::json;
using namespace dhs;

namespace {

class ServerTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    const std::string path = test::default_model_path();
    if (!std::ifstream(path).good()) return;
    EngineOptions eo;
    eo.model_path = path;
    eo.n_threads = 2;
    eo.max_context = 512;
    engine_ = Engine::load(eo).release();
    served_ = server::serve_engine(*engine_).release();
  }
  static void TearDownTestSuite() {
    delete served_;
    delete engine_;
    served_ = nullptr;
    engine_ = nullptr;
  }

  void SetUp() override {
    if (!engine_) GTEST_SKIP() << "no default model (bash scripts/fetch_model.sh)";
  }

  // A fresh scheduler with `so` and a server with `http` on a free port.
  void start(SchedulerOptions so = {}, server::ServerOptions http = {}) {
    engine_->scheduler().stop(false);
    so.max_model_len = 0;
    engine_->configure_scheduler(so);
    engine_->scheduler().start();
    http.port = 0;
    http.served_model_name = "smol";
    http.http_threads = 16;
    server_ = std::make_unique<server::HttpServer>(http);
    port_ = server_->bind();
    server_->set_model(served_);
    thread_ = std::thread([this] { server_->serve(); });
    client_ = std::make_unique<httplib::Client>("127.0.0.1", port_);
    client_->set_read_timeout(60, 0);
  }

  void TearDown() override {
    if (!server_) return;
    // Pages come back within a step of a request's end: wait for idle, then check the pool.
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    SchedulerStats st = engine_->scheduler().stats();
    while ((st.n_running + st.n_waiting > 0 || st.kv.n_used > 0) && std::chrono::steady_clock::now() < until) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
      st = engine_->scheduler().stats();
    }
    EXPECT_EQ(st.kv.n_used, 0) << "KV pages leaked";
    EXPECT_EQ(st.kv.n_free, st.kv.n_total);
    EXPECT_EQ(st.kv_check, "");
    server_->shutdown(1.0);
    thread_.join();
    server_.reset();
  }

  httplib::Result post(const std::string& path, const std::string& body, const httplib::Headers& h = {}) {
    return client_->Post(path.c_str(), h, body, "application/json");
  }
  static json error_of(const httplib::Result& r) { return json::parse(r->body).at("error"); }

  // A streamed response's data payloads, [DONE] included.
  std::vector<std::string> stream(const std::string& path, const json& body) {
    httplib::Request req;
    req.method = "POST";
    req.path = path;
    req.body = body.dump();
    req.set_header("Content-Type", "application/json");
    std::string raw;
    req.content_receiver = [&](const char* d, size_t n, uint64_t, uint64_t) {
      raw.append(d, n);
      return true;
    };
    httplib::Response res;
    httplib::Error err;
    EXPECT_TRUE(client_->send(req, res, err));
    EXPECT_EQ(res.status, 200);
    EXPECT_NE(res.get_header_value("Content-Type").find("text/event-stream"), std::string::npos);
    std::vector<std::string> data;
    size_t pos = 0;
    for (size_t end; (end = raw.find("\n\n", pos)) != std::string::npos; pos = end + 2) {
      const std::string ev = raw.substr(pos, end - pos);
      if (ev.rfind("data: ", 0) == 0) data.push_back(ev.substr(6));
    }
    EXPECT_EQ(pos, raw.size()) << "a partial event at the end";
    return data;
  }

  static Engine* engine_;
  static server::ServedModel* served_;
  std::unique_ptr<server::HttpServer> server_;
  std::thread thread_;
  int port_ = 0;
  std::unique_ptr<httplib::Client> client_;
};
Engine* ServerTest::engine_ = nullptr;
server::ServedModel* ServerTest::served_ = nullptr;

TEST_F(ServerTest, CompletionWholeAndStreamedAgree) {
  start();
  const json body = {{"model", "smol"}, {"prompt", "The capital of France is"}, {"max_tokens", 12}, {"temperature", 0}};
  const auto r = post("/v1/completions", body.dump());
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  const json j = json::parse(r->body);
  EXPECT_EQ(j.at("object"), "text_completion");
  EXPECT_EQ(j.at("model"), "smol");
  const std::string text = j.at("choices").at(0).at("text");
  EXPECT_FALSE(text.empty());
  const json usage = j.at("usage");
  EXPECT_GT(usage.at("prompt_tokens").get<int>(), 0);
  EXPECT_LE(usage.at("completion_tokens").get<int>(), 12);
  EXPECT_EQ(usage.at("total_tokens"), usage.at("prompt_tokens").get<int>() + usage.at("completion_tokens").get<int>());
  const std::string reason = j.at("choices").at(0).at("finish_reason");
  EXPECT_TRUE(reason == "length" || reason == "stop") << reason;

  json sbody = body;
  sbody["stream"] = true;
  sbody["stream_options"] = {{"include_usage", true}};
  const auto data = stream("/v1/completions", sbody);
  ASSERT_GE(data.size(), 3u);
  EXPECT_EQ(data.back(), "[DONE]");
  std::string streamed;
  for (size_t i = 0; i + 2 < data.size(); ++i) {
    const json c = json::parse(data[i]);
    EXPECT_EQ(c.at("object"), "text_completion");
    EXPECT_TRUE(c.at("usage").is_null());
    streamed += c.at("choices").at(0).at("text").get<std::string>();
  }
  EXPECT_EQ(streamed, text);  // greedy: the same tokens whole or streamed
  EXPECT_EQ(json::parse(data[data.size() - 3]).at("choices").at(0).at("finish_reason"), reason);
  EXPECT_EQ(json::parse(data[data.size() - 2]).at("usage"), usage);
}

TEST_F(ServerTest, ChatWholeAndStreamedAgree) {
  start();
  const json body = {{"messages", {{{"role", "user"}, {"content", "What is 2+2?"}}}}, {"max_tokens", 10}, {"temperature", 0}};
  const auto r = post("/v1/chat/completions", body.dump());
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  const json j = json::parse(r->body);
  EXPECT_EQ(j.at("object"), "chat.completion");
  EXPECT_EQ(j.at("choices").at(0).at("message").at("role"), "assistant");
  const std::string text = j.at("choices").at(0).at("message").at("content");

  json sbody = body;
  sbody["stream"] = true;
  const auto data = stream("/v1/chat/completions", sbody);
  ASSERT_GE(data.size(), 3u);
  EXPECT_EQ(json::parse(data.front()).at("choices").at(0).at("delta").at("role"), "assistant");
  EXPECT_EQ(data.back(), "[DONE]");
  std::string streamed;
  for (size_t i = 0; i + 1 < data.size(); ++i) {
    const json d = json::parse(data[i]).at("choices").at(0).at("delta");
    if (d.contains("content")) streamed += d.at("content").get<std::string>();
  }
  EXPECT_EQ(streamed, text);
}

TEST_F(ServerTest, ErrorStatuses) {
  start();
  auto r = post("/v1/completions", "{not json");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 400);
  EXPECT_EQ(error_of(r).at("code"), 400);
  r = post("/v1/completions", R"({"prompt": "x", "model": "other"})");
  EXPECT_EQ(r->status, 404);
  EXPECT_EQ(error_of(r).at("param"), "model");
  r = client_->Get("/no/such/route");
  EXPECT_EQ(r->status, 404);
  EXPECT_TRUE(json::parse(r->body).contains("error"));
  r = client_->Get("/v1/completions");
  EXPECT_EQ(r->status, 405);
  // Prompt past the context (512): 400 with vLLM's message, not a 5xx.
  r = post("/v1/completions", json{{"prompt", std::vector<int>(600, 1)}}.dump());
  EXPECT_EQ(r->status, 400);
  EXPECT_NE(error_of(r).at("message").get<std::string>().find("maximum context length is 512"), std::string::npos);
  // 10 MB body: 413 (the server reads past it, answers, and goes on).
  r = post("/v1/completions", std::string(10 << 20, 'a'));
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 413);
  r = client_->Get("/health");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200);
  const auto tok = post("/tokenize", R"({"prompt": "hello world"})");
  ASSERT_EQ(tok->status, 200);
  const json ids = json::parse(tok->body).at("tokens");
  const auto detok = post("/detokenize", json{{"tokens", ids}}.dump());
  ASSERT_EQ(detok->status, 200);
  EXPECT_NE(json::parse(detok->body).at("prompt").get<std::string>().find("hello world"), std::string::npos);
}

TEST_F(ServerTest, ApiKeyGuardsV1Routes) {
  server::ServerOptions http;
  http.api_key = "sesame";
  start({}, http);
  const std::string body = R"({"prompt": "x", "max_tokens": 1})";
  EXPECT_EQ(post("/v1/completions", body)->status, 401);
  EXPECT_EQ(post("/v1/completions", body, {{"Authorization", "Bearer wrong"}})->status, 401);
  EXPECT_EQ(client_->Get("/v1/models")->status, 401);
  EXPECT_EQ(error_of(client_->Get("/v1/models")).at("type"), "authentication_error");
  EXPECT_EQ(post("/v1/completions", body, {{"Authorization", "Bearer sesame"}})->status, 200);
  EXPECT_EQ(client_->Get("/health")->status, 200);  // outside /v1: no key, as vLLM
}

TEST_F(ServerTest, QueueFullIs429) {
  SchedulerOptions so;
  so.max_waiting = 0;  // every request finds the queue full
  start(so);
  const auto r = post("/v1/completions", R"({"prompt": "x", "max_tokens": 1})");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 429);
  EXPECT_EQ(error_of(r).at("code"), 429);
}

TEST_F(ServerTest, ClientLeavingMidStreamCancels) {
  start();
  httplib::Request req;
  req.method = "POST";
  req.path = "/v1/completions";
  req.body = json{{"prompt", "Once upon a time"}, {"max_tokens", 400}, {"ignore_eos", true}, {"stream", true}}.dump();
  int chunks = 0;
  req.content_receiver = [&](const char*, size_t, uint64_t, uint64_t) { return ++chunks < 3; };  // leave after 3
  httplib::Response res;
  httplib::Error err;
  client_->send(req, res, err);
  EXPECT_GE(chunks, 3);
  // The request ends as "abort" and its pages return (TearDown checks the pool).
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (engine_->scheduler().stats().n_finished_abort == 0 && std::chrono::steady_clock::now() < until)
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  EXPECT_EQ(engine_->scheduler().stats().n_finished_abort, 1u);
  EXPECT_EQ(server_->counters().n_disconnects, 1u);
  const auto m = client_->Get("/metrics");
  ASSERT_EQ(m->status, 200);
  EXPECT_NE(m->body.find("dhisparse:kv_check_ok{model_name=\"smol\"} 1"), std::string::npos);
}

TEST_F(ServerTest, ClientLeavingWholeRequestCancels) {
  start();
  const uint64_t aborts_before = engine_->scheduler().stats().n_finished_abort;
  const uint64_t gen_before = engine_->scheduler().stats().generation_tokens;
  // A non-streaming request whose client closes its socket while the answer is generated.
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_GE(fd, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port_));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
  const std::string body = json{{"prompt", "Once upon a time"}, {"max_tokens", 400}, {"ignore_eos", true}}.dump();
  const std::string head = "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: " +
                           std::to_string(body.size()) + "\r\n\r\n";
  ASSERT_EQ(send(fd, (head + body).data(), head.size() + body.size(), 0), static_cast<ssize_t>(head.size() + body.size()));
  auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (engine_->scheduler().stats().generation_tokens < gen_before + 5 && std::chrono::steady_clock::now() < until)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  ASSERT_GE(engine_->scheduler().stats().generation_tokens, gen_before + 5) << "the request did not start";
  close(fd);
  // Noticed at the handler's next poll (200 ms): the request ends as "abort", its pages return
  // (TearDown checks the pool) before its 400 tokens.
  until = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (engine_->scheduler().stats().n_finished_abort == aborts_before && std::chrono::steady_clock::now() < until)
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  EXPECT_EQ(engine_->scheduler().stats().n_finished_abort, aborts_before + 1);
  EXPECT_EQ(server_->counters().n_disconnects, 1u);
  EXPECT_LT(engine_->scheduler().stats().generation_tokens, gen_before + 400);
}

}  // namespace
