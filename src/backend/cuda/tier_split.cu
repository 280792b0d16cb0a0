// The recall-ahead schedule's split of a layer's lists by tier and the LSE merge of the two
// attention results; see tier_split.h. The CPU statement is kv/tier_split.cpp.
#include "backend/cuda/tier_split.h"

#include <cub/block/block_scan.cuh>

#include <algorithm>
#include <climits>
#include <string>

#include "backend/cuda/cuda_check.h"
#include "core/merge_state.h"
#include "dhisparse/error.h"

namespace dhs::cuda {

namespace {

void require(bool cond, const std::string& what) {
  if (!cond) throw Error(what);
}

constexpr int kRowThreads = 256;   // count and scatter: one block per row
constexpr int kScanThreads = 1024;  // the row scan: one block

// Late entries (key >= n_device) of each row.
__global__ void __launch_bounds__(kRowThreads) tier_count_kernel(const __grid_constant__ TierSplitParams p) {
  const int row = static_cast<int>(blockIdx.x);
  const int b = p.indptr[row], e = p.indptr[row + 1];
  int n = 0;
  for (int k = b + static_cast<int>(threadIdx.x); k < e; k += kRowThreads) n += p.slots[k] >= p.n_device;
  __shared__ int total;
  if (threadIdx.x == 0) total = 0;
  __syncthreads();
  n += __shfl_xor_sync(0xffffffffu, n, 16);
  n += __shfl_xor_sync(0xffffffffu, n, 8);
  n += __shfl_xor_sync(0xffffffffu, n, 4);
  n += __shfl_xor_sync(0xffffffffu, n, 2);
  n += __shfl_xor_sync(0xffffffffu, n, 1);
  if ((threadIdx.x & 31) == 0 && n) atomicAdd(&total, n);
  __syncthreads();
  if (threadIdx.x == 0) p.late_count[row] = total;
}

// Both parts' indptr: exclusive scans of the rows' late and resident counts, in tiles of the
// block with a carry.
__global__ void __launch_bounds__(kScanThreads) tier_scan_kernel(const __grid_constant__ TierSplitParams p) {
  using Scan = cub::BlockScan<int2, kScanThreads>;
  __shared__ typename Scan::TempStorage tmp;
  __shared__ int2 carry;
  if (threadIdx.x == 0) {
    carry = make_int2(0, 0);
    p.dev_indptr[0] = 0;
    p.late_indptr[0] = 0;
  }
  __syncthreads();
  for (int base = 0; base < p.n_rows; base += kScanThreads) {
    const int r = base + static_cast<int>(threadIdx.x);
    int2 v = make_int2(0, 0);  // (resident, late)
    if (r < p.n_rows) {
      const int late = p.late_count[r];
      v = make_int2(p.indptr[r + 1] - p.indptr[r] - late, late);
    }
    int2 incl, tile_total;
    Scan(tmp).InclusiveScan(
        v, incl, [](const int2& a, const int2& b) { return make_int2(a.x + b.x, a.y + b.y); }, tile_total);
    const int2 c = carry;
    if (r < p.n_rows) {
      p.dev_indptr[r + 1] = c.x + incl.x;
      p.late_indptr[r + 1] = c.y + incl.y;
    }
    __syncthreads();  // (every thread read carry and tmp before they change)
    if (threadIdx.x == 0) carry = make_int2(c.x + tile_total.x, c.y + tile_total.y);
    __syncthreads();
  }
}

// Each row's entries to their part, in order: a block-wide exclusive scan of the late flags per
// tile of the row, with a carry.
__global__ void __launch_bounds__(kRowThreads) tier_scatter_kernel(const __grid_constant__ TierSplitParams p) {
  using Scan = cub::BlockScan<int, kRowThreads>;
  __shared__ typename Scan::TempStorage tmp;
  const int row = static_cast<int>(blockIdx.x);
  const int b = p.indptr[row], e = p.indptr[row + 1];
  const int dev0 = p.dev_indptr[row], late0 = p.late_indptr[row];
  int late_before = 0;  // late entries of the row before this tile
  for (int base = b; base < e; base += kRowThreads) {
    const int k = base + static_cast<int>(threadIdx.x);
    const int32_t s = k < e ? p.slots[k] : 0;
    const int late = k < e && s >= p.n_device ? 1 : 0;
    int excl, tile_late;
    Scan(tmp).ExclusiveSum(late, excl, tile_late);
    if (k < e) {
      const int32_t pos = p.page_pos[k];
      if (late) {
        const int j = late0 + late_before + excl;
        p.late_slots[j] = p.late_keys ? s : s - p.n_device;
        p.late_page_pos[j] = pos;
        if (p.late_log) {
          const int at = atomicAdd(p.late_log_n, 1);
          if (at < p.late_log_cap) {
            p.late_log[3 * at] = row;
            p.late_log[3 * at + 1] = p.layer;
            p.late_log[3 * at + 2] = pos;
          }
        }
      } else {
        const int j = dev0 + (k - b) - (late_before + excl);
        p.dev_slots[j] = s;
        p.dev_page_pos[j] = pos;
        if (p.last_use) {
          const int32_t stamp = *p.stamp;
          if (atomicExch(p.last_use + s, stamp) != stamp && p.read_slots) {  // (first mark this step)
            const int at = atomicAdd(p.read_n, 1);
            if (at < p.read_cap) p.read_slots[at] = s;
          }
        }
      }
    }
    late_before += tile_late;
    __syncthreads();  // (tmp is reused by the next tile)
  }
}

// One warp per (row, q head): each lane its head_dim / 32 elements, merged by merge_normalized.
constexpr int kMergeWarps = 8;
__global__ void __launch_bounds__(32 * kMergeWarps) merge_late_kernel(const __grid_constant__ MergeLateParams p) {
  const int i = static_cast<int>(blockIdx.x) * kMergeWarps + static_cast<int>(threadIdx.x / 32);
  if (i >= p.n) return;
  const int lane = static_cast<int>(threadIdx.x & 31);
  const int per_lane = p.head_dim / 32;  // <= 8
  float a[8], o[8];
  __half* out = p.out + static_cast<int64_t>(i) * p.head_dim;
  const __half* late = p.late_out + static_cast<int64_t>(i) * p.head_dim;
  for (int j = 0; j < per_lane; ++j) {
    a[j] = __half2float(out[lane + 32 * j]);
    o[j] = __half2float(late[lane + 32 * j]);
  }
  float lse = p.lse[i];
  merge_normalized(a, lse, o, p.late_lse[i], per_lane);
  for (int j = 0; j < per_lane; ++j) out[lane + 32 * j] = __float2half_rn(a[j]);
  __syncwarp();
  if (lane == 0) p.lse[i] = lse;
}

}  // namespace

TierSplitLists::TierSplitLists(int max_rows, int64_t max_nnz) : max_rows_(max_rows), max_nnz_(max_nnz) {
  require(max_rows >= 1 && max_nnz >= 0, "TierSplitLists: max_rows must be >= 1 and max_nnz >= 0");
  const size_t rows = static_cast<size_t>(max_rows) + 1, nnz = static_cast<size_t>(std::max<int64_t>(max_nnz, 1));
  DHS_CUDA_CHECK(cudaMalloc(&dev_indptr_, rows * sizeof(int32_t)));
  DHS_CUDA_CHECK(cudaMalloc(&late_indptr_, rows * sizeof(int32_t)));
  DHS_CUDA_CHECK(cudaMalloc(&late_count_, rows * sizeof(int32_t)));
  DHS_CUDA_CHECK(cudaMalloc(&dev_slots_, nnz * sizeof(int32_t)));
  DHS_CUDA_CHECK(cudaMalloc(&dev_page_pos_, nnz * sizeof(int32_t)));
  DHS_CUDA_CHECK(cudaMalloc(&late_slots_, nnz * sizeof(int32_t)));
  DHS_CUDA_CHECK(cudaMalloc(&late_page_pos_, nnz * sizeof(int32_t)));
}

TierSplitLists::~TierSplitLists() {
  for (int32_t* p : {dev_indptr_, late_indptr_, late_count_, dev_slots_, dev_page_pos_, late_slots_, late_page_pos_})
    cudaFree(p);
}

void launch_tier_split(const TierSplitParams& p, cudaStream_t stream) {
  if (p.n_rows <= 0) return;
  tier_count_kernel<<<p.n_rows, kRowThreads, 0, stream>>>(p);
  tier_scan_kernel<<<1, kScanThreads, 0, stream>>>(p);
  tier_scatter_kernel<<<p.n_rows, kRowThreads, 0, stream>>>(p);
}

void split_lists_by_tier(const int32_t* indptr, const int32_t* slots, const int32_t* page_pos, int n_rows,
                         int64_t n_device, TierSplitLists& out, cudaStream_t stream, const TierSplitLog& log,
                         bool late_keys) {
  require(n_rows >= 1 && n_rows <= out.max_rows(),
          "split_lists_by_tier: " + std::to_string(n_rows) + " rows, the buffers hold " + std::to_string(out.max_rows()));
  require(indptr != nullptr && slots != nullptr && page_pos != nullptr, "split_lists_by_tier: null lists");
  require(n_device >= 0 && n_device < INT32_MAX, "split_lists_by_tier: device pool of " + std::to_string(n_device) + " pages");
  TierSplitParams p;
  p.indptr = indptr;
  p.slots = slots;
  p.page_pos = page_pos;
  p.n_rows = n_rows;
  p.n_device = static_cast<int32_t>(n_device);
  p.dev_indptr = out.dev_indptr();
  p.dev_slots = out.dev_slots();
  p.dev_page_pos = out.dev_page_pos();
  p.late_indptr = out.late_indptr();
  p.late_slots = out.late_slots();
  p.late_page_pos = out.late_page_pos();
  p.late_count = out.late_count();
  require(log.entries == nullptr || (log.count != nullptr && log.cap > 0), "split_lists_by_tier: a log needs its count and capacity");
  p.late_log = log.entries;
  p.late_log_n = log.count;
  p.late_log_cap = log.cap;
  p.layer = log.layer;
  require(log.last_use == nullptr || log.stamp != nullptr, "split_lists_by_tier: a last-use record needs its stamp");
  p.last_use = log.last_use;
  p.stamp = log.stamp;
  require(log.read_slots == nullptr || (log.last_use != nullptr && log.read_n != nullptr && log.read_cap > 0),
          "split_lists_by_tier: a read-slot list needs the last-use record, its count and capacity");
  p.read_slots = log.read_slots;
  p.read_n = log.read_n;
  p.read_cap = log.read_cap;
  p.late_keys = late_keys;
  launch_tier_split(p, stream);
}

void launch_merge_late(const MergeLateParams& p, cudaStream_t stream) {
  if (p.n <= 0) return;
  merge_late_kernel<<<(p.n + kMergeWarps - 1) / kMergeWarps, 32 * kMergeWarps, 0, stream>>>(p);
}

void merge_late_attention(const MergeLateParams& p, cudaStream_t stream) {
  require(p.head_dim >= 32 && p.head_dim <= 256 && p.head_dim % 32 == 0,
          "merge_late_attention: head_dim " + std::to_string(p.head_dim) + " (a multiple of 32 up to 256)");
  require(p.n >= 0 && (p.n == 0 || (p.out && p.lse && p.late_out && p.late_lse)), "merge_late_attention: null tensor");
  launch_merge_late(p, stream);
}

}  // namespace dhs::cuda
