// Device page summaries and sparse selection (backend/cuda/device_page_summary.h,
// page_select.h) against the CPU substrate (sparse/page_summary.h, mass_estimator.h,
// policy.h), on awkward shapes: 17 requests of 1 .. 3000 tokens (last pages partly full),
// GQA 32/8 d128 and 9/3 d64, q_len 1 and 5 mixed, keys with planted "needle" rows so that
// the masses are peaked and the coverage sets non-trivial.
//
// Tolerances and why:
//  * MinMax summaries: exact. The pool holds f16 values; min/max of them are f16 values.
//  * MeanSpread summaries: one f16 rounding of the fp32 value: |gpu - ref| <= 2^-10 |ref|
//    (twice the half-ulp bound 2^-11)
//    (+1e-6 for sums that cancel to ~0).
//  * Masses (MinMax; same summaries on both sides): per page |gpu - cpu| <= 2e-4 cpu + 1e-7.
//    Both compute q.k bounds in fp32 (128 products, different order: ~1e-6 relative of
//    sum |terms| <= ~100, i.e. ~1e-4 absolute in the scaled score, 1e-4 relative in exp);
//    the CPU normalises in double, the GPU in fp32 (~1e-6).
//  * Lists: top-k and sink+window lists must equal the CPU policy's exactly. A coverage
//    list may differ from the CPU's only where the CPU's cut is within 1e-4 of gamma (a
//    borderline the mass tolerance above can flip); every GPU coverage list must satisfy
//    the definition on the GPU's own masses (forced pages in, reaches gamma, minimal, the
//    heaviest free pages, ties by index) within 1e-5 of float summation.
//  * Key sketch codes and steps: exact (same definition and correctly rounded divisions).
//  * Sketch scores: the device (and the CPU estimator) quantizes q to int8 per vector (step
//    s_q = max|q| / 127), so against the float-q definition a
//    token's q.k^ moves by at most (s_q / 2) sum_d |k^_d|; a log-sum-exp moves by at most its
//    inputs' largest move. Per page: |gpu - ref| <= scale log2(e) max_t (s_q / 2) sum_d |k^_td|
//    + 1e-4 (fp32 sums and exp2/log2). Masses then within a factor 2^(2 bound) of the CPU's.
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/device_key_sketch.h"
#include "backend/cuda/device_page_pool.h"
#include "backend/cuda/device_page_summary.h"
#include "backend/cuda/page_select.h"
#include "backend/cuda/page_select_rule.h"
#include "core/fp16.h"
#include "device_vectors.h"
#include "gtest_shim.h"
#include "kv/page_lists.h"
#include "kv/page_pool.h"
#include "kv/page_table.h"
#include "sparse/mass_estimator.h"
#include "sparse/page_summary.h"
#include "sparse/key_basis.h"
#include "sparse/policy.h"

namespace {

namespace dc = dhs::cuda;
constexpr int kPage = 16;

bool quick() {
  const char* e = std::getenv("DHS_TEST_QUICK");
  return e && *e && *e != '0';
}
bool have_gpu() { return dc::device_count() > 0; }
float round_f16(float x) { return dhs::fp16_to_f32(dhs::f32_to_fp16(x)); }

using dhs::test::to_device;
using dhs::test::to_host;

// One layer's KV for a batch: host pool + tables + CPU summaries, the same on the device.
struct Problem {
  int n_heads_q = 0, n_heads_kv = 0, head_dim = 0;
  std::vector<int32_t> seq_len, q_indptr;
  std::unique_ptr<dhs::PagePool> pool;
  std::vector<std::unique_ptr<dhs::PageTable>> tables;
  std::vector<const dhs::PageTable*> table_ptrs;
  std::vector<float> q;  // [rows, Hq, D], f16-rounded
  std::unique_ptr<dc::DevicePagePool> pool_d;
};

Problem make_problem(int hq, int hkv, int d, const std::vector<int>& seq, const std::vector<int>& q_len,
                     std::mt19937& rng) {
  Problem pr;
  pr.n_heads_q = hq;
  pr.n_heads_kv = hkv;
  pr.head_dim = d;
  pr.seq_len.assign(seq.begin(), seq.end());
  pr.q_indptr.assign(1, 0);
  for (int l : q_len) pr.q_indptr.push_back(pr.q_indptr.back() + l);
  int64_t n_pages = 5;
  for (int s : seq) n_pages += static_cast<int64_t>((s + kPage - 1) / kPage) * hkv;
  pr.pool = std::make_unique<dhs::PagePool>(dhs::Tier::Device, n_pages, kPage, d);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::uniform_real_distribution<float> u01(0.0f, 1.0f);
  const int group = hq / hkv;
  // q first: needles are keys aligned with one of their group's q heads.
  const int n_rows = pr.q_indptr.back();
  pr.q.resize(static_cast<size_t>(n_rows) * hq * d);
  for (float& x : pr.q) x = round_f16(nd(rng));
  for (size_t r = 0; r < seq.size(); ++r) {
    auto t = std::make_unique<dhs::PageTable>(1, hkv, kPage);
    if (!t->reserve(*pr.pool, seq[r])) throw std::runtime_error("pool too small");
    t->commit(seq[r]);
    const int q_last = pr.q_indptr[r + 1] - 1;
    for (int h = 0; h < hkv; ++h)
      for (int p = 0; p < seq[r]; ++p) {
        int row;
        float* k = pr.pool->k_page(t->page_of_token(0, h, p, &row)) + row * d;
        float* v = pr.pool->v_page(t->page_of_token(0, h, p, &row)) + row * d;
        // ~1 key in 60 is a needle: 0.35 x a q head of the group + noise (peaked masses).
        const bool needle = u01(rng) < 1.0f / 60.0f;
        const float* qv = pr.q.data() + (static_cast<size_t>(q_last) * hq + h * group + (p % group)) * d;
        for (int j = 0; j < d; ++j) {
          k[j] = round_f16(needle ? 0.35f * qv[j] + 0.3f * nd(rng) : nd(rng));
          v[j] = round_f16(nd(rng));
        }
      }
    pr.table_ptrs.push_back(t.get());
    pr.tables.push_back(std::move(t));
  }
  pr.pool_d = std::make_unique<dc::DevicePagePool>(n_pages, kPage, d);
  // Unused rows of partial pages stay 0 in the host pool; the summaries never read them.
  pr.pool_d->upload(*pr.pool);
  return pr;
}

// The CPU estimator's query for request r (all its rows).
dhs::MassQuery mass_query(const Problem& pr, int r, float scale) {
  dhs::MassQuery mq;
  mq.q = pr.q.data();
  mq.row_begin = pr.q_indptr[static_cast<size_t>(r)];
  mq.row_end = pr.q_indptr[static_cast<size_t>(r) + 1];
  mq.n_heads_q = pr.n_heads_q;
  mq.scale = scale;
  mq.seq_len = pr.seq_len[static_cast<size_t>(r)];
  return mq;
}

// The CPU store of every written page of the problem (summaries and key sketch), rebuilt from the pool.
dhs::PageSummaryStore cpu_store_of(const Problem& pr) {
  dhs::PageSummaryStore store(*pr.pool);
  for (auto* t : pr.table_ptrs)
    for (int h = 0; h < pr.n_heads_kv; ++h)
      for (int64_t i = 0; i < t->n_pages_per_list(); ++i)
        store.rebuild(*pr.pool, t->page(0, h, i).slot, static_cast<int>(std::min<int64_t>(kPage, t->n_tokens() - i * kPage)));
  return store;
}

// The fields every selection shares: the dense lists of every page, q ([rows, Hq, head_dim]),
// shapes and the workspace; the caller adds the estimate's inputs (summaries or a sketch).
dc::PageSelectParams dense_params(const dc::DevicePageLists& dense_d, const __half* q_d, const int32_t* q_indptr_d,
                                  int n_req, int hq, int hkv, int head_dim, float scale, const dc::PageSelectWorkspace& ws) {
  dc::PageSelectParams p;
  p.dense_indptr = dense_d.indptr_d();
  p.dense_slots = dense_d.slots_d();
  p.dense_page_pos = dense_d.page_pos_d();
  p.seq_len = dense_d.seq_len_d();
  p.q = q_d;
  p.q_indptr = q_indptr_d;
  p.n_requests = n_req;
  p.n_heads_q = hq;
  p.n_heads_kv = hkv;
  p.head_dim = head_dim;
  p.page_size = kPage;
  p.scale = scale;
  ws.bind(&p);
  return p;
}

// dst_slot / pos of every token of every request as one prefill-like step.
void all_tokens(const Problem& pr, std::vector<int32_t>* dst, std::vector<int32_t>* pos) {
  for (size_t r = 0; r < pr.seq_len.size(); ++r)
    for (int p = 0; p < pr.seq_len[r]; ++p) {
      pos->push_back(p);
      for (int h = 0; h < pr.n_heads_kv; ++h) {
        int row;
        dst->push_back(pr.tables[r]->page_of_token(0, h, p, &row).slot);
      }
    }
}

// Uploads one step's (token, KV head) slots and positions, runs launch(dst_d, pos_d), waits.
template <typename Launch>
void run_step(const std::vector<int32_t>& dst, const std::vector<int32_t>& pos, Launch launch) {
  int32_t* dst_d = to_device(dst);
  int32_t* pos_d = to_device(pos);
  launch(dst_d, pos_d);
  DHS_CUDA_CHECK(cudaDeviceSynchronize());
  cudaFree(dst_d);
  cudaFree(pos_d);
}

// Runs the summarize kernel for the given (token, KV head) slots and positions, one step.
void summarize_step(const Problem& pr, dc::DevicePageSummaries& s, const std::vector<int32_t>& dst,
                    const std::vector<int32_t>& pos) {
  run_step(dst, pos, [&](const int32_t* dst_d, const int32_t* pos_d) {
    dc::SummarizePagesParams sp;
    sp.k_pool = pr.pool_d->k_d();
    sp.summaries = s.data_d();
    sp.pos = pos_d;
    sp.dst_slot = dst_d;
    sp.kind = s.kind();
    sp.n_pages = pr.pool->n_pages();
    sp.page_size = kPage;
    sp.n_tok = static_cast<int64_t>(pos.size());
    sp.n_heads_kv = pr.n_heads_kv;
    sp.head_dim = pr.head_dim;
    dc::launch_summarize_pages(sp, nullptr);
  });
}

std::unique_ptr<dc::DevicePageSummaries> summarize_on_device(const Problem& pr, dc::SummaryKind kind) {
  auto s = std::make_unique<dc::DevicePageSummaries>(pr.pool->n_pages(), pr.head_dim, kind);
  std::vector<int32_t> dst, pos;
  all_tokens(pr, &dst, &pos);
  summarize_step(pr, *s, dst, pos);
  return s;
}

std::vector<int> seq_lens_17() {
  return {1, 15, 16, 17, 97, 3, 256, 1000, 1601, 33, 2048, 700, 64, 129, 3000, 480, 900};
}
std::vector<int> q_lens_17(bool multi) {
  std::vector<int> q(17, 1);
  if (multi)
    for (int i = 0; i < 17; i += 3) q[static_cast<size_t>(i)] = std::min(5, seq_lens_17()[static_cast<size_t>(i)]);
  return q;
}

TEST(DeviceSummaries, MatchTheCpuStoreOnPrefillAndDecodeSteps) {
  if (!have_gpu()) GTEST_SKIP() << "no GPU";
  std::mt19937 rng(7);
  for (auto [hq, hkv, d] : {std::tuple{32, 8, 128}, std::tuple{9, 3, 64}}) {
    Problem pr = make_problem(hq, hkv, d, seq_lens_17(), q_lens_17(false), rng);
    dhs::PageSummaryStore cpu = cpu_store_of(pr);
    for (auto kind : {dc::SummaryKind::MinMax, dc::SummaryKind::MeanSpread}) {
      auto s = summarize_on_device(pr, kind);
      const auto h = to_host(reinterpret_cast<const uint16_t*>(s->data_d()), static_cast<size_t>(pr.pool->n_pages()) * 2 * d);
      int64_t checked = 0, bad = 0;
      for (auto* t : pr.table_ptrs)
        for (int hh = 0; hh < hkv; ++hh)
          for (int64_t i = 0; i < t->n_pages_per_list(); ++i) {
            const int32_t slot = t->page(0, hh, i).slot;
            const int n = cpu.n_rows(slot);
            for (int j = 0; j < d; ++j) {
              const float g0 = dhs::fp16_to_f32(h[(static_cast<size_t>(slot) * 2) * d + j]);
              const float g1 = dhs::fp16_to_f32(h[(static_cast<size_t>(slot) * 2 + 1) * d + j]);
              ++checked;
              if (kind == dc::SummaryKind::MinMax) {
                bad += g0 != cpu.min(slot)[j] || g1 != cpu.max(slot)[j];
              } else {
                const float mean = cpu.mean(slot)[j], var = cpu.m2(slot)[j] / static_cast<float>(n);
                bad += std::fabs(g0 - mean) > std::ldexp(std::fabs(mean), -10) + 1e-6f ||
                       std::fabs(g1 - var) > std::ldexp(std::fabs(var), -10) + 1e-6f;
              }
            }
          }
      EXPECT_EQ(bad, 0) << "of " << checked << " summary elements, hq " << hq << " kind "
                        << (kind == dc::SummaryKind::MinMax ? "minmax" : "meanspread");
    }
    // A decode step (one new token per request, the last) recomputes the last page only:
    // change that token's key, summarize just it, compare the page again.
    auto s = summarize_on_device(pr, dc::SummaryKind::MinMax);
    std::vector<int32_t> dst, pos;
    for (size_t r = 0; r < pr.seq_len.size(); ++r) {
      const int p = pr.seq_len[r] - 1;
      pos.push_back(p);
      for (int hh = 0; hh < hkv; ++hh) {
        int row;
        const dhs::PageRef ref = pr.tables[r]->page_of_token(0, hh, p, &row);
        dst.push_back(ref.slot);
        float* k = pr.pool->k_page(ref) + row * d;
        for (int j = 0; j < d; ++j) k[j] = round_f16(5.0f * std::sin(0.37f * j + r));
        cpu.rebuild(*pr.pool, ref.slot, row + 1);
      }
    }
    pr.pool_d->upload(*pr.pool);
    summarize_step(pr, *s, dst, pos);
    const auto h = to_host(reinterpret_cast<const uint16_t*>(s->data_d()), static_cast<size_t>(pr.pool->n_pages()) * 2 * d);
    int64_t bad = 0;
    for (int32_t slot : dst)
      for (int j = 0; j < d; ++j)
        bad += dhs::fp16_to_f32(h[(static_cast<size_t>(slot) * 2) * d + j]) != cpu.min(slot)[j] ||
               dhs::fp16_to_f32(h[(static_cast<size_t>(slot) * 2 + 1) * d + j]) != cpu.max(slot)[j];
    EXPECT_EQ(bad, 0) << "decode-step summaries differ";
  }
}

// A policy's CPU statement; the kernel's fields come from it through dc::set_rule, the one
// translation the engine uses too (page_select_rule.h).
struct PolicyCase {
  std::string name;
  dhs::PolicySpec cpu;
};

std::vector<PolicyCase> policy_cases() {
  std::vector<PolicyCase> v;
  auto cov = [&](double g, int sink, int recent, bool mx) {
    PolicyCase c{"coverage-" + std::to_string(g), {}};
    c.cpu.rule = dhs::SelectRule::Coverage;
    c.cpu.gamma = g;
    c.cpu.n_sink = sink;
    c.cpu.n_recent = recent;
    c.cpu.combine = mx ? dhs::GroupCombine::Max : dhs::GroupCombine::Sum;
    if (mx) c.name += "-max";
    return c;
  };
  for (double g : {0.05, 0.5, 0.9, 0.95, 0.99, 1.0}) v.push_back(cov(g, 1, 1, false));
  v.push_back(cov(0.98, 0, 0, false));
  v.push_back(cov(0.98, 4, 2, true));
  // Top-k cuts (1 sink, 2 recent): a fixed budget, or TopFrac's ceil(frac x pages) of each list,
  // in float on both sides (top_frac_k).
  auto top = [&](const std::string& name, dhs::SelectRule rule, int budget, double frac) {
    PolicyCase c{name, {}};
    c.cpu.rule = rule;
    c.cpu.budget = budget;
    c.cpu.frac = frac;
    c.cpu.n_sink = 1;
    c.cpu.n_recent = 2;
    v.push_back(c);
  };
  for (int k : {1, 2, 3, 8, 50}) top("topk-" + std::to_string(k), dhs::SelectRule::TopK, k, 0.25);
  for (double f : {0.05, 0.3, 0.9}) top("topfrac-" + std::to_string(f), dhs::SelectRule::TopFrac, 0, f);
  {
    PolicyCase c{"sinkwindow", {}};
    c.cpu.rule = dhs::SelectRule::SinkWindow;
    c.cpu.n_sink = 2;
    c.cpu.n_recent = 5;
    c.cpu.budget = 7;
    v.push_back(c);
  }
  {
    PolicyCase c = cov(0.95, 1, 1, false);
    c.name = "solohead-0.95";
    c.cpu.rule = dhs::SelectRule::SoloHead;
    v.push_back(c);
  }
  {
    PolicyCase c = cov(0.9, 1, 1, false);
    c.name = "coverage-0.9-dense-below-1000";
    c.cpu.dense_below = 1000;
    v.push_back(c);
  }
  return v;
}

// Checks one coverage list against the definition on masses m (all of the list's pages).
std::string coverage_violation(const std::vector<double>& m, const std::vector<int32_t>& set, int sink, int recent,
                               double gamma) {
  const int n = static_cast<int>(m.size());
  if (gamma >= 1.0) return static_cast<int>(set.size()) == n ? "" : "gamma 1 must take every page";
  std::vector<char> in(static_cast<size_t>(n), 0);
  for (int32_t i : set) in[static_cast<size_t>(i)] = 1;
  auto forced = [&](int i) { return i < sink || i >= std::max(sink, n - recent); };
  double cov = 0.0, min_free_in = 1e9;
  int min_free_idx = -1;
  for (int i = 0; i < n; ++i) {
    if (forced(i) && !in[static_cast<size_t>(i)]) return "forced page " + std::to_string(i) + " missing";
    if (in[static_cast<size_t>(i)]) {
      cov += m[static_cast<size_t>(i)];
      if (!forced(i) && m[static_cast<size_t>(i)] <= min_free_in) {
        min_free_in = m[static_cast<size_t>(i)];
        min_free_idx = i;
      }
    }
  }
  const bool all = static_cast<int>(set.size()) == n;
  if (cov < gamma - 1e-5 && !all) return "mass " + std::to_string(cov) + " below gamma";
  if (min_free_idx >= 0 && cov - min_free_in >= gamma + 1e-5) return "not minimal";
  for (int i = 0; i < n; ++i)
    if (!forced(i) && !in[static_cast<size_t>(i)] && min_free_idx >= 0) {
      const double a = m[static_cast<size_t>(i)];
      if (a > min_free_in || (a == min_free_in && i < min_free_idx)) return "a heavier page left out";
    }
  return "";
}

// seqs: request lengths (default the 17 awkward ones); smem_pages >= 0 overrides the select
// kernel's shared-memory capacity (0: every mass past the register rounds in the global workspace).
// q_gain scales the queries (scores far outside [-64, 64] take the select kernel's max-subtracted
// sums).
void run_selection_cases(int hq, int hkv, int d, bool multi_q, dc::SummaryKind kind, uint32_t seed,
                         bool gaussian = false, const std::vector<int>& seqs = {}, int smem_pages = -1,
                         float q_gain = 1.0f) {
  std::mt19937 rng(seed);
  Problem pr = seqs.empty() ? make_problem(hq, hkv, d, seq_lens_17(), q_lens_17(multi_q), rng)
                            : make_problem(hq, hkv, d, seqs, std::vector<int>(seqs.size(), 1), rng);
  for (float& x : pr.q) x = round_f16(x * q_gain);
  const int n_req = static_cast<int>(pr.seq_len.size());
  const int group = hq / hkv;
  int max_q = 0;
  for (int r = 0; r < n_req; ++r) max_q = std::max(max_q, pr.q_indptr[r + 1] - pr.q_indptr[r]);
  auto sums_d = summarize_on_device(pr, kind);
  dhs::PageSummaryStore cpu_store = cpu_store_of(pr);
  const dhs::PageLists dense = dhs::dense_page_lists(pr.table_ptrs, 0, pr.seq_len);
  dc::DevicePageLists dense_d(n_req, hkv, dense.nnz());
  dense_d.upload(dense);
  std::vector<uint16_t> qb(pr.q.size());
  for (size_t i = 0; i < qb.size(); ++i) qb[i] = dhs::f32_to_fp16(pr.q[i]);
  auto* q_d = reinterpret_cast<__half*>(to_device(qb));
  int32_t* q_indptr_d = to_device(pr.q_indptr);
  const int n_lists = n_req * hkv;
  dc::PageSelectWorkspace ws(n_lists, dense.nnz(), group * max_q);
  int32_t* out_indptr = to_device(std::vector<int32_t>(static_cast<size_t>(n_lists + 1), -7));
  int32_t* out_slots = to_device(std::vector<int32_t>(static_cast<size_t>(dense.nnz()), -7));
  int32_t* out_pos = to_device(std::vector<int32_t>(static_cast<size_t>(dense.nnz()), -7));
  float* mass_d = to_device(std::vector<float>(static_cast<size_t>(dense.nnz()), -1.0f));
  const float scale = 1.0f / std::sqrt(static_cast<float>(d));

  dhs::SelectionInput in;
  in.tables = &pr.table_ptrs;
  in.layer = 0;
  in.seq_len = &pr.seq_len;
  in.q = pr.q.data();
  in.q_indptr = pr.q_indptr.data();
  in.n_heads_q = hq;
  in.scale = scale;
  in.summaries = &cpu_store;

  // The fields every case shares: inputs, outputs, shapes, workspace.
  auto base_params = [&] {
    dc::PageSelectParams p = dense_params(dense_d, q_d, q_indptr_d, n_req, hq, hkv, d, scale, ws);
    p.summaries = sums_d->data_d();
    p.kind = kind;
    p.gaussian = gaussian;
    p.indptr = out_indptr;
    p.slots = out_slots;
    p.page_pos = out_pos;
    if (smem_pages >= 0) p.smem_pages = smem_pages;
    return p;
  };

  for (const PolicyCase& pc : policy_cases()) {
    dhs::PolicySpec cfg = pc.cpu;
    cfg.estimator = kind == dc::SummaryKind::MinMax ? "minmax" : gaussian ? "gaussian" : "meanspread";
    dc::PageSelectParams rule_fields;
    (void)dc::set_rule(cfg, &rule_fields);
    const dc::SelectRule rule = rule_fields.rule;
    if (kind == dc::SummaryKind::MeanSpread && rule != dc::SelectRule::Coverage) continue;
    const auto policy = dhs::make_policy(cfg);
    const dhs::PageLists want = policy->select(in);

    // Every cluster size of the select kernel (0: the one chosen for this many lists); 1 takes
    // the overflow rounds on the long lists, 16 leaves most blocks of a short list idle. Under
    // DHS_TEST_QUICK (the sanitizers) one size that exercises the cluster paths.
    const std::vector<int> cluster_sizes = quick() ? std::vector<int>{2} : std::vector<int>{0, 1, 2, 16};
    for (int cs : cluster_sizes) {
      dc::PageSelectParams p = base_params();
      (void)dc::set_rule(cfg, &p);
      p.summaries = sums_d->data_d();  // (set_rule sets the rule's fields; the test's store stays)
      p.mass_out = mass_d;
      p.select_cluster = cs;
      dc::launch_page_select(p, nullptr);
      DHS_CUDA_CHECK(cudaDeviceSynchronize());
      const auto g_indptr = to_host(out_indptr, static_cast<size_t>(n_lists + 1));
      ASSERT_EQ(g_indptr[0], 0) << pc.name << " C " << cs;
      const auto g_slots = to_host(out_slots, static_cast<size_t>(g_indptr[n_lists]));
      const auto g_pos = to_host(out_pos, static_cast<size_t>(g_indptr[n_lists]));
      const auto g_mass = to_host(mass_d, static_cast<size_t>(dense.nnz()));

      // Same launch again: the same lists (fixed-order reductions).
      dc::launch_page_select(p, nullptr);
      DHS_CUDA_CHECK(cudaDeviceSynchronize());
      EXPECT_TRUE(to_host(out_indptr, static_cast<size_t>(n_lists + 1)) == g_indptr) << pc.name << " C " << cs << ": not deterministic";

      int mismatched = 0, mass_bad = 0;
      for (int r = 0; r < n_req; ++r) {
        const int n_pg = (pr.seq_len[static_cast<size_t>(r)] + kPage - 1) / kPage;
        const int k_top = cfg.rule == dhs::SelectRule::TopFrac ? dhs::top_frac_k(cfg.frac, n_pg) : cfg.budget;
        const bool scored = rule != dc::SelectRule::SinkWindow && pr.seq_len[static_cast<size_t>(r)] >= cfg.dense_below &&
                            !(rule == dc::SelectRule::Coverage && cfg.gamma >= 1.0) &&
                            !(rule == dc::SelectRule::TopK && k_top >= n_pg);
        std::vector<double> cpu_mass;
        if (scored && !p.share_heads && kind == dc::SummaryKind::MinMax) {
          const dhs::MassQuery mq = mass_query(pr, r, scale);
          for (int h = 0; h < hkv; ++h) {
            dhs::estimate_page_mass(dhs::MinMaxEstimator(), cpu_store, *pr.tables[static_cast<size_t>(r)], 0, h, mq,
                                    cfg.combine, &cpu_mass);
            const int b = dense.row_begin(r, h);
            for (int i = 0; i < n_pg; ++i) {
              const double g = g_mass[static_cast<size_t>(b + i)], c = cpu_mass[static_cast<size_t>(i)];
              mass_bad += std::fabs(g - c) > 2e-4 * c + 1e-7;
            }
          }
        }
        for (int h = 0; h < hkv; ++h) {
          const int row = r * hkv + h;
          std::vector<int32_t> gp(g_pos.begin() + g_indptr[static_cast<size_t>(row)],
                                  g_pos.begin() + g_indptr[static_cast<size_t>(row) + 1]);
          std::vector<int32_t> wp(want.page_pos.begin() + want.indptr[static_cast<size_t>(row)],
                                  want.page_pos.begin() + want.indptr[static_cast<size_t>(row) + 1]);
          // Slots must be the pages' slots.
          for (size_t i = 0; i < gp.size(); ++i)
            EXPECT_EQ(g_slots[static_cast<size_t>(g_indptr[static_cast<size_t>(row)]) + i],
                      pr.tables[static_cast<size_t>(r)]->page(0, h, gp[i]).slot);
          if (gp == wp) continue;
          const bool coverage = rule == dc::SelectRule::Coverage;
          if (!coverage) {
            ADD_FAILURE() << pc.name << " C " << cs << ": request " << r << " head " << h << ": " << gp.size() << " pages, CPU "
                          << wp.size();
            continue;
          }
          ++mismatched;
          // Allowed only at a borderline, and the GPU list must satisfy the definition.
          const int b = dense.row_begin(r, p.share_heads ? 0 : h);  // SoloHead: head 0's range
          std::vector<double> gm(g_mass.begin() + b, g_mass.begin() + b + n_pg);
          const std::string why = coverage_violation(gm, gp, cfg.n_sink, cfg.n_recent, cfg.gamma);
          EXPECT_TRUE(why.empty()) << pc.name << " C " << cs << ": request " << r << " head " << h << ": " << why;
          // The CPU's cut: its mass without its lightest free page must sit within 1e-4 of gamma.
          std::vector<double> cm = cpu_mass.empty() ? gm : cpu_mass;
          if (!cpu_mass.empty()) {
            const dhs::MassQuery mq = mass_query(pr, r, scale);
            dhs::estimate_page_mass(dhs::MinMaxEstimator(), cpu_store, *pr.tables[static_cast<size_t>(r)], 0, h, mq,
                                    cfg.combine, &cm);
          }
          double cov = 0.0, lightest = 1e9;
          for (int32_t i : wp) {
            cov += cm[static_cast<size_t>(i)];
            const bool f = i < cfg.n_sink || i >= std::max(cfg.n_sink, n_pg - cfg.n_recent);
            if (!f) lightest = std::min(lightest, cm[static_cast<size_t>(i)]);
          }
          const bool border = std::fabs(cov - cfg.gamma) < 1e-4 || std::fabs(cov - lightest - cfg.gamma) < 1e-4 ||
                              kind == dc::SummaryKind::MeanSpread;
          EXPECT_TRUE(border) << pc.name << " C " << cs << ": request " << r << " head " << h << " differs from the CPU away from "
                              << "a borderline (" << gp.size() << " vs " << wp.size() << " pages)";
        }
      }
      EXPECT_EQ(mass_bad, 0) << pc.name << " C " << cs << ": masses off the CPU's";
      // MeanSpread's f16 summaries differ from the CPU's fp32 ones: only the definition check holds there.
      if (kind == dc::SummaryKind::MinMax)
        EXPECT_LE(mismatched, n_lists / 10 + 1) << pc.name << " C " << cs << ": too many coverage lists differ from the CPU";
      std::printf("  %-32s C %2d hq %2d d %3d q_len %s %-10s: %lld of %lld pages, %d borderline lists\n", pc.name.c_str(),
                  cs, hq, d, multi_q ? "1,5" : "1  ", cfg.estimator.c_str(),
                  static_cast<long long>(g_indptr[n_lists]), static_cast<long long>(dense.nnz()), mismatched);
    }
  }
  // Top-k with per-KV-head budget fractions (budgets replayed from traces) and the page counters:
  // head h keeps ceil(frac[h] * n) pages (all when that reaches n), as top_k_set ranks them.
  if (kind == dc::SummaryKind::MinMax) {
    std::vector<float> frac(static_cast<size_t>(hkv));
    for (int h = 0; h < hkv; ++h) frac[static_cast<size_t>(h)] = std::vector<float>{0.05f, 0.3f, 1.0f, 0.12f}[static_cast<size_t>(h % 4)];
    float* frac_d = to_device(frac);
    auto* stats_d = to_device(std::vector<unsigned long long>(static_cast<size_t>(2 * hkv), 0));
    dc::PageSelectParams p = base_params();
    p.rule = dc::SelectRule::TopK;
    p.budget_frac = frac_d;
    p.n_sink = 1;
    p.n_recent = 2;
    p.stats = stats_d;
    dc::launch_page_select(p, nullptr);
    DHS_CUDA_CHECK(cudaDeviceSynchronize());
    const auto g_indptr = to_host(out_indptr, static_cast<size_t>(n_lists + 1));
    const auto g_pos = to_host(out_pos, static_cast<size_t>(g_indptr[n_lists]));
    const auto stats = to_host(stats_d, static_cast<size_t>(2 * hkv));
    std::vector<unsigned long long> want_read(static_cast<size_t>(hkv), 0), want_total(static_cast<size_t>(hkv), 0);
    int bad = 0;
    for (int r = 0; r < n_req; ++r) {
      const int n_pg = (pr.seq_len[static_cast<size_t>(r)] + kPage - 1) / kPage;
      const dhs::MassQuery mq = mass_query(pr, r, scale);
      for (int h = 0; h < hkv; ++h) {
        const int k = static_cast<int>(std::ceil(frac[static_cast<size_t>(h)] * static_cast<float>(n_pg)));
        std::vector<int32_t> want;
        if (k >= n_pg) {
          want.resize(static_cast<size_t>(n_pg));
          std::iota(want.begin(), want.end(), 0);
        } else {
          std::vector<double> cm;
          dhs::estimate_page_mass(dhs::MinMaxEstimator(), cpu_store, *pr.tables[static_cast<size_t>(r)], 0, h, mq,
                                  dhs::GroupCombine::Sum, &cm);
          want = dhs::top_k_set(cm, 1, 2, k);
        }
        const int row = r * hkv + h;
        const std::vector<int32_t> got(g_pos.begin() + g_indptr[static_cast<size_t>(row)],
                                       g_pos.begin() + g_indptr[static_cast<size_t>(row) + 1]);
        bad += got != want;
        want_read[static_cast<size_t>(h)] += want.size();
        want_total[static_cast<size_t>(h)] += static_cast<unsigned long long>(n_pg);
      }
    }
    EXPECT_EQ(bad, 0) << "per-head budget lists differ from top_k_set";
    for (int h = 0; h < hkv; ++h) {
      EXPECT_EQ(stats[static_cast<size_t>(2 * h)], want_read[static_cast<size_t>(h)]) << "pages-read counter, head " << h;
      EXPECT_EQ(stats[static_cast<size_t>(2 * h + 1)], want_total[static_cast<size_t>(h)]) << "pages counter, head " << h;
    }
    cudaFree(frac_d);
    cudaFree(stats_d);
  }
  cudaFree(q_d);
  cudaFree(q_indptr_d);
  cudaFree(out_indptr);
  cudaFree(out_slots);
  cudaFree(out_pos);
  cudaFree(mass_d);
}

TEST(PageSelect, MatchesTheCpuPoliciesLlama8bShape) {
  if (!have_gpu()) GTEST_SKIP() << "no GPU";
  run_selection_cases(32, 8, 128, false, dc::SummaryKind::MinMax, 11);
  if (!quick()) run_selection_cases(32, 8, 128, true, dc::SummaryKind::MinMax, 12);
  // MinMax scores of ~150 (log2 units): past the plain sums' [-64, 64].
  run_selection_cases(32, 8, 128, false, dc::SummaryKind::MinMax, 18, false, {}, -1, 6.0f);
}

// Lists past the 8,192 pages whose masses sit in registers: the shared-memory and global
// overflow rounds of the select kernel (one request of 140,000 tokens = 8,750 pages per head).
TEST(PageSelect, MatchesTheCpuPoliciesOnListsPastTheRegisterRounds) {
  if (!have_gpu()) GTEST_SKIP() << "no GPU";
  if (quick()) GTEST_SKIP() << "DHS_TEST_QUICK: long lists skipped";
  run_selection_cases(9, 3, 64, false, dc::SummaryKind::MinMax, 16, false, {140000, 37}, -1);
  run_selection_cases(9, 3, 64, false, dc::SummaryKind::MinMax, 17, false, {140000, 37}, 0);
}

TEST(PageSelect, MatchesTheCpuPoliciesSmolShape) {
  if (!have_gpu()) GTEST_SKIP() << "no GPU";
  run_selection_cases(9, 3, 64, true, dc::SummaryKind::MinMax, 13);
  run_selection_cases(9, 3, 64, false, dc::SummaryKind::MeanSpread, 14);
  run_selection_cases(9, 3, 64, true, dc::SummaryKind::MeanSpread, 15, /*gaussian=*/true);
}


// ---- 4-bit key sketch ------------------------------------------------------------------

// basis: the projected sketch's (code dims = its rank), or null for the plain sketch.
void sketch_step(const Problem& pr, dc::DeviceKeySketch& s, const std::vector<int32_t>& dst, const std::vector<int32_t>& pos,
                 const dc::DeviceKeyBasis* basis = nullptr) {
  run_step(dst, pos, [&](const int32_t* dst_d, const int32_t* pos_d) {
    dc::SketchKeysParams sp;
    sp.k_pool = pr.pool_d->k_d();
    sp.codes = s.codes_d();
    sp.steps = s.steps_d();
    sp.pos = pos_d;
    sp.dst_slot = dst_d;
    sp.n_pages = pr.pool->n_pages();
    sp.page_size = kPage;
    sp.n_tok = static_cast<int64_t>(pos.size());
    sp.n_heads_kv = pr.n_heads_kv;
    sp.head_dim = pr.head_dim;
    if (basis != nullptr) {
      sp.basis = basis->basis_d(0);
      sp.basis_mean = basis->mean_d(0);
      sp.code_dims = basis->rank();
    }
    dc::launch_sketch_keys(sp, nullptr);
  });
}

// Every score of the score stage on `warps` warps ([q_stride, score_stride]; NaN where unwritten).
std::vector<float> run_scores(dc::PageSelectParams p, int warps, int q_stride) {
  p.n_score_warps = warps;
  DHS_CUDA_CHECK(cudaMemset(p.scores, 0xFF, static_cast<size_t>(p.score_stride) * q_stride * sizeof(float)));  // NaN
  dc::launch_page_select_stage(p, 0, nullptr);
  DHS_CUDA_CHECK(cudaDeviceSynchronize());
  return to_host(p.scores, static_cast<size_t>(p.score_stride) * q_stride);
}

// Rows of the device sketch that differ from the CPU store's codes or steps, over every written row.
int64_t sketch_mismatches(const Problem& pr, const dc::DeviceKeySketch& s, const dhs::PageSummaryStore& cpu, int64_t* rows) {
  const int d = pr.head_dim;
  const auto codes = to_host(s.codes_d(), s.code_bytes());
  const auto steps = to_host(s.steps_d(), static_cast<size_t>(pr.pool->n_pages()) * kPage);
  int64_t bad = 0;
  *rows = 0;
  for (auto* t : pr.table_ptrs)
    for (int h = 0; h < pr.n_heads_kv; ++h)
      for (int64_t i = 0; i < t->n_pages_per_list(); ++i) {
        const int32_t slot = t->page(0, h, i).slot;
        for (int r = 0; r < cpu.n_rows(slot); ++r) {
          const uint8_t* row = codes.data() + (static_cast<size_t>(slot) * kPage + r) * (d / 2);
          bool ok = steps[static_cast<size_t>(slot) * kPage + r] == cpu.key_code_scales(slot)[r];
          for (int j = 0; j < d; ++j) ok = ok && dc::sketch_code(row, d, j) == cpu.key_codes(slot)[r * d + j];
          bad += !ok;
          ++*rows;
        }
      }
  return bad;
}

// Visits every (request r, KV head h, page i, q vector j) whose page has n_vis > 0 rows visible to
// the vector: f(slot, row q0 + qi, q head hh, n_vis, q_len, index of the score in the stage's output).
template <typename F>
void for_each_visible_score(const Problem& pr, const dhs::PageLists& dense, int64_t score_stride, F f) {
  const int group = pr.n_heads_q / pr.n_heads_kv;
  for (int r = 0; r < static_cast<int>(pr.seq_len.size()); ++r) {
    const int q0 = pr.q_indptr[r], q_len = pr.q_indptr[r + 1] - q0;
    for (int h = 0; h < pr.n_heads_kv; ++h)
      for (int i = 0; i < (dense.row_end(r, h) - dense.row_begin(r, h)); ++i) {
        const int32_t slot = pr.tables[static_cast<size_t>(r)]->page(0, h, i).slot;
        for (int j = 0; j < q_len * group; ++j) {
          const int qi = j / group;
          const int n_vis = std::clamp(pr.seq_len[r] - q_len + qi + 1 - i * kPage, 0, kPage);
          if (n_vis == 0) continue;  // the select kernel ignores it
          f(slot, q0 + qi, h * group + j % group, n_vis, q_len, static_cast<size_t>(j) * score_stride + dense.row_begin(r, h) + i);
        }
      }
  }
}

TEST(KeySketch, CodesEqualTheCpuStoreAndScoresMeetTheirBound) {
  if (!have_gpu()) GTEST_SKIP() << "no GPU";
  std::mt19937 rng(21);
  // One query row per request with q_stride = group (<= 4) takes the score kernel's paired path
  // (two pages per MMA); query rows of 1 and 5 take the one-page path.
  // Gain 20: token scores of +-100 (log2 units) take the score kernel's max-subtracted sums.
  for (auto [hq, hkv, d, multi, gain] : {std::tuple{32, 8, 128, true, 1.0f}, std::tuple{32, 8, 128, false, 1.0f},
                                         std::tuple{32, 8, 128, false, 20.0f}, std::tuple{9, 3, 64, true, 1.0f},
                                         std::tuple{9, 3, 64, false, 1.0f}}) {
    Problem pr = make_problem(hq, hkv, d, seq_lens_17(), q_lens_17(multi), rng);
    for (float& x : pr.q) x = round_f16(x * gain);
    const int n_req = static_cast<int>(pr.seq_len.size());
    const int group = hq / hkv;
    dhs::PageSummaryStore cpu = cpu_store_of(pr);
    dc::DeviceKeySketch sk(pr.pool->n_pages(), kPage, d);
    {
      std::vector<int32_t> dst, pos;
      all_tokens(pr, &dst, &pos);
      sketch_step(pr, sk, dst, pos);
    }
    int64_t rows = 0;
    EXPECT_EQ(sketch_mismatches(pr, sk, cpu, &rows), 0) << "of " << rows << " sketch rows, d " << d;
    ASSERT_GT(rows, 10000);

    // Scores of every dense page for every q vector, against the definition on the CPU's codes.
    const dhs::PageLists dense = dhs::dense_page_lists(pr.table_ptrs, 0, pr.seq_len);
    dc::DevicePageLists dense_d(n_req, hkv, dense.nnz());
    dense_d.upload(dense);
    std::vector<uint16_t> qb(pr.q.size());
    for (size_t i = 0; i < qb.size(); ++i) qb[i] = dhs::f32_to_fp16(pr.q[i]);
    auto* q_d = reinterpret_cast<__half*>(to_device(qb));
    int32_t* q_indptr_d = to_device(pr.q_indptr);
    const int q_stride = multi ? group * 5 : group;
    dc::PageSelectWorkspace ws(n_req * hkv, dense.nnz(), q_stride);
    const float scale = 1.0f / std::sqrt(static_cast<float>(d));
    dc::PageSelectParams p = dense_params(dense_d, q_d, q_indptr_d, n_req, hq, hkv, d, scale, ws);
    p.sketch_codes = sk.codes_d();
    p.sketch_steps = sk.steps_d();
    const int default_warps = p.n_score_warps;
    // 8 warps: hundreds of pages per warp (the steady-state prefetch ring, passes across list
    // ends); then the default grid (a page or two per warp here), which the selection below uses.
    for (int warps : {8, default_warps}) {
      const auto g_scores = run_scores(p, warps, q_stride);
      const double l2e = 1.4426950408889634;
      int64_t checked = 0, bad = 0;
      double worst = 0.0;
      for_each_visible_score(pr, dense, p.score_stride, [&](int32_t slot, int row, int hh, int n_vis, int q_len, size_t at) {
        const int8_t* codes = cpu.key_codes(slot);
        const float* st = cpu.key_code_scales(slot);
        const float* q = pr.q.data() + (static_cast<size_t>(row) * hq + hh) * d;
        double qmax = 0.0;
        for (int c = 0; c < d; ++c) qmax = std::max(qmax, static_cast<double>(std::fabs(q[c])));
        double m = -INFINITY, bound = 0.0;
        std::vector<double> x(static_cast<size_t>(n_vis));
        for (int t = 0; t < n_vis; ++t) {
          double acc = 0.0, l1 = 0.0;
          for (int c = 0; c < d; ++c) {
            acc += static_cast<double>(q[c]) * codes[t * d + c];
            l1 += std::abs(codes[t * d + c]);
          }
          x[static_cast<size_t>(t)] = acc * st[t] * scale * l2e;
          m = std::max(m, x[static_cast<size_t>(t)]);
          bound = std::max(bound, scale * l2e * (qmax / 127.0 / 2.0) * l1 * st[t]);
        }
        double z = 0.0;
        for (double v : x) z += std::exp2(v - m);
        const double want = m + std::log2(z / n_vis);
        const double got = g_scores[at];
        const double err = std::fabs(got - want);
        worst = std::max(worst, err / (bound + 1e-4));
        bad += !(err <= bound + 1e-4);
        ++checked;
        // Where every row of the page is visible, the CPU estimator computes the same quantity with
        // the same int8 q (equal integer dot products): equal up to float rounding (1e-3 in log2
        // units for scores of magnitude <= ~30, relative past it).
        if (n_vis == cpu.n_rows(slot) && q_len == 1) {
          const double e = dhs::KeySketchEstimator().score(cpu, slot, q, scale) * scale * l2e;
          bad += std::fabs(e - got) > 1e-3 * std::max(1.0, std::fabs(e) / 30.0);
        }
      });
      EXPECT_EQ(bad, 0) << "of " << checked << " sketch scores off their bound, d " << d << ", " << warps << " warps";
      std::printf("  sketch d %3d, q rows %s, q gain %4.1f, %4d warps: %lld scores, worst error %.2f of its bound\n", d,
                  multi ? "1,5" : "1  ", gain, warps, static_cast<long long>(checked), worst);
    }

    // Coverage on the sketch: every list meets the definition on the device's own masses.
    int32_t* out_indptr = to_device(std::vector<int32_t>(static_cast<size_t>(n_req * hkv + 1), -7));
    int32_t* out_slots = to_device(std::vector<int32_t>(static_cast<size_t>(dense.nnz()), -7));
    int32_t* out_pos = to_device(std::vector<int32_t>(static_cast<size_t>(dense.nnz()), -7));
    float* mass_d = to_device(std::vector<float>(static_cast<size_t>(dense.nnz()), -1.0f));
    for (double gamma : {0.9, 0.99}) {
      p.rule = dc::SelectRule::Coverage;
      p.gamma = static_cast<float>(gamma);
      p.indptr = out_indptr;
      p.slots = out_slots;
      p.page_pos = out_pos;
      p.mass_out = mass_d;
      dc::launch_page_select(p, nullptr);
      DHS_CUDA_CHECK(cudaDeviceSynchronize());
      const auto gi = to_host(out_indptr, static_cast<size_t>(n_req * hkv + 1));
      const auto gpos = to_host(out_pos, static_cast<size_t>(gi.back()));
      const auto gm = to_host(mass_d, static_cast<size_t>(dense.nnz()));
      int viol = 0;
      for (int r = 0; r < n_req; ++r)
        for (int h = 0; h < hkv; ++h) {
          const int row = r * hkv + h, b = dense.row_begin(r, h), n = (dense.row_end(r, h) - dense.row_begin(r, h));
          const std::vector<double> m(gm.begin() + b, gm.begin() + b + n);
          const std::vector<int32_t> set(gpos.begin() + gi[static_cast<size_t>(row)], gpos.begin() + gi[static_cast<size_t>(row) + 1]);
          const std::string why = coverage_violation(m, set, 1, 1, gamma);
          viol += !why.empty();
          if (!why.empty()) ADD_FAILURE() << "sketch coverage " << gamma << ": request " << r << " head " << h << ": " << why;
        }
      std::printf("  sketch d %3d coverage %.2f: %d of %lld pages, %d violations\n", d, gamma, gi.back(),
                  static_cast<long long>(dense.nnz()), viol);
    }

    // A decode step rewrites only its own rows: change each request's last key, sketch just it.
    std::vector<int32_t> dst, pos;
    for (int r = 0; r < n_req; ++r) {
      const int ps = pr.seq_len[static_cast<size_t>(r)] - 1;
      pos.push_back(ps);
      for (int hh = 0; hh < hkv; ++hh) {
        int row;
        const dhs::PageRef ref = pr.tables[static_cast<size_t>(r)]->page_of_token(0, hh, ps, &row);
        dst.push_back(ref.slot);
        float* k = pr.pool->k_page(ref) + row * d;
        for (int j = 0; j < d; ++j) k[j] = round_f16(3.0f * std::cos(0.21f * j + r));
        cpu.rebuild(*pr.pool, ref.slot, row + 1);
      }
    }
    pr.pool_d->upload(*pr.pool);
    sketch_step(pr, sk, dst, pos);
    EXPECT_EQ(sketch_mismatches(pr, sk, cpu, &rows), 0) << "after a decode step, d " << d;
    cudaFree(q_d);
    cudaFree(q_indptr_d);
    cudaFree(out_indptr);
    cudaFree(out_slots);
    cudaFree(out_pos);
    cudaFree(mass_d);
  }
}

// ---- projected key sketch (psketch4:R, sparse/key_basis.h) ---------------------------------

// The device's codes of B (k - mean), its B q and its scores on them equal the CPU definition:
// codes and B q bit for bit (the same fp32 fma chains), scores up to float rounding.
TEST(ProjectedKeySketch, CodesQueriesAndScoresEqualTheCpuDefinition) {
  if (!have_gpu()) GTEST_SKIP() << "no GPU";
  std::mt19937 rng(23);
  // (qa: a query-aware basis, fitted on the problem's own queries: A q differs from C k. Rank 64
  // takes the projection's second output per lane and the score kernel's two k-steps.)
  for (auto [hq, hkv, d, multi, qa, kRank] :
       {std::tuple{32, 8, 128, false, false, 32}, std::tuple{32, 8, 128, true, false, 32}, std::tuple{9, 3, 64, false, false, 32},
        std::tuple{32, 8, 128, false, true, 32}, std::tuple{32, 8, 128, true, false, 64}}) {
    Problem pr = make_problem(hq, hkv, d, seq_lens_17(), q_lens_17(multi), rng);
    const int n_req = static_cast<int>(pr.seq_len.size());
    const int group = hq / hkv;
    auto keys = [&](int, int h, std::vector<float>* rows) {
      for (auto* t : pr.table_ptrs)
        for (int64_t i = 0; i < t->n_pages_per_list(); ++i) {
          const float* kp = pr.pool->k_page(t->page(0, h, i));
          rows->insert(rows->end(), kp, kp + std::min<int64_t>(kPage, t->n_tokens() - i * kPage) * d);
        }
    };
    auto queries = [&](int, int h, std::vector<float>* rows) {
      for (size_t r = 0; r < pr.q.size() / static_cast<size_t>(hq * d); ++r)
        for (int g = 0; g < group; ++g) {
          const float* qv = pr.q.data() + (r * hq + static_cast<size_t>(h * group + g)) * d;
          rows->insert(rows->end(), qv, qv + d);
        }
    };
    auto kb = std::make_shared<dhs::KeyBasis>(qa ? dhs::fit_qk_basis(1, hkv, d, kRank, keys, queries)
                                                 : dhs::fit_key_basis(1, hkv, d, kRank, keys));
    dhs::PageSummaryStore cpu(*pr.pool);
    for (auto* t : pr.table_ptrs)
      for (int h = 0; h < hkv; ++h)
        for (int64_t i = 0; i < t->n_pages_per_list(); ++i)
          cpu.rebuild(*pr.pool, t->page(0, h, i).slot, static_cast<int>(std::min<int64_t>(kPage, t->n_tokens() - i * kPage)), 0, h);
    cpu.set_key_basis(kb, *pr.pool);
    dc::DeviceKeyBasis kb_d(1, hkv, d, kRank, kb->basis(0, 0), kb->mean(0, 0), qa ? kb->query_basis(0, 0) : nullptr);

    // Codes.
    dc::DeviceKeySketch sk(pr.pool->n_pages(), kPage, kRank);
    {
      std::vector<int32_t> dst, pos;
      all_tokens(pr, &dst, &pos);
      sketch_step(pr, sk, dst, pos, &kb_d);
    }
    const auto codes = to_host(sk.codes_d(), sk.code_bytes());
    const auto steps = to_host(sk.steps_d(), static_cast<size_t>(pr.pool->n_pages()) * kPage);
    int64_t rows = 0, bad_rows = 0;
    for (auto* t : pr.table_ptrs)
      for (int h = 0; h < hkv; ++h)
        for (int64_t i = 0; i < t->n_pages_per_list(); ++i) {
          const int32_t slot = t->page(0, h, i).slot;
          for (int r = 0; r < cpu.n_rows(slot); ++r) {
            const uint8_t* row = codes.data() + (static_cast<size_t>(slot) * kPage + r) * (kRank / 2);
            bool ok = steps[static_cast<size_t>(slot) * kPage + r] == cpu.projected_scales(slot)[r];
            for (int j = 0; j < kRank; ++j) ok = ok && dc::sketch_code(row, kRank, j) == cpu.projected_codes(slot)[r * kRank + j];
            bad_rows += !ok;
            ++rows;
          }
        }
    EXPECT_EQ(bad_rows, 0) << "of " << rows << " projected sketch rows, d " << d;
    ASSERT_GT(rows, 5000);

    // B q.
    std::vector<uint16_t> qb(pr.q.size());
    for (size_t i = 0; i < qb.size(); ++i) qb[i] = dhs::f32_to_fp16(pr.q[i]);
    auto* q_d = reinterpret_cast<__half*>(to_device(qb));
    const int n_rows = pr.q_indptr.back();
    auto* qp_d = reinterpret_cast<__half*>(to_device(std::vector<uint16_t>(static_cast<size_t>(n_rows) * hq * kRank, 0)));
    dc::ProjectQueriesParams pq;
    pq.q = q_d;
    pq.qp = qp_d;
    pq.basis = kb_d.query_basis_d(0);
    pq.n_rows = n_rows;
    pq.n_heads_q = hq;
    pq.n_heads_kv = hkv;
    pq.head_dim = d;
    pq.rank = kRank;
    dc::launch_project_queries(pq, nullptr);
    DHS_CUDA_CHECK(cudaDeviceSynchronize());
    const auto qp_got = to_host(reinterpret_cast<const uint16_t*>(qp_d), static_cast<size_t>(n_rows) * hq * kRank);
    int64_t bad_q = 0;
    std::vector<float> qp_cpu(static_cast<size_t>(n_rows) * hq * kRank);
    for (int r = 0; r < n_rows; ++r)
      for (int h = 0; h < hq; ++h) {
        float* out = qp_cpu.data() + (static_cast<size_t>(r) * hq + h) * kRank;
        kb->project_query(0, h / group, pr.q.data() + (static_cast<size_t>(r) * hq + h) * d, out);
        for (int j = 0; j < kRank; ++j) {
          bad_q += dhs::f32_to_fp16(out[j]) != qp_got[(static_cast<size_t>(r) * hq + h) * kRank + j];
          out[j] = dhs::fp16_to_f32(dhs::f32_to_fp16(out[j]));
        }
      }
    EXPECT_EQ(bad_q, 0) << "of " << qp_cpu.size() << " projected q entries, d " << d;

    // Scores on the projected codes, against the definition (every visible row, int8 q of B q).
    const dhs::PageLists dense = dhs::dense_page_lists(pr.table_ptrs, 0, pr.seq_len);
    dc::DevicePageLists dense_d(n_req, hkv, dense.nnz());
    dense_d.upload(dense);
    int32_t* q_indptr_d = to_device(pr.q_indptr);
    const int q_stride = multi ? group * 5 : group;
    dc::PageSelectWorkspace ws(n_req * hkv, dense.nnz(), q_stride);
    const float scale = 1.0f / std::sqrt(static_cast<float>(d));  // attention's scale, not the rank's
    dc::PageSelectParams p = dense_params(dense_d, qp_d, q_indptr_d, n_req, hq, hkv, kRank, scale, ws);
    p.sketch_codes = sk.codes_d();
    p.sketch_steps = sk.steps_d();
    const dhs::ProjectedSketchEstimator est(kRank, 0, qa);
    for (int warps : {8, p.n_score_warps}) {
      const auto g_scores = run_scores(p, warps, q_stride);
      const double l2e = 1.4426950408889634;
      int64_t checked = 0, bad = 0, vs_estimator = 0;
      for_each_visible_score(pr, dense, p.score_stride, [&](int32_t slot, int row, int hh, int n_vis, int q_len, size_t at) {
        const int8_t* c8 = cpu.projected_codes(slot);
        const float* st = cpu.projected_scales(slot);
        const float* qv = qp_cpu.data() + (static_cast<size_t>(row) * hq + hh) * kRank;
        float amax = 0.0f;
        for (int c = 0; c < kRank; ++c) amax = std::max(amax, std::fabs(qv[c]));
        const float qstep = amax / 127.0f;
        double m = -INFINITY;
        std::vector<double> x(static_cast<size_t>(n_vis));
        for (int t = 0; t < n_vis; ++t) {
          int64_t dot = 0;
          for (int c = 0; c < kRank; ++c)
            dot += static_cast<int64_t>(c8[t * kRank + c]) * static_cast<int>(std::clamp(std::nearbyint(qv[c] / qstep), -127.0f, 127.0f));
          x[static_cast<size_t>(t)] = static_cast<double>(dot) * qstep * st[t] * scale * l2e;
          m = std::max(m, x[static_cast<size_t>(t)]);
        }
        double z = 0.0;
        for (double v : x) z += std::exp2(v - m);
        const double want = m + std::log2(z / n_vis);
        const double got = g_scores[at];
        // float rounding of the step products and the device's ex2 / lg2 approximations
        bad += !(std::fabs(got - want) <= 1e-3 * std::max(1.0, std::fabs(want) / 30.0));
        ++checked;
        // Whole pages of one-row requests: the CPU estimator itself (on the same f16 A q).
        if (n_vis == cpu.n_rows(slot) && q_len == 1) {
          const double e = est.score(cpu, slot, qv, scale) * scale * l2e;
          bad += std::fabs(e - got) > 1e-3 * std::max(1.0, std::fabs(e) / 30.0);
          ++vs_estimator;
        }
      });
      EXPECT_EQ(bad, 0) << "of " << checked << " projected sketch scores, d " << d << ", " << warps << " warps";
      std::printf("  %s:%d d %3d, q rows %s, %4d warps: %lld scores (%lld also against the estimator), %lld off\n",
                  qa ? "qsketch4" : "psketch4", kRank, d, multi ? "1,5" : "1  ", warps, static_cast<long long>(checked),
                  static_cast<long long>(vs_estimator), static_cast<long long>(bad));
    }
    cudaFree(q_d);
    cudaFree(qp_d);
    cudaFree(q_indptr_d);
  }
}

// ---- Scores of another launch (a verify's rows selected each on its own, scored once) -----------

// Each request's q rows as requests of one row (row j of request s: its table, tokens up to its own
// position), selected with the scores of one score stage over the requests themselves
// (score_req / score_vec0 / score_indptr), against the same rows scored and selected on their own
// (what llama_cuda's per-row selection launched before): the same masses up to float rounding
// (1e-5 relative: the score kernel sums a page's terms in other warps' company) and the same lists
// but where the masses sit at the cut (a list of the shared scores must still satisfy the rule).
TEST(PageSelect, RowsSelectedFromOneScoringOfTheirSequenceEqualEachRowScoredAlone) {
  if (!have_gpu()) GTEST_SKIP() << "no GPU";
  std::mt19937 rng(31);
  for (auto [hq, hkv, d, sketch] : {std::tuple{32, 8, 128, true}, std::tuple{32, 8, 128, false}, std::tuple{9, 3, 64, true}}) {
    // Verifies of 2-8 rows beside single rows over seq_lens_17's lengths (1-3,000 tokens): a
    // request's last page is partly visible to its earlier rows, or not at all.
    std::vector<int> q_len = {1, 4, 1, 2, 5, 1, 3, 8, 4, 1, 2, 1, 6, 1, 3, 5, 7};
    const std::vector<int> seqs = seq_lens_17();
    for (size_t i = 0; i < q_len.size(); ++i) q_len[i] = std::min(q_len[i], seqs[i]);
    Problem pr = make_problem(hq, hkv, d, seqs, q_len, rng);
    const int n_req = static_cast<int>(pr.seq_len.size());
    const int group = hq / hkv;
    const int max_q = *std::max_element(q_len.begin(), q_len.end());
    dc::DeviceKeySketch sk(pr.pool->n_pages(), kPage, d);
    std::unique_ptr<dc::DevicePageSummaries> sums;
    if (sketch) {
      std::vector<int32_t> dst, pos;
      all_tokens(pr, &dst, &pos);
      sketch_step(pr, sk, dst, pos);
    } else {
      sums = summarize_on_device(pr, dc::SummaryKind::MinMax);
    }
    // The rows as requests.
    std::vector<const dhs::PageTable*> row_tables;
    std::vector<int32_t> row_seq, row_q_indptr = {0}, score_req, vec0;
    for (int s = 0; s < n_req; ++s)
      for (int j = 0; j < q_len[static_cast<size_t>(s)]; ++j) {
        row_tables.push_back(pr.table_ptrs[static_cast<size_t>(s)]);
        row_seq.push_back(pr.seq_len[static_cast<size_t>(s)] - q_len[static_cast<size_t>(s)] + j + 1);
        row_q_indptr.push_back(row_q_indptr.back() + 1);
        score_req.push_back(s);
        vec0.push_back(j * group);
      }
    const int n_rows = static_cast<int>(row_seq.size());
    const dhs::PageLists dense = dhs::dense_page_lists(pr.table_ptrs, 0, pr.seq_len);
    const dhs::PageLists row_dense = dhs::dense_page_lists(row_tables, 0, row_seq);
    dc::DevicePageLists dense_d(n_req, hkv, dense.nnz()), row_dense_d(n_rows, hkv, row_dense.nnz());
    dense_d.upload(dense);
    row_dense_d.upload(row_dense);
    std::vector<uint16_t> qb(pr.q.size());
    for (size_t i = 0; i < qb.size(); ++i) qb[i] = dhs::f32_to_fp16(pr.q[i]);
    auto* q_d = reinterpret_cast<__half*>(to_device(qb));
    int32_t* q_indptr_d = to_device(pr.q_indptr);
    int32_t* row_q_indptr_d = to_device(row_q_indptr);
    int32_t* score_req_d = to_device(score_req);
    int32_t* vec0_d = to_device(vec0);
    const float scale = 1.0f / std::sqrt(static_cast<float>(d));
    const int64_t nnz = std::max(dense.nnz(), row_dense.nnz());
    dc::PageSelectWorkspace ws_alone(n_rows * hkv, row_dense.nnz(), group), ws_once(n_rows * hkv, nnz, group * max_q);
    const size_t n_lists = static_cast<size_t>(n_rows * hkv);
    struct Out {
      int32_t *indptr, *slots, *pos;
      float* mass;
    };
    auto out = [&] {
      return Out{to_device(std::vector<int32_t>(n_lists + 1, -7)), to_device(std::vector<int32_t>(static_cast<size_t>(row_dense.nnz()), -7)),
                 to_device(std::vector<int32_t>(static_cast<size_t>(row_dense.nnz()), -7)),
                 to_device(std::vector<float>(static_cast<size_t>(row_dense.nnz()), -1.0f))};
    };
    const Out alone_out = out(), once_out = out();
    for (auto [rule, gamma, budget] : {std::tuple{dc::SelectRule::Coverage, 0.99f, 0}, std::tuple{dc::SelectRule::Coverage, 0.9f, 0},
                                       std::tuple{dc::SelectRule::TopK, 1.0f, 5}}) {
      auto rows_params = [&](const dc::PageSelectWorkspace& ws, const Out& o) {
        dc::PageSelectParams p = dense_params(row_dense_d, q_d, row_q_indptr_d, n_rows, hq, hkv, d, scale, ws);
        if (sketch) {
          p.sketch_codes = sk.codes_d();
          p.sketch_steps = sk.steps_d();
        } else {
          p.summaries = sums->data_d();
          p.kind = dc::SummaryKind::MinMax;
        }
        p.rule = rule;
        p.gamma = gamma;
        p.budget = budget;
        p.n_sink = 1;
        p.n_recent = 2;
        p.indptr = o.indptr;
        p.slots = o.slots;
        p.page_pos = o.pos;
        p.mass_out = o.mass;
        return p;
      };
      // Each row scored and selected on its own.
      dc::launch_page_select(rows_params(ws_alone, alone_out), nullptr);
      // The requests scored once; the rows selected from those scores.
      dc::PageSelectParams rows = rows_params(ws_once, once_out);
      dc::PageSelectParams scored = rows;
      scored.dense_indptr = dense_d.indptr_d();
      scored.dense_slots = dense_d.slots_d();
      scored.dense_page_pos = dense_d.page_pos_d();
      scored.seq_len = dense_d.seq_len_d();
      scored.q_indptr = q_indptr_d;
      scored.n_requests = n_req;
      dc::launch_page_select_stage(scored, 0, nullptr);
      rows.score_req = score_req_d;
      rows.score_vec0 = vec0_d;
      rows.score_indptr = dense_d.indptr_d();
      dc::launch_page_select_stage(rows, 1, nullptr);
      dc::launch_page_select_stage(rows, 2, nullptr);
      DHS_CUDA_CHECK(cudaDeviceSynchronize());
      const auto a_ind = to_host(alone_out.indptr, n_lists + 1), b_ind = to_host(once_out.indptr, n_lists + 1);
      const auto a_pos = to_host(alone_out.pos, static_cast<size_t>(a_ind[n_lists]));
      const auto b_pos = to_host(once_out.pos, static_cast<size_t>(b_ind[n_lists]));
      const auto b_slots = to_host(once_out.slots, static_cast<size_t>(b_ind[n_lists]));
      const auto a_mass = to_host(alone_out.mass, static_cast<size_t>(row_dense.nnz()));
      const auto b_mass = to_host(once_out.mass, static_cast<size_t>(row_dense.nnz()));
      int differ = 0, mass_bad = 0, scored_lists = 0;
      for (int r = 0; r < n_rows; ++r)
        for (int h = 0; h < hkv; ++h) {
          const size_t row = static_cast<size_t>(r * hkv + h);
          const int b = row_dense.row_begin(r, h), n = row_dense.row_end(r, h) - b;
          const std::vector<int32_t> ga(a_pos.begin() + a_ind[row], a_pos.begin() + a_ind[row + 1]);
          const std::vector<int32_t> gb(b_pos.begin() + b_ind[row], b_pos.begin() + b_ind[row + 1]);
          for (size_t i = 0; i < gb.size(); ++i)
            EXPECT_EQ(b_slots[static_cast<size_t>(b_ind[row]) + i], row_tables[static_cast<size_t>(r)]->page(0, h, gb[i]).slot);
          const bool scored_list = n > 3 && !(rule == dc::SelectRule::TopK && budget >= n);
          scored_lists += scored_list;
          if (scored_list)
            for (int i = 0; i < n; ++i) {
              const double x = a_mass[static_cast<size_t>(b + i)], y = b_mass[static_cast<size_t>(b + i)];
              mass_bad += !(std::fabs(x - y) <= 1e-5 * std::max(x, y) + 1e-9);
            }
          if (ga == gb) continue;
          ++differ;
          if (rule == dc::SelectRule::Coverage) {
            std::vector<double> m(b_mass.begin() + b, b_mass.begin() + b + n);
            const std::string why = coverage_violation(m, gb, 1, 2, gamma);
            EXPECT_TRUE(why.empty()) << "row " << r << " head " << h << ": " << why;
          }
        }
      EXPECT_EQ(mass_bad, 0) << "hq " << hq << " d " << d << (sketch ? " sketch4" : " minmax") << ": masses off each row's own";
      EXPECT_LE(differ, static_cast<int>(n_lists) / 50) << "lists differing from each row's own";
      EXPECT_GT(scored_lists, static_cast<int>(n_lists) / 2);
      std::printf("  %s hq %2d d %3d rule %d gamma %.2f: %d rows, %lld pages chosen once / %lld alone, %d lists differ\n",
                  sketch ? "sketch4" : "minmax ", hq, d, static_cast<int>(rule), gamma, n_rows,
                  static_cast<long long>(b_ind[n_lists]), static_cast<long long>(a_ind[n_lists]), differ);
    }
    for (const Out& o : {alone_out, once_out}) {
      cudaFree(o.indptr);
      cudaFree(o.slots);
      cudaFree(o.pos);
      cudaFree(o.mass);
    }
    for (void* x : {static_cast<void*>(q_d), static_cast<void*>(q_indptr_d), static_cast<void*>(row_q_indptr_d),
                    static_cast<void*>(score_req_d), static_cast<void*>(vec0_d)})
      cudaFree(x);
  }
}

}  // namespace
