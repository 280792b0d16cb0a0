// CPU reference ops: the oracle every CUDA op is tested against, and a usable
// threaded CPU engine. Plain fp32 math; matmuls read fp32 or fp16 weights.
#pragma once
#include <cstdint>

#include "backend/cpu/cpu_matrix.h"
#include "dhisparse/rope_style.h"

namespace dhs::cpu {

// y[t, :] = W x[t, :] (+ bias).   x: [n_tok, W.cols]  y: [n_tok, W.rows]  bias: [W.rows] or null
// Batch-invariant: y[t, :] has the same bits for any n_tok and any other rows of x (one
// canonical dot per (row, token), ops.cpp), so batching never changes a request's results.
void matmul(const CpuMatrix& w, const float* x, float* y, int64_t n_tok, const float* bias = nullptr);

// y = x / rms(x) * weight, row by row.   x, y: [n_rows, n]  weight: [n]   (x == y allowed)
void rms_norm(const float* x, const float* weight, float* y, int64_t n_rows, int64_t n, float eps);

// In-place RoPE on x: [n_tok, n_heads, head_dim]; token t is at position pos[t].
void rope(float* x, const int32_t* pos, int64_t n_tok, int64_t n_heads, int64_t head_dim,
          const float* inv_freq, RopeStyle style);

// out[t, i] = silu(gate[t, i]) * up[t, i].   gate, up, out: [n_tok, n]
void silu_mul(const float* gate, const float* up, float* out, int64_t n_tok, int64_t n);

// y += x.   [n]
void add_inplace(float* y, const float* x, int64_t n);

}  // namespace dhs::cpu
