// The recall-ahead schedule on the device (backend/cuda/tier_split.h) against its CPU statement
// (kv/tier_split.h and cpu::attention with merge_normalized):
//  - the split of lists whose slots name either tier equals split_lists_by_tier's, int for int,
//    on awkward shapes: 1 to 2,500 rows (the scan's 1,024-row tiles), rows of 0 to 900 entries
//    (the scatter's 256-entry tiles), all resident, all late, mixed, in random order; the late
//    reads' log counts every late entry and holds late entries only, up to its capacity, and the
//    resident reads' record stamps exactly the device slots read and lists each of them once;
//  - decode attention over the resident part from the HBM pool and over the late part from the
//    host tier's mapped pinned pages, merged by merge_late_attention, against the CPU's attention
//    over the whole list (the same f16-rounded values), GQA 32/8 d128 and 9/3 d64, q_len 1 and 4;
//    rows with no late page come out bit-equal to the resident part's own output;
// (Captured in a graph, with the late set changing from step to step, they run in the engine's
// decode steps: test_cuda_tiers.)
// Tolerance (outputs): |gpu - ref| <= 2e-3 + 6e-3 |ref| — test_decode_attention's bound
// (1.5e-3 + 4e-3 |ref|, the kernel's own f16 roundings) plus one more f16 rounding of each
// part's output before the merge (2^-11 relative, twice); LSE within 2e-3.
// DHS_TEST_QUICK=1 (the sanitizer runs): fewer and smaller cases.
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

#include "backend/cpu/attention.h"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/decode_attention.h"
#include "backend/cuda/device_page_pool.h"
#include "backend/cuda/page_recall.h"
#include "backend/cuda/prefill_attention.h"
#include "backend/cuda/tier_split.h"
#include "core/fp16.h"
#include "device_vectors.h"
#include "gtest_shim.h"
#include "kv/page_lists.h"
#include "kv/page_pool.h"
#include "kv/tier_split.h"

namespace {

namespace dc = dhs::cuda;
using dhs::PageLists;
using dhs::PageRef;
using dhs::Tier;
using dhs::test::to_device;
using dhs::test::to_host;

constexpr int kPage = 16;

bool have_gpu() { return dc::device_count() > 0; }
bool quick() {
  const char* e = std::getenv("DHS_TEST_QUICK");
  return e != nullptr && e[0] != '\0' && e[0] != '0';
}

// Random lists of keys: n_rows rows of 0..max_len entries (some rows empty, all resident, all
// late), slots in [0, 5000) of the device pool (kDev slots) or the host tier by a coin of
// probability p_late.
constexpr int64_t kDev = 5000;
PageLists random_encoded_lists(int n_rows, int max_len, std::mt19937& rng) {
  PageLists L;
  L.n_requests = n_rows;
  L.n_heads_kv = 1;
  L.seq_len.assign(static_cast<size_t>(n_rows), 1);
  L.indptr = {0};
  for (int r = 0; r < n_rows; ++r) {
    const int kind = static_cast<int>(rng() % 8);
    const int len = kind == 0 ? 0 : static_cast<int>(rng() % static_cast<unsigned>(max_len + 1));
    const double p_late = kind == 1 ? 0.0 : kind == 2 ? 1.0 : (rng() % 1000) / 1000.0;
    for (int i = 0; i < len; ++i) {
      const int32_t slot = static_cast<int32_t>(rng() % 5000);
      const bool late = (rng() % 1000) / 1000.0 < p_late;
      L.slots.push_back(dhs::tier_key({late ? Tier::Host : Tier::Device, slot}, kDev));
      L.page_pos.push_back(static_cast<int32_t>(rng() % 100000));
    }
    L.indptr.push_back(static_cast<int32_t>(L.slots.size()));
  }
  return L;
}

TEST(TierSplit, EqualsTheCpuStatement) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  std::mt19937 rng(5);
  const std::vector<std::pair<int, int>> shapes =
      quick() ? std::vector<std::pair<int, int>>{{1, 7}, {37, 300}, {1100, 40}}
              : std::vector<std::pair<int, int>>{{1, 0}, {1, 7}, {1, 900}, {37, 300}, {256, 64}, {1024, 20}, {1025, 33}, {2500, 90}};
  for (const auto& [n_rows, max_len] : shapes) {
    const PageLists in = random_encoded_lists(n_rows, max_len, rng);
    PageLists dev, late;
    dhs::split_lists_by_tier(in, kDev, &dev, &late);
    int32_t* indptr_d = to_device(in.indptr);
    int32_t* slots_d = to_device(in.slots);
    int32_t* pos_d = to_device(in.page_pos);
    dc::TierSplitLists out(n_rows, in.nnz());
    // The late reads' log, one entry short of them when there are any (the count still counts
    // every one; the entries past the cap are dropped).
    const int cap = std::max<int>(1, static_cast<int>(late.nnz()) - 1);
    int32_t* log_d = nullptr;
    DHS_CUDA_CHECK(cudaMalloc(&log_d, static_cast<size_t>(3 * cap + 1) * 4));
    DHS_CUDA_CHECK(cudaMemset(log_d + 3 * cap, 0, 4));
    // And the resident reads' record: last_use[slot] = the stamp (5) for every device entry.
    int32_t* last_use_d = nullptr;
    DHS_CUDA_CHECK(cudaMalloc(&last_use_d, static_cast<size_t>(kDev + 1) * 4));
    DHS_CUDA_CHECK(cudaMemset(last_use_d, 0, static_cast<size_t>(kDev + 1) * 4));
    const int32_t stamp = 5;
    DHS_CUDA_CHECK(cudaMemcpy(last_use_d + kDev, &stamp, 4, cudaMemcpyHostToDevice));
    int32_t* read_d = nullptr;  // [kDev] then the count
    DHS_CUDA_CHECK(cudaMalloc(&read_d, static_cast<size_t>(kDev + 1) * 4));
    DHS_CUDA_CHECK(cudaMemset(read_d + kDev, 0, 4));
    dc::split_lists_by_tier(indptr_d, slots_d, pos_d, n_rows, kDev, out, nullptr,
                            dc::TierSplitLog{log_d, log_d + 3 * cap, cap, 7, last_use_d, last_use_d + kDev, read_d,
                                             read_d + kDev, static_cast<int>(kDev)});
    DHS_CUDA_CHECK(cudaDeviceSynchronize());
    {
      std::vector<int32_t> want_use(static_cast<size_t>(kDev), 0);
      for (int32_t slot : dev.slots) want_use[static_cast<size_t>(slot)] = stamp;
      EXPECT_TRUE(to_host(last_use_d, static_cast<size_t>(kDev)) == want_use) << "the resident reads' record";
      // Each slot read listed once.
      std::vector<int32_t> want_read = dev.slots;
      std::sort(want_read.begin(), want_read.end());
      want_read.erase(std::unique(want_read.begin(), want_read.end()), want_read.end());
      const int32_t n_read = to_host(read_d + kDev, 1)[0];
      std::vector<int32_t> got_read = to_host(read_d, static_cast<size_t>(std::max(0, n_read)));
      std::sort(got_read.begin(), got_read.end());
      EXPECT_TRUE(got_read == want_read) << "the slots read, each once";
    }
    cudaFree(last_use_d);
    cudaFree(read_d);
    {
      const std::vector<int32_t> log = to_host(log_d, static_cast<size_t>(3 * cap + 1));
      EXPECT_EQ(log[static_cast<size_t>(3 * cap)], static_cast<int32_t>(late.nnz())) << "late reads counted";
      // Every logged entry is a late entry of its row (layer 7), each at most as often as it is one.
      std::vector<std::pair<int32_t, int32_t>> want_entries, got_entries;
      for (int r = 0; r < n_rows; ++r)
        for (int32_t k = late.indptr[static_cast<size_t>(r)]; k < late.indptr[static_cast<size_t>(r) + 1]; ++k)
          want_entries.push_back({r, late.page_pos[static_cast<size_t>(k)]});
      const int logged = std::min<int>(cap, static_cast<int>(late.nnz()));
      for (int i = 0; i < logged; ++i) {
        EXPECT_EQ(log[static_cast<size_t>(3 * i + 1)], 7);
        got_entries.push_back({log[static_cast<size_t>(3 * i)], log[static_cast<size_t>(3 * i + 2)]});
      }
      std::sort(want_entries.begin(), want_entries.end());
      std::sort(got_entries.begin(), got_entries.end());
      EXPECT_TRUE(std::includes(want_entries.begin(), want_entries.end(), got_entries.begin(), got_entries.end()))
          << "a logged entry is not a late read";
    }
    cudaFree(log_d);
    const std::string at = std::to_string(n_rows) + " rows of <= " + std::to_string(max_len);
    EXPECT_TRUE(to_host(out.dev_indptr(), in.indptr.size()) == dev.indptr) << at << ": resident indptr";
    EXPECT_TRUE(to_host(out.late_indptr(), in.indptr.size()) == late.indptr) << at << ": late indptr";
    EXPECT_TRUE(to_host(out.dev_slots(), dev.slots.size()) == dev.slots) << at << ": resident slots";
    EXPECT_TRUE(to_host(out.dev_page_pos(), dev.page_pos.size()) == dev.page_pos) << at << ": resident positions";
    EXPECT_TRUE(to_host(out.late_slots(), late.slots.size()) == late.slots) << at << ": late slots";
    EXPECT_TRUE(to_host(out.late_page_pos(), late.page_pos.size()) == late.page_pos) << at << ": late positions";
    {  // late_keys (a part to be landed, then split again): the late entries as keys, the rest the same
      dc::TierSplitLists keyed(n_rows, in.nnz());
      dc::split_lists_by_tier(indptr_d, slots_d, pos_d, n_rows, kDev, keyed, nullptr, {}, /*late_keys=*/true);
      DHS_CUDA_CHECK(cudaDeviceSynchronize());
      std::vector<int32_t> want_keys = late.slots;
      for (int32_t& k : want_keys) k += static_cast<int32_t>(kDev);
      EXPECT_TRUE(to_host(keyed.late_slots(), late.slots.size()) == want_keys) << at << ": late keys";
      EXPECT_TRUE(to_host(keyed.late_indptr(), in.indptr.size()) == late.indptr) << at << ": late indptr (keys)";
      EXPECT_TRUE(to_host(keyed.dev_slots(), dev.slots.size()) == dev.slots) << at << ": resident slots (keys)";
      EXPECT_TRUE(to_host(keyed.late_page_pos(), late.page_pos.size()) == late.page_pos) << at << ": late positions (keys)";
    }
    cudaFree(indptr_d);
    cudaFree(slots_d);
    cudaFree(pos_d);
  }
}

// One attention problem with its pages in both tiers: `whole` (fp32, f16-rounded values) holds
// every page at its logical slot; each page lives in the HBM pool or the host tier at that slot.
struct TwoTierProblem {
  int n_heads_q, n_heads_kv, head_dim;
  std::vector<int32_t> seq_len, q_indptr;
  std::unique_ptr<dhs::PagePool> whole;
  PageLists ref_lists;      // slots of `whole`
  PageLists encoded_lists;  // the same entries, slots as keys (tier_key over the whole pool's size)
  std::vector<float> q;
  std::vector<uint16_t> k_dev, v_dev, k_host, v_host;  // f16 bits of each tier's pool
};

float round_f16(float x) { return dhs::fp16_to_f32(dhs::f32_to_fp16(x)); }

TwoTierProblem make_problem(int hq, int hkv, int d, const std::vector<int32_t>& seq_len, const std::vector<int>& q_len,
                            std::mt19937& rng) {
  TwoTierProblem p{hq, hkv, d, seq_len, {0}, nullptr, {}, {}, {}, {}, {}, {}, {}};
  for (int ql : q_len) p.q_indptr.push_back(p.q_indptr.back() + ql);
  int64_t n_pages = 0;
  for (int s : seq_len) n_pages += static_cast<int64_t>((s + kPage - 1) / kPage) * hkv;
  p.whole = std::make_unique<dhs::PagePool>(Tier::Device, n_pages, kPage, d);
  const size_t pe = static_cast<size_t>(kPage) * static_cast<size_t>(d);
  for (auto* v : {&p.k_dev, &p.v_dev, &p.k_host, &p.v_host}) v->assign(static_cast<size_t>(n_pages) * pe, 0x7e00);  // NaN
  std::vector<int32_t> perm(static_cast<size_t>(n_pages));
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), rng);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  size_t next = 0;
  for (PageLists* L : {&p.ref_lists, &p.encoded_lists}) {
    L->n_requests = static_cast<int>(seq_len.size());
    L->n_heads_kv = hkv;
    L->seq_len = seq_len;
    L->indptr = {0};
  }
  for (size_t r = 0; r < seq_len.size(); ++r)
    for (int h = 0; h < hkv; ++h) {
      const int n_pg = (seq_len[r] + kPage - 1) / kPage;
      // The row's late share: none, all, or a random one.
      const int kind = static_cast<int>(rng() % 4);
      const double p_late = kind == 0 ? 0.0 : kind == 1 ? 1.0 : 0.5;
      for (int i = 0; i < n_pg; ++i) {
        const int32_t slot = perm[next++];
        const bool late = (rng() % 1000) / 1000.0 < p_late;
        float* kp = p.whole->k_page({Tier::Device, slot});
        float* vp = p.whole->v_page({Tier::Device, slot});
        auto& kt = late ? p.k_host : p.k_dev;
        auto& vt = late ? p.v_host : p.v_dev;
        for (size_t e = 0; e < pe; ++e) {
          const bool valid = i * kPage + static_cast<int>(e / static_cast<size_t>(d)) < seq_len[r];
          kp[e] = valid ? round_f16(u(rng)) : 0.0f;
          vp[e] = valid ? round_f16(u(rng)) : 0.0f;
          kt[static_cast<size_t>(slot) * pe + e] = dhs::f32_to_fp16(kp[e]);
          vt[static_cast<size_t>(slot) * pe + e] = dhs::f32_to_fp16(vp[e]);
        }
        if (rng() % 10 < 3 && i + 1 < n_pg) continue;  // (not listed; the last page always is)
        p.ref_lists.slots.push_back(slot);
        p.encoded_lists.slots.push_back(dhs::tier_key({late ? Tier::Host : Tier::Device, slot}, n_pages));
        p.ref_lists.page_pos.push_back(i);
        p.encoded_lists.page_pos.push_back(i);
      }
      p.ref_lists.indptr.push_back(static_cast<int32_t>(p.ref_lists.slots.size()));
      p.encoded_lists.indptr.push_back(static_cast<int32_t>(p.encoded_lists.slots.size()));
    }
  std::uniform_real_distribution<float> uq(-3.0f, 3.0f);
  p.q.resize(static_cast<size_t>(p.q_indptr.back()) * hq * d);
  for (auto& x : p.q) x = round_f16(uq(rng));
  return p;
}

struct Outputs {
  std::vector<float> out, lse;       // merged
  std::vector<float> dev_only;       // the resident part's own output (before the merge)
  std::vector<int32_t> late_indptr;  // the split's
};

// Split, attention over each tier, merge. Decode attention, or (prefill) the prefill kernel over
// each part as LlamaCuda::attention_prefill runs it: the resident part with the default kernel
// (wgmma at d128 on sm_90a), the late part with the mma.sync kernel.
Outputs run_gpu(const TwoTierProblem& p, int max_q, bool prefill = false) {
  const int n_req = static_cast<int>(p.seq_len.size()), n_rows = n_req * p.n_heads_kv;
  const int64_t n_pages = p.whole->n_pages();
  dc::DevicePagePool dev(n_pages, kPage, p.head_dim);
  dc::HostPagePool host(n_pages, kPage, p.head_dim);
  const size_t bytes = p.k_dev.size() * sizeof(uint16_t);
  DHS_CUDA_CHECK(cudaMemcpy(dev.k_d(), p.k_dev.data(), bytes, cudaMemcpyHostToDevice));
  DHS_CUDA_CHECK(cudaMemcpy(dev.v_d(), p.v_dev.data(), bytes, cudaMemcpyHostToDevice));
  std::copy(p.k_host.begin(), p.k_host.end(), reinterpret_cast<uint16_t*>(host.k_h()));
  std::copy(p.v_host.begin(), p.v_host.end(), reinterpret_cast<uint16_t*>(host.v_h()));
  int32_t* indptr_d = to_device(p.encoded_lists.indptr);
  int32_t* slots_d = to_device(p.encoded_lists.slots);
  int32_t* pos_d = to_device(p.encoded_lists.page_pos);
  int32_t* seq_d = to_device(p.seq_len);
  int32_t* q_indptr_d = to_device(p.q_indptr);
  std::vector<uint16_t> qh(p.q.size());
  for (size_t i = 0; i < p.q.size(); ++i) qh[i] = dhs::f32_to_fp16(p.q[i]);
  __half* q_d = reinterpret_cast<__half*>(to_device(qh));
  const size_t n_vec = p.q.size() / static_cast<size_t>(p.head_dim);
  __half *out_d = nullptr, *late_out_d = nullptr;
  float *lse_d = nullptr, *late_lse_d = nullptr;
  DHS_CUDA_CHECK(cudaMalloc(&out_d, p.q.size() * 2));
  DHS_CUDA_CHECK(cudaMalloc(&late_out_d, p.q.size() * 2));
  DHS_CUDA_CHECK(cudaMalloc(&lse_d, n_vec * 4));
  DHS_CUDA_CHECK(cudaMalloc(&late_lse_d, n_vec * 4));
  dc::TierSplitLists split(n_rows, p.encoded_lists.nnz());
  dc::DecodeAttentionWorkspace ws(n_req, p.n_heads_q, p.n_heads_kv, p.head_dim, max_q);
  dc::DecodeAttentionArgs a;
  a.q_d = q_d;
  a.q_indptr_d = q_indptr_d;
  a.max_q_len = max_q;
  a.scale = 1.0f / std::sqrt(static_cast<float>(p.head_dim));
  Outputs o;
  dc::split_lists_by_tier(indptr_d, slots_d, pos_d, n_rows, n_pages, split, nullptr);
  dc::PrefillAttentionParams pp{.q = q_d, .q_indptr = q_indptr_d, .seq_len = seq_d, .n_requests = n_req,
                                .n_rows = p.q_indptr.back(), .n_heads_q = p.n_heads_q, .n_heads_kv = p.n_heads_kv,
                                .head_dim = p.head_dim, .page_size = kPage, .scale = a.scale};
  a.out_d = out_d;
  a.lse_d = lse_d;
  if (prefill) {
    dc::PrefillAttentionParams d = pp;
    d.out = out_d;
    d.lse = lse_d;
    d.k_pool = dev.k_d();
    d.v_pool = dev.v_d();
    d.kv_indptr = split.dev_indptr();
    d.slots = split.dev_slots();
    d.page_pos = split.dev_page_pos();
    dc::launch_prefill_attention(d, nullptr);
  } else {
    dc::decode_attention(a, dc::DecodeListsView{split.dev_indptr(), split.dev_slots(), split.dev_page_pos(), seq_d, n_req, p.n_heads_kv},
                         dev.view(), ws, nullptr);
  }
  DHS_CUDA_CHECK(cudaDeviceSynchronize());
  o.dev_only = dhs::test::to_host_floats(out_d, p.q.size(), false);
  a.out_d = late_out_d;
  a.lse_d = late_lse_d;
  if (prefill) {
    dc::PrefillAttentionParams l = pp;
    l.out = late_out_d;
    l.lse = late_lse_d;
    l.k_pool = host.view().k;
    l.v_pool = host.view().v;
    l.kv_indptr = split.late_indptr();
    l.slots = split.late_slots();
    l.page_pos = split.late_page_pos();
    dc::launch_prefill_attention(l, nullptr, dc::PrefillKernel{.wgmma = false});
  } else {
    dc::decode_attention(a, dc::DecodeListsView{split.late_indptr(), split.late_slots(), split.late_page_pos(), seq_d, n_req, p.n_heads_kv},
                         host.view(), ws, nullptr);
  }
  dc::merge_late_attention({out_d, lse_d, late_out_d, late_lse_d, static_cast<int>(n_vec), p.head_dim}, nullptr);
  DHS_CUDA_CHECK(cudaDeviceSynchronize());
  o.out = dhs::test::to_host_floats(out_d, p.q.size(), false);
  o.lse = to_host(lse_d, n_vec);
  o.late_indptr = to_host(split.late_indptr(), static_cast<size_t>(n_rows) + 1);
  for (void* ptr : std::initializer_list<void*>{indptr_d, slots_d, pos_d, seq_d, q_indptr_d, q_d, out_d, late_out_d, lse_d, late_lse_d})
    cudaFree(ptr);
  return o;
}

// Tolerances: decode's (the header) by default; prefill's are test_prefill_attention's bounds,
// 2.5e-3 (1 + |ref|) per part, plus one f16 rounding of each part's output before the merge
// (2^-11 relative, twice): 3.5e-3 (1 + |ref|); its LSE, fp32 throughout, 1e-4 (1 + |ref|) per part
// and the merge's log-sum-exp in fp32: 2e-4 (1 + |ref|).
struct Tolerance {
  double abs = 2e-3, rel = 6e-3, lse_abs = 2e-3, lse_rel = 0.0;
};
constexpr Tolerance kPrefillTol{3.5e-3, 3.5e-3, 2e-4, 2e-4};

void check_against_cpu(const TwoTierProblem& p, const Outputs& o, const Tolerance& tol = {}) {
  std::vector<float> ref(p.q.size()), ref_lse(p.q.size() / static_cast<size_t>(p.head_dim));
  dhs::cpu::AttentionParams cp;
  cp.q = p.q.data();
  cp.out = ref.data();
  cp.lse = ref_lse.data();
  cp.q_indptr = p.q_indptr.data();
  cp.lists = &p.ref_lists;
  cp.pool = p.whole.get();
  cp.n_heads_q = p.n_heads_q;
  cp.n_heads_kv = p.n_heads_kv;
  cp.head_dim = p.head_dim;
  cp.scale = 1.0f / std::sqrt(static_cast<float>(p.head_dim));
  dhs::cpu::attention(cp);
  const int group = p.n_heads_q / p.n_heads_kv;
  int64_t bad = 0, no_late_rows = 0;
  for (size_t r = 0; r + 1 < p.q_indptr.size(); ++r)
    for (int row = p.q_indptr[r]; row < p.q_indptr[r + 1]; ++row)
      for (int h = 0; h < p.n_heads_q; ++h) {
        const size_t v = static_cast<size_t>(row) * p.n_heads_q + h;
        const size_t list = r * static_cast<size_t>(p.n_heads_kv) + static_cast<size_t>(h / group);
        const bool any_late = o.late_indptr[list + 1] > o.late_indptr[list];
        no_late_rows += !any_late;
        for (int j = 0; j < p.head_dim; ++j) {
          const size_t e = v * static_cast<size_t>(p.head_dim) + static_cast<size_t>(j);
          if (!(std::fabs(o.out[e] - ref[e]) <= tol.abs + tol.rel * std::fabs(ref[e]))) ++bad;
          if (!any_late && o.out[e] != o.dev_only[e]) ++bad;  // nothing late: untouched, bit for bit
        }
        if (ref_lse[v] == -INFINITY ? o.lse[v] != -INFINITY
                                    : !(std::fabs(o.lse[v] - ref_lse[v]) <= tol.lse_abs + tol.lse_rel * std::fabs(ref_lse[v])))
          ++bad;
      }
  EXPECT_EQ(bad, 0) << "elements outside the tolerance";
  EXPECT_GT(no_late_rows, 0) << "the problem should have rows with no late page";
}

TEST(TierSplit, AttentionOverBothTiersMergedEqualsTheCpu) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  std::mt19937 rng(11);
  struct Shape {
    int hq, hkv, d, max_q;
    std::vector<int32_t> seq_len;
    std::vector<int> q_len;
  };
  std::vector<Shape> shapes = {{32, 8, 128, 1, {97, 1, 300, 33}, {1, 1, 1, 1}},
                               {9, 3, 64, 4, {200, 17, 64, 5, 129}, {4, 1, 4, 2, 1}}};
  if (!quick()) shapes.push_back({32, 8, 128, 4, {4000, 2500, 777}, {4, 4, 1}});
  for (const Shape& s : shapes) {
    const TwoTierProblem p = make_problem(s.hq, s.hkv, s.d, s.seq_len, s.q_len, rng);
    check_against_cpu(p, run_gpu(p, s.max_q));
  }
}

// Prefill over both tiers (LlamaCuda::attention_prefill with the host tier: a prompt chunk on top
// of a prefix whose pages are partly offloaded): chunks of 1 to 130 rows, causal, GQA 32/8 d128
// and 9/3 d64, rows all resident, all late and mixed.
TEST(TierSplit, PrefillOverBothTiersMergedEqualsTheCpu) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  std::mt19937 rng(23);
  struct Shape {
    int hq, hkv, d;
    std::vector<int32_t> seq_len;
    std::vector<int> q_len;
  };
  std::vector<Shape> shapes = {{32, 8, 128, {97, 40, 300, 17}, {97, 1, 130, 16}},
                               {9, 3, 64, {200, 17, 64, 129}, {37, 17, 1, 64}}};
  if (!quick()) shapes.push_back({32, 8, 128, {4000, 2500, 777}, {128, 100, 3}});
  for (const Shape& s : shapes) {
    const TwoTierProblem p = make_problem(s.hq, s.hkv, s.d, s.seq_len, s.q_len, rng);
    check_against_cpu(p, run_gpu(p, 1, /*prefill=*/true), kPrefillTol);
  }
}

TEST(TierSplit, MergeLeavesRowsWithoutLatePagesAndTakesRowsWithOnlyLatePages) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  // Two vectors of d 64: (a) no late part (lse -inf): unchanged bit for bit; (b) no resident part:
  // the late part's output and LSE; and (c) both with equal LSE: the mean.
  const int d = 64, n = 3;
  std::vector<uint16_t> a(static_cast<size_t>(n * d)), b(static_cast<size_t>(n * d));
  for (int i = 0; i < n * d; ++i) {
    a[static_cast<size_t>(i)] = dhs::f32_to_fp16(0.25f + 0.001f * static_cast<float>(i));
    b[static_cast<size_t>(i)] = dhs::f32_to_fp16(-0.5f + 0.002f * static_cast<float>(i));
  }
  const std::vector<float> la = {1.5f, -INFINITY, 0.75f}, lb = {-INFINITY, 2.0f, 0.75f};
  __half* a_d = reinterpret_cast<__half*>(to_device(a));
  __half* b_d = reinterpret_cast<__half*>(to_device(b));
  float* la_d = to_device(la);
  float* lb_d = to_device(lb);
  dc::merge_late_attention({a_d, la_d, b_d, lb_d, n, d}, nullptr);
  DHS_CUDA_CHECK(cudaDeviceSynchronize());
  const std::vector<uint16_t> got = to_host(reinterpret_cast<uint16_t*>(a_d), a.size());
  const std::vector<float> lse = to_host(la_d, 3);
  for (int j = 0; j < d; ++j) {
    EXPECT_EQ(got[static_cast<size_t>(j)], a[static_cast<size_t>(j)]);
    EXPECT_EQ(got[static_cast<size_t>(d + j)], b[static_cast<size_t>(d + j)]);
    const float mean = 0.5f * (dhs::fp16_to_f32(a[static_cast<size_t>(2 * d + j)]) + dhs::fp16_to_f32(b[static_cast<size_t>(2 * d + j)]));
    EXPECT_NEAR(dhs::fp16_to_f32(got[static_cast<size_t>(2 * d + j)]), mean, 1e-3);
  }
  EXPECT_EQ(lse[0], 1.5f);
  EXPECT_EQ(lse[1], 2.0f);
  EXPECT_NEAR(lse[2], 0.75f + std::log(2.0f), 1e-6);
  for (void* ptr : std::initializer_list<void*>{a_d, b_d, la_d, lb_d}) cudaFree(ptr);
}

}  // namespace
