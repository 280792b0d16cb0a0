#include "backend/cuda/gemv.h"

#include <atomic>
#include <cassert>
#include <type_traits>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/gemv_common.cuh"
#include "backend/cuda/pdl_launch.h"
#include "backend/cuda/ptx.cuh"

namespace dhs::cuda {

namespace {

constexpr int kWarps = 8;  // per block
constexpr int kUnroll = 4; // 16-byte weight loads per row in flight per lane


// Weights are read once per step: streamed past L1 (ld.global.nc.L1::no_allocate).
__device__ __forceinline__ uint4 ld_stream(const uint4* p) {
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p));
  return v;
}

// One warp owns ROWS consecutive output rows. Lane l reads 16-byte words l, l + 32, ... of each
// row (kUnroll words per row in flight) and the same words of the NT activation rows, keeps
// ROWS x NT fp32 partial dot products, and the warp adds them up at the end.
template <int NT, int ROWS>
__global__ void __launch_bounds__(kWarps * 32) gemv_kernel(const __grid_constant__ GemvParams p) {
  const int lane = threadIdx.x & 31;
  const int64_t row0 = (static_cast<int64_t>(blockIdx.x) * kWarps + (threadIdx.x >> 5)) * ROWS;
  if (row0 >= p.out) return;
  const int64_t n_words = p.in / 8;
  const uint4* x = reinterpret_cast<const uint4*>(p.x);
  const uint4* w[ROWS];
#pragma unroll
  for (int r = 0; r < ROWS; ++r)  // rows past `out` re-read the last row; their sums are dropped
    w[r] = reinterpret_cast<const uint4*>(p.w) + min(row0 + r, p.out - 1) * n_words;
  float acc[ROWS][NT] = {};
  uint4 wv[kUnroll][ROWS];
  const auto load_w = [&](int64_t k0) {
#pragma unroll
    for (int u = 0; u < kUnroll; ++u)
#pragma unroll
      for (int r = 0; r < ROWS; ++r)
        wv[u][r] = k0 + u * 32 < n_words ? ld_stream(w[r] + k0 + u * 32) : make_uint4(0, 0, 0, 0);
  };
  // The first weights are in flight before the wait for x, the previous kernel's output
  // (pdl_launch.h): they stream while that kernel drains.
  load_w(lane);
  ptx::griddep_wait();
  ptx::griddep_launch_dependents();
  for (int64_t k0 = lane; k0 < n_words; k0 += 32 * kUnroll) {
    if (k0 != lane) load_w(k0);
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t k = k0 + u * 32;
      if (k >= n_words) break;
#pragma unroll
      for (int t = 0; t < NT; ++t) {
        float xf[8];
        unpack8(__ldg(x + t * n_words + k), xf);
#pragma unroll
        for (int r = 0; r < ROWS; ++r) {
          float wf[8];
          unpack8(wv[u][r], wf);
#pragma unroll
          for (int i = 0; i < 8; ++i) acc[r][t] = fmaf(wf[i], xf[i], acc[r][t]);
        }
      }
    }
  }
  warp_sum_store<ROWS, NT>(acc, lane, row0, p.out, p.out, p.y, p.y_f32, p.accumulate);
}

// ---- 1 .. 8 rows of activations on tensor cores ------------------------------------------------
// At 2-8 rows the CUDA-core kernel above spends more on its FMAs and f16 unpacking than on the
// bytes (1.3x / 1.9x cuBLASLt at 4 / 8 rows, ops_NOTES.md), and cuBLASLt streams the weights at
// ~3.7 TB/s. Here a block owns 16 output rows and its 4 or 8 warps split `in` into contiguous ranges;
// each warp streams its 16 row segments into a private shared-memory ring with cp.async, whole
// 256-byte row pieces per copy (what HBM reads well; loading mma fragments straight from global
// memory touches 8 rows x 64 B per instruction and ran at 2.3 TB/s, v2 in ops_NOTES.md), then
// feeds mma.m16n8k16 with W as A (16 rows) and the activations as B (8 columns, the tokens).
//
// K is permuted inside each 32-element chunk so that every fragment is one 16-byte load: lane
// (g, t) = (lane / 4, lane % 4) reads elements 8t .. 8t+7 of the chunk, of W rows g and g + 8 and of
// activation row g; the first mma takes their elements 0-3 as the fragment's k = {2t, 2t+1,
// 2t+8, 2t+9}, the second elements 4-7. The same permutation on both operands leaves the sums
// unchanged. The activations travel in the same ring (after the wait: they are the previous
// kernel's output), so no load outside it sits between a slot's arrival and its MMAs. The
// ring's rows are 256 or 512 B apart (a multiple of the 128 B of all banks); 16-byte unit u of row
// r sits at u ^ 4 (r & 1), so the 8 lanes of a load phase (two rows, four units each) hit
// distinct banks.
// The ring's shape is a template (TcShape) so that shapes can be timed against each other
// (GemvKernel::tc_shape, the benchmark's sweep); the default is the one measured fastest.
// (Blocks of two 16-row tiles sharing each B fragment were timed at 17d09a5 / a611638 and were
// 3-8% slower at every row count: ops_NOTES.md, v3; removed.)
template <int WARPS, int STAGES, int UNITS>
struct TcShape {
  static constexpr int kWarps = WARPS;    // per block, splitting `in`
  static constexpr int kStages = STAGES;  // ring slots per warp
  static constexpr int kUnits = UNITS;    // 16-byte units per row per slot
  static constexpr int kRows = 16;        // output rows per block
  static constexpr int kRowBytes = UNITS * 16;
  // A slot: kRows weight rows, then the NT activation rows of the same elements.
  template <int NT>
  __host__ __device__ static constexpr int slot_bytes() { return (kRows + NT) * kRowBytes; }
  template <int NT>
  static constexpr int smem_bytes() { return WARPS * STAGES * slot_bytes<NT>() + WARPS * kRows * 8 * 4; }
};

__device__ __forceinline__ uint4 lds128(uint32_t addr) {
  uint4 v;
  asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];\n" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "r"(addr));
  return v;
}

// Byte offset of 16-byte unit u of ring row r (the bank swizzle above).
template <int ROW_BYTES>
__device__ __forceinline__ uint32_t tc_at(int r, int u) {
  return static_cast<uint32_t>(r * ROW_BYTES + ((u ^ ((r & 1) << 2)) * 16));
}

template <int NT, class S>
__global__ void __launch_bounds__(S::kWarps * 32) gemv_tc_kernel(const __grid_constant__ GemvParams p) {
  extern __shared__ __align__(16) unsigned char smem[];
  constexpr int kSlot = S::template slot_bytes<NT>();
  constexpr int kU = S::kUnits, kRow = S::kRowBytes, kSt = S::kStages, kW = S::kWarps;
  constexpr int kRows = S::kRows;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int g = lane >> 2, t = lane & 3;
  const int64_t row0 = static_cast<int64_t>(blockIdx.x) * kRows;
  const int64_t n_units = p.in / 8;  // 16-byte units per row
  const int64_t n_slots = (n_units + kU - 1) / kU;
  // This warp's slots [s_begin, s_end) of every row.
  const int64_t s_begin = n_slots * warp / kW, s_end = n_slots * (warp + 1) / kW;
  const uint32_t ring = ptx::smem_u32(smem) + warp * (kSt * kSlot);
  const uint4* w = reinterpret_cast<const uint4*>(p.w);
  const uint4* x = reinterpret_cast<const uint4*>(p.x);

  // Slot s of the row range into ring slot s % kSt, consecutive lanes along a row (32 / kU rows
  // per copy instruction): rows past `out` re-read the last row, units past the row's end are
  // zero-filled.
  const auto copy_w = [&](int64_t s) {
    if (s >= s_end) return;
    const uint32_t dst = ring + static_cast<uint32_t>(s % kSt) * kSlot;
#pragma unroll
    for (int i = 0; i < kRows * kU / 32; ++i) {
      const int r = (i * 32 + lane) / kU, u = (i * 32 + lane) % kU;
      const int64_t unit = s * kU + u;
      const int64_t row = min(row0 + r, p.out - 1);
      const bool ok = unit < n_units;
      ptx::cp_async_16(dst + tc_at<kRow>(r, u), ok ? w + row * n_units + unit : w, ok ? 16 : 0);
    }
  };
  // The activations of slot s (the previous kernel's output: only after the wait).
  const auto copy_x = [&](int64_t s) {
    if (s >= s_end) return;
    const uint32_t dst = ring + static_cast<uint32_t>(s % kSt) * kSlot + kRows * kRow;
#pragma unroll
    for (int i = 0; i < (NT * kU + 31) / 32; ++i) {
      const int r = (i * 32 + lane) / kU, u = (i * 32 + lane) % kU;
      const int64_t unit = s * kU + u;
      const bool ok = unit < n_units;
      if (r < NT) ptx::cp_async_16(dst + tc_at<kRow>(r, u), ok ? x + r * n_units + unit : x, ok ? 16 : 0);
    }
  };

  // The weights do not depend on earlier kernels: the first slots are in flight before the wait.
#pragma unroll
  for (int i = 0; i < kSt - 1; ++i) {
    copy_w(s_begin + i);
    ptx::cp_async_commit();
  }
  ptx::griddep_wait();
  ptx::griddep_launch_dependents();
#pragma unroll
  for (int i = 0; i < kSt - 1; ++i) copy_x(s_begin + i);
  ptx::cp_async_commit();

  float acc[4] = {};
  for (int64_t s = s_begin; s < s_end; ++s) {
    // Slot s has landed: the first time every group so far (the prologue's weights and
    // activations), then all but the newest kSt - 2 (one refill per later slot).
    if (s == s_begin) ptx::cp_async_wait<0>();
    else ptx::cp_async_wait<kSt - 2>();
    __syncwarp();  // the lanes' copies are visible to the warp; and slot s - 1 is free again
    copy_w(s + kSt - 1);
    copy_x(s + kSt - 1);
    ptx::cp_async_commit();  // an empty group past the end keeps the wait counts uniform
    const uint32_t slot = ring + static_cast<uint32_t>(s % kSt) * kSlot;
#pragma unroll
    for (int j = 0; j < kU / 4; ++j) {
      const uint4 xv = g < NT ? lds128(slot + kRows * kRow + tc_at<kRow>(g, 4 * j + t)) : make_uint4(0, 0, 0, 0);
      const uint4 lo = lds128(slot + tc_at<kRow>(g, 4 * j + t));
      const uint4 hi = lds128(slot + tc_at<kRow>(g + 8, 4 * j + t));
      const uint32_t a0[4] = {lo.x, hi.x, lo.y, hi.y};
      const uint32_t a1[4] = {lo.z, hi.z, lo.w, hi.w};
      ptx::mma_f16_16816(acc, a0, xv.x, xv.y);
      ptx::mma_f16_16816(acc, a1, xv.z, xv.w);
    }
    __syncwarp();  // every lane is done with slot s before the next iteration refills it
  }
  ptx::cp_async_wait<0>();

  // Split-K: the warps' [kRows rows][8 tokens] sums through shared memory, added in warp order.
  float* part = reinterpret_cast<float*>(smem + kW * kSt * kSlot);
  float* mine = part + warp * (kRows * 8);
  mine[g * 8 + 2 * t] = acc[0];
  mine[g * 8 + 2 * t + 1] = acc[1];
  mine[(g + 8) * 8 + 2 * t] = acc[2];
  mine[(g + 8) * 8 + 2 * t + 1] = acc[3];
  __syncthreads();
  for (int e = threadIdx.x; e < kRows * 8; e += kW * 32) {  // one (row, token) per thread
    const int r = e >> 3, tok = e & 7;
    if (tok < NT && row0 + r < p.out) {
      float v = 0.0f;
#pragma unroll
      for (int k = 0; k < kW; ++k) v += part[k * (kRows * 8) + r * 8 + tok];
      const int64_t at = tok * p.out + row0 + r;
      if (p.y_f32) {
        float* y = static_cast<float*>(p.y);
        y[at] = p.accumulate ? y[at] + v : v;
      } else {
        static_cast<__half*>(p.y)[at] = __float2half_rn(v);
      }
    }
  }
}

constexpr int kMaxDevices = 64;

template <int NT, class S>
void launch_tc_shape(const GemvParams& p, cudaStream_t stream) {
  // The shared-memory attributes hold per device: set once on each (first use is not concurrent:
  // graph capture and the engine's step run on one host thread per device).
  static std::atomic<bool> attrs_set[kMaxDevices] = {};
  int dev = 0;
  DHS_CUDA_CHECK(cudaGetDevice(&dev));
  if (dev >= kMaxDevices) check(cudaErrorInvalidDevice, "launch_gemv: device index out of range", __FILE__, __LINE__);
  if (!attrs_set[dev].load(std::memory_order_acquire)) {
    DHS_CUDA_CHECK(cudaFuncSetAttribute(gemv_tc_kernel<NT, S>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                        S::template smem_bytes<NT>()));
    DHS_CUDA_CHECK(cudaFuncSetAttribute(gemv_tc_kernel<NT, S>, cudaFuncAttributePreferredSharedMemoryCarveout,
                                        cudaSharedmemCarveoutMaxShared));
    attrs_set[dev].store(true, std::memory_order_release);
  }
  const unsigned grid = static_cast<unsigned>((p.out + S::kRows - 1) / S::kRows);
  launch_pdl(gemv_tc_kernel<NT, S>, dim3(grid), dim3(S::kWarps * 32), S::template smem_bytes<NT>(), stream, p);
}

template <int NT>
void launch_tc(const GemvParams& p, int shape, cudaStream_t stream) {
  // The default by rows of activations, from the sweep in ops_NOTES.md (v3): with 1-2 rows 8 warps
  // of 3 slots fit twice per SM; from 3 rows on they fit once, and 4 warps of 4 slots (twice per
  // SM) stream best.
  using Default = std::conditional_t<NT <= 2, TcShape<8, 3, 16>, TcShape<4, 4, 16>>;
  switch (shape) {
    case 1: launch_tc_shape<NT, TcShape<4, 3, 16>>(p, stream); break;
    case 2: launch_tc_shape<NT, TcShape<4, 4, 16>>(p, stream); break;
    case 3: launch_tc_shape<NT, TcShape<4, 2, 32>>(p, stream); break;
    case 4: launch_tc_shape<NT, TcShape<8, 3, 16>>(p, stream); break;
    default: launch_tc_shape<NT, Default>(p, stream); break;
  }
}

template <int NT>
void launch_nt(const GemvParams& p, cudaStream_t stream) {
  constexpr int ROWS = NT <= 2 ? 2 : 4;  // more rows per warp amortize the activation loads
  const int64_t rows_per_block = int64_t{kWarps} * ROWS;
  const unsigned grid = static_cast<unsigned>((p.out + rows_per_block - 1) / rows_per_block);
  launch_pdl(gemv_kernel<NT, ROWS>, dim3(grid), dim3(kWarps * 32), 0, stream, p);
}

}  // namespace

bool gemv_supported(const GemvParams& p) {
  const auto aligned = [](const void* q) { return (reinterpret_cast<uintptr_t>(q) & 15) == 0; };
  return p.n_tok >= 1 && p.n_tok <= kGemvMaxTok && p.in > 0 && p.in % 8 == 0 && p.out > 0 &&
         (p.out + kWarps * 4) / (kWarps * 2) < (int64_t{1} << 31) && aligned(p.w) && aligned(p.x) &&
         (!p.accumulate || p.y_f32);
}

namespace {
// NT rows of activations on the kernel the caller picks.
template <int NT>
void launch_rows(const GemvParams& p, const GemvKernel& k, cudaStream_t stream) {
  if (k.tensor_cores) launch_tc<NT>(p, k.tc_shape, stream);
  else launch_nt<NT>(p, stream);
}
}  // namespace

void launch_gemv(const GemvParams& p, cudaStream_t stream, const GemvKernel& kernel) {
  assert(gemv_supported(p));
  switch (p.n_tok) {
    case 1: launch_rows<1>(p, kernel, stream); break;
    case 2: launch_rows<2>(p, kernel, stream); break;
    case 3: launch_rows<3>(p, kernel, stream); break;
    case 4: launch_rows<4>(p, kernel, stream); break;
    case 5: launch_rows<5>(p, kernel, stream); break;
    case 6: launch_rows<6>(p, kernel, stream); break;
    case 7: launch_rows<7>(p, kernel, stream); break;
    case 8: launch_rows<8>(p, kernel, stream); break;
    default: check(cudaErrorInvalidValue, "launch_gemv: n_tok must be 1..8", __FILE__, __LINE__);
  }
  DHS_CUDA_CHECK(cudaGetLastError());
}

}  // namespace dhs::cuda
