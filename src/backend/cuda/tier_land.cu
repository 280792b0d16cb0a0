// Landing: a layer's late pages copied into HBM in the step, keys rewritten; see tier_land.h.
#include "backend/cuda/tier_land.h"

#include <string>

#include "backend/cuda/cuda_check.h"
#include "dhisparse/error.h"

namespace dhs::cuda {

namespace {

constexpr int kThreads = 256;  // one block per row, a warp per 32 entries at a time
constexpr int kWordsInFlight = 16;  // 16-byte words a lane loads before it stores (256 B)

// A warp copies one page (K then V words) from mapped DRAM to HBM, each lane's loads in flight
// together, streaming both ways (the bytes cross once; attention's L2 lines keep their place).
__device__ void copy_page(const LandLateParams& p, int64_t host_slot, int64_t dev_slot, int lane) {
  const int total = 2 * p.page_words;
  const uint4* hk = reinterpret_cast<const uint4*>(p.host_k) + host_slot * p.page_words;
  const uint4* hv = reinterpret_cast<const uint4*>(p.host_v) + host_slot * p.page_words;
  uint4* dk = reinterpret_cast<uint4*>(p.dev_k) + dev_slot * p.page_words;
  uint4* dv = reinterpret_cast<uint4*>(p.dev_v) + dev_slot * p.page_words;
  for (int w0 = 0; w0 < total; w0 += 32 * kWordsInFlight) {
    uint4 r[kWordsInFlight];
#pragma unroll
    for (int j = 0; j < kWordsInFlight; ++j) {
      const int w = w0 + j * 32 + lane;
      if (w < total) r[j] = __ldcs(w < p.page_words ? hk + w : hv + (w - p.page_words));
    }
#pragma unroll
    for (int j = 0; j < kWordsInFlight; ++j) {
      const int w = w0 + j * 32 + lane;
      if (w < total) __stcs(w < p.page_words ? dk + w : dv + (w - p.page_words), r[j]);
    }
  }
}

// A warp copies the rows kept under key `from` to key `to` in every follow array.
__device__ void copy_rows(const LandLateParams& p, int64_t from, int64_t to, int lane) {
  for (int a = 0; a < p.n_follow; ++a) {
    const int64_t words = p.follow[a].row_bytes / 16;
    uint4* base = static_cast<uint4*>(p.follow[a].base);
    for (int64_t w = lane; w < words; w += 32) base[to * words + w] = base[from * words + w];
  }
}

__global__ void __launch_bounds__(kThreads) land_late_kernel(const __grid_constant__ LandLateParams p) {
  const int row = static_cast<int>(blockIdx.x);
  const int b = p.indptr[row], e = p.indptr[row + 1];
  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
  const int cap = p.land_avail ? min(p.land_cap, max(*p.land_avail, 0)) : p.land_cap;
  for (int base = b + warp * 32; base < e; base += kThreads) {
    const int k = base + lane;
    const int32_t key = k < e ? p.slots[k] : -1;
    int64_t h = -1;
    int32_t d = -1;
    bool adopted = false;
    if (key >= p.n_device) {
      h = static_cast<int64_t>(key) - p.n_device;
      if (h >= p.n_host) {
        if (p.n_bad) atomicAdd(p.n_bad, 1);
      } else {
        const int claim = atomicAdd(p.land_n, 1);
        if (claim < cap) {
          d = p.land_slots[claim];
          if (d < 0 || d >= p.n_device) {
            if (p.n_bad) atomicAdd(p.n_bad, 1);
            d = -1;
          } else {
            const int32_t pos = p.page_pos[k];
            if (!p.table) {
              adopted = true;
            } else if (pos >= 0 && pos < p.max_pages) {
              const int64_t list = static_cast<int64_t>(p.layer) * p.n_heads_kv + row % p.n_heads_kv;
              const int64_t off = (static_cast<int64_t>(p.req_slot[row / p.n_heads_kv]) * p.n_lists + list) * p.max_pages + pos;
              adopted = atomicCAS(p.table + off, key, d) == key;
            } else if (p.n_bad) {
              atomicAdd(p.n_bad, 1);
            }
            int32_t* l = p.log + 6 * static_cast<int64_t>(claim);
            l[0] = row;
            l[1] = p.layer;
            l[2] = pos;
            l[3] = d;
            l[4] = static_cast<int32_t>(h);
            l[5] = adopted ? 1 : 0;
          }
        }
      }
    }
    if (k < e) p.slots_out[k] = d >= 0 ? d : key;
    // The warp copies its landed pages one after another.
    unsigned todo = __ballot_sync(0xffffffffu, d >= 0);
    while (todo) {
      const int src = __ffs(static_cast<int>(todo)) - 1;
      todo &= todo - 1;
      const int64_t hs = __shfl_sync(0xffffffffu, h, src);
      const int32_t ds = __shfl_sync(0xffffffffu, d, src);
      copy_page(p, hs, ds, lane);
    }
    // And the rows of the pages it adopted.
    if (p.table && p.n_follow > 0) {
      unsigned rows = __ballot_sync(0xffffffffu, adopted);
      while (rows) {
        const int src = __ffs(static_cast<int>(rows)) - 1;
        rows &= rows - 1;
        const int64_t hs = __shfl_sync(0xffffffffu, h, src);
        const int32_t ds = __shfl_sync(0xffffffffu, d, src);
        copy_rows(p, p.n_device + hs, ds, lane);
      }
    }
  }
}

void require(bool cond, const std::string& what) {
  if (!cond) throw Error(what);
}

}  // namespace

void launch_land_late(const LandLateParams& p, cudaStream_t stream) {
  if (p.n_rows <= 0) return;
  land_late_kernel<<<static_cast<unsigned>(p.n_rows), kThreads, 0, stream>>>(p);
  DHS_CUDA_CHECK(cudaGetLastError());
}

void land_late_pages(const LandLateParams& p, cudaStream_t stream) {
  require(p.n_rows >= 0 && p.n_device >= 0 && p.n_host >= 0 && p.land_cap >= 0 && p.page_words > 0,
          "land_late_pages: negative sizes or an empty page");
  require(p.n_rows == 0 || (p.indptr && p.slots && p.slots_out && p.page_pos && p.land_n),
          "land_late_pages: lists in and out and the counter needed");
  require(p.land_cap == 0 || (p.land_slots && p.log), "land_late_pages: a landing stack needs its slots and its log");
  require(p.host_k && p.host_v && p.dev_k && p.dev_v, "land_late_pages: both tiers' K and V needed");
  require(!p.table || (p.req_slot && p.n_lists > 0 && p.max_pages > 0 && p.n_heads_kv > 0 && p.n_rows % p.n_heads_kv == 0 &&
                       (p.layer + 1) * p.n_heads_kv <= p.n_lists),
          "land_late_pages: a page table needs the request slots and its shape (lists, pages, KV heads)");
  require(p.n_follow >= 0 && p.n_follow <= LandLateParams::kMaxFollow, "land_late_pages: at most 4 row arrays follow a page");
  for (int a = 0; a < p.n_follow; ++a)
    require(p.follow[a].base && p.follow[a].row_bytes > 0 && p.follow[a].row_bytes % 16 == 0,
            "land_late_pages: a row array needs its base and rows of a positive multiple of 16 bytes");
  launch_land_late(p, stream);
}

}  // namespace dhs::cuda
