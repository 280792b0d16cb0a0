// The packed-weight GEMV (backend/cuda/packed_gemv.h, quant_gemv v2) against the CPU's statement
// of the packed weights (model/packed_weight.h unpack_row, itself tested against the file's
// dequantizer in tests/unit/test_packed_weight.cpp): Q8_0 and Q4_K packed from random file rows
// (random bytes, random finite f16 scales: every code, scale and sign pattern), FP8 quantized
// from random normal weights.
//  * UnpackRowsEqualTheCpu: the device's f16 weights equal f16(unpack_row) bit for bit, with a
//    destination stride wider than the row.
//  * GemvMatchesTheCpuReference: y = x W^T against a double sum over unpack_row's weights and the
//    same f16 activations, every element; n_tok 1-8, `in` from 32 to 14,336 (partial 256-element
//    chunks included), rows 1-97 (not multiples of 16), f16 / fp32 / fp32 += output into a wider
//    row stride whose gap must stay untouched. Tolerance as test_quant_gemv.cu: 2e-6 * in * S +
//    1e-6 (S = sum |w_i x_i|), plus 2^-10 |ref| for an f16 output. (Q4_K: the kernel multiplies
//    d*sc*q - dmin*m as real numbers, the CPU rounds it to fp32 first: 2^-24 |w| per weight, inside
//    that bound.) A wrong code, nibble, scale or min moves a sum by O(|w| |x|), far above it.
//  * RejectsBadViews: misaligned planes, a wrong chunk count, `in` not a multiple of 8, n_tok 9, a block form the
//    format does not have, missing row scales.
//  * Bandwidth (DHS_CUDA_BENCH=1): the 8B shape's matrices per format and row count, GB/s of
//    packed bytes against a device-to-device copy timed in the same process; JSON rows to
//    $DHS_BENCH_OUT when set.
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "backend/cuda/packed_gemv.h"
#include "core/dtype.h"
#include "core/fp16.h"
#include "device_vectors.h"
#include "gemv_check.h"
#include "gtest_shim.h"
#include "model/dequant.h"
#include "model/packed_weight.h"

namespace {

namespace dc = dhs::cuda;
using dhs::DType;
using dhs::PackedFormat;
using dhs::PackedMatrix;
using dhs::test::to_device;

const PackedFormat kFormats[] = {PackedFormat::Q8_0, PackedFormat::Q4_K, PackedFormat::FP8};

std::string name(PackedFormat f) { return std::string(dhs::packed_format_name(f)); }

PackedMatrix random_packed(PackedFormat f, int64_t rows, int64_t in, std::mt19937& rng) {
  std::normal_distribution<float> scale(0.0f, 0.02f), value(0.0f, 0.05f);
  if (f == PackedFormat::FP8) {
    std::vector<float> w(static_cast<size_t>(rows * in));
    for (auto& v : w) v = value(rng);
    return dhs::quantize_fp8_rows(w.data(), rows, in);
  }
  const DType t = f == PackedFormat::Q8_0 ? DType::Q8_0 : DType::Q4_K;
  const dhs::DTypeTraits tr = dhs::dtype_traits(t);
  const size_t row_bytes = dhs::dtype_row_bytes(t, in);
  std::vector<uint8_t> b(static_cast<size_t>(rows) * row_bytes);
  for (auto& v : b) v = static_cast<uint8_t>(rng());
  for (size_t at = 0; at < b.size(); at += static_cast<size_t>(tr.block_bytes))
    for (int k = 0; k < (t == DType::Q4_K ? 2 : 1); ++k) {  // d (and Q4_K's dmin): finite
      const uint16_t h = dhs::f32_to_fp16(scale(rng));
      std::memcpy(&b[at + 2 * static_cast<size_t>(k)], &h, 2);
    }
  return dhs::pack_rows(t, b.data(), rows, in);
}

// The packed planes on the device (one allocation each, freed by the caller through `owned`).
dc::PackedWeightView upload(const PackedMatrix& m, std::vector<void*>& owned) {
  dc::PackedWeightView v;
  v.format = m.format;
  v.rows = m.rows;
  v.in = m.in;
  v.chunks = m.chunks;
  v.codes = to_device(m.codes);
  owned.push_back(const_cast<uint8_t*>(v.codes));
  if (!m.meta.empty()) {
    v.meta = to_device(m.meta);
    owned.push_back(const_cast<uint8_t*>(v.meta));
  }
  if (!m.row_scale.empty()) {
    v.row_scale = to_device(m.row_scale);
    owned.push_back(const_cast<float*>(v.row_scale));
  }
  return v;
}

std::vector<float> unpacked(const PackedMatrix& m) {
  std::vector<float> ref(static_cast<size_t>(m.rows * m.in));
  for (int64_t r = 0; r < m.rows; ++r) dhs::unpack_row(m, r, ref.data() + r * m.in);
  return ref;
}

TEST(PackedGemv, UnpackRowsEqualTheCpu) {
  if (dc::device_count() == 0) GTEST_SKIP() << "no GPU";
  std::mt19937 rng(11);
  for (PackedFormat f : kFormats)
    for (int64_t in : {256, 576, 1280}) {
      if (f == PackedFormat::Q4_K && in % 256 != 0) continue;  // (Q4_K rows are whole 256-blocks)
      const PackedMatrix m = random_packed(f, 37, in, rng);
      std::vector<void*> owned;
      const dc::PackedWeightView v = upload(m, owned);
      const int64_t ld = in + 24;
      std::vector<uint16_t> init(static_cast<size_t>(37 * ld), 0x7E00);  // NaN: any element not written shows
      uint16_t* d = to_device(init);
      dc::launch_unpack_rows(v, reinterpret_cast<__half*>(d), ld, nullptr);
      DHS_CUDA_CHECK(cudaDeviceSynchronize());
      const std::vector<uint16_t> got = dhs::test::to_host(d, init.size());
      const std::vector<float> ref = unpacked(m);
      int bad = 0;
      for (int64_t r = 0; r < 37; ++r)
        for (int64_t i = 0; i < ld; ++i) {
          const uint16_t g = got[static_cast<size_t>(r * ld + i)];
          const uint16_t want = i < in ? dhs::f32_to_fp16(ref[static_cast<size_t>(r * in + i)]) : 0x7E00;
          if (g != want && bad++ < 3)
            std::printf("  %s in %lld: [%lld, %lld] = %04x, want %04x\n", name(f).c_str(), static_cast<long long>(in),
                        static_cast<long long>(r), static_cast<long long>(i), g, want);
        }
      EXPECT_EQ(bad, 0) << name(f) << " in " << in;
      cudaFree(d);
      for (void* p : owned) cudaFree(p);
    }
}

int check_gemv(PackedFormat f, int n_tok, int64_t in, int64_t out, int mode, int shape, std::mt19937& rng) {
  const PackedMatrix m = random_packed(f, out, in, rng);
  const std::vector<float> w = unpacked(m);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<uint16_t> x(static_cast<size_t>(n_tok * in));
  for (auto& v : x) v = dhs::f32_to_fp16(nd(rng));
  const int64_t ldy = out + 5;
  std::vector<float> y0(static_cast<size_t>(n_tok * ldy));
  for (float& v : y0) v = nd(rng);
  const bool f32 = mode != 0, acc = mode == 2;
  std::vector<void*> owned;
  dc::PackedGemvParams p;
  p.w = upload(m, owned);
  uint16_t* x_d = to_device(x);
  std::vector<uint16_t> y0_h(y0.size());
  for (size_t i = 0; i < y0.size(); ++i) y0_h[i] = dhs::f32_to_fp16(y0[i]);
  void* y_d = f32 ? static_cast<void*>(to_device(y0)) : static_cast<void*>(to_device(y0_h));
  p.x = reinterpret_cast<const __half*>(x_d);
  p.y = y_d;
  p.ldy = ldy;
  p.y_f32 = f32;
  p.accumulate = acc;
  p.n_tok = n_tok;
  p.shape = shape;
  dc::launch_packed_gemv(p, nullptr);
  DHS_CUDA_CHECK(cudaDeviceSynchronize());
  const std::vector<float> got = dhs::test::to_host_floats(y_d, y0.size(), f32);
  const int bad = dhs::test::gemv_errors(name(f), w, x, y0, y0_h, got, n_tok, in, out, ldy, mode);
  cudaFree(x_d);
  cudaFree(y_d);
  for (void* q : owned) cudaFree(q);
  return bad;
}

TEST(PackedGemv, GemvMatchesTheCpuReference) {
  if (dc::device_count() == 0) GTEST_SKIP() << "no GPU";
  const char* quick = std::getenv("DHS_TEST_QUICK");
  const bool small = quick != nullptr && quick[0] == '1';
  std::mt19937 rng(5);
  struct Shape { int n_tok; int64_t in, out; };
  const Shape shapes[] = {{1, 32, 1},    {2, 96, 17},  {3, 256, 33},  {5, 576, 70},  {8, 768, 97},
                          {7, 2304, 31}, {4, 4096, 9}, {6, 256, 3},   {8, 14336, 5}, {1, 14336, 40},
                          {2, 520, 16},  {8, 4096, 64}};
  for (PackedFormat f : kFormats)
    for (const Shape& s : shapes) {
      if (f == PackedFormat::Q4_K && s.in % 256 != 0) continue;
      if (f == PackedFormat::Q8_0 && s.in % 32 != 0) continue;
      if (small && s.in > 2304) continue;
      // Every block form of the format (auto, one tile x 4 / 8 warps, two tiles; Q4_K's further
      // forms: 8 and 16 warps, two tiles with x in registers): rows past the matrix in the last
      // block, fewer chunks than warps, 1-8 activation rows.
      for (int shape = 0; shape < dc::packed_shapes(f); ++shape)
        for (int mode = 0; mode < 3; ++mode)
          EXPECT_EQ(check_gemv(f, s.n_tok, s.in, s.out, mode, shape, rng), 0) << "shape " << shape;
    }
}

TEST(PackedGemv, RejectsBadViews) {
  if (dc::device_count() == 0) GTEST_SKIP() << "no GPU";
  void* buf = nullptr;
  DHS_CUDA_CHECK(cudaMalloc(&buf, 1 << 20));
  DHS_CUDA_CHECK(cudaMemset(buf, 0, 1 << 20));
  const auto throws = [&](dc::PackedGemvParams p) {
    try {
      dc::launch_packed_gemv(p, nullptr);
    } catch (const std::exception&) {  // (dhs::Error; core/error.h needs fmt, which nvcc rejects)
      return true;
    }
    return false;
  };
  auto* b = static_cast<uint8_t*>(buf);
  dc::PackedGemvParams ok;
  ok.w.format = PackedFormat::Q4_K;
  ok.w.codes = b;
  ok.w.meta = b + 4096;
  ok.w.rows = 4;
  ok.w.in = 512;
  ok.w.chunks = 2;
  ok.x = reinterpret_cast<const __half*>(b + 8192);
  ok.y = b + 16384;
  ok.ldy = 4;
  ok.n_tok = 1;
  EXPECT_FALSE(throws(ok));
  DHS_CUDA_CHECK(cudaDeviceSynchronize());
  auto p = ok;
  p.w.chunks = 3;  // not ceil(in / 256)
  EXPECT_TRUE(throws(p));
  p = ok;
  p.w.in = 508;  // not a multiple of 8
  p.w.chunks = 2;
  EXPECT_TRUE(throws(p));
  p = ok;
  p.w.codes = b + 8;
  EXPECT_TRUE(throws(p));
  p = ok;
  p.w.meta = nullptr;
  EXPECT_TRUE(throws(p));
  p = ok;
  p.w.format = PackedFormat::FP8;  // no row scales
  EXPECT_TRUE(throws(p));
  p = ok;
  p.n_tok = 9;
  EXPECT_TRUE(throws(p));
  p = ok;
  p.ldy = 3;
  EXPECT_TRUE(throws(p));
  p = ok;
  p.x = reinterpret_cast<const __half*>(b + 8194);
  EXPECT_TRUE(throws(p));
  p = ok;
  p.accumulate = true;  // f16 output
  EXPECT_TRUE(throws(p));
  p = ok;
  p.shape = dc::packed_shapes(p.w.format);  // no such block form
  EXPECT_TRUE(throws(p));
  p.shape = -1;
  EXPECT_TRUE(throws(p));
  cudaFree(buf);
}

// Packed bytes streamed per second on the 8B shape's matrices (qkv 6144 x 4096, gate/up
// 28672 x 4096, down 4096 x 14336), each launch on a different copy of the weights (the set is
// larger than L2), beside a device-to-device copy of 1 GiB timed the same way.
TEST(PackedGemv, Bandwidth) {
  if (dc::device_count() == 0) GTEST_SKIP() << "no GPU";
  const char* on = std::getenv("DHS_CUDA_BENCH");
  if (on == nullptr || on[0] != '1') GTEST_SKIP() << "set DHS_CUDA_BENCH=1 for timings";
  const char* out_path = std::getenv("DHS_BENCH_OUT");
  const char* commit = std::getenv("DHS_COMMIT");
  std::ofstream jl;
  if (out_path) jl.open(out_path, std::ios::app);
  cudaDeviceProp prop{};
  DHS_CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
  cudaEvent_t e0, e1;
  DHS_CUDA_CHECK(cudaEventCreate(&e0));
  DHS_CUDA_CHECK(cudaEventCreate(&e1));
  double copy_gbps = 0;
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
    copy_gbps = 5.0 * 2.0 * static_cast<double>(n) / (ms * 1e6);
    std::printf("d2d copy: %.1f GB/s (bytes read + written)\n", copy_gbps);
    cudaFree(a);
    cudaFree(b);
  }
  struct M { const char* name; int64_t out, in; };
  const M mats[] = {{"qkv", 6144, 4096}, {"gate_up", 28672, 4096}, {"down", 4096, 14336}};
  for (PackedFormat f : kFormats) {
    // The automatic form's time per row count over the three matrices (a layer's projections
    // but the output one): bytes / time, the figure docs/kernels/quant_gemv_NOTES.md quotes.
    double layer_us[4] = {}, layer_bytes = 0;
    for (const M& mm : mats) {
      dc::PackedWeightView v;
      v.format = f;
      v.rows = mm.out;
      v.in = mm.in;
      v.chunks = (mm.in + 255) / 256;
      const size_t bytes = dc::packed_bytes(v);
      const int copies = static_cast<int>(std::max<size_t>(2, (size_t{1} << 30) / bytes));
      std::vector<dc::PackedWeightView> w(static_cast<size_t>(copies), v);
      std::vector<void*> owned;
      const size_t n = static_cast<size_t>(v.rows * v.chunks);
      for (auto& c : w) {
        uint8_t* d = nullptr;
        DHS_CUDA_CHECK(cudaMalloc(&d, bytes + 16));
        owned.push_back(d);
        const size_t code_bytes = n * static_cast<size_t>(dhs::packed_code_bytes(f));
        c.codes = d;
        if (dhs::packed_has_meta(f)) c.meta = d + code_bytes;
        else c.row_scale = reinterpret_cast<const float*>(d + code_bytes);
        dc::fill_random_packed(c, 1 + owned.size(), 0.03f, nullptr);
      }
      __half* x = reinterpret_cast<__half*>(to_device(std::vector<uint16_t>(static_cast<size_t>(8 * mm.in), 0x3C00)));
      float* y = to_device(std::vector<float>(static_cast<size_t>(8 * mm.out), 0.0f));
      for (int shape = 0; shape < dc::packed_shapes(f); ++shape)
      for (int nt = 1; nt <= 8; nt *= 2) {
        dc::PackedGemvParams p;
        p.shape = shape;
        p.x = x;
        p.y = y;
        p.ldy = mm.out;
        p.y_f32 = true;
        p.n_tok = nt;
        const int reps = 4 * copies;
        for (int i = 0; i < copies; ++i) {
          p.w = w[static_cast<size_t>(i)];
          dc::launch_packed_gemv(p, nullptr);
        }
        DHS_CUDA_CHECK(cudaEventRecord(e0));
        for (int i = 0; i < reps; ++i) {
          p.w = w[static_cast<size_t>(i % copies)];
          dc::launch_packed_gemv(p, nullptr);
        }
        DHS_CUDA_CHECK(cudaEventRecord(e1));
        DHS_CUDA_CHECK(cudaEventSynchronize(e1));
        float ms = 0;
        DHS_CUDA_CHECK(cudaEventElapsedTime(&ms, e0, e1));
        const double us = 1000.0 * ms / reps, gbps = static_cast<double>(bytes) / (us * 1e3);
        if (shape == 0) layer_us[nt == 1 ? 0 : nt == 2 ? 1 : nt == 4 ? 2 : 3] += us;
        std::printf("bw %-5s %-8s shape %d n_tok %d: %8.1f us  %7.1f GB/s of weights  %.2f of the copy rate\n",
                    name(f).c_str(), mm.name, shape, nt, us, gbps, gbps / copy_gbps);
        if (jl.is_open())
          jl << "{\"commit\": \"" << (commit ? commit : "unknown") << "\", \"gpu\": \"" << prop.name
             << "\", \"impl\": \"quant-gemv-v2\", \"format\": \"" << name(f) << "\", \"matrix\": \"" << mm.name
             << "\", \"shape\": " << shape << ", \"out\": " << mm.out << ", \"in\": " << mm.in << ", \"n_tok\": " << nt << ", \"us\": " << us
             << ", \"weight_GBps\": " << gbps << ", \"d2d_copy_GBps_read_plus_write\": " << copy_gbps
             << ", \"of_copy_rate\": " << gbps / copy_gbps
             << ", \"timing\": \"events over 4 x copies launches, each on its own copy of the weights (> 1 GiB in all), "
                "fp32 output\"}\n";
      }
      layer_bytes += static_cast<double>(bytes);
      for (void* d : owned) cudaFree(d);
      cudaFree(x);
      cudaFree(y);
    }
    for (int i = 0; i < 4; ++i)
      std::printf("layer %-5s n_tok %d: %8.1f us  %.2f of the copy rate (automatic form, qkv + gate_up + down)\n",
                  name(f).c_str(), 1 << i, layer_us[i], layer_bytes / (layer_us[i] * 1e3) / copy_gbps);
  }
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
}

}  // namespace
