// Token sampling on the GPU, the last op of a decode step: per row of logits,
// repetition penalty, then greedy or temperature -> top-k -> top-p -> min-p ->
// draw, with the same semantics as the CPU dhs::Sampler (engine/sampler.h).
// Everything stays on the device (parameters, RNG counters, output ids), so a
// captured step replays without host work; each call advances each row's RNG
// counter by one, so graph replays draw new tokens, deterministically.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

namespace dhs::cuda {

// Per-row sampling parameters (device array, one per row). Same meaning as
// dhs::SamplingParams; repetition_window is applied by whoever fills `history`.
struct SamplingRow {
  float temperature = 0.0f;         // <= 0: greedy (argmax of penalised logits, lowest id on ties)
  int32_t top_k = 0;                // <= 0 or >= vocab: off
  float top_p = 1.0f;               // >= 1: off
  float min_p = 0.0f;               // <= 0: off
  float repetition_penalty = 1.0f;  // 1: off
  int32_t reserved = 0;
  uint64_t seed = 0;                // Philox key of this row's stream
};
static_assert(sizeof(SamplingRow) == 32, "SamplingRow is shared with device code");

struct SampleParams {
  const float* logits = nullptr;       // [n_rows, logits_ld]; ids [0, vocab) of each row are sampled; not modified
  const SamplingRow* rows = nullptr;   // [n_rows]
  // Token ids the penalty applies to, or null: row r's are history[history_off[r] ..][0, history_len[r])
  // when history_off is given (a per-request store, rows pointing into it), else
  // history[r * history_ld ..][0, min(history_len[r], history_ld)).
  const int32_t* history = nullptr;
  const int32_t* history_len = nullptr;  // [n_rows]
  const int64_t* history_off = nullptr;  // [n_rows] or null
  int history_ld = 0;
  uint64_t* rng_offset = nullptr;      // [n_rows] counter of each row's stream; the call uses it and adds 1
  int32_t* out = nullptr;              // [n_rows] sampled token ids
  uint64_t* debug_threshold = nullptr; // [n_rows] or null: smallest kept sort key (tests; see sampling.cu)
  int n_rows = 0;
  int vocab = 0;         // ids a row may return: [0, vocab) (the rest of the row is embedding padding)
  int64_t logits_ld = 0; // row stride of logits (>= vocab); 0: vocab
  int max_candidates = 0;  // 0: default; smaller values force the multi-level select path (tests)
};

constexpr int kSamplingMaxVocab = 1 << 19;

// Needs no workspace: one 1024-thread block per row, candidates in shared memory.
void launch_sample(const SampleParams& p, cudaStream_t stream);
void sample(const SampleParams& p, cudaStream_t stream);

}  // namespace dhs::cuda
