// GPU sampler (backend/cuda/sampling.h) against the CPU sampler's rule (engine/sampler.cpp):
//  * greedy: the exact CPU argmax (lowest id on ties), with and without repetition penalty;
//  * support: the kept set {key >= debug_threshold} equals the CPU filter's set exactly,
//    for top-k / top-p / min-p / penalty mixes, ties, vocab 1000 .. 152064, and with a tiny
//    candidate list (forces the multi-level histogram path);
//  * frequencies over many draws within 5 sigma of the CPU-filtered softmax;
//  * same seed and counter -> same tokens; a captured graph replayed twice draws new
//    tokens each replay, and the same ones again after the counters are reset.
// The CPU filter below restates sampler.cpp step by step; CpuMirrorAgreesWithSampler checks
// that every token dhs::Sampler draws lies in it. DHS_TEST_SMALL=1|2 (or DHS_TEST_QUICK=1) shrinks
// everything (for compute-sanitizer); DHS_CUDA_BENCH=1 adds timings (µs per call).
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <unordered_set>
#include <vector>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/sampling.h"
#include "engine/sampler.h"
#include "gtest_shim.h"
#include "sampling_reference.h"

namespace {

namespace dc = dhs::cuda;

bool env_on(const char* name) {
  const char* e = std::getenv(name);
  return e && *e && *e != '0';
}
// DHS_TEST_SMALL=1: fewer rows and draws (memcheck); 2: also vocab <= 5000 only (racecheck).
// The project's DHS_TEST_QUICK=1 (its sanitizer runs) counts as level 2.
int small_level() {
  const char* e = std::getenv("DHS_TEST_SMALL");
  if (e && *e) return std::atoi(e);
  return env_on("DHS_TEST_QUICK") ? 2 : 0;
}
bool small_mode() { return small_level() >= 1; }
bool tiny_mode() { return small_level() >= 2; }
bool have_gpu() { return dc::device_count() > 0; }

template <typename T>
struct Dev {
  T* p = nullptr;
  size_t n = 0;
  explicit Dev(size_t count) : n(count) { DHS_CUDA_CHECK(cudaMalloc(&p, std::max<size_t>(count, 1) * sizeof(T))); }
  explicit Dev(const std::vector<T>& h) : Dev(h.size()) { put(h); }
  ~Dev() { cudaFree(p); }
  Dev(const Dev&) = delete;
  Dev& operator=(const Dev&) = delete;
  void put(const std::vector<T>& h) { DHS_CUDA_CHECK(cudaMemcpy(p, h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice)); }
  std::vector<T> get() const {
    std::vector<T> h(n);
    DHS_CUDA_CHECK(cudaMemcpy(h.data(), p, n * sizeof(T), cudaMemcpyDeviceToHost));
    return h;
  }
};

// ---- the CPU rule: sampling_reference.h ---------------------------------------------

using dhs::test::cpu_filter;
using dhs::test::KeptSet;
using dhs::test::penalised;

// The device's sort key, on the host (see sampling.cu): the GPU's kept set is {key >= thr}.
uint64_t host_key(float l, float temperature, int i) {
  float x = temperature > 0.0f ? l / temperature : l;
  if (x != x) x = -INFINITY;
  if (x == 0.0f) x = 0.0f;
  uint32_t b;
  std::memcpy(&b, &x, 4);
  const uint32_t ord = (b & 0x80000000u) ? ~b : (b | 0x80000000u);
  return (static_cast<uint64_t>(ord) << 32) | static_cast<uint64_t>(~static_cast<uint32_t>(i));
}
std::vector<int32_t> gpu_set(const std::vector<float>& pen_logits, float temperature, uint64_t thr) {
  std::vector<int32_t> ids;
  for (int i = 0; i < static_cast<int>(pen_logits.size()); ++i)
    if (host_key(pen_logits[i], temperature, i) >= thr) ids.push_back(i);
  return ids;
}

// ---- logits ------------------------------------------------------------------------------

enum class Dist { Flat, Peaked, Ties };
std::vector<float> make_logits(int vocab, Dist d, std::mt19937& rng) {
  std::vector<float> l(static_cast<size_t>(vocab));
  std::normal_distribution<float> n1(0.0f, 1.0f), n25(0.0f, 2.5f);
  std::uniform_int_distribution<int> pick(0, vocab - 1);
  switch (d) {
    case Dist::Flat:
      for (auto& x : l) x = n1(rng);
      break;
    case Dist::Peaked:  // LLM-like: broad bulk, a few dozen strong candidates
      for (auto& x : l) x = n25(rng);
      for (int j = 0; j < 40; ++j) l[pick(rng)] += 8.0f + 0.25f * j;
      break;
    case Dist::Ties:  // coarse values: ties at every boundary (broken by lowest id)
      for (auto& x : l) x = std::round(n25(rng) * 2.0f) / 2.0f;
      for (int j = 0; j < 5; ++j) l[pick(rng)] = 12.0f;  // tied maxima
      break;
  }
  return l;
}

struct Batch {
  int vocab = 0;
  std::vector<float> logits;                // [n_rows, vocab]
  std::vector<dc::SamplingRow> rows;        // [n_rows]
  std::vector<std::vector<int32_t>> hist;   // per row
  int n_rows() const { return static_cast<int>(rows.size()); }
};

struct GpuResult {
  std::vector<int32_t> out;
  std::vector<uint64_t> thr;
};

// Runs `calls` sampling calls over the batch (counters start at `offset0`).
GpuResult run_gpu(const Batch& b, int max_candidates, int calls = 1, uint64_t offset0 = 0,
                  std::vector<int32_t>* all_out = nullptr) {
  const int n = b.n_rows();
  int hist_ld = 1;
  for (const auto& h : b.hist) hist_ld = std::max<int>(hist_ld, static_cast<int>(h.size()));
  std::vector<int32_t> hist(static_cast<size_t>(n) * hist_ld, 0), hist_len(static_cast<size_t>(n), 0);
  for (int r = 0; r < n; ++r) {
    std::copy(b.hist[r].begin(), b.hist[r].end(), hist.begin() + static_cast<size_t>(r) * hist_ld);
    hist_len[r] = static_cast<int32_t>(b.hist[r].size());
  }
  Dev<float> logits(b.logits);
  Dev<dc::SamplingRow> rows(b.rows);
  Dev<int32_t> hist_d(hist), hist_len_d(hist_len), out(static_cast<size_t>(n));
  Dev<uint64_t> offset(std::vector<uint64_t>(static_cast<size_t>(n), offset0)), thr(static_cast<size_t>(n));
  dc::SampleParams p;
  p.logits = logits.p;
  p.rows = rows.p;
  p.history = hist_d.p;
  p.history_len = hist_len_d.p;
  p.history_ld = hist_ld;
  p.rng_offset = offset.p;
  p.out = out.p;
  p.debug_threshold = thr.p;
  p.n_rows = n;
  p.vocab = b.vocab;
  p.max_candidates = max_candidates;
  GpuResult res;
  for (int c = 0; c < calls; ++c) {
    dc::sample(p, nullptr);
    if (all_out) {
      const auto o = out.get();
      all_out->insert(all_out->end(), o.begin(), o.end());
    }
  }
  DHS_CUDA_CHECK(cudaDeviceSynchronize());
  res.out = out.get();
  res.thr = thr.get();
  const auto off = offset.get();
  for (int r = 0; r < n; ++r) EXPECT_EQ(off[r], offset0 + calls) << "row " << r << ": counter not advanced";
  return res;
}

dc::SamplingRow row(float t, int k, float p, float min_p, float pen = 1.0f, uint64_t seed = 1) {
  dc::SamplingRow r;
  r.temperature = t;
  r.top_k = k;
  r.top_p = p;
  r.min_p = min_p;
  r.repetition_penalty = pen;
  r.seed = seed;
  return r;
}

std::vector<int32_t> random_history(int vocab, int n, std::mt19937& rng) {
  std::uniform_int_distribution<int32_t> pick(0, vocab - 1);
  std::vector<int32_t> h(static_cast<size_t>(n));
  for (auto& x : h) x = pick(rng);
  if (n > 3) {
    h[1] = h[0];  // repeated ids are penalised once
    h[2] = -5;    // out-of-range ids are ignored
  }
  return h;
}

// ---- tests --------------------------------------------------------------------------------

TEST(CudaSampling, GreedyMatchesCpuArgmax) {
  if (!have_gpu()) GTEST_SKIP() << "no GPU";
  std::mt19937 rng(11);
  std::vector<int> vocabs = tiny_mode()    ? std::vector<int>{7, 1000}
                            : small_mode() ? std::vector<int>{7, 1000, 49152}
                                           : std::vector<int>{7, 1000, 49152, 128256, 152064};
  for (int vocab : vocabs) {
    Batch b;
    b.vocab = vocab;
    const int n_rows = 32;
    for (int r = 0; r < n_rows; ++r) {
      const Dist d = r % 3 == 0 ? Dist::Flat : (r % 3 == 1 ? Dist::Ties : Dist::Peaked);
      auto l = make_logits(vocab, d, rng);
      if (r == 5) std::fill(l.begin(), l.end(), -1.0f);  // all tied: id 0
      if (r == 6) l[vocab - 1] = 1e30f;                  // the last id
      if (r == 7 && vocab > 4) {
        l[3] = 0.0f;  // -0 and +0 tie at the max: lowest id
        l[2] = -0.0f;
        for (int i = 0; i < vocab; ++i)
          if (i != 2 && i != 3) l[i] = -std::fabs(l[i]) - 1.0f;
      }
      b.logits.insert(b.logits.end(), l.begin(), l.end());
      const bool pen = r % 4 == 3;
      b.rows.push_back(row(0.0f, 0, 1.0f, 0.0f, pen ? 1.5f : 1.0f, 100 + r));
      b.hist.push_back(pen ? random_history(vocab, 64, rng) : std::vector<int32_t>{});
    }
    const GpuResult g = run_gpu(b, 0);
    for (int r = 0; r < n_rows; ++r) {
      auto l = penalised(&b.logits[static_cast<size_t>(r) * vocab], vocab, b.hist[r], b.rows[r].repetition_penalty);
      const int32_t want = static_cast<int32_t>(std::max_element(l.begin(), l.end()) - l.begin());
      EXPECT_EQ(g.out[r], want) << "vocab " << vocab << " row " << r;
      // And through dhs::Sampler itself.
      dhs::SamplingParams sp;
      sp.repetition_penalty = b.rows[r].repetition_penalty;
      sp.repetition_window = 0;
      dhs::Sampler s(sp);
      std::vector<float> l2(b.logits.begin() + static_cast<size_t>(r) * vocab, b.logits.begin() + static_cast<size_t>(r + 1) * vocab);
      EXPECT_EQ(g.out[r], s.sample(l2.data(), vocab, b.hist[r])) << "vocab " << vocab << " row " << r;
    }
  }
}

// A batch with one row per (filter config, logits distribution).
Batch filter_batch(int vocab, std::mt19937& rng) {
  std::vector<dc::SamplingRow> cfgs = {
      row(1.0f, 50, 1.0f, 0.0f),            // top-k
      row(0.7f, 50, 0.9f, 0.0f),            // top-k + top-p
      row(1.0f, 0, 0.9f, 0.0f),             // top-p
      row(1.3f, 0, 0.6f, 0.05f),            // top-p + min-p
      row(1.0f, 0, 1.0f, 0.1f),             // min-p
      row(0.8f, 2000, 0.95f, 0.0f),         // k > 1024
      row(1.0f, 1, 1.0f, 0.0f),             // k = 1
      row(1.0f, 20000, 0.99f, 0.0f),        // k beyond the candidate list
      row(0.9f, 40, 0.8f, 0.0f, 1.3f),      // with penalty
      row(1.0f, 0, 1.0f, 0.0f),             // no filter
      row(1.0f, 0, 0.999f, 0.0f),           // wide nucleus
      row(0.5f, 300, 0.7f, 0.02f, 1.1f),    // everything
  };
  Batch b;
  b.vocab = vocab;
  uint64_t seed = 7;
  for (const auto& c : cfgs)
    for (Dist d : {Dist::Flat, Dist::Peaked, Dist::Ties}) {
      const auto l = make_logits(vocab, d, rng);
      b.logits.insert(b.logits.end(), l.begin(), l.end());
      dc::SamplingRow r = c;
      r.seed = seed++;
      b.rows.push_back(r);
      b.hist.push_back(r.repetition_penalty != 1.0f ? random_history(vocab, 64, rng) : std::vector<int32_t>{});
    }
  return b;
}

TEST(CudaSampling, KeptSetEqualsCpuFilter) {
  if (!have_gpu()) GTEST_SKIP() << "no GPU";
  std::mt19937 rng(12);
  std::vector<int> vocabs = tiny_mode()    ? std::vector<int>{1000}
                            : small_mode() ? std::vector<int>{1000, 49152}
                                           : std::vector<int>{1000, 49152, 128256, 152064};
  for (int vocab : vocabs) {
    const Batch b = filter_batch(vocab, rng);
    std::vector<KeptSet> want;
    for (int r = 0; r < b.n_rows(); ++r)
      want.push_back(cpu_filter(penalised(&b.logits[static_cast<size_t>(r) * vocab], vocab, b.hist[r],
                                          b.rows[r].repetition_penalty),
                                b.rows[r]));
    for (int cap : {0, 37, 1}) {
      if (small_mode() && cap == 1) continue;
      const GpuResult g = run_gpu(b, cap);
      for (int r = 0; r < b.n_rows(); ++r) {
        const auto l = penalised(&b.logits[static_cast<size_t>(r) * vocab], vocab, b.hist[r], b.rows[r].repetition_penalty);
        auto got = gpu_set(l, b.rows[r].temperature, g.thr[r]);
        auto exp = want[r].ids;
        std::sort(exp.begin(), exp.end());
        EXPECT_EQ(got.size(), exp.size()) << "vocab " << vocab << " cap " << cap << " row " << r;
        EXPECT_TRUE(got == exp) << "vocab " << vocab << " cap " << cap << " row " << r << ": kept sets differ";
        EXPECT_TRUE(std::binary_search(exp.begin(), exp.end(), g.out[r]))
            << "vocab " << vocab << " cap " << cap << " row " << r << ": token " << g.out[r] << " outside the set";
      }
    }
  }
}

TEST(CudaSampling, CpuMirrorAgreesWithSampler) {
  // The test's restatement of the CPU rule must be the rule: dhs::Sampler's draws lie in it.
  std::mt19937 rng(13);
  const int vocab = 3000;
  const Batch b = filter_batch(vocab, rng);
  for (int r = 0; r < b.n_rows(); ++r) {
    const auto& c = b.rows[r];
    const auto set = cpu_filter(penalised(&b.logits[static_cast<size_t>(r) * vocab], vocab, b.hist[r], c.repetition_penalty), c);
    std::vector<int32_t> ids = set.ids;
    std::sort(ids.begin(), ids.end());
    dhs::SamplingParams sp;
    sp.temperature = c.temperature;
    sp.top_k = c.top_k;
    sp.top_p = c.top_p;
    sp.min_p = c.min_p;
    sp.repetition_penalty = c.repetition_penalty;
    sp.repetition_window = 0;
    sp.seed = 99 + r;
    dhs::Sampler s(sp);
    for (int d = 0; d < 40; ++d) {
      std::vector<float> l(b.logits.begin() + static_cast<size_t>(r) * vocab, b.logits.begin() + static_cast<size_t>(r + 1) * vocab);
      const int32_t t = s.sample(l.data(), vocab, b.hist[r]);
      EXPECT_TRUE(std::binary_search(ids.begin(), ids.end(), t)) << "row " << r << " token " << t;
    }
  }
}

// Draws over many rows (same logits, different seeds) and calls; every draw in the set,
// every token's count within 5 sigma of N p.
void check_frequencies(const char* name, int vocab, Dist d, dc::SamplingRow cfg, int max_candidates, std::mt19937& rng) {
  const int n_rows = small_mode() ? 32 : 512;
  const int calls = small_mode() ? 2 : 16;
  const auto l = make_logits(vocab, d, rng);
  Batch b;
  b.vocab = vocab;
  for (int r = 0; r < n_rows; ++r) {
    b.logits.insert(b.logits.end(), l.begin(), l.end());
    dc::SamplingRow c = cfg;
    c.seed = 1000 + static_cast<uint64_t>(r) * 7919;
    b.rows.push_back(c);
    b.hist.push_back({});
  }
  const auto set = cpu_filter(l, cfg);
  std::vector<int32_t> draws;
  run_gpu(b, max_candidates, calls, 0, &draws);
  std::vector<double> count(static_cast<size_t>(vocab), 0.0);
  for (int32_t t : draws) {
    ASSERT_TRUE(t >= 0 && t < vocab) << name << ": token " << t;
    count[t] += 1.0;
  }
  const double n = static_cast<double>(draws.size());
  double inside = 0.0;
  int bad = 0;
  for (size_t i = 0; i < set.ids.size(); ++i) {
    const double p = set.prob[i], c = count[set.ids[i]];
    inside += c;
    const double sigma = std::sqrt(n * p * (1.0 - p));
    if (std::fabs(c - n * p) > 5.0 * sigma + 1.0) {
      if (bad++ < 3)
        std::printf("%s: token %d count %.0f expected %.1f (5 sigma %.1f)\n", name, set.ids[i], c, n * p, 5 * sigma);
    }
  }
  EXPECT_EQ(inside, n) << name << ": draws outside the CPU-filtered set";
  EXPECT_EQ(bad, 0) << name << ": frequencies off by more than 5 sigma (" << set.ids.size() << " tokens, " << n
                    << " draws)";
}

TEST(CudaSampling, FrequenciesMatchCpuSoftmax) {
  if (!have_gpu()) GTEST_SKIP() << "no GPU";
  std::mt19937 rng(14);
  const int big = tiny_mode() ? 5000 : 49152;
  // Set fully in shared memory (top-k superset, then top-p).
  check_frequencies("topk50+topp0.9", big, Dist::Peaked, row(0.8f, 50, 0.9f, 0.0f), 0, rng);
  // min-p path.
  check_frequencies("minp0.1", big, Dist::Peaked, row(1.5f, 0, 1.0f, 0.1f), 0, rng);
  // No filter: the thread-major draw over the whole row.
  check_frequencies("plain T=1", 200, Dist::Flat, row(1.0f, 0, 1.0f, 0.0f), 0, rng);
  // Tiny candidate list: histogram levels, kept elements above the list, thread-major draw.
  check_frequencies("topp0.8 cap16", big, Dist::Peaked, row(1.0f, 0, 0.8f, 0.0f), 16, rng);
  check_frequencies("topk30 cap4 ties", 5000, Dist::Ties, row(1.0f, 30, 1.0f, 0.0f), 4, rng);
}

TEST(CudaSampling, SameSeedSameTokens) {
  if (!have_gpu()) GTEST_SKIP() << "no GPU";
  std::mt19937 rng(15);
  Batch b = filter_batch(small_mode() ? 1000 : 49152, rng);
  const GpuResult a = run_gpu(b, 0, 3, 5);
  const GpuResult c = run_gpu(b, 0, 3, 5);
  EXPECT_TRUE(a.out == c.out);
  // Different counters draw differently somewhere (flat rows have hundreds of candidates).
  const GpuResult d = run_gpu(b, 0, 1, 6);
  EXPECT_FALSE(a.out == d.out);
}

TEST(CudaSampling, GraphReplayAdvances) {
  if (!have_gpu()) GTEST_SKIP() << "no GPU";
  std::mt19937 rng(16);
  const int vocab = 5000, n_rows = 8;
  std::vector<float> logits;
  std::vector<dc::SamplingRow> rows;
  for (int r = 0; r < n_rows; ++r) {
    const auto l = make_logits(vocab, Dist::Flat, rng);
    logits.insert(logits.end(), l.begin(), l.end());
    rows.push_back(row(1.0f, r % 2 ? 0 : 500, r % 3 ? 1.0f : 0.95f, 0.0f, 1.0f, 42 + r));
  }
  Dev<float> logits_d(logits);
  Dev<dc::SamplingRow> rows_d(rows);
  Dev<int32_t> out(static_cast<size_t>(n_rows));
  Dev<uint64_t> offset(std::vector<uint64_t>(static_cast<size_t>(n_rows), 0));
  dc::SampleParams p;
  p.logits = logits_d.p;
  p.rows = rows_d.p;
  p.rng_offset = offset.p;
  p.out = out.p;
  p.n_rows = n_rows;
  p.vocab = vocab;

  cudaStream_t st;
  DHS_CUDA_CHECK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  // Eager reference: counters 0 and 1.
  dc::sample(p, st);
  DHS_CUDA_CHECK(cudaStreamSynchronize(st));
  const auto e0 = out.get();
  dc::sample(p, st);
  DHS_CUDA_CHECK(cudaStreamSynchronize(st));
  const auto e1 = out.get();

  offset.put(std::vector<uint64_t>(static_cast<size_t>(n_rows), 0));
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  DHS_CUDA_CHECK(cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal));
  dc::sample(p, st);
  DHS_CUDA_CHECK(cudaStreamEndCapture(st, &graph));
  DHS_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
  std::vector<std::vector<int32_t>> replays;
  for (int round = 0; round < 2; ++round) {
    for (int k = 0; k < 2; ++k) {
      DHS_CUDA_CHECK(cudaGraphLaunch(exec, st));
      DHS_CUDA_CHECK(cudaStreamSynchronize(st));
      replays.push_back(out.get());
    }
    EXPECT_TRUE(offset.get() == std::vector<uint64_t>(static_cast<size_t>(n_rows), 2)) << "counters advance per replay";
    offset.put(std::vector<uint64_t>(static_cast<size_t>(n_rows), 0));
  }
  EXPECT_TRUE(replays[0] == e0) << "replay 1 draws as the eager call with counter 0";
  EXPECT_TRUE(replays[1] == e1) << "replay 2 draws as the eager call with counter 1";
  EXPECT_FALSE(replays[0] == replays[1]) << "replays draw new tokens";
  EXPECT_TRUE(replays[2] == replays[0] && replays[3] == replays[1]) << "reset counters replay the same tokens";
  DHS_CUDA_CHECK(cudaGraphExecDestroy(exec));
  DHS_CUDA_CHECK(cudaGraphDestroy(graph));
  DHS_CUDA_CHECK(cudaStreamDestroy(st));
}

// The sampled-vocabulary limit (logits_ld > vocab: ids past vocab are embedding padding) and
// per-row history offsets into one store (the engine's layout), against dhs::Sampler itself:
// greedy ids equal exactly, with the repetition window applied as the Sampler applies it; the
// padding, given the largest logits of the row, is never returned, greedy or drawn.
TEST(CudaSampling, SampledVocabLimitAndHistoryStore) {
  if (!have_gpu()) GTEST_SKIP() << "no GPU";
  std::mt19937 rng(21);
  const int vocab = small_mode() ? 3000 : 49152, pad = 128, ld = vocab + pad, n_rows = 12, store_ld = 300;
  std::vector<float> logits;
  std::vector<dc::SamplingRow> rows;
  std::vector<std::vector<int32_t>> hist;
  std::vector<int> window;
  std::vector<int32_t> store(static_cast<size_t>(n_rows) * store_ld, 0), hist_len(n_rows);
  std::vector<int64_t> hist_off(n_rows);
  for (int r = 0; r < n_rows; ++r) {
    auto l = make_logits(vocab, r % 3 == 2 ? Dist::Ties : Dist::Peaked, rng);
    for (int j = 0; j < pad; ++j) l.push_back(100.0f + j);  // padding: the row's largest logits
    logits.insert(logits.end(), l.begin(), l.end());
    const bool greedy = r < n_rows / 2;
    // History: the row's top ids among others, so the penalty changes the argmax.
    std::vector<int32_t> h = random_history(vocab, 40 + 20 * r, rng);
    std::vector<int32_t> order(static_cast<size_t>(vocab));
    std::iota(order.begin(), order.end(), 0);
    std::partial_sort(order.begin(), order.begin() + 4, order.end(), [&](int a, int b) { return l[a] > l[b]; });
    for (int j = 0; j < 4; ++j) h[h.size() - 1 - static_cast<size_t>(j) * 3] = order[static_cast<size_t>(j)];
    hist.push_back(h);
    window.push_back(r % 4 == 0 ? 0 : 8 + 5 * r);  // 0: the whole history
    rows.push_back(greedy ? row(0.0f, 0, 1.0f, 0.0f, 1.0f + 0.4f * static_cast<float>(r % 3 + 1), 7)
                          : row(1.0f, r % 2 ? 0 : 64, 0.95f, 0.0f, 1.3f, 100 + r));
    const int64_t n = static_cast<int64_t>(h.size());
    const int64_t from = window.back() > 0 && n > window.back() ? n - window.back() : 0;
    std::copy(h.begin(), h.end(), store.begin() + static_cast<size_t>(r) * store_ld);
    hist_off[r] = static_cast<int64_t>(r) * store_ld + from;
    hist_len[r] = static_cast<int32_t>(n - from);
  }
  Dev<float> logits_d(logits);
  Dev<dc::SamplingRow> rows_d(rows);
  Dev<int32_t> store_d(store), hist_len_d(hist_len), out(static_cast<size_t>(n_rows));
  Dev<int64_t> hist_off_d(hist_off);
  Dev<uint64_t> offset(std::vector<uint64_t>(static_cast<size_t>(n_rows), 0));
  dc::SampleParams p;
  p.logits = logits_d.p;
  p.rows = rows_d.p;
  p.history = store_d.p;
  p.history_len = hist_len_d.p;
  p.history_off = hist_off_d.p;
  p.rng_offset = offset.p;
  p.out = out.p;
  p.n_rows = n_rows;
  p.vocab = vocab;
  p.logits_ld = ld;
  const int calls = small_mode() ? 20 : 200;
  for (int c = 0; c < calls; ++c) {
    dc::sample(p, nullptr);
    const auto o = out.get();
    for (int r = 0; r < n_rows; ++r) {
      ASSERT_TRUE(o[r] >= 0 && o[r] < vocab) << "row " << r << " returned padding id " << o[r];
      if (rows[r].temperature > 0.0f) continue;
      dhs::SamplingParams sp;
      sp.repetition_penalty = rows[r].repetition_penalty;
      sp.repetition_window = window[r];
      dhs::Sampler cpu(sp);
      std::vector<float> l(logits.begin() + static_cast<size_t>(r) * ld, logits.begin() + static_cast<size_t>(r) * ld + ld);
      const int32_t want = cpu.sample(l.data(), vocab, hist[r]);
      ASSERT_EQ(o[r], want) << "greedy row " << r << " (window " << window[r] << ")";
    }
  }
}

// Chi-square goodness of fit of the GPU's draws to the CPU rule's distribution (the kept set of
// sampler.cpp and its renormalised softmax) for top-k / top-p / min-p / penalty mixes on a fixed
// row: bins are the kept tokens (those expected fewer than 5 times merged into one), the
// statistic must stay below the chi-square quantile at significance 1e-4 per case (five cases:
// a false alarm once in 2,000 runs); and no draw ever leaves the kept set (exact).
TEST(CudaSampling, ChiSquareMatchesCpuDistribution) {
  if (!have_gpu()) GTEST_SKIP() << "no GPU";
  std::mt19937 rng(22);
  const int vocab = small_mode() ? 2000 : 32000, n_rows = small_mode() ? 64 : 1024, calls = small_mode() ? 4 : 200;
  const std::vector<float> base = make_logits(vocab, Dist::Peaked, rng);
  const std::vector<int32_t> hist = random_history(vocab, 50, rng);
  struct Case {
    const char* name;
    dc::SamplingRow r;
  };
  const Case cases[] = {
      {"T0.9 topk40 topp0.9 minp0.02", row(0.9f, 40, 0.9f, 0.02f)},
      {"T1.2 topp0.8", row(1.2f, 0, 0.8f, 0.0f)},
      {"T1 minp0.05", row(1.0f, 0, 1.0f, 0.05f)},
      {"T0.7 topk200 pen1.3", row(0.7f, 200, 1.0f, 0.0f, 1.3f)},
      {"T2 topk1000 topp0.95 minp0.001 pen1.2", row(2.0f, 1000, 0.95f, 0.001f, 1.2f)},
  };
  for (const Case& cs : cases) {
    Batch b;
    b.vocab = vocab;
    for (int r = 0; r < n_rows; ++r) {
      b.logits.insert(b.logits.end(), base.begin(), base.end());
      dc::SamplingRow rr = cs.r;
      rr.seed = 1000 + static_cast<uint64_t>(r);  // independent streams
      b.rows.push_back(rr);
      b.hist.push_back(hist);
    }
    std::vector<int32_t> draws;
    run_gpu(b, 0, calls, 0, &draws);
    const KeptSet set = cpu_filter(penalised(base.data(), vocab, hist, cs.r.repetition_penalty), cs.r);
    std::vector<double> count(static_cast<size_t>(vocab), 0.0);
    for (int32_t id : draws) count[static_cast<size_t>(id)] += 1.0;
    const double n = static_cast<double>(draws.size());
    double inside = 0.0, chi2 = 0.0, merged_obs = 0.0, merged_exp = 0.0;
    int bins = 0;
    for (size_t i = 0; i < set.ids.size(); ++i) {
      const double e = n * set.prob[i], o = count[static_cast<size_t>(set.ids[i])];
      inside += o;
      if (e < 5.0) {
        merged_obs += o;
        merged_exp += e;
        continue;
      }
      chi2 += (o - e) * (o - e) / e;
      ++bins;
    }
    if (merged_exp > 0.0) {
      chi2 += (merged_obs - merged_exp) * (merged_obs - merged_exp) / merged_exp;
      ++bins;
    }
    // Wilson-Hilferty: the chi-square quantile with df degrees of freedom at upper tail 1e-4.
    const double df = std::max(1, bins - 1), z = 3.719;
    const double crit = df * std::pow(1.0 - 2.0 / (9.0 * df) + z * std::sqrt(2.0 / (9.0 * df)), 3.0);
    std::printf("%-40s kept %5zu, %8.0f draws, chi2 %9.1f (df %4.0f, critical %8.1f at 1e-4)\n", cs.name, set.ids.size(), n,
                chi2, df, crit);
    EXPECT_EQ(inside, n) << cs.name << ": draws outside the CPU rule's kept set";
    if (set.ids.size() > 1) EXPECT_LT(chi2, crit) << cs.name << ": draws do not follow the CPU rule's distribution";
  }
}

TEST(CudaSampling, Timing) {
  if (!have_gpu()) GTEST_SKIP() << "no GPU";
  if (!env_on("DHS_CUDA_BENCH")) GTEST_SKIP() << "set DHS_CUDA_BENCH=1 for timings";
  std::mt19937 rng(17);
  struct Cfg {
    const char* name;
    dc::SamplingRow r;
    Dist d;
  };
  const std::vector<Cfg> cfgs = {
      {"greedy", row(0.0f, 0, 1.0f, 0.0f), Dist::Peaked},
      {"T0.7 k50 p0.9", row(0.7f, 50, 0.9f, 0.0f), Dist::Peaked},
      {"T1 p0.9", row(1.0f, 0, 0.9f, 0.0f), Dist::Peaked},
      {"T1 minp0.05", row(1.0f, 0, 1.0f, 0.05f), Dist::Peaked},
      {"T1 plain", row(1.0f, 0, 1.0f, 0.0f), Dist::Peaked},
      {"T1 p0.9 flat(worst)", row(1.0f, 0, 0.9f, 0.0f), Dist::Flat},
      {"T1 k50 pen1.2 hist64", row(1.0f, 50, 1.0f, 0.0f, 1.2f), Dist::Peaked},
  };
  for (int vocab : {49152, 128256})
    for (int batch : {1, 32})
      for (const auto& c : cfgs) {
        Batch b;
        b.vocab = vocab;
        for (int r = 0; r < batch; ++r) {
          const auto l = make_logits(vocab, c.d, rng);
          b.logits.insert(b.logits.end(), l.begin(), l.end());
          b.rows.push_back(c.r);
          b.hist.push_back(random_history(vocab, 64, rng));
        }
        std::vector<int32_t> hist;
        for (const auto& h : b.hist) hist.insert(hist.end(), h.begin(), h.end());
        Dev<float> logits(b.logits);
        Dev<dc::SamplingRow> rows(b.rows);
        Dev<int32_t> hist_d(hist), hist_len(std::vector<int32_t>(static_cast<size_t>(batch), 64)),
            out(static_cast<size_t>(batch));
        Dev<uint64_t> offset(std::vector<uint64_t>(static_cast<size_t>(batch), 0));
        dc::SampleParams p;
        p.logits = logits.p;
        p.rows = rows.p;
        p.history = hist_d.p;
        p.history_len = hist_len.p;
        p.history_ld = 64;
        p.rng_offset = offset.p;
        p.out = out.p;
        p.n_rows = batch;
        p.vocab = vocab;
        for (int w = 0; w < 5; ++w) dc::sample(p, nullptr);
        cudaEvent_t e0, e1;
        DHS_CUDA_CHECK(cudaEventCreate(&e0));
        DHS_CUDA_CHECK(cudaEventCreate(&e1));
        const int reps = 200;
        DHS_CUDA_CHECK(cudaEventRecord(e0));
        for (int i = 0; i < reps; ++i) dc::sample(p, nullptr);
        DHS_CUDA_CHECK(cudaEventRecord(e1));
        DHS_CUDA_CHECK(cudaEventSynchronize(e1));
        float ms = 0.0f;
        DHS_CUDA_CHECK(cudaEventElapsedTime(&ms, e0, e1));
        std::printf("BENCH sample vocab %6d batch %2d %-22s %8.1f us/call\n", vocab, batch, c.name, 1000.0 * ms / reps);
        DHS_CUDA_CHECK(cudaEventDestroy(e0));
        DHS_CUDA_CHECK(cudaEventDestroy(e1));
      }
}

}  // namespace
