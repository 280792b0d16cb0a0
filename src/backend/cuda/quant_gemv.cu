#include "backend/cuda/quant_gemv.h"

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/gemv_common.cuh"

namespace dhs::cuda {

namespace {

void require(bool cond, const char* what) {
  if (!cond) check(cudaErrorInvalidValue, what, __FILE__, __LINE__);
}

__device__ __forceinline__ float ld_f16(const uint8_t* p) {  // 2-byte aligned
  return __half2float(__ushort_as_half(__ldg(reinterpret_cast<const unsigned short*>(p))));
}
__device__ __forceinline__ uint32_t ld_u8(const uint8_t* p) { return __ldg(p); }

// A 32-weight group of a row, decoded in 4 pieces of 8 (elements 8 * piece .. + 7). init() reads
// what the whole group shares (scales, pointers); piece() the weights, each as dequant.cpp
// computes it. One specialisation per format.
template <DType T>
struct Group;

template <>
struct Group<DType::F16> {
  const uint8_t* b;
  __device__ void init(const uint8_t* row, int64_t g) { b = row + 64 * g; }
  __device__ void piece(int p, float (&w)[8]) const {
    unpack8(__ldg(reinterpret_cast<const uint4*>(b + 16 * p)), w);
  }
};

// Q8_0 (34 B): f16 d, int8 q[32]; w = d * q.
template <>
struct Group<DType::Q8_0> {
  const uint8_t* b;
  float d;
  __device__ void init(const uint8_t* row, int64_t g) {
    b = row + 34 * g;
    d = ld_f16(b);
  }
  __device__ void piece(int p, float (&w)[8]) const {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const unsigned short two = __ldg(reinterpret_cast<const unsigned short*>(b + 2 + 8 * p + 2 * i));
      w[2 * i] = d * static_cast<float>(static_cast<int8_t>(two & 0xFF));
      w[2 * i + 1] = d * static_cast<float>(static_cast<int8_t>(two >> 8));
    }
  }
};

// Q4_0 (18 B): f16 d, qs[16]; element e < 16 the low nibble of qs[e], e >= 16 the high nibble of
// qs[e - 16]; w = d * (nibble - 8).
template <>
struct Group<DType::Q4_0> {
  const uint8_t* qs;
  float d;
  __device__ void init(const uint8_t* row, int64_t g) {
    const uint8_t* b = row + 18 * g;
    d = ld_f16(b);
    qs = b + 2;
  }
  __device__ void piece(int p, float (&w)[8]) const {
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const uint32_t byte = ld_u8(qs + 8 * (p & 1) + i);
      const int nib = static_cast<int>(p < 2 ? byte & 15u : byte >> 4);
      w[i] = d * static_cast<float>(nib - 8);
    }
  }
};

// Q4_1 (20 B): f16 d, f16 m, qs[16] (nibbles as Q4_0); w = nibble * d + m.
template <>
struct Group<DType::Q4_1> {
  const uint8_t* qs;
  float d, m;
  __device__ void init(const uint8_t* row, int64_t g) {
    const uint8_t* b = row + 20 * g;
    d = ld_f16(b);
    m = ld_f16(b + 2);
    qs = b + 4;
  }
  __device__ void piece(int p, float (&w)[8]) const {
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const uint32_t byte = ld_u8(qs + 8 * (p & 1) + i);
      w[i] = fmaf(static_cast<float>(p < 2 ? byte & 15u : byte >> 4), d, m);  // (the product is exact)
    }
  }
};

// Q5_0 (22 B): f16 d, u32 qh (little-endian), qs[16]; the fifth bit of element e is bit e of qh;
// w = d * (q - 16).
template <>
struct Group<DType::Q5_0> {
  const uint8_t* qs;
  float d;
  uint32_t qh;
  __device__ void init(const uint8_t* row, int64_t g) {
    const uint8_t* b = row + 22 * g;
    d = ld_f16(b);
    qh = ld_u8(b + 2) | (ld_u8(b + 3) << 8) | (ld_u8(b + 4) << 16) | (ld_u8(b + 5) << 24);
    qs = b + 6;
  }
  __device__ void piece(int p, float (&w)[8]) const {
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const int e = 8 * p + i;
      const uint32_t byte = ld_u8(qs + 8 * (p & 1) + i);
      const int q = static_cast<int>((p < 2 ? byte & 15u : byte >> 4) | (((qh >> e) & 1u) << 4));
      w[i] = d * static_cast<float>(q - 16);
    }
  }
};

// The 6-bit scale and min of sub-block j of a Q4_K / Q5_K super-block (12 bytes at s, the layout
// in dequant.cpp), as d * scale and dmin * min.
__device__ __forceinline__ void k_scale_min(const uint8_t* s, int j, float d, float dmin, float& dj, float& mj) {
  int sc, mn;
  if (j < 4) {
    sc = static_cast<int>(ld_u8(s + j) & 63u);
    mn = static_cast<int>(ld_u8(s + j + 4) & 63u);
  } else {
    sc = static_cast<int>((ld_u8(s + j + 4) & 15u) | ((ld_u8(s + j - 4) >> 6) << 4));
    mn = static_cast<int>((ld_u8(s + j + 4) >> 4) | ((ld_u8(s + j) >> 6) << 4));
  }
  dj = d * static_cast<float>(sc);
  mj = dmin * static_cast<float>(mn);
}

// Q4_K (144 B per 256): f16 d, f16 dmin, scales[12], qs[128]; sub-block j reads qs[32 (j / 2) ..],
// low nibbles for even j, high for odd; w = (d sc_j) q - dmin min_j.
template <>
struct Group<DType::Q4_K> {
  const uint8_t* q;
  float dj, mj;
  int shift;
  __device__ void init(const uint8_t* row, int64_t g) {
    const int j = static_cast<int>(g & 7);
    const uint8_t* b = row + 144 * (g >> 3);
    k_scale_min(b + 4, j, ld_f16(b), ld_f16(b + 2), dj, mj);
    q = b + 16 + 32 * (j >> 1);
    shift = 4 * (j & 1);
  }
  __device__ void piece(int p, float (&w)[8]) const {
#pragma unroll
    for (int i = 0; i < 8; ++i) w[i] = dj * static_cast<float>((ld_u8(q + 8 * p + i) >> shift) & 15u) - mj;
  }
};

// Q5_K (176 B per 256): as Q4_K with qh[32] at 16 and qs at 48; bit j of qh[e] is the fifth bit.
template <>
struct Group<DType::Q5_K> {
  const uint8_t* q;
  const uint8_t* qh;
  float dj, mj;
  int j;
  __device__ void init(const uint8_t* row, int64_t g) {
    j = static_cast<int>(g & 7);
    const uint8_t* b = row + 176 * (g >> 3);
    k_scale_min(b + 4, j, ld_f16(b), ld_f16(b + 2), dj, mj);
    qh = b + 16;
    q = b + 48 + 32 * (j >> 1);
  }
  __device__ void piece(int p, float (&w)[8]) const {
    const int shift = 4 * (j & 1);
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const int e = 8 * p + i;
      const uint32_t v = ((ld_u8(q + e) >> shift) & 15u) | (((ld_u8(qh + e) >> j) & 1u) << 4);
      w[i] = dj * static_cast<float>(v) - mj;
    }
  }
};

// Q6_K (210 B per 256): ql[128], qh[64], int8 scales[16], f16 d. Sub-block j: half h = j / 4,
// quarter k = j % 4; element l of it: the (k >= 2 ? high : low) nibble of ql[64h + 32 (k & 1) + l]
// and bits 2k, 2k+1 of qh[32h + l]; w = (d * scales[8h + 2k + l / 16]) * (q - 32).
template <>
struct Group<DType::Q6_K> {
  const uint8_t* ql;
  const uint8_t* qh;
  const uint8_t* sc;
  float d;
  int k;
  __device__ void init(const uint8_t* row, int64_t g) {
    const int j = static_cast<int>(g & 7), h = j >> 2;
    k = j & 3;
    const uint8_t* b = row + 210 * (g >> 3);
    d = ld_f16(b + 208);
    ql = b + 64 * h + 32 * (k & 1);
    qh = b + 128 + 32 * h;
    sc = b + 192 + 8 * h + 2 * k;
  }
  __device__ void piece(int p, float (&w)[8]) const {
    const float ds = d * static_cast<float>(static_cast<int8_t>(ld_u8(sc + (p >> 1))));
    const int lo_shift = k >= 2 ? 4 : 0;
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const int l = 8 * p + i;
      const int q = static_cast<int>(((ld_u8(ql + l) >> lo_shift) & 15u) | (((ld_u8(qh + l) >> (2 * k)) & 3u) << 4));
      w[i] = ds * static_cast<float>(q - 32);
    }
  }
};

constexpr int kWarps = 8;  // per block

// One warp owns R consecutive rows; lane l takes groups l, l + 32, ... of them, and for each
// piece of 8 weights the NT activation rows' same 8 elements (one 16-byte load each), so each
// activation load serves R rows. The warp adds its lanes' sums at the end.
template <DType T, int NT, int R>
__global__ void __launch_bounds__(kWarps * 32) quant_gemv_kernel(const __grid_constant__ QuantGemvParams p) {
  const int lane = threadIdx.x & 31;
  const int64_t row0 = (static_cast<int64_t>(blockIdx.x) * kWarps + (threadIdx.x >> 5)) * R;
  if (row0 >= p.out) return;
  const uint8_t* rows[R];
#pragma unroll
  for (int r = 0; r < R; ++r)  // rows past `out` re-read the last row; their sums are dropped
    rows[r] = p.w + min(row0 + r, p.out - 1) * p.row_stride;
  float acc[R][NT] = {};
  const int64_t n_groups = p.in / 32;
  for (int64_t g = lane; g < n_groups; g += 32) {
    Group<T> grp[R];
#pragma unroll
    for (int r = 0; r < R; ++r) grp[r].init(rows[r], g);
#pragma unroll 1  // (unrolled, the 4 pieces' loads in flight spill registers at 5-8 rows)
    for (int piece = 0; piece < 4; ++piece) {
      float xf[NT][8];
#pragma unroll
      for (int t = 0; t < NT; ++t) {
        unpack8(__ldg(reinterpret_cast<const uint4*>(p.x + t * p.in + 32 * g + 8 * piece)), xf[t]);
      }
#pragma unroll
      for (int r = 0; r < R; ++r) {
        float w[8];
        grp[r].piece(piece, w);
#pragma unroll
        for (int t = 0; t < NT; ++t)
#pragma unroll
          for (int i = 0; i < 8; ++i) acc[r][t] = fmaf(w[i], xf[t][i], acc[r][t]);
      }
    }
  }
  warp_sum_store<R, NT>(acc, lane, row0, p.out, p.ldy, p.y, p.y_f32, p.accumulate);
}

template <DType T, int NT>
void launch_nt(const QuantGemvParams& p, cudaStream_t stream) {
  constexpr int R = NT <= 2 ? 2 : 4;
  const int64_t rows_per_block = int64_t{kWarps} * R;
  const unsigned grid = static_cast<unsigned>((p.out + rows_per_block - 1) / rows_per_block);
  quant_gemv_kernel<T, NT, R><<<grid, kWarps * 32, 0, stream>>>(p);
}

template <DType T>
void launch_type(const QuantGemvParams& p, cudaStream_t stream) {
  switch (p.n_tok) {
    case 1: launch_nt<T, 1>(p, stream); break;
    case 2: launch_nt<T, 2>(p, stream); break;
    case 3: launch_nt<T, 3>(p, stream); break;
    case 4: launch_nt<T, 4>(p, stream); break;
    case 5: launch_nt<T, 5>(p, stream); break;
    case 6: launch_nt<T, 6>(p, stream); break;
    case 7: launch_nt<T, 7>(p, stream); break;
    default: launch_nt<T, 8>(p, stream); break;
  }
}

// One thread per piece of 8 weights: (row, group, piece) -> 8 f16 values.
template <DType T>
__global__ void dequant_rows_kernel(const uint8_t* w, int64_t row_stride, int64_t rows, int64_t in, __half* dst,
                                    int64_t ld_dst) {
  const int64_t pieces_per_row = in / 8;
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= rows * pieces_per_row) return;
  const int64_t r = i / pieces_per_row, pc = i % pieces_per_row;
  Group<T> grp;
  grp.init(w + r * row_stride, pc / 4);
  float v[8];
  grp.piece(static_cast<int>(pc % 4), v);
  __half* o = dst + r * ld_dst + 8 * pc;
#pragma unroll
  for (int k = 0; k < 8; ++k) o[k] = __float2half_rn(v[k]);
}

// Calls f.template operator()<T>() for the runtime format t.
template <class F>
void dispatch(DType t, F&& f) {
  switch (t) {
    case DType::F16: f.template operator()<DType::F16>(); break;
    case DType::Q8_0: f.template operator()<DType::Q8_0>(); break;
    case DType::Q4_0: f.template operator()<DType::Q4_0>(); break;
    case DType::Q4_1: f.template operator()<DType::Q4_1>(); break;
    case DType::Q5_0: f.template operator()<DType::Q5_0>(); break;
    case DType::Q4_K: f.template operator()<DType::Q4_K>(); break;
    case DType::Q5_K: f.template operator()<DType::Q5_K>(); break;
    case DType::Q6_K: f.template operator()<DType::Q6_K>(); break;
    default: require(false, "quantized weights: unsupported format");
  }
}

void require_layout(DType t, const uint8_t* w, int64_t row_stride, int64_t in) {
  require(quant_format_supported(t), "quantized weights: unsupported format");
  const DTypeTraits tr = dtype_traits(t);
  require(in > 0 && in % 32 == 0 && in % tr.block_elems == 0, "quantized weights: in must be a multiple of the block");
  require(row_stride % 16 == 0 && row_stride >= in / tr.block_elems * tr.block_bytes,
          "quantized weights: row stride must hold a row and be a multiple of 16");
  require(w != nullptr && (reinterpret_cast<uintptr_t>(w) & 15) == 0, "quantized weights: rows must be 16-byte aligned");
}

}  // namespace

bool quant_format_supported(DType t) {
  switch (t) {
    case DType::F16: case DType::Q8_0: case DType::Q4_0: case DType::Q4_1: case DType::Q5_0:
    case DType::Q4_K: case DType::Q5_K: case DType::Q6_K:
      return true;
    default:
      return false;
  }
}

void launch_quant_gemv(const QuantGemvParams& p, cudaStream_t stream) {
  require_layout(p.type, p.w, p.row_stride, p.in);
  require(p.n_tok >= 1 && p.n_tok <= kQuantGemvMaxTok, "quant_gemv: n_tok must be 1..8");
  require(p.out > 0 && p.ldy >= p.out && p.x != nullptr && p.y != nullptr, "quant_gemv: bad shape or null pointer");
  require((reinterpret_cast<uintptr_t>(p.x) & 15) == 0, "quant_gemv: activations must be 16-byte aligned");
  require(!p.accumulate || p.y_f32, "quant_gemv: accumulate needs fp32 output");
  require((p.out + kWarps * 4) / kWarps < (int64_t{1} << 31), "quant_gemv: too many rows");
  dispatch(p.type, [&]<DType T>() { launch_type<T>(p, stream); });
  DHS_CUDA_CHECK(cudaGetLastError());
}

void launch_dequant_rows(DType type, const uint8_t* w, int64_t row_stride, int64_t rows, int64_t in, __half* dst,
                         int64_t ld_dst, cudaStream_t stream) {
  require_layout(type, w, row_stride, in);
  require(rows >= 0 && dst != nullptr && ld_dst >= in, "dequant_rows: bad shape or null pointer");
  const int64_t n = rows * (in / 8);
  if (n == 0) return;
  const unsigned grid = static_cast<unsigned>((n + 255) / 256);
  dispatch(type, [&]<DType T>() { dequant_rows_kernel<T><<<grid, 256, 0, stream>>>(w, row_stride, rows, in, dst, ld_dst); });
  DHS_CUDA_CHECK(cudaGetLastError());
}

}  // namespace dhs::cuda
