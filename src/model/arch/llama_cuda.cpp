#include "model/arch/llama_cuda.h"
#include "model/rope.h"

#include <algorithm>
#include <chrono>
#include <tuple>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <type_traits>
#include <optional>

#include "backend/cpu/ops.h"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/lru_mirror.h"
#include "backend/cuda/quant_gemv.h"
#include "backend/cuda/tier_land.h"
#include "core/error.h"
#include "core/fp16.h"
#include "core/thread_pool.h"
#include "kv/page_lists.h"
#include "model/dequant.h"
#include "model/tensor_load.h"

namespace dhs {

namespace {
// A weight as the device stores it. f16 holds every weight of the models we load to 2^-11
// relative; one beyond its range (|w| > 65504) is refused rather than stored as infinity.
uint16_t weight_f16(float w) {
  DHS_CHECK(std::fabs(w) <= 65504.0f, "CUDA backend: a weight of {} is outside the f16 range", w);
  return f32_to_fp16(w);
}
}  // namespace

void* LlamaCuda::dalloc(size_t bytes) {
  void* p = nullptr;
  DHS_CUDA_CHECK(cudaMalloc(&p, std::max<size_t>(bytes, 16)));
  allocs_.push_back(p);
  return p;
}

LandOverlapRule land_overlap_env(LandOverlapRule rule) {
  const char* v = std::getenv("DHS_LAND_OVERLAP");
  if (v == nullptr) return rule;
  const std::optional<LandOverlapRule> r = LandOverlapRule::parse(v);
  DHS_CHECK(r.has_value(), "DHS_LAND_OVERLAP must be off, on or auto (or 0, 1), got '{}'", v);
  rule.mode = r->mode;
  return rule;
}

namespace {
// Requests per step the backend takes: graphs are captured per power-of-two bucket up to it.
constexpr int kMaxBatchLimit = 1024;
}  // namespace

// Everything but the KV pool and its page data (allocate_kv, once the weights are in: a pool
// sized from the memory left must come last).
void LlamaCuda::allocate(const CudaModelOptions& o) {
  opt_ = o;
  DHS_CHECK(!(o.fp8_weights && o.draft_fp8), "--draft-quantization fp8: the model's projections are FP8 already");
  const int64_t H = cfg_.hidden, D = cfg_.head_dim, Hq = cfg_.n_heads_q, Hkv = cfg_.n_heads_kv, F = cfg_.ffn_hidden;
  const int64_t V = cfg_.vocab_size, L = cfg_.n_layers;
  DHS_CHECK(o.max_batch >= 1 && o.max_batch <= kMaxBatchLimit, "CUDA backend: max batch must be in [1, {}], got {}",
            kMaxBatchLimit, o.max_batch);
  DHS_CHECK(o.max_context >= 1, "CUDA backend: max context must be >= 1");
  const int64_t B = o.max_batch;
  // Tokens of one step: a prefill chunk, or a decode-like step padded to its graph's bucket (a
  // verify step's rows plus up to max_batch - 1 padding rows; per-row verify requests up to
  // max_batch x max_verify_rows).
  const int64_t T = std::max<int64_t>(o.max_step_tokens, B) + B * (o.max_verify_rows > 1 ? o.max_verify_rows : 0);
  max_tokens_ = T;
  DHS_CHECK(o.page_size == cuda::kDecodePageSize, "CUDA backend: page size must be {}", cuda::kDecodePageSize);
  DHS_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  DHS_CUDA_CHECK(cudaEventCreate(&ev_launch_));
  DHS_CUDA_CHECK(cudaEventCreate(&ev_kernels_done_));
  pages_per_seq_ = (o.max_context + o.page_size - 1) / o.page_size;
  table_ = std::make_unique<cuda::DevicePageTable>(static_cast<int>(B), static_cast<int>(L), static_cast<int>(Hkv), pages_per_seq_);
  gemm_ = std::make_unique<cuda::Gemm>();
  gemm_->set_gemv_max_tok(o.gemv_max_tok);
  const int64_t group = Hq / Hkv;
  DHS_CHECK(o.verify_selection == "last-row" || o.verify_selection == "all-rows" || o.verify_selection == "per-row",
            "verify selection must be last-row, all-rows or per-row, got '{}'", o.verify_selection);
  max_attn_ = o.verify_selection == "per-row" ? B * o.max_verify_rows : B;
  const int64_t R = max_attn_;
  dws_ = std::make_unique<cuda::DecodeAttentionWorkspace>(static_cast<int>(R), static_cast<int>(Hq), static_cast<int>(Hkv),
                                                         static_cast<int>(D), 1);
  DHS_CHECK(o.max_verify_rows >= 1 && group * o.max_verify_rows <= cuda::kDecodeMaxQVecs,
            "CUDA backend: verify rows {} outside [1, {}] (the attention kernel takes {} query vectors per KV head, "
            "GQA group {})",
            o.max_verify_rows, cuda::kDecodeMaxQVecs / group, cuda::kDecodeMaxQVecs, group);
  // Per-row selections read as their union: after the merge a step's attention requests are its
  // sequences and its padding rows (up to R of them), with up to max_verify_rows rows each.
  const bool unite = o.verify_selection == "per-row" && o.per_row_union && o.max_verify_rows > 1 && o.host_pages == 0;
  if (o.max_verify_rows > 1) {
    const int WB = static_cast<int>(unite ? R : B);
    const int one_tile = static_cast<int>(std::min<int64_t>(16 / group, o.max_verify_rows));
    if (one_tile > 1)
      dws_verify_[0] = std::make_unique<cuda::DecodeAttentionWorkspace>(
          WB, static_cast<int>(Hq), static_cast<int>(Hkv), static_cast<int>(D), one_tile);
    if (o.max_verify_rows > one_tile)
      dws_verify_[1] = std::make_unique<cuda::DecodeAttentionWorkspace>(
          WB, static_cast<int>(Hq), static_cast<int>(Hkv), static_cast<int>(D), o.max_verify_rows);
  }
  max_out_ = B * o.max_verify_rows;
  const int64_t O = max_out_;
  auto ints = [&](int64_t n) { return static_cast<int32_t*>(dalloc(static_cast<size_t>(n) * 4)); };
  DHS_CHECK(o.summaries == "none" || o.summaries == "minmax" || o.summaries == "meanspread" || o.summaries == "both",
            "page summaries must be none, minmax, meanspread or both, got '{}'", o.summaries);
  ids_d_ = ints(T);
  pos_d_ = ints(T);
  dst_slot_d_ = ints(L * T * Hkv);
  q_indptr_d_ = ints(R + 1);
  seq_len_d_ = ints(R);
  req_slot_d_ = ints(R);
  last_row_d_ = ints(O);
  sel_row_d_ = ints(R);
  sel_q_indptr_d_ = ints(B + 1);
  {
    std::vector<int32_t> iota(static_cast<size_t>(B + 1));
    for (int64_t i = 0; i <= B; ++i) iota[static_cast<size_t>(i)] = static_cast<int32_t>(i);
    DHS_CUDA_CHECK(cudaMemcpy(sel_q_indptr_d_, iota.data(), iota.size() * 4, cudaMemcpyHostToDevice));
  }
  indptr_d_ = ints(R * Hkv + 1);
  slots_d_ = ints(R * Hkv * pages_per_seq_);
  page_pos_d_ = ints(R * Hkv * pages_per_seq_);
  if (unite) {
    // (row_union's grid has the lists in y)
    DHS_CHECK(R * Hkv <= 65535, "per-row union: {} verify rows x {} KV heads exceed the merge's 65,535 lists", R, Hkv);
    union_scratch_ = std::make_unique<cuda::RowUnionScratch>(static_cast<int>(R * Hkv), static_cast<int>(pages_per_seq_));
    union_rows_d_ = ints(R + 1);
    union_seq_d_ = ints(R);
    union_indptr_d_ = ints(R * Hkv + 1);
    union_slots_d_ = ints(R * Hkv * pages_per_seq_);
    union_pos_d_ = ints(R * Hkv * pages_per_seq_);
    union_mask_d_ = static_cast<uint32_t*>(dalloc(static_cast<size_t>(R * Hkv * pages_per_seq_) * 4));
    union_req_slot_d_ = ints(R);
    union_score_req_d_ = ints(R);
    union_vec0_d_ = ints(R);
    union_dense_indptr_d_ = ints(R * Hkv + 1);
    union_dense_slots_d_ = ints(R * Hkv * pages_per_seq_);
    union_dense_pos_d_ = ints(R * Hkv * pages_per_seq_);
    // (rows and tokens of the merged requests, their table rows, each row's merged request and first q vector)
    DHS_CUDA_CHECK(cudaMallocHost(&union_h_, static_cast<size_t>(5 * R + 1) * 4));
    if (const char* e = std::getenv("DHS_DEBUG_ROW_UNION"); e != nullptr)  // (the probe, printing)
      union_check_ = RowUnionCheck{true, std::string_view(e) == "split", true};
  }
  staging_ints_ = static_cast<size_t>(2 * T + L * T * Hkv + 4 * R + 1 + O);
  DHS_CUDA_CHECK(cudaMallocHost(&staging_h_, staging_ints_ * 4));
  auto bf = [&](int64_t n) { return static_cast<__half*>(dalloc(static_cast<size_t>(n) * 2)); };
  x_d_ = static_cast<float*>(dalloc(static_cast<size_t>(T * H) * 4));
  h_d_ = bf(T * H);
  qkv_d_ = bf(T * (Hq + 2 * Hkv) * D);
  q_d_ = bf(T * Hq * D);
  att_d_ = bf(T * Hq * D);
  sel_q_d_ = bf(B * Hq * D);
  gu_d_ = bf(T * 2 * F);
  act_d_ = bf(T * F);
  hlast_d_ = bf(O * H);
  last_x_d_ = static_cast<float*>(dalloc(static_cast<size_t>(O * H) * 4));
  logits_d_ = static_cast<float*>(dalloc(static_cast<size_t>(O * V) * 4));
  // The sampler's per-row inputs: one block, one upload per step.
  samp_block_bytes_ = static_cast<size_t>(O) * (sizeof(cuda::SamplingRow) + 8 + 8 + 4);
  samp_block_d_ = static_cast<uint8_t*>(dalloc(samp_block_bytes_));
  DHS_CUDA_CHECK(cudaMallocHost(&samp_block_h_, samp_block_bytes_));
  std::memset(samp_block_h_, 0, samp_block_bytes_);
  samp_rows_d_ = reinterpret_cast<cuda::SamplingRow*>(samp_block_d_);
  rng_d_ = reinterpret_cast<uint64_t*>(samp_block_d_ + O * sizeof(cuda::SamplingRow));
  hist_off_d_ = reinterpret_cast<int64_t*>(samp_block_d_ + O * (sizeof(cuda::SamplingRow) + 8));
  hist_len_d_ = reinterpret_cast<int32_t*>(samp_block_d_ + O * (sizeof(cuda::SamplingRow) + 16));
  {
    std::vector<cuda::SamplingRow> greedy(static_cast<size_t>(O));  // temperature 0 = greedy
    std::memcpy(samp_block_h_, greedy.data(), greedy.size() * sizeof(cuda::SamplingRow));
    DHS_CUDA_CHECK(cudaMemcpy(samp_block_d_, samp_block_h_, samp_block_bytes_, cudaMemcpyHostToDevice));
  }
  // Each request slot's tokens (the repetition penalty's history): 4 B per token of context, next
  // to the KV's 2 * L * Hkv * D * 2 B.
  hist_ld_ = o.max_context + 1;
  hist_d_ = ints(B * hist_ld_);
  hist_stage_cap_ = hist_ld_ + 64 * B;
  DHS_CUDA_CHECK(cudaMallocHost(&hist_stage_h_, static_cast<size_t>(hist_stage_cap_) * 4));
  hist_synced_.assign(static_cast<size_t>(B), 0);
  hist_last_.assign(static_cast<size_t>(B), -1);
  out_ids_d_ = ints(O);
  DHS_CUDA_CHECK(cudaMallocHost(&out_ids_h_, static_cast<size_t>(O) * 4));
  inv_freq_ = static_cast<float*>(dalloc(static_cast<size_t>(D / 2) * 4));
  std::vector<float> inv(static_cast<size_t>(D / 2));
  rope_inv_freq(cfg_, inv.data());
  DHS_CUDA_CHECK(cudaMemcpy(inv_freq_, inv.data(), inv.size() * 4, cudaMemcpyHostToDevice));
}

void LlamaCuda::allocate_kv() {
  const CudaModelOptions& o = opt_;
  const int64_t D = cfg_.head_dim, Hq = cfg_.n_heads_q, Hkv = cfg_.n_heads_kv, L = cfg_.n_layers, B = o.max_batch;
  const bool minmax = o.summaries != "meanspread" && o.summaries != "none";
  const bool meanvar = o.summaries != "minmax" && o.summaries != "none";
  const bool unite = union_scratch_ != nullptr;  // (allocate: the per-row union)
  int64_t n_pages = o.n_pages;
  if (n_pages <= 0 && o.gpu_memory_utilization > 0.0) {
    // vLLM's rule: the pool takes what utilization x total memory leaves after everything the
    // process holds now (weights, workspaces, step buffers), less what is still to come: the
    // selector's workspace (sparse-capable models) and room for graphs and cuBLASLt's plans.
    DHS_CHECK(o.gpu_memory_utilization <= 1.0, "gpu memory utilization must be in (0, 1], got {}", o.gpu_memory_utilization);
    DHS_CUDA_CHECK(cudaStreamSynchronize(stream_));
    size_t free_b = 0, total_b = 0;
    DHS_CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
    const double used = static_cast<double>(total_b - free_b);
    double to_come = 512.0 * (1 << 20);
    if (minmax || meanvar || o.key_sketch) {
      const double nnz = static_cast<double>(max_attn_ * Hkv * pages_per_seq_);
      // (per request; the per-row union scores a verify's rows as one request: PageSelector::ScoreFrom)
      const int64_t scored_rows = o.verify_selection == "all-rows" || unite ? o.max_verify_rows : 1;
      to_come += nnz * (4.0 * static_cast<double>(Hq / Hkv * scored_rows) + 4 + 4 + 8);  // scores, mass, stage, lists
    }
    double per_page = 2.0 * o.page_size * static_cast<double>(D) * 2;  // K and V, f16
    if (minmax) per_page += 4.0 * static_cast<double>(D);
    if (meanvar) per_page += 4.0 * static_cast<double>(D);
    if (o.key_sketch) per_page += static_cast<double>(o.page_size) * (static_cast<double>(D) / 2 + 4);
    // The estimator rows of the host tier's pages live in HBM too (per_page's page data, without K and V).
    to_come += static_cast<double>(o.host_pages) * (per_page - 2.0 * o.page_size * static_cast<double>(D) * 2);
    const double budget = o.gpu_memory_utilization * static_cast<double>(total_b) - used - to_come;
    n_pages = budget > 0 ? static_cast<int64_t>(budget / per_page) : 0;
    n_pages = std::min<int64_t>(n_pages, (int64_t{1} << 31) - 1);
    n_pages -= n_pages % (L * Hkv);  // whole blocks of page_size tokens over every layer and KV head
    DHS_CHECK(n_pages >= L * Hkv,
              "gpu memory utilization {:.2f} leaves no room for the KV pool ({:.1f} GiB of {:.1f} GiB in use before it)",
              o.gpu_memory_utilization, used / (1 << 30), static_cast<double>(total_b) / (1 << 30));
  } else if (n_pages <= 0) {
    n_pages = pages_per_seq_ * B * L * Hkv;
  }
  alloc_ = std::make_unique<PagePool>(Tier::Device, n_pages, o.page_size, static_cast<int>(D), /*with_storage=*/false);
  pool_ = std::make_unique<cuda::DevicePagePool>(n_pages, o.page_size, static_cast<int>(D));
  // With a host tier the page data the estimators read keeps a row per page of both tiers, under
  // the page's key (device slot s, host slot n_pages + h): a page is scored wherever it lives.
  DHS_CHECK(o.host_pages >= 0 && n_pages + o.host_pages < (int64_t{1} << 31), "host tier of {} pages (with {} in HBM) is too large",
            o.host_pages, n_pages);
  const int64_t n_keys = n_pages + o.host_pages;
  if (o.key_sketch) sketch_ = std::make_unique<cuda::DeviceKeySketch>(n_keys, o.page_size, static_cast<int>(D));
  if (minmax) sum_minmax_ = std::make_unique<cuda::DevicePageSummaries>(n_keys, static_cast<int>(D), cuda::SummaryKind::MinMax);
  if (meanvar)
    sum_meanvar_ = std::make_unique<cuda::DevicePageSummaries>(n_keys, static_cast<int>(D), cuda::SummaryKind::MeanSpread);
  if (o.host_pages > 0) {
    host_pool_ = std::make_unique<cuda::HostPagePool>(o.host_pages, o.page_size, static_cast<int>(D));
    table_->set_tier_keys(n_pages);
    split_ = std::make_unique<cuda::TierSplitLists>(static_cast<int>(max_attn_ * Hkv), max_attn_ * Hkv * pages_per_seq_);
    late_att_d_ = static_cast<__half*>(dalloc(static_cast<size_t>(max_tokens_ * Hq * D) * 2));
    lse_d_ = static_cast<float*>(dalloc(static_cast<size_t>(max_tokens_ * Hq) * 4));
    late_lse_d_ = static_cast<float*>(dalloc(static_cast<size_t>(max_tokens_ * Hq) * 4));
    // The late log holds every page a step's lists can name (all layers), up to kLateLogMax.
    late_cap_ = static_cast<int>(std::min<int64_t>(max_attn_ * Hkv * pages_per_seq_ * L, kLateLogMax));
    late_log_d_ = static_cast<int32_t*>(dalloc(static_cast<size_t>(3 * late_cap_ + 1) * 4));
    DHS_CUDA_CHECK(cudaMallocHost(&late_count_h_, 4));
    last_use_d_ = static_cast<int32_t*>(dalloc(static_cast<size_t>(n_pages + 1) * 4));  // (+1: the stamp)
    DHS_CUDA_CHECK(cudaMemset(last_use_d_, 0, static_cast<size_t>(n_pages + 1) * 4));
    stamp_d_ = last_use_d_ + n_pages;
    read_d_ = static_cast<int32_t*>(dalloc(static_cast<size_t>(n_pages + 1) * 4));  // (+1: the count)
    DHS_CUDA_CHECK(cudaMallocHost(&read_count_h_, 4));
    DHS_CUDA_CHECK(cudaMallocHost(&stamp_h_, 4));
    DHS_CUDA_CHECK(cudaMallocHost(&last_use_h_, static_cast<size_t>(n_pages) * 4));
    land_d_ = static_cast<int32_t*>(dalloc(static_cast<size_t>(7 * kLandMax + 3) * 4));
    DHS_CUDA_CHECK(cudaMemset(land_d_ + kLandMax, 0, 12));
    land_keys_d_ = static_cast<int32_t*>(dalloc(static_cast<size_t>(split_->max_nnz()) * 4));
    DHS_CUDA_CHECK(cudaMallocHost(&land_h_, static_cast<size_t>(kLandMax + 3) * 4));
    if (o.land_overlap.enabled()) {
      overlap_next_ = o.land_overlap.mode == LandOverlapRule::Mode::On;  // (auto: the first step has no claims yet)
      DHS_CUDA_CHECK(cudaStreamCreateWithFlags(&side_stream_, cudaStreamNonBlocking));
      DHS_CUDA_CHECK(cudaEventCreateWithFlags(&ev_fork_, cudaEventDisableTiming));
      DHS_CUDA_CHECK(cudaEventCreateWithFlags(&ev_join_, cudaEventDisableTiming));
      split_landed_ = std::make_unique<cuda::TierSplitLists>(split_->max_rows(), split_->max_nnz());
      land_att_d_ = static_cast<__half*>(dalloc(static_cast<size_t>(max_tokens_ * Hq * D) * 2));
      land_lse_d_ = static_cast<float*>(dalloc(static_cast<size_t>(max_tokens_ * Hq) * 4));
      dws_side_ = std::make_unique<cuda::DecodeAttentionWorkspace>(static_cast<int>(max_attn_), static_cast<int>(Hq),
                                                                   static_cast<int>(Hkv), static_cast<int>(D), 1);
    }
  }
  const cuda::PageSelector::Sizes sel_sizes{static_cast<int>(L), static_cast<int>(Hq), static_cast<int>(Hkv), static_cast<int>(D),
                                            o.page_size, static_cast<int>(max_attn_), pages_per_seq_,
                                            o.verify_selection == "all-rows" || unite ? o.max_verify_rows : 1};
  selector_ = std::make_unique<cuda::PageSelector>(
      sel_sizes, cuda::PageSelector::Inputs{sum_minmax_.get(), sum_meanvar_.get(), sketch_.get(),
                                            cuda::LayerLists{indptr_d_, slots_d_, page_pos_d_}, seq_len_d_, q_d_, q_indptr_d_,
                                            table_->table_d(), req_slot_d_});
}

LlamaCuda::LlamaCuda(const WeightSource& src, const CudaModelOptions& o) : cfg_(src.config()) {
  allocate(o);
  const int64_t H = cfg_.hidden, D = cfg_.head_dim, Hq = cfg_.n_heads_q, Hkv = cfg_.n_heads_kv, F = cfg_.ffn_hidden;
  const int64_t V = cfg_.vocab_size;
  auto up_f16 = [&](const std::vector<float>& f) {
    std::vector<uint16_t> b(f.size());
    for (size_t i = 0; i < f.size(); ++i) b[i] = weight_f16(f[i]);
    auto* d = static_cast<__half*>(dalloc(b.size() * 2));
    DHS_CUDA_CHECK(cudaMemcpy(d, b.data(), b.size() * 2, cudaMemcpyHostToDevice));
    weight_bytes_ += b.size() * 2;
    return d;
  };
  auto up_f32 = [&](const std::vector<float>& f) {
    auto* d = static_cast<float*>(dalloc(f.size() * 4));
    DHS_CUDA_CHECK(cudaMemcpy(d, f.data(), f.size() * 4, cudaMemcpyHostToDevice));
    return d;
  };
  tok_embd_ = up_f16(load_tensor_f32(src, "token_embd.weight", {V, H}));  // (f16 for the gather)
  output_ = upload_weight(src, {{cfg_.tied_embeddings ? "token_embd.weight" : "output.weight", V}}, H,
                          /*projection=*/false);
  output_norm_ = up_f32(load_tensor_f32(src, "output_norm.weight", {H}));
  layers_.resize(static_cast<size_t>(cfg_.n_layers));
  for (int64_t l = 0; l < cfg_.n_layers; ++l) {
    Layer& L = layers_[static_cast<size_t>(l)];
    const std::string p = fmt::format("blk.{}.", l);
    L.attn_norm = up_f32(load_tensor_f32(src, p + "attn_norm.weight", {H}));
    L.ffn_norm = up_f32(load_tensor_f32(src, p + "ffn_norm.weight", {H}));
    // Fused projections: rows [q; k; v] and [gate; up]; fp8: FP8 whatever the options say.
    const auto projections = [&](Layer& to, bool fp8) {
      to.w_qkv = upload_weight(src, {{p + "attn_q.weight", Hq * D}, {p + "attn_k.weight", Hkv * D}, {p + "attn_v.weight", Hkv * D}},
                               H, true, fp8);
      to.w_o = upload_weight(src, {{p + "attn_output.weight", H}}, Hq * D, true, fp8);
      to.w_gu = upload_weight(src, {{p + "ffn_gate.weight", F}, {p + "ffn_up.weight", F}}, H, true, fp8);
      to.w_down = upload_weight(src, {{p + "ffn_down.weight", H}}, F, true, fp8);
    };
    projections(L, false);
    if (cfg_.qkv_bias) {
      L.bq = up_f32(load_tensor_f32(src, p + "attn_q.bias", {Hq * D}));
      L.bk = up_f32(load_tensor_f32(src, p + "attn_k.bias", {Hkv * D}));
      L.bv = up_f32(load_tensor_f32(src, p + "attn_v.bias", {Hkv * D}));
    }
    if (cfg_.qk_norm) {
      L.q_norm = up_f32(load_tensor_f32(src, p + "attn_q_norm.weight", {D}));
      L.k_norm = up_f32(load_tensor_f32(src, p + "attn_k_norm.weight", {D}));
    }
    if (opt_.draft_fp8) {
      // The drafts' FP8 copies (CudaModelOptions::draft_fp8), quantized as --quantization fp8 does.
      for (const cuda::DeviceWeight* w : {&L.w_qkv, &L.w_o, &L.w_gu, &L.w_down})
        DHS_CHECK(w->plain_f16(), "--draft-quantization fp8 needs f16 projections (--gpu-weights f16, or an f16 / bf16 "
                                  "checkpoint): over a block format FP8 would not read fewer bytes");
      Layer Dl = L;
      const size_t before = weight_bytes_;
      projections(Dl, true);
      draft_weight_bytes_ += weight_bytes_ - before;
      draft_layers_.push_back(Dl);
    }
  }
  reserve_dequant_scratch();
  allocate_kv();
  build_params();
}

void LlamaCuda::reserve_dequant_scratch() {
  // The dequantization scratch of steps above Gemm::kQuantTileRows rows, for the largest matrix
  // kept in a block format.
  size_t scratch = 0;
  const auto need = [&](const cuda::DeviceWeight& w) {
    if (!w.plain_f16()) scratch = std::max(scratch, static_cast<size_t>(w.out * w.in));
  };
  need(output_);
  for (const std::vector<Layer>* set : {&layers_, &draft_layers_})
    for (const Layer& L : *set) {
      need(L.w_qkv);
      need(L.w_o);
      need(L.w_gu);
      need(L.w_down);
    }
  if (scratch > 0) gemm_->reserve_dequant(scratch);
}

size_t LlamaCuda::step_weight_bytes(bool draft) const {
  const size_t model = weight_bytes_ - draft_weight_bytes_;
  if (!draft || draft_layers_.empty()) return model;
  size_t proj = 0;
  for (const Layer& L : layers_) proj += L.w_qkv.bytes + L.w_o.bytes + L.w_gu.bytes + L.w_down.bytes;
  return model - proj + draft_weight_bytes_;
}

cuda::WeightPart LlamaCuda::alloc_packed(PackedFormat f, int64_t rows, int64_t in) {
  // One allocation: codes, then meta, then row scales (each 16-byte aligned).
  cuda::WeightPart p;
  p.rows = rows;
  p.packed = true;
  p.pk.format = f;
  p.pk.rows = rows;
  p.pk.in = in;
  p.pk.chunks = (in + kPackChunk - 1) / kPackChunk;
  const size_t n = static_cast<size_t>(rows * p.pk.chunks);
  const size_t codes = n * static_cast<size_t>(packed_code_bytes(f));
  const size_t meta = packed_has_meta(f) ? n * kPackMetaBytes : 0;
  const size_t scales = f == PackedFormat::FP8 ? static_cast<size_t>(rows) * 4 : 0;
  auto* d = static_cast<uint8_t*>(dalloc(codes + meta + scales));
  p.pk.codes = d;
  p.pk.meta = meta ? d + codes : nullptr;
  p.pk.row_scale = scales ? reinterpret_cast<const float*>(d + codes + meta) : nullptr;
  return p;
}

cuda::WeightPart LlamaCuda::upload_packed(const PackedMatrix& m) {
  cuda::WeightPart p = alloc_packed(m.format, m.rows, m.in);
  auto* d = const_cast<uint8_t*>(p.pk.codes);
  DHS_CUDA_CHECK(cudaMemcpy(d, m.codes.data(), m.codes.size(), cudaMemcpyHostToDevice));
  if (p.pk.meta) DHS_CUDA_CHECK(cudaMemcpy(const_cast<uint8_t*>(p.pk.meta), m.meta.data(), m.meta.size(), cudaMemcpyHostToDevice));
  if (p.pk.row_scale)
    DHS_CUDA_CHECK(cudaMemcpy(const_cast<float*>(p.pk.row_scale), m.row_scale.data(), 4 * m.row_scale.size(),
                              cudaMemcpyHostToDevice));
  return p;
}

cuda::DeviceWeight LlamaCuda::upload_weight(const WeightSource& src, const std::vector<std::pair<std::string, int64_t>>& parts,
                                            int64_t in, bool projection, bool fp8) {
  DHS_CHECK(!parts.empty() && parts.size() <= cuda::DeviceWeight::kMaxParts, "weight of {} parts", parts.size());
  cuda::DeviceWeight w;
  w.in = in;
  // Each part: packed (FP8, or Q8_0 / Q4_K repacked), the file's bytes (a block format the v1
  // kernels read) or f16 values (16-byte rows).
  struct Host {
    DType type;
    int64_t rows, stride;
    std::vector<uint8_t> bytes;
    std::optional<PackedMatrix> packed;
  };
  std::vector<Host> host;
  bool all_f16 = true;
  for (const auto& [name, rows] : parts) {
    const RawTensor* t = &checked_tensor(src, name, {rows, in});
    if (projection && (opt_.fp8_weights || fp8)) {
      const std::vector<float> f = load_tensor_f32(src, name, {rows, in});
      host.push_back({DType::F16, rows, 0, {}, quantize_fp8_rows(f.data(), rows, in)});
      all_f16 = false;
      continue;
    }
    if (opt_.quantized_weights && opt_.packed_weights && packable(t->dtype)) {
      host.push_back({t->dtype, rows, 0, {}, pack_rows(t->dtype, t->data, rows, in)});
      all_f16 = false;
      continue;
    }
    const bool keep = opt_.quantized_weights && t->dtype != DType::F16 && cuda::quant_format_supported(t->dtype) &&
                      in % 32 == 0 && in % dtype_traits(t->dtype).block_elems == 0;
    Host h{keep ? t->dtype : DType::F16, rows, 0, {}, std::nullopt};
    if (keep) {
      const size_t row_bytes = dtype_row_bytes(t->dtype, in);
      h.stride = static_cast<int64_t>((row_bytes + 15) / 16 * 16);
      h.bytes.assign(static_cast<size_t>(rows * h.stride), 0);
      for (int64_t r = 0; r < rows; ++r)
        std::memcpy(h.bytes.data() + r * h.stride, t->data + static_cast<size_t>(r) * row_bytes, row_bytes);
      all_f16 = false;
    } else {
      const std::vector<float> f = load_tensor_f32(src, name, {rows, in});
      h.stride = (2 * in + 15) / 16 * 16;
      h.bytes.assign(static_cast<size_t>(rows * h.stride), 0);
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t i = 0; i < in; ++i) {
          const uint16_t b = weight_f16(f[static_cast<size_t>(r * in + i)]);
          std::memcpy(h.bytes.data() + r * h.stride + 2 * i, &b, 2);
        }
      all_f16 = all_f16 && h.stride == 2 * in;
    }
    host.push_back(std::move(h));
  }
  // Neighbouring packed parts of one format are one packed matrix (one launch): the planes are
  // row-major, so their rows stack.
  for (size_t i = 1; i < host.size();) {
    Host& a = host[i - 1];
    Host& b = host[i];
    if (a.packed && b.packed && a.packed->format == b.packed->format) {
      PackedMatrix& m = *a.packed;
      const PackedMatrix& n = *b.packed;
      m.codes.insert(m.codes.end(), n.codes.begin(), n.codes.end());
      m.meta.insert(m.meta.end(), n.meta.begin(), n.meta.end());
      m.row_scale.insert(m.row_scale.end(), n.row_scale.begin(), n.row_scale.end());
      m.rows += n.rows;
      a.rows += b.rows;
      host.erase(host.begin() + static_cast<std::ptrdiff_t>(i));
    } else {
      ++i;
    }
  }
  if (all_f16 && host.size() > 1) {  // one contiguous f16 matrix: the tensor-core GEMV and cuBLASLt
    for (size_t i = 1; i < host.size(); ++i) {
      host[0].bytes.insert(host[0].bytes.end(), host[i].bytes.begin(), host[i].bytes.end());
      host[0].rows += host[i].rows;
    }
    host.resize(1);
  }
  for (const Host& h : host) {
    if (h.packed) {
      w.part[w.n_parts++] = upload_packed(*h.packed);
      w.out += h.rows;
      w.bytes += cuda::packed_bytes(w.part[w.n_parts - 1].pk);
      continue;
    }
    auto* d = static_cast<uint8_t*>(dalloc(h.bytes.size()));
    DHS_CUDA_CHECK(cudaMemcpy(d, h.bytes.data(), h.bytes.size(), cudaMemcpyHostToDevice));
    w.part[w.n_parts++] = {h.type, d, h.rows, h.stride, false, {}};
    w.out += h.rows;
    w.bytes += h.bytes.size();
  }
  weight_bytes_ += w.bytes;
  return w;
}

LlamaCuda::LlamaCuda(const ModelConfig& cfg, uint64_t seed, const CudaModelOptions& o) : cfg_(cfg) {
  allocate(o);
  const int64_t H = cfg_.hidden, D = cfg_.head_dim, Hq = cfg_.n_heads_q, Hkv = cfg_.n_heads_kv, F = cfg_.ffn_hidden;
  const int64_t V = cfg_.vocab_size;
  // Uniform(-a, a) with a = sqrt(3 / fan_in): unit-variance outputs for unit-variance inputs.
  auto rnd = [&](int64_t rows, int64_t cols) {
    auto* d = static_cast<__half*>(dalloc(static_cast<size_t>(rows * cols) * 2));
    const float a = std::sqrt(3.0f / static_cast<float>(cols));
    cuda::fill_random_f16(d, static_cast<size_t>(rows * cols), seed++, -a, a, stream_);
    weight_bytes_ += static_cast<size_t>(rows * cols) * 2;
    return d;
  };
  auto ones = [&](int64_t n) {
    std::vector<float> f(static_cast<size_t>(n), 1.0f);
    auto* d = static_cast<float*>(dalloc(f.size() * 4));
    DHS_CUDA_CHECK(cudaMemcpy(d, f.data(), f.size() * 4, cudaMemcpyHostToDevice));
    return d;
  };
  // A projection in the format o.random_weights names: f16, or packed random codes.
  const std::string fmt = o.fp8_weights ? "fp8" : o.random_weights;
  DHS_CHECK(fmt == "f16" || fmt == "q8_0" || fmt == "q4_k" || fmt == "fp8",
            "random weights must be f16, q8_0, q4_k or fp8, got '{}'", fmt);
  auto proj = [&](int64_t rows, int64_t cols, const std::string& fm) {
    if (fm == "f16") return cuda::DeviceWeight::f16_matrix(rnd(rows, cols), rows, cols);
    const PackedFormat f = fm == "q8_0" ? PackedFormat::Q8_0 : fm == "q4_k" ? PackedFormat::Q4_K : PackedFormat::FP8;
    DHS_CHECK(f != PackedFormat::Q4_K || cols % 256 == 0, "q4_k random weights need widths that are multiples of 256");
    cuda::DeviceWeight w;
    w.out = rows;
    w.in = cols;
    w.n_parts = 1;
    w.part[0] = alloc_packed(f, rows, cols);
    cuda::fill_random_packed(w.part[0].pk, seed++, std::sqrt(3.0f / static_cast<float>(cols)), stream_);
    w.bytes = cuda::packed_bytes(w.part[0].pk);
    weight_bytes_ += w.bytes;
    return w;
  };
  DHS_CHECK(!o.draft_fp8 || fmt == "f16", "--draft-quantization fp8 needs f16 projections, the random weights are {}", fmt);
  uint64_t draft_seed = seed + (uint64_t{1} << 32);
  tok_embd_ = rnd(V, H);
  output_ = cuda::DeviceWeight::f16_matrix(cfg_.tied_embeddings ? tok_embd_ : rnd(V, H), V, H);
  output_norm_ = ones(H);
  layers_.resize(static_cast<size_t>(cfg_.n_layers));
  for (auto& L : layers_) {
    L.attn_norm = ones(H);
    L.ffn_norm = ones(H);
    const auto projections = [&](Layer& to, const std::string& fm) {
      to.w_qkv = proj((Hq + 2 * Hkv) * D, H, fm);
      to.w_o = proj(H, Hq * D, fm);
      to.w_gu = proj(2 * F, H, fm);
      to.w_down = proj(H, F, fm);
    };
    projections(L, fmt);
    if (o.draft_fp8) {  // (random FP8 codes: what a draft step reads, not a quantization of L's values)
      Layer Dl = L;
      const size_t before = weight_bytes_;
      const uint64_t main_seed = seed;
      seed = draft_seed;  // (their own seeds: the model's weights are the same with or without the copies)
      projections(Dl, "fp8");
      draft_seed = seed;
      seed = main_seed;
      draft_weight_bytes_ += weight_bytes_ - before;
      draft_layers_.push_back(Dl);
    }
  }
  reserve_dequant_scratch();
  allocate_kv();
  build_params();
  DHS_CUDA_CHECK(cudaStreamSynchronize(stream_));
}

LlamaCuda::~LlamaCuda() {
  if (late_count_h_) cudaFreeHost(late_count_h_);
  if (read_count_h_) cudaFreeHost(read_count_h_);
  if (stamp_h_) cudaFreeHost(stamp_h_);
  if (last_use_h_) cudaFreeHost(last_use_h_);
  if (mirror_h_) cudaFreeHost(mirror_h_);
  if (mirror_counts_h_) cudaFreeHost(mirror_counts_h_);
  if (patch_h_) cudaFreeHost(patch_h_);
  if (land_h_) cudaFreeHost(land_h_);
  if (move_h_) cudaFreeHost(move_h_);
  if (move_d_) cudaFree(move_d_);
  for (auto& [b, g] : graphs_) cudaGraphExecDestroy(g);
  for (void* p : allocs_) cudaFree(p);
  cudaFreeHost(staging_h_);
  if (union_h_) cudaFreeHost(union_h_);
  cudaFreeHost(samp_block_h_);
  cudaFreeHost(hist_stage_h_);
  cudaFreeHost(out_ids_h_);
  if (ev_launch_) cudaEventDestroy(ev_launch_);
  if (ev_kernels_done_) cudaEventDestroy(ev_kernels_done_);
  if (ev_fork_) cudaEventDestroy(ev_fork_);
  if (ev_join_) cudaEventDestroy(ev_join_);
  if (side_stream_) cudaStreamDestroy(side_stream_);
  if (stream_) cudaStreamDestroy(stream_);
}

// Host side of a step: the small per-step inputs, packed into pinned buffers and copied with
// one cudaMemcpyAsync per array (all before the kernels). Rows past the batch (a decode step
// padded to its graph's bucket) are inert: token 0 at position 0, no append slot (the append
// and summary kernels skip slot -1), no KV (seq_len 0: empty lists, attention output 0),
// greedy, no history; their sampled ids are never read.
int LlamaCuda::upload_step(const std::vector<Seq>& batch, int n_rows, bool split) {
  const int64_t L = cfg_.n_layers, Hkv = cfg_.n_heads_kv;
  const int n_req = static_cast<int>(batch.size());
  // Attention requests: one per sequence, or (split) one per row of a verify.
  int n_attn = 0;
  for (const Seq& s : batch) n_attn += split && s.verify ? static_cast<int>(s.n_new) : 1;
  DHS_CHECK(n_req >= 1 && n_req <= opt_.max_batch && n_attn <= n_rows && n_rows <= max_attn_,
            "CUDA step: batch of {} (max {}; {} attention requests of at most {})", n_req, opt_.max_batch, n_attn,
            max_attn_);
  int64_t T = n_rows - n_attn;  // the padding rows' tokens
  for (const Seq& s : batch) T += s.n_new;
  DHS_CHECK(T <= max_tokens_, "CUDA step: {} tokens (max {})", T, max_tokens_);
  int32_t* ids = staging_h_;
  int32_t* pos = ids + T;
  int32_t* dst = pos + T;               // [L, T, Hkv]
  int32_t* q_indptr = dst + L * T * Hkv;
  int32_t* seq_len = q_indptr + n_rows + 1;
  int32_t* req_slot = seq_len + n_rows;
  int32_t* sel_row = req_slot + n_rows;   // [n_rows] each request's last row
  int32_t* last_row = sel_row + n_rows;   // [n_out] the output rows
  const size_t O = static_cast<size_t>(max_out_);
  auto* samp_rows = reinterpret_cast<cuda::SamplingRow*>(samp_block_h_);
  auto* rng = reinterpret_cast<uint64_t*>(samp_block_h_ + O * sizeof(cuda::SamplingRow));
  auto* hist_off = reinterpret_cast<int64_t*>(samp_block_h_ + O * (sizeof(cuda::SamplingRow) + 8));
  auto* hist_len = reinterpret_cast<int32_t*>(samp_block_h_ + O * (sizeof(cuda::SamplingRow) + 16));
  // Output rows: each request's last row, every row of a verify (its earlier rows greedy, no
  // history: only the last row's draw is the request's).
  int64_t n_out = n_rows - n_attn;
  for (const Seq& s : batch) n_out += s.verify ? s.n_new : 1;
  DHS_CHECK(n_out <= max_out_, "CUDA step: {} output rows (the model keeps {}: max_verify_rows {})", n_out, max_out_,
            opt_.max_verify_rows);
  out_first_.assign(static_cast<size_t>(n_req), 0);
  q_indptr[0] = 0;
  int64_t t = 0, o = 0;
  int a = 0;  // attention request
  for (int r = 0; r < n_req; ++r) {
    const Seq& s = batch[static_cast<size_t>(r)];
    DHS_CHECK(s.req_slot >= 0 && s.req_slot < opt_.max_batch, "CUDA step: request slot {} outside [0, {})", s.req_slot,
              opt_.max_batch);
    DHS_CHECK(!s.verify || (s.n_new >= 1 && s.n_new <= opt_.max_verify_rows), "CUDA step: a verify of {} rows (max {})",
              s.n_new, opt_.max_verify_rows);
    DHS_CHECK(!s.verify || !s.sampling, "CUDA step: a verify request is not sampled");
    DHS_ASSERT(s.table->capacity_tokens() >= s.table->n_tokens() + s.n_new);
    for (int64_t i = 0; i < s.n_new; ++i, ++t) {
      DHS_CHECK(s.tokens[i] >= 0 && s.tokens[i] < cfg_.vocab_size, "token id {} out of range", s.tokens[i]);
      ids[t] = s.tokens[i];
      const int64_t p = s.table->n_tokens() + i;
      pos[t] = static_cast<int32_t>(p);
      for (int64_t l = 0; l < L; ++l)
        for (int64_t h = 0; h < Hkv; ++h) {
          int row;
          const PageRef pg = s.table->page_of_token(static_cast<int>(l), static_cast<int>(h), p, &row);
          DHS_CHECK(pg.tier == Tier::Device, "a step appends into a page of the host tier (layer {}, KV head {})", l, h);
          dst[(l * T + t) * Hkv + h] = pg.slot;
        }
    }
    if (split && s.verify) {
      for (int64_t j = 0; j < s.n_new; ++j, ++a) {  // row j: its own request, at its own position
        q_indptr[a + 1] = static_cast<int32_t>(t - s.n_new + j + 1);
        seq_len[a] = static_cast<int32_t>(s.table->n_tokens() + j + 1);
        req_slot[a] = s.req_slot;
        sel_row[a] = static_cast<int32_t>(t - s.n_new + j);
      }
    } else {
      q_indptr[a + 1] = static_cast<int32_t>(t);
      seq_len[a] = static_cast<int32_t>(s.table->n_tokens() + s.n_new);
      req_slot[a] = s.req_slot;
      sel_row[a] = static_cast<int32_t>(t - 1);
      ++a;
    }
    out_first_[static_cast<size_t>(r)] = o;
    for (int64_t i = s.verify ? t - s.n_new : t - 1; i < t - 1; ++i, ++o) {  // a verify's rows before its last
      last_row[o] = static_cast<int32_t>(i);
      samp_rows[o] = cuda::SamplingRow{};
      rng[o] = 0;
      hist_off[o] = 0;
      hist_len[o] = 0;
    }
    const int64_t lo = o++;  // the last row
    last_row[lo] = static_cast<int32_t>(t - 1);
    table_->sync(s.req_slot, *s.table, stream_);
    // Sampling: the row's parameters and draw, and its penalty history (new tokens only).
    samp_rows[lo] = s.sampling ? *s.sampling : cuda::SamplingRow{};
    rng[lo] = s.rng_offset;
    hist_off[lo] = 0;
    hist_len[lo] = 0;
    if (s.sampling && s.history && s.sampling->repetition_penalty != 1.0f && !s.history->empty()) {
      const std::vector<int32_t>& h = *s.history;
      const size_t slot = static_cast<size_t>(s.req_slot);
      const int64_t n = static_cast<int64_t>(h.size());
      DHS_CHECK(n <= hist_ld_, "CUDA step: a history of {} tokens (the context holds {})", n, hist_ld_ - 1);
      int64_t& have = hist_synced_[slot];
      if (have > n || (have > 0 && h[static_cast<size_t>(have - 1)] != hist_last_[slot])) have = 0;  // not an extension: re-send
      const int64_t from = s.history_window > 0 && n > s.history_window ? n - s.history_window : 0;
      have = std::max(have, from);  // tokens before the window are never read
      if (n > have) {
        if (hist_stage_used_ + (n - have) > hist_stage_cap_) {  // (a step of many long first histories)
          DHS_CUDA_CHECK(cudaStreamSynchronize(stream_));
          hist_stage_used_ = 0;
        }
        int32_t* stage = hist_stage_h_ + hist_stage_used_;
        std::memcpy(stage, h.data() + have, static_cast<size_t>(n - have) * 4);
        hist_stage_used_ += n - have;
        DHS_CUDA_CHECK(cudaMemcpyAsync(hist_d_ + static_cast<int64_t>(slot) * hist_ld_ + have, stage,
                                       static_cast<size_t>(n - have) * 4, cudaMemcpyHostToDevice, stream_));
      }
      have = n;
      hist_last_[slot] = h.back();
      hist_off[lo] = static_cast<int64_t>(slot) * hist_ld_ + from;
      hist_len[lo] = static_cast<int32_t>(n - from);
    }
  }
  DHS_ASSERT(a == n_attn);
  for (int r = n_attn; r < n_rows; ++r, ++t, ++o) {  // padding
    ids[t] = 0;
    pos[t] = 0;
    for (int64_t l = 0; l < L; ++l)
      for (int64_t h = 0; h < Hkv; ++h) dst[(l * T + t) * Hkv + h] = -1;
    q_indptr[r + 1] = static_cast<int32_t>(t + 1);
    seq_len[r] = 0;
    req_slot[r] = 0;
    last_row[o] = static_cast<int32_t>(t);
    sel_row[r] = static_cast<int32_t>(t);
    samp_rows[o] = cuda::SamplingRow{};
    rng[o] = 0;
    hist_off[o] = 0;
    hist_len[o] = 0;
  }
  DHS_ASSERT(o == n_out);
  auto cp = [&](int32_t* d, const int32_t* h, int64_t n) {
    DHS_CUDA_CHECK(cudaMemcpyAsync(d, h, static_cast<size_t>(n) * 4, cudaMemcpyHostToDevice, stream_));
  };
  cp(ids_d_, ids, T);
  cp(pos_d_, pos, T);
  // dst_slot_d_ is laid out [L, T_step, Hkv] with this step's T (the graph for batch B reads the same layout).
  cp(dst_slot_d_, dst, L * T * Hkv);
  cp(q_indptr_d_, q_indptr, n_rows + 1);
  cp(seq_len_d_, seq_len, n_rows);
  cp(req_slot_d_, req_slot, n_rows);
  cp(last_row_d_, last_row, n_out);
  cp(sel_row_d_, sel_row, n_rows);
  DHS_CUDA_CHECK(cudaMemcpyAsync(samp_block_d_, samp_block_h_, samp_block_bytes_, cudaMemcpyHostToDevice, stream_));
  // Per-row selections read as their union: each sequence's selection requests (its rows, in
  // token order) merge into one attention request, each padding row stays one; a merged
  // request's tokens are its last row's.
  if (!split || !union_h_ || host_pool_ ||
      std::none_of(batch.begin(), batch.end(), [](const Seq& s) { return s.verify && s.n_new > 1; }) ||
      std::any_of(batch.begin(), batch.end(), [](const Seq& s) { return !s.verify && s.n_new > 1; }))  // (a mixed step)
    return 0;
  int32_t* rows = union_h_;
  int32_t* len = union_h_ + max_attn_ + 1;
  int32_t* slot = len + max_attn_;
  int32_t* score_req = slot + max_attn_;  // per row
  int32_t* vec0 = score_req + max_attn_;  // per row
  const int group = static_cast<int>(cfg_.n_heads_q / cfg_.n_heads_kv);
  int n_union = 0, a0 = 0;
  rows[0] = 0;
  for (const Seq& s : batch) {
    const int n = s.verify ? static_cast<int>(s.n_new) : 1;
    for (int j = 0; j < n; ++j) {
      score_req[a0 + j] = n_union;
      vec0[a0 + j] = j * group;
    }
    a0 += n;
    rows[n_union + 1] = a0;
    len[n_union] = seq_len[a0 - 1];
    slot[n_union] = req_slot[a0 - 1];
    ++n_union;
  }
  for (int r = n_attn; r < n_rows; ++r) {
    score_req[r] = n_union;
    vec0[r] = 0;
    rows[n_union + 1] = r + 1;
    len[n_union] = 0;
    slot[n_union] = 0;
    ++n_union;
  }
  cp(union_rows_d_, rows, n_union + 1);
  cp(union_seq_d_, len, n_union);
  cp(union_req_slot_d_, slot, n_union);
  cp(union_score_req_d_, score_req, n_rows);
  cp(union_vec0_d_, vec0, n_rows);
  return n_union;
}

void LlamaCuda::set_sampled_vocab(int64_t n) {
  DHS_CHECK(n >= 1 && n <= cfg_.vocab_size, "sampled vocabulary {} outside [1, {}]", n, cfg_.vocab_size);
  if (sample_.vocab == static_cast<int>(n)) return;
  sample_.vocab = static_cast<int>(n);
  for (auto& [k, g] : graphs_) cudaGraphExecDestroy(g);  // they bake the sampler's vocabulary
  graphs_.clear();
  n_verify_graphs_ = 0;
}

void LlamaCuda::reset_history(int req_slot) {
  DHS_CHECK(req_slot >= 0 && req_slot < opt_.max_batch, "request slot {} outside [0, {})", req_slot, opt_.max_batch);
  hist_synced_[static_cast<size_t>(req_slot)] = 0;
  hist_last_[static_cast<size_t>(req_slot)] = -1;
}

int LlamaCuda::bucket(int n, int cap) {
  int b = 1;
  while (b < n) b *= 2;
  return std::min(b, cap);
}

void LlamaCuda::build_params() {
  const int64_t H = cfg_.hidden, D = cfg_.head_dim, Hq = cfg_.n_heads_q, Hkv = cfg_.n_heads_kv, F = cfg_.ffn_hidden;
  const int64_t V = cfg_.vocab_size, QKV = (Hq + 2 * Hkv) * D;
  const int hq = static_cast<int>(Hq), hkv = static_cast<int>(Hkv), d = static_cast<int>(D);
  const float scale = 1.0f / std::sqrt(static_cast<float>(D));
  embed_ = {.table = tok_embd_, .ids = ids_d_, .out = x_d_, .out_dtype = DType::F32, .vocab = V, .hidden = H};
  // h = rmsnorm(x) (the previous GEMM added its output into x).
  norm_ = {.x = x_d_, .y = h_d_, .n = H, .eps = cfg_.rms_eps};
  // q, k, v are views of the fused QKV GEMM's output.
  rope_ = {.q = qkv_d_, .k = qkv_d_ + Hq * D, .v = qkv_d_ + (Hq + Hkv) * D, .in_dtype = DType::F16,
           .q_ld = QKV, .k_ld = QKV, .v_ld = QKV, .norm_eps = cfg_.rms_eps, .q_out = q_d_, .q_out_ld = Hq * D,
           .pos = pos_d_, .inv_freq = inv_freq_, .style = cfg_.rope_style, .k_pool = pool_->k_d(), .v_pool = pool_->v_d(),
           .n_pages = pool_->n_pages(), .page_size = opt_.page_size, .n_heads_q = hq, .n_heads_kv = hkv, .head_dim = d};
  for (cuda::DevicePageSummaries* store : {sum_minmax_.get(), sum_meanvar_.get()})
    if (store)
      summarize_.push_back({.k_pool = pool_->k_d(), .summaries = store->data_d(), .pos = pos_d_, .kind = store->kind(),
                            .n_pages = pool_->n_pages(), .page_size = opt_.page_size, .n_heads_kv = hkv, .head_dim = d});
  if (sketch_)
    sketch_keys_.push_back({.k_pool = pool_->k_d(), .codes = sketch_->codes_d(), .steps = sketch_->steps_d(), .pos = pos_d_,
                            .n_pages = pool_->n_pages(), .page_size = opt_.page_size, .n_heads_kv = hkv, .head_dim = d});
  dense_lists_ = {.table = table_->table_d(), .req_slot = req_slot_d_, .seq_len = seq_len_d_, .indptr = indptr_d_,
                  .slots = slots_d_, .page_pos = page_pos_d_, .n_layers = static_cast<int>(cfg_.n_layers),
                  .n_heads_kv = hkv, .max_pages = table_->max_pages(), .page_size = opt_.page_size};
  decode_attn_ = {.q = q_d_, .out = att_d_, .q_indptr = q_indptr_d_, .seq_len = seq_len_d_, .k_pool = pool_->k_d(),
                  .v_pool = pool_->v_d(), .ws_o = dws_->o_d(), .ws_state = dws_->state_d(), .n_heads_q = hq,
                  .n_heads_kv = hkv, .head_dim = d, .max_q_len = 1, .ws_q_vecs = dws_->q_vecs(),
                  .n_workers = dws_->n_workers(), .stages = dws_->stages(), .scale = scale};
  prefill_attn_ = {.q = q_d_, .out = att_d_, .k_pool = pool_->k_d(), .v_pool = pool_->v_d(), .q_indptr = q_indptr_d_,
                   .kv_indptr = indptr_d_, .slots = slots_d_, .page_pos = page_pos_d_, .seq_len = seq_len_d_,
                   .n_heads_q = hq, .n_heads_kv = hkv, .head_dim = d, .page_size = opt_.page_size, .scale = scale};
  // The fused gate/up GEMM's output: [gate | up] per token.
  swiglu_ = {.gate = gu_d_, .up = gu_d_ + F, .in_dtype = DType::F16, .in_ld = 2 * F, .out = act_d_, .out_ld = F, .n = F};
  last_rows_ = {.src = x_d_, .rows = last_row_d_, .dst = last_x_d_, .n = H};
  final_norm_ = {.x = last_x_d_, .weight = output_norm_, .y = hlast_d_, .n = H, .eps = cfg_.rms_eps};
  sample_ = {.logits = logits_d_, .rows = samp_rows_d_, .history = hist_d_, .history_len = hist_len_d_,
             .history_off = hist_off_d_, .rng_offset = rng_d_, .out = out_ids_d_, .vocab = static_cast<int>(V),
             .logits_ld = V};
}

// The model, as one step runs it on the stream (and as the decode graph captures it).
void LlamaCuda::run_layers(const Step& s) {
  const int64_t T = s.n_tok;
  const bool log_late = host_pool_ && s.n_dec > 0;  // (the late reads' count starts at 0)
  overlap_now_ = s.overlap;
  if (log_late) {
    DHS_CUDA_CHECK(cudaMemsetAsync(late_log_d_ + 3 * late_cap_, 0, 4, stream_));
    DHS_CUDA_CHECK(cudaMemsetAsync(read_d_ + pool_->n_pages(), 0, 4, stream_));
    DHS_CUDA_CHECK(cudaMemsetAsync(land_d_ + kLandMax, 0, 8, stream_));  // landing claims, bad
  }
  embed(s.n_tok);                                                            // x = tok_embd[ids] (fp32)
  for (int l = 0; l < static_cast<int>(cfg_.n_layers); ++l) {
    const Layer& w = (s.draft ? draft_layers_ : layers_)[static_cast<size_t>(l)];
    rms_norm(w.attn_norm, s.n_tok);                                          // h = rmsnorm(x)
    gemm_->run(w.w_qkv, h_d_, qkv_d_, T, cuda::GemmOut::F16, stream_);  // [q k v] = h W_qkv^T
    rope_append(l, s.n_tok);                                                 // q, k rotated; k, v into pages
    selector_->join(stream_);                                                // (the last layer's seed record)
    if (!s.plan.window_only || s.n_dec < s.n_req) dense_lists(l, s.n_req);  // every page of this layer
    if (s.decode && s.n_union > 0) {
      // Each row's own pages, read once; the rows scored once, as their sequence.
      attention_decode_united(select_united(l, s), s);
    } else if (s.decode) {
      attention_policy(l, s.n_req, s.max_q, s.n_tok, s.plan);  // the pages the policy keeps
    } else {
      // A mixed step's decode and verify requests (the first n_dec) under the policy, as a
      // decode-like step reads them; the prompt chunks' rows after them, dense.
      if (s.n_dec > 0) attention_policy(l, s.n_dec, s.dec_max_q, s.dec_rows, s.plan);
      attention_prefill(s.n_dec, s.dec_rows, s.n_tok, s.n_req);
    }
    gemm_->run(w.w_o, att_d_, x_d_, T, cuda::GemmOut::F32, stream_, 1.0f);  // x += att W_o^T
    rms_norm(w.ffn_norm, s.n_tok);                                           // h = rmsnorm(x)
    gemm_->run(w.w_gu, h_d_, gu_d_, T, cuda::GemmOut::F16, stream_);  // [gate up] = h W_gu^T
    swiglu(s.n_tok);                                                         // act = silu(gate) up
    gemm_->run(w.w_down, act_d_, x_d_, T, cuda::GemmOut::F32, stream_, 1.0f);  // x += act W_down^T
  }
  selector_->join(stream_);
  if (log_late) {  // the counts of the step's late and resident reads (the entries follow after the step)
    DHS_CUDA_CHECK(cudaMemcpyAsync(late_count_h_, late_log_d_ + 3 * late_cap_, 4, cudaMemcpyDeviceToHost, stream_));
    DHS_CUDA_CHECK(cudaMemcpyAsync(read_count_h_, read_d_ + pool_->n_pages(), 4, cudaMemcpyDeviceToHost, stream_));
    DHS_CUDA_CHECK(cudaMemcpyAsync(land_h_ + kLandMax, land_d_ + kLandMax, 8, cudaMemcpyDeviceToHost, stream_));
  }
  logits_and_sample(s.n_out);                                                // output rows -> ids
}

void LlamaCuda::embed(int n_tok) {
  cuda::EmbeddingParams p = embed_;
  p.n_tok = n_tok;
  cuda::launch_embedding(p, stream_);
}

void LlamaCuda::rms_norm(const float* weight, int n_tok) {
  cuda::AddRmsNormParams p = norm_;
  p.weight = weight;
  p.n_rows = n_tok;
  cuda::launch_add_rms_norm(p, stream_);
}

void LlamaCuda::rope_append(int layer, int n_tok) {
  const Layer& w = layers_[static_cast<size_t>(layer)];
  cuda::RopeAppendParams p = rope_;
  p.q_bias = w.bq;
  p.k_bias = w.bk;
  p.v_bias = w.bv;
  p.q_norm = w.q_norm;
  p.k_norm = w.k_norm;
  // dst_slot_d_ is laid out [L, T, Hkv] with this step's T (upload_step).
  p.dst_slot = dst_slot_d_ + static_cast<int64_t>(layer) * n_tok * cfg_.n_heads_kv;
  p.n_tok = n_tok;
  cuda::launch_rope_append(p, stream_);
  // Every step keeps the summaries (and sketch) of the pages it wrote (prefill too: decode scores them).
  for (cuda::SummarizePagesParams sm : summarize_) {
    sm.dst_slot = p.dst_slot;
    sm.n_tok = n_tok;
    cuda::launch_summarize_pages(sm, stream_);
  }
  for (cuda::SketchKeysParams sk : sketch_keys_) {
    sk.dst_slot = p.dst_slot;
    sk.n_tok = n_tok;
    cuda::launch_sketch_keys(sk, stream_);
  }
}

// The dense policy, on the device: this layer's page lists from the device page table.
void LlamaCuda::dense_lists(int layer, int n_req) {
  cuda::DenseListsParams p = dense_lists_;
  p.n_requests = n_req;
  p.layer = layer;
  cuda::launch_dense_lists(p, stream_);
}

cuda::DecodeAttentionParams LlamaCuda::decode_params(int max_q, int n_req) const {
  cuda::DecodeAttentionParams p = decode_attn_;
  if (max_q > 1) {  // verify rows: the smallest workspace (kernel form) that takes them
    const cuda::DecodeAttentionWorkspace* ws =
        dws_verify_[0] && max_q <= dws_verify_[0]->max_q_len() ? dws_verify_[0].get() : dws_verify_[1].get();
    DHS_ASSERT(ws && max_q <= ws->max_q_len() && n_req <= ws->max_requests());
    p.ws_o = const_cast<cuda::DecodeAttentionWorkspace*>(ws)->o_d();
    p.ws_state = const_cast<cuda::DecodeAttentionWorkspace*>(ws)->state_d();
    p.ws_q_vecs = ws->q_vecs();
    p.n_workers = ws->n_workers();
    p.stages = ws->stages();
    p.max_q_len = ws->max_q_len();
  }
  return p;
}

void LlamaCuda::attention_policy(int layer, int n, int max_q, int rows, const cuda::SelectPlan& plan) {
  if (max_q > 1 && plan.runs_policy && opt_.verify_selection == "last-row") {
    // A verify's shared selection from its last row's queries (CudaModelOptions::verify_selection).
    cuda::GatherRowsParams g{.src = reinterpret_cast<const float*>(q_d_), .rows = sel_row_d_,
                             .dst = reinterpret_cast<float*>(sel_q_d_), .n_out = n,
                             .n = cfg_.n_heads_q * cfg_.head_dim / 2};  // (f16 rows moved as pairs)
    cuda::launch_gather_rows(g, stream_);
    attention_decode(selector_->select(layer, n, plan, stream_, sel_q_d_, sel_q_indptr_d_), n, max_q, layer, rows);
  } else {
    attention_decode(selector_->select(layer, n, plan, stream_), n, max_q, layer, rows);
  }
}

void LlamaCuda::attention_decode(const cuda::LayerLists& lists, int n_req, int max_q, int layer, int n_tok) {
  cuda::DecodeAttentionParams p = decode_params(max_q, n_req);
  p.kv_indptr = lists.indptr;
  p.kv_slots = lists.slots;
  p.kv_page_pos = lists.page_pos;
  p.n_requests = n_req;
  if (!host_pool_) {
    cuda::launch_decode_attention(p, stream_);
    return;
  }
  // The recall-ahead schedule (tier_split.h): the lists' keys split by tier, attention over the
  // resident part from HBM and over the late part in place from the host tier, merged by LSE.
  const int n_rows = n_req * static_cast<int>(cfg_.n_heads_kv);
  // Landing first (tier_land.h): late pages copied into the step's reserved HBM slots as far as
  // they go, the keys rewritten into land_keys_d_ (the selection's lists stay as they are).
  cuda::LandLateParams land;
  land.indptr = lists.indptr;
  land.slots = lists.slots;
  land.slots_out = land_keys_d_;
  land.page_pos = lists.page_pos;
  land.n_rows = n_rows;
  land.n_device = static_cast<int32_t>(pool_->n_pages());
  land.n_host = host_pool_->n_pages();
  land.land_slots = land_d_;
  land.land_n = land_d_ + kLandMax;
  land.n_bad = land_d_ + kLandMax + 1;
  land.land_avail = land_d_ + kLandMax + 2;
  land.land_cap = kLandMax;
  land.log = land_d_ + kLandMax + 3;
  land.layer = layer;
  land.host_k = host_pool_->k_d();
  land.host_v = host_pool_->v_d();
  land.dev_k = pool_->k_d();
  land.dev_v = pool_->v_d();
  land.page_words = static_cast<int>(pool_->page_elems() / 8);
  // (the page adopted where it lands: its table entry, its sketch and summary rows)
  land.table = table_->entries_d();
  land.req_slot = req_slot_d_;
  land.n_lists = table_->n_lists();
  land.max_pages = table_->max_pages();
  land.n_heads_kv = static_cast<int>(cfg_.n_heads_kv);
  const int64_t ps = opt_.page_size, D = cfg_.head_dim;
  const auto follow = [&](void* base, int64_t row_bytes) { land.follow[land.n_follow++] = {base, row_bytes}; };
  if (sketch_) {
    follow(sketch_->codes_d(), ps * (D / 2));
    follow(sketch_->steps_d(), ps * 4);
  }
  for (cuda::DevicePageSummaries* st : {sum_minmax_.get(), sum_meanvar_.get()})
    if (st) follow(st->data_d(), 2 * D * 2);
  const cuda::TierSplitLog log{late_log_d_, late_log_d_ + 3 * late_cap_, late_cap_, layer, last_use_d_, stamp_d_, read_d_,
                               read_d_ + pool_->n_pages(), static_cast<int>(pool_->n_pages())};
  const int n_heads = n_tok * static_cast<int>(cfg_.n_heads_q), hd = static_cast<int>(cfg_.head_dim);
  if (overlap_now_ && max_q == 1) {  // CudaModelOptions::land_overlap
    // The resident part split off (the late part kept as keys, to be landed); its reads stamped,
    // no late entry logged here: the second split logs those that stay late, and stamps the landed.
    cuda::TierSplitLog stamps = log;
    stamps.entries = nullptr;
    stamps.count = nullptr;
    stamps.cap = 0;
    cuda::split_lists_by_tier(lists.indptr, lists.slots, lists.page_pos, n_rows, pool_->n_pages(), *split_, stream_, stamps,
                              /*late_keys=*/true);
    DHS_CUDA_CHECK(cudaEventRecord(ev_fork_, stream_));
    DHS_CUDA_CHECK(cudaStreamWaitEvent(side_stream_, ev_fork_, 0));
    // Second stream: the late part lands and is split again; its landed part attended from HBM,
    // the rest in place from the host tier, the two merged (its own attention workspace).
    land.indptr = split_->late_indptr();
    land.slots = split_->late_slots();
    land.page_pos = split_->late_page_pos();
    cuda::launch_land_late(land, side_stream_);
    cuda::split_lists_by_tier(split_->late_indptr(), land_keys_d_, split_->late_page_pos(), n_rows, pool_->n_pages(),
                              *split_landed_, side_stream_, log);
    cuda::DecodeAttentionParams landed = p;
    landed.ws_o = dws_side_->o_d();
    landed.ws_state = dws_side_->state_d();
    landed.ws_q_vecs = dws_side_->q_vecs();
    landed.n_workers = dws_side_->n_workers();
    landed.stages = dws_side_->stages();
    landed.kv_indptr = split_landed_->dev_indptr();
    landed.kv_slots = split_landed_->dev_slots();
    landed.kv_page_pos = split_landed_->dev_page_pos();
    landed.out = land_att_d_;
    landed.lse = land_lse_d_;
    cuda::launch_decode_attention(landed, side_stream_);
    cuda::DecodeAttentionParams late = landed;
    late.kv_indptr = split_landed_->late_indptr();
    late.kv_slots = split_landed_->late_slots();
    late.kv_page_pos = split_landed_->late_page_pos();
    late.k_pool = host_pool_->k_d();
    late.v_pool = host_pool_->v_d();
    late.out = late_att_d_;
    late.lse = late_lse_d_;
    cuda::launch_decode_attention(late, side_stream_);
    cuda::launch_merge_late({land_att_d_, land_lse_d_, late_att_d_, late_lse_d_, n_heads, hd}, side_stream_);
    DHS_CUDA_CHECK(cudaEventRecord(ev_join_, side_stream_));
    // This stream: the resident part meanwhile, then the join and the merge. Its grid is one wave
    // of the SMs' attention blocks; it leaves two blocks' room per landing block (a list's, 8
    // warps), so that neither waits for the other's blocks to drain (a wave of either launched first
    // would otherwise hold the SMs) — unless that would take more than half the grid.
    const int spare = 2 * n_rows * cuda::kDecodeWarpsPerBlock;
    if (p.n_workers - spare >= p.n_workers / 2) p.n_workers -= spare;
    p.kv_indptr = split_->dev_indptr();
    p.kv_slots = split_->dev_slots();
    p.kv_page_pos = split_->dev_page_pos();
    p.lse = lse_d_;
    cuda::launch_decode_attention(p, stream_);
    DHS_CUDA_CHECK(cudaStreamWaitEvent(stream_, ev_join_, 0));
    cuda::launch_merge_late({att_d_, lse_d_, land_att_d_, land_lse_d_, n_heads, hd}, stream_);
    return;
  }
  cuda::launch_land_late(land, stream_);
  cuda::split_lists_by_tier(lists.indptr, land_keys_d_, lists.page_pos, n_rows, pool_->n_pages(), *split_, stream_, log);
  p.kv_indptr = split_->dev_indptr();
  p.kv_slots = split_->dev_slots();
  p.kv_page_pos = split_->dev_page_pos();
  p.lse = lse_d_;
  cuda::launch_decode_attention(p, stream_);
  cuda::DecodeAttentionParams late = p;
  late.kv_indptr = split_->late_indptr();
  late.kv_slots = split_->late_slots();
  late.kv_page_pos = split_->late_page_pos();
  late.k_pool = host_pool_->k_d();
  late.v_pool = host_pool_->v_d();
  late.out = late_att_d_;
  late.lse = late_lse_d_;
  cuda::launch_decode_attention(late, stream_);
  cuda::launch_merge_late({att_d_, lse_d_, late_att_d_, late_lse_d_, n_heads, hd}, stream_);
}

cuda::LayerLists LlamaCuda::select_united(int layer, const Step& s) {
  // (DHS_UNION_SCORE_ROWS: a study switch — each row scored on its own, as the per-row form
  // scores, so the merge and masked attention can be told apart from the one scoring's rounding.)
  static const bool score_rows = std::getenv("DHS_UNION_SCORE_ROWS") != nullptr;
  if (!s.plan.runs_policy || s.plan.window_only || score_rows) return selector_->select(layer, s.n_req, s.plan, stream_);
  // The merged requests' dense lists of this layer (their sequences at their last rows' tokens).
  cuda::DenseListsParams d = dense_lists_;
  d.req_slot = union_req_slot_d_;
  d.seq_len = union_seq_d_;
  d.indptr = union_dense_indptr_d_;
  d.slots = union_dense_slots_d_;
  d.page_pos = union_dense_pos_d_;
  d.n_requests = s.n_union;
  d.layer = layer;
  cuda::launch_dense_lists(d, stream_);
  const cuda::PageSelector::ScoreFrom from{cuda::LayerLists{union_dense_indptr_d_, union_dense_slots_d_, union_dense_pos_d_},
                                           union_seq_d_, union_rows_d_, s.n_union, union_score_req_d_, union_vec0_d_,
                                           s.union_max_q};
  return selector_->select(layer, s.n_req, s.plan, stream_, nullptr, nullptr, &from);
}

void LlamaCuda::attention_decode_united(const cuda::LayerLists& rows, const Step& s) {
  DHS_ASSERT(!host_pool_ && union_scratch_ && s.union_max_q <= opt_.max_verify_rows);
  cuda::RowUnionParams u;
  u.in_indptr = rows.indptr;
  u.in_slots = rows.slots;
  u.in_page_pos = rows.page_pos;
  u.row_indptr = union_rows_d_;
  u.seq_len = union_seq_d_;
  u.n_out = s.n_union;
  u.n_heads_kv = static_cast<int>(cfg_.n_heads_kv);
  u.page_size = static_cast<int>(opt_.page_size);
  u.out_indptr = union_indptr_d_;
  u.out_slots = union_slots_d_;
  u.out_page_pos = union_pos_d_;
  u.out_row_mask = union_mask_d_;
  union_scratch_->bind(u);
  cuda::launch_row_union(u, stream_);
  cuda::DecodeAttentionParams p = decode_params(s.union_max_q, s.n_union);
  // (one token row per selection request, in order: the merged requests' row ranges are their q_indptr)
  p.q_indptr = union_rows_d_;
  p.seq_len = union_seq_d_;
  p.kv_indptr = union_indptr_d_;
  p.kv_slots = union_slots_d_;
  p.kv_page_pos = union_pos_d_;
  p.kv_row_mask = union_mask_d_;
  p.n_requests = s.n_union;
  cuda::launch_decode_attention(p, stream_);
  if (union_check_.on) check_row_union_layer(rows, s);
}

// The probe: the step's split lists and their merge copied back, the merge recomputed by the CPU
// statement (which refuses duplicates and conflicting slots), differences printed.
void LlamaCuda::check_row_union_layer(const cuda::LayerLists& rows, const Step& s) {
  DHS_CUDA_CHECK(cudaStreamSynchronize(stream_));
  const int hkv = static_cast<int>(cfg_.n_heads_kv);
  auto get = [&](const auto* d, size_t n) {
    std::vector<std::remove_const_t<std::remove_pointer_t<decltype(d)>>> h(n);
    if (n) DHS_CUDA_CHECK(cudaMemcpy(h.data(), d, n * sizeof(h[0]), cudaMemcpyDeviceToHost));
    return h;
  };
  PageLists in;
  in.n_requests = s.n_req;
  in.n_heads_kv = hkv;
  in.indptr = get(rows.indptr, static_cast<size_t>(s.n_req * hkv + 1));
  in.slots = get(rows.slots, static_cast<size_t>(in.indptr.back()));
  in.page_pos = get(rows.page_pos, static_cast<size_t>(in.indptr.back()));
  in.seq_len = get(seq_len_d_, static_cast<size_t>(s.n_req));
  const std::vector<int32_t> row_indptr = get(union_rows_d_, static_cast<size_t>(s.n_union + 1));
  const std::vector<int32_t> useq = get(union_seq_d_, static_cast<size_t>(s.n_union));
  const std::vector<int32_t> uindptr = get(union_indptr_d_, static_cast<size_t>(s.n_union * hkv + 1));
  int64_t dups = 0, unsorted = 0;
  for (int r = 0; r < s.n_req * hkv; ++r)
    for (int32_t k = in.indptr[static_cast<size_t>(r)] + 1; k < in.indptr[static_cast<size_t>(r) + 1]; ++k) {
      dups += in.page_pos[static_cast<size_t>(k)] == in.page_pos[static_cast<size_t>(k) - 1];
      unsorted += in.page_pos[static_cast<size_t>(k)] < in.page_pos[static_cast<size_t>(k) - 1];
    }
  std::string verdict;
  bool equal = false;
  try {
    const PageLists want = union_row_lists(in, row_indptr);
    const auto uslots = get(union_slots_d_, static_cast<size_t>(uindptr.back()));
    const auto upos = get(union_pos_d_, static_cast<size_t>(uindptr.back()));
    const auto umask = get(union_mask_d_, static_cast<size_t>(uindptr.back()));
    verdict = fmt::format("indptr {}, slots {}, pos {}, masks {}, seq_len {}", uindptr == want.indptr ? "equal" : "DIFFER",
                          uslots == want.slots ? "equal" : "DIFFER", upos == want.page_pos ? "equal" : "DIFFER",
                          umask == want.row_mask ? "equal" : "DIFFER", useq == want.seq_len ? "equal" : "DIFFER");
    equal = uindptr == want.indptr && uslots == want.slots && upos == want.page_pos && umask == want.row_mask &&
            useq == want.seq_len;
  } catch (const std::exception& e) {
    verdict = std::string("statement refused: ") + e.what();
  }
  // The attention itself: the merged read against the rows attended one at a time on the same
  // lists (att_d_ is left as the merged read wrote it).
  const size_t n_att = static_cast<size_t>(s.n_tok) * static_cast<size_t>(cfg_.n_heads_q * cfg_.head_dim);
  const std::vector<uint16_t> united = get(reinterpret_cast<const uint16_t*>(att_d_), n_att);
  attention_decode(rows, s.n_req, 1, 0, s.n_tok);
  DHS_CUDA_CHECK(cudaStreamSynchronize(stream_));
  const std::vector<uint16_t> split = get(reinterpret_cast<const uint16_t*>(att_d_), n_att);
  if (!union_check_.keep_split) DHS_CUDA_CHECK(cudaMemcpy(att_d_, united.data(), n_att * 2, cudaMemcpyHostToDevice));
  float att_diff = 0.0f;
  int64_t worst = -1;
  for (size_t i = 0; i < n_att; ++i) {
    const float d = std::fabs(fp16_to_f32(united[i]) - fp16_to_f32(split[i]));
    if (d > att_diff) att_diff = d, worst = static_cast<int64_t>(i);
  }
  ++union_check_.layers;
  union_check_.merges_equal += equal;
  union_check_.max_att_diff = std::max(union_check_.max_att_diff, att_diff);
  if (!union_check_.print) return;
  const int64_t row_elems = cfg_.n_heads_q * cfg_.head_dim;
  std::fprintf(stderr, "row union probe: %d rows -> %d requests, %d entries in (%lld repeated, %lld out of order) -> %d: %s; "
               "attention max |merged - split| %.4f (token row %lld, head %lld)\n",
               s.n_req, s.n_union, in.indptr.back(), static_cast<long long>(dups), static_cast<long long>(unsorted), uindptr.back(),
               verdict.c_str(), att_diff, static_cast<long long>(worst < 0 ? -1 : worst / row_elems),
               static_cast<long long>(worst < 0 ? -1 : (worst % row_elems) / cfg_.head_dim));
}

std::vector<int32_t> LlamaCuda::read_slots() const {
  std::vector<int32_t> out;
  if (!stamps_valid_) return out;
  const std::span<const int32_t> st = read_stamps();
  for (int64_t s = 0; s < pool_->n_pages(); ++s)
    if (st[static_cast<size_t>(s)] == stamp_) out.push_back(static_cast<int32_t>(s));
  return out;
}

std::span<int32_t> LlamaCuda::lru_mirror_storage() {
  DHS_CHECK(host_pool_, "the LRU mirror: no host tier");
  DHS_CHECK(!owner_d_, "the LRU mirror is on already");
  const int64_t n = pool_->n_pages();
  owner_d_ = static_cast<int32_t*>(dalloc(static_cast<size_t>(n) * 4));
  DHS_CUDA_CHECK(cudaMemset(owner_d_, 0xff, static_cast<size_t>(n) * 4));  // (-1: free, until the first patch)
  patch_d_ = static_cast<int32_t*>(dalloc(static_cast<size_t>(3 * kPatchChunk) * 4));
  DHS_CUDA_CHECK(cudaMallocHost(&mirror_h_, static_cast<size_t>(n) * 4));
  mirror_dst_ = mirror_h_;
  return {last_use_h_, static_cast<size_t>(n)};
}

int32_t* LlamaCuda::stage_lru_patch(int64_t n, int32_t tick, int32_t n_owners) {
  DHS_CHECK(owner_d_, "an LRU patch without the mirror (lru_mirror_storage)");
  DHS_CHECK(n >= 0 && n <= pool_->n_pages() && n_owners >= 0, "an LRU patch of {} entries ({} slots), {} owners", n,
            pool_->n_pages(), n_owners);
  // (the step before has been waited for: the staging and the counts are free)
  if (n > patch_cap_) {
    if (patch_h_) DHS_CUDA_CHECK(cudaFreeHost(patch_h_));
    patch_h_ = nullptr;
    patch_cap_ = std::min(pool_->n_pages(), std::max<int64_t>(n, 2 * patch_cap_));
    DHS_CUDA_CHECK(cudaMallocHost(&patch_h_, static_cast<size_t>(3 * std::max<int64_t>(patch_cap_, 1)) * 4));
  }
  if (n_owners + 1 > mirror_counts_cap_) {
    if (mirror_counts_h_) DHS_CUDA_CHECK(cudaFreeHost(mirror_counts_h_));
    mirror_counts_h_ = nullptr;
    mirror_counts_cap_ = std::max(n_owners + 1, 2 * mirror_counts_cap_);
    DHS_CUDA_CHECK(cudaMallocHost(&mirror_counts_h_, static_cast<size_t>(mirror_counts_cap_) * 8));
    // (the device's counts: outside any graph, so grown in place; the old one freed with the rest)
    mirror_counts_d_ = static_cast<int64_t*>(dalloc(static_cast<size_t>(mirror_counts_cap_) * 8));
  }
  patch_n_ = n;
  patch_tick_ = tick;
  mirror_owners_ = n_owners;
  return patch_h_;
}

void LlamaCuda::set_lru_mirror_dst(const int32_t* lru_storage) noexcept {
  // (called while unwinding too: no throw; a storage that is neither buffer leaves the choice as it is)
  if (lru_storage == last_use_h_) mirror_dst_ = mirror_h_;
  else if (lru_storage == mirror_h_) mirror_dst_ = last_use_h_;
}

int64_t LlamaCuda::move_pages(const PagePool& src, PagePool& dst, std::span<const PageMove> moves) {
  DHS_CHECK(host_pool_, "move_pages: no host tier");
  DHS_CHECK(src.tier() != dst.tier(), "move_pages: both pools of one tier");
  const int64_t n = static_cast<int64_t>(moves.size());
  if (n == 0) return 0;
  const bool recall = src.tier() == Tier::Host;
  const int64_t n_dev = pool_->n_pages(), n_host = host_pool_->n_pages();
  const int64_t at = move_staging(n);
  int32_t* const stage_h = move_h_ + at;
  int32_t* const stage_d = move_d_ + at;
  const auto key = [&](PageRef p) { return p.tier == Tier::Device ? p.slot : static_cast<int32_t>(n_dev + p.slot); };
  // Staging: [n, 2] slot pairs, [n, 2] key pairs (both 8-byte aligned: the kernels read int2), the count.
  int32_t* keys_h = stage_h + 2 * n;
  int64_t runs = 0;
  for (int64_t i = 0; i < n; ++i) {
    const PageMove& m = moves[static_cast<size_t>(i)];
    DHS_CHECK(m.src.tier == src.tier() && m.dst.tier == dst.tier(), "move_pages: a move of other tiers than the pools'");
    stage_h[2 * i] = m.src.slot;
    stage_h[2 * i + 1] = m.dst.slot;
    keys_h[2 * i] = key(m.src);
    keys_h[2 * i + 1] = key(m.dst);
    runs += i == 0 || m.src.slot != moves[static_cast<size_t>(i - 1)].src.slot + 1 ||
            m.dst.slot != moves[static_cast<size_t>(i - 1)].dst.slot + 1;
  }
  stage_h[4 * n] = static_cast<int32_t>(n);
  DHS_CUDA_CHECK(cudaMemcpyAsync(stage_d, stage_h, static_cast<size_t>(4 * n + 1) * 4, cudaMemcpyHostToDevice, stream_));
  cuda::PageMoveParams mp;
  mp.moves = stage_d;
  mp.n_moves = stage_d + 4 * n;
  mp.src_k = recall ? host_pool_->k_d() : pool_->k_d();
  mp.src_v = recall ? host_pool_->v_d() : pool_->v_d();
  mp.dst_k = recall ? pool_->k_d() : host_pool_->k_d();
  mp.dst_v = recall ? pool_->v_d() : host_pool_->v_d();
  mp.max_moves = static_cast<int>(n);
  mp.n_src_pages = recall ? n_host : n_dev;
  mp.n_dst_pages = recall ? n_dev : n_host;
  mp.page_words = static_cast<int>(pool_->page_elems() / 8);
  cuda::launch_page_move(mp, cuda::kPageMoveBlocks, stream_);
  // The page's estimator rows follow it (their keys: the tiers' slots apart).
  move_key_rows(stage_d + 2 * n, static_cast<int>(n));
  return runs;
}

int64_t LlamaCuda::move_staging(int64_t n) {
  // Regions in order; one is rewritten only once the copies that read it ran: the stream is
  // waited for only when the buffer is full (so moves issued while a step runs do not wait for it).
  const int64_t need = 4 * n + 2;  // (even: the next region stays 8-byte aligned)
  if (move_used_ + need <= move_cap_) {
    move_used_ += need;
    return move_used_ - need;
  }
  DHS_CUDA_CHECK(cudaStreamSynchronize(stream_));
  move_used_ = need;
  if (need <= move_cap_) return 0;
  // (the new buffers first: a failed allocation leaves the old ones in place)
  const int64_t cap = std::max<int64_t>({need, 2 * move_cap_, int64_t{1} << 20});
  int32_t *h = nullptr, *d = nullptr;
  DHS_CUDA_CHECK(cudaMallocHost(&h, static_cast<size_t>(cap) * 4));
  if (cudaMalloc(&d, static_cast<size_t>(cap) * 4) != cudaSuccess) {
    cudaFreeHost(h);
    move_used_ = 0;
    throw Error(fmt::format("move_pages: no device memory for {} moves", n));
  }
  if (move_h_) cudaFreeHost(move_h_);
  if (move_d_) cudaFree(move_d_);
  move_h_ = h;
  move_d_ = d;
  move_cap_ = cap;
  return 0;
}

void LlamaCuda::move_key_rows(const int32_t* key_pairs_d, int n) {
  const int64_t ps = opt_.page_size, D = cfg_.head_dim;
  if (sketch_) {
    cuda::launch_move_rows(sketch_->codes_d(), ps * (D / 2), key_pairs_d, n, stream_);
    cuda::launch_move_rows(sketch_->steps_d(), ps * 4, key_pairs_d, n, stream_);
  }
  for (cuda::DevicePageSummaries* st : {sum_minmax_.get(), sum_meanvar_.get()})
    if (st) cuda::launch_move_rows(st->data_d(), 2 * D * 2, key_pairs_d, n, stream_);
}

void LlamaCuda::set_landing_slots(std::span<const int32_t> slots) {
  DHS_CHECK(host_pool_, "set_landing_slots: no host tier");
  DHS_CHECK(static_cast<int64_t>(slots.size()) <= kLandMax, "set_landing_slots: {} slots (at most {})", slots.size(), kLandMax);
  for (const int32_t s : slots)
    DHS_CHECK(s >= 0 && s < pool_->n_pages(), "set_landing_slots: slot {} outside the HBM pool's {} pages", s, pool_->n_pages());
  if (slots.empty()) {
    land_avail_next_ = 0;
    return;
  }
  DHS_CUDA_CHECK(cudaStreamSynchronize(stream_));  // (the staging's last upload has run)
  std::copy(slots.begin(), slots.end(), land_h_);
  DHS_CUDA_CHECK(cudaMemcpyAsync(land_d_, land_h_, slots.size() * 4, cudaMemcpyHostToDevice, stream_));
  land_avail_next_ = static_cast<int32_t>(slots.size());
}

// Prefill reads the dense lists: policies apply to decode steps only. With the host tier the lists
// name pages of both tiers (keys): as decode, they are split by tier, the resident part attended
// from HBM and the late part in place from the host tier's mapped pages, and the two merged by LSE
// (a prompt longer than HBM holds prefills with its earlier chunks' pages offloaded). The late
// part runs the mma.sync kernel: its plain loads read mapped DRAM (the wgmma kernel's cp.async
// ring is for HBM), and PCIe bounds it whatever kernel runs.
void LlamaCuda::attention_prefill(int first, int first_row, int n_tok, int n_req) {
  if (first >= n_req) return;
  const int hkv = static_cast<int>(cfg_.n_heads_kv);
  cuda::PrefillAttentionParams p = prefill_attn_;
  // (requests from `first`: q_indptr holds absolute rows, so the kernel writes rows first.. of out)
  p.q_indptr += first;
  p.kv_indptr += static_cast<int64_t>(first) * hkv;
  p.seq_len += first;
  p.n_requests = n_req - first;
  p.n_rows = n_tok - first_row;
  if (!host_pool_) {
    cuda::launch_prefill_attention(p, stream_, prefill_kernel_);
    return;
  }
  cuda::split_lists_by_tier(p.kv_indptr, p.slots, p.page_pos, p.n_requests * hkv, pool_->n_pages(), *split_, stream_);
  p.kv_indptr = split_->dev_indptr();
  p.slots = split_->dev_slots();
  p.page_pos = split_->dev_page_pos();
  p.lse = lse_d_;
  cuda::launch_prefill_attention(p, stream_, prefill_kernel_);
  cuda::PrefillAttentionParams late = p;
  late.kv_indptr = split_->late_indptr();
  late.slots = split_->late_slots();
  late.page_pos = split_->late_page_pos();
  late.k_pool = host_pool_->k_d();
  late.v_pool = host_pool_->v_d();
  late.out = late_att_d_;
  late.lse = late_lse_d_;
  cuda::launch_prefill_attention(late, stream_, cuda::PrefillKernel{.wgmma = false});
  const int64_t row0 = static_cast<int64_t>(first_row) * cfg_.n_heads_q;  // (the prefill rows' first head row)
  cuda::launch_merge_late({att_d_ + row0 * cfg_.head_dim, lse_d_ + row0, late_att_d_ + row0 * cfg_.head_dim, late_lse_d_ + row0,
                           p.n_rows * static_cast<int>(cfg_.n_heads_q), static_cast<int>(cfg_.head_dim)},
                          stream_);
}

void LlamaCuda::swiglu(int n_tok) {
  cuda::SwiGluParams p = swiglu_;
  p.n_tok = n_tok;
  cuda::launch_swiglu(p, stream_);
}

// Output rows (each request's last, every verify row) -> final norm -> logits -> sampled ids.
void LlamaCuda::logits_and_sample(int n_out) {
  cuda::GatherRowsParams g = last_rows_;
  g.n_out = n_out;
  cuda::launch_gather_rows(g, stream_);
  cuda::AddRmsNormParams n = final_norm_;
  n.n_rows = n_out;
  cuda::launch_add_rms_norm(n, stream_);
  gemm_->run(output_, hlast_d_, logits_d_, n_out, cuda::GemmOut::F32, stream_);
  cuda::SampleParams sp = sample_;
  sp.n_rows = n_out;
  cuda::launch_sample(sp, stream_);
}

void LlamaCuda::forward(const std::vector<Seq>& given, std::vector<float>* logits, bool use_graph,
                        const std::function<void()>& while_running) {
  using Clock = std::chrono::steady_clock;
  const auto ms = [](Clock::time_point a, Clock::time_point b) { return std::chrono::duration<double, std::milli>(b - a).count(); };
  const Clock::time_point t_start = Clock::now();
  Step step;
  step.decode = true;
  step.draft = !draft_layers_.empty() && !given.empty();
  int64_t T = 0, n_out_real = 0;
  for (const Seq& s : given) {
    step.draft = step.draft && s.draft && s.n_new == 1 && !s.verify;
    // A decode-like step: one token each, or a verify's rows (reads_as_decode). A step with a
    // prompt chunk is not; its decode and verify rows are ordered first below.
    step.decode = step.decode && reads_as_decode(s.n_new, s.verify);
    step.max_q = std::max(step.max_q, static_cast<int>(s.n_new));
    T += s.n_new;
    n_out_real += s.verify ? s.n_new : 1;
  }
  const int n_real = static_cast<int>(given.size());
  // A mixed step (CudaModelOptions::mixed_decode_attention): its decode and verify requests
  // first, in the caller's order, then the rest; `orig` maps back (empty: the caller's order).
  std::vector<int> orig;
  int n_dec_seqs = 0;
  if (!step.decode && opt_.mixed_decode_attention) {
    const auto is_dec = [&](const Seq& s) { return reads_as_decode(s.n_new, s.verify); };
    for (int i = 0; i < n_real; ++i)
      if (is_dec(given[static_cast<size_t>(i)])) orig.push_back(i);
    n_dec_seqs = static_cast<int>(orig.size());
    for (int i = 0; i < n_real; ++i)
      if (!is_dec(given[static_cast<size_t>(i)])) orig.push_back(i);
    if (n_dec_seqs == 0) orig.clear();
  }
  ordered_.clear();
  for (const int i : orig) ordered_.push_back(given[static_cast<size_t>(i)]);
  const std::vector<Seq>& batch = orig.empty() ? given : ordered_;
  const auto caller = [&](size_t i) { return orig.empty() ? static_cast<int>(i) : orig[i]; };
  // verify_selection "per-row" under a sparse engine: each verify row its own attention request
  // (and selection), at its own position.
  const bool split = (step.decode || n_dec_seqs > 0) && opt_.verify_selection == "per-row" && selector_->sparse();
  std::vector<cuda::PageSelector::Request> reqs;
  attn_seq_.clear();  // each attention request's sequence (the late log names the former)
  for (size_t i = 0; i < batch.size(); ++i) {
    const Seq& s = batch[i];
    if (split && s.verify) {
      for (int64_t j = 0; j < s.n_new; ++j) {
        reqs.push_back({s.table, s.req_slot, s.table->n_tokens() + j, 1, s.policy, s.table->id()});
        attn_seq_.push_back(caller(i));
      }
    } else {
      reqs.push_back({s.table, s.req_slot, s.table->n_tokens(), s.n_new, s.policy, s.table->id()});
      attn_seq_.push_back(caller(i));
    }
  }
  if (split) step.max_q = 1;
  // (a mixed step's decode part: its attention requests, rows and longest request)
  int n_dec = 0, dec_rows = 0, dec_max_q = 1;
  for (int i = 0; i < n_dec_seqs; ++i) {
    const Seq& s = batch[static_cast<size_t>(i)];
    n_dec += split && s.verify ? static_cast<int>(s.n_new) : 1;
    dec_rows += static_cast<int>(s.n_new);
    dec_max_q = std::max(dec_max_q, split ? 1 : static_cast<int>(s.n_new));
  }
  if (host_pool_) {
    // Moved pages' entries first (a later sync of the same entries writes after them).
    table_->flush_patches(stream_);
    // The step writes its tokens' K/V into HBM pages (rope_append by slot): the pages each list
    // appends into must be resident (TieredKv::prepare_append); the others may be in either tier.
    for (const Seq& s : batch)
      for (int l = 0; l < static_cast<int>(cfg_.n_layers); ++l)
        for (int h = 0; h < static_cast<int>(cfg_.n_heads_kv); ++h)
          for (int64_t i = s.table->n_tokens() / opt_.page_size; i < s.table->n_pages_per_list(); ++i)
            DHS_CHECK(s.table->page(l, h, i).tier == Tier::Device,
                      "page {} of layer {}, KV head {} takes this step's tokens and is in the host tier", i, l, h);
  }
  const int n_attn = static_cast<int>(reqs.size());
  // check_row_union: merged per-row steps run uncaptured (step.n_union is known only after the
  // upload, which the graph's bucket sizes).
  const bool graph = step.decode && use_graph && !(split && union_scratch_ && !host_pool_ && union_check_.on);
  // A graph runs its bucket's rows.
  const int n_rows = !graph ? n_attn : bucket(n_attn, n_attn > opt_.max_batch ? static_cast<int>(max_attn_) : opt_.max_batch);
  step.n_tok = static_cast<int>(T) + (n_rows - n_attn);
  // FP8 drafts only where the quantized GEMV reads each matrix once (at most kQuantGemvMaxTok
  // rows, padding included): above it the packed weights are read once per 8 rows or unpacked to
  // f16 for cuBLASLt, more bytes than the f16 matrix itself.
  step.draft = step.draft && step.n_tok <= cuda::kQuantGemvMaxTok;
  step.n_req = n_rows;
  step.n_out = static_cast<int>(n_out_real) + (n_rows - n_attn);
  step.n_dec = step.decode ? n_rows : n_dec;
  step.dec_rows = dec_rows;
  step.dec_max_q = dec_max_q;
  step.n_union = upload_step(batch, n_rows, split);
  const std::vector<int64_t> row_first = out_first_;  // (each of batch's sequences' first output row)
  if (step.n_union > 0)
    for (const Seq& s : batch) step.union_max_q = std::max(step.union_max_q, s.verify ? static_cast<int>(s.n_new) : 1);
  // (a mixed step's selection: its decode rows, the first n_dec requests)
  if (!step.decode && n_dec > 0) reqs.resize(static_cast<size_t>(n_dec));
  step.plan = selector_->begin_step(reqs, step.decode || n_dec > 0, stream_);
  // The landing beside the resident attention where the rule chose it (one-row attention requests).
  step.overlap = side_stream_ && step.n_dec > 0 && overlap_next_ && (step.decode ? step.max_q : step.dec_max_q) == 1;
  n_overlapped_ += step.overlap;
  n_tier_steps_ += host_pool_ && step.n_dec > 0;
  last_step_ = step;
  int32_t land_avail = 0;
  const bool patched = patch_n_ >= 0;
  if (patched) {  // the host LRU's changes into its mirror, before the step's reads
    for (int64_t c0 = 0; c0 < patch_n_; c0 += kPatchChunk) {
      const int64_t m = std::min(kPatchChunk, patch_n_ - c0);
      for (int64_t part = 0; part < 3; ++part)  // (the slots, last uses, owners of entries [c0, c0 + m))
        DHS_CUDA_CHECK(cudaMemcpyAsync(patch_d_ + part * m, patch_h_ + part * patch_n_ + c0, static_cast<size_t>(m) * 4,
                                       cudaMemcpyHostToDevice, stream_));
      cuda::launch_lru_mirror_apply(last_use_d_, owner_d_, patch_d_, m, stream_);
    }
    patch_n_ = -1;
  }
  if (host_pool_ && step.n_dec > 0) {  // this step's stamp for the resident reads' record
    // (with the LRU mirror, the patch's tick: the last use the split writes is the LRU's own)
    DHS_CHECK(!owner_d_ || patched, "a decode step over the host tier with the LRU mirror but no patch (stage_lru_patch)");
    *stamp_h_ = owner_d_ ? (stamp_ = patch_tick_) : ++stamp_;
    DHS_CUDA_CHECK(cudaMemcpyAsync(stamp_d_, stamp_h_, 4, cudaMemcpyHostToDevice, stream_));
    // The landing stack's length (set_landing_slots uploaded the slots; 0: nothing lands).
    land_avail = land_avail_next_;
    land_h_[kLandMax + 2] = land_avail;
    DHS_CUDA_CHECK(cudaMemcpyAsync(land_d_ + kLandMax + 2, land_h_ + kLandMax + 2, 4, cudaMemcpyHostToDevice, stream_));
  }
  land_avail_next_ = 0;
  cudaGraphExec_t g = graph ? decode_graph(step) : nullptr;
  const Clock::time_point t_launch = Clock::now();
  DHS_CUDA_CHECK(cudaEventRecord(ev_launch_, stream_));
  if (g) {
    DHS_CUDA_CHECK(cudaGraphLaunch(g, stream_));
  } else {
    run_layers(step);  // (a graph's padding rows are inert uncaptured too)
  }
  DHS_CUDA_CHECK(cudaEventRecord(ev_kernels_done_, stream_));
  DHS_CUDA_CHECK(cudaGetLastError());
  for (const Seq& s : batch) s.table->commit(s.n_new);
  DHS_CUDA_CHECK(cudaMemcpyAsync(out_ids_h_, out_ids_d_, static_cast<size_t>(n_out_real) * 4, cudaMemcpyDeviceToHost, stream_));
  // The output rows in the caller's order: each sequence's first at out_first_ (out_row).
  const auto n_out_of = [](const Seq& s) { return s.verify ? s.n_new : int64_t{1}; };
  out_first_.assign(static_cast<size_t>(n_real), 0);
  {
    std::vector<int64_t> n_of(static_cast<size_t>(n_real));
    for (size_t i = 0; i < batch.size(); ++i) n_of[static_cast<size_t>(caller(i))] = n_out_of(batch[i]);
    for (int j = 1; j < n_real; ++j) out_first_[static_cast<size_t>(j)] = out_first_[static_cast<size_t>(j - 1)] + n_of[static_cast<size_t>(j - 1)];
  }
  if (logits) {
    logits->resize(static_cast<size_t>(n_out_real * cfg_.vocab_size));
    if (orig.empty()) {
      DHS_CUDA_CHECK(cudaMemcpyAsync(logits->data(), logits_d_, logits->size() * 4, cudaMemcpyDeviceToHost, stream_));
    } else {
      const size_t V = static_cast<size_t>(cfg_.vocab_size);
      for (size_t i = 0; i < batch.size(); ++i)
        DHS_CUDA_CHECK(cudaMemcpyAsync(logits->data() + static_cast<size_t>(out_first_[static_cast<size_t>(caller(i))]) * V,
                                       logits_d_ + static_cast<size_t>(row_first[i]) * V,
                                       static_cast<size_t>(n_out_of(batch[i])) * V * 4, cudaMemcpyDeviceToHost, stream_));
    }
  }
  // The HBM reads' stamps (a decode step with the host tier): what the hierarchy's after-step
  // reads in one pass (TieredKv::after_decode_step), rather than a list of millions of slots.
  stamps_valid_ = host_pool_ && step.n_dec > 0;
  if (stamps_valid_ && owner_d_) {
    // The mirror: its reads counted per owner, its last uses copied into the buffer the host LRU
    // gave up (after_step_reads takes it as its own).
    cuda::launch_lru_mirror_count(last_use_d_, owner_d_, static_cast<int32_t>(pool_->n_pages()), stamp_d_, mirror_owners_,
                                  mirror_counts_d_, stream_);
    DHS_CUDA_CHECK(cudaMemcpyAsync(mirror_counts_h_, mirror_counts_d_, static_cast<size_t>(mirror_owners_ + 1) * 8,
                                   cudaMemcpyDeviceToHost, stream_));
    DHS_CUDA_CHECK(cudaMemcpyAsync(mirror_dst_, last_use_d_, static_cast<size_t>(pool_->n_pages()) * 4, cudaMemcpyDeviceToHost, stream_));
    mirror_last_ = mirror_dst_;
  } else if (stamps_valid_) {
    DHS_CUDA_CHECK(cudaMemcpyAsync(last_use_h_, last_use_d_, static_cast<size_t>(pool_->n_pages()) * 4, cudaMemcpyDeviceToHost, stream_));
  }
  // The caller's host work while the step runs (the hierarchy's last recalls: what it enqueues
  // on the stream runs after the step).
  const Clock::time_point t_while = Clock::now();
  if (while_running) while_running();
  const double while_ms = ms(t_while, Clock::now());
  DHS_CUDA_CHECK(cudaStreamSynchronize(stream_));  // the step's one wait
  move_used_ = 0;                                  // (the moves' staging is read: reusable)
  const Clock::time_point t_done = Clock::now();
  table_->step_done();
  late_reads_.clear();
  landings_.clear();
  land_claims_ = 0;
  late_overflow_ = false;
  if (host_pool_ && step.n_dec > 0) {
    land_claims_ = land_h_[kLandMax];
    // The next decode step's form, from this one's claims (K and V pages of f16).
    overlap_next_ = opt_.land_overlap.take(land_claims_, 4 * static_cast<int64_t>(pool_->page_elems()), cfg_.n_layers);
    const int64_t n = std::min<int64_t>(land_claims_, land_avail);
    if (n > 0) {
      land_log_h_.resize(static_cast<size_t>(6 * n));
      DHS_CUDA_CHECK(cudaMemcpy(land_log_h_.data(), land_d_ + kLandMax + 3, land_log_h_.size() * 4, cudaMemcpyDeviceToHost));
    }
    const int hkv = static_cast<int>(cfg_.n_heads_kv);
    for (int64_t i = 0; i < n; ++i) {
      const int32_t* e = land_log_h_.data() + 6 * i;
      // (a padding row lists nothing; its entries would name no sequence)
      if (e[0] / hkv >= n_attn) continue;
      landings_.push_back({attn_seq_[static_cast<size_t>(e[0] / hkv)], e[1], e[0] % hkv, e[2], e[3], e[4], e[5] != 0});
    }
  }
  if (host_pool_ && step.n_dec > 0) {
    const int32_t n = *late_count_h_;
    late_overflow_ = n > late_cap_;
    const int logged = std::min(n, late_cap_);
    if (logged > 0) {
      late_log_h_.resize(static_cast<size_t>(3 * logged));
      DHS_CUDA_CHECK(cudaMemcpy(late_log_h_.data(), late_log_d_, late_log_h_.size() * 4, cudaMemcpyDeviceToHost));
    }
    // Each entry (sequence, layer, KV head, page) packed into one 64-bit key in that order
    // (12 + 10 + 10 + 32 bits), sorted and deduplicated as integers: the atomics log in no fixed
    // order, and what the host recalls first must not vary by run; a verify's rows, one attention
    // request each under per-row selections, log their sequence's pages more than once. (A tuple
    // comparator sorted ~120k entries in ~10 ms of the step at 128k x 4.)
    const int hkv = static_cast<int>(cfg_.n_heads_kv);
    DHS_ASSERT(n_attn <= 4096 && cfg_.n_layers <= 1024 && hkv <= 1024);
    late_keys_.clear();
    for (int32_t i = 0; i < logged; ++i) {
      const int row = late_log_h_[static_cast<size_t>(3 * i)];
      if (row / hkv >= n_attn) continue;  // (padding rows read nothing)
      const uint64_t seq = static_cast<uint64_t>(attn_seq_[static_cast<size_t>(row / hkv)]);
      const uint64_t layer = static_cast<uint64_t>(late_log_h_[static_cast<size_t>(3 * i + 1)]);
      const uint64_t page = static_cast<uint32_t>(late_log_h_[static_cast<size_t>(3 * i + 2)]);
      late_keys_.push_back(seq << 52 | layer << 42 | static_cast<uint64_t>(row % hkv) << 32 | page);
    }
    std::sort(late_keys_.begin(), late_keys_.end());
    late_keys_.erase(std::unique(late_keys_.begin(), late_keys_.end()), late_keys_.end());
    late_reads_.reserve(late_keys_.size());
    for (const uint64_t k : late_keys_)
      late_reads_.push_back({static_cast<int>(k >> 52), static_cast<int>((k >> 42) & 1023), static_cast<int>((k >> 32) & 1023),
                             static_cast<int32_t>(k & 0xffffffffu)});
  }
  hist_stage_used_ = 0;
  row_ids_.resize(static_cast<size_t>(n_out_real));
  sampled_.resize(static_cast<size_t>(n_real));  // each sequence's last output row
  for (size_t i = 0; i < batch.size(); ++i) {
    const int32_t* rows = out_ids_h_ + row_first[i];
    const int64_t n = n_out_of(batch[i]);
    std::copy(rows, rows + n, row_ids_.begin() + out_first_[static_cast<size_t>(caller(i))]);
    sampled_[static_cast<size_t>(caller(i))] = rows[n - 1];
  }
  float graph_ms = 0.0f;  // (both events done: the step's wait came after them)
  DHS_CUDA_CHECK(cudaEventElapsedTime(&graph_ms, ev_launch_, ev_kernels_done_));
  phases_ = {ms(t_start, t_launch), ms(t_launch, t_done), ms(t_done, Clock::now()), while_ms, graph_ms};
}

cudaGraphExec_t LlamaCuda::decode_graph(const Step& step) {
  // A step with verify rows runs other sizes than its bucket's decode step: its tokens and
  // longest request are in the key.
  // The overlapped landing's form is another graph (CudaModelOptions::land_overlap).
  const std::string key =
      (step.n_union > 0 ? fmt::format("{}/union:{}x{}x{}", selector_->graph_key(step.plan), step.n_tok, step.n_union, step.union_max_q)
       : step.max_q == 1 ? selector_->graph_key(step.plan)
                         : fmt::format("{}/verify:{}x{}", selector_->graph_key(step.plan), step.n_tok, step.max_q)) +
      (step.overlap ? "/overlap" : "") + (step.draft ? "/draft-fp8" : "");
  auto it = graphs_.find({key, step.n_req});
  // Verify steps' graphs are keyed by their sizes; past kMaxVerifyGraphs of them (speculation
  // with many mixes of k) new ones run uncaptured.
  constexpr size_t kMaxVerifyGraphs = 64;
  if (it == graphs_.end() && (step.max_q > 1 || step.n_union > 0) && n_verify_graphs_++ >= kMaxVerifyGraphs) return nullptr;
  if (it == graphs_.end()) {
    // Capture once per bucket (and plan); replays read the same step-input buffers.
    cudaGraph_t g;
    DHS_CUDA_CHECK(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal));
    run_layers(step);
    DHS_CUDA_CHECK(cudaStreamEndCapture(stream_, &g));
    cudaGraphExec_t exec;
    DHS_CUDA_CHECK(cudaGraphInstantiate(&exec, g, 0));
    DHS_CUDA_CHECK(cudaGraphDestroy(g));
    it = graphs_.emplace(std::make_pair(key, step.n_req), exec).first;
  }
  return it->second;
}

double LlamaCuda::time_decode_step(const std::vector<Seq>& batch, int n_iters) {
  // One real step (captures the graph), then replays of it: the same positions are
  // rewritten each time, which costs what a real step costs.
  for (const Seq& s : batch) DHS_CHECK(s.n_new == 1 || s.verify, "time_decode_step: decode or verify batches only");
  selector_->restart_schedule();  // the first step selects at every layer
  forward(batch, nullptr, true);
  for (const Seq& s : batch) s.table->truncate(allocator(), s.table->n_tokens() - s.n_new);
  // With --reselect-every R the steps cycle through R graphs (each selecting at a different
  // 1/R of the layers, reusing the first step's selections at the others): all are timed.
  std::vector<cudaGraphExec_t> cycle;
  for (const cuda::SelectPlan& plan : selector_->replay_cycle(last_step_.plan)) {
    Step st = last_step_;
    st.plan = plan;
    cycle.push_back(decode_graph(st));
  }
  for (cudaGraphExec_t g : cycle) DHS_CHECK(g != nullptr, "time_decode_step: too many verify graphs to capture another");
  cudaEvent_t a, b;
  DHS_CUDA_CHECK(cudaEventCreate(&a));
  DHS_CUDA_CHECK(cudaEventCreate(&b));
  std::vector<float> ms;
  for (int i = 0; i < n_iters; ++i) {
    DHS_CUDA_CHECK(cudaEventRecord(a, stream_));
    DHS_CUDA_CHECK(cudaGraphLaunch(cycle[static_cast<size_t>(i) % cycle.size()], stream_));
    DHS_CUDA_CHECK(cudaEventRecord(b, stream_));
    DHS_CUDA_CHECK(cudaEventSynchronize(b));
    float t = 0;
    DHS_CUDA_CHECK(cudaEventElapsedTime(&t, a, b));
    ms.push_back(t);
  }
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

}  // namespace dhs
