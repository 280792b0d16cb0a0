#include "backend/cpu/attention.h"

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "core/error.h"
#include "core/merge_state.h"
#include "core/thread_pool.h"

namespace dhs::cpu {

namespace {
inline float dot(const float* a, const float* b, int n) {
  __m256 s = _mm256_setzero_ps();
  int i = 0;
  for (; i + 8 <= n; i += 8) s = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), s);
  __m128 lo = _mm_add_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps(s, 1));
  lo = _mm_hadd_ps(lo, lo);
  lo = _mm_hadd_ps(lo, lo);
  float r = _mm_cvtss_f32(lo);
  for (; i < n; ++i) r += a[i] * b[i];
  return r;
}
}  // namespace

void attention(const AttentionParams& p) {
  const PageLists& L = *p.lists;
  DHS_ASSERT(p.n_heads_q % p.n_heads_kv == 0 && L.n_heads_kv == p.n_heads_kv);
  DHS_ASSERT(p.pool->head_dim() == p.head_dim);
  const int group = p.n_heads_q / p.n_heads_kv;
  const int ps = p.pool->page_size();
  const int d = p.head_dim;
  const int64_t n_rows = p.q_indptr[L.n_requests];
  DHS_ASSERT(L.row_mask.empty() || static_cast<int64_t>(L.row_mask.size()) == L.nnz());
  // Work item = (query row, q head); parallel over all of them.
  const int64_t n_items = n_rows * p.n_heads_q;
  std::vector<int32_t> row_req(static_cast<size_t>(n_rows));
  for (int r = 0; r < L.n_requests; ++r)
    for (int32_t j = p.q_indptr[r]; j < p.q_indptr[r + 1]; ++j) row_req[static_cast<size_t>(j)] = r;

  ThreadPool::global().parallel_for(n_items, [&](int64_t b, int64_t e, int) {
    std::vector<float> acc(static_cast<size_t>(d)), scores(static_cast<size_t>(ps)), part(static_cast<size_t>(d));
    for (int64_t it = b; it < e; ++it) {
      const int64_t row = it / p.n_heads_q;
      const int hq = static_cast<int>(it % p.n_heads_q);
      const int hk = hq / group;
      const int req = row_req[static_cast<size_t>(row)];
      const int64_t q_len = p.q_indptr[req + 1] - p.q_indptr[req];
      const int64_t qpos = L.seq_len[static_cast<size_t>(req)] - q_len + (row - p.q_indptr[req]);
      const float* q = p.q + (row * p.n_heads_q + hq) * d;
      MergeState st;
      std::fill(acc.begin(), acc.end(), 0.0f);
      const int64_t j = row - p.q_indptr[req];  // the row's index in its request (row_mask's bit)
      for (int32_t k = L.row_begin(req, hk); k < L.row_end(req, hk); ++k) {
        if (!L.row_mask.empty() && j < 32 && !((L.row_mask[static_cast<size_t>(k)] >> j) & 1u)) continue;
        const PageRef pg{p.pool->tier(), L.slots[static_cast<size_t>(k)]};
        const int64_t base = static_cast<int64_t>(L.page_pos[static_cast<size_t>(k)]) * ps;
        const int n_valid = static_cast<int>(std::clamp<int64_t>(qpos + 1 - base, 0, ps));
        if (n_valid == 0) continue;
        const float* kp = p.pool->k_page(pg);
        const float* vp = p.pool->v_page(pg);
        MergeState pst;
        pst.m = -INFINITY;
        for (int t = 0; t < n_valid; ++t) {
          scores[static_cast<size_t>(t)] = dot(q, kp + t * d, d) * p.scale;
          pst.m = std::max(pst.m, scores[static_cast<size_t>(t)]);
        }
        std::fill(part.begin(), part.end(), 0.0f);
        for (int t = 0; t < n_valid; ++t) {
          const float w = std::exp(scores[static_cast<size_t>(t)] - pst.m);
          pst.d += w;
          const float* vr = vp + t * d;
          for (int i = 0; i < d; ++i) part[static_cast<size_t>(i)] += w * vr[i];
        }
        merge(st, acc.data(), pst, part.data(), d);
      }
      float* o = p.out + (row * p.n_heads_q + hq) * d;
      const float inv = st.d > 0.0f ? 1.0f / st.d : 0.0f;
      for (int i = 0; i < d; ++i) o[i] = acc[static_cast<size_t>(i)] * inv;
      if (p.lse) p.lse[row * p.n_heads_q + hq] = st.lse();
    }
  });
}

void append_kv(const PageTable& table, PagePool& pool, int layer, const float* k, const float* v,
               const int32_t* pos, int64_t n_tok) {
  const int hkv = table.n_heads_kv();
  const int d = pool.head_dim();
  for (int64_t t = 0; t < n_tok; ++t) {
    DHS_ASSERT(pos[t] >= 0 && pos[t] < table.capacity_tokens());
    for (int h = 0; h < hkv; ++h) {
      int row;
      const PageRef pg = table.page_of_token(layer, h, pos[t], &row);
      std::memcpy(pool.k_page(pg) + row * d, k + (t * hkv + h) * d, static_cast<size_t>(d) * 4);
      std::memcpy(pool.v_page(pg) + row * d, v + (t * hkv + h) * d, static_cast<size_t>(d) * 4);
    }
  }
}

}  // namespace dhs::cpu
