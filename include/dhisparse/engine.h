// dhisparse public API: load a model, tokenize, render chat, generate.
// Front ends (CLI, server) use only this header.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "dhisparse/error.h"
#include "dhisparse/kv_stats.h"
#include "dhisparse/model_config.h"
#include "dhisparse/policy.h"
#include "dhisparse/sampling.h"
#include "dhisparse/chat.h"

namespace dhs {

class Scheduler;  // dhisparse/scheduler.h
struct SchedulerOptions;
class Tokenizer;  // the engine's tokenizer, for code inside dhisparse (tokenizer/tokenizer.h)

struct EngineOptions {
  std::string model_path;           // GGUF file or Hugging Face directory
  std::string device = "cpu";       // cpu, or cuda (f16 activations and KV on the GPU)
  int n_threads = 0;                // 0: all hardware threads
  int page_size = 16;               // tokens per head-page
  int64_t max_context = 0;          // 0: the model's trained context (capped at 8192 on the CPU)
  std::string weight_type = "f16";  // CPU weight storage: f16 (fast) or f32 (exact)
  // CUDA weight storage: "native" keeps GGUF block formats (Q8_0, Q4_0, Q4_1, Q5_0, Q4_K, Q5_K,
  // Q6_K) as the file holds them and multiplies them dequantizing in registers (GEMV v1); "packed"
  // (the default) is native with Q8_0 and Q4_K repacked at load for the tensor-core GEMV v2 (the
  // same numbers; backend/cuda/packed_gemv.h); "f16" dequantizes every matrix to f16 at load.
  // Other tensors are f16 either way.
  std::string gpu_weights = "packed";
  // CUDA: "fp8" quantizes every projection matrix at load to FP8 E4M3 with one fp32 scale per
  // output row (the output head stays f16, as vLLM's --quantization fp8); "none" keeps gpu_weights.
  std::string quantization = "none";
  // CUDA, speculative decoding: "fp8" keeps an FP8 E4M3 copy of every projection matrix (one
  // scale per output row, quantized at load as --quantization fp8 quantizes them) that steps of
  // drafts only read — about half a draft step's weight bytes over f16 projections — while
  // verify and plain steps keep the model's own weights, so output is unchanged (a draft's KV is
  // written again by its verify); acceptance is what it may cost. One byte of HBM per projection
  // weight. Needs f16 projections (--gpu-weights f16, or an f16 / bf16 checkpoint). "none": drafts
  // read the model's weights.
  std::string draft_quantization = "none";
  // CUDA, speculative verification under a sparse policy: what a verify's rows read. "last-row"
  // (one page set for all rows: the one the last row selects), "all-rows" (one set scored from
  // every row's queries) or "per-row" (each row the set its decode step would select: greedy output
  // equal to decoding without speculation; the pages are read once per row) or "per-row-union"
  // (the same sets, their union read once with a mask of the rows each page serves; on the GPU
  // without a host tier). The CPU is per-row.
  std::string verify_selection = "last-row";
  // The KV hierarchy (issue 23): a host tier of this many GiB behind the pool steps read (the
  // device tier; on the GPU pinned DRAM, with kv_recall "ahead"); 0: none. vLLM's --swap-space
  // is the same flag.
  double cpu_kv_gb = 0.0;
  // With the host tier: device-tier pages each request may keep (0: no limit); its least
  // recently used full pages go to the host tier past it, and come back when a step reads them.
  int64_t kv_device_budget = 0;
  // With the host tier: budgets set after every step by the cache manager (kv/device_budgets.h:
  // working set, miss rate and the device tier's room across requests) instead of one fixed
  // kv_device_budget. `--kv-device-budget auto`.
  bool kv_budget_auto = false;
  // With kv_budget_auto: the share of a decode step the misses the budgets allow may take on the
  // link, at a page's measured price (RunnerTiers' link rule): the cache manager's miss target
  // follows it — lower on a loaded or slow link (bigger buffers), higher with link time to spare
  // (smaller ones, HBM left to other requests). 0: the fixed target (2.5% of the pages read).
  // `--kv-budget-io-share`.
  double kv_budget_io_share = 0.0;
  // With the host tier, when pages move: "layer" (before each layer's attention, the pages it
  // reads are recalled: the host knows every list in time) or "ahead" (the GPU's schedule: no
  // move inside a step — each layer reads late pages in place from the host tier and merges them
  // by log-sum-exp — and after the step the pages it read are recalled for the next one).
  // "land": "ahead", and each step copies its late pages into device slots set aside before it,
  // reading them from there, so on the GPU a miss crosses PCIe once (kv/tier_land.h).
  // `--kv-recall`. Tokens are the all-resident run's with any (ahead, land: up to the merge's
  // rounding).
  std::string kv_recall = "layer";
  // CUDA, kv_recall ahead / land: a decode step's recalls (and the evictions they need) are
  // planned and issued while the next decode step runs, their copies queued behind it
  // (docs/hierarchy.md "After-step overlap"); false: before the next step is launched.
  // `--kv-sync-recalls` turns it off.
  bool kv_overlap_recalls = true;
  // CUDA, kv_recall land / ahead: which decode steps land (or read in place) their late pages on
  // a second stream beside the attention over the resident pages (kv/land_overlap_rule.h): "auto"
  // (a step after one whose late pages came to at least 2 MiB a layer), "on" (every one), "off"
  // (in series: landing first, then the attention). `--kv-land-overlap`; the environment's DHS_LAND_OVERLAP overrides it.
  std::string kv_land_overlap = "auto";
  // CUDA, with the host tier: the LRU's last uses and owners mirrored in HBM, so a decode step
  // writes its reads as the LRU's own last uses and counts them per request, and the host takes
  // them back in one copy instead of scanning the step's read stamps (docs/hierarchy.md "The
  // step's reads written into a mirror of the LRU"). `--kv-lru-mirror on|off`; the environment's
  // DHS_LRU_MIRROR overrides it. The same tokens, hits and page moves either way (tested).
  std::string kv_lru_mirror = "off";
  // With the host tier: the rate of the link between the tiers in GB/s, against which the
  // hierarchy's I/O load is measured (pages moved and read in place per step / what the link
  // moves in the step's time); 0: measured at load (a bulk copy between the tiers' memories).
  // Admission offloads running requests' pages for a new one only while that load is below
  // SchedulerOptions::kv_io_admit_max. `--kv-io-gbps`.
  double kv_io_gbps = 0.0;
  std::string chat_template;        // override: a file path or the template text itself
  std::function<void(int64_t done, int64_t total)> progress;  // model loading
  // Sparse decode, both backends: which KV pages each (layer, KV head) reads at each decode step
  // (dhisparse/policy.h; PolicySpec::parse reads the grammar "coverage:0.99/2@sketch4").
  // A decode step whose batch holds fewer than policy.min_step_tokens tokens of context in all
  // reads every page, no selection: where selection costs more than it saves (H200, 8B shape:
  // from ~96k tokens a step; docs/benchmarks.md).
  PolicySpec policy;
  // Keep every estimator's page data (both summary kinds and the key sketch) when loaded sparse, as
  // eval does to compare estimators on one prefill; otherwise the CUDA backend keeps only what
  // policy.estimator reads (each costs HBM and a kernel per layer and step).
  bool keep_all_estimators = false;
  // Serving sizes. Requests per step the backend is built for (the CUDA backend captures a decode
  // graph per batch-size bucket up to it); 0: the backend's default (CPU 256, CUDA 1).
  int max_batch = 0;
  // KV pool size in blocks of page_size tokens over every layer and KV head (vLLM's
  // --num-gpu-blocks-override); 0: one request of the whole context, except on CUDA when
  // max_batch is given (serving): what gpu_memory_utilization leaves after weights and workspaces.
  int64_t kv_blocks = 0;
  double gpu_memory_utilization = 0.9;  // fraction of the GPU's memory the engine may take
  // "auto": weights from model_path; "dummy": random weights of model_path's shape (vLLM's
  // --load-format dummy), or of a named shape (dummy_shape, e.g. "llama3-8b") with model_path's
  // tokenizer, for speed measurements.
  std::string load_format = "auto";
  std::string dummy_shape;
};


// One request's KV kept between calls: for evaluation and tools that branch from one
// prefix (decode under several policies from the same prefill). Frees its pages when
// destroyed.
class Session {
 public:
  virtual ~Session() = default;
  virtual int64_t n_tokens() const = 0;
  // Appends tokens (prefill in chunks when several), writes the last token's logits ([vocab]).
  virtual void append(const std::vector<int32_t>& ids, std::vector<float>* logits) = 0;
  // Drops tokens past n_tokens.
  virtual void truncate(int64_t n_tokens) = 0;
  // Whether the one-token appends that follow are speculative drafts (eval's speculation, as the
  // scheduler marks its draft rows): a backend keeping draft weights (--draft-quantization) runs
  // them on those. Off at open.
  virtual void set_drafting(bool on) { (void)on; }
};

struct GenerateOptions {
  SamplingParams sampling;
  int64_t max_tokens = 256;
  std::vector<std::string> stop;    // stop strings (not included in the output)
  bool ignore_eos = false;
  // This request's own sparse policy (PolicySpec's grammar, e.g. "coverage:0.95", "dense",
  // "sinkwindow:64"), over the engine's: a request may choose its rule and the rule's values;
  // the estimator, combine, reselect schedule and dense thresholds stay the engine's
  // (PolicySpec::as_request_policy says why). Empty: the engine's policy.
  std::string sparse_policy;
  // Speculative decoding (issue 24; the CPU backend so far): each cycle drafts
  // up to speculative_k tokens with the same model on draft_policy (a small page set), then
  // verifies them with the request's own policy in one step of k + 1 rows, each row reading the
  // pages its own decode step would. Greedy: the longest prefix the verifier agrees with, then
  // its next token, so the output equals decoding without it; sampled: speculative sampling's
  // acceptance rule (engine/spec_accept.h), the same distribution as without it. 0: off; -1: the
  // scheduler's (SchedulerOptions::speculative_k, serve's --speculative-k); -2 (kSpeculativeAuto in
  // scheduler.h): drafts chosen per cycle from measured acceptance and step costs.
  int speculative_k = -1;
  std::string draft_policy;  // the draft's pages (sinkwindow:PAGES); empty: the scheduler's
};

struct GenerateResult {
  std::vector<int32_t> tokens;      // generated ids (the stop token not included)
  std::string text;                 // generated text, cut before any stop string
  std::string finish_reason;        // "stop" (eos / stop string) or "length"
  int64_t n_prompt = 0;
  double prompt_seconds = 0.0;      // prefill time
  double decode_seconds = 0.0;      // time for tokens after the first
  double pages_read_frac = 1.0;     // KV pages read by decode attention / all pages (sparse policies)
  int64_t spec_verifies = 0;        // speculative decoding: verification steps,
  int64_t spec_drafted = 0;         // draft tokens they checked,
  int64_t spec_accepted = 0;        // and how many of them were accepted
};

class Engine {
 public:
  // Throws dhs::Error with a clear message for bad paths, files, architectures.
  static std::unique_ptr<Engine> load(const EngineOptions& opts);
  virtual ~Engine() = default;

  virtual const ModelConfig& config() const = 0;
  // Opaque to users of this header (the text functions below are the public way); code inside
  // dhisparse that needs more includes tokenizer/tokenizer.h.
  virtual const Tokenizer& tokenizer() const = 0;
  virtual int64_t max_context() const = 0;

  // Text -> ids, special-token spellings parsed, with BOS when the model asks for it.
  virtual std::vector<int32_t> tokenize(const std::string& text) const = 0;
  // The same without BOS.
  virtual std::vector<int32_t> tokenize_no_bos(const std::string& text) const = 0;
  // Ids -> text (special tokens written out unless skip_special).
  virtual std::string detokenize(const std::vector<int32_t>& ids, bool skip_special = false) const = 0;
  // Ids the tokenizer knows: [0, n) (the embedding may have padding rows past it).
  virtual int64_t vocab_size() const = 0;
  // Renders the chat template (the model's own, or the override).
  virtual std::string render_chat(const std::vector<ChatMessage>& messages, bool add_generation_prompt) const = 0;
  // Renders the chat template and tokenizes it, reading every message string as plain text:
  // a "<|im_end|>" a user types stays text, special tokens come only from the template's own
  // markup (as vLLM and llama.cpp's server do). BOS as tokenize() adds it, unless the
  // template wrote it. What front ends use for chat.
  virtual std::vector<int32_t> tokenize_chat(const std::vector<ChatMessage>& messages,
                                             bool add_generation_prompt) const = 0;

  // Generates from prompt ids. on_text receives printable text as it is produced
  // (never half a UTF-8 character, never part of a stop string); returning false stops.
  virtual GenerateResult generate(const std::vector<int32_t>& prompt, const GenerateOptions& opts,
                                  const std::function<bool(const std::string&)>& on_text = {}) = 0;

  // Next-token logits after the prompt ([vocab]); the KV is released afterwards.
  virtual std::vector<float> prompt_logits(const std::vector<int32_t>& prompt) = 0;

  virtual std::unique_ptr<Session> open_session() = 0;
  // Policy of the following decode steps (scoring policies need an engine loaded with a sparse
  // policy: its page data; the CUDA backend keeps only the loaded estimator's unless
  // keep_all_estimators).
  virtual void set_policy(const PolicySpec& policy) = 0;
  // Page counts of sparse decode since the last call.
  virtual PageCounts take_page_counts() = 0;
  // Fits the low-rank key basis of the projected sketch (estimators "psketch4:R", "qsketch4:R",
  // sparse/key_basis.h) from the keys (and, query_aware, the queries) of `prompt` (prefilled,
  // then released) and installs it in the page summaries. Returns the mean fraction of the keys'
  // variance (query_aware: of the scores' second moment) the R directions hold.
  virtual double calibrate_key_basis(const std::vector<int32_t>& prompt, int rank, bool query_aware = false) = 0;

  // The engine's continuous-batching scheduler (dhisparse/scheduler.h). generate() runs through
  // it as a batch of one; a server start()s it and submits many. configure_scheduler replaces its
  // options while no request is in flight (throws otherwise).
  virtual Scheduler& scheduler() = 0;
  virtual void configure_scheduler(const SchedulerOptions& opts) = 0;

  // KV page accounting (free + used == total when idle).
  virtual PoolStats kv_stats() const = 0;
  virtual std::string kv_check() const = 0;  // "" when the pool (and the KV hierarchy) is consistent
  virtual TierCounts tier_counts() const = 0;
};

// Human-readable summary of a model file: architecture, shapes, dtypes, context,
// RoPE settings, tokenizer. Throws dhs::Error for bad files.
std::string describe_model(const std::string& path);

}  // namespace dhs
