// Prefill attention benchmark: one layer of causal attention at Llama-3.1-8B
// shapes (32 q heads, 8 KV heads, d 128), batch 1, prompts of 32k and 128k,
// K/V in a shuffled head-paged pool. Runs the whole prompt as one chunk and as
// chunks of --chunk tokens on top of the growing prefix (how the engine runs a
// long prompt), checks a few rows against a float64 host reference, and writes
// JSON lines (commit, gpu, impl, ctx, batch, us, tflops, samples). The anchor,
// bench/anchors/sdpa_prefill_anchor.py, runs in the same device call.
//
//   prefill_bench [--ctx 32768,131072] [--chunk 8192] [--out FILE]
//   (commit from $DHS_COMMIT)
#include <cuda_fp16.h>

#include "core/fp16.h"
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

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/prefill_attention.h"

namespace {

constexpr int kHeadsQ = 32, kHeadsKv = 8, kHeadDim = 128, kPageSize = 16;

__global__ void fill_uniform_kernel(__half* x, size_t n, uint64_t seed, float lo, float hi) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    uint64_t z = seed + i * 0x9e3779b97f4a7c15ull;  // splitmix64
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
    const float u = static_cast<float>(z >> 40) * (1.0f / 16777216.0f);
    x[i] = __float2half_rn(lo + (hi - lo) * u);
  }
}

__global__ void count_diff_kernel(const uint16_t* a, const uint16_t* b, size_t n, unsigned long long* n_diff) {
  unsigned long long local = 0;
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x)
    local += a[i] != b[i];
  if (local) atomicAdd(n_diff, local);
}

void fill(__half* x, size_t n, uint64_t seed, float lo, float hi) {
  fill_uniform_kernel<<<1024, 256>>>(x, n, seed, lo, hi);
  DHS_CUDA_CHECK(cudaGetLastError());
}

float f16_to_float(uint16_t h) { return dhs::fp16_to_f32(h); }

template <class T>
T* dev_alloc(size_t n) {
  T* p = nullptr;
  DHS_CUDA_CHECK(cudaMalloc(&p, n * sizeof(T)));
  return p;
}
template <class T>
T* dev_upload(const std::vector<T>& h) {
  T* p = dev_alloc<T>(h.size());
  DHS_CUDA_CHECK(cudaMemcpy(p, h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice));
  return p;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

struct Result {
  std::string mode;
  int ctx;
  double us, tflops;
  std::vector<double> samples_us;
};

}  // namespace

int main(int argc, char** argv) {
  std::vector<int> ctxs = {32768, 131072};
  int chunk = 8192;
  std::string out_path = "bench/results/prefill_attention.jsonl";
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i], v = argv[i + 1];
    if (a == "--ctx") {
      ctxs.clear();
      for (size_t s = 0; s < v.size();) {
        const size_t e = v.find(',', s);
        ctxs.push_back(std::stoi(v.substr(s, e - s)));
        s = e == std::string::npos ? v.size() : e + 1;
      }
    } else if (a == "--chunk") {
      chunk = std::stoi(v);
    } else if (a == "--out") {
      out_path = v;
    }
  }
  if (dhs::cuda::device_count() == 0) {
    std::printf("SKIP: no GPU\n");
    return 0;
  }
  cudaDeviceProp prop{};
  DHS_CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
  const char* commit_env = std::getenv("DHS_COMMIT");
  const std::string commit = commit_env ? commit_env : "unknown";
  FILE* jf = std::fopen(out_path.c_str(), "a");
  if (!jf) {
    std::printf("cannot open %s\n", out_path.c_str());
    return 1;
  }

  std::vector<Result> results;
  int failures = 0;
  cudaEvent_t ev0, ev1;
  DHS_CUDA_CHECK(cudaEventCreate(&ev0));
  DHS_CUDA_CHECK(cudaEventCreate(&ev1));

  for (const int ctx : ctxs) {
    const int pages_per_head = (ctx + kPageSize - 1) / kPageSize;
    const int64_t n_pages = static_cast<int64_t>(pages_per_head) * kHeadsKv;
    const size_t pool_elems = static_cast<size_t>(n_pages) * kPageSize * kHeadDim;
    const size_t q_elems = static_cast<size_t>(ctx) * kHeadsQ * kHeadDim;
    __half* k_pool = dev_alloc<__half>(pool_elems);
    __half* v_pool = dev_alloc<__half>(pool_elems);
    __half* q = dev_alloc<__half>(q_elems);
    __half* out = dev_alloc<__half>(q_elems);
    __half* out_chunked = dev_alloc<__half>(q_elems);
    fill(k_pool, pool_elems, 1, -1.0f, 1.0f);
    fill(v_pool, pool_elems, 2, -1.0f, 1.0f);
    fill(q, q_elems, 3, -2.0f, 2.0f);

    // Dense lists over a shuffled pool: page i of KV head h sits at a random slot.
    std::vector<int32_t> perm(static_cast<size_t>(n_pages));
    std::iota(perm.begin(), perm.end(), 0);
    std::shuffle(perm.begin(), perm.end(), std::mt19937_64(7));
    std::vector<int32_t> indptr(kHeadsKv + 1), page_pos(static_cast<size_t>(n_pages));
    for (int h = 0; h <= kHeadsKv; ++h) indptr[static_cast<size_t>(h)] = h * pages_per_head;
    for (int64_t e = 0; e < n_pages; ++e) page_pos[static_cast<size_t>(e)] = static_cast<int32_t>(e % pages_per_head);
    int32_t* indptr_d = dev_upload(indptr);
    int32_t* slots_d = dev_upload(perm);
    int32_t* page_pos_d = dev_upload(page_pos);
    const int n_chunks = (ctx + chunk - 1) / chunk;
    // Per call c: q_indptr {0, rows}, seq_len {end of the chunk}; c == n_chunks is the single call.
    std::vector<int32_t> q_indptr_h, seq_len_h;
    for (int c = 0; c < n_chunks; ++c) {
      const int end = std::min(ctx, (c + 1) * chunk);
      q_indptr_h.insert(q_indptr_h.end(), {0, end - c * chunk});
      seq_len_h.push_back(end);
    }
    q_indptr_h.insert(q_indptr_h.end(), {0, ctx});
    seq_len_h.push_back(ctx);
    int32_t* q_indptr_d = dev_upload(q_indptr_h);
    int32_t* seq_len_d = dev_upload(seq_len_h);

    auto params = [&](int c) {
      dhs::cuda::PrefillAttentionParams p;
      const bool single = c == n_chunks;
      const size_t row0 = single ? 0 : static_cast<size_t>(c) * chunk;
      p.q = q + row0 * kHeadsQ * kHeadDim;
      p.out = (single ? out : out_chunked) + row0 * kHeadsQ * kHeadDim;
      p.k_pool = k_pool;
      p.v_pool = v_pool;
      p.q_indptr = q_indptr_d + 2 * c;
      p.kv_indptr = indptr_d;
      p.slots = slots_d;
      p.page_pos = page_pos_d;
      p.seq_len = seq_len_d + c;
      p.n_requests = 1;
      p.n_rows = q_indptr_h[static_cast<size_t>(2 * c + 1)];
      p.n_heads_q = kHeadsQ;
      p.n_heads_kv = kHeadsKv;
      p.head_dim = kHeadDim;
      p.page_size = kPageSize;
      p.scale = 1.0f / std::sqrt(static_cast<float>(kHeadDim));
      return p;
    };
    dhs::cuda::PrefillKernel kernel;  // the mode's, set in the loop below
    auto run_single = [&] { dhs::cuda::launch_prefill_attention(params(n_chunks), nullptr, kernel); };
    auto run_chunked = [&] {
      for (int c = 0; c < n_chunks; ++c) dhs::cuda::launch_prefill_attention(params(c), nullptr, kernel);
    };

    const double flops = 2.0 * kHeadsQ * kHeadDim * static_cast<double>(ctx) * ctx;  // 4*S^2*h*d / 2 (causal)
    const int reps = ctx <= 32768 ? 30 : 3;
    // Mode 2 first: the mma.sync kernel (PrefillKernel::wgmma false) in one call, for the A/B against
    // the default (wgmma on sm_90); then the default in one call and in chunks, whose outputs the
    // checks below read.
    // Modes 3-8: the wgmma kernel's other shapes (PrefillKernel::sm90_shape): 64 and 128 keys per tile
    // with every thread gathering, 64 warp-specialized, and at 128 keys warp-specialized with ping-pong
    // consumers alone, with a 3-tile ring alone and with neither (modes 0 and 1: the default, 128
    // keys with both, in one call and in chunks).
    using Shape = dhs::cuda::PrefillSm90Shape;
    const Shape shapes[] = {dhs::cuda::kPrefillSm90Default, dhs::cuda::kPrefillSm90Default, Shape{},
                            Shape{64, false, false, 2}, Shape{128, false, false, 2}, Shape{64, true, false, 2},
                            Shape{128, true, true, 2}, Shape{128, true, false, 3}, Shape{128, true, false, 2}};
    const char* names[] = {"single", "chunked", "single-mmasync", "single-wgmma64", "single-wgmma128", "single-wgmma64ws",
                           "single-wgmma128ws-pp", "single-wgmma128ws-s3", "single-wgmma128ws"};
    for (int mode : {2, 3, 4, 5, 6, 7, 8, 0, 1}) {
      kernel = {.wgmma = mode != 2, .sm90_shape = shapes[mode]};
      auto fn = [&] { mode == 1 ? run_chunked() : run_single(); };
      fn();  // warm-up (module load, smem attribute)
      DHS_CUDA_CHECK(cudaDeviceSynchronize());
      std::vector<double> samples;
      for (int r = 0; r < reps; ++r) {
        DHS_CUDA_CHECK(cudaEventRecord(ev0));
        fn();
        DHS_CUDA_CHECK(cudaEventRecord(ev1));
        DHS_CUDA_CHECK(cudaEventSynchronize(ev1));
        float ms = 0;
        DHS_CUDA_CHECK(cudaEventElapsedTime(&ms, ev0, ev1));
        samples.push_back(ms * 1e3);
      }
      const double us = median(samples);
      results.push_back({mode == 1 ? "chunked" + std::to_string(chunk) : std::string(names[mode]),
                         ctx, us,
                         flops / us * 1e-6, samples});
    }

    // The chunked run must produce exactly the single run's output (same tiles, same key order).
    unsigned long long* n_diff_d = dev_alloc<unsigned long long>(1);
    DHS_CUDA_CHECK(cudaMemset(n_diff_d, 0, sizeof(unsigned long long)));
    count_diff_kernel<<<1024, 256>>>(reinterpret_cast<const uint16_t*>(out), reinterpret_cast<const uint16_t*>(out_chunked),
                                     q_elems, n_diff_d);
    DHS_CUDA_CHECK(cudaGetLastError());
    unsigned long long n_diff = 0;
    DHS_CUDA_CHECK(cudaMemcpy(&n_diff, n_diff_d, sizeof(n_diff), cudaMemcpyDeviceToHost));
    cudaFree(n_diff_d);

    // A few rows against a float64 host reference (KV head 5: q heads 20..23).
    const int hk = 5;
    std::vector<uint16_t> k_h(pool_elems), v_h(pool_elems);
    DHS_CUDA_CHECK(cudaMemcpy(k_h.data(), k_pool, pool_elems * 2, cudaMemcpyDeviceToHost));
    DHS_CUDA_CHECK(cudaMemcpy(v_h.data(), v_pool, pool_elems * 2, cudaMemcpyDeviceToHost));
    double max_err = 0.0;
    for (const int tok : {0, 17, ctx / 3, ctx - 1}) {
      for (const int hq : {4 * hk, 4 * hk + 3}) {
        std::vector<uint16_t> qr(kHeadDim), orow(kHeadDim);
        const size_t off = (static_cast<size_t>(tok) * kHeadsQ + hq) * kHeadDim;
        DHS_CUDA_CHECK(cudaMemcpy(qr.data(), q + off, kHeadDim * 2, cudaMemcpyDeviceToHost));
        DHS_CUDA_CHECK(cudaMemcpy(orow.data(), out + off, kHeadDim * 2, cudaMemcpyDeviceToHost));
        std::vector<double> sc(static_cast<size_t>(tok) + 1), acc(kHeadDim, 0.0);
        double mx = -1e300, den = 0.0;
        for (int t = 0; t <= tok; ++t) {
          const size_t kr = (static_cast<size_t>(perm[static_cast<size_t>(hk * pages_per_head + t / kPageSize)]) * kPageSize +
                             t % kPageSize) * kHeadDim;
          double s = 0.0;
          for (int x = 0; x < kHeadDim; ++x) s += f16_to_float(qr[static_cast<size_t>(x)]) * f16_to_float(k_h[kr + x]);
          sc[static_cast<size_t>(t)] = s / std::sqrt(static_cast<double>(kHeadDim));
          mx = std::max(mx, sc[static_cast<size_t>(t)]);
        }
        for (int t = 0; t <= tok; ++t) {
          const size_t kr = (static_cast<size_t>(perm[static_cast<size_t>(hk * pages_per_head + t / kPageSize)]) * kPageSize +
                             t % kPageSize) * kHeadDim;
          const double w = std::exp(sc[static_cast<size_t>(t)] - mx);
          den += w;
          for (int x = 0; x < kHeadDim; ++x) acc[static_cast<size_t>(x)] += w * f16_to_float(v_h[kr + x]);
        }
        for (int x = 0; x < kHeadDim; ++x) {
          const double r = acc[static_cast<size_t>(x)] / den, g = f16_to_float(orow[static_cast<size_t>(x)]);
          const double err = std::fabs(g - r) / (1.0 + std::fabs(r));
          max_err = std::max(max_err, std::isfinite(g) ? err : 1e30);
        }
      }
    }
    const bool ok = max_err <= 1e-2 && n_diff == 0;
    failures += !ok;
    std::printf("ctx %d: spot check max|err|/(1+|ref|) %.2e, chunked vs single differing elements %llu -> %s\n", ctx,
                max_err, n_diff, ok ? "ok" : "FAIL");

    for (const Result& r : results) {
      if (r.ctx != ctx) continue;
      std::string samples;
      for (double s : r.samples_us) samples += (samples.empty() ? "" : ",") + std::to_string(static_cast<int64_t>(s));
      std::fprintf(jf,
                   "{\"commit\":\"%s\",\"gpu\":\"%s\",\"impl\":\"dhisparse-prefill\",\"dtype\":\"f16\",\"mode\":\"%s\",\"ctx\":%d,"
                   "\"batch\":1,\"wgmma\":%s,\"n_heads_q\":%d,\"n_heads_kv\":%d,\"head_dim\":%d,\"us\":%.1f,\"tflops\":%.1f,"
                   "\"checked\":%s,\"samples_us\":[%s]}\n",
                   commit.c_str(), prop.name, r.mode.c_str(), r.ctx, r.mode == "single-mmasync" ? "false" : "true", kHeadsQ,
                   kHeadsKv, kHeadDim, r.us, r.tflops,
                   ok ? "true" : "false", samples.c_str());
    }
    std::fflush(jf);
    for (void* ptr : {static_cast<void*>(k_pool), static_cast<void*>(v_pool), static_cast<void*>(q),
                      static_cast<void*>(out), static_cast<void*>(out_chunked), static_cast<void*>(indptr_d),
                      static_cast<void*>(slots_d), static_cast<void*>(page_pos_d), static_cast<void*>(q_indptr_d),
                      static_cast<void*>(seq_len_d)})
      cudaFree(ptr);
  }
  std::fclose(jf);

  std::printf("\n%-15s %-8s %12s %10s\n", "mode", "ctx", "us", "TFLOP/s");
  for (const Result& r : results) std::printf("%-15s %-8d %12.1f %10.1f\n", r.mode.c_str(), r.ctx, r.us, r.tflops);
  return failures ? 1 : 0;
}
