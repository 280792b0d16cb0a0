// The local engine over the head-paged KV substrate, on the CPU or the CUDA backend (a
// StepRunner). Requests run through its continuous-batching scheduler (generate is a
// batch of one); sessions and prompt_logits step the runner directly, in slot 0.
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "backend/cpu/cpu_matrix.h"
#include "core/error.h"
#include "template/chat_template.h"
#include "tokenizer/tokenizer.h"
#include "core/thread_pool.h"
#include "dhisparse/engine.h"
#include "engine/continuous_scheduler.h"
#include "kv/page_table.h"
#include "engine/step_runner.h"
#include "model/gguf_source.h"
#include "model/hf_source.h"
#include "model/model_loader.h"
#include "model/model_shapes.h"

namespace dhs {

namespace {

constexpr int64_t kCpuContextCap = 8192;

std::unique_ptr<Tokenizer> load_tokenizer(const WeightSource& src) {
  if (const auto* g = dynamic_cast<const GgufSource*>(&src)) return Tokenizer::from_gguf(g->file());
  if (const auto* h = dynamic_cast<const HfDirSource*>(&src)) {
    DHS_CHECK(!h->tokenizer_json_path().empty(), "{}: no tokenizer.json in the model directory", h->dir());
    return Tokenizer::from_hf_files(h->tokenizer_json_path(), h->tokenizer_config_path());
  }
  throw Error("unknown model source");
}

std::string load_template_override(const std::string& t) {
  std::error_code ec;
  if (t.find("{%") == std::string::npos && t.find("{{") == std::string::npos &&
      std::filesystem::is_regular_file(t, ec)) {
    std::ifstream f(t, std::ios::binary);
    std::stringstream ss;
    ss << f.rdbuf();
    return ss.str();
  }
  DHS_CHECK(t.find("{%") != std::string::npos || t.find("{{") != std::string::npos,
            "--chat-template: '{}' is neither a readable file nor template text", t);
  return t;
}

using Clock = std::chrono::steady_clock;

class LocalEngine final : public Engine {
 public:
  explicit LocalEngine(const EngineOptions& o) {
    if (o.n_threads > 0) ThreadPool::set_global_threads(o.n_threads);
    DHS_CHECK(o.device == "cpu" || o.device == "cuda", "device must be cpu or cuda, got '{}'", o.device);
    DHS_CHECK(o.page_size >= 1 && o.page_size <= 256, "page size must be in [1, 256], got {}", o.page_size);
    src_ = open_weights(o.model_path);
    tok_ = load_tokenizer(*src_);
    if (!o.chat_template.empty()) {
      chat_ = std::make_unique<ChatTemplate>(load_template_override(o.chat_template));  // asked for: fail loudly
    } else if (!tok_->chat_template().empty()) {
      // The model file's own template: one that does not parse must not keep the model from
      // running raw prompts; --chat then says why it cannot.
      try {
        chat_ = std::make_unique<ChatTemplate>(tok_->chat_template());
      } catch (const Error& e) {
        chat_error_ = e.what();
        std::fprintf(stderr, "warning: the model's chat template is unusable, chat is off (%s)\n", e.what());
      }
    }
    DHS_CHECK(o.load_format == "auto" || o.load_format == "dummy", "load format must be auto or dummy, got '{}'",
              o.load_format);
    DHS_CHECK(o.dummy_shape.empty() || o.load_format == "dummy", "a dummy shape ('{}') applies to load format dummy",
              o.dummy_shape);
    // --load-format dummy --dummy-shape NAME: the named shape's config with model_path's tokenizer.
    const ModelConfig c = o.dummy_shape.empty() ? src_->config() : model_shape(o.dummy_shape);
    // Ids past the tokenizer's vocabulary are padding of the embedding (Qwen2.5 pads to a
    // multiple of 128): never sampled. Ids the model cannot embed are a broken file.
    DHS_CHECK(tok_->vocab_size() <= c.vocab_size, "the tokenizer has {} tokens but the model's embedding only {} rows",
              tok_->vocab_size(), c.vocab_size);
    // The CPU keeps a whole-context pool in host memory: cap it; the GPU takes the model's context.
    const int64_t dflt = o.device == "cpu" ? std::min<int64_t>(c.max_context, kCpuContextCap) : c.max_context;
    // Past the trained context RoPE positions were never seen, and a huge -c would only fail
    // as an allocation of the KV pool: say it here, with both numbers.
    DHS_CHECK(o.max_context <= c.max_context, "context size (--ctx-size) {} is larger than the model's trained context of {} tokens",
              o.max_context, c.max_context);
    max_ctx_ = o.max_context > 0 ? o.max_context : dflt;
    DHS_CHECK(max_ctx_ >= 1 && max_ctx_ <= (int64_t{1} << 24), "context size must be in [1, 2^24], got {}", max_ctx_);
    runner_ = o.device == "cuda" ? make_cuda_runner(*src_, o, max_ctx_) : make_cpu_runner(*src_, o, max_ctx_);
    runner_->set_sampled_vocab(tok_->vocab_size());  // ids past it: embedding padding
    page_size_ = o.page_size;
    SchedulerOptions so;
    so.max_num_seqs = runner_->max_batch();
    so.max_num_batched_tokens = runner_->max_step_tokens();
    sched_ = std::make_unique<ContinuousScheduler>(*runner_, *tok_, max_ctx_, so);
  }
  ~LocalEngine() override { sched_.reset(); }  // before the runner it steps

  const ModelConfig& config() const override { return runner_->config(); }
  const Tokenizer& tokenizer() const override { return *tok_; }
  int64_t max_context() const override { return max_ctx_; }

  std::vector<int32_t> tokenize(const std::string& text) const override {
    std::vector<int32_t> ids;
    if (tok_->add_bos() && tok_->bos_id() >= 0) ids.push_back(tok_->bos_id());
    auto rest = tok_->encode(text, /*parse_special=*/true);
    ids.insert(ids.end(), rest.begin(), rest.end());
    return ids;
  }

  std::vector<int32_t> tokenize_no_bos(const std::string& text) const override {
    return tok_->encode(text, /*parse_special=*/true);
  }
  std::string detokenize(const std::vector<int32_t>& ids, bool skip_special) const override {
    return tok_->decode(ids, skip_special);
  }
  int64_t vocab_size() const override { return tok_->vocab_size(); }

  std::string render_chat(const std::vector<ChatMessage>& messages, bool add_generation_prompt) const override {
    DHS_CHECK(chat_ != nullptr, "{}", chat_error_.empty() ? "this model has no chat template; pass --chat-template"
                                                          : "the model's chat template is unusable (" + chat_error_ +
                                                                "); pass --chat-template");
    const std::string bos = tok_->bos_id() >= 0 ? tok_->token_text(tok_->bos_id()) : "";
    const std::string eos = tok_->eos_id() >= 0 ? tok_->token_text(tok_->eos_id()) : "";
    return chat_->render(messages, add_generation_prompt, bos, eos);
  }

  std::vector<int32_t> tokenize_chat(const std::vector<ChatMessage>& messages,
                                     bool add_generation_prompt) const override {
    std::vector<ChatMessage> guarded;
    guarded.reserve(messages.size());
    for (const ChatMessage& m : messages) guarded.push_back({tok_->guard_text(m.role), tok_->guard_text(m.content)});
    const std::vector<int32_t> body = tok_->encode_guarded(render_chat(guarded, add_generation_prompt));
    std::vector<int32_t> ids;
    // Templates that write bos_token themselves (Llama 3) get no second one.
    if (tok_->add_bos() && tok_->bos_id() >= 0 && (body.empty() || body.front() != tok_->bos_id()))
      ids.push_back(tok_->bos_id());
    ids.insert(ids.end(), body.begin(), body.end());
    return ids;
  }

  std::vector<float> prompt_logits(const std::vector<int32_t>& prompt) override {
    PageTable table = new_table();
    std::vector<float> logits;
    try {
      prefill(table, prompt, &logits);
    } catch (...) {
      runner_->release(table);
      throw;
    }
    runner_->release(table);
    return logits;
  }

  // A batch of one through the scheduler: stepped here, or by the loop thread once a server
  // started it.
  GenerateResult generate(const std::vector<int32_t>& prompt, const GenerateOptions& opts,
                          const std::function<bool(const std::string&)>& on_text) override {
    GenerateResult res;
    res.n_prompt = static_cast<int64_t>(prompt.size());
    std::mutex mu;
    std::condition_variable cv;
    bool done = false;
    std::string error;
    const auto t0 = Clock::now();
    auto t_first = t0, t_end = t0;
    (void)sched_->take_page_counts();  // this request's steps only
    const RequestSink sink = [&](const RequestEvent& e) {
      std::lock_guard lk(mu);
      if (!e.tokens.empty() && res.tokens.empty()) t_first = Clock::now();
      if (!e.tokens.empty()) t_end = Clock::now();
      res.tokens.insert(res.tokens.end(), e.tokens.begin(), e.tokens.end());
      res.text += e.text;
      res.spec_verifies = e.spec_verifies;
      res.spec_drafted = e.spec_drafted;
      res.spec_accepted = e.spec_accepted;
      if (!e.text.empty() && on_text && !on_text(e.text) && !e.finished) {
        sched_->cancel(e.id);
      }
      if (e.finished) {
        res.finish_reason = e.finish_reason;
        error = e.error;
        done = true;
        cv.notify_all();
      }
    };
    const SubmitResult sub = sched_->submit(RequestParams{prompt, opts}, sink);
    DHS_CHECK(sub.status == SubmitStatus::Accepted, "{}", sub.error);
    if (sched_->started()) {
      std::unique_lock lk(mu);
      cv.wait(lk, [&] { return done; });
    } else {
      while (!done) sched_->step();
    }
    DHS_CHECK(res.finish_reason != "error", "generation failed: {}", error);
    res.prompt_seconds = std::chrono::duration<double>((res.tokens.empty() ? t_end : t_first) - t0).count();
    res.decode_seconds = res.tokens.size() > 1 ? std::chrono::duration<double>(t_end - t_first).count() : 0.0;
    res.pages_read_frac = sched_->take_page_counts().read_frac();
    return res;
  }

  std::unique_ptr<Session> open_session() override;

  void set_policy(const PolicySpec& policy) override {
    // A seeded draft policy (eval's speculation): the scoring steps record seeds from now on.
    if (policy.seed_pages > 0) runner_->keep_draft_seeds(policy.seed_pages);
    runner_->set_policy(policy);
  }
  // The scheduler's steps and the sessions' steps alike.
  PageCounts take_page_counts() override {
    PageCounts c = sched_->take_page_counts();
    const PageCounts s = runner_->take_page_counts();
    c.read += s.read;
    c.total += s.total;
    if (c.layer_head_read.empty()) {
      c.layer_head_read = s.layer_head_read;
      c.layer_head_total = s.layer_head_total;
    } else {
      for (size_t i = 0; i < s.layer_head_read.size() && i < c.layer_head_read.size(); ++i) {
        c.layer_head_read[i] += s.layer_head_read[i];
        c.layer_head_total[i] += s.layer_head_total[i];
      }
    }
    return c;
  }

  Scheduler& scheduler() override { return *sched_; }
  void configure_scheduler(const SchedulerOptions& opts) override {
    DHS_CHECK(!sched_->started() && sched_->idle(), "the scheduler can be configured only while it is stopped and idle");
    sched_ = std::make_unique<ContinuousScheduler>(*runner_, *tok_, max_ctx_, opts);
  }

  double calibrate_key_basis(const std::vector<int32_t>& prompt, int rank, bool query_aware) override {
    DHS_CHECK(!prompt.empty(), "key basis calibration needs a non-empty prompt");
    PageTable table = new_table();
    std::vector<float> logits;
    try {
      runner_->capture_queries(query_aware);
      prefill(table, prompt, &logits);
      const double kept = runner_->fit_key_basis(table, table.n_tokens(), rank, query_aware);
      runner_->capture_queries(false);
      runner_->release(table);
      return kept;
    } catch (...) {
      runner_->capture_queries(false);
      runner_->release(table);
      throw;
    }
  }

  PoolStats kv_stats() const override { return runner_->pages().stats(); }
  std::string kv_check() const override {
    const std::string e = runner_->pages().check_invariants();
    return e.empty() ? runner_->check_pages() : e;
  }
  TierCounts tier_counts() const override { return runner_->tier_counts(); }

 private:
  PageTable new_table() const {
    const ModelConfig& c = runner_->config();
    return PageTable(static_cast<int>(c.n_layers), static_cast<int>(c.n_heads_kv), page_size_);
  }

  // A batch of one: n tokens of the request in kSlot, its pages reserved first. Copies its
  // last-row logits ([vocab]) to `logits` when given; samples its next token (returned, -1
  // when not) when `history` is given.
  int32_t step(PageTable& table, const int32_t* ids, int64_t n, std::vector<float>* logits,
               const std::vector<int32_t>* history = nullptr, bool draft = false) {
    PagePool& pool = runner_->pages();
    // With a host tier, cold pages (this request's own earlier chunks among them) make room first.
    if (pool.n_free() < table.pages_needed(n)) runner_->make_room(table.pages_needed(n));
    DHS_CHECK(table.reserve(pool, n), "out of KV pages ({} free, {} needed)", pool.n_free(), table.pages_needed(n));
    StepRequest r{&table, kSlot, ids, n, history != nullptr, history};
    r.draft = draft && n == 1;
    runner_->step({r}, &out_, logits != nullptr);
    if (logits) logits->swap(out_.logits);
    return out_.sampled.at(0);
  }

  // The prompt, checked against the context, in chunks.
  int32_t prefill(PageTable& table, const std::vector<int32_t>& prompt, std::vector<float>* logits,
                  const std::vector<int32_t>* history = nullptr) {
    DHS_CHECK(!prompt.empty(), "empty prompt");
    DHS_CHECK(static_cast<int64_t>(prompt.size()) < max_ctx_,
              "prompt has {} tokens; the context holds {} (raise --ctx-size up to the model's {})", prompt.size(),
              max_ctx_, runner_->config().max_context);
    return append_chunks(table, prompt, logits, history);
  }

  // Tokens in chunks of the runner's step size; only the last chunk has an output (logits,
  // sampled token: as step()).
  int32_t append_chunks(PageTable& table, const std::vector<int32_t>& ids, std::vector<float>* logits,
                        const std::vector<int32_t>* history = nullptr) {
    const int64_t chunk = runner_->max_step_tokens();
    int32_t sampled = -1;
    for (size_t b = 0; b < ids.size(); b += static_cast<size_t>(chunk)) {
      const int64_t n = std::min<int64_t>(chunk, static_cast<int64_t>(ids.size() - b));
      const bool last = b + static_cast<size_t>(n) == ids.size();
      sampled = step(table, ids.data() + b, n, last ? logits : nullptr, last ? history : nullptr);
    }
    return sampled;
  }

  friend class LocalSession;
  std::unique_ptr<WeightSource> src_;
  std::unique_ptr<Tokenizer> tok_;
  std::unique_ptr<ChatTemplate> chat_;
  std::string chat_error_;  // why the model's own template could not be used ("" if it could)
  std::unique_ptr<StepRunner> runner_;
  std::unique_ptr<ContinuousScheduler> sched_;
  StepOutput out_;                 // the last step's outputs (buffers reused)
  static constexpr int kSlot = 0;  // one request at a time: it runs in the runner's slot 0
  int64_t max_ctx_ = 0;
  int page_size_ = 16;
};

// One request's table kept between calls; its pages go back to the pool with it.
class LocalSession final : public Session {
 public:
  explicit LocalSession(LocalEngine& e) : e_(e), table_(e.new_table()) {}
  ~LocalSession() override { e_.runner_->release(table_); }
  int64_t n_tokens() const override { return table_.n_tokens(); }
  void append(const std::vector<int32_t>& ids, std::vector<float>* logits) override {
    DHS_CHECK(!ids.empty(), "append: no tokens");
    DHS_CHECK(table_.n_tokens() + static_cast<int64_t>(ids.size()) <= e_.max_ctx_, "context full ({} tokens)",
              e_.max_ctx_);
    for (const int32_t id : ids)
      DHS_CHECK(id >= 0 && id < e_.runner_->config().vocab_size, "token id {} out of range", id);
    if (drafting_ && ids.size() == 1) {
      e_.step(table_, ids.data(), 1, logits, nullptr, /*draft=*/true);
      return;
    }
    e_.append_chunks(table_, ids, logits);
  }
  void set_drafting(bool on) override { drafting_ = on; }
  void truncate(int64_t n_tokens) override {
    DHS_CHECK(n_tokens >= 0 && n_tokens <= table_.n_tokens(), "truncate to {} of {} tokens", n_tokens, table_.n_tokens());
    e_.runner_->truncate(table_, n_tokens);
  }

 private:
  LocalEngine& e_;
  PageTable table_;
  bool drafting_ = false;
};

std::unique_ptr<Session> LocalEngine::open_session() { return std::make_unique<LocalSession>(*this); }

}  // namespace

std::unique_ptr<Engine> Engine::load(const EngineOptions& opts) { return std::make_unique<LocalEngine>(opts); }

}  // namespace dhs
