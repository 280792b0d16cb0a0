#include "model/arch/llama_cuda.h"

#include <algorithm>
#include <cmath>

#include "backend/cpu/ops.h"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/gather_rows.h"
#include "backend/cuda/ops.h"
#include "backend/cuda/prefill_attention.h"
#include "backend/cuda/reuse_lists.h"
#include "core/error.h"
#include "core/fp16.h"
#include "core/thread_pool.h"
#include "model/tensor_load.h"

namespace dhs {

void* LlamaCuda::dalloc(size_t bytes) {
  void* p = nullptr;
  DHS_CUDA_CHECK(cudaMalloc(&p, std::max<size_t>(bytes, 16)));
  allocs_.push_back(p);
  return p;
}

void LlamaCuda::allocate(const CudaModelOptions& o) {
  opt_ = o;
  const int64_t H = cfg_.hidden, D = cfg_.head_dim, Hq = cfg_.n_heads_q, Hkv = cfg_.n_heads_kv, F = cfg_.ffn_hidden;
  const int64_t V = cfg_.vocab_size, L = cfg_.n_layers;
  const int64_t T = std::max<int64_t>(o.max_step_tokens, o.max_batch), B = o.max_batch;
  DHS_CHECK(o.page_size == cuda::kDecodePageSize, "CUDA backend: page size must be {}", cuda::kDecodePageSize);
  DHS_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  const int64_t pages_per_seq = (o.max_context + o.page_size - 1) / o.page_size;
  const int64_t n_pages = o.n_pages > 0 ? o.n_pages : pages_per_seq * B * L * Hkv;
  alloc_ = std::make_unique<PagePool>(Tier::Device, n_pages, o.page_size, static_cast<int>(D), /*with_storage=*/false);
  pool_ = std::make_unique<cuda::DevicePagePool>(n_pages, o.page_size, static_cast<int>(D));
  table_ = std::make_unique<cuda::DevicePageTable>(static_cast<int>(B), static_cast<int>(L), static_cast<int>(Hkv), pages_per_seq);
  gemm_ = std::make_unique<cuda::Gemm>();
  gemm_->set_gemv_max_tok(o.gemv_max_tok);
  dws_ = std::make_unique<cuda::DecodeAttentionWorkspace>(static_cast<int>(B), static_cast<int>(Hq), static_cast<int>(Hkv),
                                                         static_cast<int>(D), 1);
  auto ints = [&](int64_t n) { return static_cast<int32_t*>(dalloc(static_cast<size_t>(n) * 4)); };
  DHS_CHECK(o.summaries == "none" || o.summaries == "minmax" || o.summaries == "meanspread" || o.summaries == "both",
            "page summaries must be none, minmax, meanspread or both, got '{}'", o.summaries);
  if (o.key_sketch) sketch_ = std::make_unique<cuda::DeviceKeySketch>(n_pages, o.page_size, static_cast<int>(D));
  if (o.summaries != "none" || o.key_sketch) {
    if (o.summaries != "meanspread" && o.summaries != "none")
      sum_minmax_ = std::make_unique<cuda::DevicePageSummaries>(n_pages, static_cast<int>(D), cuda::SummaryKind::MinMax);
    if (o.summaries != "minmax" && o.summaries != "none")
      sum_meanvar_ = std::make_unique<cuda::DevicePageSummaries>(n_pages, static_cast<int>(D), cuda::SummaryKind::MeanSpread);
    sel_ws_ = std::make_unique<cuda::PageSelectWorkspace>(static_cast<int>(B * Hkv), B * Hkv * pages_per_seq,
                                                          static_cast<int>(Hq / Hkv));
    sp_indptr_d_ = ints(B * Hkv + 1);
    sp_slots_d_ = ints(B * Hkv * pages_per_seq);
    sp_page_pos_d_ = ints(B * Hkv * pages_per_seq);
    budget_frac_d_ = static_cast<float*>(dalloc(static_cast<size_t>(L * Hkv) * 4));
    sparse_stats_d_ = static_cast<unsigned long long*>(dalloc(static_cast<size_t>(L * Hkv * 2) * 8));
    DHS_CUDA_CHECK(cudaMemset(sparse_stats_d_, 0, static_cast<size_t>(L * Hkv * 2) * 8));
  }
  ids_d_ = ints(T);
  pos_d_ = ints(T);
  dst_slot_d_ = ints(L * T * Hkv);
  q_indptr_d_ = ints(B + 1);
  seq_len_d_ = ints(B);
  req_slot_d_ = ints(B);
  last_row_d_ = ints(B);
  indptr_d_ = ints(B * Hkv + 1);
  slots_d_ = ints(B * Hkv * pages_per_seq);
  page_pos_d_ = ints(B * Hkv * pages_per_seq);
  staging_ints_ = static_cast<size_t>(2 * T + L * T * Hkv + 4 * B + 1);
  DHS_CUDA_CHECK(cudaMallocHost(&staging_h_, staging_ints_ * 4));
  auto bf = [&](int64_t n) { return static_cast<__nv_bfloat16*>(dalloc(static_cast<size_t>(n) * 2)); };
  x_d_ = static_cast<float*>(dalloc(static_cast<size_t>(T * H) * 4));
  h_d_ = bf(T * H);
  qkv_d_ = bf(T * (Hq + 2 * Hkv) * D);
  q_d_ = bf(T * Hq * D);
  att_d_ = bf(T * Hq * D);
  gu_d_ = bf(T * 2 * F);
  act_d_ = bf(T * F);
  hlast_d_ = bf(B * H);
  last_x_d_ = static_cast<float*>(dalloc(static_cast<size_t>(B * H) * 4));
  logits_d_ = static_cast<float*>(dalloc(static_cast<size_t>(B * V) * 4));
  samp_rows_d_ = static_cast<cuda::SamplingRow*>(dalloc(static_cast<size_t>(B) * sizeof(cuda::SamplingRow)));
  std::vector<cuda::SamplingRow> greedy(static_cast<size_t>(B));  // temperature 0 = greedy
  DHS_CUDA_CHECK(cudaMemcpy(samp_rows_d_, greedy.data(), greedy.size() * sizeof(cuda::SamplingRow), cudaMemcpyHostToDevice));
  rng_d_ = static_cast<uint64_t*>(dalloc(static_cast<size_t>(B) * 8));
  DHS_CUDA_CHECK(cudaMemset(rng_d_, 0, static_cast<size_t>(B) * 8));
  out_ids_d_ = ints(B);
  inv_freq_ = static_cast<float*>(dalloc(static_cast<size_t>(D / 2) * 4));
  std::vector<float> inv(static_cast<size_t>(D / 2));
  cpu::rope_inv_freq(cfg_, inv.data());
  DHS_CUDA_CHECK(cudaMemcpy(inv_freq_, inv.data(), inv.size() * 4, cudaMemcpyHostToDevice));
}

LlamaCuda::LlamaCuda(const WeightSource& src, const CudaModelOptions& o) : cfg_(src.config()) {
  allocate(o);
  const int64_t H = cfg_.hidden, D = cfg_.head_dim, Hq = cfg_.n_heads_q, Hkv = cfg_.n_heads_kv, F = cfg_.ffn_hidden;
  const int64_t V = cfg_.vocab_size;
  auto up_bf16 = [&](const std::vector<float>& f) {
    std::vector<uint16_t> b(f.size());
    for (size_t i = 0; i < f.size(); ++i) b[i] = f32_to_bf16(f[i]);
    auto* d = static_cast<__nv_bfloat16*>(dalloc(b.size() * 2));
    DHS_CUDA_CHECK(cudaMemcpy(d, b.data(), b.size() * 2, cudaMemcpyHostToDevice));
    weight_bytes_ += b.size() * 2;
    return d;
  };
  auto up_f32 = [&](const std::vector<float>& f) {
    auto* d = static_cast<float*>(dalloc(f.size() * 4));
    DHS_CUDA_CHECK(cudaMemcpy(d, f.data(), f.size() * 4, cudaMemcpyHostToDevice));
    return d;
  };
  auto cat = [](std::vector<float> a, const std::vector<float>& b) {
    a.insert(a.end(), b.begin(), b.end());
    return a;
  };
  tok_embd_ = up_bf16(load_tensor_f32(src, "token_embd.weight", {V, H}));
  output_ = cfg_.tied_embeddings ? tok_embd_ : up_bf16(load_tensor_f32(src, "output.weight", {V, H}));
  output_norm_ = up_f32(load_tensor_f32(src, "output_norm.weight", {H}));
  layers_.resize(static_cast<size_t>(cfg_.n_layers));
  for (int64_t l = 0; l < cfg_.n_layers; ++l) {
    Layer& L = layers_[static_cast<size_t>(l)];
    const std::string p = fmt::format("blk.{}.", l);
    L.attn_norm = up_f32(load_tensor_f32(src, p + "attn_norm.weight", {H}));
    L.ffn_norm = up_f32(load_tensor_f32(src, p + "ffn_norm.weight", {H}));
    // Fused projections: rows [q; k; v] and [gate; up].
    L.w_qkv = up_bf16(cat(cat(load_tensor_f32(src, p + "attn_q.weight", {Hq * D, H}), load_tensor_f32(src, p + "attn_k.weight", {Hkv * D, H})),
                          load_tensor_f32(src, p + "attn_v.weight", {Hkv * D, H})));
    L.w_o = up_bf16(load_tensor_f32(src, p + "attn_output.weight", {H, Hq * D}));
    L.w_gu = up_bf16(cat(load_tensor_f32(src, p + "ffn_gate.weight", {F, H}), load_tensor_f32(src, p + "ffn_up.weight", {F, H})));
    L.w_down = up_bf16(load_tensor_f32(src, p + "ffn_down.weight", {H, F}));
    if (cfg_.qkv_bias) {
      L.bq = up_f32(load_tensor_f32(src, p + "attn_q.bias", {Hq * D}));
      L.bk = up_f32(load_tensor_f32(src, p + "attn_k.bias", {Hkv * D}));
      L.bv = up_f32(load_tensor_f32(src, p + "attn_v.bias", {Hkv * D}));
    }
    if (cfg_.qk_norm) {
      L.q_norm = up_f32(load_tensor_f32(src, p + "attn_q_norm.weight", {D}));
      L.k_norm = up_f32(load_tensor_f32(src, p + "attn_k_norm.weight", {D}));
    }
  }
}

LlamaCuda::LlamaCuda(const ModelConfig& cfg, uint64_t seed, const CudaModelOptions& o) : cfg_(cfg) {
  allocate(o);
  const int64_t H = cfg_.hidden, D = cfg_.head_dim, Hq = cfg_.n_heads_q, Hkv = cfg_.n_heads_kv, F = cfg_.ffn_hidden;
  const int64_t V = cfg_.vocab_size;
  // Uniform(-a, a) with a = sqrt(3 / fan_in): unit-variance outputs for unit-variance inputs.
  auto rnd = [&](int64_t rows, int64_t cols) {
    auto* d = static_cast<__nv_bfloat16*>(dalloc(static_cast<size_t>(rows * cols) * 2));
    const float a = std::sqrt(3.0f / static_cast<float>(cols));
    cuda::fill_random_bf16(d, static_cast<size_t>(rows * cols), seed++, -a, a, stream_);
    weight_bytes_ += static_cast<size_t>(rows * cols) * 2;
    return d;
  };
  auto ones = [&](int64_t n) {
    std::vector<float> f(static_cast<size_t>(n), 1.0f);
    auto* d = static_cast<float*>(dalloc(f.size() * 4));
    DHS_CUDA_CHECK(cudaMemcpy(d, f.data(), f.size() * 4, cudaMemcpyHostToDevice));
    return d;
  };
  tok_embd_ = rnd(V, H);
  output_ = cfg_.tied_embeddings ? tok_embd_ : rnd(V, H);
  output_norm_ = ones(H);
  layers_.resize(static_cast<size_t>(cfg_.n_layers));
  for (auto& L : layers_) {
    L.attn_norm = ones(H);
    L.ffn_norm = ones(H);
    L.w_qkv = rnd((Hq + 2 * Hkv) * D, H);
    L.w_o = rnd(H, Hq * D);
    L.w_gu = rnd(2 * F, H);
    L.w_down = rnd(H, F);
  }
  DHS_CUDA_CHECK(cudaStreamSynchronize(stream_));
}

LlamaCuda::~LlamaCuda() {
  for (auto& [b, g] : graphs_) cudaGraphExecDestroy(g);
  for (void* p : allocs_) cudaFree(p);
  cudaFreeHost(staging_h_);
  if (stream_) cudaStreamDestroy(stream_);
}

// Host side of a step: the small per-step inputs, packed into one pinned buffer
// and copied with one cudaMemcpyAsync per array (all before the kernels).
void LlamaCuda::upload_step(const std::vector<Seq>& batch, bool decode) {
  const int64_t L = cfg_.n_layers, Hkv = cfg_.n_heads_kv;
  const int n_req = static_cast<int>(batch.size());
  DHS_CHECK(n_req >= 1 && n_req <= opt_.max_batch, "CUDA step: batch of {} (max {})", n_req, opt_.max_batch);
  int64_t T = 0;
  for (const Seq& s : batch) T += s.n_new;
  DHS_CHECK(T <= std::max<int64_t>(opt_.max_step_tokens, opt_.max_batch), "CUDA step: {} tokens (max {})", T,
            opt_.max_step_tokens);
  int32_t* ids = staging_h_;
  int32_t* pos = ids + T;
  int32_t* dst = pos + T;               // [L, T, Hkv]
  int32_t* q_indptr = dst + L * T * Hkv;
  int32_t* seq_len = q_indptr + n_req + 1;
  int32_t* req_slot = seq_len + n_req;
  int32_t* last_row = req_slot + n_req;
  q_indptr[0] = 0;
  int64_t t = 0;
  for (int r = 0; r < n_req; ++r) {
    const Seq& s = batch[static_cast<size_t>(r)];
    DHS_ASSERT(s.table->capacity_tokens() >= s.table->n_tokens() + s.n_new);
    for (int64_t i = 0; i < s.n_new; ++i, ++t) {
      DHS_CHECK(s.tokens[i] >= 0 && s.tokens[i] < cfg_.vocab_size, "token id {} out of range", s.tokens[i]);
      ids[t] = s.tokens[i];
      const int64_t p = s.table->n_tokens() + i;
      pos[t] = static_cast<int32_t>(p);
      for (int64_t l = 0; l < L; ++l)
        for (int64_t h = 0; h < Hkv; ++h) {
          int row;
          dst[(l * T + t) * Hkv + h] = s.table->page_of_token(static_cast<int>(l), static_cast<int>(h), p, &row).slot;
        }
    }
    q_indptr[r + 1] = static_cast<int32_t>(t);
    seq_len[r] = static_cast<int32_t>(s.table->n_tokens() + s.n_new);
    req_slot[r] = s.req_slot;
    last_row[r] = static_cast<int32_t>(t - 1);
    table_->sync(s.req_slot, *s.table, stream_);
  }
  auto cp = [&](int32_t* d, const int32_t* h, int64_t n) {
    DHS_CUDA_CHECK(cudaMemcpyAsync(d, h, static_cast<size_t>(n) * 4, cudaMemcpyHostToDevice, stream_));
  };
  cp(ids_d_, ids, T);
  cp(pos_d_, pos, T);
  // dst_slot_d_ is laid out [L, T_step, Hkv] with this step's T (the graph for batch B reads the same layout).
  cp(dst_slot_d_, dst, L * T * Hkv);
  cp(q_indptr_d_, q_indptr, n_req + 1);
  cp(seq_len_d_, seq_len, n_req);
  cp(req_slot_d_, req_slot, n_req);
  cp(last_row_d_, last_row, n_req);
  (void)decode;
}

void LlamaCuda::run_layers(int n_tok, int n_req, bool decode, int phase) {
  const int64_t H = cfg_.hidden, D = cfg_.head_dim, Hq = cfg_.n_heads_q, Hkv = cfg_.n_heads_kv, F = cfg_.ffn_hidden;
  const int64_t V = cfg_.vocab_size, QKV = (Hq + 2 * Hkv) * D;
  const int64_t T = n_tok;
  const float scale = 1.0f / std::sqrt(static_cast<float>(D));

  cuda::EmbeddingParams ep;
  ep.table = tok_embd_;
  ep.ids = ids_d_;
  ep.out = x_d_;
  ep.out_dtype = DType::F32;
  ep.n_tok = T;
  ep.vocab = V;
  ep.hidden = H;
  cuda::launch_embedding(ep, stream_);

  for (int l = 0; l < static_cast<int>(cfg_.n_layers); ++l) {
    const Layer& Ly = layers_[static_cast<size_t>(l)];
    // h = rmsnorm(x) (the previous layer's down projection was added into x by its GEMM).
    cuda::AddRmsNormParams an;
    an.x = x_d_;
    an.weight = Ly.attn_norm;
    an.y = h_d_;
    an.n_rows = T;
    an.n = H;
    an.eps = cfg_.rms_eps;
    cuda::launch_add_rms_norm(an, stream_);
    gemm_->run(Ly.w_qkv, h_d_, qkv_d_, T, H, QKV, cuda::GemmOut::BF16, stream_);

    cuda::RopeAppendParams ra;
    ra.q = qkv_d_;
    ra.k = qkv_d_ + Hq * D;
    ra.v = qkv_d_ + (Hq + Hkv) * D;
    ra.in_dtype = DType::BF16;
    ra.q_ld = ra.k_ld = ra.v_ld = QKV;
    ra.q_bias = Ly.bq;
    ra.k_bias = Ly.bk;
    ra.v_bias = Ly.bv;
    ra.q_norm = Ly.q_norm;
    ra.k_norm = Ly.k_norm;
    ra.norm_eps = cfg_.rms_eps;
    ra.q_out = q_d_;
    ra.q_out_ld = Hq * D;
    ra.pos = pos_d_;
    ra.inv_freq = inv_freq_;
    ra.style = cfg_.rope_style;
    ra.dst_slot = dst_slot_d_ + static_cast<int64_t>(l) * T * Hkv;
    ra.k_pool = pool_->k_d();
    ra.v_pool = pool_->v_d();
    ra.n_pages = pool_->n_pages();
    ra.page_size = opt_.page_size;
    ra.n_tok = T;
    ra.n_heads_q = static_cast<int>(Hq);
    ra.n_heads_kv = static_cast<int>(Hkv);
    ra.head_dim = static_cast<int>(D);
    cuda::launch_rope_append(ra, stream_);
    for (cuda::DevicePageSummaries* store : {sum_minmax_.get(), sum_meanvar_.get()}) {
      if (!store) continue;
      // Every step keeps the summaries of the pages it wrote (prefill too: decode scores them).
      cuda::SummarizePagesParams sm;
      sm.k_pool = pool_->k_d();
      sm.summaries = store->data_d();
      sm.pos = pos_d_;
      sm.dst_slot = ra.dst_slot;
      sm.kind = store->kind();
      sm.n_pages = pool_->n_pages();
      sm.page_size = opt_.page_size;
      sm.n_tok = T;
      sm.n_heads_kv = static_cast<int>(Hkv);
      sm.head_dim = static_cast<int>(D);
      cuda::launch_summarize_pages(sm, stream_);
    }
    if (sketch_) {
      cuda::SketchKeysParams sk;
      sk.k_pool = pool_->k_d();
      sk.codes = sketch_->codes_d();
      sk.steps = sketch_->steps_d();
      sk.pos = pos_d_;
      sk.dst_slot = ra.dst_slot;
      sk.n_pages = pool_->n_pages();
      sk.page_size = opt_.page_size;
      sk.n_tok = T;
      sk.n_heads_kv = static_cast<int>(Hkv);
      sk.head_dim = static_cast<int>(D);
      cuda::launch_sketch_keys(sk, stream_);
    }

    // The dense policy, on the device: this layer's page lists from the device page table.
    cuda::DenseListsParams dl;
    dl.table = table_->table_d();
    dl.req_slot = req_slot_d_;
    dl.seq_len = seq_len_d_;
    dl.indptr = indptr_d_;
    dl.slots = slots_d_;
    dl.page_pos = page_pos_d_;
    dl.n_requests = n_req;
    dl.n_layers = static_cast<int>(cfg_.n_layers);
    dl.n_heads_kv = static_cast<int>(Hkv);
    dl.max_pages = table_->max_pages();
    dl.layer = l;
    dl.page_size = opt_.page_size;
    cuda::launch_dense_lists(dl, stream_);

    if (decode) {
      const int32_t *kv_indptr = indptr_d_, *kv_slots = slots_d_, *kv_page_pos = page_pos_d_;
      const bool reuse = step_sparse_ && schedule_.every() > 1;
      // This layer's stored selection (reuse only): written where it selects, read where it does not.
      int32_t *st_indptr = nullptr, *st_slots = nullptr, *st_page_pos = nullptr, *st_seq_len = nullptr;
      if (reuse) {
        const int64_t B = opt_.max_batch, nnz_max = sel_ws_->max_nnz();
        st_indptr = st_indptr_d_ + l * (B * Hkv + 1);
        st_slots = st_slots_d_ + l * nnz_max;
        st_page_pos = st_page_pos_d_ + l * nnz_max;
        st_seq_len = st_seq_len_d_ + l * B;
      }
      if (reuse && !schedule_.selects(l, phase)) {
        // The layer's last selection, grown by the pages written since (reuse_lists.h).
        cuda::ReuseListsParams rp;
        rp.dense_indptr = indptr_d_;
        rp.dense_slots = slots_d_;
        rp.seq_len = seq_len_d_;
        rp.sel_indptr = st_indptr;
        rp.sel_slots = st_slots;
        rp.sel_page_pos = st_page_pos;
        rp.sel_seq_len = st_seq_len;
        rp.indptr = sp_indptr_d_;
        rp.slots = sp_slots_d_;
        rp.page_pos = sp_page_pos_d_;
        rp.stats = sparse_stats_d_ + static_cast<int64_t>(l) * Hkv * 2;
        rp.n_requests = n_req;
        rp.n_heads_kv = static_cast<int>(Hkv);
        rp.page_size = opt_.page_size;
        cuda::launch_reuse_lists(rp, stream_);
        kv_indptr = sp_indptr_d_;
        kv_slots = sp_slots_d_;
        kv_page_pos = sp_page_pos_d_;
      } else if (step_sparse_) {
        // Score and select on the device; attention reads the selected lists in place.
        cuda::PageSelectParams sp = sel_;
        sp.dense_indptr = indptr_d_;
        sp.dense_slots = slots_d_;
        sp.dense_page_pos = page_pos_d_;
        sp.seq_len = seq_len_d_;
        sp.q = q_d_;
        sp.q_indptr = q_indptr_d_;
        if (!sp.sketch_codes) sp.summaries = (sp.kind == cuda::SummaryKind::MinMax ? sum_minmax_ : sum_meanvar_)->data_d();
        if (sp.budget_frac) sp.budget_frac = budget_frac_d_ + static_cast<int64_t>(l) * Hkv;
        sp.indptr = reuse ? st_indptr : sp_indptr_d_;
        sp.slots = reuse ? st_slots : sp_slots_d_;
        sp.page_pos = reuse ? st_page_pos : sp_page_pos_d_;
        sp.sel_seq_len = st_seq_len;  // (null without reuse) kept for the steps that reuse these lists
        sp.stats = sparse_stats_d_ + static_cast<int64_t>(l) * Hkv * 2;
        sp.n_requests = n_req;
        sp.n_heads_q = static_cast<int>(Hq);
        sp.n_heads_kv = static_cast<int>(Hkv);
        sp.head_dim = static_cast<int>(D);
        sp.page_size = opt_.page_size;
        sp.scale = scale;
        sel_ws_->bind(&sp);
        cuda::launch_page_select(sp, stream_);
        kv_indptr = sp.indptr;
        kv_slots = sp.slots;
        kv_page_pos = sp.page_pos;
      }
      cuda::DecodeAttentionParams p;
      p.q = q_d_;
      p.out = att_d_;
      p.q_indptr = q_indptr_d_;
      p.kv_indptr = kv_indptr;
      p.kv_slots = kv_slots;
      p.kv_page_pos = kv_page_pos;
      p.seq_len = seq_len_d_;
      p.k_pool = pool_->k_d();
      p.v_pool = pool_->v_d();
      p.ws_o = dws_->o_d();
      p.ws_state = dws_->state_d();
      p.n_requests = n_req;
      p.n_heads_q = static_cast<int>(Hq);
      p.n_heads_kv = static_cast<int>(Hkv);
      p.head_dim = static_cast<int>(D);
      p.max_q_len = 1;
      p.ws_q_vecs = dws_->q_vecs();
      p.n_workers = dws_->n_workers();
      p.stages = dws_->stages();
      p.scale = scale;
      cuda::launch_decode_attention(p, stream_);
    } else {
      cuda::PrefillAttentionParams p;
      p.q = q_d_;
      p.out = att_d_;
      p.k_pool = pool_->k_d();
      p.v_pool = pool_->v_d();
      p.q_indptr = q_indptr_d_;
      p.kv_indptr = indptr_d_;
      p.slots = slots_d_;
      p.page_pos = page_pos_d_;
      p.seq_len = seq_len_d_;
      p.n_requests = n_req;
      p.n_rows = static_cast<int>(T);
      p.n_heads_q = static_cast<int>(Hq);
      p.n_heads_kv = static_cast<int>(Hkv);
      p.head_dim = static_cast<int>(D);
      p.page_size = opt_.page_size;
      p.scale = scale;
      cuda::launch_prefill_attention(p, stream_);
    }
    // x += att W_o^T, accumulated by the GEMM into the fp32 residual stream.
    gemm_->run(Ly.w_o, att_d_, x_d_, T, Hq * D, H, cuda::GemmOut::F32, stream_, 1.0f);
    an.weight = Ly.ffn_norm;
    cuda::launch_add_rms_norm(an, stream_);
    gemm_->run(Ly.w_gu, h_d_, gu_d_, T, H, 2 * F, cuda::GemmOut::BF16, stream_);
    cuda::SwiGluParams sg;
    sg.gate = gu_d_;
    sg.up = gu_d_ + F;
    sg.in_dtype = DType::BF16;
    sg.in_ld = 2 * F;
    sg.out = act_d_;
    sg.out_ld = F;
    sg.n_tok = T;
    sg.n = F;
    cuda::launch_swiglu(sg, stream_);
    gemm_->run(Ly.w_down, act_d_, x_d_, T, F, H, cuda::GemmOut::F32, stream_, 1.0f);
  }
  // Last row of each request -> final norm -> logits -> greedy ids.
  cuda::GatherRowsParams gr;
  gr.src = x_d_;
  gr.rows = last_row_d_;
  gr.dst = last_x_d_;
  gr.n_out = n_req;
  gr.n = H;
  cuda::launch_gather_rows(gr, stream_);
  cuda::AddRmsNormParams fn;
  fn.x = last_x_d_;
  fn.weight = output_norm_;
  fn.y = hlast_d_;
  fn.n_rows = n_req;
  fn.n = H;
  fn.eps = cfg_.rms_eps;
  cuda::launch_add_rms_norm(fn, stream_);
  gemm_->run(output_, hlast_d_, logits_d_, n_req, H, V, cuda::GemmOut::F32, stream_);
  cuda::SampleParams sp;
  sp.logits = logits_d_;
  sp.rows = samp_rows_d_;
  sp.rng_offset = rng_d_;
  sp.out = out_ids_d_;
  sp.n_rows = n_req;
  sp.vocab = static_cast<int>(V);
  cuda::launch_sample(sp, stream_);
}

void LlamaCuda::forward(const std::vector<Seq>& batch, std::vector<float>* logits, bool use_graph) {
  bool decode = true;
  int64_t T = 0;
  for (const Seq& s : batch) {
    decode = decode && s.n_new == 1;
    T += s.n_new;
  }
  const int n_req = static_cast<int>(batch.size());
  upload_step(batch, decode);
  // Which layers run the policy this step (sparse/reselect_schedule.h): the stored selections
  // serve only the same requests in the same rows, continued by one token.
  int phase = ReselectSchedule::kFull;
  std::vector<int> req_slots;
  for (const Seq& s : batch) req_slots.push_back(s.req_slot);
  // --dense-below N: a step whose requests are all shorter than N tokens (this step's token
  // included) runs the dense step, and so does one whose requests hold fewer than
  // --sparse-min-tokens in all: the selection would cost more than it saves there
  // (docs/benchmarks.md). A batch that mixes short and long requests selects, and the select
  // kernel gives the short ones their dense lists.
  step_sparse_ = sparse_ && decode;
  if (step_sparse_ && (dense_below_ > 0 || min_step_tokens_ > 0)) {
    std::vector<int64_t> seq_len;
    for (const Seq& s : batch) seq_len.push_back(s.table->n_tokens() + s.n_new);
    if (!step_runs_policy(seq_len, dense_below_, min_step_tokens_)) {
      step_sparse_ = false;
      ++threshold_dense_steps_;
      for (int64_t n : seq_len) dense_step_pages_ += static_cast<uint64_t>((n + opt_.page_size - 1) / opt_.page_size);
    }
  }
  if (step_sparse_) {
    std::vector<const void*> ids;
    std::vector<int64_t> n_before;
    for (const Seq& s : batch) {
      ids.push_back(s.table);
      n_before.push_back(s.table->n_tokens());
    }
    if (req_slots != last_req_slots_) schedule_.invalidate();
    phase = schedule_.begin_step(ids, n_before);
  } else {
    schedule_.invalidate();
  }
  last_req_slots_ = std::move(req_slots);
  if (decode && use_graph) {
    DHS_CUDA_CHECK(cudaGraphLaunch(decode_graph(static_cast<int>(T), n_req, phase), stream_));
  } else {
    run_layers(static_cast<int>(T), n_req, decode, phase);
  }
  DHS_CUDA_CHECK(cudaGetLastError());
  for (const Seq& s : batch) s.table->commit(s.n_new);
  last_n_req_ = n_req;
  if (logits) {
    logits->resize(static_cast<size_t>(n_req * cfg_.vocab_size));
    DHS_CUDA_CHECK(cudaMemcpyAsync(logits->data(), logits_d_, logits->size() * 4, cudaMemcpyDeviceToHost, stream_));
  }
  DHS_CUDA_CHECK(cudaStreamSynchronize(stream_));
}

cudaGraphExec_t LlamaCuda::decode_graph(int n_tok, int n_req, int phase) {
  const std::string base = step_sparse_ || !sparse_ ? policy_key_ : std::string("dense-step");
  const std::string key = phase == ReselectSchedule::kFull ? base : fmt::format("{}#{}", base, phase);
  auto it = graphs_.find({key, n_req});
  if (it == graphs_.end()) {
    // Capture once per batch size (and phase); replays read the same step-input buffers.
    cudaGraph_t g;
    DHS_CUDA_CHECK(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal));
    run_layers(n_tok, n_req, true, phase);
    DHS_CUDA_CHECK(cudaStreamEndCapture(stream_, &g));
    cudaGraphExec_t exec;
    DHS_CUDA_CHECK(cudaGraphInstantiate(&exec, g, 0));
    DHS_CUDA_CHECK(cudaGraphDestroy(g));
    it = graphs_.emplace(std::make_pair(key, n_req), exec).first;
  }
  return it->second;
}

std::vector<int32_t> LlamaCuda::greedy_ids() {
  std::vector<int32_t> ids(static_cast<size_t>(last_n_req_));
  DHS_CUDA_CHECK(cudaMemcpy(ids.data(), out_ids_d_, ids.size() * 4, cudaMemcpyDeviceToHost));
  return ids;
}

double CudaSparsityStats::read_frac() const {
  uint64_t r = 0, t = 0;
  for (size_t i = 0; i < read.size(); ++i) {
    r += read[i];
    t += total[i];
  }
  return t > 0 ? static_cast<double>(r) / static_cast<double>(t) : 1.0;
}

void LlamaCuda::set_sparsity(const PolicyConfig& pc, const std::vector<float>& budget_frac) {
  {
    PolicyConfig check = pc;  // the CPU factory's validation: one set of rules for both backends
    if (!budget_frac.empty() && check.budget == 0) check.budget = 1;  // per-head budgets stand in for --budget
    (void)make_policy(check);
  }
  const int64_t L = cfg_.n_layers, Hkv = cfg_.n_heads_kv;
  // Everything a captured step bakes in (the select kernels' parameters) is in the key.
  policy_key_ = fmt::format("{}/{}/{}/{}/{}/{}/{}/{}/{}/{}", pc.name, pc.gamma, pc.budget, pc.n_sink, pc.n_recent,
                            pc.estimator, static_cast<int>(pc.combine), pc.dense_below, budget_frac.empty() ? 0 : 1,
                            pc.reselect_every);
  sparse_ = pc.name != "dense";
  dense_below_ = pc.dense_below;
  min_step_tokens_ = pc.min_step_tokens;
  schedule_ = ReselectSchedule(sparse_ ? pc.reselect_every : 1);
  if (!sparse_) return;
  DHS_CHECK(sel_ws_ != nullptr, "--sparse-policy {}: the CUDA model was built without page summaries", pc.name);
  if (pc.reselect_every > 1 && st_indptr_d_ == nullptr) {
    // Once per model: every layer's selection kept for the steps that reuse it.
    const int64_t B = opt_.max_batch, L = cfg_.n_layers, n_lists = B * cfg_.n_heads_kv, nnz = sel_ws_->max_nnz();
    st_indptr_d_ = static_cast<int32_t*>(dalloc(static_cast<size_t>(L * (n_lists + 1)) * 4));
    st_slots_d_ = static_cast<int32_t*>(dalloc(static_cast<size_t>(L * nnz) * 4));
    st_page_pos_d_ = static_cast<int32_t*>(dalloc(static_cast<size_t>(L * nnz) * 4));
    st_seq_len_d_ = static_cast<int32_t*>(dalloc(static_cast<size_t>(L * B) * 4));
  }
  const bool scoring = pc.name != "sinkwindow";
  const bool sketch = pc.estimator == "sketch4";
  DHS_CHECK(!scoring || sketch || pc.estimator == "minmax" || pc.estimator == "meanspread" || pc.estimator == "gaussian",
            "--estimator {}: the CUDA backend has minmax, meanspread, gaussian and sketch4", pc.estimator);
  // gaussian reads the same mean / variance summaries as meanspread.
  const auto kind = pc.estimator == "minmax" ? cuda::SummaryKind::MinMax : cuda::SummaryKind::MeanSpread;
  DHS_CHECK(!scoring || (sketch ? sketch_ != nullptr
                                : kind == cuda::SummaryKind::MinMax ? sum_minmax_ != nullptr : sum_meanvar_ != nullptr),
            "--sparse-policy {}: estimator {} needs summaries the CUDA model does not keep", pc.name, pc.estimator);
  cuda::PageSelectParams p;
  p.kind = kind;
  if (sketch) {
    p.sketch_codes = sketch_->codes_d();
    p.sketch_steps = sketch_->steps_d();
  }
  p.gaussian = pc.estimator == "gaussian";
  p.gamma = static_cast<float>(pc.gamma);
  p.n_sink = pc.n_sink;
  p.n_recent = pc.n_recent;
  p.combine_max = pc.combine == GroupCombine::Max;
  p.dense_below = static_cast<int>(std::min<int64_t>(pc.dense_below, INT32_MAX));
  if (pc.name == "coverage") {
    p.rule = cuda::SelectRule::Coverage;
  } else if (pc.name == "topk") {
    p.rule = cuda::SelectRule::TopK;
    p.budget = pc.budget;
  } else if (pc.name == "sinkwindow") {
    p.rule = cuda::SelectRule::SinkWindow;
    p.n_recent = pc.budget > 0 ? pc.budget - pc.n_sink : pc.n_recent;  // as make_policy reads --budget
  } else if (pc.name == "solohead") {
    p.share_heads = true;
    p.rule = pc.budget > 0 ? cuda::SelectRule::TopK : cuda::SelectRule::Coverage;
    p.budget = pc.budget;
  } else {
    throw Error(fmt::format("--sparse-policy {}: not on the CUDA backend", pc.name));
  }
  if (!budget_frac.empty()) {
    DHS_CHECK(pc.name == "topk", "per-head budget fractions go with --sparse-policy topk");
    DHS_CHECK(static_cast<int64_t>(budget_frac.size()) == L * Hkv, "budget fractions: {} values for {} layers x {} KV heads",
              budget_frac.size(), L, Hkv);
    DHS_CUDA_CHECK(cudaMemcpy(budget_frac_d_, budget_frac.data(), budget_frac.size() * 4, cudaMemcpyHostToDevice));
    p.budget_frac = budget_frac_d_;
  }
  sel_ = p;
}

CudaSparsityStats LlamaCuda::sparsity_stats() const {
  CudaSparsityStats st;
  if (!sparse_stats_d_) return st;
  const size_t n = static_cast<size_t>(cfg_.n_layers * cfg_.n_heads_kv);
  std::vector<unsigned long long> h(2 * n);
  DHS_CUDA_CHECK(cudaMemcpy(h.data(), sparse_stats_d_, h.size() * 8, cudaMemcpyDeviceToHost));
  st.read.resize(n);
  st.total.resize(n);
  for (size_t i = 0; i < n; ++i) {
    st.read[i] = h[2 * i] + dense_step_pages_;
    st.total[i] = h[2 * i + 1] + dense_step_pages_;
  }
  return st;
}

void LlamaCuda::reset_sparsity_stats() {
  dense_step_pages_ = 0;
  threshold_dense_steps_ = 0;
  if (sparse_stats_d_)
    DHS_CUDA_CHECK(cudaMemset(sparse_stats_d_, 0, static_cast<size_t>(cfg_.n_layers * cfg_.n_heads_kv * 2) * 8));
}

double LlamaCuda::time_decode_step(const std::vector<Seq>& batch, int n_iters) {
  // One real step (captures the graph), then replays of it: the same positions are
  // rewritten each time, which costs what a real step costs.
  for (const Seq& s : batch) DHS_CHECK(s.n_new == 1, "time_decode_step: decode batches only");
  schedule_.invalidate();  // the first step selects at every layer
  forward(batch, nullptr, true);
  for (const Seq& s : batch) s.table->truncate(allocator(), s.table->n_tokens() - 1);
  // With --reselect-every R the steps cycle through R graphs (each selecting at a different
  // 1/R of the layers, reusing the first step's selections at the others): all are timed.
  const int n_req = static_cast<int>(batch.size());
  std::vector<cudaGraphExec_t> cycle;
  if (step_sparse_ && schedule_.every() > 1)
    for (int ph = 0; ph < schedule_.every(); ++ph) cycle.push_back(decode_graph(n_req, n_req, ph));
  else
    cycle.push_back(decode_graph(n_req, n_req, ReselectSchedule::kFull));
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
