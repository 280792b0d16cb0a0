// Weight GEMMs (backend/cuda/gemm.h): the decode-step kernel (gemv.h, n_tok <= 8) and the
// cuBLASLt path against a double-precision CPU reference computed from the same f16 inputs,
// every element, on awkward shapes: n_tok 1, 2, 3, 5, 8 (and 9: cuBLASLt), rows 1 .. 6,144,
// `in` 8 .. 14,336 including lengths that are not a multiple of the kernels' strides (256 elements
// for the CUDA-core kernel, a 128-element slot for the tensor-core one)
// and one that is not a multiple of 8 (cuBLASLt), outputs f16, fp32 and fp32 accumulated into
// a preset y (the residual stream). Every shape runs on both GEMV kernels: the tensor-core one
// (the default) and the CUDA-core one.
//
// Tolerances and why: both paths accumulate in fp32 in orders that differ from the reference's;
// each of the `in` fp32 adds rounds by at most 2^-24 of the running sum's magnitude, bounded by
// S = sum_i |w_i x_i|, so |gpu - ref| <= in * 2^-24 * S; we allow 2e-6 * in * S + 1e-6 (about 30x
// that bound: cuBLASLt's order is not known). A f16 output adds its own rounding, at most 2^-11
// of |ref| (2^-10 allowed). A wrong element, row or stride moves results by O(S).
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdlib>
#include <cstdio>
#include <random>
#include <vector>

#include "backend/cuda/gemm.h"
#include "backend/cuda/gemv.h"
#include "core/fp16.h"
#include "device_vectors.h"
#include "gtest_shim.h"

namespace {

namespace dc = dhs::cuda;
using dhs::test::to_device;
using dhs::test::to_host;

std::vector<uint16_t> random_f16(size_t n, std::mt19937& rng, float sd) {
  std::normal_distribution<float> nd(0.0f, sd);
  std::vector<uint16_t> v(n);
  for (auto& x : v) x = dhs::f32_to_fp16(nd(rng));
  return v;
}

// Runs one shape through `gemm` and checks every element; returns the number of bad elements.
int check_shape(dc::Gemm& gemm, int n_tok, int64_t in, int64_t out, int mode, std::mt19937& rng, const char* path) {
  const auto w = random_f16(static_cast<size_t>(out * in), rng, 0.05f);
  const auto x = random_f16(static_cast<size_t>(n_tok * in), rng, 1.0f);
  std::vector<float> y0(static_cast<size_t>(n_tok * out));
  std::normal_distribution<float> nd(0.0f, 1.0f);
  for (float& v : y0) v = nd(rng);
  const bool f32 = mode != 0, acc = mode == 2;
  auto* w_d = to_device(w);
  auto* x_d = to_device(x);
  void* y_d = f32 ? static_cast<void*>(to_device(y0)) : static_cast<void*>(to_device(std::vector<uint16_t>(y0.size(), 0)));
  gemm.run(reinterpret_cast<const __half*>(w_d), reinterpret_cast<const __half*>(x_d), y_d, n_tok, in, out,
           f32 ? dc::GemmOut::F32 : dc::GemmOut::F16, nullptr, acc ? 1.0f : 0.0f);
  DHS_CUDA_CHECK(cudaDeviceSynchronize());
  const std::vector<float> got = dhs::test::to_host_floats(y_d, y0.size(), f32);
  int bad = 0;
  double worst = 0;
  for (int t = 0; t < n_tok; ++t)
    for (int64_t o = 0; o < out; ++o) {
      double ref = acc ? y0[static_cast<size_t>(t * out + o)] : 0.0, mag = 0.0;
      for (int64_t i = 0; i < in; ++i) {
        const double p = static_cast<double>(dhs::fp16_to_f32(w[static_cast<size_t>(o * in + i)])) *
                         dhs::fp16_to_f32(x[static_cast<size_t>(t * in + i)]);
        ref += p;
        mag += std::fabs(p);
      }
      const double tol = 2e-6 * static_cast<double>(in) * mag + 1e-6 + (f32 ? 0.0 : std::ldexp(std::fabs(ref), -10));
      const double err = std::fabs(got[static_cast<size_t>(t * out + o)] - ref);
      worst = std::max(worst, err / tol);
      if (!(err <= tol)) {
        if (bad < 5)
          std::printf("  %s n_tok %d in %lld out %lld mode %d: y[%d, %lld] = %.7g, ref %.7g (tol %.3g)\n", path, n_tok,
                      static_cast<long long>(in), static_cast<long long>(out), mode, t, static_cast<long long>(o),
                      got[static_cast<size_t>(t * out + o)], ref, tol);
        ++bad;
      }
    }
  std::printf("%-8s n_tok %d in %6lld out %5lld %-9s worst err / tol %.3f\n", path, n_tok, static_cast<long long>(in),
              static_cast<long long>(out), mode == 0 ? "f16" : mode == 1 ? "f32" : "f32 += ", worst);
  cudaFree(w_d);
  cudaFree(x_d);
  cudaFree(y_d);
  return bad;
}

TEST(Gemv, DecodeShapesMatchTheCpuReference) {
  if (dc::device_count() == 0) GTEST_SKIP() << "no GPU";
  std::mt19937 rng(5);
  dc::Gemm gemm;
  gemm.set_gemv_max_tok(dc::kGemvMaxTok);
  struct Shape { int n_tok; int64_t in, out; };
  const Shape shapes[] = {{1, 8, 1},    {2, 64, 17},    {3, 136, 33},     {5, 264, 70},    {8, 4096, 97},
                          {1, 4096, 6144}, {4, 14336, 40}, {8, 14336, 129}, {7, 1000, 31},   {6, 520, 3}};
  for (const bool tc : {true, false}) {
    gemm.set_gemv_kernel(dc::GemvKernel{.tensor_cores = tc});  // the tensor-core kernel, then the CUDA-core one
    for (const Shape& s : shapes)
      for (int mode = 0; mode < 3; ++mode) {
      dc::GemvParams g;
      g.n_tok = s.n_tok;
      g.in = s.in;
      g.out = s.out;
      g.w = g.x = reinterpret_cast<const __half*>(size_t{256});
      EXPECT_TRUE(dc::gemv_supported(g)) << "n_tok " << s.n_tok << " in " << s.in;
        EXPECT_EQ(check_shape(gemm, s.n_tok, s.in, s.out, mode, rng, tc ? "gemv-tc" : "gemv"), 0);
      }
  }
}

// The tensor-core kernel's own edges (gemv.cu): `in` shorter than one warp's slot of 128 elements
// and than the 4 warps' split (some warps get no slot), tails of 1-3 units inside a 32-element
// chunk and of a partial slot, rows not a multiple of its 16-row tile (1, 15, 17, 6,145), every
// row count 1..8, on every ring shape (GemvKernel::tc_shape), and the 8B layer's shapes (4096 -> 6,144 rows; 14,336 -> 4,096 accumulated).
TEST(Gemv, TensorCoreKernelEdges) {
  if (dc::device_count() == 0) GTEST_SKIP() << "no GPU";
  std::mt19937 rng(7);
  dc::Gemm gemm;
  gemm.set_gemv_max_tok(dc::kGemvMaxTok);
  struct Shape { int n_tok; int64_t in, out; };
  const Shape shapes[] = {{1, 8, 3},     {1, 4096, 6145}, {2, 8, 1},     {3, 24, 15},     {4, 40, 17},     {5, 128, 16},   {6, 136, 31},
                          {7, 392, 33},  {8, 520, 48},    {2, 576, 6145},  {4, 1000, 129}, {8, 1544, 64},
                          {4, 4096, 6144}, {4, 14336, 4096}, {8, 8960, 97}, {3, 4104, 200}};
  // Every ring shape the benchmark can pick; under DHS_TEST_QUICK=1 (the sanitizer runs) the
  // default one only, or the one DHS_TEST_GEMV_RING names.
  const char* quick = std::getenv("DHS_TEST_QUICK");
  const char* only = std::getenv("DHS_TEST_GEMV_RING");
  int first = 0, n_rings = quick != nullptr && quick[0] == '1' ? 1 : dc::kGemvTcShapes;
  if (only != nullptr && only[0] != '\0') {
    first = std::atoi(only);
    ASSERT_TRUE(first >= 0 && first < dc::kGemvTcShapes) << "DHS_TEST_GEMV_RING=" << only << " is not a ring shape";
    n_rings = first + 1;
  }
  for (int ring = first; ring < n_rings; ++ring) {
    gemm.set_gemv_kernel(dc::GemvKernel{.tensor_cores = true, .tc_shape = ring});
    std::printf("ring shape %d\n", ring);
    for (const Shape& s : shapes)
      for (int mode = 0; mode < 3; ++mode) EXPECT_EQ(check_shape(gemm, s.n_tok, s.in, s.out, mode, rng, "gemv-tc"), 0);
  }
}

TEST(Gemv, OtherShapesAndTheCublasPathMatchTheReferenceToo) {
  if (dc::device_count() == 0) GTEST_SKIP() << "no GPU";
  std::mt19937 rng(6);
  dc::Gemm gemm;
  gemm.set_gemv_max_tok(dc::kGemvMaxTok);
  // Not the kernel's: 9 rows of activations, `in` not a multiple of 8 (cuBLASLt takes them).
  for (int mode = 0; mode < 3; ++mode) {
    EXPECT_EQ(check_shape(gemm, 9, 264, 70, mode, rng, "cublaslt"), 0);
    EXPECT_EQ(check_shape(gemm, 3, 100, 21, mode, rng, "cublaslt"), 0);
  }
  dc::GemvParams g;
  g.n_tok = 3;
  g.in = 100;
  g.out = 21;
  g.w = g.x = reinterpret_cast<const __half*>(size_t{256});
  EXPECT_FALSE(dc::gemv_supported(g));
  g.in = 104;
  g.x = reinterpret_cast<const __half*>(size_t{258});  // not 16-byte aligned
  EXPECT_FALSE(dc::gemv_supported(g));
  // The decode shapes through cuBLASLt, as the model ran them before the kernel.
  gemm.set_gemv_max_tok(0);
  for (int mode = 0; mode < 3; ++mode) EXPECT_EQ(check_shape(gemm, 5, 4096, 97, mode, rng, "cublaslt"), 0);
}

}  // namespace
