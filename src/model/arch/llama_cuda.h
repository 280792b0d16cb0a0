// The Llama family on the CUDA backend: f16 weights in HBM (dequantized at
// load, or random from a seed for benchmarks), fused QKV and gate/up GEMMs on
// cuBLASLt, head-paged f16 KV, the self-planning decode kernel, chunked
// tensor-core prefill, sampling on the GPU. A decode step of B requests runs
// padded to its batch-size bucket (1, 2, 4, ... max_batch; the padding rows
// read and write no KV), through a CUDA graph captured once per (policy plan,
// bucket) and replayed: the host only uploads the step's small inputs (ids,
// positions, append slots, lengths, sampling rows, new history tokens) and reads
// back the sampled ids.
#pragma once
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdlib>
#include <functional>
#include <map>
#include <span>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "backend/cuda/decode_attention.h"
#include "backend/cuda/device_key_sketch.h"
#include "backend/cuda/device_page_pool.h"
#include "backend/cuda/device_page_summary.h"
#include "backend/cuda/device_page_table.h"
#include "backend/cuda/gather_rows.h"
#include "backend/cuda/gemm.h"
#include "backend/cuda/ops.h"
#include "backend/cuda/page_recall.h"
#include "backend/cuda/page_selector.h"
#include "backend/cuda/prefill_attention.h"
#include "backend/cuda/row_union.h"
#include "backend/cuda/sampling.h"
#include "backend/cuda/tier_split.h"
#include "kv/bucketed_lru.h"
#include "kv/land_overlap_rule.h"
#include "kv/page_pool.h"
#include "kv/page_table.h"
#include "kv/tier_copy.h"
#include "model/packed_weight.h"
#include "model/weight_source.h"
#include "sparse/policy.h"

namespace dhs {

struct CudaModelOptions {
  int max_batch = 8;           // requests per step
  int max_step_tokens = 2048;  // prefill chunk (tokens of one step over all requests)
  int64_t max_context = 8192;  // tokens per request
  // KV head-pages in HBM. 0: what gpu_memory_utilization x the GPU's memory leaves after
  // everything else is allocated (weights, workspaces, step buffers) when that is > 0, else
  // enough for max_batch x max_context.
  int64_t n_pages = 0;
  double gpu_memory_utilization = 0.0;
  int page_size = 16;
  // Page summaries kept on every append (needed by scoring policies): "none", "minmax",
  // "meanspread" (also what gaussian reads), "both". Each costs 512 B per 4 KiB page of HBM
  // (d 128) and one small kernel per layer.
  std::string summaries = "none";
  // The per-token 4-bit key sketch (device_key_sketch.h; estimator sketch4): 1/8 of the KV's
  // HBM (d 128) and one small kernel per layer.
  bool key_sketch = false;
  // Weight GEMMs of at most this many rows run on the GEMV kernel (gemm.h), the rest on cuBLASLt
  // (8: every decode step up to batch 8; ops_NOTES.md has the measurements).
  int gemv_max_tok = 8;
  // Matrices stored in a GGUF block format the kernels read (Q8_0, Q4_0, Q4_1, Q5_0, Q4_K, Q5_K,
  // Q6_K) stay in it in HBM and are multiplied by the quantized GEMV (quant_gemv.h); false: every
  // matrix dequantized to f16 at load, as before.
  bool quantized_weights = true;
  // Of those, Q8_0 and Q4_K are repacked at load (model/packed_weight.h; the same numbers) for
  // the bandwidth GEMV (packed_gemv.h, v2); false keeps them in the file's blocks on v1
  // (docs/kernels/quant_gemv_NOTES.md has both measured).
  bool packed_weights = true;
  // `--quantization fp8`: every projection matrix (not the output head, as vLLM) quantized at
  // load to FP8 E4M3 with one fp32 scale per output row (model/packed_weight.h), from its f32
  // values. Overrides quantized_weights for those matrices.
  bool fp8_weights = false;
  // Speculative drafts on FP8 (`--draft-quantization fp8`): a second copy of every projection
  // matrix, quantized at load as fp8_weights quantizes them, which a step whose every row is a
  // draft (Seq::draft) reads instead of the model's own: about half a draft step's weight bytes
  // over f16 projections. Verify and plain steps keep the model's weights, and a draft's KV is
  // written again by its verify, so output is unchanged; acceptance is what it costs. One byte
  // per projection weight of HBM. Only over f16 projections (FP8 would not read fewer bytes than
  // a block format, and over fp8_weights it is the model itself).
  bool draft_fp8 = false;
  // The random-weight constructor's projection format (the 8B-shape benchmarks): "f16", "q8_0",
  // "q4_k" or "fp8" (random codes with scales that keep activations bounded).
  std::string random_weights = "f16";
  // Speculative verification: the most rows one request may have in a decode-like step (1 + its
  // drafts; Seq::verify). Above 1 a second attention workspace is kept for those steps, and the
  // step's output rows (final norm, logits, sampler) grow to max_batch x max_verify_rows:
  // 4 x vocab bytes each. The GQA group times this is at most cuda::kDecodeMaxQVecs.
  int max_verify_rows = 1;
  // What a verify's rows read under a sparse policy (the engine's):
  //  "last-row" (default): one set for all rows, the one the last row selects (scored from its
  //    queries alone: a decode step's scoring and selection work), attended causally by the
  //    earlier rows (at most k tokens before it);
  //  "all-rows": one set scored from every row's queries (each list's masses averaged over them:
  //    k + 1 times the scoring work);
  //  "per-row": each row its own selection, exactly what its decode step would select (so greedy
  //    output equals decoding without speculation), each row a separate selection request; with
  //    per_row_union the rows' lists are merged into one list per (request, KV head) with a row mask per page
  //    (cuda/row_union.h) and attention reads their union once, each row attending its own pages
  //    (per_row_union; by default, and with the host tier, each row is a separate attention
  //    request and the pages are read k + 1 times). Request-indexed buffers (lists, attention
  //    workspaces, selector) are sized for max_batch x max_verify_rows requests.
  std::string verify_selection = "last-row";
  // Off by default: on the H100 (session 28) the merged form's verify logits differed from
  // decoding the rows one at a time by 0.74 (test_cuda_verify SparseVerifySelections at γ 0.5,
  // limit 0.24) while its kernels passed their own tests, and it was not faster at 128k x 1.
  bool per_row_union = false;
  // The KV hierarchy's host tier (issue 23): this many head-pages of pinned DRAM mapped into the
  // device (cuda::HostPagePool); 0: none. With it the device page table holds keys (device slot
  // s, host slot n_pages + h; kv/tier_split.h), the key sketch and summaries keep a row for every
  // page of both tiers, and each decode step reads its late pages in place (the recall-ahead
  // schedule: split by tier, attention over each, LSE merge) and logs them (late_reads()).
  // Prefill steps need their requests' pages resident (forward checks).
  int64_t host_pages = 0;
  // A step with prompt chunks (or verifies beside other rows) and plain decode rows: the decode
  // rows are read by decode attention under their policy (sparse, over either tier as a decode
  // step reads them: late pages in place, logged; read stamps) and the rest by prefill attention;
  // false: every row of such a step through prefill attention, dense (before session 35). A
  // verify beside a chunk reads as in a decode-like step too (its verify_selection). forward
  // orders the decode and verify rows first internally; what it returns is in the caller's order.
  bool mixed_decode_attention = true;
  // With the host tier, a decode step's landing (tier_land.h) beside the attention over the pages
  // already resident: each layer's lists are split by tier first (the late part kept as keys); on
  // a second stream the late part lands, is split again, and its landed and still-late parts are
  // attended and merged, while the first stream attends the resident part; the two outputs are
  // merged by LSE after the join. The landing reads PCIe with a block per list and the resident
  // attention reads HBM, so they overlap instead of running in series. Attention requests of one
  // row (decode rows, and verify rows under the per-row selection); a verify whose rows share a
  // selection keeps the serial form. The same records (stamps, late log, landings).
  // The rule (kv/land_overlap_rule.h) picks the form per step: off (landing first, then one
  // attention over the resident and landed pages), on, or auto (from the last decode step's
  // claims); each form's graph is captured apart.
  LandOverlapRule land_overlap;
};

// DHS_LAND_OVERLAP (off | on | auto, or 0 | 1), when set, overrides the rule's mode (the benches'
// A/B switch); an unknown value is an error.
LandOverlapRule land_overlap_env(LandOverlapRule rule);

// Pages read by sparse decode since the last reset, per (layer, KV head).
using CudaSparsityStats = cuda::SparsityStats;

class LlamaCuda {
 public:
  // Real weights: block-quantized matrices as the file holds them (CudaModelOptions::
  // quantized_weights), every other tensor dequantized on the host, rounded to f16, uploaded.
  LlamaCuda(const WeightSource& src, const CudaModelOptions& o);
  // Random f16 weights from a seed, for speed measurements (values do not
  // change kernel speed). Norm weights are 1, so activations stay bounded.
  LlamaCuda(const ModelConfig& cfg, uint64_t seed, const CudaModelOptions& o);
  ~LlamaCuda();

  const ModelConfig& config() const { return cfg_; }
  PagePool& allocator() { return *alloc_; }   // page accounting of the HBM pool
  size_t weight_bytes() const { return weight_bytes_; }
  // Bytes of the FP8 draft projections (CudaModelOptions::draft_fp8; 0 without them).
  size_t draft_weight_bytes() const { return draft_weight_bytes_; }
  // The weight bytes a decode step reads (every matrix once, as the floors count them): a plain
  // or verify step's, or (draft) a step of drafts only, which reads the FP8 copies where kept.
  size_t step_weight_bytes(bool draft) const;
  cuda::DevicePagePool& kv_pool() { return *pool_; }
  // The kept summaries (null where not kept).
  cuda::DeviceKeySketch* key_sketch() { return sketch_.get(); }
  cuda::DevicePageSummaries* summaries(cuda::SummaryKind k) {
    return k == cuda::SummaryKind::MinMax ? sum_minmax_.get() : sum_meanvar_.get();
  }
  cudaStream_t stream() const { return stream_; }

  struct Seq {
    PageTable* table = nullptr;       // capacity reserved for the new tokens (from allocator())
    int req_slot = 0;                 // row of the device page table [0, max_batch)
    const int32_t* tokens = nullptr;  // [n_new]
    int64_t n_new = 0;
    // How the next token is drawn from the last row (null: greedy). rng_offset: the Philox
    // counter of this draw in the request's stream (sampling.h). history: the request's tokens
    // so far; with a penalty the last history_window of them (0: all) are penalised. The
    // history is kept per req_slot on the device and only what it gained since the last step
    // is uploaded (reset_history when another request takes the slot).
    const cuda::SamplingRow* sampling = nullptr;
    uint64_t rng_offset = 0;
    const std::vector<int32_t>* history = nullptr;
    int history_window = 0;
    // Its own sparse policy at decode steps (PolicySpec::as_request_policy checked it against
    // set_sparsity's); null: set_sparsity's.
    const PolicySpec* policy = nullptr;
    // Speculative verification: the n_new (<= max_verify_rows) tokens are decode rows at
    // positions n_tokens().. — in a step of decode and verify rows only, attention reads the
    // decode policy's lists with every row of the request as a query (q_len n_new, causal among
    // them: the rows share one selection, chosen from all their queries' masses) — and every
    // row's logits come back, not only the last's.
    bool verify = false;
    // A speculative draft row (one token on the draft's pages): a step whose every row is one
    // runs the FP8 draft projections when the model keeps them (CudaModelOptions::draft_fp8).
    bool draft = false;
  };

  // Whether a request's rows read as a decode step's: one new token, or a speculative verify of at
  // most max_verify_rows rows. A step of only such requests is a decode step; in a mixed step
  // they are read under their policy (CudaModelOptions::mixed_decode_attention) and the runner
  // reserves landing for them.
  bool reads_as_decode(int64_t n_new, bool verify) const { return n_new == 1 || (verify && n_new <= opt_.max_verify_rows); }
  // Prefill (any n_new), or a decode-like step: every sequence one token or a verify. Commits
  // the tables. logits (host, optional): the step's output rows, [n_out, vocab]: one per
  // sequence (its last token), every row of a verify; sequence i's first at out_row(i).
  // Decode-like steps run through a captured graph when use_graph. Synchronizes once, at the
  // end (the sampled ids, from each sequence's last row, are then in sampled_ids()).
  // while_running (optional): host work run once the step is launched, before the wait (what it
  // enqueues on the model's stream — page moves — runs after the step).
  void forward(const std::vector<Seq>& batch, std::vector<float>* logits, bool use_graph = true,
               const std::function<void()>& while_running = {});
  // A check of the per-row merge (CudaModelOptions::per_row_union) in the engine: while on, merged
  // steps run uncaptured and every layer's merge is compared with the CPU statement
  // (union_row_lists) and its attention with the rows attended one at a time on the same lists;
  // keep_split: the step goes on with the one-at-a-time read's output (so it differs from the
  // per-row form only where the merged read's roundings would move a later layer's selection).
  // DHS_DEBUG_ROW_UNION=1 (=split) turns it on at construction and prints each layer's verdict.
  struct RowUnionCheck {
    bool on = false, keep_split = false, print = false;
    int64_t layers = 0, merges_equal = 0;  // layers merged; of them, merges equal to the statement
    float max_att_diff = 0.0f;             // max |merged - one at a time| over the attention outputs
  };
  void check_row_union(bool on, bool keep_split = false) { union_check_ = RowUnionCheck{on, keep_split, union_check_.print}; }
  const RowUnionCheck& row_union_check() const { return union_check_; }
  // The first output row of sequence i of the last forward (logits' row).
  int64_t out_row(size_t i) const { return out_first_.at(i); }
  // The sampler's id of every output row of the last forward ([n_out]; a verify's rows are
  // greedy: the argmax over the sampled vocabulary).
  const std::vector<int32_t>& row_ids() const { return row_ids_; }

  // The ids the GPU sampler drew from the last forward's rows ([n_seqs]; greedy rows: argmax).
  const std::vector<int32_t>& sampled_ids() const { return sampled_; }
  std::vector<int32_t> greedy_ids() const { return sampled_; }
  // Ids [0, n) may be sampled (the rest of the logits are embedding padding). Drops the
  // captured graphs (they bake the sampler's vocabulary): call before the first step.
  void set_sampled_vocab(int64_t n);
  // Another request takes `req_slot`: its device history starts empty.
  void reset_history(int req_slot);
  // The rows a decode step of n requests runs (its graph's bucket): the next power of two,
  // at most max_batch.
  int batch_bucket(int n) const { return bucket(n, opt_.max_batch); }
  const CudaModelOptions& options() const { return opt_; }

  // Sparse decode (DESIGN.md §1.1): the policy of every following decode step; prefill
  // stays dense. Scoring policies need the summaries chosen at construction (the
  // policy's estimator must match them). budget_frac (topk only, optional): per
  // (layer, KV head) fraction of each list's pages, [n_layers * n_heads_kv] (budgets
  // replayed from traces of a real model). Captured graphs are kept per policy.
  void set_sparsity(const PolicySpec& spec, const std::vector<float>& budget_frac = {}) {
    selector_->set_policy(spec, budget_frac);
  }
  CudaSparsityStats sparsity_stats() const { return selector_->stats(); }
  // Steps whose requests all read fixed windows take their lists from the page table (default)
  // or from the select kernel's SinkWindow rule (tests: the same lists).
  void set_window_lists(bool on) { selector_->set_window_lists(on); }
  // Verification-seeded drafts: scoring steps record seeds from now on (PageSelector::keep_seeds).
  void keep_draft_seeds(int m) { selector_->keep_seeds(m); }
  // A table rolled back to n_tokens (or released: 0): its stale seeds are forgotten.
  void forget_draft_seeds(uint64_t table_id, int64_t n_tokens) { selector_->forget_seeds(table_id, n_tokens); }
  void record_draft_seeds(bool on) { selector_->set_seed_recording(on); }
  // Decode steps since reset_sparsity_stats() that a sparse policy ran as the dense step because
  // every request was shorter than --dense-below or the batch held fewer than --sparse-min-tokens
  // (no scoring or selection kernels ran).
  int64_t threshold_dense_steps() const { return selector_->threshold_dense_steps(); }
  void reset_sparsity_stats() { selector_->reset_stats(); }

  // The weight GEMMs, for the benchmarks' choice of GEMV kernel (Gemm::set_gemv_kernel): set it
  // before the first forward, since a captured graph keeps the kernels it was captured with.
  cuda::Gemm& gemm() { return *gemm_; }
  // The prefill attention kernel, for the benchmarks' A/B (the default otherwise: warpgroup MMAs
  // where the device allows). Prefill steps are never captured: it applies from the next forward.
  void set_prefill_kernel(const cuda::PrefillKernel& k) { prefill_kernel_ = k; }

  // The KV hierarchy (CudaModelOptions::host_pages): the host tier's storage, the mover of page
  // bytes between it and the HBM pool (TieredKv::set_mover; the pages' sketch and summary rows
  // move with them), the device page table's rewrite of a moved page's entry (its relocation
  // hook; applied before the next step), and the last decode step's late reads, by sequence.
  cuda::HostPagePool* host_pool() { return host_pool_.get(); }
  int64_t move_pages(const PagePool& src, PagePool& dst, std::span<const PageMove> moves);
  void patch_table(const PageTable& t, int layer, int head, int64_t idx) { table_->patch(t, layer, head, idx); }
  struct LateRead {
    int seq, layer, head;
    int32_t page;
  };
  const std::vector<LateRead>& late_reads() const { return late_reads_; }
  // Landing (backend/cuda/tier_land.h, TieredKv::reserve_landing): the next decode step copies
  // its late pages into these HBM slots as far as they go (at most kLandMax), before each layer's
  // split, and reads them from there; a step without this call lands nothing. landings(): the last
  // step's, by sequence; landing_claims(): the late entries that asked for a slot (past the
  // stack's length too). The landing adopts each page on the device (tier_land.h: the device
  // page table's entry and the page's key sketch and summary rows follow it to its slot, so the
  // next step reads it there before the host's TieredKv adopts it); `adopted` says which landing
  // of a page landed twice took it.
  static constexpr int kLandMax = 1 << 18;
  void set_landing_slots(std::span<const int32_t> slots);
  struct Landing {
    int seq, layer, head;
    int32_t page, dev_slot, host_slot;
    bool adopted;
  };
  const std::vector<Landing>& landings() const { return landings_; }
  int64_t landing_claims() const { return land_claims_; }
  // Steps with decode rows over the host tier since construction, those of them run with the
  // landing beside the resident attention (CudaModelOptions::land_overlap), and whether the last
  // step was.
  int64_t tier_steps() const { return n_tier_steps_; }
  int64_t overlapped_steps() const { return n_overlapped_; }
  bool last_step_overlapped() const { return last_step_.overlap; }
  // The last decode step's reads of HBM (or a mixed step's decode rows': mixed_decode_attention):
  // read_stamps()[s] == read_stamp() when it read slot s ([n_pages] of the HBM pool, copied back
  // with the step; read_stamp() is -1 after any other step), and the same as a list of slots, in slot order (a pass over the stamps: for tests and
  // the benches).
  std::span<const int32_t> read_stamps() const {
    const int32_t* h = mirror_last_ ? mirror_last_ : last_use_h_;
    return {h, h ? static_cast<size_t>(pool_->n_pages()) : size_t{0}};
  }
  int32_t read_stamp() const { return stamps_valid_ ? stamp_ : -1; }
  std::vector<int32_t> read_slots() const;

  // The hierarchy's LRU mirrored in HBM (kv/bucketed_lru.h mirror_on; backend/cuda/lru_mirror.h;
  // docs/hierarchy.md "The step's reads written into a mirror of the LRU"): lru_mirror_storage()
  // turns it on and returns the pinned storage for the host LRU's last uses ([n_pages]). Before
  // each step with decode rows the host stages its patch: applied in the stream before
  // the step, its tick the step's stamp (the tier split writes it as the last use of each HBM slot
  // read; stage_lru_patch). After it, read_stamps() is the mirror's last uses (read_stamp() the tick) and
  // lru_mirror_counts() the reads per owner ([n_owners + 1]); the host takes the copy
  // (TieredKv::after_step_reads) and names the buffer it holds now (set_lru_mirror_dst).
  std::span<int32_t> lru_mirror_storage();
  bool lru_mirrored() const { return owner_d_ != nullptr; }
  // The patch staged in place: [3, n] pinned ints (slots, then last uses, then owners) for the
  // caller to fill before the next forward.
  int32_t* stage_lru_patch(int64_t n, int32_t tick, int32_t n_owners);
  std::span<int32_t> lru_mirror_copy() const {
    return {mirror_last_, mirror_last_ && stamps_valid_ ? static_cast<size_t>(pool_->n_pages()) : size_t{0}};
  }
  std::span<const int64_t> lru_mirror_counts() const {
    return {mirror_counts_h_, mirror_counts_h_ && stamps_valid_ ? static_cast<size_t>(mirror_owners_) + 1 : size_t{0}};
  }
  // The next copy lands in whichever of the two buffers is not `lru_storage` (the host LRU's now).
  void set_lru_mirror_dst(const int32_t* lru_storage) noexcept;
  // The last step logged more late reads than the log holds (those past it were not logged; the
  // log holds every page a step's lists can name, up to kLateLogMax).
  bool late_log_overflowed() const { return late_overflow_; }
  static constexpr int64_t kLateLogMax = int64_t{1} << 22;
  // Where the last forward's wall time went, on the host's clock: before the launch (the lists'
  // checks, the page table's patches, the step's inputs, the selection plan, a graph's capture),
  // the launch to the step's one wait's end (the GPU's work, and the copies back), and after it
  // (the late log sorted into late reads, the sampled ids); while_ms: of the launch-to-wait
  // part, the caller's work while the step ran (forward's while_running).
  struct Phases {
    // host clock: before the launch, launch to the step's wait (while_ms inside it), after; and
    // graph_ms, the step's kernels on the GPU (CUDA events around them): while_ms beyond it is host
    // work the step waited for.
    double before_ms = 0, gpu_ms = 0, after_ms = 0, while_ms = 0, graph_ms = 0;
  };
  const Phases& last_phases() const { return phases_; }

  // Times: the decode-like step (graph replay) for the current batch (one token each, or
  // verify rows), in ms (median of n).
  double time_decode_step(const std::vector<Seq>& batch, int n_iters);

 private:
  struct Layer {
    cuda::DeviceWeight w_qkv, w_o, w_gu, w_down;  // [q; k; v] and [gate; up] fused by rows
    float *attn_norm = nullptr, *ffn_norm = nullptr;
    float *bq = nullptr, *bk = nullptr, *bv = nullptr, *q_norm = nullptr, *k_norm = nullptr;
  };
  // What one step runs: its size, and what the selector planned for it.
  struct Step {
    int n_tok = 0;
    int n_req = 0;
    bool decode = false;  // one new token per request, or verify rows
    // Requests read by decode attention under the policy, first in the batch: every one of a
    // decode step (padding included), a mixed step's decode and verify requests
    // (mixed_decode_attention), else 0; in a mixed step, their rows and longest request.
    int n_dec = 0;
    int dec_rows = 0;
    int dec_max_q = 1;
    int max_q = 1;        // rows of the longest request (a decode step with verify rows: > 1)
    int n_out = 0;        // output rows: one per request, each row of a verify
    // Per-row verify selections read as their union (CudaModelOptions::per_row_union): the
    // attention requests after the merge (each sequence, each padding row), 0 when not merged,
    // and their most rows.
    int n_union = 0;
    int union_max_q = 1;
    // The landing beside the resident attention in this step (CudaModelOptions::land_overlap).
    bool overlap = false;
    // Every row a draft and the model keeps FP8 draft projections: the step runs them.
    bool draft = false;
    cuda::SelectPlan plan;
  };
  void allocate(const CudaModelOptions& o);
  // The KV pool and its page data, sized last (CudaModelOptions::n_pages), and the selector.
  void allocate_kv();
  // The named [rows_i, in] tensors, stacked by rows into one weight (device_weight.h).
  // `projection` false: the output head, which --quantization fp8 leaves in f16.
  // `fp8`: FP8 whatever the options say (the draft copy, CudaModelOptions::draft_fp8).
  cuda::DeviceWeight upload_weight(const WeightSource& src, const std::vector<std::pair<std::string, int64_t>>& parts,
                                   int64_t in, bool projection = true, bool fp8 = false);
  // Gemm's dequantization scratch for the largest matrix that is not plain f16.
  void reserve_dequant_scratch();
  // A packed matrix's planes in one HBM allocation (codes, meta, row scales), unfilled; and
  // filled from the host.
  cuda::WeightPart alloc_packed(PackedFormat f, int64_t rows, int64_t in);
  cuda::WeightPart upload_packed(const PackedMatrix& m);
  // The kernels' parameters that do not change between steps (every buffer has a fixed address,
  // so that a captured graph keeps reading the same ones): built once, when the weights are in.
  void build_params();
  // n_rows >= batch.size(): the rows past the batch are padding (no KV read or written).
  // split: verify rows run as separate attention requests (verify_selection "per-row").
  // Returns the requests after a per-row merge (0: none; see Step::n_union).
  int upload_step(const std::vector<Seq>& batch, int n_rows, bool split);
  // The step's kernels, in order (what the decode graph captures).
  void run_layers(const Step& step);
  // The captured decode step (captured on first use per selection plan and batch size).
  cudaGraphExec_t decode_graph(const Step& step);
  void* dalloc(size_t bytes);
  // The next power of two >= n, at most cap.
  static int bucket(int n, int cap);

  // The launches of run_layers: the prebuilt parameters, with this step's sizes and this
  // layer's weights and slices.
  void embed(int n_tok);
  void rms_norm(const float* weight, int n_tok);
  void rope_append(int layer, int n_tok);  // and the page summaries / key sketch of the written pages
  void dense_lists(int layer, int n_req);
  // The decode attention's parameters for n_req requests of up to max_q rows (the smallest verify
  // workspace, kernel form, that takes them when max_q > 1).
  cuda::DecodeAttentionParams decode_params(int max_q, int n_req) const;
  void attention_decode(const cuda::LayerLists& lists, int n_req, int max_q, int layer, int n_tok);
  // Per-row verify selections (step.n_union > 0): the rows' lists merged (row_union) and attended
  // once, each row over its own pages.
  void attention_decode_united(const cuda::LayerLists& rows, const Step& step);
  void check_row_union_layer(const cuda::LayerLists& rows, const Step& step);
  // A merged step's per-row selection of `layer`: every row its own lists, from one scoring of
  // each merged request (its rows' q vectors together; PageSelector::ScoreFrom).
  cuda::LayerLists select_united(int layer, const Step& s);
  // The first n requests (rows [0, rows), at most max_q each) under the step's policy: the lists
  // select returns (a verify's shared set from its last row's queries under "last-row"), decode
  // attention over them.
  void attention_policy(int layer, int n, int max_q, int rows, const cuda::SelectPlan& plan);
  // Requests [first, n_req) and their rows [first_row, n_tok) (the requests before them are a
  // mixed step's decode and verify requests).
  void attention_prefill(int first, int first_row, int n_tok, int n_req);
  void swiglu(int n_tok);
  void logits_and_sample(int n_out);

  ModelConfig cfg_;
  CudaModelOptions opt_;
  cudaStream_t stream_ = nullptr;
  cudaEvent_t ev_launch_ = nullptr, ev_kernels_done_ = nullptr;  // Phases::graph_ms
  std::vector<void*> allocs_;
  size_t weight_bytes_ = 0;

  __half* tok_embd_ = nullptr;  // [vocab, hidden]
  cuda::DeviceWeight output_;   // [vocab, hidden] (token_embd's rows when tied)
  float* output_norm_ = nullptr;       // [hidden]
  float* inv_freq_ = nullptr;          // [head_dim / 2]
  std::vector<Layer> layers_;
  std::vector<Layer> draft_layers_;  // CudaModelOptions::draft_fp8: the FP8 copies (norms shared), else empty
  size_t draft_weight_bytes_ = 0;    // their bytes (within weight_bytes_)

  std::unique_ptr<PagePool> alloc_;
  std::unique_ptr<cuda::DevicePagePool> pool_;
  std::unique_ptr<cuda::DevicePageTable> table_;
  std::unique_ptr<cuda::Gemm> gemm_;
  std::unique_ptr<cuda::DecodeAttentionWorkspace> dws_;
  // Verify steps' attention workspaces: [0] up to 16 query vectors per KV head (the kernel's
  // one-tile form, which keeps more warps resident), [1] up to max_verify_rows rows (null where
  // [0] covers them; both null at max_verify_rows 1).
  std::unique_ptr<cuda::DecodeAttentionWorkspace> dws_verify_[2];
  // Per-row verify selections merged (per_row_union): the merge's scratch, each merged request's
  // rows (row_indptr: also its q_indptr, one token row per selection request) and tokens, the
  // merged lists with their row masks; union_h_: the pinned staging of rows and tokens.
  std::unique_ptr<cuda::RowUnionScratch> union_scratch_;
  int32_t *union_rows_d_ = nullptr, *union_seq_d_ = nullptr, *union_h_ = nullptr;
  int32_t *union_indptr_d_ = nullptr, *union_slots_d_ = nullptr, *union_pos_d_ = nullptr;
  uint32_t* union_mask_d_ = nullptr;
  // The rows scored once as their sequence (PageSelector::ScoreFrom): each merged request's page
  // table row and this layer's dense lists, and per selection request (row) its merged request and
  // first q vector.
  int32_t *union_req_slot_d_ = nullptr, *union_score_req_d_ = nullptr, *union_vec0_d_ = nullptr;
  int32_t *union_dense_indptr_d_ = nullptr, *union_dense_slots_d_ = nullptr, *union_dense_pos_d_ = nullptr;
  std::unique_ptr<cuda::DevicePageSummaries> sum_minmax_, sum_meanvar_;
  std::unique_ptr<cuda::DeviceKeySketch> sketch_;
  std::unique_ptr<cuda::PageSelector> selector_;  // what sparse decode steps read (owns the policy)
  // The host tier (CudaModelOptions::host_pages), or null; with it: the split of each decode
  // layer's lists, the late part's attention output and both parts' LSE ([T, Hq]), the late log
  // and its pinned mirror, and the pinned staging of page moves.
  std::unique_ptr<cuda::HostPagePool> host_pool_;
  std::unique_ptr<cuda::TierSplitLists> split_;
  // overlap_landing: the second stream with its fork and join events, the split of the landed
  // late part, its attention output and LSE ([T, Hq]) and the attention workspace it runs with.
  cudaStream_t side_stream_ = nullptr;
  bool overlap_next_ = false;  // the rule's choice for the next decode step (from the last one's claims)
  bool overlap_now_ = false;   // run_layers' step's form (attention_decode reads it)
  int64_t n_overlapped_ = 0, n_tier_steps_ = 0;
  cudaEvent_t ev_fork_ = nullptr, ev_join_ = nullptr;
  std::unique_ptr<cuda::TierSplitLists> split_landed_;
  __half* land_att_d_ = nullptr;
  float* land_lse_d_ = nullptr;
  std::unique_ptr<cuda::DecodeAttentionWorkspace> dws_side_;
  __half* late_att_d_ = nullptr;
  float *lse_d_ = nullptr, *late_lse_d_ = nullptr;
  int32_t* late_log_d_ = nullptr;  // [late_cap_, 3] then the count
  int32_t* late_count_h_ = nullptr;  // pinned: the count, copied back in the step
  int late_cap_ = 0;
  Phases phases_;
  std::vector<int32_t> late_log_h_;  // the entries, copied back after the step
  std::vector<LateRead> late_reads_;
  std::vector<uint64_t> late_keys_;  // the late log as sortable keys (forward's scratch)
  // Landing: land_d_ = [kLandMax] slots, then claims, bad, available, then the log [kLandMax, 6];
  // land_keys_d_ the layer's keys after landing (what the split reads); land_h_ pinned: the slots'
  // staging, then claims, bad, available.
  int32_t* land_d_ = nullptr;
  int32_t* land_keys_d_ = nullptr;
  int32_t* land_h_ = nullptr;
  int32_t land_avail_next_ = 0;
  int64_t land_claims_ = 0;
  std::vector<int32_t> land_log_h_;
  std::vector<Landing> landings_;
  // A region of the page moves' pinned and device staging (move_h_, move_d_) for n moves: its
  // offset in ints (the buffers grown, after a wait for the stream, when full).
  int64_t move_staging(int64_t n);
  // The estimator rows (sketch, summaries) of n pages moved by key pairs ([n, 2] on the device).
  void move_key_rows(const int32_t* key_pairs_d, int n);
  std::vector<int> attn_seq_;  // [attention requests of the last step] its sequence in the batch
  std::vector<Seq> ordered_;   // a mixed step's batch, decode rows first (mixed_decode_attention)
  // The resident reads' record: last_use_d_[slot] = the step's stamp (stamp_d_, written before
  // each decode step from stamp_h_); each slot read listed once in read_d_ ([n_pages] then the
  // count), the count copied back in the step (read_count_h_), the slots after it.
  int32_t* last_use_d_ = nullptr;
  int32_t* read_d_ = nullptr;
  int32_t* read_count_h_ = nullptr;  // pinned [1]
  int32_t* stamp_d_ = nullptr;
  int32_t* stamp_h_ = nullptr;     // pinned [1]
  int32_t stamp_ = 0;
  int32_t* last_use_h_ = nullptr;  // pinned [n_pages]: last_use_d_ after each decode step
  bool stamps_valid_ = false;      // the last step was a decode step with the host tier
  // The LRU mirror (lru_mirror_storage): last_use_d_ holds the host LRU's last uses (offsets),
  // owner_d_ its owners; the host's storage alternates between last_use_h_ and mirror_h_, the copy
  // after a step lands in mirror_dst_ (mirror_last_: where the last one landed). The patch: its
  // [3, n] entries staged in patch_h_ (pinned, grown), applied kPatchChunk at a time through patch_d_
  // ([3, chunk] each).
  static constexpr int64_t kPatchChunk = int64_t{1} << 18;
  int32_t* owner_d_ = nullptr;
  int32_t* mirror_h_ = nullptr;
  int32_t* mirror_dst_ = nullptr;
  int32_t* mirror_last_ = nullptr;
  int64_t* mirror_counts_d_ = nullptr;
  int64_t* mirror_counts_h_ = nullptr;  // pinned
  int32_t mirror_counts_cap_ = 0, mirror_owners_ = 0;
  int32_t* patch_h_ = nullptr;  // pinned [patch_cap_ entries x 3]
  int32_t* patch_d_ = nullptr;  // [kPatchChunk x 3]
  int64_t patch_cap_ = 0, patch_n_ = -1;  // (-1: no patch for the next step)
  int32_t patch_tick_ = 0;
  bool late_overflow_ = false;
  int32_t* move_h_ = nullptr;      // pinned [move_cap_]: regions of [n, 2] slot pairs, [n, 2] key pairs, the count
  int32_t* move_d_ = nullptr;
  int64_t move_cap_ = 0, move_used_ = 0;  // ints; used: regions handed out since the stream last drained

  // Step inputs (device; fixed addresses so a captured graph keeps reading them).
  int32_t *ids_d_ = nullptr, *pos_d_ = nullptr, *dst_slot_d_ = nullptr;  // [T], [T], [L, T * Hkv]
  int32_t *q_indptr_d_ = nullptr, *seq_len_d_ = nullptr, *req_slot_d_ = nullptr;
  int32_t* last_row_d_ = nullptr;  // [max_out] the step's output rows (each request's last; every verify row)
  // A verify step's selection from its last rows (verify_selection "last-row"): [B] each
  // request's last row, those rows' queries gathered [B, Hq D], and q_indptr 0, 1, .., B.
  int32_t *sel_row_d_ = nullptr, *sel_q_indptr_d_ = nullptr;
  __half* sel_q_d_ = nullptr;
  int32_t *indptr_d_ = nullptr, *slots_d_ = nullptr, *page_pos_d_ = nullptr;  // one layer's lists
  int32_t* staging_h_ = nullptr;  // pinned host copy of the step inputs
  size_t staging_ints_ = 0;
  // Activations.
  float* x_d_ = nullptr;               // [T, hidden] fp32 residual stream
  __half* h_d_ = nullptr;       // [T, hidden]
  __half* qkv_d_ = nullptr;     // [T, (Hq + 2 Hkv) D]
  __half* q_d_ = nullptr;       // [T, Hq D] rotated queries
  __half* att_d_ = nullptr;     // [T, Hq D]
  RowUnionCheck union_check_;
  __half* gu_d_ = nullptr;      // [T, 2 F]
  __half* act_d_ = nullptr;     // [T, F]
  // The step's output rows: max_out = max_batch x max_verify_rows.
  int64_t max_out_ = 0;
  // Attention requests a step may have: max_batch, or max_batch x max_verify_rows with per-row
  // verify selections (each verify row its own request).
  int64_t max_attn_ = 0;
  int64_t max_tokens_ = 0;  // tokens a step may run (its buffers' rows)
  __half* hlast_d_ = nullptr;   // [max_out, hidden] normed output rows
  float* last_x_d_ = nullptr;          // [max_out, hidden]
  float* logits_d_ = nullptr;          // [max_out, vocab]
  // Per-row sampling inputs, one block uploaded with one copy: [max_out] SamplingRow, Philox
  // counters, history offsets (into hist_d_), history lengths.
  uint8_t* samp_block_d_ = nullptr;
  uint8_t* samp_block_h_ = nullptr;    // pinned mirror
  size_t samp_block_bytes_ = 0;
  cuda::SamplingRow* samp_rows_d_ = nullptr;
  uint64_t* rng_d_ = nullptr;
  int64_t* hist_off_d_ = nullptr;
  int32_t* hist_len_d_ = nullptr;
  int32_t* hist_d_ = nullptr;          // [B, hist_ld_] each request slot's tokens so far
  int64_t hist_ld_ = 0;
  int32_t* hist_stage_h_ = nullptr;    // pinned: the step's new history tokens
  int64_t hist_stage_cap_ = 0, hist_stage_used_ = 0;
  std::vector<int64_t> hist_synced_;   // [B] history tokens on the device per slot
  std::vector<int32_t> hist_last_;     // [B] the last of them (a changed history is re-sent)
  int32_t* out_ids_d_ = nullptr;       // [max_out]
  int32_t* out_ids_h_ = nullptr;       // pinned [max_out]
  std::vector<int32_t> sampled_;
  std::vector<int64_t> out_first_;     // [n_seqs] of the last forward: each sequence's first output row
  std::vector<int32_t> row_ids_;       // [n_out] of the last forward
  int64_t pages_per_seq_ = 0;
  Step last_step_;  // the last forward's (time_decode_step replays its plan)

  // Built once (build_params): everything but this step's sizes and this layer's weights and slices.
  cuda::EmbeddingParams embed_;
  cuda::AddRmsNormParams norm_;        // attention and FFN norms (weight per launch)
  cuda::RopeAppendParams rope_;
  std::vector<cuda::SummarizePagesParams> summarize_;  // one per kept summary store
  std::vector<cuda::SketchKeysParams> sketch_keys_;    // one when the key sketch is kept
  cuda::DenseListsParams dense_lists_;
  cuda::DecodeAttentionParams decode_attn_;            // (lists per launch)
  cuda::PrefillAttentionParams prefill_attn_;
  cuda::PrefillKernel prefill_kernel_;
  cuda::SwiGluParams swiglu_;
  cuda::GatherRowsParams last_rows_;
  cuda::AddRmsNormParams final_norm_;
  cuda::SampleParams sample_;

  // Decode step per (selection plan, batch bucket): switching policies back and forth (eval) reuses them.
  std::map<std::pair<std::string, int>, cudaGraphExec_t> graphs_;
  size_t n_verify_graphs_ = 0;  // of them, steps with verify rows
};

}  // namespace dhs
