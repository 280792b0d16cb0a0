#include "model/arch/llama_cpu.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>

#include "backend/cpu/attention.h"
#include "backend/cpu/ops.h"
#include "core/error.h"
#include "core/thread_pool.h"
#include "kv/page_lists.h"
#include "model/tensor_load.h"
#include "sparse/mass_estimator.h"

namespace dhs {

namespace {

CpuMatrix load_matrix(const WeightSource& src, const std::string& name, int64_t rows, int64_t cols,
                      CpuWeightType wt) {
  std::vector<float> f = load_tensor_f32(src, name, {rows, cols});
  return CpuMatrix(f.data(), rows, cols, wt);
}

}  // namespace

LlamaCpu::LlamaCpu(const WeightSource& src, CpuWeightType wt, const Progress& progress) : cfg_(src.config()) {
  const int64_t H = cfg_.hidden, D = cfg_.head_dim, Hq = cfg_.n_heads_q, Hkv = cfg_.n_heads_kv;
  const int64_t F = cfg_.ffn_hidden, V = cfg_.vocab_size;
  const int64_t total = cfg_.n_layers + 2;
  int64_t done = 0;
  auto tick = [&] {
    if (progress) progress(++done, total);
  };
  tok_embd_ = load_matrix(src, "token_embd.weight", V, H, wt);
  output_norm_ = load_tensor_f32(src, "output_norm.weight", {H});
  if (!cfg_.tied_embeddings) output_ = load_matrix(src, "output.weight", V, H, wt);
  tick();
  layers_.resize(static_cast<size_t>(cfg_.n_layers));
  for (int64_t l = 0; l < cfg_.n_layers; ++l) {
    Layer& L = layers_[static_cast<size_t>(l)];
    const std::string p = fmt::format("blk.{}.", l);
    L.attn_norm = load_tensor_f32(src, p + "attn_norm.weight", {H});
    L.ffn_norm = load_tensor_f32(src, p + "ffn_norm.weight", {H});
    L.wq = load_matrix(src, p + "attn_q.weight", Hq * D, H, wt);
    L.wk = load_matrix(src, p + "attn_k.weight", Hkv * D, H, wt);
    L.wv = load_matrix(src, p + "attn_v.weight", Hkv * D, H, wt);
    L.wo = load_matrix(src, p + "attn_output.weight", H, Hq * D, wt);
    L.w_gate = load_matrix(src, p + "ffn_gate.weight", F, H, wt);
    L.w_up = load_matrix(src, p + "ffn_up.weight", F, H, wt);
    L.w_down = load_matrix(src, p + "ffn_down.weight", H, F, wt);
    if (cfg_.qkv_bias) {
      L.bq = load_tensor_f32(src, p + "attn_q.bias", {Hq * D});
      L.bk = load_tensor_f32(src, p + "attn_k.bias", {Hkv * D});
      L.bv = load_tensor_f32(src, p + "attn_v.bias", {Hkv * D});
    }
    if (cfg_.qk_norm) {
      L.q_norm = load_tensor_f32(src, p + "attn_q_norm.weight", {D});
      L.k_norm = load_tensor_f32(src, p + "attn_k_norm.weight", {D});
    }
    tick();
  }
  inv_freq_.resize(static_cast<size_t>(D / 2));
  cpu::rope_inv_freq(cfg_, inv_freq_.data());
  tick();
}

size_t LlamaCpu::weight_bytes() const {
  size_t n = tok_embd_.n_bytes() + output_.n_bytes();
  for (const auto& L : layers_)
    n += L.wq.n_bytes() + L.wk.n_bytes() + L.wv.n_bytes() + L.wo.n_bytes() + L.w_gate.n_bytes() +
         L.w_up.n_bytes() + L.w_down.n_bytes();
  return n;
}

void LlamaCpu::forward(const std::vector<Seq>& batch, PagePool& pool, std::vector<float>* logits,
                       bool all_logits) {
  const int64_t H = cfg_.hidden, D = cfg_.head_dim, Hq = cfg_.n_heads_q, Hkv = cfg_.n_heads_kv;
  const int64_t F = cfg_.ffn_hidden, V = cfg_.vocab_size;
  DHS_ASSERT(!batch.empty());

  // Flatten the batch: token t of the step belongs to sequence seq_of[t] at position pos[t].
  std::vector<int32_t> q_indptr{0}, pos, tokens, seq_len;
  std::vector<const PageTable*> tables;
  for (const Seq& s : batch) {
    DHS_ASSERT(s.n_new > 0 && s.table->capacity_tokens() >= s.table->n_tokens() + s.n_new);
    for (int64_t i = 0; i < s.n_new; ++i) {
      DHS_CHECK(s.tokens[i] >= 0 && s.tokens[i] < V, "token id {} out of range [0, {})", s.tokens[i], V);
      tokens.push_back(s.tokens[i]);
      pos.push_back(static_cast<int32_t>(s.table->n_tokens() + i));
    }
    q_indptr.push_back(static_cast<int32_t>(tokens.size()));
    seq_len.push_back(static_cast<int32_t>(s.table->n_tokens() + s.n_new));
    tables.push_back(s.table);
  }
  const int64_t T = static_cast<int64_t>(tokens.size());
  const bool decode_step = T == static_cast<int64_t>(batch.size());

  std::vector<float> x(static_cast<size_t>(T * H));          // [T, hidden] residual stream
  std::vector<float> h(static_cast<size_t>(T * H));          // [T, hidden] normed
  std::vector<float> q(static_cast<size_t>(T * Hq * D));     // [T, n_heads_q, head_dim]
  std::vector<float> k(static_cast<size_t>(T * Hkv * D));    // [T, n_heads_kv, head_dim]
  std::vector<float> v(static_cast<size_t>(T * Hkv * D));    // [T, n_heads_kv, head_dim]
  std::vector<float> att(static_cast<size_t>(T * Hq * D));   // [T, n_heads_q, head_dim]
  std::vector<float> o(static_cast<size_t>(T * H));          // [T, hidden]
  std::vector<float> gate(static_cast<size_t>(T * F)), up(static_cast<size_t>(T * F));  // [T, ffn]

  for (int64_t t = 0; t < T; ++t) tok_embd_.row_to_f32(tokens[static_cast<size_t>(t)], x.data() + t * H);
  dump("embd", -1, x.data(), T, H);

  const float scale = 1.0f / std::sqrt(static_cast<float>(D));
  for (int l = 0; l < static_cast<int>(cfg_.n_layers); ++l) {
    const Layer& L = layers_[static_cast<size_t>(l)];
    cpu::rms_norm(x.data(), L.attn_norm.data(), h.data(), T, H, cfg_.rms_eps);
    dump("attn_norm", l, h.data(), T, H);
    cpu::matmul(L.wq, h.data(), q.data(), T, L.bq.empty() ? nullptr : L.bq.data());
    cpu::matmul(L.wk, h.data(), k.data(), T, L.bk.empty() ? nullptr : L.bk.data());
    cpu::matmul(L.wv, h.data(), v.data(), T, L.bv.empty() ? nullptr : L.bv.data());
    if (cfg_.qk_norm) {
      cpu::rms_norm(q.data(), L.q_norm.data(), q.data(), T * Hq, D, cfg_.rms_eps);
      cpu::rms_norm(k.data(), L.k_norm.data(), k.data(), T * Hkv, D, cfg_.rms_eps);
    }
    cpu::rope(q.data(), pos.data(), T, Hq, D, inv_freq_.data(), cfg_.rope_style);
    cpu::rope(k.data(), pos.data(), T, Hkv, D, inv_freq_.data(), cfg_.rope_style);
    dump("q_rope", l, q.data(), T, Hq * D);
    dump("k_rope", l, k.data(), T, Hkv * D);
    for (size_t s = 0; s < batch.size(); ++s) {
      cpu::append_kv(*batch[s].table, pool, l, k.data() + q_indptr[s] * Hkv * D, v.data() + q_indptr[s] * Hkv * D,
                     pos.data() + q_indptr[s], batch[s].n_new);
      if (summaries_)
        append_summaries(*batch[s].table, *summaries_, l, k.data() + q_indptr[s] * Hkv * D, pos.data() + q_indptr[s],
                         batch[s].n_new);
    }

    PageLists lists;
    // Sparse selection serves decode steps; prefill reads every page (a chunk's
    // queries span the whole prompt, and its own pages are not summarised yet).
    if (policy_ && decode_step) {
      SelectionInput in{&tables, l, &seq_len, q.data(), q_indptr.data(), static_cast<int>(Hq), scale, summaries_};
      lists = policy_->select(in);
      stats_.pages_read += lists.nnz();
      for (size_t r = 0; r < seq_len.size(); ++r)
        stats_.pages_total += Hkv * ((seq_len[r] + pool.page_size() - 1) / pool.page_size());
    } else {
      lists = dense_page_lists(tables, l, seq_len);
    }
    cpu::AttentionParams ap;
    ap.q = q.data();
    ap.out = att.data();
    ap.q_indptr = q_indptr.data();
    ap.lists = &lists;
    ap.pool = &pool;
    ap.n_heads_q = static_cast<int>(Hq);
    ap.n_heads_kv = static_cast<int>(Hkv);
    ap.head_dim = static_cast<int>(D);
    ap.scale = scale;
    cpu::attention(ap);
    dump("attn_out", l, att.data(), T, Hq * D);
    if (policy_ && decode_step && std::getenv("DHS_SPARSE_DIAG")) {
      // Diagnostic: the true softmax mass of the chosen pages, exp(lse_sparse - lse_dense) per q head.
      std::vector<float> lse_s(static_cast<size_t>(T * Hq)), lse_d(static_cast<size_t>(T * Hq)), tmp(att.size());
      const PageLists dense = dense_page_lists(tables, l, seq_len);
      cpu::AttentionParams a2 = ap;
      a2.out = tmp.data();
      a2.lse = lse_s.data();
      cpu::attention(a2);
      a2.lists = &dense;
      a2.lse = lse_d.data();
      cpu::attention(a2);
      static std::vector<double> sum(64, 0.0), mn(64, 1.0);
      static std::vector<int64_t> cnt(64, 0);
      for (int64_t i = 0; i < T * Hq; ++i) {
        const double c = std::exp(static_cast<double>(lse_s[static_cast<size_t>(i)]) - lse_d[static_cast<size_t>(i)]);
        sum[static_cast<size_t>(l)] += c;
        if (c < 0.3 && std::getenv("DHS_SPARSE_DIAG2")) {
          // Which pages hold the missed mass, and how the estimate ranked them.
          const int hq = static_cast<int>(i % Hq), hk = hq / static_cast<int>(Hq / Hkv);
          const PageTable& tb = *tables[0];
          const int64_t n_pg = (seq_len[0] + pool.page_size() - 1) / pool.page_size();
          const float* qv = q.data() + i * D;
          std::vector<double> tm(static_cast<size_t>(n_pg), 0.0);
          double mx = -1e30;
          std::vector<double> sc;
          for (int64_t pg = 0; pg < n_pg; ++pg)
            for (int r = 0; r < pool.page_size() && pg * pool.page_size() + r < seq_len[0]; ++r) {
              const float* kk = pool.k_page(tb.page(l, hk, pg)) + r * D;
              double d = 0;
              for (int64_t j = 0; j < D; ++j) d += qv[j] * kk[j];
              sc.push_back(d * scale);
              mx = std::max(mx, d * scale);
            }
          size_t t = 0;
          double z = 0;
          for (int64_t pg = 0; pg < n_pg; ++pg)
            for (int r = 0; r < pool.page_size() && pg * pool.page_size() + r < seq_len[0]; ++r, ++t) {
              tm[static_cast<size_t>(pg)] += std::exp(sc[t] - mx);
              z += std::exp(sc[t] - mx);
            }
          int best = 0;
          for (int64_t pg = 0; pg < n_pg; ++pg) if (tm[static_cast<size_t>(pg)] > tm[static_cast<size_t>(best)]) best = static_cast<int>(pg);
          bool chosen = false;
          for (int32_t e = lists.row_begin(0, hk); e < lists.row_end(0, hk); ++e) chosen |= lists.page_pos[static_cast<size_t>(e)] == best;
          MassQuery mq{q.data(), 0, 1, static_cast<int>(Hq), scale, seq_len[0]};
          std::vector<double> est;
          estimate_page_mass(MinMaxEstimator(), *summaries_, tb, l, hk, mq, GroupCombine::Sum, &est);
          int rank = 0;
          for (double v : est) rank += v > est[static_cast<size_t>(best)];
          std::fprintf(stderr, "diag2 layer %d qhead %d kept %.3f: heaviest page %d of %lld holds %.3f (chosen %d), est %.2e rank %d, est max %.2e\n",
                       l, hq, c, best, static_cast<long long>(n_pg), tm[static_cast<size_t>(best)] / z, chosen, est[static_cast<size_t>(best)], rank,
                       *std::max_element(est.begin(), est.end()));
        }
        mn[static_cast<size_t>(l)] = std::min(mn[static_cast<size_t>(l)], c);
        ++cnt[static_cast<size_t>(l)];
      }
      if (l + 1 == cfg_.n_layers) {
        std::fprintf(stderr, "diag true mass kept per layer (mean/min):");
        for (int64_t k = 0; k < cfg_.n_layers; ++k)
          std::fprintf(stderr, " %lld:%.3f/%.3f", static_cast<long long>(k), sum[static_cast<size_t>(k)] / cnt[static_cast<size_t>(k)], mn[static_cast<size_t>(k)]);
        std::fprintf(stderr, "\n");
      }
    }

    cpu::matmul(L.wo, att.data(), o.data(), T);
    cpu::add_inplace(x.data(), o.data(), T * H);
    cpu::rms_norm(x.data(), L.ffn_norm.data(), h.data(), T, H, cfg_.rms_eps);
    cpu::matmul(L.w_gate, h.data(), gate.data(), T);
    cpu::matmul(L.w_up, h.data(), up.data(), T);
    cpu::silu_mul(gate.data(), up.data(), gate.data(), T, F);
    cpu::matmul(L.w_down, gate.data(), o.data(), T);
    dump("ffn_out", l, o.data(), T, H);
    cpu::add_inplace(x.data(), o.data(), T * H);
    dump("l_out", l, x.data(), T, H);
  }
  for (const Seq& s : batch) s.table->commit(s.n_new);

  // Rows whose logits are wanted: all, or each sequence's last token.
  std::vector<int64_t> rows;
  if (all_logits) {
    for (int64_t t = 0; t < T; ++t) rows.push_back(t);
  } else {
    for (size_t s = 0; s < batch.size(); ++s) rows.push_back(q_indptr[s + 1] - 1);
  }
  const int64_t R = static_cast<int64_t>(rows.size());
  std::vector<float> hr(static_cast<size_t>(R * H));  // [R, hidden]
  for (int64_t i = 0; i < R; ++i)
    cpu::rms_norm(x.data() + rows[static_cast<size_t>(i)] * H, output_norm_.data(), hr.data() + i * H, 1, H,
                  cfg_.rms_eps);
  dump("result_norm", -1, hr.data(), R, H);
  logits->resize(static_cast<size_t>(R * V));
  cpu::matmul(cfg_.tied_embeddings ? tok_embd_ : output_, hr.data(), logits->data(), R);
}

}  // namespace dhs
