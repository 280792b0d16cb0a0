// CUDA glue ops (backend/cuda/ops.h) against the CPU reference (backend/cpu/ops.h) on
// awkward sizes: n_tok 1, 17, 97; hidden 576, 1003 (not a multiple of 8), 4096;
// head_dim 64 and 128; positions up to 131071; scattered page slots, last page 3/16 full.
// Every element is checked. The reference is fed the same f16-rounded inputs.
//
// Tolerances (per element; ref = CPU fp32 value):
//  * fp32 outputs that are a plain copy or one fp32 add (embedding, residual x): exact.
//  * f16 outputs: |gpu - ref| <= 2^-10 |ref| + 2^-24 + abs_err (2^-24: one step of f16's
//    subnormals, below 2^-14). The GPU rounds its fp32 value to
//    f16 (<= 2^-11 |v|, half an ulp); its fp32 value differs from the CPU's by fp32
//    accumulation order (norms: sum of squares over <= 4096 terms, ~1e-6 relative) and
//    expf vs std::exp (2 ulp). One full f16 ulp (2^-10) covers both with margin.
//    abs_err: 0 for products (norm, SwiGLU); for RoPE, 1e-5 (|x0| + |x1|) of the rotated
//    pair, because x0 c - x1 s can cancel: the fp32 terms carry ~1e-7 of their size, and
//    cos/sin of the same double angle may differ by one fp32 ulp between CPU and GPU.
//  * RoPE angle: both sides compute pos * inv_freq in double (GPU: sincos() in double),
//    so positions up to 131071 need no extra tolerance. (An fp32 angle would be off by
//    up to 0.0078 rad there: ~8 f16 ulps on every element — the test catches it.)
// DHS_TEST_SMALL=1 (or DHS_TEST_QUICK=1) shrinks the sizes (for compute-sanitizer runs).
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "backend/cpu/ops.h"
#include "model/rope.h"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/device_page_table.h"
#include "device_vectors.h"
#include "backend/cuda/ops.h"
#include "core/fp16.h"
#include "gtest_shim.h"
#include "kv/page_pool.h"
#include "kv/page_table.h"

namespace {

using dhs::DType;
namespace dc = dhs::cuda;

bool small_mode() {  // DHS_TEST_SMALL or the project's DHS_TEST_QUICK (sanitizer runs)
  for (const char* name : {"DHS_TEST_SMALL", "DHS_TEST_QUICK"}) {
    const char* e = std::getenv(name);
    if (e && *e && *e != '0') return true;
  }
  return false;
}

// ---- host helpers ----------------------------------------------------------------

float round_f16(float x) { return dhs::fp16_to_f32(dhs::f32_to_fp16(x)); }

std::vector<float> randn(size_t n, std::mt19937& rng, float s = 1.0f, float mean = 0.0f) {
  std::normal_distribution<float> d(mean, s);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}
std::vector<float> rounded(std::vector<float> v) {
  for (auto& x : v) x = round_f16(x);
  return v;
}
std::vector<uint16_t> to_f16(const std::vector<float>& v) {
  std::vector<uint16_t> r(v.size());
  for (size_t i = 0; i < v.size(); ++i) r[i] = dhs::f32_to_fp16(v[i]);
  return r;
}
std::vector<float> from_f16(const std::vector<uint16_t>& v) {
  std::vector<float> r(v.size());
  for (size_t i = 0; i < v.size(); ++i) r[i] = dhs::fp16_to_f32(v[i]);
  return r;
}

// Device buffer of n elements of T (RAII; tests only).
template <typename T>
struct Dev {
  T* p = nullptr;
  size_t n = 0;
  explicit Dev(size_t count) : n(count) { DHS_CUDA_CHECK(cudaMalloc(&p, std::max<size_t>(count, 1) * sizeof(T))); }
  template <typename U>
  explicit Dev(const std::vector<U>& h) : Dev(h.size()) {
    static_assert(sizeof(U) == sizeof(T));
    DHS_CUDA_CHECK(cudaMemcpy(p, h.data(), n * sizeof(T), cudaMemcpyHostToDevice));
  }
  ~Dev() { cudaFree(p); }
  Dev(const Dev&) = delete;
  Dev& operator=(const Dev&) = delete;
  template <typename U = T>
  std::vector<U> get() const {
    static_assert(sizeof(U) == sizeof(T));
    std::vector<U> h(n);
    DHS_CUDA_CHECK(cudaMemcpy(h.data(), p, n * sizeof(T), cudaMemcpyDeviceToHost));
    return h;
  }
};
using f16 = __half;

// Every element: |got - ref| <= rel |ref| + abs_i. Returns "" or the first failures.
std::string compare(const std::vector<float>& got, const std::vector<float>& ref, double rel,
                    const std::vector<float>* abs_tol = nullptr, double abs_const = 0.0) {
  if (got.size() != ref.size()) return "size mismatch";
  size_t bad = 0;
  std::string first;
  double worst = 0.0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double tol = rel * std::fabs(ref[i]) + abs_const + (abs_tol ? (*abs_tol)[i] : 0.0);
    const double err = std::fabs(static_cast<double>(got[i]) - ref[i]);
    const bool ok = err <= tol && std::isfinite(got[i]) == std::isfinite(ref[i]);
    if (tol > 0) worst = std::max(worst, err / tol);
    if (!ok) {
      if (bad < 3)
        first += " [" + std::to_string(i) + "] got " + std::to_string(got[i]) + " ref " + std::to_string(ref[i]) +
                 " tol " + std::to_string(tol);
      ++bad;
    }
  }
  if (bad == 0) return "";
  return std::to_string(bad) + " of " + std::to_string(got.size()) + " elements out of tolerance:" + first;
}

bool have_gpu() { return dc::device_count() > 0; }

constexpr double kF16Rel = 1.0 / 1024.0;  // one f16 ulp, relative (see header)
// Below 2^-14 f16 values are subnormal, spaced 2^-24 apart whatever their size: one such step is
// allowed on top of the relative bound (bf16 had no such range at these magnitudes).
constexpr double kF16Sub = 0x1p-24;

// ---- embedding ------------------------------------------------------------------------

TEST(CudaOps, EmbeddingGather) {
  if (!have_gpu()) GTEST_SKIP() << "no GPU";
  std::mt19937 rng(1);
  const int64_t vocab = 1001;
  std::vector<int64_t> hiddens = small_mode() ? std::vector<int64_t>{576, 1003} : std::vector<int64_t>{576, 1003, 4096};
  for (int64_t hidden : hiddens) {
    const auto table = rounded(randn(static_cast<size_t>(vocab * hidden), rng));
    Dev<f16> table_d(to_f16(table));
    for (int64_t n_tok : {1, 17, 97}) {
      std::vector<int32_t> ids(static_cast<size_t>(n_tok));
      std::uniform_int_distribution<int32_t> pick(0, static_cast<int32_t>(vocab - 1));
      for (auto& id : ids) id = pick(rng);
      if (n_tok > 2) {
        ids[1] = -1;                               // invalid ids give zero rows
        ids[2] = static_cast<int32_t>(vocab);
      }
      ids[0] = static_cast<int32_t>(vocab - 1);  // last row of the table
      Dev<int32_t> ids_d(ids);
      std::vector<float> ref(static_cast<size_t>(n_tok * hidden), 0.0f);
      for (int64_t t = 0; t < n_tok; ++t)
        if (ids[t] >= 0 && ids[t] < vocab)
          std::copy_n(table.begin() + ids[t] * hidden, hidden, ref.begin() + t * hidden);
      for (DType dt : {DType::F32, DType::F16}) {
        Dev<float> out_f(static_cast<size_t>(n_tok * hidden));
        Dev<f16> out_b(static_cast<size_t>(n_tok * hidden));
        dc::EmbeddingParams p;
        p.table = table_d.p;
        p.ids = ids_d.p;
        p.out = dt == DType::F32 ? static_cast<void*>(out_f.p) : static_cast<void*>(out_b.p);
        p.out_dtype = dt;
        p.n_tok = n_tok;
        p.vocab = vocab;
        p.hidden = hidden;
        dc::embedding(p, nullptr);
        const auto got = dt == DType::F32 ? out_f.get() : from_f16(out_b.get<uint16_t>());
        EXPECT_EQ(compare(got, ref, 0.0), "") << "hidden " << hidden << " n_tok " << n_tok;
      }
    }
  }
}

// ---- add + RMSNorm, RMSNorm ---------------------------------------------------------

TEST(CudaOps, AddRmsNorm) {
  if (!have_gpu()) GTEST_SKIP() << "no GPU";
  std::mt19937 rng(2);
  std::vector<int64_t> hiddens = small_mode() ? std::vector<int64_t>{576, 1003} : std::vector<int64_t>{576, 1003, 4096};
  for (int64_t n : hiddens) {
    for (int64_t rows : {1, 17, 97}) {
      for (int variant = 0; variant < 3; ++variant) {  // delta f16, delta fp32, no delta
        const auto x0 = randn(static_cast<size_t>(rows * n), rng, 3.0f);
        auto delta = randn(static_cast<size_t>(rows * n), rng, 1.0f);
        if (variant == 0) delta = rounded(delta);
        const auto w = rounded(randn(static_cast<size_t>(n), rng, 0.2f, 1.0f));
        const float eps = 1e-5f;
        std::vector<float> x_ref = x0;
        if (variant != 2) dhs::cpu::add_inplace(x_ref.data(), delta.data(), rows * n);
        std::vector<float> y_ref(x_ref.size());
        dhs::cpu::rms_norm(x_ref.data(), w.data(), y_ref.data(), rows, n, eps);

        Dev<float> x_d(x0), w_d(w), delta_f(delta);
        Dev<f16> delta_b(to_f16(delta)), y_d(static_cast<size_t>(rows * n));
        dc::AddRmsNormParams p;
        p.x = x_d.p;
        p.delta = variant == 0 ? static_cast<const void*>(delta_b.p) : variant == 1 ? delta_f.p : nullptr;
        p.delta_dtype = variant == 0 ? DType::F16 : DType::F32;
        p.weight = w_d.p;
        p.y = y_d.p;
        p.n_rows = rows;
        p.n = n;
        p.eps = eps;
        dc::add_rms_norm(p, nullptr);
        EXPECT_EQ(compare(x_d.get(), x_ref, 0.0), "") << "x, n " << n << " rows " << rows << " variant " << variant;
        EXPECT_EQ(compare(from_f16(y_d.get<uint16_t>()), y_ref, kF16Rel, nullptr, kF16Sub), "")
            << "y, n " << n << " rows " << rows << " variant " << variant;
      }
    }
  }
}

TEST(CudaOps, RmsNormRowsAndHeads) {
  if (!have_gpu()) GTEST_SKIP() << "no GPU";
  std::mt19937 rng(3);
  struct Shape {
    int64_t rows, n;
  };
  // Plain rows, and per-head norm: 17 tokens x 8 heads of 128, 97 x 3 heads of 64.
  const std::vector<Shape> shapes = {{1, 576}, {17, 1003}, {97, 4096}, {17 * 8, 128}, {97 * 3, 64}, {1, 64}};
  for (const Shape& s : shapes) {
    if (small_mode() && s.n == 4096) continue;
    for (int variant = 0; variant < 3; ++variant) {  // f16 in, fp32 in, f16 in place
      auto x = randn(static_cast<size_t>(s.rows * s.n), rng, 2.0f);
      if (variant != 1) x = rounded(x);
      const auto w = rounded(randn(static_cast<size_t>(s.n), rng, 0.2f, 1.0f));
      std::vector<float> ref(x.size());
      dhs::cpu::rms_norm(x.data(), w.data(), ref.data(), s.rows, s.n, 1e-6f);
      Dev<float> x_f(x), w_d(w);
      Dev<f16> x_b(to_f16(x)), y_d(x.size());
      dc::RmsNormParams p;
      p.in = variant == 1 ? static_cast<const void*>(x_f.p) : x_b.p;
      p.in_dtype = variant == 1 ? DType::F32 : DType::F16;
      p.weight = w_d.p;
      p.out = variant == 2 ? x_b.p : y_d.p;
      p.n_rows = s.rows;
      p.n = s.n;
      p.eps = 1e-6f;
      dc::rms_norm(p, nullptr);
      const auto got = from_f16(variant == 2 ? x_b.get<uint16_t>() : y_d.get<uint16_t>());
      EXPECT_EQ(compare(got, ref, kF16Rel, nullptr, kF16Sub), "") << "rows " << s.rows << " n " << s.n << " variant " << variant;
    }
  }
}

// ---- RoPE + K/V append ------------------------------------------------------------------

struct RopeCase {
  const char* name;
  int n_heads_q, n_heads_kv, head_dim;
  dhs::RopeStyle style;
  DType in_dtype;
  bool bias, qk_norm, in_place, fused_qkv;
  bool far_positions;  // random positions up to 131071 (else 2 .. n_tok+1 through a PageTable)
  float theta;
  bool llama3_scaling;
};

void run_rope_case(const RopeCase& rc, int64_t n_tok, std::mt19937& rng) {
  const int hq = rc.n_heads_q, hkv = rc.n_heads_kv, hd = rc.head_dim, half = hd / 2;
  const int page_size = 16;
  const std::string tag = std::string(rc.name) + " n_tok " + std::to_string(n_tok);

  // Positions and destination slots.
  std::vector<int32_t> pos(static_cast<size_t>(n_tok));
  std::vector<int32_t> dst(static_cast<size_t>(n_tok * hkv));
  int64_t n_pages;
  if (!rc.far_positions) {
    // A request with 2 tokens already cached appends n_tok more: the last page ends 3/16
    // full for n_tok = 1, 17, 97. Slots come from a PageTable over a pool whose free
    // stack was shuffled, so pages are scattered.
    n_pages = 4 * ((n_tok + 2 + page_size - 1) / page_size) * hkv + 7;
    dhs::PagePool pool(dhs::Tier::Device, n_pages, page_size, hd, /*with_storage=*/false);
    std::vector<dhs::PageRef> all;
    ASSERT_TRUE(pool.allocate(n_pages, &all));
    std::shuffle(all.begin(), all.end(), rng);
    for (const auto& r : all) pool.free(r);
    dhs::PageTable table(1, hkv, page_size);
    ASSERT_TRUE(table.reserve(pool, 2 + n_tok));
    for (int64_t t = 0; t < n_tok; ++t) {
      pos[t] = static_cast<int32_t>(2 + t);
      for (int h = 0; h < hkv; ++h) {
        int row;
        dst[t * hkv + h] = table.page_of_token(0, h, pos[t], &row).slot;
      }
    }
  } else {
    // Distinct far positions (131071 included), each (token, head) on its own page, one
    // (token 0, head 0) with slot -1 (a padded row: must write nothing).
    n_pages = n_tok * hkv + 5;
    std::vector<int32_t> slots(static_cast<size_t>(n_pages));
    std::iota(slots.begin(), slots.end(), 0);
    std::shuffle(slots.begin(), slots.end(), rng);
    std::uniform_int_distribution<int32_t> pick(0, 131071);
    for (int64_t t = 0; t < n_tok; ++t) pos[t] = t == 0 ? 131071 : (t == 1 ? 131070 : pick(rng));
    for (size_t i = 0; i < dst.size(); ++i) dst[i] = slots[i];
    if (n_tok > 1) dst[0] = -1;
  }

  // Inputs: q, k, v as fp32 GEMM outputs or f16, in one fused buffer or three.
  const int64_t q_w = int64_t{hq} * hd, kv_w = int64_t{hkv} * hd;
  const int64_t ld_fused = q_w + 2 * kv_w;
  auto q = randn(static_cast<size_t>(n_tok * q_w), rng, 1.5f);
  auto k = randn(static_cast<size_t>(n_tok * kv_w), rng, 1.5f);
  auto v = randn(static_cast<size_t>(n_tok * kv_w), rng, 1.5f);
  if (rc.in_dtype == DType::F16) {
    q = rounded(q);
    k = rounded(k);
    v = rounded(v);
  }
  const auto q_bias = randn(static_cast<size_t>(q_w), rng, 0.5f);
  const auto k_bias = randn(static_cast<size_t>(kv_w), rng, 0.5f);
  const auto v_bias = randn(static_cast<size_t>(kv_w), rng, 0.5f);
  const auto q_norm = rounded(randn(static_cast<size_t>(hd), rng, 0.3f, 1.0f));
  const auto k_norm = rounded(randn(static_cast<size_t>(hd), rng, 0.3f, 1.0f));
  dhs::ModelConfig cfg;
  cfg.head_dim = hd;
  cfg.rope_theta = rc.theta;
  if (rc.llama3_scaling) {
    cfg.rope_scaling.kind = dhs::RopeScaling::Kind::Llama3;
    cfg.rope_scaling.factor = 8.0f;
    cfg.rope_scaling.low_freq_factor = 1.0f;
    cfg.rope_scaling.high_freq_factor = 4.0f;
    cfg.rope_scaling.original_max_position = 8192;
  }
  std::vector<float> inv_freq(static_cast<size_t>(half));
  dhs::rope_inv_freq(cfg, inv_freq.data());

  // CPU reference: bias, per-head norm, rope.
  auto prep = [&](std::vector<float> x, int heads, const std::vector<float>& bias, const std::vector<float>* norm) {
    for (int64_t t = 0; t < n_tok; ++t)
      for (int64_t i = 0; i < int64_t{heads} * hd; ++i) {
        float& e = x[static_cast<size_t>(t * heads * hd + i)];
        if (rc.bias) e += bias[static_cast<size_t>(i)];
      }
    if (norm) dhs::cpu::rms_norm(x.data(), norm->data(), x.data(), n_tok * heads, hd, 1e-6f);
    return x;
  };
  const auto q_pre = prep(q, hq, q_bias, rc.qk_norm ? &q_norm : nullptr);
  const auto k_pre = prep(k, hkv, k_bias, rc.qk_norm ? &k_norm : nullptr);
  const auto v_ref = prep(v, hkv, v_bias, nullptr);
  auto q_ref = q_pre, k_ref = k_pre;
  dhs::cpu::rope(q_ref.data(), pos.data(), n_tok, hq, hd, inv_freq.data(), rc.style);
  dhs::cpu::rope(k_ref.data(), pos.data(), n_tok, hkv, hd, inv_freq.data(), rc.style);
  // abs tolerance per element: 1e-5 (|x0| + |x1|) of its rotation pair.
  auto pair_tol = [&](const std::vector<float>& pre) {
    std::vector<float> tol(pre.size());
    for (size_t base = 0; base < pre.size(); base += static_cast<size_t>(hd))
      for (int i = 0; i < half; ++i) {
        const int a = rc.style == dhs::RopeStyle::Half ? i : 2 * i;
        const int b = rc.style == dhs::RopeStyle::Half ? i + half : 2 * i + 1;
        const float s = 1e-5f * (std::fabs(pre[base + a]) + std::fabs(pre[base + b]));
        tol[base + a] = tol[base + b] = s;
      }
    return tol;
  };
  const auto q_tol = pair_tol(q_pre), k_tol = pair_tol(k_pre);

  // Device buffers.
  const size_t esz = rc.in_dtype == DType::F32 ? 4 : 2;
  auto pack = [&](const std::vector<float>& x) {  // -> bytes in in_dtype
    std::vector<uint8_t> b(x.size() * esz);
    if (esz == 4) {
      std::memcpy(b.data(), x.data(), b.size());
    } else {
      const auto h = to_f16(x);
      std::memcpy(b.data(), h.data(), b.size());
    }
    return b;
  };
  std::vector<uint8_t> fused;
  if (rc.fused_qkv) {
    fused.resize(static_cast<size_t>(n_tok * ld_fused) * esz);
    const auto qb = pack(q), kb = pack(k), vb = pack(v);
    for (int64_t t = 0; t < n_tok; ++t) {
      std::memcpy(&fused[static_cast<size_t>(t * ld_fused) * esz], &qb[static_cast<size_t>(t * q_w) * esz], q_w * esz);
      std::memcpy(&fused[static_cast<size_t>(t * ld_fused + q_w) * esz], &kb[static_cast<size_t>(t * kv_w) * esz],
                  kv_w * esz);
      std::memcpy(&fused[static_cast<size_t>(t * ld_fused + q_w + kv_w) * esz], &vb[static_cast<size_t>(t * kv_w) * esz],
                  kv_w * esz);
    }
  }
  Dev<uint8_t> fused_d(fused), q_d(pack(q)), k_d(pack(k)), v_d(pack(v));
  Dev<float> qb_d(q_bias), kb_d(k_bias), vb_d(v_bias), qn_d(q_norm), kn_d(k_norm), inv_d(inv_freq);
  Dev<int32_t> pos_d(pos), dst_d(dst);
  Dev<f16> q_out_d(static_cast<size_t>(n_tok * q_w));
  const size_t pool_elems = static_cast<size_t>(n_pages) * page_size * hd;
  std::vector<uint16_t> sentinel(pool_elems, 0x7fc1u);  // a NaN pattern: any stray write shows
  Dev<f16> k_pool(sentinel), v_pool(sentinel);

  dc::RopeAppendParams p;
  uint8_t* base = rc.fused_qkv ? fused_d.p : nullptr;
  p.q = rc.fused_qkv ? static_cast<const void*>(base) : q_d.p;
  p.k = rc.fused_qkv ? static_cast<const void*>(base + q_w * esz) : k_d.p;
  p.v = rc.fused_qkv ? static_cast<const void*>(base + (q_w + kv_w) * esz) : v_d.p;
  p.q_ld = rc.fused_qkv ? ld_fused : q_w;
  p.k_ld = p.v_ld = rc.fused_qkv ? ld_fused : kv_w;
  p.in_dtype = rc.in_dtype;
  p.q_bias = rc.bias ? qb_d.p : nullptr;
  p.k_bias = rc.bias ? kb_d.p : nullptr;
  p.v_bias = rc.bias ? vb_d.p : nullptr;
  p.q_norm = rc.qk_norm ? qn_d.p : nullptr;
  p.k_norm = rc.qk_norm ? kn_d.p : nullptr;
  p.norm_eps = 1e-6f;
  if (rc.in_place) {
    p.q_out = reinterpret_cast<f16*>(const_cast<void*>(p.q));
    p.q_out_ld = p.q_ld;
  } else {
    p.q_out = q_out_d.p;
    p.q_out_ld = q_w;
  }
  p.pos = pos_d.p;
  p.inv_freq = inv_d.p;
  p.style = rc.style;
  p.dst_slot = dst_d.p;
  p.k_pool = k_pool.p;
  p.v_pool = v_pool.p;
  p.n_pages = n_pages;
  p.page_size = page_size;
  p.n_tok = n_tok;
  p.n_heads_q = hq;
  p.n_heads_kv = hkv;
  p.head_dim = hd;
  dc::rope_append(p, nullptr);
  DHS_CUDA_CHECK(cudaDeviceSynchronize());

  // q
  std::vector<float> q_got(static_cast<size_t>(n_tok * q_w));
  if (rc.in_place) {
    const auto raw = rc.fused_qkv ? fused_d.get() : q_d.get();
    const int64_t ld = rc.fused_qkv ? ld_fused : q_w;
    for (int64_t t = 0; t < n_tok; ++t)
      for (int64_t i = 0; i < q_w; ++i) {
        uint16_t h;
        std::memcpy(&h, &raw[static_cast<size_t>(t * ld + i) * 2], 2);
        q_got[static_cast<size_t>(t * q_w + i)] = dhs::fp16_to_f32(h);
      }
  } else {
    q_got = from_f16(q_out_d.get<uint16_t>());
  }
  EXPECT_EQ(compare(q_got, q_ref, kF16Rel, &q_tol, kF16Sub), "") << tag << " q";

  // k, v rows in the pools; every other row untouched.
  const auto kp = k_pool.get<uint16_t>(), vp = v_pool.get<uint16_t>();
  std::vector<uint8_t> written(static_cast<size_t>(n_pages) * page_size, 0);
  std::vector<float> k_got, v_got, k_exp, v_exp, k_tol_sel;
  for (int64_t t = 0; t < n_tok; ++t)
    for (int h = 0; h < hkv; ++h) {
      const int32_t slot = dst[t * hkv + h];
      if (slot < 0) continue;
      const int row = pos[t] % page_size;
      written[static_cast<size_t>(slot) * page_size + row] = 1;
      const size_t off = (static_cast<size_t>(slot) * page_size + row) * hd;
      const size_t src = static_cast<size_t>((t * hkv + h) * hd);
      for (int i = 0; i < hd; ++i) {
        k_got.push_back(dhs::fp16_to_f32(kp[off + i]));
        v_got.push_back(dhs::fp16_to_f32(vp[off + i]));
        k_exp.push_back(k_ref[src + i]);
        v_exp.push_back(v_ref[src + i]);
        k_tol_sel.push_back(k_tol[src + i]);
      }
    }
  EXPECT_EQ(compare(k_got, k_exp, kF16Rel, &k_tol_sel, kF16Sub), "") << tag << " k pool";
  // v: f16 in, no bias -> exact copy; else one rounding of an fp32 sum.
  EXPECT_EQ(compare(v_got, v_exp, kF16Rel, nullptr, kF16Sub), "") << tag << " v pool";
  size_t stray = 0;
  for (size_t r = 0; r < written.size(); ++r) {
    if (written[r]) continue;
    for (int i = 0; i < hd; ++i) {
      stray += kp[r * hd + i] != 0x7fc1u;
      stray += vp[r * hd + i] != 0x7fc1u;
    }
  }
  EXPECT_EQ(stray, size_t{0}) << tag << " writes outside the appended rows";
}

TEST(CudaOps, RopeAppend) {
  if (!have_gpu()) GTEST_SKIP() << "no GPU";
  std::mt19937 rng(4);
  using S = dhs::RopeStyle;
  const std::vector<RopeCase> cases = {
      // name, hq, hkv, hd, style, dtype, bias, qk_norm, in_place, fused, far, theta, llama3
      {"llama31 d128 half fp32 far", 8, 2, 128, S::Half, DType::F32, false, false, false, false, true, 500000.0f, true},
      {"llama31 d128 half f16 fused in-place", 8, 2, 128, S::Half, DType::F16, false, false, true, true, false,
       500000.0f, true},
      {"gguf d128 interleaved f16 far", 4, 4, 128, S::Interleaved, DType::F16, false, false, false, false, true,
       10000.0f, false},
      {"qwen2 d64 half fp32 bias fused", 6, 2, 64, S::Half, DType::F32, true, false, false, true, false, 1000000.0f,
       false},
      {"qwen3 d128 half f16 qknorm far", 4, 2, 128, S::Half, DType::F16, false, true, false, false, true, 1000000.0f,
       false},
      {"qwen3 d64 interleaved f16 qknorm+bias in-place", 3, 1, 64, S::Interleaved, DType::F16, true, true, true,
       false, false, 10000.0f, false},
  };
  for (const auto& rc : cases)
    for (int64_t n_tok : {1, 17, 97}) {
      if (small_mode() && n_tok == 97) continue;
      run_rope_case(rc, n_tok, rng);
    }
}

// ---- SwiGLU ------------------------------------------------------------------------------

TEST(CudaOps, SwiGlu) {
  if (!have_gpu()) GTEST_SKIP() << "no GPU";
  std::mt19937 rng(5);
  std::vector<int64_t> ns = small_mode() ? std::vector<int64_t>{1003} : std::vector<int64_t>{1003, 1536, 14336};
  for (int64_t n : ns)
    for (int64_t n_tok : {1, 17, 97}) {
      if (n == 14336 && n_tok == 97 && small_mode()) continue;
      for (int variant = 0; variant < 4; ++variant) {  // {f16, fp32} x {fused gate|up, two buffers}
        const bool f32 = variant & 1, fused = variant & 2;
        auto g = randn(static_cast<size_t>(n_tok * n), rng, 3.0f);
        auto u = randn(static_cast<size_t>(n_tok * n), rng, 1.0f);
        if (!f32) {
          g = rounded(g);
          u = rounded(u);
        }
        std::vector<float> ref(g.size());
        dhs::cpu::silu_mul(g.data(), u.data(), ref.data(), n_tok, n);
        std::vector<float> buf;
        if (fused) {
          buf.resize(static_cast<size_t>(n_tok * 2 * n));
          for (int64_t t = 0; t < n_tok; ++t) {
            std::copy_n(g.begin() + t * n, n, buf.begin() + t * 2 * n);
            std::copy_n(u.begin() + t * n, n, buf.begin() + t * 2 * n + n);
          }
        }
        Dev<float> gf(g), uf(u), buf_f(buf);
        Dev<f16> gb(to_f16(g)), ub(to_f16(u)), buf_b(to_f16(buf)), out(static_cast<size_t>(n_tok * n));
        dc::SwiGluParams p;
        if (fused) {
          p.gate = f32 ? static_cast<const void*>(buf_f.p) : buf_b.p;
          p.up = f32 ? static_cast<const void*>(buf_f.p + n) : buf_b.p + n;
          p.in_ld = 2 * n;
        } else {
          p.gate = f32 ? static_cast<const void*>(gf.p) : gb.p;
          p.up = f32 ? static_cast<const void*>(uf.p) : ub.p;
          p.in_ld = n;
        }
        p.in_dtype = f32 ? DType::F32 : DType::F16;
        p.out = out.p;
        p.out_ld = n;
        p.n_tok = n_tok;
        p.n = n;
        dc::swiglu(p, nullptr);
        EXPECT_EQ(compare(from_f16(out.get<uint16_t>()), ref, kF16Rel, nullptr, kF16Sub), "")
            << "n " << n << " n_tok " << n_tok << " variant " << variant;
      }
    }
}

// ---- dense page lists -----------------------------------------------------------------------

// launch_dense_lists against its definition: for each (request, KV head) in batch order, every
// page of `layer` (ceil(seq_len / 16) of them) as (slot from the table, position i), CSR offsets
// the running sum. Batches of 1 and 17 requests in scattered table rows, lengths 1 token .. the
// table's max (a last page 1/16 .. full), rows longer than one block's 1,024 pages, every layer.
TEST(CudaOps, DenseLists) {
  if (!have_gpu()) GTEST_SKIP() << "no GPU";
  std::mt19937 rng(11);
  const int n_layers = 3, hkv = 5, max_req = 24, page = 16;
  for (const int64_t max_pages : {int64_t{7}, int64_t{1030}, int64_t{2500}}) {
    std::vector<int32_t> table(static_cast<size_t>(max_req * n_layers * hkv * max_pages));
    for (auto& v : table) v = static_cast<int32_t>(rng() % 1000000);
    int32_t* table_d = dhs::test::to_device(table);
    for (const int n_req : {1, 17}) {
      std::vector<int32_t> slot(static_cast<size_t>(max_req));
      std::iota(slot.begin(), slot.end(), 0);
      std::shuffle(slot.begin(), slot.end(), rng);
      slot.resize(static_cast<size_t>(n_req));
      std::vector<int32_t> seq(static_cast<size_t>(n_req));
      for (int r = 0; r < n_req; ++r) {
        const int64_t max_tok = max_pages * page;
        seq[static_cast<size_t>(r)] = static_cast<int32_t>(r == 0 ? max_tok : r == 1 ? 1 : 1 + rng() % max_tok);
      }
      int32_t* slot_d = dhs::test::to_device(slot);
      int32_t* seq_d = dhs::test::to_device(seq);
      int64_t nnz = 0;
      for (int32_t n : seq) nnz += hkv * ((n + page - 1) / page);
      int32_t *indptr_d, *slots_d, *pos_d;
      DHS_CUDA_CHECK(cudaMalloc(&indptr_d, static_cast<size_t>(n_req * hkv + 1) * 4));
      DHS_CUDA_CHECK(cudaMalloc(&slots_d, static_cast<size_t>(nnz) * 4));
      DHS_CUDA_CHECK(cudaMalloc(&pos_d, static_cast<size_t>(nnz) * 4));
      for (int layer = 0; layer < n_layers; ++layer) {
        DHS_CUDA_CHECK(cudaMemset(slots_d, 0xff, static_cast<size_t>(nnz) * 4));
        DHS_CUDA_CHECK(cudaMemset(pos_d, 0xff, static_cast<size_t>(nnz) * 4));
        dc::DenseListsParams p;
        p.table = table_d;
        p.req_slot = slot_d;
        p.seq_len = seq_d;
        p.indptr = indptr_d;
        p.slots = slots_d;
        p.page_pos = pos_d;
        p.n_requests = n_req;
        p.n_layers = n_layers;
        p.n_heads_kv = hkv;
        p.max_pages = max_pages;
        p.layer = layer;
        p.page_size = page;
        dc::launch_dense_lists(p, nullptr);
        DHS_CUDA_CHECK(cudaDeviceSynchronize());
        const auto indptr = dhs::test::to_host(indptr_d, static_cast<size_t>(n_req * hkv + 1));
        const auto slots = dhs::test::to_host(slots_d, static_cast<size_t>(nnz));
        const auto pos = dhs::test::to_host(pos_d, static_cast<size_t>(nnz));
        int64_t at = 0, bad = 0;
        for (int r = 0; r < n_req; ++r)
          for (int h = 0; h < hkv; ++h) {
            const int row = r * hkv + h;
            bad += indptr[static_cast<size_t>(row)] != at;
            const int64_t n = (seq[static_cast<size_t>(r)] + page - 1) / page;
            const int32_t* src = table.data() + ((static_cast<int64_t>(slot[static_cast<size_t>(r)]) * n_layers + layer) * hkv + h) * max_pages;
            for (int64_t i = 0; i < n; ++i, ++at)
              bad += slots[static_cast<size_t>(at)] != src[i] || pos[static_cast<size_t>(at)] != i;
          }
        bad += indptr.back() != at;
        EXPECT_EQ(bad, 0) << "max_pages " << max_pages << " batch " << n_req << " layer " << layer;
      }
      cudaFree(indptr_d);
      cudaFree(slots_d);
      cudaFree(pos_d);
      cudaFree(slot_d);
      cudaFree(seq_d);
    }
    cudaFree(table_d);
  }
}

TEST(CudaOps, RejectsBadParams) {
  if (!have_gpu()) GTEST_SKIP() << "no GPU";
  dc::RopeAppendParams p;  // head_dim 0, null pointers
  bool threw = false;
  try {
    dc::rope_append(p, nullptr);
  } catch (const std::exception&) {
    threw = true;
  }
  EXPECT_TRUE(threw);
  dc::SwiGluParams s;
  threw = false;
  try {
    dc::swiglu(s, nullptr);
  } catch (const std::exception&) {
    threw = true;
  }
  EXPECT_TRUE(threw);
}

}  // namespace

// The device page table's patches (a page moved between tiers, its entry rewritten): a page
// patched many times between flushes ends with its last record's key (the claims pick the latest
// record on the device), pages patched once with theirs, every other entry untouched; a second
// flush on the same claims' array is exact too (the claims were reset).
TEST(CudaOps, PageTablePatchesTakeEachEntrysLastRecord) {
  if (!have_gpu()) GTEST_SKIP() << "no GPU";
  constexpr int kLayers = 3, kHeads = 2, kDevice = 500;
  dhs::PagePool pool(dhs::Tier::Device, kDevice, 16, 8, /*with_storage=*/false);
  dhs::PageTable t(kLayers, kHeads, 16);
  ASSERT_TRUE(t.reserve(pool, 16 * 20));
  t.commit(16 * 20);
  dc::DevicePageTable dt(2, kLayers, kHeads, 32);
  dt.set_tier_keys(kDevice);
  dt.sync(1, t, nullptr);  // request slot 1 mirrors t
  DHS_CUDA_CHECK(cudaDeviceSynchronize());
  dt.step_done();
  std::mt19937 rng(5);
  auto want_key = [&](int l, int h, int64_t i) {
    const dhs::PageRef p = t.page(l, h, i);
    return p.tier == dhs::Tier::Device ? p.slot : kDevice + p.slot;
  };
  for (int round = 0; round < 2; ++round) {
    // Entry (1, 0, 7): 1000 moves back and forth; 300 other random entries once or twice.
    for (int k = 0; k < 1000; ++k) {
      t.relocate(1, 0, 7, k % 2 ? dhs::PageRef{dhs::Tier::Host, 100 + k} : dhs::PageRef{dhs::Tier::Device, 400 + k % 90});
      dt.patch(t, 1, 0, 7);
    }
    for (int k = 0; k < 300; ++k) {
      const int l = static_cast<int>(rng() % kLayers), h = static_cast<int>(rng() % kHeads);
      const int64_t i = static_cast<int64_t>(rng() % 20);
      t.relocate(l, h, i, dhs::PageRef{dhs::Tier::Host, static_cast<int32_t>(rng() % 5000)});
      dt.patch(t, l, h, i);
    }
    dt.flush_patches(nullptr);
    DHS_CUDA_CHECK(cudaDeviceSynchronize());
    dt.step_done();
    const auto table = dhs::test::to_host(dt.table_d(), static_cast<size_t>(2 * kLayers * kHeads * 32));
    int64_t bad = 0;
    for (int l = 0; l < kLayers; ++l)
      for (int h = 0; h < kHeads; ++h)
        for (int64_t i = 0; i < 20; ++i)
          bad += table[static_cast<size_t>(((1 * kLayers + l) * kHeads + h) * 32 + i)] != want_key(l, h, i);
    EXPECT_EQ(bad, 0) << "round " << round;
    // Request slot 0 mirrors nothing: its entries stay -1.
    EXPECT_TRUE(std::all_of(table.begin(), table.begin() + kLayers * kHeads * 32, [](int32_t x) { return x == -1; }));
  }
  t.release([](void*, dhs::PageRef, int, int, int64_t) {}, nullptr);  // (the pages' refs were rewritten by hand)
}
