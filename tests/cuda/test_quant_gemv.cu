// Quantized weights on the device (backend/cuda/quant_gemv.h) against the CPU's dequantization
// (model/dequant.h, the oracle), every GGUF format the kernels read: F16, Q8_0, Q4_0, Q4_1, Q5_0,
// Q4_K, Q5_K, Q6_K. Blocks are random bytes with random finite f16 scales, so every code, scale
// and sign pattern occurs.
//  * DequantRowsEqualTheCpu: the device's f16 weights equal f16(the CPU's fp32 weight) bit for
//    bit, on 37 rows with a destination stride wider than the row (the kernel computes each
//    weight by the CPU's operations, so the fp32 values are the same and round the same).
//  * GemvMatchesTheCpuReference: y = x W^T against a double-precision sum over the CPU's
//    weights and the same f16 activations, every element, n_tok 1-8, `in` from one block to
//    14,336, rows 1-97 (not multiples of the kernel's 16 or 32 rows per block), outputs f16, fp32
//    and fp32 accumulated, written with a row stride wider than `out` whose gap must stay untouched.
//    Tolerance as test_gemv.cu: 2e-6 * in * S + 1e-6 (S = sum |w_i x_i|; fp32 sums in another
//    order err by at most in * 2^-24 * S), plus 2^-10 |ref| for an f16 output (one rounding:
//    2^-11). A wrong code, nibble, scale or min moves a sum by O(|w| |x|), far above it.
//  * RejectsBadLayouts: misaligned or short strides, `in` not a multiple of the block, n_tok 9.
//  * Bandwidth (DHS_CUDA_BENCH=1): the 8B shape's matrices per format and row count, GB/s of
//    weight bytes against a device-to-device copy timed in the same process.
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "backend/cuda/quant_gemv.h"
#include "core/dtype.h"
#include "core/fp16.h"
#include "device_vectors.h"
#include "gemv_check.h"
#include "gtest_shim.h"
#include "model/dequant.h"

namespace {

namespace dc = dhs::cuda;
using dhs::DType;
using dhs::test::to_device;
using dhs::test::to_host;

const DType kFormats[] = {DType::F16, DType::Q8_0, DType::Q4_0, DType::Q4_1,
                          DType::Q5_0, DType::Q4_K, DType::Q5_K, DType::Q6_K};

// Byte offsets of a block's f16 fields (scales and mins), which must hold finite values.
std::vector<int> f16_fields(DType t) {
  switch (t) {
    case DType::Q8_0: case DType::Q4_0: case DType::Q5_0: return {0};
    case DType::Q4_1: case DType::Q4_K: case DType::Q5_K: return {0, 2};
    case DType::Q6_K: return {208};
    default: return {};
  }
}

// rows x in weights of type t, rows padded to 16 bytes: the device layout.
struct Matrix {
  DType type;
  int64_t rows, in, row_bytes, stride;
  std::vector<uint8_t> bytes;
  std::vector<float> ref;  // [rows, in] the CPU's dequantization
};

Matrix random_matrix(DType t, int64_t rows, int64_t in, std::mt19937& rng) {
  Matrix m{t, rows, in, static_cast<int64_t>(dhs::dtype_row_bytes(t, in)), 0, {}, {}};
  m.stride = (m.row_bytes + 15) / 16 * 16;
  m.bytes.assign(static_cast<size_t>(rows * m.stride), 0);
  std::uniform_int_distribution<int> byte(0, 255);
  std::normal_distribution<float> scale(0.0f, 0.02f), value(0.0f, 0.05f);
  const dhs::DTypeTraits tr = dhs::dtype_traits(t);
  for (int64_t r = 0; r < rows; ++r) {
    uint8_t* row = m.bytes.data() + r * m.stride;
    if (t == DType::F16) {
      for (int64_t i = 0; i < in; ++i) {
        const uint16_t h = dhs::f32_to_fp16(value(rng));
        std::memcpy(row + 2 * i, &h, 2);
      }
    } else {
      for (int64_t b = 0; b < m.row_bytes; ++b) row[b] = static_cast<uint8_t>(byte(rng));
      for (int64_t blk = 0; blk < in / tr.block_elems; ++blk)
        for (int off : f16_fields(t)) {
          const uint16_t h = dhs::f32_to_fp16(scale(rng));
          std::memcpy(row + blk * tr.block_bytes + off, &h, 2);
        }
    }
  }
  m.ref.resize(static_cast<size_t>(rows * in));
  for (int64_t r = 0; r < rows; ++r) dhs::dequantize_row(t, m.bytes.data() + r * m.stride, m.ref.data() + r * in, in);
  return m;
}

std::string name(DType t) { return std::string(dhs::dtype_traits(t).name); }

TEST(QuantGemv, DequantRowsEqualTheCpu) {
  if (dc::device_count() == 0) GTEST_SKIP() << "no GPU";
  std::mt19937 rng(11);
  for (DType t : kFormats)
    for (int64_t in : {int64_t{256}, int64_t{768}, int64_t{96}}) {
      if (in % dhs::dtype_traits(t).block_elems != 0) continue;
      const int64_t rows = 37, ld = in + 8;
      const Matrix m = random_matrix(t, rows, in, rng);
      uint8_t* w_d = to_device(m.bytes);
      __half* y_d = reinterpret_cast<__half*>(to_device(std::vector<uint16_t>(static_cast<size_t>(rows * ld), 0x7E00)));
      dc::launch_dequant_rows(t, w_d, m.stride, rows, in, y_d, ld, nullptr);
      DHS_CUDA_CHECK(cudaDeviceSynchronize());
      const auto got = to_host(reinterpret_cast<uint16_t*>(y_d), static_cast<size_t>(rows * ld));
      int bad = 0, gap_touched = 0;
      for (int64_t r = 0; r < rows; ++r) {
        for (int64_t i = 0; i < in; ++i)
          bad += got[static_cast<size_t>(r * ld + i)] != dhs::f32_to_fp16(m.ref[static_cast<size_t>(r * in + i)]);
        for (int64_t i = in; i < ld; ++i) gap_touched += got[static_cast<size_t>(r * ld + i)] != 0x7E00;
      }
      EXPECT_EQ(bad, 0) << name(t) << " in " << in;
      EXPECT_EQ(gap_touched, 0) << name(t) << " in " << in;
      cudaFree(w_d);
      cudaFree(y_d);
    }
}

// One shape: returns the number of elements out of tolerance (the gap counts as bad when touched).
int check_gemv(DType t, int n_tok, int64_t in, int64_t out, int mode, std::mt19937& rng) {
  const Matrix m = random_matrix(t, out, in, rng);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<uint16_t> x(static_cast<size_t>(n_tok * in));
  for (auto& v : x) v = dhs::f32_to_fp16(nd(rng));
  const int64_t ldy = out + 5;
  std::vector<float> y0(static_cast<size_t>(n_tok * ldy));
  for (float& v : y0) v = nd(rng);
  const bool f32 = mode != 0, acc = mode == 2;
  uint8_t* w_d = to_device(m.bytes);
  uint16_t* x_d = to_device(x);
  std::vector<uint16_t> y0_h(y0.size());
  for (size_t i = 0; i < y0.size(); ++i) y0_h[i] = dhs::f32_to_fp16(y0[i]);
  void* y_d = f32 ? static_cast<void*>(to_device(y0)) : static_cast<void*>(to_device(y0_h));
  dc::QuantGemvParams p;
  p.type = t;
  p.w = w_d;
  p.row_stride = m.stride;
  p.x = reinterpret_cast<const __half*>(x_d);
  p.y = y_d;
  p.ldy = ldy;
  p.y_f32 = f32;
  p.accumulate = acc;
  p.n_tok = n_tok;
  p.in = in;
  p.out = out;
  dc::launch_quant_gemv(p, nullptr);
  DHS_CUDA_CHECK(cudaDeviceSynchronize());
  const std::vector<float> got = dhs::test::to_host_floats(y_d, y0.size(), f32);
  const int bad = dhs::test::gemv_errors(name(t), m.ref, x, y0, y0_h, got, n_tok, in, out, ldy, mode);
  cudaFree(w_d);
  cudaFree(x_d);
  cudaFree(y_d);
  return bad;
}

TEST(QuantGemv, GemvMatchesTheCpuReference) {
  if (dc::device_count() == 0) GTEST_SKIP() << "no GPU";
  const char* quick = std::getenv("DHS_TEST_QUICK");
  const bool small = quick != nullptr && quick[0] == '1';
  std::mt19937 rng(5);
  struct Shape { int n_tok; int64_t in, out; };
  const Shape shapes[] = {{1, 32, 1},  {2, 96, 17},  {3, 256, 33},  {5, 576, 70},   {8, 768, 97},
                          {7, 2304, 31}, {4, 4096, 9}, {6, 256, 3},  {8, 14336, 5}, {1, 14336, 40}};
  for (DType t : kFormats)
    for (const Shape& s : shapes) {
      if (s.in % dhs::dtype_traits(t).block_elems != 0) continue;
      if (small && s.in > 2304) continue;
      for (int mode = 0; mode < 3; ++mode) EXPECT_EQ(check_gemv(t, s.n_tok, s.in, s.out, mode, rng), 0);
    }
}

TEST(QuantGemv, RejectsBadLayouts) {
  if (dc::device_count() == 0) GTEST_SKIP() << "no GPU";
  void* buf = nullptr;
  DHS_CUDA_CHECK(cudaMalloc(&buf, 1 << 20));
  const auto throws = [&](dc::QuantGemvParams p) {
    try {
      dc::launch_quant_gemv(p, nullptr);
    } catch (const std::exception&) {  // (dhs::Error; core/error.h needs fmt, which nvcc rejects)
      return true;
    }
    return false;
  };
  dc::QuantGemvParams ok;
  ok.type = DType::Q4_K;
  ok.w = static_cast<const uint8_t*>(buf);
  ok.row_stride = 144;
  ok.x = static_cast<const __half*>(buf);
  ok.y = buf;
  ok.ldy = 4;
  ok.n_tok = 1;
  ok.in = 256;
  ok.out = 4;
  EXPECT_FALSE(throws(ok));
  DHS_CUDA_CHECK(cudaDeviceSynchronize());
  auto p = ok;
  p.row_stride = 136;  // shorter than a row
  EXPECT_TRUE(throws(p));
  p = ok;
  p.row_stride = 152;  // not a multiple of 16
  EXPECT_TRUE(throws(p));
  p = ok;
  p.in = 288;  // not a multiple of 256
  EXPECT_TRUE(throws(p));
  p = ok;
  p.n_tok = 9;
  EXPECT_TRUE(throws(p));
  p = ok;
  p.ldy = 3;
  EXPECT_TRUE(throws(p));
  p = ok;
  p.w = static_cast<const uint8_t*>(buf) + 8;
  EXPECT_TRUE(throws(p));
  p = ok;
  p.type = DType::Q5_1;
  EXPECT_TRUE(throws(p));
  p = ok;
  p.accumulate = true;  // f16 output
  EXPECT_TRUE(throws(p));
  cudaFree(buf);
}

// Weight bytes streamed per second on the 8B shape's matrices (qkv 6144 x 4096, gate/up
// 28672 x 4096, down 4096 x 14336), each launch on a different copy of the weights (the set is
// larger than L2), beside a device-to-device copy of 1 GiB timed the same way.
TEST(QuantGemv, Bandwidth) {
  if (dc::device_count() == 0) GTEST_SKIP() << "no GPU";
  const char* on = std::getenv("DHS_CUDA_BENCH");
  if (on == nullptr || on[0] != '1') GTEST_SKIP() << "set DHS_CUDA_BENCH=1 for timings";
  cudaEvent_t e0, e1;
  DHS_CUDA_CHECK(cudaEventCreate(&e0));
  DHS_CUDA_CHECK(cudaEventCreate(&e1));
  {
    const size_t n = size_t{1} << 30;
    void *a = nullptr, *b = nullptr;
    DHS_CUDA_CHECK(cudaMalloc(&a, n));
    DHS_CUDA_CHECK(cudaMalloc(&b, n));
    DHS_CUDA_CHECK(cudaMemcpy(b, a, n, cudaMemcpyDeviceToDevice));
    DHS_CUDA_CHECK(cudaEventRecord(e0));
    for (int i = 0; i < 5; ++i) DHS_CUDA_CHECK(cudaMemcpyAsync(b, a, n, cudaMemcpyDeviceToDevice));
    DHS_CUDA_CHECK(cudaEventRecord(e1));
    DHS_CUDA_CHECK(cudaEventSynchronize(e1));
    float ms = 0;
    DHS_CUDA_CHECK(cudaEventElapsedTime(&ms, e0, e1));
    std::printf("d2d copy: %.1f GB/s (bytes read + written)\n", 5.0 * 2.0 * static_cast<double>(n) / (ms * 1e6));
    cudaFree(a);
    cudaFree(b);
  }
  struct M { const char* name; int64_t out, in; };
  const M mats[] = {{"qkv", 6144, 4096}, {"gate_up", 28672, 4096}, {"down", 4096, 14336}};
  std::mt19937 rng(3);
  for (DType t : {DType::F16, DType::Q8_0, DType::Q4_K, DType::Q6_K, DType::Q4_0})
    for (const M& mm : mats) {
      const int64_t stride = (static_cast<int64_t>(dhs::dtype_row_bytes(t, mm.in)) + 15) / 16 * 16;
      const size_t bytes = static_cast<size_t>(stride * mm.out);
      const int copies = static_cast<int>(std::max<size_t>(2, (size_t{1} << 30) / bytes));
      // Random bytes: values do not change the kernel's speed (f16 fields may be NaN here).
      std::vector<uint8_t> h(bytes);
      for (auto& v : h) v = static_cast<uint8_t>(rng());
      std::vector<uint8_t*> w(static_cast<size_t>(copies));
      for (auto& d : w) d = to_device(h);
      __half* x = reinterpret_cast<__half*>(to_device(std::vector<uint16_t>(static_cast<size_t>(8 * mm.in), 0x3C00)));
      float* y = to_device(std::vector<float>(static_cast<size_t>(8 * mm.out), 0.0f));
      for (int nt : {1, 2, 4, 8}) {
        dc::QuantGemvParams p;
        p.type = t;
        p.row_stride = stride;
        p.x = x;
        p.y = y;
        p.ldy = mm.out;
        p.y_f32 = true;
        p.n_tok = nt;
        p.in = mm.in;
        p.out = mm.out;
        const int reps = 4 * copies;
        for (int i = 0; i < copies; ++i) {
          p.w = w[static_cast<size_t>(i)];
          dc::launch_quant_gemv(p, nullptr);
        }
        DHS_CUDA_CHECK(cudaEventRecord(e0));
        for (int i = 0; i < reps; ++i) {
          p.w = w[static_cast<size_t>(i % copies)];
          dc::launch_quant_gemv(p, nullptr);
        }
        DHS_CUDA_CHECK(cudaEventRecord(e1));
        DHS_CUDA_CHECK(cudaEventSynchronize(e1));
        float ms = 0;
        DHS_CUDA_CHECK(cudaEventElapsedTime(&ms, e0, e1));
        const double us = 1000.0 * ms / reps;
        std::printf("bw %-5s %-8s n_tok %d: %8.1f us  %7.1f GB/s of weights\n", name(t).c_str(), mm.name, nt, us,
                    static_cast<double>(bytes) / (us * 1e3));
      }
      for (auto* d : w) cudaFree(d);
      cudaFree(x);
      cudaFree(y);
    }
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
}

}  // namespace
