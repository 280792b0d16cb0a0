// Prefill attention on the GPU against cpu::attention (the oracle), fed the
// same f16-rounded Q/K/V, on awkward sizes: 97 new tokens after a 3-token
// prefix, a last page 3/16 full, a chunk on top of a 1000-token prefix, a
// one-row chunk, requests of different lengths, GQA 32/8 d128 and 9/3 d64,
// sparse lists that differ per KV head. Unused pool rows and pages hold NaN,
// and the outputs are poisoned with NaN before the launch, so a read outside
// the lists or an unwritten output fails.
//
// Tolerance, every element: |gpu - ref| <= 2.5e-3 * (1 + |ref|), with V in [-1, 1].
// The GPU rounds P to f16 before P.V (relative 2^-11 per weight, so at most
// 2^-11 * max|v| on the normalised output, in the worst case where all rounding
// errors align) and rounds the output to f16 (2^-11 * |ref|); fp32 sums in
// another order add ~1e-6. The worst case is ~0.001 * (1 + |ref|): the bound
// leaves 2.5x margin and still catches any wrong key (one misplaced weight of
// a peaked softmax moves the output by O(0.1)). LSE: fp32 throughout, so
// |gpu - ref| <= 1e-4 * (1 + |ref|).
//
// GTest binary through gtest_shim.h (ctest label cuda; every GPU case skips where there is
// no GPU). With -DDHS_NO_GTEST it builds as a plain executable with the same TESTs; the small
// cases alone (for compute-sanitizer): --gtest_filter='*Small*'.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <exception>
#include <random>
#include <string>
#include <vector>

#include "backend/cpu/attention.h"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/prefill_attention.h"
#include "backend/cuda/prefill_attention_sm90.h"
#include "core/fp16.h"
#include "gtest_shim.h"
#include "kv/page_lists.h"
#include "kv/page_pool.h"

namespace {

using dhs::PageLists;
using dhs::PagePool;
using dhs::PageRef;

constexpr int kPageSize = 16;

struct Case {
  std::string name;
  int n_heads_q, n_heads_kv, head_dim;
  std::vector<int> prefix;  // [n_requests] tokens already in the KV before this chunk
  std::vector<int> q_len;   // [n_requests] new tokens (rows of this chunk)
  bool sparse = false;      // drop ~30% of each list's pages, differently per KV head
  uint64_t seed = 1;
  // Lists at the edges, by (request + KV head) % 3: 0 empty (every row sees no key: output 0,
  // lse -inf), 1 only the last page (the chunk's rows before that page see no key), 2 whole.
  bool edge_lists = false;
};

// A run's raw results, for the bitwise comparison of kernel forms.
struct Bits {
  std::vector<uint16_t> out;
  std::vector<float> lse;
};

float f16_round(float x) { return dhs::fp16_to_f32(dhs::f32_to_fp16(x)); }

template <class T>
struct DeviceBuffer {
  T* ptr = nullptr;
  explicit DeviceBuffer(size_t n) { DHS_CUDA_CHECK(cudaMalloc(&ptr, std::max<size_t>(n, 1) * sizeof(T))); }
  ~DeviceBuffer() { cudaFree(ptr); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  void upload(const std::vector<T>& h) {
    DHS_CUDA_CHECK(cudaMemcpy(ptr, h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice));
  }
  void download(std::vector<T>& h) const {
    DHS_CUDA_CHECK(cudaMemcpy(h.data(), ptr, h.size() * sizeof(T), cudaMemcpyDeviceToHost));
  }
};

// Returns "" when every element is within tolerance, else a description. wgmma: the
// warpgroup-MMA kernel where it applies (head_dim 128 on sm_90), else the mma.sync one.
std::string run_case_on(const Case& c, bool wgmma, dhs::cuda::PrefillSm90Shape shape = {}, Bits* bits = nullptr) {
  std::mt19937_64 rng(c.seed);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  const int n_req = static_cast<int>(c.q_len.size());
  const int d = c.head_dim;
  const int hq = c.n_heads_q, hkv = c.n_heads_kv;

  // Page lists: slots handed out in a shuffled order so pages of one list are scattered.
  std::vector<int> seq_len(static_cast<size_t>(n_req));
  int64_t n_list_pages = 0;
  for (int r = 0; r < n_req; ++r) {
    seq_len[static_cast<size_t>(r)] = c.prefix[static_cast<size_t>(r)] + c.q_len[static_cast<size_t>(r)];
    n_list_pages += static_cast<int64_t>(hkv) * ((seq_len[static_cast<size_t>(r)] + kPageSize - 1) / kPageSize);
  }
  const int64_t n_pool_pages = n_list_pages + 7;  // a few pages no list names (NaN-filled)
  PagePool pool(dhs::Tier::Device, n_pool_pages, kPageSize, d);
  std::vector<PageRef> refs;
  if (!pool.allocate(n_pool_pages, &refs)) return "pool allocation failed";
  std::shuffle(refs.begin(), refs.end(), rng);

  PageLists lists;
  lists.n_requests = n_req;
  lists.n_heads_kv = hkv;
  lists.seq_len.assign(seq_len.begin(), seq_len.end());
  lists.indptr.push_back(0);
  // Device pool contents: NaN everywhere except the rows of tokens that exist.
  const size_t page_elems = static_cast<size_t>(kPageSize) * d;
  const uint16_t kNanBf16 = 0x7fc1;
  std::vector<uint16_t> k_dev(static_cast<size_t>(n_pool_pages) * page_elems, kNanBf16);
  std::vector<uint16_t> v_dev(k_dev.size(), kNanBf16);
  size_t next_ref = 0;
  std::bernoulli_distribution drop(0.3);
  for (int r = 0; r < n_req; ++r) {
    const int sl = seq_len[static_cast<size_t>(r)];
    const int n_pages = (sl + kPageSize - 1) / kPageSize;
    for (int h = 0; h < hkv; ++h) {
      for (int i = 0; i < n_pages; ++i) {
        const PageRef pg = refs[next_ref++];
        const int n_tok = std::min(kPageSize, sl - i * kPageSize);
        float* kp = pool.k_page(pg);
        float* vp = pool.v_page(pg);
        for (int t = 0; t < n_tok; ++t)
          for (int x = 0; x < d; ++x) {
            const float kv = f16_round(u(rng)), vv = f16_round(u(rng));
            kp[t * d + x] = kv;
            vp[t * d + x] = vv;
            k_dev[static_cast<size_t>(pg.slot) * page_elems + static_cast<size_t>(t * d + x)] = dhs::f32_to_fp16(kv);
            v_dev[static_cast<size_t>(pg.slot) * page_elems + static_cast<size_t>(t * d + x)] = dhs::f32_to_fp16(vv);
          }
        // Sparse lists keep the last page (it holds the newest keys) and drop others at random.
        if (c.sparse && i + 1 < n_pages && drop(rng)) continue;
        if (c.edge_lists && ((r + h) % 3 == 0 || ((r + h) % 3 == 1 && i + 1 < n_pages))) continue;
        lists.slots.push_back(pg.slot);
        lists.page_pos.push_back(i);
      }
      lists.indptr.push_back(static_cast<int32_t>(lists.slots.size()));
    }
  }

  std::vector<int32_t> q_indptr(static_cast<size_t>(n_req) + 1, 0);
  for (int r = 0; r < n_req; ++r) q_indptr[static_cast<size_t>(r) + 1] = q_indptr[static_cast<size_t>(r)] + c.q_len[static_cast<size_t>(r)];
  const int n_rows = q_indptr[static_cast<size_t>(n_req)];
  const size_t n_q = static_cast<size_t>(n_rows) * hq * d;
  std::vector<float> q(n_q);
  std::vector<uint16_t> q_dev(n_q);
  // |q| up to 3: scores of std ~1 after 1/sqrt(d), so softmax is peaked enough
  // that a wrong or missing key shows.
  for (size_t i = 0; i < n_q; ++i) {
    q[i] = f16_round(3.0f * u(rng));
    q_dev[i] = dhs::f32_to_fp16(q[i]);
  }

  // Oracle.
  std::vector<float> out_ref(n_q), lse_ref(static_cast<size_t>(n_rows) * hq);
  dhs::cpu::AttentionParams cp;
  cp.q = q.data();
  cp.out = out_ref.data();
  cp.lse = lse_ref.data();
  cp.q_indptr = q_indptr.data();
  cp.lists = &lists;
  cp.pool = &pool;
  cp.n_heads_q = hq;
  cp.n_heads_kv = hkv;
  cp.head_dim = d;
  cp.scale = 1.0f / std::sqrt(static_cast<float>(d));
  dhs::cpu::attention(cp);

  // GPU.
  DeviceBuffer<uint16_t> q_d(n_q), out_d(n_q), k_d(k_dev.size()), v_d(v_dev.size());
  DeviceBuffer<float> lse_d(lse_ref.size());
  DeviceBuffer<int32_t> q_indptr_d(q_indptr.size()), indptr_d(lists.indptr.size()), slots_d(lists.slots.size()),
      page_pos_d(lists.page_pos.size()), seq_len_d(lists.seq_len.size());
  q_d.upload(q_dev);
  k_d.upload(k_dev);
  v_d.upload(v_dev);
  q_indptr_d.upload(q_indptr);
  indptr_d.upload(lists.indptr);
  slots_d.upload(lists.slots);
  page_pos_d.upload(lists.page_pos);
  seq_len_d.upload(lists.seq_len);
  DHS_CUDA_CHECK(cudaMemset(out_d.ptr, 0xff, n_q * sizeof(uint16_t)));  // f16 NaN
  DHS_CUDA_CHECK(cudaMemset(lse_d.ptr, 0xff, lse_ref.size() * sizeof(float)));

  dhs::cuda::PrefillAttentionParams p;
  p.q = reinterpret_cast<const __half*>(q_d.ptr);
  p.out = reinterpret_cast<__half*>(out_d.ptr);
  p.lse = lse_d.ptr;
  p.k_pool = reinterpret_cast<const __half*>(k_d.ptr);
  p.v_pool = reinterpret_cast<const __half*>(v_d.ptr);
  p.q_indptr = q_indptr_d.ptr;
  p.kv_indptr = indptr_d.ptr;
  p.slots = slots_d.ptr;
  p.page_pos = page_pos_d.ptr;
  p.seq_len = seq_len_d.ptr;
  p.n_requests = n_req;
  p.n_rows = n_rows;
  p.n_heads_q = hq;
  p.n_heads_kv = hkv;
  p.head_dim = d;
  p.page_size = kPageSize;
  p.scale = cp.scale;
  dhs::cuda::launch_prefill_attention(p, nullptr, {.wgmma = wgmma, .sm90_shape = shape});
  DHS_CUDA_CHECK(cudaDeviceSynchronize());

  std::vector<uint16_t> out_dev(n_q);
  std::vector<float> lse_dev(lse_ref.size());
  out_d.download(out_dev);
  lse_d.download(lse_dev);

  double max_abs = 0.0, max_rel = 0.0;
  size_t n_bad = 0;
  std::string first_bad;
  for (size_t i = 0; i < n_q; ++i) {
    const float g = dhs::fp16_to_f32(out_dev[i]), r = out_ref[i];
    const double err = std::fabs(static_cast<double>(g) - r);
    const bool ok = std::isfinite(g) && err <= 2.5e-3 * (1.0 + std::fabs(r));
    if (std::isfinite(g)) {
      max_abs = std::max(max_abs, err);
      max_rel = std::max(max_rel, err / (1.0 + std::fabs(r)));
    }
    if (!ok && n_bad++ == 0) {
      const size_t row = i / (static_cast<size_t>(hq) * d), head = (i / d) % hq, x = i % d;
      first_bad = "out[row " + std::to_string(row) + ", head " + std::to_string(head) + ", " + std::to_string(x) +
                  "] gpu " + std::to_string(g) + " ref " + std::to_string(r);
    }
  }
  size_t n_bad_lse = 0;
  for (size_t i = 0; i < lse_ref.size(); ++i) {
    const float g = lse_dev[i], r = lse_ref[i];
    const bool ok = std::isinf(r) ? (std::isinf(g) && g < 0) : (std::isfinite(g) && std::fabs(g - r) <= 1e-4 * (1.0 + std::fabs(r)));
    if (!ok && n_bad_lse++ == 0 && first_bad.empty())
      first_bad = "lse[" + std::to_string(i) + "] gpu " + std::to_string(g) + " ref " + std::to_string(r);
  }
  const bool sm90 = wgmma && d == 128 && dhs::cuda::prefill_sm90_available();
  const std::string kernel =
      !sm90 ? std::string("mma.sync")
            : "wgmma" + std::to_string(shape.block_n) + (shape.warp_specialized ? "ws" : "") + (shape.ping_pong ? "pp" : "") +
                  (shape.stages != 2 ? "s" + std::to_string(shape.stages) : "");
  if (bits != nullptr) *bits = {out_dev, lse_dev};
  std::printf("  %-28s %-8s rows %5d  max|err| %.2e  max|err|/(1+|ref|) %.2e  bad %zu/%zu  bad lse %zu\n",
              c.name.c_str(), kernel.c_str(), n_rows, max_abs, max_rel, n_bad, n_q, n_bad_lse);
  if (n_bad || n_bad_lse)
    return c.name + " (" + kernel + "): " + std::to_string(n_bad) + " outputs and " + std::to_string(n_bad_lse) +
           " lse out of tolerance; first: " + first_bad;
  return "";
}

// "" when a and b hold the same bits, else where they first differ.
std::string same_bits(const Bits& a, const Bits& b, const std::string& what) {
  for (size_t i = 0; i < a.out.size() && i < b.out.size(); ++i)
    if (a.out[i] != b.out[i]) return what + ": out[" + std::to_string(i) + "] differs bitwise; ";
  for (size_t i = 0; i < a.lse.size() && i < b.lse.size(); ++i)
    if (std::memcmp(&a.lse[i], &b.lse[i], sizeof(float)) != 0)
      return what + ": lse[" + std::to_string(i) + "] differs bitwise; ";
  return a.out.size() == b.out.size() && a.lse.size() == b.lse.size() ? "" : what + ": sizes differ; ";
}

// Both kernels on the same case (the wgmma one only where it applies): the wgmma kernel with 64-
// and 128-key tiles, warp-specialized or not, the warp-specialized one also with ping-pong
// consumers and with a 3-tile ring. At one tile width every form runs the same MMAs and the same
// softmax on every row, in the same order (the forms differ only in who copies and when), so their
// outputs must be equal bit for bit: a race on a ring buffer or a barrier out of step shows here
// even where it stays inside the tolerance.
std::string run_case(const Case& c) {
  std::string err;
  for (const int bn : {128, 64}) {
    Bits ref;
    err += run_case_on(c, true, {bn, false, false, 2}, &ref);
    for (const bool pp : {false, true})
      for (const int st : {2, 3}) {
        Bits b;
        err += run_case_on(c, true, {bn, true, pp, st}, &b);
        err += same_bits(ref, b, c.name + " wgmma" + std::to_string(bn) + "ws" + (pp ? "pp" : "") + "s" +
                                     std::to_string(st) + " vs wgmma" + std::to_string(bn));
      }
  }
  return err + run_case_on(c, false);
}

// prefix 3 + 97 new; a 51-token request (last page 3/16 full); a chunk of 67
// on top of a 1000-token prefix (last page 11/16); a one-row chunk.
const std::vector<int> kPrefix = {3, 0, 1000, 20};
const std::vector<int> kQLen = {97, 51, 67, 1};

Case small_case() { return {"small 8/2 d128", 8, 2, 128, {3}, {97}, false, 11}; }
Case small_case_d64() { return {"small 9/3 d64", 9, 3, 64, {0}, {35}, false, 12}; }
Case gqa32x8_d128() { return {"gqa 32/8 d128", 32, 8, 128, kPrefix, kQLen, false, 21}; }
Case gqa9x3_d64() { return {"gqa 9/3 d64", 9, 3, 64, kPrefix, kQLen, false, 22}; }
Case sparse_d128() { return {"sparse 32/8 d128", 32, 8, 128, kPrefix, kQLen, true, 31}; }
// Several query tiles per request, and a whole chunk of 600 after 1000 (MHA: 128 tokens per tile).
Case long_chunk() { return {"chunk 600 on 1000, 4/4 d128", 4, 4, 128, {1000, 0}, {600, 333}, false, 41}; }
// GQA 4 with many query tiles (32 tokens each) and K/V tiles per request, one sparse.
Case long_gqa() { return {"chunk 700 on 300, 32/8 d128", 32, 8, 128, {300, 5}, {700, 259}, false, 51}; }
Case long_gqa_sparse() { return {"sparse chunk 400 on 900, 32/8", 32, 8, 128, {900}, {400}, true, 52}; }
// Empty lists and lists of one page (whole query tiles, and rows of a tile, that see no key: the
// n_kv_tiles = 0 path and the rows whose max stays -inf), on requests of 1 to 3 query tiles.
Case edge_lists_case() {
  Case c{"edge lists 32/8 d128", 32, 8, 128, {0, 40, 300}, {90, 7, 33}, false, 61};
  c.edge_lists = true;
  return c;
}

bool have_gpu() { return dhs::cuda::device_count() > 0; }

// Shapes the launcher must refuse loudly.
std::string check_rejects() {
  dhs::cuda::PrefillAttentionParams p;
  p.n_requests = 1;
  p.n_rows = 1;
  p.n_heads_q = 8;
  p.n_heads_kv = 2;
  p.head_dim = 96;
  p.scale = 0.1f;
  for (int variant = 0; variant < 3; ++variant) {
    if (variant == 1) p.head_dim = 128, p.page_size = 32;
    if (variant == 2) p.page_size = 16, p.n_heads_kv = 3;
    try {
      dhs::cuda::launch_prefill_attention(p, nullptr);
      return "launcher accepted unsupported shape variant " + std::to_string(variant);
    } catch (const std::exception&) {
    }
  }
  return "";
}

// Kernel shapes check_prefill_sm90_shape (the launcher's check) must refuse (no GPU needed): "" or
// what it wrongly accepted.
std::string check_shape_setter() {
  using Shape = dhs::cuda::PrefillSm90Shape;
  const Shape bad[] = {{96, true, true, 3}, {128, true, true, 4}, {128, false, true, 2}, {128, false, false, 3},
                       {64, true, false, 1}};
  std::string err;
  for (const Shape& s : bad) {
    try {
      dhs::cuda::check_prefill_sm90_shape(s);
      err += "accepted {" + std::to_string(s.block_n) + ", " + std::to_string(s.warp_specialized) + ", " +
             std::to_string(s.ping_pong) + ", " + std::to_string(s.stages) + "}; ";
    } catch (const std::exception&) {
    }
  }
  for (const Shape& s : {Shape{64, false, false, 2}, Shape{128, true, true, 2}, Shape{64, true, false, 3}}) {
    try {
      dhs::cuda::check_prefill_sm90_shape(s);
    } catch (const std::exception& e) {
      err += std::string("refused a valid shape: ") + e.what() + "; ";
    }
  }
  return err;
}

}  // namespace

// Small enough for compute-sanitizer: --gtest_filter=PrefillAttention.Small
#define SKIP_WITHOUT_GPU() \
  if (!have_gpu()) GTEST_SKIP() << "no GPU (test_prefill_attention needs a CUDA device)"

TEST(PrefillAttention, Small) {
  SKIP_WITHOUT_GPU();
  EXPECT_EQ(run_case(small_case()), "");
  EXPECT_EQ(run_case(small_case_d64()), "");
}
TEST(PrefillAttention, Gqa32x8D128) {
  SKIP_WITHOUT_GPU();
  EXPECT_EQ(run_case(gqa32x8_d128()), "");
}
TEST(PrefillAttention, Gqa9x3D64) {
  SKIP_WITHOUT_GPU();
  EXPECT_EQ(run_case(gqa9x3_d64()), "");
}
TEST(PrefillAttention, SparseListsPerHead) {
  SKIP_WITHOUT_GPU();
  EXPECT_EQ(run_case(sparse_d128()), "");
}
TEST(PrefillAttention, LongChunkOnPrefix) {
  SKIP_WITHOUT_GPU();
  EXPECT_EQ(run_case(long_chunk()), "");
}
TEST(PrefillAttention, LongChunksGqa) {
  SKIP_WITHOUT_GPU();
  EXPECT_EQ(run_case(long_gqa()), "");
  EXPECT_EQ(run_case(long_gqa_sparse()), "");
}
TEST(PrefillAttention, EmptyAndOnePageLists) {
  SKIP_WITHOUT_GPU();
  EXPECT_EQ(run_case(edge_lists_case()), "");
}
TEST(PrefillAttention, RejectsUnsupportedShapes) {
  SKIP_WITHOUT_GPU();
  EXPECT_EQ(check_rejects(), "");
}
// Runs without a GPU too: the shape check needs none.
TEST(PrefillAttention, ShapeSetterRejectsInvalidShapes) { EXPECT_EQ(check_shape_setter(), ""); }
