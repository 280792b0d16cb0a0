// Sparse page selection on the device (DESIGN.md §1.1-1.2): from one layer's dense
// page lists, this step's rotated queries and the page summaries, the CSR lists of
// the pages each (request, KV head) reads — the device twin of sparse/policy.h, with
// the same definitions (coverage_set / top_k_set are its oracle in the tests).
//
// Three kernels, no host sync, no allocation, fixed grids (capturable in a graph):
//   1. score   — every dense page, all q heads of its GQA group and all query rows:
//                estimated q.k (MinMax: sum_d max(q_d min_d, q_d max_d); MeanSpread:
//                q.mean + kappa sqrt(sum_d q_d^2 var_d); Gaussian: q.mean + scale/2 sum_d
//                q_d^2 var_d, the log of a Gaussian page's expected exp-score; Sketch4: the
//                log-mean-exp of the page's tokens' scores on their 4-bit keys), scaled, log2
//                units. All are dot products on tensor cores (page_score.cu). The
//                flattened page space is split evenly over a fixed grid of warps, each
//                finding its first list from the prefix sums (as the attention kernel).
//   2. select  — a cluster of 1-4 blocks per list (up to 16 when forced; per request under
//                SoloHead; reductions through distributed shared memory): per q vector the
//                (max, sum) of n_i * 2^(s_i - max) -> normalised masses, combined over the
//                group's q vectors (mean or max), renormalised; then the rule's cut:
//                coverage-gamma (heaviest pages until the mass reaches gamma) or top-k, both
//                by three histogram levels over the float bits of the masses (non-negative
//                floats order as their bits; weights in fixed point), ties by page index.
//                Forced pages (first n_sink, last n_recent) are always in.
//   3. compact — prefix sums of the chosen counts -> CSR indptr; gathers the chosen pages' slots
//                and positions into the lists.
// Every float reduction has a fixed order and the histograms add integers, so the same inputs
// give the same lists.
#pragma once
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "backend/cuda/device_page_summary.h"

namespace dhs::cuda {

enum class SelectRule { Coverage, TopK, SinkWindow };

// One request's own rule (PageSelectParams::row_rules): the values a request may choose
// (PolicySpec::as_request_policy); the estimator, combine and dense_below stay the launch's.
struct RowRule {
  int32_t all_pages = 0;  // 1: every page (a dense request in a selecting step)
  SelectRule rule = SelectRule::Coverage;
  float gamma = 0.99f;
  int32_t budget = 0;
  float frac = 0.0f;
  int32_t n_sink = 1;
  int32_t n_recent = 1;
  // SinkWindow: also this many of the request's draft seeds (draft_seeds.h; 0: none, or none
  // recorded), from window_lists.h or from the select kernel (PageSelectParams::seeds) in a step
  // where other requests score.
  int32_t n_seeds = 0;
};

struct PageSelectParams {
  // This layer's dense lists: every page of each (request, KV head), ascending page_pos (so page i
  // of a list is its request's page i: the select kernel takes the positions as such).
  const int32_t* dense_indptr = nullptr;    // [n_requests * n_heads_kv + 1]
  const int32_t* dense_slots = nullptr;     // [nnz_dense]
  const int32_t* dense_page_pos = nullptr;  // [nnz_dense]
  const int32_t* seq_len = nullptr;         // [n_requests] tokens in KV, this step's included
  const __half* q = nullptr;         // [n_rows, n_heads_q, head_dim] (RoPE applied)
  const int32_t* q_indptr = nullptr;        // [n_requests + 1]
  const __half* summaries = nullptr; // [n_pages, 2, head_dim] (device_page_summary.h)
  SummaryKind kind = SummaryKind::MinMax;
  // Sketch4 (both set): the per-token 4-bit key sketch (device_key_sketch.h) replaces the
  // summaries: a page's score is log2 of the mean over its visible rows of 2^(q.k^ scale log2 e),
  // with q quantized to int8 per vector (absmax / 127) for the int8 tensor-core MMA.
  const uint8_t* sketch_codes = nullptr;    // [n_pages, page_size, head_dim / 2]
  const float* sketch_steps = nullptr;      // [n_pages, page_size]
  float kappa = 1.0f;     // MeanSpread: q.mean + kappa sqrt(sum q^2 var)
  bool gaussian = false;  // MeanSpread summaries, Gaussian estimate: q.mean + scale / 2 sum q^2 var

  SelectRule rule = SelectRule::Coverage;
  float gamma = 0.99f;                   // Coverage
  int budget = 0;                        // TopK: pages per list (when budget_frac is null and frac is 0)
  float frac = 0.0f;                     // TopK, > 0: ceil(frac * n_pages) per list (sparse TopFrac)
  const float* budget_frac = nullptr;    // TopK: [n_heads_kv] ceil(frac * n_pages) per KV head, or null
  int n_sink = 1;                        // forced first pages (SinkWindow: the sinks)
  int n_recent = 1;                      // forced last pages (SinkWindow: the window)
  bool combine_max = false;              // q vectors of a group: false = mean, true = max
  bool share_heads = false;              // SoloHead: one set per request from all heads' masses
  int dense_below = 0;                   // requests with seq_len < this read every page
  // [n_requests] each request's own rule, replacing rule, gamma, budget, frac, n_sink and
  // n_recent above (and budget_frac) for its lists; null: the launch's for all. The score
  // kernel runs for every request as the launch's rule says.
  const RowRule* row_rules = nullptr;
  // Draft seeds (draft_seeds.h) for rows whose rule is SinkWindow with n_seeds > 0: such a row
  // also reads the first n_seeds of its store row that lie inside its list and outside its window
  // (window_lists.h's rule, so a seeded draft reads the same pages whether or not other requests
  // of its step score). Null: windows alone. (Not with share_heads: SoloHead records none.)
  const int32_t* seeds = nullptr;     // [max_slots, n_layers, n_heads_kv, seed_cap]
  const int32_t* req_slot = nullptr;  // [n_requests] each request's row of the store
  int seed_cap = 0;
  int n_layers = 0;
  int layer = 0;
  // Scores from another launch's score stage (all three set, or none): request r's q vector j is q
  // vector score_vec0[r] + j of list (score_req[r], h) of that launch, whose dense lists are
  // score_indptr and whose page i is page i of this launch's list (r's own sequence, as long or
  // longer). A verify whose rows are each selected on their own (llama_cuda's per-row union) scores
  // its sequence once, all rows' q vectors in one read of the sketch, instead of once per row; the
  // score kernel's query row j sees the tokens up to its own position either way.
  const int32_t* score_req = nullptr;     // [n_requests]
  const int32_t* score_vec0 = nullptr;    // [n_requests]
  const int32_t* score_indptr = nullptr;  // [n_scored * n_heads_kv + 1]
  // q vectors of the launch's longest request, at least (0: q_stride): the score kernel's form
  // (two pages an MMA up to 4, else one; a graph keeps the form it was captured with).
  int q_vecs = 0;

  // Workspace (PageSelectWorkspace).
  float* scores = nullptr;        // [q_stride, score_stride]: q vector j of dense page i at j * score_stride + i
  float* mass = nullptr;          // [nnz_dense] for lists longer than smem_pages
  int32_t* counts = nullptr;      // [n_lists]
  int32_t* stage_idx = nullptr;   // [nnz_dense] chosen pages' indices in their list, at its dense offset

  // Output: the lists attention reads.
  int32_t* indptr = nullptr;    // [n_requests * n_heads_kv + 1]
  int32_t* slots = nullptr;     // [nnz <= nnz_dense]
  int32_t* page_pos = nullptr;  // [nnz]
  unsigned long long* stats = nullptr;  // [n_heads_kv, 2] += (pages chosen, pages in list), or null
  float* mass_out = nullptr;    // [nnz_dense] the normalised masses of scored lists (tests), or null
  int32_t* sel_seq_len = nullptr;  // [n_requests] seq_len copied here by compact (what a later reuse of
                                   // these lists needs: reuse_lists.h), or null

  int n_requests = 0;
  int n_heads_q = 0;
  int n_heads_kv = 0;
  int head_dim = 0;      // 64, 128 or 256; the projected sketch: its rank (32, 64, ...), q projected
  int page_size = 16;
  int q_stride = 0;      // >= (n_heads_q / n_heads_kv) * max q_len
  int64_t score_stride = 0;  // >= nnz_dense (the workspace's max_nnz)
  float scale = 0.0f;    // softmax scale, usually 1/sqrt(head_dim)
  int n_score_warps = 0; // grid of the score kernel, in warps (multiple of 8)
  int smem_pages = 0;    // lists up to this length keep their masses in shared memory
  int select_cluster = 0; // blocks per list of the select kernel (power of two <= 16); 0: chosen
                          // from the number of lists (about one block per SM)
};

// Launches score (unless SinkWindow), select and compact on `stream`. No checks.
void launch_page_select(const PageSelectParams& p, cudaStream_t stream);
// One of the three kernels alone (0 score, 1 select, 2 compact): the benchmark's breakdown, the
// tests of the score stage.
void launch_page_select_stage(const PageSelectParams& p, int stage, cudaStream_t stream);

// ---- The benchmark's probe (bench/attention_bench.cu), apart from the production parameters ----
// Timestamps inside the three kernels, early exits of the select kernel, and select launched
// after the score kernel ends. Only the overloads below take one; every other launch passes the
// default (null pointers, the kernels test them as they always did).
struct PageSelectProbe {
  long long* block_ns = nullptr;          // [grid blocks][2] %globaltimer at each select block's entry, exit
  unsigned long long* span_ns = nullptr;  // [5][2] %globaltimer, set to [~0, 0] before: first entry (min) and
                                          // last exit (max) of the score, select and compact kernels; the
                                          // select blocks' first and last release from their wait; [9] their
                                          // last entry
  long long* phase_cycles = nullptr;      // [14] clock64() of block 0 at the select kernel's phase ends, then
                                          // %globaltimer (ns) at its entry and exit
  int stop_after = 0;  // 0 runs the select kernel whole; k in 1..5 ends it after phase k (1 masses, 2
                       // their sums, 3-5 the cut's histogram levels), the lists unwritten, so that
                       // timing each prefix gives each phase's cost
  bool select_pdl = true;  // select launched as a programmatic dependent of the score kernel (its
                           // blocks resident before the score kernel ends); false: after it ends
};
void launch_page_select(const PageSelectParams& p, const PageSelectProbe& probe, cudaStream_t stream);
void launch_page_select_stage(const PageSelectParams& p, const PageSelectProbe& probe, int stage, cudaStream_t stream);

namespace detail {
// What the pipeline's kernels (score, select, compact) take as their one __grid_constant__
// parameter: the parameters, then the probe. Its fields were PageSelectParams' last ones and keep
// their offsets here, so the kernels' code did not change when they moved out of it.
struct PageSelectKernelArgs : PageSelectParams, PageSelectProbe {};
// The score stage (page_score.cu).
void launch_score_pages(const PageSelectKernelArgs& p, cudaStream_t stream);
}  // namespace detail

// The select kernel's blocks per list for n_lists lists when select_cluster is 0.
int page_select_cluster(int n_lists);

// Buffers sized once from maxima and reused by every step (and graph replay).
class PageSelectWorkspace {
 public:
  PageSelectWorkspace(int max_lists, int64_t max_nnz, int q_stride);
  ~PageSelectWorkspace();
  PageSelectWorkspace(const PageSelectWorkspace&) = delete;
  PageSelectWorkspace& operator=(const PageSelectWorkspace&) = delete;

  // Fills the workspace fields of p (and q_stride, score_stride, n_score_warps, smem_pages).
  void bind(PageSelectParams* p) const;
  int max_lists() const { return max_lists_; }
  int64_t max_nnz() const { return max_nnz_; }
  int q_stride() const { return q_stride_; }

 private:
  int max_lists_;
  int64_t max_nnz_;
  int q_stride_;
  int n_score_warps_ = 0;
  float* scores_d_ = nullptr;
  float* mass_d_ = nullptr;
  int32_t* counts_d_ = nullptr;
  int32_t* stage_idx_d_ = nullptr;
};

// Shared-memory capacity of each select block, in fp32 masses: 22 rounds of 512 (44 KiB; with the
// mass pass's 64 KiB cache of exp-terms and ~34 KiB of static buffers a block takes ~142 KiB, one
// block per SM, opted in). With C blocks per list the first C * 16 * 512 pages of a list (8,192 per
// block: 128k tokens at page 16 for C = 1) keep their masses in registers, the next C * 11,264 in
// shared memory; longer lists or a smaller smem_pages put the overflow in the global workspace.
inline constexpr int kSelectSmemPages = 11264;

}  // namespace dhs::cuda
