#include "model/arch/llama_cpu.h"
#include "model/rope.h"

#include <algorithm>
#include <iterator>
#include <map>
#include <tuple>
#include <cmath>
#include <cstdio>
#include <cstdlib>

#include "backend/cpu/attention.h"
#include "backend/cpu/ops.h"
#include "core/error.h"
#include "core/merge_state.h"
#include "core/thread_pool.h"
#include "kv/page_lists.h"
#include "kv/tier_land.h"
#include "kv/tier_split.h"
#include "model/packed_weight.h"
#include "model/tensor_load.h"

namespace dhs {

namespace {

// DHS_SPARSE_DIAG=1 (CPU): the TRUE softmax mass that the chosen pages hold, per q head,
// exp(lse over the chosen pages - lse over all pages); mean and minimum per layer, printed
// to stderr after the last layer of each decode step (running figures). Costs two more
// attention passes per layer: a diagnostic, not for speed.
void report_true_mass(const cpu::AttentionParams& ap, const std::vector<const PageTable*>& tables, int layer,
                      const std::vector<int32_t>& seq_len, int n_layers) {
  const int64_t rows = ap.q_indptr[tables.size()];
  const size_t n = static_cast<size_t>(rows * ap.n_heads_q);
  std::vector<float> lse_s(n), lse_d(n), tmp(n * static_cast<size_t>(ap.head_dim));
  const PageLists dense = dense_page_lists(tables, layer, seq_len);
  cpu::AttentionParams a2 = ap;
  a2.out = tmp.data();
  a2.lse = lse_s.data();
  cpu::attention(a2);
  a2.lists = &dense;
  a2.lse = lse_d.data();
  cpu::attention(a2);
  static std::vector<double> sum(256, 0.0), mn(256, 1.0);
  static std::vector<int64_t> cnt(256, 0);
  const size_t l = static_cast<size_t>(std::min(layer, 255));
  for (size_t i = 0; i < n; ++i) {
    const double c = std::exp(static_cast<double>(lse_s[i]) - lse_d[i]);
    sum[l] += c;
    mn[l] = std::min(mn[l], c);
    ++cnt[l];
  }
  if (layer + 1 != n_layers) return;
  std::fprintf(stderr, "diag true mass kept per layer (mean/min):");
  for (int k = 0; k < std::min(n_layers, 256); ++k)
    std::fprintf(stderr, " %d:%.3f/%.3f", k, sum[static_cast<size_t>(k)] / std::max<int64_t>(1, cnt[static_cast<size_t>(k)]),
                 mn[static_cast<size_t>(k)]);
  std::fprintf(stderr, "\n");
}

}  // namespace


namespace {

CpuMatrix load_matrix(const WeightSource& src, const std::string& name, int64_t rows, int64_t cols,
                      CpuWeightType wt, bool fp8 = false) {
  std::vector<float> f = load_tensor_f32(src, name, {rows, cols});
  if (fp8) {  // the weights --quantization fp8 multiplies: row_scale * e4m3(code), in fp32
    const PackedMatrix q = quantize_fp8_rows(f.data(), rows, cols);
    for (int64_t r = 0; r < rows; ++r) unpack_row(q, r, f.data() + r * cols);
  }
  return CpuMatrix(f.data(), rows, cols, wt);
}

}  // namespace

LlamaCpu::LlamaCpu(const WeightSource& src, CpuWeightType wt, const Progress& progress, bool fp8)
    : cfg_(src.config()) {
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
    L.wq = load_matrix(src, p + "attn_q.weight", Hq * D, H, wt, fp8);
    L.wk = load_matrix(src, p + "attn_k.weight", Hkv * D, H, wt, fp8);
    L.wv = load_matrix(src, p + "attn_v.weight", Hkv * D, H, wt, fp8);
    L.wo = load_matrix(src, p + "attn_output.weight", H, Hq * D, wt, fp8);
    L.w_gate = load_matrix(src, p + "ffn_gate.weight", F, H, wt, fp8);
    L.w_up = load_matrix(src, p + "ffn_up.weight", F, H, wt, fp8);
    L.w_down = load_matrix(src, p + "ffn_down.weight", H, F, wt, fp8);
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
  rope_inv_freq(cfg_, inv_freq_.data());
  tick();
}

size_t LlamaCpu::weight_bytes() const {
  size_t n = tok_embd_.n_bytes() + output_.n_bytes();
  for (const auto& L : layers_)
    n += L.wq.n_bytes() + L.wk.n_bytes() + L.wv.n_bytes() + L.wo.n_bytes() + L.w_gate.n_bytes() +
         L.w_up.n_bytes() + L.w_down.n_bytes();
  return n;
}

namespace {

// Every page `lists` names (layer `layer`, one row per attention request and KV head) resident in
// the device tier, and the lists pointing at its device slots. The pages stay pinned until the
// caller's end_step, so a later request's recalls in the same layer do not evict them.
void make_resident(TieredKv& kv, const std::vector<const PageTable*>& tables, int layer, PageLists& lists,
                   int64_t now) {
  for (int r = 0; r < lists.n_requests; ++r) {
    // (the batch's own tables, which forward() may write: Seq::table is not const)
    PageTable& t = const_cast<PageTable&>(*tables[static_cast<size_t>(r)]);
    std::vector<PageId> ids;
    for (int h = 0; h < lists.n_heads_kv; ++h)
      for (int32_t k = lists.row_begin(r, h); k < lists.row_end(r, h); ++k)
        ids.push_back({layer, h, lists.page_pos[static_cast<size_t>(k)]});
    kv.ensure_resident(t, ids, now);
    for (int h = 0; h < lists.n_heads_kv; ++h)
      for (int32_t k = lists.row_begin(r, h); k < lists.row_end(r, h); ++k) {
        const PageRef p = t.page(layer, h, lists.page_pos[static_cast<size_t>(k)]);
        DHS_ASSERT(p.tier == Tier::Device);
        lists.slots[static_cast<size_t>(k)] = p.slot;
      }
  }
}

// The recall-ahead schedule's layer: `lists` keeps the entries whose page is in the device tier
// (pointing at their slots); `late` gets the others, pointing at their host slots, rows alike
// (kv/tier_split.h, the device's statement). Every page read is noted (TieredKv::note_reads) and
// appended to its table's `reads`. With a landing stack (kv/tier_land.h), late entries first land
// in its next slots — copied from the host tier into the device pool, the key rewritten, the
// landing appended to *landed (row's request as the sequence) — and are read from there.
struct LandingStack {
  std::span<const int32_t> slots;
  size_t used = 0;
  PagePool* device = nullptr;
  std::vector<TieredKv::Landed>* landed = nullptr;
};
void split_by_tier(TieredKv& kv, const std::vector<const PageTable*>& tables, int layer, int64_t n_device,
                   PageLists& lists, PageLists& late, std::map<const PageTable*, std::vector<PageId>>& reads, int64_t now,
                   LandingStack* land = nullptr) {
  for (int r = 0; r < lists.n_requests; ++r) {
    PageTable& t = const_cast<PageTable&>(*tables[static_cast<size_t>(r)]);
    std::vector<PageId> ids;
    for (int h = 0; h < lists.n_heads_kv; ++h)
      for (int32_t k = lists.row_begin(r, h); k < lists.row_end(r, h); ++k) {
        const int32_t pos = lists.page_pos[static_cast<size_t>(k)];
        ids.push_back({layer, h, pos});
        lists.slots[static_cast<size_t>(k)] = tier_key(t.page(layer, h, pos), n_device);
      }
    kv.note_reads(t, ids, now);
    std::vector<PageId>& all = reads[&t];
    all.insert(all.end(), ids.begin(), ids.end());
  }
  if (land && land->used < land->slots.size()) {
    std::vector<LandEntry> log;
    land_late_pages(lists, n_device, land->slots.subspan(land->used), land->device, &kv.host_pool(), &log);
    land->used += log.size();
    for (const LandEntry& e : log)
      land->landed->push_back({e.row / lists.n_heads_kv, PageId{layer, e.row % lists.n_heads_kv, e.page_pos}, e.dev_slot, e.host_slot});
  }
  PageLists dev;
  split_lists_by_tier(lists, n_device, &dev, &late);
  lists = std::move(dev);
}

// DHS_REPAIR_DIAG (a study hook, issue 22's "overlap with repair"): per selecting decode step,
// layer, request and KV head, the selected pages A against the previous step's set P of the same
// list — |A \ P| (what a repair pass would attend after the selection) and |P \ A| (what attending
// P ahead of the selection reads beyond A) — summed, printed after each step.
void report_repair(const PageLists& lists, const std::vector<const PageTable*>& tables, int layer, int n_layers) {
  struct Prev {
    int64_t n_tokens = -1;
    std::vector<int32_t> pages;
  };
  static std::map<std::tuple<uint64_t, int, int>, Prev> prev;
  static int64_t a_total = 0, added = 0, extra = 0, steps = 0;
  for (int r = 0; r < lists.n_requests; ++r)
    for (int h = 0; h < lists.n_heads_kv; ++h) {
      std::vector<int32_t> a(lists.page_pos.begin() + lists.row_begin(r, h), lists.page_pos.begin() + lists.row_end(r, h));
      std::sort(a.begin(), a.end());
      Prev& p = prev[{tables[static_cast<size_t>(r)]->id(), layer, h}];
      const int64_t n = tables[static_cast<size_t>(r)]->n_tokens();
      if (p.n_tokens == n - 1) {  // the step before, same list
        std::vector<int32_t> d;
        std::set_difference(a.begin(), a.end(), p.pages.begin(), p.pages.end(), std::back_inserter(d));
        added += static_cast<int64_t>(d.size());
        d.clear();
        std::set_difference(p.pages.begin(), p.pages.end(), a.begin(), a.end(), std::back_inserter(d));
        extra += static_cast<int64_t>(d.size());
        a_total += static_cast<int64_t>(a.size());
      }
      p.n_tokens = n;
      p.pages = std::move(a);
    }
  if (layer + 1 != n_layers) return;
  ++steps;
  std::fprintf(stderr, "repair diag: %lld steps, %lld pages selected; new vs the step before %.2f%%, previous set's pages not selected now %.2f%%\n",
               static_cast<long long>(steps), static_cast<long long>(a_total), a_total ? 100.0 * added / a_total : 0.0,
               a_total ? 100.0 * extra / a_total : 0.0);
}

}  // namespace

void LlamaCpu::forward(const std::vector<Seq>& batch, PagePool& pool, std::vector<float>* logits,
                       bool all_logits) {
  const int64_t H = cfg_.hidden, D = cfg_.head_dim, Hq = cfg_.n_heads_q, Hkv = cfg_.n_heads_kv;
  const int64_t F = cfg_.ffn_hidden, V = cfg_.vocab_size;
  DHS_ASSERT(!batch.empty());

  // Flatten the batch: token t of the step belongs to sequence seq_of[t] at position pos[t].
  std::vector<int32_t> q_indptr{0}, pos, tokens, seq_len;
  std::vector<const PageTable*> tables;
  std::vector<DraftSeeds*> seeds;  // [n_requests]
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
    seeds.push_back(s.seeds);
    if (s.seeds) s.seeds->begin_step(s.table->n_tokens());
  }
  const int64_t T = static_cast<int64_t>(tokens.size());
  const bool has_verify = std::any_of(batch.begin(), batch.end(), [](const Seq& s) { return s.verify; });
  const bool any_policy = policy_ || std::any_of(batch.begin(), batch.end(), [](const Seq& s) { return s.policy; });
  const bool decode_step = T == static_cast<int64_t>(batch.size());
  // The policy runs on the decode rows of the steps step_runs_policy allows (over those rows);
  // prompt chunks read every page, and so do decode rows where the rule says dense (counted as
  // read when a policy is set). A decode row beside a prompt chunk (a mixed step) reads its
  // policy's pages as in a decode step of its own, as on the CUDA backend (session 35): before,
  // such a step read every page for every row, so a sparse request's tokens depended on whether
  // its step carried another request's prompt. A step with verify sequences plans its own
  // (plan_verify_step); its attention requests are then rows, not sequences.
  // The decode rows: dec[i] is the batch index of decode row i, dec_seq_len[i] its sequence's
  // tokens with this step's (the rule's input and the reuse schedule's, --reselect-every, which
  // runs over a mixed step's decode rows too, as the CUDA selector keeps it).
  std::vector<int> dec;
  std::vector<const PageTable*> dec_tables;
  std::vector<int32_t> dec_seq_len;
  for (size_t s = 0; s < batch.size(); ++s) {
    if (batch[s].n_new != 1) continue;
    dec.push_back(static_cast<int>(s));
    dec_tables.push_back(tables[s]);
    dec_seq_len.push_back(seq_len[s]);
  }
  const std::vector<int64_t> decode_len(dec_seq_len.begin(), dec_seq_len.end());
  const bool select_step = !has_verify && any_policy && !decode_len.empty() &&
                           step_runs_policy(decode_len, dense_below_, min_step_tokens_);
  std::vector<int32_t> a_indptr = q_indptr, a_seq_len = seq_len;
  std::vector<const PageTable*> a_tables = tables;
  std::vector<AttnReq> areq;
  if (has_verify) {
    DHS_CHECK(schedule_.every() == 1, "speculative verification with reselect every {} steps (> 1) is not supported",
              schedule_.every());
    areq = plan_verify_step(batch, q_indptr, &a_indptr, &a_seq_len, &a_tables);
  }
  int phase = ReselectSchedule::kFull;
  if (select_step) {
    std::vector<const void*> ids(dec_tables.begin(), dec_tables.end());
    std::vector<int64_t> n_before(dec_seq_len.begin(), dec_seq_len.end());
    for (int64_t& n : n_before) --n;
    phase = schedule_.begin_step(ids, n_before);
  } else {
    schedule_.invalidate();
  }

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
  const int64_t step = ++tier_step_;
  DHS_CHECK(!tiers_ || pool.tier() == Tier::Device, "the KV hierarchy needs forward() on its device tier");
  const bool ahead = tiers_ && recall_ == RecallSchedule::Ahead;
  std::map<const PageTable*, std::vector<PageId>> reads;  // (ahead) what each table's step read, in order
  // Landing (set_landing_slots): this step's stack, consumed here whatever the step is.
  const std::vector<int32_t> land_slots = std::move(land_next_);
  land_next_.clear();
  std::vector<TieredKv::Landed> landed;
  LandingStack land{land_slots, 0, &pool, &landed};
  const bool landing = ahead && !land_slots.empty() && (decode_step || has_verify);
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
      if (summaries_ && !has_verify)  // (a verify step appends page data stage by stage)
        append_summaries(*batch[s].table, *summaries_, l, k.data() + q_indptr[s] * Hkv * D, pos.data() + q_indptr[s],
                         batch[s].n_new);
    }

    PageLists lists;
    // Sparse selection serves decode rows (and verifies); a prompt chunk reads every page (its
    // queries span the whole prompt).
    if (has_verify) {
      lists = verify_step_lists(batch, areq, l, a_indptr, a_seq_len, a_tables, q.data(), k.data(), pos, scale);
    } else if (select_step) {
      if (schedule_.selects(l, phase)) {
        SelectionInput in{&tables, l, &seq_len, q.data(), q_indptr.data(), static_cast<int>(Hq), scale, summaries_,
                          seeds.data()};
        std::vector<const SelectionPolicy*> policies;  // (a prompt chunk's rows: every page)
        for (const Seq& s : batch) policies.push_back(s.n_new > 1 ? &dense_ : s.policy ? s.policy : policy_ ? policy_ : &dense_);
        lists = select_each(in, policies);
        if (schedule_.every() > 1) {  // (the decode rows' lists, which a later step may reuse)
          std::vector<ListPick> pick;
          for (const int s : dec) pick.push_back({&lists, s});
          selected_[static_cast<size_t>(l)] = decode_step ? lists : pick_requests(pick);
        }
      } else if (decode_step) {
        lists = reuse_selection(selected_[static_cast<size_t>(l)], tables, l, seq_len);
      } else {
        // The decode rows' reused lists, the chunks' every page, in the batch's order.
        const PageLists reused = reuse_selection(selected_[static_cast<size_t>(l)], dec_tables, l, dec_seq_len);
        const PageLists dense = dense_page_lists(tables, l, seq_len);
        std::vector<ListPick> pick;
        for (size_t s = 0, i = 0; s < batch.size(); ++s)
          pick.push_back(i < dec.size() && dec[i] == static_cast<int>(s) ? ListPick{&reused, static_cast<int>(i++)}
                                                                          : ListPick{&dense, static_cast<int>(s)});
        lists = pick_requests(pick);
      }
      // (the decode rows' reads: a mixed step's chunks are not counted)
      std::vector<uint8_t> counted(batch.size());
      for (size_t r = 0; r < batch.size(); ++r) {
        counted[r] = batch[r].n_new == 1;
        if (!counted[r]) continue;
        for (int hh = 0; hh < static_cast<int>(Hkv); ++hh)
          stats_.pages_read += lists.row_end(static_cast<int>(r), hh) - lists.row_begin(static_cast<int>(r), hh);
        stats_.pages_total += Hkv * ((seq_len[r] + pool.page_size() - 1) / pool.page_size());
      }
      count_lists(lists, l, seq_len, pool.page_size(), counted);
    } else {
      lists = dense_page_lists(tables, l, seq_len);
      if (policy_)  // (the decode rows' reads, as a decode step alone counts them)
        for (size_t r = 0; r < batch.size(); ++r)
          if (batch[r].n_new == 1)
            for (int hh = 0; hh < static_cast<int>(Hkv); ++hh) {
              const int64_t n = lists.row_end(static_cast<int>(r), hh) - lists.row_begin(static_cast<int>(r), hh);
              stats_.pages_read += n;
              stats_.pages_total += n;
            }
    }
    const int64_t now = step * cfg_.n_layers + l;  // the hierarchy's clock (set_tiers)
    PageLists late;
    if (ahead) split_by_tier(*tiers_, a_tables, l, pool.n_pages(), lists, late, reads, now, landing ? &land : nullptr);
    else if (tiers_) make_resident(*tiers_, a_tables, l, lists, now);
    cpu::AttentionParams ap;
    ap.q = q.data();
    ap.out = att.data();
    ap.q_indptr = a_indptr.data();
    ap.lists = &lists;
    ap.pool = &pool;
    ap.n_heads_q = static_cast<int>(Hq);
    ap.n_heads_kv = static_cast<int>(Hkv);
    ap.head_dim = static_cast<int>(D);
    ap.scale = scale;
    if (ahead && late.nnz() > 0) {
      // The late pages apart, from the host tier, and the two results merged row by row.
      std::vector<float> lse(static_cast<size_t>(T * Hq)), late_att(att.size()), late_lse(lse.size());
      ap.lse = lse.data();
      cpu::attention(ap);
      cpu::AttentionParams lp = ap;
      lp.lists = &late;
      lp.pool = &tiers_->host_pool();
      lp.out = late_att.data();
      lp.lse = late_lse.data();
      cpu::attention(lp);
      for (int64_t i = 0; i < T * Hq; ++i)
        merge_normalized(att.data() + i * D, lse[static_cast<size_t>(i)], late_att.data() + i * D,
                         late_lse[static_cast<size_t>(i)], static_cast<int>(D));
    } else {
      cpu::attention(ap);
    }
    if (tiers_ && !ahead) tiers_->end_step(now);
    dump("attn_out", l, att.data(), T, Hq * D);
    if (select_step && decode_step && !tiers_ && std::getenv("DHS_SPARSE_DIAG")) report_true_mass(ap, tables, l, seq_len, static_cast<int>(cfg_.n_layers));
    if (select_step && decode_step && !tiers_ && std::getenv("DHS_REPAIR_DIAG")) report_repair(lists, tables, l, static_cast<int>(cfg_.n_layers));

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
  // Recall ahead: a decode-like step's reads are the next step's prediction (a prefill chunk's
  // are every page, which the next step does not read again).
  if (ahead && !land_slots.empty()) {  // the landings adopted (the step's reads were noted), the rest of the stack freed
    std::vector<PageTable*> seqs;
    for (const PageTable* t : a_tables) seqs.push_back(const_cast<PageTable*>(t));
    tiers_->adopt_landings(landed, seqs, step * cfg_.n_layers + cfg_.n_layers - 1);
  }
  // (a mixed step's decode rows: theirs, as a decode step's)
  const auto predicts = [&](const PageTable* t) {
    if (decode_step) return true;
    return std::any_of(batch.begin(), batch.end(), [&](const Seq& s) { return s.table == t && (s.n_new == 1 || s.verify); });
  };
  if (ahead)
    for (auto& [t, ids] : reads)
      if (predicts(t)) tiers_->recall_ahead(const_cast<PageTable&>(*t), ids, step * cfg_.n_layers + cfg_.n_layers - 1);
  if (!logits) return;  // a prefill chunk before the last: no output head
  output_head(batch, q_indptr, x, all_logits, logits);
}

void LlamaCpu::output_head(const std::vector<Seq>& batch, const std::vector<int32_t>& q_indptr,
                           const std::vector<float>& x, bool all_logits, std::vector<float>* logits) const {
  const int64_t H = cfg_.hidden, V = cfg_.vocab_size;
  // Rows whose logits are wanted: all, or each sequence's last token (every row of a verify one).
  std::vector<int64_t> rows;
  for (size_t s = 0; s < batch.size(); ++s) {
    if (all_logits || batch[s].verify)
      for (int64_t t = q_indptr[s]; t < q_indptr[s + 1]; ++t) rows.push_back(t);
    else
      rows.push_back(q_indptr[s + 1] - 1);
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

std::vector<LlamaCpu::AttnReq> LlamaCpu::plan_verify_step(const std::vector<Seq>& batch,
                                                          const std::vector<int32_t>& q_indptr,
                                                          std::vector<int32_t>* a_indptr,
                                                          std::vector<int32_t>* a_seq_len,
                                                          std::vector<const PageTable*>* a_tables) const {
  // The other decode rows select as in a decode step of theirs alone (step_runs_policy over
  // them), prompt chunks read every page; a verify row as its request's decode step at its position
  // would, alone (generate's batch of one: the same decision as decoding one token at a time).
  std::vector<int64_t> plain_len;
  for (const Seq& s : batch)
    if (!s.verify && s.n_new == 1) plain_len.push_back(s.table->n_tokens() + 1);
  const bool plain_selects = !plain_len.empty() && step_runs_policy(plain_len, dense_below_, min_step_tokens_);
  std::vector<AttnReq> areq;
  a_indptr->assign(1, 0);
  a_seq_len->clear();
  a_tables->clear();
  for (size_t s = 0; s < batch.size(); ++s) {
    const Seq& sq = batch[s];
    const bool has_policy = sq.policy || policy_;
    const int64_t n_rows = sq.verify ? sq.n_new : 1;
    for (int64_t j = 0; j < n_rows; ++j) {
      const int64_t len = sq.verify ? sq.table->n_tokens() + j + 1 : sq.table->n_tokens() + sq.n_new;
      const bool selects = has_policy && (sq.verify ? step_runs_policy({len}, dense_below_, min_step_tokens_) : sq.n_new == 1 && plain_selects);
      areq.push_back(AttnReq{s, q_indptr[s] + j, static_cast<int>(j), selects});
      a_indptr->push_back(sq.verify ? q_indptr[s] + static_cast<int32_t>(j) + 1 : q_indptr[s + 1]);
      a_seq_len->push_back(static_cast<int32_t>(len));
      a_tables->push_back(sq.table);
    }
  }
  return areq;
}

void LlamaCpu::count_lists(const PageLists& lists, int layer, const std::vector<int32_t>& seq_len, int page_size,
                           const std::vector<uint8_t>& counted) {
  const size_t Hkv = static_cast<size_t>(cfg_.n_heads_kv);
  if (stats_.read.empty()) {
    stats_.read.assign(static_cast<size_t>(cfg_.n_layers) * Hkv, 0);
    stats_.total.assign(stats_.read.size(), 0);
  }
  for (int r = 0; r < lists.n_requests; ++r)
    for (size_t h = 0; h < Hkv && counted[static_cast<size_t>(r)]; ++h) {
      const size_t i = static_cast<size_t>(layer) * Hkv + h;
      stats_.read[i] += static_cast<uint64_t>(lists.row_end(r, static_cast<int>(h)) - lists.row_begin(r, static_cast<int>(h)));
      stats_.total[i] += static_cast<uint64_t>((seq_len[static_cast<size_t>(r)] + page_size - 1) / page_size);
    }
}

PageLists LlamaCpu::verify_step_lists(const std::vector<Seq>& batch, const std::vector<AttnReq>& areq, int layer,
                                      const std::vector<int32_t>& a_indptr, const std::vector<int32_t>& a_seq_len,
                                      const std::vector<const PageTable*>& a_tables, const float* q, const float* k,
                                      const std::vector<int32_t>& pos, float scale) {
  const int64_t Hq = cfg_.n_heads_q, Hkv = cfg_.n_heads_kv, D = cfg_.head_dim;
  int n_stages = 0;
  for (const AttnReq& a : areq) n_stages = std::max(n_stages, a.stage + 1);
  // Stage by stage: the page data of the stage's rows, then the stage's selections in one call,
  // so that a verify row's estimate sees no key past its own position.
  std::vector<PageLists> parts(static_cast<size_t>(n_stages));
  std::vector<std::pair<int, int>> where(areq.size());  // (stage, index in its part)
  for (int st = 0; st < n_stages; ++st) {
    std::vector<const PageTable*> t;
    std::vector<int32_t> len, qi{0};
    std::vector<float> qrows;  // [rows of the selecting requests, Hq, D]
    std::vector<const SelectionPolicy*> pol;
    std::vector<DraftSeeds*> seeds;
    for (size_t i = 0; i < areq.size(); ++i) {
      const AttnReq& a = areq[i];
      if (a.stage != st) continue;
      const Seq& s = batch[a.seq];
      const int64_t n_new = a_indptr[i + 1] - a_indptr[i];
      if (summaries_)
        append_summaries(*s.table, *summaries_, layer, k + a.first_row * Hkv * D, pos.data() + a.first_row, n_new);
      where[i] = {st, static_cast<int>(t.size())};
      t.push_back(a_tables[i]);
      len.push_back(a_seq_len[i]);
      if (a.selects) qrows.insert(qrows.end(), q + a.first_row * Hq * D, q + (a.first_row + n_new) * Hq * D);
      qi.push_back(qi.back() + (a.selects ? static_cast<int32_t>(n_new) : 0));  // (the dense rule reads no query)
      pol.push_back(a.selects ? (s.policy ? s.policy : policy_) : &dense_);
      seeds.push_back(s.seeds);
    }
    SelectionInput in{&t, layer, &len, qrows.data(), qi.data(), static_cast<int>(Hq), scale, summaries_, seeds.data()};
    parts[static_cast<size_t>(st)] = select_each(in, pol);
  }
  // In the attention's order (the requests' rows ascending), with the page counts.
  PageLists out;
  out.n_requests = static_cast<int>(areq.size());
  out.n_heads_kv = static_cast<int>(Hkv);
  out.seq_len = a_seq_len;
  out.indptr.push_back(0);
  const int ps = summaries_ ? summaries_->page_size() : a_tables[0]->page_size();
  for (size_t i = 0; i < areq.size(); ++i) {
    const PageLists& p = parts[static_cast<size_t>(where[i].first)];
    const int r = where[i].second;
    const int64_t before = out.nnz();
    for (int h = 0; h < Hkv; ++h) {
      for (int32_t e = p.row_begin(r, h); e < p.row_end(r, h); ++e) {
        out.slots.push_back(p.slots[static_cast<size_t>(e)]);
        out.page_pos.push_back(p.page_pos[static_cast<size_t>(e)]);
      }
      out.indptr.push_back(static_cast<int32_t>(out.slots.size()));
    }
    const int64_t read = out.nnz() - before;
    const bool decode_row = a_indptr[i + 1] - a_indptr[i] == 1;
    if (areq[i].selects) {
      stats_.pages_read += read;
      stats_.pages_total += Hkv * ((a_seq_len[i] + ps - 1) / ps);
    } else if (policy_ && decode_row) {
      stats_.pages_read += read;
      stats_.pages_total += read;
    }
  }
  return out;
}

}  // namespace dhs
