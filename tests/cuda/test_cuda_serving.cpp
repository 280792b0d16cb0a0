// The CUDA backend at serving sizes, on random weights of a small Llama shape (no model file):
//  * batched decode at batch 1, 3, 17 and 64 (padded to the graph buckets 1, 4, 32, 64) gives
//    each request the logits and greedy id it gets alone, within a stated f16 tolerance, and
//    the device's greedy id is exactly the host argmax of the logits it returned;
//  * the CUDA runner (make_cuda_runner, --load-format dummy) samples on the device with each
//    request's parameters: greedy rows equal dhs::Sampler on the returned logits exactly
//    (penalty, window, sampled-vocabulary limit), drawn rows stay in the CPU rule's kept set,
//    and a rerun with the same seeds without logits draws the same tokens;
//  * the KV pool's accounting holds after each test.
// DHS_CUDA_BENCH=1 adds DecodeBatchTiming: decode step time against batch size on the Llama-3
// 8B shape at 8k context (one model of max batch 64: each batch size replays its bucket's graph),
// rows appended to $DHS_DECODE_BATCH_OUT (default bench/results/decode_batch.jsonl).
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "backend/cuda/cuda_check.h"
#include "engine/sampler.h"
#include "engine/step_runner.h"
#include "gtest_shim.h"
#include "model/arch/llama_cuda.h"
#include "model/model_shapes.h"
#include "sampling_reference.h"
#include "tiny_llama.h"

namespace {

using namespace dhs;

using test::argmax;
using test::ConfigSource;
using test::expect_pool_empty;
using test::have_gpu;
using test::random_ids;
using test::small_mode;
using test::tiny_config;
using test::top2_gap;

// Batched decode vs each request alone. Tolerance: the random weights give logits of unit scale
// (|logit| <= ~5); a batched step runs other GEMM shapes (GEMV up to 8 rows, cuBLASLt beyond, and
// the bucket's padding rows), so f16 roundings of activations may differ: all logits of every
// request and step within 2% of the largest |logit| (a wrong page, row or mask moves them by
// units). Greedy ids must match unless the solo top-2 gap is below twice the measured difference.
TEST(CudaServing, BatchedDecodeEqualsSolo) {
  if (!have_gpu()) GTEST_SKIP() << "no GPU";
  const ModelConfig cfg = tiny_config();
  const int64_t V = cfg.vocab_size;
  CudaModelOptions o;
  o.max_batch = 64;
  o.max_step_tokens = 512;
  o.max_context = 256;
  LlamaCuda m(cfg, 7, o);
  std::mt19937 rng(5);
  const int kSteps = 3;
  const std::vector<int> sizes = small_mode() ? std::vector<int>{1, 3, 17} : std::vector<int>{1, 3, 17, 64};
  for (const int B : sizes) {
    std::vector<PageTable> ts;
    std::vector<std::vector<int32_t>> prompts, feed;
    std::vector<int64_t> n0;
    for (int r = 0; r < B; ++r) {
      ts.emplace_back(static_cast<int>(cfg.n_layers), static_cast<int>(cfg.n_heads_kv), 16);
      prompts.push_back(random_ids(3 + (r * 37) % 90, static_cast<int>(V), rng));  // 3..92 tokens: pages part full
      feed.push_back(random_ids(kSteps, static_cast<int>(V), rng));
    }
    // Prefill each alone (slot r), un-captured.
    for (int r = 0; r < B; ++r) {
      const auto& p = prompts[static_cast<size_t>(r)];
      ASSERT_TRUE(ts[static_cast<size_t>(r)].reserve(m.allocator(), static_cast<int64_t>(p.size())));
      m.forward({LlamaCuda::Seq{&ts[static_cast<size_t>(r)], r, p.data(), static_cast<int64_t>(p.size())}}, nullptr);
      n0.push_back(ts[static_cast<size_t>(r)].n_tokens());
    }
    // Solo decode: each request alone through the bucket-1 graph, then rolled back.
    std::vector<std::vector<std::vector<float>>> solo(static_cast<size_t>(B));
    std::vector<std::vector<int32_t>> solo_ids(static_cast<size_t>(B));
    std::vector<float> l;
    for (int r = 0; r < B; ++r) {
      PageTable& t = ts[static_cast<size_t>(r)];
      for (int s = 0; s < kSteps; ++s) {
        ASSERT_TRUE(t.reserve(m.allocator(), 1));
        m.forward({LlamaCuda::Seq{&t, r, &feed[static_cast<size_t>(r)][static_cast<size_t>(s)], 1}}, &l);
        solo[static_cast<size_t>(r)].push_back(l);
        solo_ids[static_cast<size_t>(r)].push_back(m.sampled_ids()[0]);
        EXPECT_EQ(m.sampled_ids()[0], argmax(l.data(), V)) << "device greedy != host argmax (solo)";
      }
      t.truncate(m.allocator(), n0[static_cast<size_t>(r)]);
    }
    // Batched: all B together, padded to the bucket.
    float md = 0.0f, scale = 0.0f;
    int id_diff = 0, id_near_tie = 0;
    for (int s = 0; s < kSteps; ++s) {
      std::vector<LlamaCuda::Seq> batch;
      for (int r = 0; r < B; ++r) {
        ASSERT_TRUE(ts[static_cast<size_t>(r)].reserve(m.allocator(), 1));
        batch.push_back(LlamaCuda::Seq{&ts[static_cast<size_t>(r)], r, &feed[static_cast<size_t>(r)][static_cast<size_t>(s)], 1});
      }
      m.forward(batch, &l);
      ASSERT_EQ(m.sampled_ids().size(), static_cast<size_t>(B));
      for (int r = 0; r < B; ++r) {
        const float* bl = l.data() + static_cast<size_t>(r) * V;
        const std::vector<float>& sl = solo[static_cast<size_t>(r)][static_cast<size_t>(s)];
        float d = 0.0f;
        for (int64_t i = 0; i < V; ++i) {
          d = std::max(d, std::fabs(bl[i] - sl[static_cast<size_t>(i)]));
          scale = std::max(scale, std::fabs(sl[static_cast<size_t>(i)]));
        }
        md = std::max(md, d);
        EXPECT_EQ(m.sampled_ids()[static_cast<size_t>(r)], argmax(bl, V)) << "device greedy != host argmax, batch " << B;
        if (m.sampled_ids()[static_cast<size_t>(r)] != solo_ids[static_cast<size_t>(r)][static_cast<size_t>(s)]) {
          ++id_diff;
          if (top2_gap(sl.data(), V) < 2.0f * d) ++id_near_tie;
        }
      }
    }
    const float tol = 0.02f * scale;
    std::printf("batch %2d (bucket %2d): max |dlogit| batched vs solo %.4f (tolerance %.4f = 2%% of max |logit| %.2f); "
                "greedy ids differing %d (near ties %d)\n",
                B, m.batch_bucket(B), md, tol, scale, id_diff, id_near_tie);
    EXPECT_LE(md, tol) << "batch " << B << ": batched logits differ from solo";
    EXPECT_EQ(id_diff, id_near_tie) << "batch " << B << ": a greedy id differs at a clear top-2 gap";
    for (auto& t : ts) t.release(m.allocator());
    expect_pool_empty(m.allocator(), "BatchedDecodeEqualsSolo");
  }
}

// One request's sampling state on the host side of the test.
struct Req {
  SamplingParams p;
  std::vector<int32_t> history;  // prompt + fed tokens
  PageTable table;
  Req(const ModelConfig& c) : table(static_cast<int>(c.n_layers), static_cast<int>(c.n_heads_kv), 16) {}
};

// Runs prompts then kDecode decode steps of every request together through the runner; returns
// each request's sampled tokens. check: compare every sampled id with the CPU rule on the
// returned logits.
std::vector<std::vector<int32_t>> run_runner(StepRunner& run, std::vector<Req>& reqs, int64_t n_sampled, bool check,
                                             std::mt19937& rng) {
  const int kDecode = 6;
  const int64_t V = run.config().vocab_size;
  std::vector<std::vector<int32_t>> out(reqs.size());
  for (size_t i = 0; i < reqs.size(); ++i) run.begin_request(static_cast<int>(i), reqs[i].p);
  int drawn_checked = 0;
  for (int s = 0; s <= kDecode; ++s) {
    std::vector<StepRequest> batch;
    std::vector<std::vector<int32_t>> feed(reqs.size());
    for (size_t i = 0; i < reqs.size(); ++i) {
      Req& q = reqs[i];
      feed[i] = s == 0 ? q.history : std::vector<int32_t>{out[i].back()};
      if (s > 0) q.history.push_back(out[i].back());
      EXPECT_TRUE(q.table.reserve(run.pages(), static_cast<int64_t>(feed[i].size())));
      batch.push_back(StepRequest{&q.table, static_cast<int>(i), feed[i].data(), static_cast<int64_t>(feed[i].size()), true,
                                  &q.history});
    }
    StepOutput so;
    run.step(batch, &so, check);
    EXPECT_EQ(so.sampled.size(), reqs.size());
    EXPECT_EQ(so.logits.size(), check ? reqs.size() * static_cast<size_t>(V) : 0u);
    for (size_t i = 0; i < reqs.size(); ++i) {
      const int32_t id = so.sampled[i];
      EXPECT_TRUE(id >= 0 && id < n_sampled) << "sampled id " << id << " outside the sampled vocabulary";
      out[i].push_back(id);
      if (!check) continue;
      const SamplingParams& p = reqs[i].p;
      std::vector<float> l(so.logits.begin() + static_cast<std::ptrdiff_t>(i * V),
                           so.logits.begin() + static_cast<std::ptrdiff_t>((i + 1) * V));
      const std::vector<int32_t>& h = reqs[i].history;
      if (p.temperature == 0.0f) {
        Sampler cpu(p);  // greedy: no RNG; the exact host result
        EXPECT_EQ(id, cpu.sample(l.data(), n_sampled, h)) << "request " << i << " step " << s;
      } else {
        const size_t from = p.repetition_window > 0 && h.size() > static_cast<size_t>(p.repetition_window)
                                ? h.size() - static_cast<size_t>(p.repetition_window)
                                : 0;
        const std::vector<int32_t> window(h.begin() + static_cast<std::ptrdiff_t>(from), h.end());
        cuda::SamplingRow r;
        r.temperature = p.temperature;
        r.top_k = p.top_k;
        r.top_p = p.top_p;
        r.min_p = p.min_p;
        r.repetition_penalty = p.repetition_penalty;
        const test::KeptSet kept = test::cpu_filter(test::penalised(l.data(), static_cast<int>(n_sampled), window,
                                                                    p.repetition_penalty), r);
        EXPECT_TRUE(std::find(kept.ids.begin(), kept.ids.end(), id) != kept.ids.end())
            << "request " << i << " step " << s << ": id " << id << " outside the kept set of " << kept.ids.size();
        ++drawn_checked;
      }
    }
  }
  (void)rng;
  for (Req& q : reqs) q.table.release(run.pages());
  return out;
}

TEST(CudaServing, RunnerSamplesOnDevice) {
  if (!have_gpu()) GTEST_SKIP() << "no GPU";
  const ModelConfig cfg = tiny_config();
  ConfigSource src(cfg);
  EngineOptions o;
  o.device = "cuda";
  o.load_format = "dummy";
  o.max_batch = 12;
  o.kv_blocks = 12 * 16;  // 12 requests of 256 tokens
  auto run = make_cuda_runner(src, o, 256);
  ASSERT_EQ(run->max_batch(), 12);
  EXPECT_EQ(run->pages().stats().n_total, o.kv_blocks * cfg.n_layers * cfg.n_heads_kv);
  const int64_t n_sampled = cfg.vocab_size - 200;  // the rest: "embedding padding"
  run->set_sampled_vocab(n_sampled);
  std::mt19937 rng(9);
  auto make = [&]() {
    std::vector<Req> reqs;
    std::mt19937 prng(17);
    for (int i = 0; i < 12; ++i) {
      Req q(cfg);
      q.history = random_ids(5 + 13 * i, static_cast<int>(cfg.vocab_size), prng);
      SamplingParams& p = q.p;
      p.seed = 40 + static_cast<uint64_t>(i);
      switch (i % 6) {
        case 0: break;  // greedy
        case 1: p.repetition_penalty = 1.8f; p.repetition_window = 4; break;  // greedy, penalty, short window
        case 2: p.repetition_penalty = 1.5f; p.repetition_window = 0; break;  // greedy, whole history
        case 3: p.temperature = 0.8f; p.top_k = 20; break;
        case 4: p.temperature = 1.0f; p.top_p = 0.9f; p.min_p = 0.05f; p.repetition_penalty = 1.2f; break;
        case 5: p.temperature = 1.3f; p.top_k = 100; p.top_p = 0.95f; break;
      }
      reqs.push_back(std::move(q));
    }
    return reqs;
  };
  std::vector<Req> a = make();
  const auto with_logits = run_runner(*run, a, n_sampled, true, rng);
  expect_pool_empty(run->pages(), "RunnerSamplesOnDevice (checked run)");
  std::vector<Req> b = make();
  const auto ids_only = run_runner(*run, b, n_sampled, false, rng);
  EXPECT_TRUE(with_logits == ids_only) << "same seeds, same tokens (with and without the logits copied)";
  expect_pool_empty(run->pages(), "RunnerSamplesOnDevice");
}

// Requests with their own sparse policy (StepRequest::policy) in one graph-captured decode step:
// each reads the pages its policy gives (counted exactly for dense and sink + window rows), and
// those rows get the logits they get alone on a runner of their policy (the tolerance of
// BatchedDecodeEqualsSolo: 2% of the largest |logit|; a row read with another request's pages
// moves its logits by units). The coverage row (the engine's policy) is checked by its page count
// only: its set depends on f16 scores that differ between batched and solo GEMM shapes, and on
// these random weights (near-uniform attention, ~90% of pages kept) one page across the cut moved
// its logits by 0.14 against the 0.08 tolerance on the H200 (248d666).
TEST(CudaServing, RequestPoliciesInOneStep) {
  if (!have_gpu()) GTEST_SKIP() << "no GPU";
  const ModelConfig cfg = tiny_config();
  ConfigSource src(cfg);
  const char* engine_policy = "coverage:0.9@sketch4";
  auto make = [&](const char* policy) {
    EngineOptions o;
    o.device = "cuda";
    o.load_format = "dummy";
    o.max_batch = 4;
    o.kv_blocks = 4 * 24;  // four requests of up to 384 tokens
    o.policy = PolicySpec::parse(policy);
    return make_cuda_runner(src, o, 384);
  };
  const std::vector<std::string> own = {"dense", "sinkwindow:3", "sinkwindow:6", ""};  // "": the engine's
  std::mt19937 rng(23);
  std::vector<std::vector<int32_t>> prompts, decode;
  for (size_t i = 0; i < own.size(); ++i) {
    prompts.push_back(random_ids(300 + 7 * static_cast<int>(i), static_cast<int>(cfg.vocab_size), rng));
    decode.push_back(random_ids(3, static_cast<int>(cfg.vocab_size), rng));
  }
  const int64_t V = cfg.vocab_size;
  // Prefill alone, then the decode steps of all requests together; logits [step][n_req * V] and
  // the pages the decode steps read.
  auto run = [&](StepRunner& r, const std::vector<size_t>& which, const std::vector<const PolicySpec*>& policies,
                 uint64_t* read) {
    std::vector<PageTable> tables;
    for (size_t i = 0; i < which.size(); ++i) tables.emplace_back(static_cast<int>(cfg.n_layers), static_cast<int>(cfg.n_heads_kv), 16);
    StepOutput out;
    for (size_t i = 0; i < which.size(); ++i) {
      const std::vector<int32_t>& p = prompts[which[i]];
      EXPECT_TRUE(tables[i].reserve(r.pages(), static_cast<int64_t>(p.size())));
      r.step({StepRequest{&tables[i], static_cast<int>(i), p.data(), static_cast<int64_t>(p.size())}}, &out, false);
    }
    (void)r.take_page_counts();
    std::vector<std::vector<float>> logits;
    for (size_t k = 0; k < 3; ++k) {
      std::vector<StepRequest> batch;
      for (size_t i = 0; i < which.size(); ++i) {
        EXPECT_TRUE(tables[i].reserve(r.pages(), 1));
        StepRequest q{&tables[i], static_cast<int>(i), &decode[which[i]][k], 1};
        q.policy = policies[i];
        batch.push_back(q);
      }
      r.step(batch, &out, true);
      logits.push_back(out.logits);
    }
    *read = r.take_page_counts().read;
    for (PageTable& t : tables) t.release(r.pages());
    expect_pool_empty(r.pages(), "RequestPoliciesInOneStep");
    return logits;
  };
  auto mixed_runner = make(engine_policy);
  std::vector<PolicySpec> specs;
  std::vector<const PolicySpec*> ptrs;
  for (const std::string& s : own)
    specs.push_back(s.empty() ? mixed_runner->policy()
                              : PolicySpec::parse(s, mixed_runner->policy()).as_request_policy(mixed_runner->policy()));
  for (size_t i = 0; i < own.size(); ++i) ptrs.push_back(own[i].empty() ? nullptr : &specs[i]);
  uint64_t mixed_read = 0;
  const auto mixed = run(*mixed_runner, {0, 1, 2, 3}, ptrs, &mixed_read);

  const int64_t lh = cfg.n_layers * cfg.n_heads_kv;
  uint64_t coverage_solo = 0, exact_rows = 0;
  for (size_t i = 0; i < own.size(); ++i) {
    auto solo_runner = make(own[i].empty() ? engine_policy : own[i].c_str());
    uint64_t solo_read = 0;
    const auto solo = run(*solo_runner, {i}, {nullptr}, &solo_read);
    if (i == 3) coverage_solo = solo_read;
    for (size_t k = 0; k < 3 && !own[i].empty(); ++k) {
      const float* got = mixed[k].data() + static_cast<int64_t>(i) * V;
      float scale = 0.0f, diff = 0.0f;
      for (int64_t v = 0; v < V; ++v) {
        scale = std::max(scale, std::fabs(solo[k][static_cast<size_t>(v)]));
        diff = std::max(diff, std::fabs(got[v] - solo[k][static_cast<size_t>(v)]));
      }
      EXPECT_LE(diff, 0.02f * scale) << "request " << i << " (" << (own[i].empty() ? engine_policy : own[i]) << ") step " << k;
    }
    // Pages of the dense and sink + window rows: every page, or min(budget, pages), per layer and head.
    if (i < 3) {
      uint64_t want = 0;
      for (int64_t k = 0; k < 3; ++k) {
        const int64_t pages = (static_cast<int64_t>(prompts[i].size()) + k + 1 + 15) / 16;
        want += static_cast<uint64_t>(lh * (i == 0 ? pages : std::min<int64_t>(i == 1 ? 3 : 6, pages)));
      }
      if (i > 0) {
        EXPECT_EQ(solo_read, want) << "request " << i << " alone";  // (a dense engine counts nothing)
      }
      exact_rows += want;
    }
  }
  // The coverage row's count may move by a page where batched f16 scores cross the cut.
  const double slack = 0.02 * static_cast<double>(lh) * 3 * 20;
  EXPECT_NEAR(static_cast<double>(mixed_read), static_cast<double>(exact_rows + coverage_solo), slack);
  EXPECT_GT(mixed_read, exact_rows) << "the coverage row read nothing";
}

// Decode step time against batch size, 8B shape, 8k context, one model of max batch 64: each batch
// size runs its bucket's graph (17 -> 32 rows: the padding's cost shows as 17 against 16 and 32).
TEST(CudaServing, DecodeBatchTiming) {
  if (!have_gpu()) GTEST_SKIP() << "no GPU";
  if (!test::env_on("DHS_CUDA_BENCH")) GTEST_SKIP() << "set DHS_CUDA_BENCH=1 for timings";
  const ModelConfig cfg = model_shape("llama3-8b");
  const int64_t ctx = 8192, max_b = 64;
  CudaModelOptions o;
  o.max_batch = static_cast<int>(max_b);
  o.max_context = ctx + 64;
  o.gpu_memory_utilization = 0.9;  // the serving rule: the pool takes what is left
  auto m = std::make_unique<LlamaCuda>(cfg, 1234, o);
  m->kv_pool().fill_random(99, -1.0f, 1.0f, m->stream());
  DHS_CUDA_CHECK(cudaStreamSynchronize(m->stream()));  // (before the copy timing below)
  size_t free_b = 0, total_b = 0;
  DHS_CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
  std::printf("pool %lld head-pages (%.1f GiB), weights %.1f GiB, GPU %.1f GiB free of %.1f\n",
              static_cast<long long>(m->allocator().stats().n_total),
              static_cast<double>(m->allocator().stats().n_total) * 2 * 16 * 128 * 2 / (1 << 30),
              static_cast<double>(m->weight_bytes()) / (1 << 30), static_cast<double>(free_b) / (1 << 30),
              static_cast<double>(total_b) / (1 << 30));
  // The read ceiling: device-to-device copy rate (what `dhisparse bench` divides by).
  double copy_gbps = 0;
  {
    const size_t n = size_t{2} << 30;
    void *x, *y;
    DHS_CUDA_CHECK(cudaMalloc(&x, n));
    DHS_CUDA_CHECK(cudaMalloc(&y, n));
    cudaEvent_t e0, e1;
    DHS_CUDA_CHECK(cudaEventCreate(&e0));
    DHS_CUDA_CHECK(cudaEventCreate(&e1));
    float best = 1e9f;
    for (int i = 0; i < 10; ++i) {  // best of 10, as dhisparse bench measures it
      DHS_CUDA_CHECK(cudaEventRecord(e0));
      DHS_CUDA_CHECK(cudaMemcpyAsync(y, x, n, cudaMemcpyDeviceToDevice));
      DHS_CUDA_CHECK(cudaEventRecord(e1));
      DHS_CUDA_CHECK(cudaEventSynchronize(e1));
      float ms = 0;
      DHS_CUDA_CHECK(cudaEventElapsedTime(&ms, e0, e1));
      best = std::min(best, ms);
    }
    copy_gbps = 2.0 * static_cast<double>(n) / (best * 1e-3) / 1e9;
    cudaFree(x);
    cudaFree(y);
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
  }
  std::vector<PageTable> ts;
  std::vector<int32_t> tok(static_cast<size_t>(max_b), 42);
  std::vector<LlamaCuda::Seq> all;
  for (int64_t r = 0; r < max_b; ++r) ts.emplace_back(static_cast<int>(cfg.n_layers), static_cast<int>(cfg.n_heads_kv), 16);
  for (int64_t r = 0; r < max_b; ++r) {
    ASSERT_TRUE(ts[static_cast<size_t>(r)].reserve(m->allocator(), ctx + 1));
    ts[static_cast<size_t>(r)].commit(ctx);  // a context of random KV
    all.push_back(LlamaCuda::Seq{&ts[static_cast<size_t>(r)], static_cast<int>(r), &tok[static_cast<size_t>(r)], 1});
  }
  cudaDeviceProp prop;
  DHS_CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
  const char* out_env = std::getenv("DHS_DECODE_BATCH_OUT");
  std::ofstream jl(out_env ? out_env : "bench/results/decode_batch.jsonl", std::ios::app);
  const char* commit = std::getenv("DHS_COMMIT");
  const double kv_per_token = 2.0 * cfg.n_layers * cfg.n_heads_kv * cfg.head_dim * 2;
  std::printf("copy %.0f GB/s\n%-6s %-6s %10s %10s %10s %8s\n", copy_gbps, "batch", "bucket", "step_ms", "floor_ms", "tok/s",
              "vs_floor");
  for (const int b : {1, 2, 3, 4, 8, 16, 17, 24, 32, 48, 64}) {
    const std::vector<LlamaCuda::Seq> batch(all.begin(), all.begin() + b);
    for (const LlamaCuda::Seq& q : batch)  // time_decode_step hands the step's page back when it rolls back
      if (q.table->capacity_tokens() < q.table->n_tokens() + 1) {
        ASSERT_TRUE(q.table->reserve(m->allocator(), 1));
      }
    const double ms = m->time_decode_step(batch, 30);
    const double floor_ms =
        (static_cast<double>(m->weight_bytes()) + kv_per_token * static_cast<double>(ctx) * b) / (copy_gbps * 1e9) * 1e3;
    std::printf("%-6d %-6d %10.3f %10.3f %10.1f %8.2f\n", b, m->batch_bucket(b), ms, floor_ms, b / ms * 1e3, ms / floor_ms);
    jl << "{\"commit\":\"" << (commit ? commit : "unknown") << "\",\"gpu\":\"" << prop.name
       << "\",\"model\":\"llama-3.1-8b-shape\",\"ctx\":" << ctx << ",\"batch\":" << b << ",\"bucket\":" << m->batch_bucket(b)
       << ",\"max_batch\":" << max_b << ",\"policy\":\"dense\",\"step_ms\":" << ms << ",\"tok_s\":" << b / ms * 1e3
       << ",\"floor_ms\":" << floor_ms << ",\"copy_GBps\":" << copy_gbps
       << ",\"method\":\"LlamaCuda::time_decode_step, graph of the bucket, median of 30 replays; floor = (weights + KV "
          "bytes) / D2D copy rate, same process\"}\n";
  }
  for (auto& t : ts) t.release(m->allocator());
  expect_pool_empty(m->allocator(), "DecodeBatchTiming");
}

}  // namespace
