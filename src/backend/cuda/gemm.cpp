#include "backend/cuda/gemm.h"

#include <algorithm>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/gemv.h"
#include "backend/cuda/quant_gemv.h"
#include "core/error.h"

namespace dhs::cuda {

namespace {
void lt_check(cublasStatus_t s, const char* what) {
  if (s != CUBLAS_STATUS_SUCCESS) throw Error(fmt::format("cuBLASLt error {} in {}", static_cast<int>(s), what));
}
}  // namespace

Gemm::Gemm(size_t workspace_bytes) : workspace_bytes_(workspace_bytes) {
  lt_check(cublasLtCreate(&lt_), "cublasLtCreate");
  DHS_CUDA_CHECK(cudaMalloc(&workspace_d_, workspace_bytes_));
}

Gemm::~Gemm() {
  for (auto& [k, p] : plans_) {
    cublasLtMatrixLayoutDestroy(p.a);
    cublasLtMatrixLayoutDestroy(p.b);
    cublasLtMatrixLayoutDestroy(p.c);
    cublasLtMatmulDescDestroy(p.desc);
  }
  cudaFree(workspace_d_);
  cudaFree(scratch_d_);
  cublasLtDestroy(lt_);
}

// Row-major y[n, out] = x[n, in] W[out, in]^T is, in cuBLAS's column-major terms,
// C[out, n] = op(A) B with A = W seen as col-major [in, out] (transposed) and
// B = x seen as col-major [in, n].
const Gemm::Plan& Gemm::plan(int64_t n_tok, int64_t in, int64_t out, GemmOut out_type, float beta) {
  const auto key = std::make_tuple(n_tok, in, out, static_cast<int>(out_type), beta != 0.0f);
  auto it = plans_.find(key);
  if (it != plans_.end()) return it->second;
  Plan p;
  lt_check(cublasLtMatmulDescCreate(&p.desc, CUBLAS_COMPUTE_32F, CUDA_R_32F), "desc");
  const cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
  lt_check(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)), "transa");
  lt_check(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)), "transb");
  const cudaDataType_t ct = out_type == GemmOut::F16 ? CUDA_R_16F : CUDA_R_32F;
  lt_check(cublasLtMatrixLayoutCreate(&p.a, CUDA_R_16F, static_cast<uint64_t>(in), static_cast<uint64_t>(out), in), "A");
  lt_check(cublasLtMatrixLayoutCreate(&p.b, CUDA_R_16F, static_cast<uint64_t>(in), static_cast<uint64_t>(n_tok), in), "B");
  lt_check(cublasLtMatrixLayoutCreate(&p.c, ct, static_cast<uint64_t>(out), static_cast<uint64_t>(n_tok), out), "C");
  cublasLtMatmulPreference_t pref;
  lt_check(cublasLtMatmulPreferenceCreate(&pref), "pref");
  lt_check(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace_bytes_,
                                                sizeof(workspace_bytes_)),
           "pref ws");
  cublasLtMatmulHeuristicResult_t res{};
  int n_res = 0;
  lt_check(cublasLtMatmulAlgoGetHeuristic(lt_, p.desc, p.a, p.b, p.c, p.c, pref, 1, &res, &n_res), "heuristic");
  cublasLtMatmulPreferenceDestroy(pref);
  DHS_CHECK(n_res > 0, "cuBLASLt has no algorithm for GEMM n={} in={} out={}", n_tok, in, out);
  p.algo = res.algo;
  return plans_.emplace(key, p).first->second;
}

void Gemm::run(const __half* w_d, const __half* x_d, void* y_d, int64_t n_tok, int64_t in,
               int64_t out, GemmOut out_type, cudaStream_t stream, float beta) {
  DHS_CHECK(beta == 0.0f || out_type == GemmOut::F32, "GEMM accumulation needs fp32 output");
  DHS_CHECK(beta == 0.0f || beta == 1.0f, "GEMM beta must be 0 or 1, got {}", beta);
  if (n_tok <= gemv_max_tok_ && n_tok <= kGemvMaxTok) {
    GemvParams g;
    g.w = w_d;
    g.x = x_d;
    g.y = y_d;
    g.y_f32 = out_type == GemmOut::F32;
    g.accumulate = beta != 0.0f;
    g.n_tok = static_cast<int>(n_tok);
    g.in = in;
    g.out = out;
    if (gemv_supported(g)) {
      launch_gemv(g, stream, gemv_kernel_);
      return;
    }
  }
  const Plan& p = plan(n_tok, in, out, out_type, beta);
  const float alpha = 1.0f;
  lt_check(cublasLtMatmul(lt_, p.desc, &alpha, w_d, p.a, x_d, p.b, &beta, y_d, p.c, y_d, p.c, &p.algo, workspace_d_,
                          workspace_bytes_, stream),
           "matmul");
}

void Gemm::reserve_dequant(size_t elems) {
  if (elems <= scratch_elems_) return;
  cudaFree(scratch_d_);
  scratch_d_ = nullptr;
  scratch_elems_ = 0;
  DHS_CUDA_CHECK(cudaMalloc(&scratch_d_, elems * 2));
  scratch_elems_ = elems;
}

void Gemm::run(const DeviceWeight& w, const __half* x_d, void* y_d, int64_t n_tok, GemmOut out_type, cudaStream_t stream,
               float beta) {
  if (w.plain_f16()) return run(w.f16(), x_d, y_d, n_tok, w.in, w.out, out_type, stream, beta);
  DHS_CHECK(beta == 0.0f || out_type == GemmOut::F32, "GEMM accumulation needs fp32 output");
  DHS_CHECK(beta == 0.0f || beta == 1.0f, "GEMM beta must be 0 or 1, got {}", beta);
  DHS_CHECK(w.n_parts >= 1 && w.n_parts <= DeviceWeight::kMaxParts, "weight of {} parts", w.n_parts);
  const bool f32 = out_type == GemmOut::F32;
  const size_t elem = f32 ? 4 : 2;
  if (n_tok <= kQuantTileRows) {
    for (int64_t t0 = 0; t0 < n_tok; t0 += kQuantGemvMaxTok) {
      int64_t row0 = 0;
      for (int i = 0; i < w.n_parts; ++i) {
        const WeightPart& part = w.part[i];
        void* y_part = static_cast<char*>(y_d) + static_cast<size_t>(t0 * w.out + row0) * elem;
        const int nt = static_cast<int>(std::min<int64_t>(kQuantGemvMaxTok, n_tok - t0));
        if (part.packed) {
          PackedGemvParams q;
          q.w = part.pk;
          q.x = x_d + t0 * w.in;
          q.y = y_part;
          q.ldy = w.out;
          q.y_f32 = f32;
          q.accumulate = beta != 0.0f;
          q.n_tok = nt;
          launch_packed_gemv(q, stream);
          row0 += part.rows;
          continue;
        }
        QuantGemvParams q;
        q.type = part.type;
        q.w = part.data;
        q.row_stride = part.row_stride;
        q.x = x_d + t0 * w.in;
        q.y = y_part;
        q.ldy = w.out;
        q.y_f32 = f32;
        q.accumulate = beta != 0.0f;
        q.n_tok = nt;
        q.in = w.in;
        q.out = part.rows;
        launch_quant_gemv(q, stream);
        row0 += part.rows;
      }
    }
    return;
  }
  DHS_CHECK(static_cast<size_t>(w.out * w.in) <= scratch_elems_,
            "GEMM of {} rows on a {} x {} quantized weight: the dequantization scratch holds {} elements", n_tok, w.out,
            w.in, scratch_elems_);
  int64_t row0 = 0;
  for (int i = 0; i < w.n_parts; ++i) {
    const WeightPart& part = w.part[i];
    if (part.packed) launch_unpack_rows(part.pk, scratch_d_ + row0 * w.in, w.in, stream);
    else launch_dequant_rows(part.type, part.data, part.row_stride, part.rows, w.in, scratch_d_ + row0 * w.in, w.in, stream);
    row0 += part.rows;
  }
  run(scratch_d_, x_d, y_d, n_tok, w.in, w.out, out_type, stream, beta);
}

}  // namespace dhs::cuda
