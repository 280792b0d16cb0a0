#include "backend/cuda/packed_gemv.h"

#include <cuda_fp8.h>

#include <atomic>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/pdl_launch.h"
#include "backend/cuda/ptx.cuh"

namespace dhs::cuda {

namespace {

void require(bool cond, const char* what) {
  if (!cond) check(cudaErrorInvalidValue, what, __FILE__, __LINE__);
}

// ---- geometry ------------------------------------------------------------------------------------
// A block owns TILES x 16 output rows (mma tiles of 16); its warps split the rows' chunks into
// contiguous ranges, each warp computing every tile of its chunks (two tiles share each
// activation fragment, Q4_K's sum of x and the loop's overhead). Each warp streams its chunks
// through a private shared-memory ring with 16-byte cp.async: per slot, one chunk (256 elements)
// of the block's rows (codes, then the 16-byte meta) and of the NT activation rows. The ring's row
// pitches keep the fragment loads free of bank conflicts: a W row is 288 B (72 words, 8 mod 32:
// the 8-byte loads of 4 rows x 4 lanes hit 32 banks) for 1-byte codes and 144 B (36 words, 4 mod
// 32: the 4-byte loads of 8 rows x 4 lanes) for 4-bit codes; an activation row is 576 B (16 mod 32
// words: the 16-byte loads of 2 rows x 4 lanes).
template <PackedFormat F>
struct Geo {
  static constexpr int kCodeBytes = static_cast<int>(packed_code_bytes(F));
  static constexpr bool kMeta = packed_has_meta(F);
  static constexpr int kWPitch = F == PackedFormat::Q4_K ? 144 : 288;
  static constexpr int kXPitch = 576;
};

// Q4_K's per-chunk scales, one (ds, 1024 ds + dm) pair per (row, group), in a per-warp scratch whose
// 72-byte row pitch (18 words) keeps the 8 rows a warp reads at once on distinct banks.
constexpr int kScalePitch = 72;

// (Pick's probe instantiates Shape with one slot only to measure it; nvcc would warn that the probe's
// kWarps / kStages / kTiles are never read.)
#pragma nv_diag_suppress 177
// XREG: the activations are not staged; each lane loads its 16-byte fragments of x straight into
// registers (ld.global.nc, through L1), so a slot holds only the weights and more slots or blocks
// fit (the x part of a slot is as large as Q4_K's codes at 4 rows).
template <PackedFormat F, int WARPS, int STAGES, int TILES, bool XREG = false>
struct Shape {
  static constexpr int kWarps = WARPS;
  static constexpr int kStages = STAGES;
  static constexpr int kTiles = TILES;
  static constexpr int kRows = 16 * TILES;
  static constexpr bool kXReg = XREG;
  // One ring slot: a chunk of the block's rows and (unless XREG) of the NT activation rows.
  template <int NT>
  __host__ __device__ static constexpr int slot_bytes() {
    return kRows * Geo<F>::kWPitch + (XREG ? 0 : NT * Geo<F>::kXPitch);
  }
  // After the rings: the split-K partial sums (at the end) or Q4_K's scale scratch (in the loop).
  static constexpr int kTail = F == PackedFormat::Q4_K ? WARPS * kRows * kScalePitch : WARPS * kRows * 8 * 4;
  template <int NT>
  static constexpr int smem_bytes() {
    return WARPS * STAGES * slot_bytes<NT>() + kTail;
  }
};

// The deepest ring (2 to kMaxStages slots per warp) for which PER_SM blocks of WARPS warps and
// TILES tiles fit on one SM (228 KB of shared memory, 1 KB of it reserved per block). Measured on
// the H200: 5 slots at one activation row were slower than 4 for Q8_0 / FP8 (gate/up 46.8 / 41.1 us
// against 38.5 / 33.9).
template <PackedFormat F, int NT, int PER_SM, int WARPS = 4, int TILES = 1, bool XREG = false>
struct Pick {
  using Probe = Shape<F, WARPS, 1, TILES, XREG>;
  static constexpr int kMaxStages = F == PackedFormat::Q4_K ? 6 : 4;
  static constexpr int kBudget = 233472 / PER_SM - 1024;
  static constexpr int kFit = (kBudget - Probe::kTail) / (WARPS * Probe::template slot_bytes<NT>());
  using type = Shape<F, WARPS, (kFit < 2 ? 2 : kFit > kMaxStages ? kMaxStages : kFit), TILES, XREG>;
  static_assert(type::template smem_bytes<NT>() <= 232448, "packed_gemv: ring too large for one block");
};

__device__ __forceinline__ uint4 lds128(uint32_t a) {
  uint4 v;
  asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];\n" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "r"(a));
  return v;
}
__device__ __forceinline__ uint2 lds64(uint32_t a) {
  uint2 v;
  asm volatile("ld.shared.v2.u32 {%0, %1}, [%2];\n" : "=r"(v.x), "=r"(v.y) : "r"(a));
  return v;
}
__device__ __forceinline__ uint32_t lds32(uint32_t a) {
  uint32_t v;
  asm volatile("ld.shared.u32 %0, [%1];\n" : "=r"(v) : "r"(a));
  return v;
}

__device__ __forceinline__ uint4 ldg_nc128(const void* p) {
  uint4 v;
  asm volatile("ld.global.nc.v4.u32 {%0, %1, %2, %3}, [%4];\n" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
  return v;
}

__device__ __forceinline__ uint32_t hsub2_bits(uint32_t a, uint32_t b) {
  const __half2 r = __hsub2(*reinterpret_cast<const __half2*>(&a), *reinterpret_cast<const __half2*>(&b));
  return *reinterpret_cast<const uint32_t*>(&r);
}

// ---- decoding: 8 codes -> 4 f16 pairs (e0,e1) (e2,e3) (e4,e5) (e6,e7), exact -------------------
// int8: q + 128 as the low byte of the f16 1024 + (q + 128) (exponent byte 0x64), minus 1152.
__device__ __forceinline__ void decode_q8(uint2 w, uint32_t (&h)[4]) {
  const uint32_t lo = w.x ^ 0x80808080u, hi = w.y ^ 0x80808080u;
  constexpr uint32_t kMagic = 0x64806480u;  // f16 pair (1152, 1152)
  h[0] = hsub2_bits(__byte_perm(lo, 0x64646464u, 0x4140), kMagic);
  h[1] = hsub2_bits(__byte_perm(lo, 0x64646464u, 0x4342), kMagic);
  h[2] = hsub2_bits(__byte_perm(hi, 0x64646464u, 0x4140), kMagic);
  h[3] = hsub2_bits(__byte_perm(hi, 0x64646464u, 0x4342), kMagic);
}
// 4-bit (Q4_K packed nibble order, core/packed_layout.h): (word >> 4k) & 0x000F000F is the pair
// (2k, 2k+1); OR'd into 1024's f16 bits, minus 1024.
// Biased: the pairs are 1024 + q (exact in f16), and the kernel subtracts 1024 * sum(x) once per
// group in fp32 instead of one hsub2 per pair.
__device__ __forceinline__ void decode_q4_biased(uint32_t w, uint32_t (&h)[4]) {
  constexpr uint32_t k1024 = 0x64006400u;
#pragma unroll
  for (int k = 0; k < 4; ++k) asm("lop3.b32 %0, %1, 0x000F000F, %2, 0xEA;\n" : "=r"(h[k]) : "r"(w >> (4 * k)), "r"(k1024));
}
// E4M3 -> f16 is exact (cvt.rn.f16x2.e4m3x2).
__device__ __forceinline__ void decode_e4m3(uint2 w, uint32_t (&h)[4]) {
  const uint32_t v[2] = {w.x, w.y};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const __half2_raw r =
        __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(v[i / 2] >> (16 * (i % 2))), __NV_E4M3);
    h[i] = static_cast<uint32_t>(r.x) | (static_cast<uint32_t>(r.y) << 16);
  }
}

// Q4_K: sub-block j's 6-bit scale and min from the 12 bytes after d, dmin (dequant.cpp's
// unpack_k_scales): hdr = the 16-byte header as four words.
__device__ __forceinline__ void q4k_scale_min(const uint4& hdr, int j, float& ds, float& dm) {
  const auto byte = [](uint32_t v, int k) { return static_cast<int>((v >> (8 * k)) & 0xFF); };
  int sc, m;
  if (j < 4) {
    sc = byte(hdr.y, j) & 63;
    m = byte(hdr.z, j) & 63;
  } else {
    sc = (byte(hdr.w, j - 4) & 0xF) | ((byte(hdr.y, j - 4) >> 6) << 4);
    m = (byte(hdr.w, j - 4) >> 4) | ((byte(hdr.z, j - 4) >> 6) << 4);
  }
  const float d = __half2float(__ushort_as_half(static_cast<unsigned short>(hdr.x & 0xFFFF)));
  const float dmin = __half2float(__ushort_as_half(static_cast<unsigned short>(hdr.x >> 16)));
  ds = d * static_cast<float>(sc);  // exact in fp32 (11 x 6 bits), as the CPU's
  dm = dmin * static_cast<float>(m);
}

template <PackedFormat F, int NT, class S>
__global__ void __launch_bounds__(S::kWarps * 32) packed_gemv_kernel(const __grid_constant__ PackedGemvParams p) {
  using G = Geo<F>;
  extern __shared__ __align__(16) unsigned char smem[];
  constexpr int kSlot = S::template slot_bytes<NT>();
  constexpr int kSt = S::kStages, kW = S::kWarps, kRows = S::kRows, kTiles = S::kTiles;
  constexpr int kCB = G::kCodeBytes;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int g = lane >> 2, t = lane & 3;
  const int64_t row0 = static_cast<int64_t>(blockIdx.x) * kRows;
  const int64_t chunks = p.w.chunks, rows = p.w.rows, in = p.w.in;
  const int c_begin = static_cast<int>(chunks * warp / kW), c_end = static_cast<int>(chunks * (warp + 1) / kW);
  const uint32_t ring = ptx::smem_u32(smem) + warp * (kSt * kSlot);
  [[maybe_unused]] const uint32_t scales = ptx::smem_u32(smem) + kW * kSt * kSlot + warp * (kRows * kScalePitch);

  // Chunk c of the block's rows into ring slot `slot` (32-bit slot counters: a 64-bit c % kSt was ~20
  // instructions), the chunks in increasing order: codes as
  // kRows x kCB / 16 units of 16 bytes, lane l on unit column l % kCols of rows l / kCols + i *
  // (32 / kCols), then (lanes 0-15) the rows' 16-byte meta. Each lane keeps its source pointers
  // and steps them one chunk per copy (no index arithmetic per copy); rows past the matrix are
  // zero-filled (their sums are never stored).
  constexpr int kCols = kCB / 16, kRowsPerIt = 32 / kCols, kIt = kRows / kRowsPerIt;
  static_assert(kRows % kRowsPerIt == 0, "packed_gemv: code units must tile the warp");
  const int lr = lane / kCols, lu = lane % kCols;
  const int64_t row_bytes = chunks * kCB;
  const uint8_t* code_src = p.w.codes + (row0 + lr) * row_bytes + c_begin * kCB + 16 * lu;
  uint32_t code_live = 0;  // bit i: row lr + i * kRowsPerIt is inside the matrix
#pragma unroll
  for (int i = 0; i < kIt; ++i) code_live |= (row0 + lr + i * kRowsPerIt < rows ? 1u : 0u) << i;
  static_assert(kRows <= 32, "packed_gemv: one lane copies each row's meta");
  const bool meta_live = G::kMeta && lane < kRows && row0 + lane < rows;
  const uint8_t* meta_src = G::kMeta ? p.w.meta + (row0 + lane % kRows) * chunks * kPackMetaBytes + c_begin * kPackMetaBytes : nullptr;
  const auto copy_w = [&](int c, int slot) {
    if (c >= c_end) return;
    const uint32_t dst = ring + static_cast<uint32_t>(slot * kSlot);
#pragma unroll
    for (int i = 0; i < kIt; ++i) {
      const bool live = (code_live >> i) & 1u;
      ptx::cp_async_16(dst + (lr + i * kRowsPerIt) * G::kWPitch + 16 * lu,
                       live ? code_src + i * kRowsPerIt * row_bytes : p.w.codes, live ? 16 : 0);
    }
    code_src += kCB;
    if constexpr (G::kMeta) {
      if (lane < kRows) ptx::cp_async_16(dst + lane * G::kWPitch + kCB, meta_live ? meta_src : p.w.meta, meta_live ? 16 : 0);
      meta_src += kPackMetaBytes;
    }
  };
  // The activations of chunk c (the previous kernel's output: only after the wait); past `in`
  // zero-filled.
  const auto copy_x = [&](int c, int slot) {
    if (S::kXReg || c >= c_end) return;
    const uint32_t dst = ring + static_cast<uint32_t>(slot * kSlot) + kRows * G::kWPitch;
    const int64_t e = static_cast<int64_t>(c) * kPackChunk + 8 * lane;
    const bool ok = e < in;
#pragma unroll
    for (int i = 0; i < NT; ++i) ptx::cp_async_16(dst + i * G::kXPitch + 16 * lane, ok ? p.x + i * in + e : p.x, ok ? 16 : 0);
  };

#pragma unroll
  for (int i = 0; i < kSt - 1; ++i) {
    copy_w(c_begin + i, i);
    ptx::cp_async_commit();
  }
  ptx::griddep_wait();
  ptx::griddep_launch_dependents();
#pragma unroll
  for (int i = 0; i < kSt - 1; ++i) copy_x(c_begin + i, i);
  ptx::cp_async_commit();

  constexpr uint32_t kOnes = 0x3C003C00u;  // f16 pair (1, 1)
  [[maybe_unused]] const uint32_t ones[4] = {kOnes, kOnes, kOnes, kOnes};
  float acc[kTiles][4] = {};
  int use = 0, load = kSt - 1;  // ring slots of chunk c and of chunk c + kSt - 1
  for (int c = c_begin; c < c_end; ++c) {
    if (c == c_begin) ptx::cp_async_wait<0>();
    else ptx::cp_async_wait<kSt - 2>();
    __syncwarp();
    copy_w(c + kSt - 1, load);
    copy_x(c + kSt - 1, load);
    ptx::cp_async_commit();
    const uint32_t slot = ring + static_cast<uint32_t>(use * kSlot);
    use = use + 1 == kSt ? 0 : use + 1;
    load = load + 1 == kSt ? 0 : load + 1;
    // Lanes past the last activation row read row NT - 1 (their columns are never stored): no
    // predicate and no zeroed registers per group.
    const int gx = g < NT ? g : NT - 1;
    const uint32_t xs = slot + kRows * G::kWPitch + gx * G::kXPitch;
    // XREG: the chunk's x fragments, loaded first (their latency behind the scale scratch);
    // elements past `in` (Q8_0 / FP8's last chunk) are zero.
    [[maybe_unused]] uint4 xr[8];
    if constexpr (S::kXReg) {
      const __half* xrow = p.x + gx * in;
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        const int64_t e = static_cast<int64_t>(c) * kPackChunk + 32 * j + 8 * t;
        xr[j] = F == PackedFormat::Q4_K || e < in ? ldg_nc128(xrow + e) : make_uint4(0, 0, 0, 0);  // (Q4_K: in % 256 == 0)
      }
    }
    // Tile u's rows g and g + 8 of the slot.
    const auto w_row = [&](int u, int hi) { return slot + (16 * u + g + 8 * hi) * G::kWPitch; };
    uint4 meta[kTiles][2] = {};
    if constexpr (F == PackedFormat::Q8_0) {
#pragma unroll
      for (int u = 0; u < kTiles; ++u) {
        meta[u][0] = lds128(w_row(u, 0) + kCB);
        meta[u][1] = lds128(w_row(u, 1) + kCB);
      }
    }
    if constexpr (F == PackedFormat::Q4_K) {
      // The chunk's kRows rows x 8 groups of (ds, 1024 ds + dm), once per warp: (row, half) pairs
      // lane, lane + 32, ..., a pair's half h taking groups 4 h .. 4 h + 3 (the 4 lanes of a quad
      // shared each row's work before). dequant.cpp's unpack_k_scales four bytes at a time: groups
      // 0-3 are the low 6 bits of header bytes 4-7 (scales) and 8-11 (mins); groups 4-7 take their
      // low 4 bits from bytes 12-15 and their high 2 from the top of bytes 4-7 / 8-11.
#pragma unroll
      for (int i = 0; i < kTiles; ++i) {
        const int r = (lane + 32 * i) >> 1;
        const bool h = lane & 1;
        const uint4 hdr = lds128(slot + r * G::kWPitch + kCB);
        const uint32_t sc4 = h ? (hdr.w & 0x0F0F0F0Fu) | ((hdr.y >> 2) & 0x30303030u) : hdr.y & 0x3F3F3F3Fu;
        const uint32_t m4 = h ? ((hdr.w >> 4) & 0x0F0F0F0Fu) | ((hdr.z >> 2) & 0x30303030u) : hdr.z & 0x3F3F3F3Fu;
        const float d = __half2float(__ushort_as_half(static_cast<unsigned short>(hdr.x & 0xFFFF)));
        const float dmin = __half2float(__ushort_as_half(static_cast<unsigned short>(hdr.x >> 16)));
        const uint32_t at = scales + r * kScalePitch + 32 * h;
#pragma unroll
        for (int q = 0; q < 4; ++q) {
          const float ds = d * static_cast<float>((sc4 >> (8 * q)) & 0xFF);  // exact (11 x 6 bits), as the CPU's
          const float dm = dmin * static_cast<float>((m4 >> (8 * q)) & 0xFF);
          asm volatile("st.shared.v2.f32 [%0], {%1, %2};\n" ::"r"(at + 8 * q), "f"(ds), "f"(fmaf(1024.0f, ds, dm)));
        }
      }
      __syncwarp();
    }
#pragma unroll
    for (int j = 0; j < 8; ++j) {  // 32-element groups of the chunk
      uint4 xv;
      if constexpr (S::kXReg) xv = xr[j];
      else xv = lds128(xs + 64 * j + 16 * t);
      [[maybe_unused]] float sx[4] = {};  // Q4_K: the group's sum of x per token (the same on every row)
      if constexpr (F == PackedFormat::Q4_K) {
        ptx::mma_f16_16816(sx, ones, xv.x, xv.y);
        ptx::mma_f16_16816(sx, ones, xv.z, xv.w);
      }
#pragma unroll
      for (int u = 0; u < kTiles; ++u) {
        uint32_t lo[4], hi[4];
        if constexpr (F == PackedFormat::Q4_K) {
          decode_q4_biased(lds32(w_row(u, 0) + 16 * j + 4 * t), lo);
          decode_q4_biased(lds32(w_row(u, 1) + 16 * j + 4 * t), hi);
        } else if constexpr (F == PackedFormat::Q8_0) {
          decode_q8(lds64(w_row(u, 0) + 32 * j + 8 * t), lo);
          decode_q8(lds64(w_row(u, 1) + 32 * j + 8 * t), hi);
        } else {
          decode_e4m3(lds64(w_row(u, 0) + 32 * j + 8 * t), lo);
          decode_e4m3(lds64(w_row(u, 1) + 32 * j + 8 * t), hi);
        }
        const uint32_t a0[4] = {lo[0], hi[0], lo[1], hi[1]};
        const uint32_t a1[4] = {lo[2], hi[2], lo[3], hi[3]};
        float* ac = acc[u];
        if constexpr (F == PackedFormat::FP8) {
          ptx::mma_f16_16816(acc[u], a0, xv.x, xv.y);
          ptx::mma_f16_16816(acc[u], a1, xv.z, xv.w);
        } else {
          float blk[4] = {};
          ptx::mma_f16_16816(blk, a0, xv.x, xv.y);
          ptx::mma_f16_16816(blk, a1, xv.z, xv.w);
          if constexpr (F == PackedFormat::Q8_0) {
            const auto scale = [&](const uint4& m) {
              const uint32_t word = (&m.x)[j / 2];
              return __half2float(__ushort_as_half(static_cast<unsigned short>(word >> (16 * (j % 2)))));
            };
            const float d_lo = scale(meta[u][0]), d_hi = scale(meta[u][1]);
            ac[0] = fmaf(d_lo, blk[0], ac[0]);
            ac[1] = fmaf(d_lo, blk[1], ac[1]);
            ac[2] = fmaf(d_hi, blk[2], ac[2]);
            ac[3] = fmaf(d_hi, blk[3], ac[3]);
          } else {
            // blk = sum (1024 + q) x: the group adds ds * blk - (1024 ds + dm) * sum x.
            const uint32_t sa = scales + (16 * u + g) * kScalePitch + 8 * j;
            float s_lo[2], s_hi[2];
            asm volatile("ld.shared.v2.f32 {%0, %1}, [%2];\n" : "=f"(s_lo[0]), "=f"(s_lo[1]) : "r"(sa));
            asm volatile("ld.shared.v2.f32 {%0, %1}, [%2];\n" : "=f"(s_hi[0]), "=f"(s_hi[1]) : "r"(sa + 8 * kScalePitch));
            ac[0] = fmaf(-s_lo[1], sx[0], fmaf(s_lo[0], blk[0], ac[0]));
            ac[1] = fmaf(-s_lo[1], sx[1], fmaf(s_lo[0], blk[1], ac[1]));
            ac[2] = fmaf(-s_hi[1], sx[2], fmaf(s_hi[0], blk[2], ac[2]));
            ac[3] = fmaf(-s_hi[1], sx[3], fmaf(s_hi[0], blk[3], ac[3]));
          }
        }
      }
    }
    __syncwarp();
  }
  ptx::cp_async_wait<0>();

  // Split-K: the warps' [kRows rows][8 tokens] sums through shared memory, added in warp order.
  float* part = reinterpret_cast<float*>(smem + kW * kSt * kSlot);
  if constexpr (F == PackedFormat::Q4_K) __syncthreads();  // (the partials reuse the warps' scale scratch)
  float* mine = part + warp * (kRows * 8);
#pragma unroll
  for (int u = 0; u < kTiles; ++u) {
    mine[(16 * u + g) * 8 + 2 * t] = acc[u][0];
    mine[(16 * u + g) * 8 + 2 * t + 1] = acc[u][1];
    mine[(16 * u + g + 8) * 8 + 2 * t] = acc[u][2];
    mine[(16 * u + g + 8) * 8 + 2 * t + 1] = acc[u][3];
  }
  __syncthreads();
  for (int e = threadIdx.x; e < kRows * 8; e += kW * 32) {
    const int r = e >> 3, tok = e & 7;
    if (tok < NT && row0 + r < rows) {
      float v = 0.0f;
#pragma unroll
      for (int k = 0; k < kW; ++k) v += part[k * (kRows * 8) + r * 8 + tok];
      if constexpr (F == PackedFormat::FP8) v *= p.w.row_scale[row0 + r];
      const int64_t at = tok * p.ldy + row0 + r;
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

template <PackedFormat F, int NT, class S>
void launch_shape(const PackedGemvParams& p, cudaStream_t stream) {
  static std::atomic<bool> attrs_set[kMaxDevices] = {};
  int dev = 0;
  DHS_CUDA_CHECK(cudaGetDevice(&dev));
  if (dev >= kMaxDevices) check(cudaErrorInvalidDevice, "packed_gemv: device index out of range", __FILE__, __LINE__);
  constexpr int kSmem = S::template smem_bytes<NT>();
  if (!attrs_set[dev].load(std::memory_order_acquire)) {
    DHS_CUDA_CHECK(cudaFuncSetAttribute(packed_gemv_kernel<F, NT, S>, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem));
    DHS_CUDA_CHECK(cudaFuncSetAttribute(packed_gemv_kernel<F, NT, S>, cudaFuncAttributePreferredSharedMemoryCarveout,
                                        cudaSharedmemCarveoutMaxShared));
    attrs_set[dev].store(true, std::memory_order_release);
  }
  const unsigned grid = static_cast<unsigned>((p.w.rows + S::kRows - 1) / S::kRows);
  launch_pdl(packed_gemv_kernel<F, NT, S>, dim3(grid), dim3(S::kWarps * 32), kSmem, stream, p);
}

int sm_count() {
  static std::atomic<int> sms[kMaxDevices] = {};
  int dev = 0;
  DHS_CUDA_CHECK(cudaGetDevice(&dev));
  if (dev >= kMaxDevices) check(cudaErrorInvalidDevice, "packed_gemv: device index out of range", __FILE__, __LINE__);
  int n = sms[dev].load(std::memory_order_relaxed);
  if (n == 0) {
    DHS_CUDA_CHECK(cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev));
    sms[dev].store(n, std::memory_order_relaxed);
  }
  return n;
}

// The block's form and ring (Pick), from sweeps of every form on the 8B shape's matrices at 1, 2,
// 4 and 8 activation rows (docs/kernels/quant_gemv_NOTES.md). Q8_0 / FP8 (H200, session 21): 8
// warps per block up to 4 rows (gate/up Q8_0 32.8 against 39.0 us with 4), except the QKV matrix
// at 1-2 rows (384 blocks: one tile, 4 warps, 3 blocks per SM, one wave); from 5 rows two tiles
// per warp on large matrices, else one tile and 4 warps. Q4_K, whose loop issues ~2x the
// instructions per byte (H100, session 36): 8 warps and 2 blocks per SM where one-tile blocks
// would not give 2 per SM (down: 256 blocks), 16 warps at one row where each warp still gets 2
// chunks or more (down 13.6 against 15.3 us); on the QKV matrix 8 warps and 3 per SM up to 4
// rows (7.4 against 7.9 us at one row), one tile and 4 per SM at 8; on large matrices 8 warps
// and 3 per SM at 1-2 rows (gate/up 24.7 against 29.1 us for two tiles), two tiles with x in
// registers from 3 (29.5 against 34.3 us at 8 rows).
int auto_shape(PackedFormat f, int n_tok, int64_t grid, int64_t sms, int64_t chunks) {
  const bool qkv_like = grid > 2 * sms && grid <= 3 * sms, large = grid >= 8 * sms;
  if (f == PackedFormat::Q4_K) {
    if (grid <= 2 * sms) return n_tok == 1 && chunks >= 32 ? 6 : 2;
    if (large) return n_tok <= 2 ? 4 : 5;
    return n_tok <= 4 ? 4 : 1;
  }
  if (n_tok <= 2) return qkv_like ? 1 : 2;
  if (n_tok <= 4) return 2;
  return large ? 3 : 1;
}

template <PackedFormat F, int NT>
void launch_nt(const PackedGemvParams& p, cudaStream_t stream) {
  const int64_t grid = (p.w.rows + 15) / 16, sms = sm_count();
  const int shape = p.shape != 0 ? p.shape : auto_shape(F, NT, grid, sms, p.w.chunks);
  constexpr int kOne = F == PackedFormat::Q4_K ? 4 : 2;  // blocks per SM of the one-tile form
  // Q4_K's two further forms (docs/kernels/quant_gemv_NOTES.md, session 36's sweep): 8 warps
  // and 3 blocks per SM; two tiles with the activations in registers.
  if constexpr (F == PackedFormat::Q4_K) {
    if (shape == 4) return launch_shape<F, NT, typename Pick<F, NT, 3, 8, 1>::type>(p, stream);
    if (shape == 5) return launch_shape<F, NT, typename Pick<F, NT, 4, 4, 2, true>::type>(p, stream);
    if (shape == 6) {  // 16 warps, 2-slot rings: two blocks per SM where they fit
      using S16 = Shape<F, 16, 2, 1>;
      if constexpr (S16::template smem_bytes<NT>() <= 232448) return launch_shape<F, NT, S16>(p, stream);
      else return launch_shape<F, NT, typename Pick<F, NT, 2, 8, 1>::type>(p, stream);  // (as shape 2)
    }
  }
  switch (shape) {
    case 2: launch_shape<F, NT, typename Pick<F, NT, 2, 8, 1>::type>(p, stream); break;
    case 3: launch_shape<F, NT, typename Pick<F, NT, 3, 4, 2>::type>(p, stream); break;
    default:
      if (F != PackedFormat::Q4_K && grid > 2 * sms && grid <= 3 * sms)
        launch_shape<F, NT, typename Pick<F, NT, 3>::type>(p, stream);
      else
        launch_shape<F, NT, typename Pick<F, NT, kOne>::type>(p, stream);
  }
}

template <PackedFormat F>
void launch_format(const PackedGemvParams& p, cudaStream_t stream) {
  switch (p.n_tok) {
    case 1: launch_nt<F, 1>(p, stream); break;
    case 2: launch_nt<F, 2>(p, stream); break;
    case 3: launch_nt<F, 3>(p, stream); break;
    case 4: launch_nt<F, 4>(p, stream); break;
    case 5: launch_nt<F, 5>(p, stream); break;
    case 6: launch_nt<F, 6>(p, stream); break;
    case 7: launch_nt<F, 7>(p, stream); break;
    default: launch_nt<F, 8>(p, stream); break;
  }
}

void require_view(const PackedWeightView& w) {
  const auto aligned = [](const void* q) { return (reinterpret_cast<uintptr_t>(q) & 15) == 0; };
  require(w.rows > 0 && w.in > 0 && w.in % 8 == 0 && w.chunks == (w.in + kPackChunk - 1) / kPackChunk,
          "packed weights: bad shape (in must be a multiple of 8, chunks = ceil(in / 256))");
  require(w.format != PackedFormat::Q8_0 || w.in % 32 == 0, "packed weights: Q8_0 needs in % 32 == 0");
  require(w.format != PackedFormat::Q4_K || w.in % 256 == 0, "packed weights: Q4_K needs in % 256 == 0");
  require(w.codes != nullptr && aligned(w.codes), "packed weights: codes must be 16-byte aligned");
  if (packed_has_meta(w.format)) require(w.meta != nullptr && aligned(w.meta), "packed weights: meta must be 16-byte aligned");
  else require(w.row_scale != nullptr, "packed weights: FP8 needs its row scales");
  require((w.rows + 15) / 16 < (int64_t{1} << 31), "packed weights: too many rows");
}

// One thread per 8 weights of a row: (row, chunk, group of 8) -> 8 f16 values, each by the
// expression dequant.cpp evaluates (Q4_K: (d*sc) * q - dmin*m; as v1's decoders, tested equal
// to f16 of the CPU's value bit for bit).
template <PackedFormat F>
__global__ void unpack_rows_kernel(const PackedWeightView w, __half* dst, int64_t ld_dst) {
  const int64_t per_row = w.in / 8;
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= w.rows * per_row) return;
  const int64_t r = i / per_row, e0 = 8 * (i % per_row);
  const int64_t c = e0 / kPackChunk, in_c = e0 % kPackChunk;
  const int64_t rc = r * w.chunks + c;
  float v[8];
  if constexpr (F == PackedFormat::Q4_K) {
    const int j = static_cast<int>(in_c / 32), word = static_cast<int>(in_c % 32) / 8;
    const uint4 hdr = *reinterpret_cast<const uint4*>(w.meta + rc * kPackMetaBytes);
    const uint32_t codes = *reinterpret_cast<const uint32_t*>(w.codes + rc * 128 + 16 * j + 4 * word);
    float ds, dm;
    q4k_scale_min(hdr, j, ds, dm);
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const uint32_t pair = (codes >> (4 * k)) & 0x000F000Fu;
      v[2 * k] = ds * static_cast<float>(pair & 0xF) - dm;
      v[2 * k + 1] = ds * static_cast<float>(pair >> 16) - dm;
    }
  } else {
    const uint8_t* q = w.codes + rc * 256 + in_c;
    if constexpr (F == PackedFormat::Q8_0) {
      const float d = __half2float(*reinterpret_cast<const __half*>(w.meta + rc * kPackMetaBytes + 2 * (in_c / 32)));
#pragma unroll
      for (int k = 0; k < 8; ++k) v[k] = __fmul_rn(d, static_cast<float>(static_cast<int8_t>(q[k])));
    } else {
      const float s = w.row_scale[r];
#pragma unroll
      for (int k = 0; k < 8; ++k) {
        const __half_raw h = __nv_cvt_fp8_to_halfraw(static_cast<__nv_fp8_storage_t>(q[k]), __NV_E4M3);
        v[k] = __fmul_rn(s, __half2float(__half(h)));
      }
    }
  }
  __half* o = dst + r * ld_dst + e0;
#pragma unroll
  for (int k = 0; k < 8; ++k) o[k] = __float2half_rn(v[k]);
}

__device__ __forceinline__ uint32_t hash32(uint64_t seed, uint64_t i) {  // splitmix64's finalizer
  uint64_t z = seed + 0x9E3779B97F4A7C15ull * (i + 1);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return static_cast<uint32_t>((z ^ (z >> 31)) >> 16);
}

// One thread per 4 code bytes; the first thread of each (row, chunk) writes its meta too.
__global__ void fill_random_packed_kernel(PackedWeightView w, uint64_t seed, float a) {
  const int64_t cb = w.format == PackedFormat::Q4_K ? 128 : 256;  // packed_code_bytes (host-only)
  const int64_t words = w.rows * w.chunks * cb / 4;
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= words) return;
  uint32_t v = hash32(seed, static_cast<uint64_t>(i));
  if (w.format == PackedFormat::FP8) v &= 0xF7F7F7F7u;  // exponent field <= 14: finite, |v| <= 240
  reinterpret_cast<uint32_t*>(const_cast<uint8_t*>(w.codes))[i] = v;
  const int64_t rc = i * 4 / cb;
  if ((i * 4) % cb != 0) return;
  if (w.format == PackedFormat::FP8) {
    if (rc % w.chunks == 0) const_cast<float*>(w.row_scale)[rc / w.chunks] = a / 240.0f;
    return;
  }
  uint32_t* m = reinterpret_cast<uint32_t*>(const_cast<uint8_t*>(w.meta) + rc * kPackMetaBytes);
  if (w.format == PackedFormat::Q8_0) {
    const uint32_t d = __half_as_ushort(__float2half_rn(a / 127.0f));
    for (int k = 0; k < 4; ++k) m[k] = d | (d << 16);
  } else {
    const uint32_t d = __half_as_ushort(__float2half_rn(a / 945.0f));
    const uint32_t dmin = __half_as_ushort(__float2half_rn(a / 126.0f));
    m[0] = d | (dmin << 16);
    for (int k = 1; k < 4; ++k) m[k] = hash32(seed ^ 0x5CA1Eull, static_cast<uint64_t>(rc * 4 + k));
  }
}

}  // namespace

void fill_random_packed(const PackedWeightView& w, uint64_t seed, float a, cudaStream_t stream) {
  require_view(w);
  const int64_t words = w.rows * w.chunks * packed_code_bytes(w.format) / 4;
  fill_random_packed_kernel<<<static_cast<unsigned>((words + 255) / 256), 256, 0, stream>>>(w, seed, a);
  DHS_CUDA_CHECK(cudaGetLastError());
}

size_t packed_bytes(const PackedWeightView& w) {
  const size_t n = static_cast<size_t>(w.rows * w.chunks);
  return n * static_cast<size_t>(packed_code_bytes(w.format)) + (packed_has_meta(w.format) ? n * kPackMetaBytes : 0) +
         (w.format == PackedFormat::FP8 ? static_cast<size_t>(w.rows) * 4 : 0);
}

void launch_packed_gemv(const PackedGemvParams& p, cudaStream_t stream) {
  require_view(p.w);
  require(p.n_tok >= 1 && p.n_tok <= 8, "packed_gemv: n_tok must be 1..8");
  require(p.ldy >= p.w.rows && p.x != nullptr && p.y != nullptr, "packed_gemv: bad ldy or null pointer");
  require(p.shape >= 0 && p.shape < packed_shapes(p.w.format), "packed_gemv: no such block form for this format");
  require((reinterpret_cast<uintptr_t>(p.x) & 15) == 0, "packed_gemv: activations must be 16-byte aligned");
  require((reinterpret_cast<uintptr_t>(p.y) & (p.y_f32 ? 3 : 1)) == 0, "packed_gemv: misaligned output");
  require(!p.accumulate || p.y_f32, "packed_gemv: accumulate needs fp32 output");
  switch (p.w.format) {
    case PackedFormat::Q8_0: launch_format<PackedFormat::Q8_0>(p, stream); break;
    case PackedFormat::Q4_K: launch_format<PackedFormat::Q4_K>(p, stream); break;
    case PackedFormat::FP8: launch_format<PackedFormat::FP8>(p, stream); break;
  }
  DHS_CUDA_CHECK(cudaGetLastError());
}

void launch_unpack_rows(const PackedWeightView& w, __half* dst, int64_t ld_dst, cudaStream_t stream) {
  require_view(w);
  require(dst != nullptr && ld_dst >= w.in, "unpack_rows: bad ld_dst or null pointer");
  const int64_t n = w.rows * (w.in / 8);
  const unsigned grid = static_cast<unsigned>((n + 255) / 256);
  switch (w.format) {
    case PackedFormat::Q8_0: unpack_rows_kernel<PackedFormat::Q8_0><<<grid, 256, 0, stream>>>(w, dst, ld_dst); break;
    case PackedFormat::Q4_K: unpack_rows_kernel<PackedFormat::Q4_K><<<grid, 256, 0, stream>>>(w, dst, ld_dst); break;
    case PackedFormat::FP8: unpack_rows_kernel<PackedFormat::FP8><<<grid, 256, 0, stream>>>(w, dst, ld_dst); break;
  }
  DHS_CUDA_CHECK(cudaGetLastError());
}

}  // namespace dhs::cuda
