// draft_seeds.h: one block per (request, KV head) list. The seed_cap largest keys among the
// list's selected pages are found by a radix select over the masses' float bits (non-negative
// floats order as their bits: four 8-bit passes with a shared histogram), ties at the threshold
// going to the lowest page indices (the list is in ascending page order: a block prefix count);
// the chosen ones are then ranked by counting and written heaviest first.
#include "backend/cuda/block_sum.cuh"
#include "backend/cuda/draft_seeds.h"
#include "backend/cuda/pdl_launch.h"
#include "backend/cuda/ptx.cuh"

namespace dhs::cuda {

namespace {

constexpr int kThreads = 256;


__global__ void __launch_bounds__(kThreads) record_seeds_kernel(const __grid_constant__ RecordSeedsParams p) {
  ptx::griddep_wait();  // the select launch's lists and masses
  ptx::griddep_launch_dependents();
  const int row = blockIdx.x;
  const int req = row / p.n_heads_kv, h = row - req * p.n_heads_kv;
  const int seq = p.seq_len[req];
  const int slot = p.req_slot[req];
  // A per-row verify: only its last row (the next request continues the same row of the store).
  if (req + 1 < p.n_requests && p.req_slot[req + 1] == slot && p.seq_len[req + 1] == seq + 1) return;
  const int dbase = p.dense_indptr[row], n = p.dense_indptr[row + 1] - dbase;
  const int q_len = p.q_indptr[req + 1] - p.q_indptr[req];
  const RowRule rr = p.row_rules != nullptr ? p.row_rules[req] : p.rule;
  // The select kernel's lists that were not cut by mass (their masses unwritten): no record.
  if (n == 0 || q_len == 0 || seq < p.dense_below || rr.all_pages || rr.rule == SelectRule::SinkWindow) return;
  if (rr.rule == SelectRule::Coverage && rr.gamma >= 1.0f) return;
  if (rr.rule == SelectRule::TopK) {
    const int k = p.budget_frac && p.row_rules == nullptr ? static_cast<int>(ceilf(p.budget_frac[h] * static_cast<float>(n)))
                  : rr.frac > 0.0f ? static_cast<int>(ceilf(rr.frac * static_cast<float>(n)))
                                   : rr.budget;
    if (k >= n) return;
  }
  const int sb = p.sel_indptr[row], c = p.sel_indptr[row + 1] - sb;
  const int m = p.seed_cap;
  int32_t* out = p.seeds + ((static_cast<int64_t>(slot) * p.n_layers + p.layer) * p.n_heads_kv + h) * m;
  auto key = [&](int e) { return __float_as_uint(p.mass[dbase + p.sel_page_pos[sb + e]]); };

  __shared__ int s_red[kThreads / 32];
  __shared__ unsigned s_hist[256];
  __shared__ unsigned s_prefix;  // the threshold's bits found so far
  __shared__ int s_need;         // keys still to take at or below the current prefix
  __shared__ uint32_t s_key[kMaxSeedPages];
  __shared__ int32_t s_page[kMaxSeedPages];
  __shared__ int s_n;

  unsigned thr = 0;  // the m-th largest key (0: every key is taken)
  int n_above = 0;   // keys > thr
  if (c > m) {
    if (threadIdx.x == 0) {
      s_prefix = 0;
      s_need = m;
    }
    for (int shift = 24; shift >= 0; shift -= 8) {
      for (int i = threadIdx.x; i < 256; i += kThreads) s_hist[i] = 0;
      __syncthreads();
      const unsigned hi_mask = shift == 24 ? 0u : ~0u << (shift + 8);
      const unsigned prefix = s_prefix;
      for (int e = threadIdx.x; e < c; e += kThreads) {
        const unsigned k = key(e);
        if ((k & hi_mask) == (prefix & hi_mask)) atomicAdd(&s_hist[(k >> shift) & 255u], 1u);
      }
      __syncthreads();
      if (threadIdx.x == 0) {  // the digit where the count from the top reaches s_need
        int need = s_need;
        int d = 255;
        for (; d > 0; --d) {
          const int cnt = static_cast<int>(s_hist[d]);
          if (cnt >= need) break;
          need -= cnt;
        }
        s_prefix = prefix | (static_cast<unsigned>(d) << shift);
        s_need = need;
      }
      __syncthreads();
    }
    thr = s_prefix;
    int above = 0;
    for (int e = threadIdx.x; e < c; e += kThreads) above += key(e) > thr ? 1 : 0;
    n_above = block_sum<kThreads>(above, s_red);  // (s_red is next written after a __syncthreads)
  }
  // Take every key above thr and the first (m - n_above) equal to it in list order (lowest pages).
  if (threadIdx.x == 0) s_n = 0;
  __syncthreads();
  const int eq_take = c > m ? m - n_above : 0;
  int eq_before = 0;  // equal keys in earlier chunks
  for (int e0 = 0; e0 < c; e0 += kThreads) {
    const int e = e0 + threadIdx.x;
    const unsigned k = e < c ? key(e) : 0u;
    const bool eq = c > m && e < c && k == thr;
    // This thread's rank among the chunk's equal keys (warp ballots, then the warps before it).
    const unsigned ball = __ballot_sync(0xffffffffu, eq);
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    if (lane == 0) s_red[warp] = __popc(ball);
    __syncthreads();
    int before = eq_before + __popc(ball & ((1u << lane) - 1u));
    int chunk_eq = 0;
    for (int w = 0; w < kThreads / 32; ++w) {
      if (w < warp) before += s_red[w];
      chunk_eq += s_red[w];
    }
    __syncthreads();
    const bool take = e < c && (c <= m || k > thr || (eq && before < eq_take));
    if (take) {
      const int at = atomicAdd(&s_n, 1);
      s_key[at] = k;
      s_page[at] = p.sel_page_pos[sb + e];
    }
    eq_before += chunk_eq;
  }
  __syncthreads();
  const int taken = s_n;
  // Heaviest first: rank by (key desc, page asc); unfilled entries -1.
  for (int i = threadIdx.x; i < m; i += kThreads) {
    if (i >= taken) {
      out[i] = -1;
      continue;
    }
    int rank = 0;
    for (int j = 0; j < taken; ++j)
      rank += (s_key[j] > s_key[i] || (s_key[j] == s_key[i] && s_page[j] < s_page[i])) ? 1 : 0;
    out[rank] = s_page[i];
  }
}

}  // namespace

void launch_record_seeds(const RecordSeedsParams& p, cudaStream_t stream) {
  if (p.n_requests == 0 || p.seed_cap == 0) return;
  launch_pdl(record_seeds_kernel, dim3(static_cast<unsigned>(p.n_requests * p.n_heads_kv)), dim3(kThreads), 0, stream, p);
}

}  // namespace dhs::cuda
