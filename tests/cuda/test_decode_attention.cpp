// CUDA decode attention vs the CPU reference (cpu::attention) on awkward shapes:
// 17 requests, 97 tokens, last pages 3/16 full, per-head page lists of length 0..N
// (random subsets, empty lists), q_len 1, 5, 8 and mixed, GQA 32/8 d128 and 9/3 d64,
// plus CUDA-graph capture replayed over lists of other lengths.
//
// GTest binary through gtest_shim.h (ctest label cuda; with -DDHS_NO_GTEST a plain executable
// with the same TESTs, for the device machine, which has no GTest): one TEST per case, each
// skipped where there is no GPU. DHS_TEST_QUICK=1 skips the long-context cases (for
// compute-sanitizer runs).
//
// Tolerance, per output element: |gpu - ref| <= 1.5e-3 + 4e-3 * |ref|, every element.
// The reference runs in fp32 on the SAME f16-rounded q, k, v, so only the kernel's own
// rounding remains: (1) the output is stored as f16: <= 2^-11 |ref| (inside the 4e-3 rtol,
// which also covers a split's partial output stored once more); (2) P is rounded to f16
// before the P V product. The denominator sums the same rounded weights, so
// out = sum w~_i v_i with w~_i = w_i (1 + e_i), |e_i| <= 2^-11, and
// |out - ref| <= 2^-11 * max_i |v_i - ref| <= 2^-11 * 2 = 9.8e-4 for |v| <= 1 (inside atol).
// fp32 accumulation order and exp2f vs expf add ~1e-6. LSE: |gpu - ref| <= 1.5e-3 (the same
// 2^-11 relative error of the denominator, as a log), and -inf exactly where ref is -inf.
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "backend/cpu/attention.h"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/decode_attention.h"
#include "backend/cuda/device_page_pool.h"
#include "core/fp16.h"
#include "gtest_shim.h"
#include "kv/page_lists.h"
#include "kv/page_pool.h"

namespace {

using dhs::PageLists;
using dhs::PagePool;

constexpr int kPage = 16;
constexpr double kAtol = 1.5e-3, kRtol = 4e-3, kLseAtol = 1.5e-3;

float round_f16(float x) { return dhs::fp16_to_f32(dhs::f32_to_fp16(x)); }

enum class ListKind { Dense, Sparse, SparseShuffled, Empty };

struct Case {
  std::string name;
  int n_heads_q, n_heads_kv, head_dim;
  std::vector<int> seq_len;
  std::vector<int> q_len;
  ListKind lists;
  int min_pages_per_worker = 8;
  float q_amp = 3.0f;  // q ~ U(-q_amp, q_amp): larger makes attention peakier
  // Row masks on the entries (a verify's rows over the union of their own lists): each row's bit
  // set with probability 0.6, so some entries are read by no row and some rows read nothing.
  bool row_masks = false;
};

// Host side of one problem: pool (f16-rounded fp32), page ids per (request, head), q.
struct Problem {
  int n_requests = 0, n_heads_q = 0, n_heads_kv = 0, head_dim = 0;
  std::vector<int32_t> seq_len, q_indptr;
  std::vector<std::vector<int32_t>> slots_of;  // [req * n_heads_kv + h][logical page] -> slot
  std::unique_ptr<PagePool> pool;
  std::vector<float> q;  // [n_rows, n_heads_q, head_dim], f16-rounded
};

Problem make_problem(const Case& c, std::mt19937& rng) {
  Problem pr;
  pr.n_requests = static_cast<int>(c.seq_len.size());
  pr.n_heads_q = c.n_heads_q;
  pr.n_heads_kv = c.n_heads_kv;
  pr.head_dim = c.head_dim;
  pr.seq_len.assign(c.seq_len.begin(), c.seq_len.end());
  pr.q_indptr.assign(1, 0);
  for (int r = 0; r < pr.n_requests; ++r) pr.q_indptr.push_back(pr.q_indptr.back() + c.q_len[r]);
  int64_t n_pages = 0;
  for (int s : c.seq_len) n_pages += static_cast<int64_t>((s + kPage - 1) / kPage) * c.n_heads_kv;
  n_pages += 7;  // spare slots nobody lists
  pr.pool = std::make_unique<PagePool>(dhs::Tier::Device, n_pages, kPage, c.head_dim);
  // Pages of a request's heads are scattered over the pool, as after many allocations.
  std::vector<int32_t> perm(static_cast<size_t>(n_pages));
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), rng);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  const float nan = std::nanf("");
  size_t next = 0;
  const int d = c.head_dim;
  for (int r = 0; r < pr.n_requests; ++r)
    for (int h = 0; h < c.n_heads_kv; ++h) {
      std::vector<int32_t> ids;
      const int n_pg = (c.seq_len[r] + kPage - 1) / kPage;
      for (int i = 0; i < n_pg; ++i) {
        const int32_t slot = perm[next++];
        ids.push_back(slot);
        float* kp = pr.pool->k_page(dhs::PageRef{dhs::Tier::Device, slot});
        float* vp = pr.pool->v_page(dhs::PageRef{dhs::Tier::Device, slot});
        for (int t = 0; t < kPage; ++t) {
          const bool valid = i * kPage + t < c.seq_len[r];
          for (int j = 0; j < d; ++j) {
            // Rows past seq_len hold NaN: the kernel must never let them reach the output.
            kp[t * d + j] = valid ? round_f16(u(rng)) : nan;
            vp[t * d + j] = valid ? round_f16(u(rng)) : nan;
          }
        }
      }
      pr.slots_of.push_back(std::move(ids));
    }
  // Unlisted spare pages: NaN too.
  for (size_t i = next; i < perm.size(); ++i) {
    float* kp = pr.pool->k_page(dhs::PageRef{dhs::Tier::Device, perm[i]});
    float* vp = pr.pool->v_page(dhs::PageRef{dhs::Tier::Device, perm[i]});
    std::fill(kp, kp + kPage * d, nan);
    std::fill(vp, vp + kPage * d, nan);
  }
  std::uniform_real_distribution<float> uq(-c.q_amp, c.q_amp);
  pr.q.resize(static_cast<size_t>(pr.q_indptr.back()) * c.n_heads_q * d);
  for (auto& x : pr.q) x = round_f16(uq(rng));
  return pr;
}

PageLists make_lists(const Problem& pr, ListKind kind, std::mt19937& rng) {
  PageLists L;
  L.n_requests = pr.n_requests;
  L.n_heads_kv = pr.n_heads_kv;
  L.seq_len = pr.seq_len;
  L.indptr.push_back(0);
  std::uniform_real_distribution<double> u01(0.0, 1.0);
  for (int r = 0; r < pr.n_requests; ++r)
    for (int h = 0; h < pr.n_heads_kv; ++h) {
      const auto& ids = pr.slots_of[static_cast<size_t>(r * pr.n_heads_kv + h)];
      std::vector<int32_t> keep;
      if (kind == ListKind::Dense) {
        for (size_t i = 0; i < ids.size(); ++i) keep.push_back(static_cast<int32_t>(i));
      } else if (kind == ListKind::Sparse || kind == ListKind::SparseShuffled) {
        // Per head: empty (15%), a single page (10%), or a random subset of random density.
        const double x = u01(rng);
        if (x < 0.15) {
        } else if (x < 0.25) {
          keep.push_back(static_cast<int32_t>(rng() % ids.size()));
        } else {
          const double p_keep = 0.1 + 0.8 * u01(rng);
          for (size_t i = 0; i < ids.size(); ++i)
            if (u01(rng) < p_keep) keep.push_back(static_cast<int32_t>(i));
        }
        if (kind == ListKind::SparseShuffled) std::shuffle(keep.begin(), keep.end(), rng);
      }
      for (int32_t i : keep) {
        L.slots.push_back(ids[static_cast<size_t>(i)]);
        L.page_pos.push_back(i);
      }
      L.indptr.push_back(static_cast<int32_t>(L.slots.size()));
    }
  return L;
}

struct Reference {
  std::vector<float> out, lse;
};

Reference run_cpu(const Problem& pr, const PageLists& L) {
  Reference ref;
  const size_t n = pr.q.size();
  ref.out.assign(n, 0.0f);
  ref.lse.assign(n / static_cast<size_t>(pr.head_dim), 0.0f);
  dhs::cpu::AttentionParams p;
  p.q = pr.q.data();
  p.out = ref.out.data();
  p.lse = ref.lse.data();
  p.q_indptr = pr.q_indptr.data();
  p.lists = &L;
  p.pool = pr.pool.get();
  p.n_heads_q = pr.n_heads_q;
  p.n_heads_kv = pr.n_heads_kv;
  p.head_dim = pr.head_dim;
  p.scale = 1.0f / std::sqrt(static_cast<float>(pr.head_dim));
  dhs::cpu::attention(p);
  return ref;
}

// Device buffers of one problem.
struct DeviceProblem {
  __half* q_d = nullptr;
  __half* out_d = nullptr;
  float* lse_d = nullptr;
  int32_t* q_indptr_d = nullptr;
  size_t n_out = 0, n_lse = 0;
  ~DeviceProblem() {
    cudaFree(q_d);
    cudaFree(out_d);
    cudaFree(lse_d);
    cudaFree(q_indptr_d);
  }
};

void upload_problem(const Problem& pr, DeviceProblem& dp) {
  dp.n_out = pr.q.size();
  dp.n_lse = dp.n_out / static_cast<size_t>(pr.head_dim);
  std::vector<uint16_t> qb(dp.n_out);
  for (size_t i = 0; i < dp.n_out; ++i) qb[i] = dhs::f32_to_fp16(pr.q[i]);
  DHS_CUDA_CHECK(cudaMalloc(&dp.q_d, dp.n_out * 2));
  DHS_CUDA_CHECK(cudaMalloc(&dp.out_d, dp.n_out * 2));
  DHS_CUDA_CHECK(cudaMalloc(&dp.lse_d, dp.n_lse * 4));
  DHS_CUDA_CHECK(cudaMalloc(&dp.q_indptr_d, pr.q_indptr.size() * 4));
  DHS_CUDA_CHECK(cudaMemcpy(dp.q_d, qb.data(), dp.n_out * 2, cudaMemcpyHostToDevice));
  DHS_CUDA_CHECK(cudaMemcpy(dp.q_indptr_d, pr.q_indptr.data(), pr.q_indptr.size() * 4, cudaMemcpyHostToDevice));
}

void poison(DeviceProblem& dp) {  // NaN everywhere: every element must be written
  DHS_CUDA_CHECK(cudaMemset(dp.out_d, 0xff, dp.n_out * 2));
  DHS_CUDA_CHECK(cudaMemset(dp.lse_d, 0xff, dp.n_lse * 4));
  DHS_CUDA_CHECK(cudaDeviceSynchronize());  // before work on a non-blocking stream
}

// Compares every element; prints the worst and returns the number of violations.
int64_t compare(const std::string& what, const DeviceProblem& dp, const Reference& ref) {
  std::vector<uint16_t> ob(dp.n_out);
  std::vector<float> lse(dp.n_lse);
  DHS_CUDA_CHECK(cudaMemcpy(ob.data(), dp.out_d, dp.n_out * 2, cudaMemcpyDeviceToHost));
  DHS_CUDA_CHECK(cudaMemcpy(lse.data(), dp.lse_d, dp.n_lse * 4, cudaMemcpyDeviceToHost));
  int64_t bad = 0;
  double worst = 0.0, worst_lse = 0.0, num = 0.0, den = 0.0;
  size_t first_bad = SIZE_MAX;
  for (size_t i = 0; i < dp.n_out; ++i) {
    const double g = dhs::fp16_to_f32(ob[i]), r = ref.out[i];
    const double err = std::fabs(g - r);
    if (!(err <= kAtol + kRtol * std::fabs(r))) {  // NaN fails
      if (first_bad == SIZE_MAX) first_bad = i;
      ++bad;
    }
    if (err > worst || std::isnan(err)) worst = std::isnan(err) ? INFINITY : err;
    num += (g - r) * (g - r);
    den += r * r;
  }
  int64_t bad_lse = 0;
  for (size_t i = 0; i < dp.n_lse; ++i) {
    const double g = lse[i], r = ref.lse[i];
    bool ok;
    if (std::isinf(r) && r < 0)
      ok = std::isinf(g) && g < 0;
    else
      ok = std::fabs(g - r) <= kLseAtol;
    if (!ok) ++bad_lse;
    if (!std::isinf(r)) worst_lse = std::max(worst_lse, std::isnan(g) ? INFINITY : std::fabs(g - r));
  }
  std::printf("  %-44s out: max|err| %.2e rel-L2 %.2e bad %lld/%zu | lse: max|err| %.2e bad %lld/%zu\n",
              what.c_str(), worst, den > 0 ? std::sqrt(num / den) : 0.0, static_cast<long long>(bad), dp.n_out,
              worst_lse, static_cast<long long>(bad_lse), dp.n_lse);
  if (first_bad != SIZE_MAX)
    std::printf("    first bad element %zu: gpu %g ref %g\n", first_bad,
                static_cast<double>(dhs::fp16_to_f32(ob[first_bad])), static_cast<double>(ref.out[first_bad]));
  return bad + bad_lse;
}

int max_of(const std::vector<int>& v) { return *std::max_element(v.begin(), v.end()); }

// One case: CPU reference vs the op, then the op captured in a CUDA graph and replayed
// over other lists (other lengths) uploaded in place. Every comparison must find no element
// out of tolerance.
void run_case(const Case& c, std::mt19937& rng) {
  std::printf("[case] %s: %zu requests, heads %d/%d, d %d, q_len max %d, min_pages %d\n", c.name.c_str(),
              c.seq_len.size(), c.n_heads_q, c.n_heads_kv, c.head_dim, max_of(c.q_len), c.min_pages_per_worker);
  const Problem pr = make_problem(c, rng);
  PageLists lists = make_lists(pr, c.lists, rng);
  if (c.row_masks) {
    std::bernoulli_distribution bit(0.6);
    for (int r = 0; r < pr.n_requests; ++r)
      for (int32_t k = lists.indptr[static_cast<size_t>(r * pr.n_heads_kv)];
           k < lists.indptr[static_cast<size_t>((r + 1) * pr.n_heads_kv)]; ++k) {
        uint32_t m = 0;
        for (int j = 0; j < c.q_len[static_cast<size_t>(r)]; ++j) m |= bit(rng) ? 1u << j : 0u;
        lists.row_mask.push_back(m);
      }
  }
  const PageLists dense = make_lists(pr, ListKind::Dense, rng);  // capacity: the most any list set needs
  const Reference ref = run_cpu(pr, lists);

  dhs::cuda::DevicePagePool pool(pr.pool->n_pages(), kPage, c.head_dim);
  pool.upload(*pr.pool);
  dhs::cuda::DevicePageLists dlists(pr.n_requests, c.n_heads_kv, std::max<int64_t>(dense.nnz(), 1));
  dlists.upload(lists);
  // The row masks travel beside the lists (DecodeListsView::row_mask); a dense replay's are all ones.
  uint32_t* mask_d = nullptr;
  if (c.row_masks) {
    DHS_CUDA_CHECK(cudaMalloc(&mask_d, static_cast<size_t>(std::max<int64_t>(dense.nnz(), 1)) * 4));
    DHS_CUDA_CHECK(cudaMemcpy(mask_d, lists.row_mask.data(), lists.row_mask.size() * 4, cudaMemcpyHostToDevice));
  }
  const dhs::cuda::DecodeListsView view{dlists.indptr_d(), dlists.slots_d(), dlists.page_pos_d(), dlists.seq_len_d(),
                                        dlists.n_requests(), dlists.n_heads_kv(), mask_d};
  DeviceProblem dp;
  upload_problem(pr, dp);
  const int max_q_len = max_of(c.q_len);
  dhs::cuda::DecodeAttentionWorkspace ws(pr.n_requests, c.n_heads_q, c.n_heads_kv, c.head_dim, max_q_len);
  dhs::cuda::DecodeAttentionArgs a;
  a.q_d = dp.q_d;
  a.q_indptr_d = dp.q_indptr_d;
  a.max_q_len = max_q_len;
  a.scale = 1.0f / std::sqrt(static_cast<float>(c.head_dim));
  a.out_d = dp.out_d;
  a.lse_d = dp.lse_d;
  a.min_pages_per_worker = c.min_pages_per_worker;
  auto launch = [&](cudaStream_t st) {
    if (c.row_masks)
      dhs::cuda::decode_attention(a, view, pool.view(), ws, st);
    else
      dhs::cuda::decode_attention(a, dlists, pool, ws, st);
  };

  poison(dp);
  launch(nullptr);
  DHS_CUDA_CHECK(cudaDeviceSynchronize());
  EXPECT_EQ(compare("stream launch, nnz " + std::to_string(lists.nnz()), dp, ref), 0) << c.name << ": stream launch";

  // Graph: capture once, replay over the same lists, then over dense lists of other lengths.
  cudaStream_t s;
  DHS_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  DHS_CUDA_CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
  launch(s);
  DHS_CUDA_CHECK(cudaStreamEndCapture(s, &graph));
  DHS_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
  poison(dp);
  DHS_CUDA_CHECK(cudaGraphLaunch(exec, s));
  DHS_CUDA_CHECK(cudaStreamSynchronize(s));
  EXPECT_EQ(compare("graph replay, same lists", dp, ref), 0) << c.name << ": graph replay, same lists";
  if (c.lists != ListKind::Dense) {
    dlists.upload(dense);
    if (mask_d) {
      const std::vector<uint32_t> ones(static_cast<size_t>(dense.nnz()), 0xffffffffu);
      DHS_CUDA_CHECK(cudaMemcpy(mask_d, ones.data(), ones.size() * 4, cudaMemcpyHostToDevice));
    }
    const Reference ref_dense = run_cpu(pr, dense);
    poison(dp);
    DHS_CUDA_CHECK(cudaGraphLaunch(exec, s));
    DHS_CUDA_CHECK(cudaStreamSynchronize(s));
    EXPECT_EQ(compare("graph replay, dense lists, nnz " + std::to_string(dense.nnz()), dp, ref_dense), 0)
        << c.name << ": graph replay over dense lists";
  }
  DHS_CUDA_CHECK(cudaGraphExecDestroy(exec));
  DHS_CUDA_CHECK(cudaGraphDestroy(graph));
  DHS_CUDA_CHECK(cudaStreamDestroy(s));
  cudaFree(mask_d);
}

// 17 requests of awkward lengths: 97 (last page 1/16), 99 (3/16), 1, 16, 17, ... up to ~600.
std::vector<int> awkward_lengths(std::mt19937& rng, int n, int min_len) {
  std::vector<int> v = {97, 99, 1, 16, 17, 33, 255, 256, 257, 611};
  std::uniform_int_distribution<int> d(1, 400);
  while (static_cast<int>(v.size()) < n) v.push_back(d(rng));
  v.resize(static_cast<size_t>(n));
  for (auto& x : v) x = std::max(x, min_len);
  return v;
}

bool have_gpu() { return dhs::cuda::device_count() > 0; }
bool quick_mode() { return std::getenv("DHS_TEST_QUICK") != nullptr; }

// Each case draws its lengths and data from its own generator (kSeed + the case's number), so
// it sees the same inputs alone (--gtest_filter) as in the whole run.
constexpr uint32_t kSeed = 20261129;
const std::vector<int> kQ1(17, 1), kQ5(17, 5);
std::vector<int> q_mixed() {  // 1..5 rows per request
  std::vector<int> q(17);
  for (int i = 0; i < 17; ++i) q[static_cast<size_t>(i)] = 1 + i % 5;
  return q;
}

}  // namespace

#define SKIP_WITHOUT_GPU() \
  if (!have_gpu()) GTEST_SKIP() << "no GPU (test_decode_attention needs a CUDA device)"
// The long-context cases: left out under DHS_TEST_QUICK (compute-sanitizer runs).
#define SKIP_LONG_IF_QUICK() \
  if (quick_mode()) GTEST_SKIP() << "DHS_TEST_QUICK: long-context case left out"

TEST(DecodeAttention, Llama32x8D128Q1Dense) {
  SKIP_WITHOUT_GPU();
  std::mt19937 rng(kSeed + 1);
  run_case({"llama 32/8 d128 q1 dense", 32, 8, 128, awkward_lengths(rng, 17, 1), kQ1, ListKind::Dense}, rng);
}
TEST(DecodeAttention, Llama32x8D128Q1Sparse) {
  SKIP_WITHOUT_GPU();
  std::mt19937 rng(kSeed + 2);
  run_case({"llama 32/8 d128 q1 sparse", 32, 8, 128, awkward_lengths(rng, 17, 1), kQ1, ListKind::Sparse}, rng);
}
TEST(DecodeAttention, Llama32x8D128Q5Sparse) {
  SKIP_WITHOUT_GPU();
  std::mt19937 rng(kSeed + 3);
  run_case({"llama 32/8 d128 q5 sparse", 32, 8, 128, awkward_lengths(rng, 17, 5), kQ5, ListKind::Sparse}, rng);
}
TEST(DecodeAttention, Llama32x8D128Q5Dense) {
  SKIP_WITHOUT_GPU();
  std::mt19937 rng(kSeed + 4);
  run_case({"llama 32/8 d128 q5 dense", 32, 8, 128, awkward_lengths(rng, 17, 5), kQ5, ListKind::Dense}, rng);
}
TEST(DecodeAttention, Llama32x8D128MixedQShuffledOnePagePerWorker) {
  SKIP_WITHOUT_GPU();
  std::mt19937 rng(kSeed + 5);
  run_case({"llama 32/8 d128 q1..5 shuffled, 1 page/worker", 32, 8, 128, awkward_lengths(rng, 17, 5), q_mixed(),
            ListKind::SparseShuffled, 1},
           rng);
}
TEST(DecodeAttention, Llama32x8D128Q8Sparse) {
  SKIP_WITHOUT_GPU();
  std::mt19937 rng(kSeed + 6);
  run_case({"llama 32/8 d128 q8 sparse", 32, 8, 128, awkward_lengths(rng, 5, 8), std::vector<int>(5, 8),
            ListKind::Sparse, 2},
           rng);
}
TEST(DecodeAttention, Gqa9x3D64Q1Dense) {
  SKIP_WITHOUT_GPU();
  std::mt19937 rng(kSeed + 7);
  run_case({"gqa 9/3 d64 q1 dense", 9, 3, 64, awkward_lengths(rng, 17, 1), kQ1, ListKind::Dense}, rng);
}
TEST(DecodeAttention, Gqa9x3D64Q5Sparse) {
  SKIP_WITHOUT_GPU();
  std::mt19937 rng(kSeed + 8);
  run_case({"gqa 9/3 d64 q5 sparse", 9, 3, 64, awkward_lengths(rng, 17, 5), kQ5, ListKind::Sparse}, rng);
}
TEST(DecodeAttention, Gqa9x3D64MixedQSparseOnePagePerWorker) {
  SKIP_WITHOUT_GPU();
  std::mt19937 rng(kSeed + 9);
  run_case({"gqa 9/3 d64 q1..5 sparse, 1 page/worker", 9, 3, 64, awkward_lengths(rng, 17, 5), q_mixed(),
            ListKind::Sparse, 1},
           rng);
}
// Row masks (a verify's rows each over its own list, read as their union): rows attend only the
// entries whose mask names them, q_len 1..5 and 8, both shapes, split over workers and whole.
TEST(DecodeAttention, Llama32x8D128MixedQRowMasks) {
  SKIP_WITHOUT_GPU();
  std::mt19937 rng(kSeed + 17);
  Case c{"llama 32/8 d128 q1..5 row masks", 32, 8, 128, awkward_lengths(rng, 17, 5), q_mixed(), ListKind::Sparse, 2};
  c.row_masks = true;
  run_case(c, rng);
}
TEST(DecodeAttention, Gqa9x3D64Q8RowMasksOnePagePerWorker) {
  SKIP_WITHOUT_GPU();
  std::mt19937 rng(kSeed + 18);
  Case c{"gqa 9/3 d64 q8 row masks, 1 page/worker", 9, 3, 64, awkward_lengths(rng, 5, 8), std::vector<int>(5, 8),
         ListKind::Sparse, 1};
  c.row_masks = true;
  run_case(c, rng);
}
TEST(DecodeAttention, AllListsEmpty) {
  SKIP_WITHOUT_GPU();
  std::mt19937 rng(kSeed + 10);
  run_case({"llama all lists empty", 32, 8, 128, awkward_lengths(rng, 17, 5), kQ5, ListKind::Empty}, rng);
}
TEST(DecodeAttention, PeakyScores) {
  SKIP_WITHOUT_GPU();
  std::mt19937 rng(kSeed + 11);
  Case c{"llama 32/8 d128 q1 dense, peaky scores", 32, 8, 128, awkward_lengths(rng, 17, 1), kQ1, ListKind::Dense};
  c.q_amp = 24.0f;
  run_case(c, rng);
}
// Long lists split over many workers: the merge kernel's path.
TEST(DecodeAttention, LongListsDense) {
  SKIP_WITHOUT_GPU();
  SKIP_LONG_IF_QUICK();
  std::mt19937 rng(kSeed + 12);
  run_case({"llama long 20000/5001/97 q1 dense", 32, 8, 128, {20000, 5001, 97}, {1, 1, 1}, ListKind::Dense}, rng);
}
TEST(DecodeAttention, LongListsQ5Sparse) {
  SKIP_WITHOUT_GPU();
  SKIP_LONG_IF_QUICK();
  std::mt19937 rng(kSeed + 13);
  run_case({"llama long 12000/3000/99 q5 sparse", 32, 8, 128, {12000, 3000, 99}, {5, 5, 5}, ListKind::Sparse}, rng);
}
// One request of 8 lists (~132 partials per list on an H200: the 32-warp merge) and two (~67:
// the 16-warp merge).
TEST(DecodeAttention, LongOneRequest) {
  SKIP_WITHOUT_GPU();
  SKIP_LONG_IF_QUICK();
  std::mt19937 rng(kSeed + 14);
  run_case({"llama long 30001 q1 dense, one request", 32, 8, 128, {30001}, {1}, ListKind::Dense}, rng);
}
TEST(DecodeAttention, LongTwoRequestsSparse) {
  SKIP_WITHOUT_GPU();
  SKIP_LONG_IF_QUICK();
  std::mt19937 rng(kSeed + 15);
  run_case({"llama long 16000/9000 q1 sparse, two requests", 32, 8, 128, {16000, 9000}, {1, 1}, ListKind::Sparse},
           rng);
}
TEST(DecodeAttention, Gqa9x3D64Long) {
  SKIP_WITHOUT_GPU();
  SKIP_LONG_IF_QUICK();
  std::mt19937 rng(kSeed + 16);
  run_case({"gqa 9/3 d64 long 9001 q5 dense", 9, 3, 64, {9001, 17}, {5, 2}, ListKind::Dense}, rng);
}
// Shape checks fail loudly: an unsupported head_dim throws, naming head_dim.
TEST(DecodeAttention, RejectsUnsupportedHeadDim) {
  SKIP_WITHOUT_GPU();
  std::string what = "(nothing thrown)";
  try {
    dhs::cuda::DecodeAttentionWorkspace ws(4, 32, 8, 96, 1);
  } catch (const std::exception& e) {
    what = e.what();
  }
  std::printf("  head_dim 96: %s\n", what.c_str());
  EXPECT_NE(what.find("head_dim"), std::string::npos) << "head_dim 96 must be rejected naming head_dim: " << what;
}
