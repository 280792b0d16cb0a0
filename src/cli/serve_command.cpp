#include "cli/serve_command.h"

#include <pthread.h>
#include <signal.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <future>
#include <thread>

#include "cli/option_checks.h"
#include "cli/version.h"
#include "server/http_server.h"
#include "server/served_model.h"

namespace dhs::cli {

ServeCommand::ServeCommand(CLI::App& app) {
  app_ = app.add_subcommand("serve", "Serve a model over HTTP with the OpenAI API (/v1/completions, /v1/chat/completions, "
                                     "streaming), continuous batching, /metrics in vLLM's names");
  app_->add_option("model", model_, "GGUF file or Hugging Face directory (default: the bundled SmolLM2-135M-Instruct)");
  app_->add_option("--host", http_.host, "Address to listen on")->capture_default_str();
  app_->add_option("--port", http_.port, "Port to listen on (0: any free port, printed)")->check(int_in(0, 65535))->capture_default_str();
  app_->add_option("--api-key", http_.api_key, "Every /v1 route wants 'Authorization: Bearer KEY'");
  app_->add_option("--served-model-name", http_.served_model_name, "Model name in the API (default: the model file's name)");
  app_->add_option("--max-model-len", max_model_len_, "Prompt + generated tokens per request; 0 = the model's context (capped at 8192 on CPU)")->check(int_in(0, kMaxTokens));
  app_->add_option("--max-num-seqs", so_.max_num_seqs, "Requests running at once (0 = the backend's default)")->check(int_in(0, 1 << 16));
  app_->add_option("--max-num-batched-tokens", so_.max_num_batched_tokens, "Tokens of one step, decode rows and prefill chunks (0 = the backend's default)")->check(int_in(0, kMaxTokens));
  app_->add_option("--kv-io-admit-max", so_.kv_io_admit_max, "With --cpu-kv-gb: a request that needs running requests' pages offloaded waits while the hierarchy's I/O load with it running (the share of the link its moves take, the working sets the pool would no longer hold included) is above this")->check(real_in(0.0, End::Open, 1e6, End::Closed))->capture_default_str();
  app_->add_option("--kv-io-admit", kv_io_admit_, "With --cpu-kv-gb: throughput = also wait while the batch's tokens per second would fall with the request running (the step's cost fitted against its rows and the pages moved); load = --kv-io-admit-max alone")->check(CLI::IsMember({"throughput", "load"}))->capture_default_str();
  app_->add_option("--max-waiting", so_.max_waiting, "Requests that may wait for admission; more get HTTP 429")->check(int_in(0, 1 << 20))->capture_default_str();
  app_->add_option("--gpu-memory-utilization", eo_.gpu_memory_utilization, "Fraction of the GPU's memory the engine may take")->check(real_in(0.0, End::Open, 1.0, End::Closed))->capture_default_str();
  app_->add_option("--block-size", eo_.page_size, "Tokens per KV head-page")->check(int_in(1, 256))->capture_default_str();
  app_->add_option("--num-gpu-blocks-override", eo_.kv_blocks, "KV pool size in blocks (0 = from the context / the GPU's free memory)")->check(int_in(0, kNoLimit));
  app_->add_option("--chat-template", eo_.chat_template, "Override the chat template (file path or template text)");
  app_->add_option("--load-format", eo_.load_format, "auto: weights from MODEL; dummy: random weights of MODEL's shape (or --dummy-shape), for speed runs")->check(CLI::IsMember({"auto", "dummy"}))->capture_default_str();
  app_->add_option("--dummy-shape", eo_.dummy_shape, "With --load-format dummy: a named shape (e.g. llama3-8b) with MODEL's tokenizer");
  app_->add_option("--device", eo_.device, "Backend: cpu, or cuda (needs a GPU and a CUDA build)")->check(CLI::IsMember({"cpu", "cuda"}))->capture_default_str();
  app_->add_option("-t,--threads", eo_.n_threads, "CPU threads; 0 = all")->check(int_in(0, 4096));
  app_->add_option("--weights", eo_.weight_type, "CPU weight storage: f16 or f32")->check(CLI::IsMember({"f16", "f32"}))->capture_default_str();
  add_gpu_weight_options(app_, eo_);
  add_kv_tier_options(app_, eo_);
  app_->add_option("--http-threads", http_.http_threads, "HTTP worker threads = connections served at once, SSE streams included (0 = max-num-seqs + max-waiting + 64, at most 1000)")->check(int_in(0, 1 << 14));
  app_->add_option("--shutdown-timeout", http_.shutdown_timeout_s, "SIGTERM/SIGINT: seconds running requests get to finish before they are aborted")->check(real_in(0.0, End::Closed, 86400.0, End::Closed))->capture_default_str();
  app_->add_option("--speculative-k", so_.speculative_k,
                  "Speculative decoding: drafts per cycle on --draft-policy, verified in one step (greedy: the tokens "
                  "of decoding without it; sampled: its distribution; on the GPU the verify rows of a sparse policy share one "
                  "selection); a request's 'speculative_k' "
                  "overrides; 0 = off; auto = drafts chosen per cycle from the measured acceptance and step costs, 0 where "
                  "speculation would not pay")
      ->transform(speculative_k_value(16))->capture_default_str();
  app_->add_option("--draft-policy", so_.draft_policy, "The draft's pages: sinkwindow:PAGES, or sinkwindow:PAGES+SEEDS (also the verifier's SEEDS heaviest selected pages per list)")->capture_default_str();
  // The sparse flags of generate (generate_command.cpp), same names and meaning.
  app_->add_option("--sparse-policy", sparse_policy_,
                  "KV pages each head reads: RULE[:VALUE][/R][@ESTIMATOR] (as generate's --sparse-policy)")
      ->capture_default_str();
  app_->add_option("--gamma", policy_.spec.gamma, "coverage / solohead: attention mass to keep per layer, KV head and step")->check(real_in(0.0, End::Open, 1.0, End::Closed))->capture_default_str();
  app_->add_option("--budget", policy_.spec.budget, "topk / sinkwindow / solohead: pages per list")->check(int_in(0, kMaxTokens));
  app_->add_option("--sparse-min-tokens", policy_.spec.min_step_tokens, "decode steps whose batch holds fewer context tokens in all read every page")->check(int_in(0, kNoLimit));
  policy_.add(app_, "Page mass estimate: sketch4, minmax, meanspread, gaussian", false);
  app_->add_option("--reselect-every", policy_.spec.reselect_every, "A layer selects its pages every N decode steps")->check(int_in(1, 64))->capture_default_str();
}

void ServeCommand::check() {
  eo_.policy = policy_.parse(sparse_policy_, "--sparse-policy");
  const RuleArg arg = rule_info(eo_.policy.rule).arg;
  const std::string pol = eo_.policy.rule_name();
  if (app_->count("--gamma") > 0 && arg != RuleArg::Mass && arg != RuleArg::MassOrPages)
    throw CLI::ValidationError("--gamma", "applies to --sparse-policy coverage or solohead, not " + pol);
  if (app_->count("--budget") > 0 && arg != RuleArg::Pages && arg != RuleArg::MassOrPages)
    throw CLI::ValidationError("--budget", "applies to --sparse-policy topk, sinkwindow or solohead, not " + pol);
  if (app_->count("--dummy-shape") > 0 && eo_.load_format != "dummy")
    throw CLI::ValidationError("--dummy-shape", "applies to --load-format dummy");
}

int ServeCommand::run(std::string& oom_while) {
  eo_.model_path = resolve_model(model_, app_->count("model") > 0);
  eo_.max_context = max_model_len_;
  so_.kv_admit_throughput = kv_io_admit_ == "throughput";
  eo_.max_batch = so_.max_num_seqs;
  if (http_.served_model_name.empty()) http_.served_model_name = std::filesystem::path(eo_.model_path).stem().string();
  http_.version = version_text();
  if (http_.http_threads == 0) http_.http_threads = std::min(1000, so_.max_num_seqs + so_.max_waiting + 64);

  // SIGTERM / SIGINT go to one watcher thread (sigwait): blocked here, before any thread starts,
  // every thread inherits the mask, so no handler runs at an arbitrary point of the engine.
  sigset_t sigs;
  sigemptyset(&sigs);
  sigaddset(&sigs, SIGTERM);
  sigaddset(&sigs, SIGINT);
  pthread_sigmask(SIG_BLOCK, &sigs, nullptr);
  signal(SIGPIPE, SIG_IGN);  // a client gone mid-write is an error return, not a kill

  server::HttpServer http(http_);
  const int port = http.bind();
  std::fprintf(stderr, "serve: listening on http://%s:%d (model '%s' loading)\n", http_.host.c_str(), port,
               http_.served_model_name.c_str());
  std::atomic<bool> load_failed{false};  // the watcher is woken to stop, not by a signal
  std::promise<void> served_out;
  std::future<void> listener_done = served_out.get_future();
  std::thread listener([&] {
    http.serve();
    served_out.set_value();
  });
  const double shutdown_timeout = http_.shutdown_timeout_s;
  const int linger_s = http_.read_timeout_s + 5;
  std::thread watcher([&] {
    int sig = 0;
    sigwait(&sigs, &sig);
    if (!load_failed)
      std::fprintf(stderr, "serve: %s: stopping (running requests get %.0f s)\n", sig == SIGINT ? "SIGINT" : "SIGTERM",
                   shutdown_timeout);
    http.shutdown(shutdown_timeout);
    // httplib's stop joins every connection thread; one held by a client that trickles its
    // headers (only each read is timed) would hold the exit without bound. Requests are ended
    // by now, so past a bound the process leaves without those connections.
    if (listener_done.wait_for(std::chrono::seconds(linger_s)) != std::future_status::ready) {
      std::fprintf(stderr, "serve: connections still open %d s after shutdown; exiting without them\n", linger_s);
      std::fflush(stderr);
      std::_Exit(0);
    }
  });
  auto stop_threads = [&] {
    load_failed = true;
    pthread_kill(watcher.native_handle(), SIGTERM);  // wakes the watcher, which shuts down
    watcher.join();
    listener.join();
  };

  std::unique_ptr<Engine> engine;
  std::unique_ptr<server::ServedModel> served;
  try {
    oom_while = "loading the model and its KV cache";
    eo_.progress = [](int64_t done, int64_t total) { progress_bar("loading", done, total); };
    engine = Engine::load(eo_);
    SchedulerOptions so = so_;
    const SchedulerOptions& dflt = engine->scheduler().options();
    if (so.max_num_seqs == 0) so.max_num_seqs = dflt.max_num_seqs;
    if (so.max_num_batched_tokens == 0) so.max_num_batched_tokens = dflt.max_num_batched_tokens;
    so.max_model_len = engine->max_context();
    engine->configure_scheduler(so);
    engine->scheduler().start();
    served = server::serve_engine(*engine);
    http.set_model(served.get());
    const PoolStats kv = engine->kv_stats();
    std::fprintf(stderr, "serve: ready: max-model-len %lld, max-num-seqs %d, max-num-batched-tokens %lld, KV pool %lld blocks of %d tokens\n",
                 static_cast<long long>(so.max_model_len), so.max_num_seqs,
                 static_cast<long long>(so.max_num_batched_tokens), static_cast<long long>(kv.n_total), eo_.page_size);
    oom_while = "serving";
  } catch (...) {
    stop_threads();
    throw;
  }
  listener.join();  // returns once the watcher has shut the server down
  watcher.join();
  if (engine) engine->scheduler().stop(/*drain=*/false);  // already stopped by shutdown; idempotent
  std::fprintf(stderr, "serve: stopped\n");
  return 0;
}

}  // namespace dhs::cli
