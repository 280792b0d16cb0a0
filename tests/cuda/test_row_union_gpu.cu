// A verify's per-row lists merged on the device (backend/cuda/row_union.h) against the CPU
// statement (kv/page_lists.h union_row_lists), exactly: indptr, slots, page positions and row
// masks. Random verifies of 1 to 32 rows per request (decode requests of one row among them),
// 8 and 3 KV heads, lists from empty to every page of a 128k request (8,192 pages: the second
// kernel's scan over many rounds), rows sharing most pages as consecutive tokens' selections do.
// Then the same scratch reused: a second, different merge (and a graph replay of the first
// capture over new lists) must be exact too — the first kernel's bits would leak into it if the
// second did not clear the scratch behind it. Page positions past a request's pages are skipped
// and counted.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <random>
#include <vector>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/device_page_pool.h"
#include "backend/cuda/row_union.h"
#include "device_vectors.h"
#include "gtest_shim.h"
#include "kv/page_lists.h"

namespace {

namespace dc = dhs::cuda;
using dhs::PageLists;
using dhs::test::to_device;
using dhs::test::to_host;

bool have_gpu() { return dc::device_count() > 0; }

constexpr int kPage = 16;

// Requests of rows_of[s] rows at ctx[s] tokens before them; row j of a request selects a random
// subset of its pages around a shared core (the pages most rows keep), its last page always.
struct Verify {
  PageLists rows;                 // one request per row
  std::vector<int32_t> row_indptr;
  std::vector<int32_t> seq_len;   // per output request: its last row's
};

Verify random_verify(const std::vector<int>& rows_of, const std::vector<int>& ctx, int hkv, std::mt19937& rng) {
  Verify v;
  v.rows.n_heads_kv = hkv;
  v.rows.indptr = {0};
  v.row_indptr = {0};
  std::uniform_real_distribution<double> u(0.0, 1.0);
  for (size_t s = 0; s < rows_of.size(); ++s) {
    const int last_pages = (ctx[s] + rows_of[s] + kPage - 1) / kPage;
    // Slots: any distinct numbers per (head, page); the core each head's rows share.
    std::vector<std::vector<int32_t>> slot(static_cast<size_t>(hkv));
    std::vector<std::vector<char>> core(static_cast<size_t>(hkv));
    for (int h = 0; h < hkv; ++h)
      for (int i = 0; i < last_pages; ++i) {
        slot[static_cast<size_t>(h)].push_back(static_cast<int32_t>(rng() % 1000000));
        core[static_cast<size_t>(h)].push_back(u(rng) < 0.3);
      }
    const int kind = static_cast<int>(rng() % 4);  // 0: dense rows, 1: empty head 0, else sparse
    for (int j = 0; j < rows_of[s]; ++j) {
      const int len = ctx[s] + j + 1;
      v.rows.seq_len.push_back(len);
      const int n_pages = (len + kPage - 1) / kPage;
      for (int h = 0; h < hkv; ++h) {
        for (int i = 0; i < n_pages; ++i) {
          bool keep = kind == 0 || i == n_pages - 1 || core[static_cast<size_t>(h)][static_cast<size_t>(i)] ||
                      u(rng) < 0.08;
          if (kind == 1 && h == 0) keep = false;
          if (!keep) continue;
          v.rows.page_pos.push_back(i);
          v.rows.slots.push_back(slot[static_cast<size_t>(h)][static_cast<size_t>(i)]);
        }
        v.rows.indptr.push_back(static_cast<int32_t>(v.rows.slots.size()));
      }
    }
    v.rows.n_requests += rows_of[s];
    v.row_indptr.push_back(v.rows.n_requests);
    v.seq_len.push_back(ctx[s] + rows_of[s]);
  }
  return v;
}

// The device buffers of one merge, sized for up to `cap` entries (inputs and outputs) so that a
// captured merge can be replayed over other lists of the same request count written into them.
struct DeviceMerge {
  int32_t *in_indptr, *in_slots, *in_pos, *row_indptr, *seq_len, *out_indptr, *out_slots, *out_pos, *n_bad;
  uint32_t* out_mask;
  int n_out = 0, hkv = 0;
  int64_t nnz = 0, cap = 0;
  DeviceMerge(const Verify& v, int64_t capacity) : cap(std::max<int64_t>(capacity, 1)) {
    n_out = static_cast<int>(v.seq_len.size());
    hkv = v.rows.n_heads_kv;
    const size_t n_in_rows = v.rows.indptr.size();
    in_indptr = to_device(std::vector<int32_t>(n_in_rows, 0));
    in_slots = to_device(std::vector<int32_t>(static_cast<size_t>(cap), 0));
    in_pos = to_device(std::vector<int32_t>(static_cast<size_t>(cap), 0));
    row_indptr = to_device(v.row_indptr);
    seq_len = to_device(v.seq_len);
    out_indptr = to_device(std::vector<int32_t>(static_cast<size_t>(n_out * hkv + 1), -7));
    out_slots = to_device(std::vector<int32_t>(static_cast<size_t>(cap), -7));
    out_pos = to_device(std::vector<int32_t>(static_cast<size_t>(cap), -7));
    out_mask = to_device(std::vector<uint32_t>(static_cast<size_t>(cap), 0xdeadu));
    n_bad = to_device(std::vector<int32_t>{0});
    load(v);
  }
  // v's lists into the buffers (the same request and row counts as the constructor's).
  void load(const Verify& v) {
    ASSERT_LE(v.rows.nnz(), cap);
    ASSERT_EQ(static_cast<int>(v.seq_len.size()), n_out);
    nnz = v.rows.nnz();
    DHS_CUDA_CHECK(cudaMemcpy(in_indptr, v.rows.indptr.data(), v.rows.indptr.size() * 4, cudaMemcpyHostToDevice));
    DHS_CUDA_CHECK(cudaMemcpy(in_slots, v.rows.slots.data(), v.rows.slots.size() * 4, cudaMemcpyHostToDevice));
    DHS_CUDA_CHECK(cudaMemcpy(in_pos, v.rows.page_pos.data(), v.rows.page_pos.size() * 4, cudaMemcpyHostToDevice));
    DHS_CUDA_CHECK(cudaMemcpy(row_indptr, v.row_indptr.data(), v.row_indptr.size() * 4, cudaMemcpyHostToDevice));
    DHS_CUDA_CHECK(cudaMemcpy(seq_len, v.seq_len.data(), v.seq_len.size() * 4, cudaMemcpyHostToDevice));
  }
  ~DeviceMerge() {
    for (void* p : {static_cast<void*>(in_indptr), static_cast<void*>(in_slots), static_cast<void*>(in_pos),
                    static_cast<void*>(row_indptr), static_cast<void*>(seq_len), static_cast<void*>(out_indptr),
                    static_cast<void*>(out_slots), static_cast<void*>(out_pos), static_cast<void*>(out_mask),
                    static_cast<void*>(n_bad)})
      cudaFree(p);
  }
  dc::RowUnionParams params(const dc::RowUnionScratch& scratch) const {
    dc::RowUnionParams p;
    p.in_indptr = in_indptr;
    p.in_slots = in_slots;
    p.in_page_pos = in_pos;
    p.row_indptr = row_indptr;
    p.seq_len = seq_len;
    p.n_out = n_out;
    p.n_heads_kv = hkv;
    p.page_size = kPage;
    p.out_indptr = out_indptr;
    p.out_slots = out_slots;
    p.out_page_pos = out_pos;
    p.out_row_mask = out_mask;
    p.n_bad = n_bad;
    scratch.bind(p);
    return p;
  }
};

// The device's merge equals the CPU statement's, entry for entry.
void expect_equal(const DeviceMerge& d, const Verify& v, const char* what) {
  const PageLists want = dhs::union_row_lists(v.rows, v.row_indptr);
  const auto indptr = to_host(d.out_indptr, static_cast<size_t>(d.n_out * d.hkv + 1));
  EXPECT_EQ(indptr, want.indptr) << what;
  const size_t n = want.slots.size();
  EXPECT_EQ(to_host(d.out_slots, n), want.slots) << what;
  EXPECT_EQ(to_host(d.out_pos, n), want.page_pos) << what;
  EXPECT_EQ(to_host(d.out_mask, n), want.row_mask) << what;
  EXPECT_EQ(to_host(d.n_bad, 1)[0], 0) << what;
}

}  // namespace

TEST(RowUnionGpu, RandomVerifiesEqualTheCpuStatement) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  std::mt19937 rng(20261205);
  // 17 requests: verifies of 2-8 rows, decode rows (1), one of 32 rows; awkward contexts.
  const std::vector<int> rows_of = {4, 1, 8, 2, 32, 1, 3, 5, 1, 6, 2, 7, 4, 1, 3, 2, 5};
  std::vector<int> ctx;
  for (size_t i = 0; i < rows_of.size(); ++i) ctx.push_back(static_cast<int>(1 + rng() % 3000));
  ctx[2] = 0;  // rows from the first token
  ctx[5] = 15;
  for (int hkv : {8, 3}) {
    const Verify v = random_verify(rows_of, ctx, hkv, rng);
    dc::RowUnionScratch scratch(static_cast<int>(rows_of.size()) * hkv, 3100 / kPage + 4);
    DeviceMerge d(v, v.rows.nnz());
    dc::row_union(d.params(scratch), scratch, nullptr);
    DHS_CUDA_CHECK(cudaDeviceSynchronize());
    expect_equal(d, v, hkv == 8 ? "8 KV heads" : "3 KV heads");
  }
}

TEST(RowUnionGpu, LongListsAndTheScratchLeftClean) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  std::mt19937 rng(7);
  // 128k tokens: 8,192 page positions per list; two requests of 4 rows and 1 row.
  const int max_pages = 131072 / kPage + 1;
  dc::RowUnionScratch scratch(3 * 8, max_pages);
  const Verify a = random_verify({4, 1}, {131068, 100000}, 8, rng);
  const Verify c = random_verify({4, 1}, {131000, 99990}, 8, rng);
  DeviceMerge da(a, std::max(a.rows.nnz(), c.rows.nnz()));
  cudaStream_t s;
  DHS_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  DHS_CUDA_CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
  dc::row_union(da.params(scratch), scratch, s);
  DHS_CUDA_CHECK(cudaStreamEndCapture(s, &graph));
  DHS_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
  DHS_CUDA_CHECK(cudaGraphLaunch(exec, s));
  DHS_CUDA_CHECK(cudaStreamSynchronize(s));
  expect_equal(da, a, "128k, first merge (graph)");
  // Another merge on the same scratch (other requests, other heads, fewer pages): nothing of the
  // first left behind.
  const Verify b = random_verify({3, 2, 1}, {5000, 70000, 17}, 8, rng);
  DeviceMerge db(b, b.rows.nnz());
  dc::row_union(db.params(scratch), scratch, s);
  DHS_CUDA_CHECK(cudaStreamSynchronize(s));
  expect_equal(db, b, "a second merge on the same scratch");
  // The captured merge replayed over new lists written into its buffers.
  da.load(c);
  DHS_CUDA_CHECK(cudaGraphLaunch(exec, s));
  DHS_CUDA_CHECK(cudaStreamSynchronize(s));
  expect_equal(da, c, "the graph replayed over new lists");
  DHS_CUDA_CHECK(cudaGraphExecDestroy(exec));
  DHS_CUDA_CHECK(cudaGraphDestroy(graph));
  DHS_CUDA_CHECK(cudaStreamDestroy(s));
}

TEST(RowUnionGpu, PagesPastTheRequestAreSkippedAndCounted) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  std::mt19937 rng(11);
  Verify v = random_verify({3}, {100}, 2, rng);
  dc::RowUnionScratch scratch(2, 64);
  // A row naming page 40 of a 103-token request (7 pages): skipped, counted, not left behind.
  v.rows.page_pos[0] = 40;
  DeviceMerge d(v, v.rows.nnz());
  dc::row_union(d.params(scratch), scratch, nullptr);
  DHS_CUDA_CHECK(cudaDeviceSynchronize());
  EXPECT_EQ(to_host(d.n_bad, 1)[0], 1);
  // A clean merge on the same scratch afterwards equals the CPU statement.
  const Verify w = random_verify({3}, {100}, 2, rng);
  DeviceMerge dw(w, w.rows.nnz());
  dc::row_union(dw.params(scratch), scratch, nullptr);
  DHS_CUDA_CHECK(cudaDeviceSynchronize());
  expect_equal(dw, w, "after a skipped entry");
}
