// The OpenAI protocol layer of `dhisparse serve` (src/server/openai_protocol.h, sse_stream.h,
// metrics.h): every error path gives its status, param and OpenAI's error object; accepted
// requests fill the engine's options as vLLM reads them; responses, chunks and /metrics text
// have the shapes clients parse.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "dhisparse/scheduler.h"
#include "server/metrics.h"
#include "server/openai_protocol.h"
#include "server/sse_stream.h"

using nlohmann::json;
using namespace dhs::server;

namespace {

// The error a body gets (status 0: accepted).
ApiError error_of(Endpoint ep, const std::string& body) {
  CompletionRequest r;
  auto e = parse_completion_request(ep, body, r);
  return e ? *e : ApiError{0, "", ""};
}
ApiError completion_error(const std::string& body) { return error_of(Endpoint::Completions, body); }
ApiError chat_error(const std::string& body) { return error_of(Endpoint::ChatCompletions, body); }

CompletionRequest parsed(Endpoint ep, const std::string& body) {
  CompletionRequest r;
  auto e = parse_completion_request(ep, body, r);
  EXPECT_FALSE(e) << body << ": " << (e ? e->message : "");
  return r;
}

}  // namespace

TEST(OpenAiProtocol, MalformedBodiesAre400) {
  for (const char* body : {"", "{", "{bad", "[]", "null", "42", "\"text\"", "{\"prompt\": \"a\"", "{\"prompt\": \"\xff\xfe\"}"}) {
    const ApiError e = completion_error(body);
    EXPECT_EQ(e.status, 400) << body;
    EXPECT_FALSE(e.message.empty()) << body;
  }
}

TEST(OpenAiProtocol, WrongTypesName400AndTheField) {
  const std::pair<const char*, const char*> cases[] = {
      {R"({"prompt": 5})", "prompt"},
      {R"({"prompt": [1, "a"]})", "prompt"},
      {R"({"prompt": [1.5]})", "prompt"},
      {R"({"prompt": [-1]})", "prompt"},
      {R"({"prompt": {"a": 1}})", "prompt"},
      {R"({"prompt": "x", "temperature": "hot"})", "temperature"},
      {R"({"prompt": "x", "temperature": true})", "temperature"},
      {R"({"prompt": "x", "max_tokens": "12"})", "max_tokens"},
      {R"({"prompt": "x", "max_tokens": 1.5})", "max_tokens"},
      {R"({"prompt": "x", "stream": "yes"})", "stream"},
      {R"({"prompt": "x", "stop": 3})", "stop"},
      {R"({"prompt": "x", "stop": ["a", 3]})", "stop"},
      {R"({"prompt": "x", "seed": "s"})", "seed"},
      {R"({"prompt": "x", "seed": 1.25})", "seed"},
      {R"({"prompt": "x", "ignore_eos": 1})", "ignore_eos"},
      {R"({"prompt": "x", "model": 7})", "model"},
      {R"({"prompt": "x", "top_k": "all"})", "top_k"},
      {R"({"prompt": "x", "speculative_k": "sometimes"})", "speculative_k"},
      {R"({"prompt": "x", "speculative_k": 17})", "speculative_k"},
      {R"({"prompt": "x", "speculative_k": true})", "speculative_k"},
  };
  for (const auto& [body, param] : cases) {
    const ApiError e = completion_error(body);
    EXPECT_EQ(e.status, 400) << body;
    EXPECT_EQ(e.param, param) << body;
  }
}

TEST(OpenAiProtocol, OutOfRangeNumbersAre400) {
  for (const char* body : {R"({"prompt": "x", "max_tokens": 0})", R"({"prompt": "x", "max_tokens": -5})",
                           R"({"prompt": "x", "max_tokens": 1e30})", R"({"prompt": "x", "temperature": -0.1})",
                           R"({"prompt": "x", "temperature": 1e300})", R"({"prompt": "x", "top_p": 0})",
                           R"({"prompt": "x", "top_p": 1.5})", R"({"prompt": "x", "min_p": 2})",
                           R"({"prompt": "x", "top_k": -2})", R"({"prompt": "x", "repetition_penalty": 0})",
                           R"({"prompt": "x", "max_completion_tokens": 0})", R"({"prompt": "x", "n": 0})",
                           R"({"prompt": [99999999999]})"})
    EXPECT_EQ(completion_error(body).status, 400) << body;
}

TEST(OpenAiProtocol, UnsupportedFeaturesAre400WithAReason) {
  const std::pair<const char*, const char*> cases[] = {
      {R"({"prompt": "x", "presence_penalty": 0.5})", "presence_penalty"},
      {R"({"prompt": "x", "frequency_penalty": -1})", "frequency_penalty"},
      {R"({"prompt": "x", "n": 2})", "n"},
      {R"({"prompt": "x", "best_of": 3})", "best_of"},
      {R"({"prompt": "x", "logprobs": 5})", "logprobs"},
      {R"({"prompt": "x", "echo": true})", "echo"},
      {R"({"prompt": "x", "logit_bias": {"5": 10}})", "logit_bias"},
      {R"({"prompt": ["a", "b"]})", "prompt"},
      {R"({"prompt": "x", "stream_options": {"include_usage": true}})", "stream_options"},
  };
  for (const auto& [body, param] : cases) {
    const ApiError e = completion_error(body);
    EXPECT_EQ(e.status, 400) << body;
    EXPECT_EQ(e.param, param) << body;
  }
  // Zero penalties, n = 1 and logprobs false are what clients send by default: accepted.
  EXPECT_EQ(completion_error(R"({"prompt": "x", "presence_penalty": 0, "frequency_penalty": 0.0, "n": 1, "logprobs": null})").status, 0);
  EXPECT_EQ(chat_error(R"({"messages": [{"role": "user", "content": "hi"}], "logprobs": false})").status, 0);
}

TEST(OpenAiProtocol, ChatMessagesAreChecked) {
  for (const char* body : {R"({})", R"({"messages": []})", R"({"messages": "hi"})", R"({"messages": [5]})",
                           R"({"messages": [{"content": "hi"}]})", R"({"messages": [{"role": 1, "content": "hi"}]})",
                           R"({"messages": [{"role": "user", "content": 5}]})",
                           R"({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]})"}) {
    const ApiError e = chat_error(body);
    EXPECT_EQ(e.status, 400) << body;
    EXPECT_EQ(e.param, "messages") << body;
  }
  const CompletionRequest r = parsed(Endpoint::ChatCompletions,
                                     R"({"messages": [{"role": "system", "content": "Be brief."},
                                                      {"role": "user", "content": [{"type": "text", "text": "a"},
                                                                                   {"type": "text", "text": "b"}]},
                                                      {"role": "assistant", "content": null}]})");
  ASSERT_EQ(r.messages.size(), 3u);
  EXPECT_EQ(r.messages[0].role, "system");
  EXPECT_EQ(r.messages[1].content, "ab");
  EXPECT_EQ(r.messages[2].content, "");
}

TEST(OpenAiProtocol, AcceptedRequestFillsTheEngineOptions) {
  const CompletionRequest r = parsed(Endpoint::Completions, R"({"model": "m", "prompt": "Hello", "max_tokens": 7,
      "temperature": 0.5, "top_p": 0.9, "top_k": 40, "min_p": 0.05, "seed": 1234, "repetition_penalty": 1.1,
      "stop": ["\n", "END"], "ignore_eos": true, "stream": true, "stream_options": {"include_usage": true},
      "user": "someone", "some_future_field": {"x": 1}})");
  EXPECT_EQ(r.model, "m");
  EXPECT_EQ(r.prompt_text, "Hello");
  EXPECT_FALSE(r.prompt_is_ids);
  EXPECT_EQ(r.max_tokens, 7);
  EXPECT_FLOAT_EQ(r.options.sampling.temperature, 0.5f);
  EXPECT_FLOAT_EQ(r.options.sampling.top_p, 0.9f);
  EXPECT_EQ(r.options.sampling.top_k, 40);
  EXPECT_FLOAT_EQ(r.options.sampling.min_p, 0.05f);
  EXPECT_FLOAT_EQ(r.options.sampling.repetition_penalty, 1.1f);
  EXPECT_EQ(r.options.sampling.seed, 1234u);
  EXPECT_TRUE(r.seed_given);
  EXPECT_EQ(r.options.stop, (std::vector<std::string>{"\n", "END"}));
  EXPECT_TRUE(r.options.ignore_eos);
  EXPECT_TRUE(r.stream);
  EXPECT_TRUE(r.include_usage);

  // Defaults as OpenAI's: temperature 1, no seed (the server draws one), top_k -1 = off.
  const CompletionRequest d = parsed(Endpoint::Completions, R"({"prompt": [[1, 2, 3]], "top_k": -1, "stop": "x"})");
  EXPECT_TRUE(d.prompt_is_ids);
  EXPECT_EQ(d.prompt_ids, (std::vector<int32_t>{1, 2, 3}));
  EXPECT_FLOAT_EQ(d.options.sampling.temperature, 1.0f);
  EXPECT_EQ(d.options.sampling.top_k, 0);
  EXPECT_FALSE(d.seed_given);
  EXPECT_FALSE(d.max_tokens.has_value());
  EXPECT_EQ(d.options.stop, (std::vector<std::string>{"x"}));
  // max_completion_tokens wins over max_tokens (OpenAI deprecates the latter for chat).
  EXPECT_EQ(parsed(Endpoint::ChatCompletions,
                   R"({"messages": [{"role": "user", "content": "x"}], "max_tokens": 9, "max_completion_tokens": 4})")
                .max_tokens,
            4);
}

TEST(OpenAiProtocol, FitContextAsVllm) {
  CompletionRequest r = parsed(Endpoint::Completions, R"({"prompt": "x"})");
  ASSERT_FALSE(fit_context(r, {1, 2, 3}, 100, 16));
  EXPECT_EQ(r.options.max_tokens, 13);  // absent: what the context leaves

  r = parsed(Endpoint::Completions, R"({"prompt": "x", "max_tokens": 14})");
  auto e = fit_context(r, {1, 2, 3}, 100, 16);
  ASSERT_TRUE(e);
  EXPECT_EQ(e->status, 400);
  EXPECT_EQ(e->param, "max_tokens");
  EXPECT_NE(e->message.find("maximum context length is 16 tokens"), std::string::npos) << e->message;

  r = parsed(Endpoint::Completions, R"({"prompt": "x", "max_tokens": 13})");
  EXPECT_FALSE(fit_context(r, {1, 2, 3}, 100, 16));

  e = fit_context(r, std::vector<int32_t>(16, 1), 100, 16);  // the prompt alone fills the context
  ASSERT_TRUE(e);
  EXPECT_NE(e->message.find("16 input tokens"), std::string::npos) << e->message;
  e = fit_context(r, {}, 100, 16);
  ASSERT_TRUE(e);
  EXPECT_EQ(e->status, 400);
  e = fit_context(r, {1, 100}, 100, 16);  // outside the vocabulary
  ASSERT_TRUE(e);
  EXPECT_EQ(e->param, "prompt");
}

TEST(OpenAiProtocol, ErrorObjectShape) {
  const json j = error_json(ApiError{429, "slow down", ""});
  EXPECT_EQ(j.at("error").at("message"), "slow down");
  EXPECT_EQ(j.at("error").at("type"), "rate_limit_error");
  EXPECT_TRUE(j.at("error").at("param").is_null());
  EXPECT_EQ(j.at("error").at("code"), 429);
  EXPECT_EQ(error_json(ApiError{400, "m", "top_p"}).at("error").at("param"), "top_p");
  EXPECT_EQ(error_type(401), "authentication_error");
  EXPECT_EQ(error_type(404), "invalid_request_error");
}

TEST(OpenAiProtocol, TokenizeAndDetokenizeBodies) {
  TokenizeRequest t;
  ASSERT_FALSE(parse_tokenize_request(R"({"prompt": "hi", "add_special_tokens": false})", t));
  EXPECT_FALSE(t.chat);
  EXPECT_EQ(t.prompt, "hi");
  EXPECT_FALSE(t.add_special);
  ASSERT_FALSE(parse_tokenize_request(R"({"messages": [{"role": "user", "content": "x"}]})", t));
  EXPECT_TRUE(t.chat);
  EXPECT_EQ(parse_tokenize_request(R"({"prompt": 3})", t)->status, 400);
  EXPECT_EQ(parse_tokenize_request(R"({})", t)->status, 400);
  std::vector<int32_t> ids;
  ASSERT_FALSE(parse_detokenize_request(R"({"tokens": [1, 2]})", ids));
  EXPECT_EQ(ids, (std::vector<int32_t>{1, 2}));
  ids.clear();
  EXPECT_EQ(parse_detokenize_request(R"({"tokens": "12"})", ids)->param, "tokens");
  EXPECT_EQ(parse_detokenize_request(R"({"tokens": [-3]})", ids)->status, 400);
}

TEST(OpenAiProtocol, ResponseShapes) {
  const ResponseMeta chat{Endpoint::ChatCompletions, "chatcmpl-1", 100, "m"};
  const json r = response_json(chat, "Hi!", "stop", 5, 2);
  EXPECT_EQ(r.at("object"), "chat.completion");
  EXPECT_EQ(r.at("choices").at(0).at("message").at("role"), "assistant");
  EXPECT_EQ(r.at("choices").at(0).at("message").at("content"), "Hi!");
  EXPECT_EQ(r.at("choices").at(0).at("finish_reason"), "stop");
  EXPECT_EQ(r.at("usage"), (json{{"prompt_tokens", 5}, {"completion_tokens", 2}, {"total_tokens", 7}}));

  const ResponseMeta cmpl{Endpoint::Completions, "cmpl-1", 100, "m"};
  const json c = response_json(cmpl, "text", "length", 1, 3);
  EXPECT_EQ(c.at("object"), "text_completion");
  EXPECT_EQ(c.at("choices").at(0).at("text"), "text");
  // Invalid UTF-8 in text (detokenized arbitrary ids) is replaced on the wire, not thrown about.
  EXPECT_NO_THROW(dump_json(response_json(cmpl, "\xff\xfe", "stop", 1, 1)));
}

TEST(OpenAiProtocol, SseStreamOrder) {
  auto lines_of = [](const std::string& s) {
    std::vector<std::string> out;
    size_t pos = 0;
    while (pos < s.size()) {
      const size_t end = s.find("\n\n", pos);
      EXPECT_NE(end, std::string::npos) << "an event not ended by a blank line";
      if (end == std::string::npos) break;
      out.push_back(s.substr(pos, end - pos));
      pos = end + 2;
    }
    return out;
  };
  SseStream chat(ResponseMeta{Endpoint::ChatCompletions, "chatcmpl-1", 1, "m"}, /*include_usage=*/true);
  std::string all = chat.open();
  StreamUpdate u;
  u.text = "Hel";
  all += chat.events(u);
  u.text = "lo";
  u.finished = true;
  u.finish_reason = "stop";
  u.n_prompt = 4;
  u.n_generated = 2;
  all += chat.events(u);
  const auto ev = lines_of(all);
  ASSERT_EQ(ev.size(), 5u);
  for (size_t i = 0; i + 1 < ev.size(); ++i) ASSERT_EQ(ev[i].rfind("data: ", 0), 0u) << ev[i];
  const json role = json::parse(ev[0].substr(6));
  EXPECT_EQ(role.at("choices").at(0).at("delta").at("role"), "assistant");
  EXPECT_TRUE(role.at("usage").is_null());
  EXPECT_EQ(json::parse(ev[1].substr(6)).at("choices").at(0).at("delta").at("content"), "Hel");
  const json last = json::parse(ev[2].substr(6));
  EXPECT_EQ(last.at("choices").at(0).at("delta").at("content"), "lo");
  EXPECT_EQ(last.at("choices").at(0).at("finish_reason"), "stop");
  const json usage = json::parse(ev[3].substr(6));
  EXPECT_TRUE(usage.at("choices").empty());
  EXPECT_EQ(usage.at("usage").at("total_tokens"), 6);
  EXPECT_EQ(ev[4], "data: [DONE]");

  // Completions: no role chunk, no usage fields without include_usage; an engine error ends
  // with an error object, then [DONE].
  SseStream cmpl(ResponseMeta{Endpoint::Completions, "cmpl-1", 1, "m"}, false);
  EXPECT_EQ(cmpl.open(), "");
  StreamUpdate err;
  err.finished = true;
  err.finish_reason = "error";
  err.error = "boom";
  const auto ee = lines_of(cmpl.events(err));
  ASSERT_EQ(ee.size(), 2u);
  EXPECT_EQ(json::parse(ee[0].substr(6)).at("error").at("message"), "boom");
  EXPECT_EQ(ee[1], "data: [DONE]");
}

TEST(OpenAiProtocol, MetricsText) {
  dhs::SchedulerStats s;
  s.n_running = 3;
  s.n_waiting = 2;
  s.kv = {100, 75, 25};
  s.generation_tokens = 42;
  s.ttft = dhs::Histogram({0.1, 1.0});
  s.ttft.add(0.05);
  s.ttft.add(0.5);
  s.ttft.add(5.0);
  s.kv_check = "page 3 owned twice";
  const std::string t = render_metrics(s, "m\"x", HttpCounters{});
  auto has = [&](const std::string& line) { return t.find(line + "\n") != std::string::npos; };
  EXPECT_TRUE(has(R"(vllm:num_requests_running{model_name="m\"x"} 3)")) << t;
  EXPECT_TRUE(has(R"(vllm:num_requests_waiting{model_name="m\"x"} 2)"));
  EXPECT_TRUE(has(R"(vllm:gpu_cache_usage_perc{model_name="m\"x"} 0.25)"));
  EXPECT_TRUE(has(R"(vllm:generation_tokens_total{model_name="m\"x"} 42)"));
  EXPECT_TRUE(has(R"(vllm:time_to_first_token_seconds_bucket{model_name="m\"x",le="0.10000000000000001"} 1)")) << t;
  EXPECT_TRUE(has(R"(vllm:time_to_first_token_seconds_bucket{model_name="m\"x",le="1"} 2)"));
  EXPECT_TRUE(has(R"(vllm:time_to_first_token_seconds_bucket{model_name="m\"x",le="+Inf"} 3)"));
  EXPECT_TRUE(has(R"(vllm:time_to_first_token_seconds_count{model_name="m\"x"} 3)"));
  EXPECT_TRUE(has(R"(dhisparse:kv_pool_used_blocks{model_name="m\"x"} 25)"));
  EXPECT_TRUE(has(R"(dhisparse:kv_check_ok{model_name="m\"x"} 0)"));
  EXPECT_TRUE(has("# TYPE vllm:e2e_request_latency_seconds histogram"));
}

TEST(OpenAiProtocol, SpeculativeKIsAnIntegerOrAuto) {
  EXPECT_EQ(parsed(Endpoint::Completions, R"({"prompt": "x", "speculative_k": 4})").options.speculative_k, 4);
  EXPECT_EQ(parsed(Endpoint::Completions, R"({"prompt": "x", "speculative_k": "auto"})").options.speculative_k,
            dhs::kSpeculativeAuto);
  EXPECT_EQ(parsed(Endpoint::Completions, R"({"prompt": "x"})").options.speculative_k, -1) << "the server's";
}
