// `dhisparse eval` (include/dhisparse/eval.h): every policy decodes from the same
// dense prefill of each synthetic sample; the dense continuation is the reference.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "dhisparse/eval.h"
#include "eval/ruler_tasks.h"
#include "sparse/mass_estimator.h"
#include "tokenizer/tokenizer.h"

namespace dhs {

namespace {

// Greedy over the tokenizer's ids: logits past them are embedding padding (Qwen2.5).
int32_t argmax(const std::vector<float>& v, int64_t n_vocab) {
  const auto end = v.begin() + std::min<int64_t>(n_vocab, static_cast<int64_t>(v.size()));
  return static_cast<int32_t>(std::max_element(v.begin(), end) - v.begin());
}

// KL(p || q) of the softmaxes of two logit rows, in double.
double kl_div(const std::vector<float>& lp, const std::vector<float>& lq) {
  const double mp = *std::max_element(lp.begin(), lp.end()), mq = *std::max_element(lq.begin(), lq.end());
  double zp = 0, zq = 0;
  for (size_t i = 0; i < lp.size(); ++i) {
    zp += std::exp(lp[i] - mp);
    zq += std::exp(lq[i] - mq);
  }
  const double lzp = std::log(zp) + mp, lzq = std::log(zq) + mq;
  double kl = 0;
  for (size_t i = 0; i < lp.size(); ++i) {
    const double a = lp[i] - lzp;
    kl += std::exp(a) * (a - (lq[i] - lzq));
  }
  return std::max(0.0, kl);
}

constexpr int kHistBins = 10;  // pages-read fraction per (layer, head, step): [0, 0.1), ..., [0.9, 1.0]

struct Agg {  // one (task, length, policy)
  int n = 0;
  double score = 0;
  int64_t steps = 0, top1 = 0;
  double kl_sum = 0, kl_max = 0;
  std::vector<double> kls;
  uint64_t read = 0, total = 0;
  std::vector<uint64_t> lh_read, lh_total;
  std::vector<int64_t> hist = std::vector<int64_t>(kHistBins, 0);
  int64_t spec_verifies = 0, spec_drafted = 0, spec_accepted = 0;  // EvalOptions::speculative_k
  void add_counts(const PageCounts& c) {
    read += c.read;
    total += c.total;
    if (lh_read.size() < c.layer_head_read.size()) {
      lh_read.resize(c.layer_head_read.size(), 0);
      lh_total.resize(c.layer_head_read.size(), 0);
    }
    for (size_t i = 0; i < c.layer_head_read.size(); ++i) {
      lh_read[i] += c.layer_head_read[i];
      lh_total[i] += c.layer_head_total[i];
      if (c.layer_head_total[i] > 0) {
        const double f = static_cast<double>(c.layer_head_read[i]) / static_cast<double>(c.layer_head_total[i]);
        ++hist[static_cast<size_t>(std::min(kHistBins - 1, static_cast<int>(f * kHistBins)))];
      }
    }
  }
};

std::string format_seconds(double s) {
  const auto t = static_cast<int64_t>(s + 0.5);
  if (t < 60) return fmt::format("{}s", t);
  if (t < 3600) return fmt::format("{}m {:02}s", t / 60, t % 60);
  return fmt::format("{}h {:02}m", t / 3600, t % 3600 / 60);
}

std::string plural(int64_t n, const char* one, const char* many) { return fmt::format("{} {}", n, n == 1 ? one : many); }

double quantile(std::vector<double> v, double q) {
  if (v.empty()) return 0.0;
  std::sort(v.begin(), v.end());
  return v[static_cast<size_t>(std::min<double>(static_cast<double>(v.size() - 1), q * static_cast<double>(v.size())))];
}

// Greedy speculative decoding of `out` (the verifier's own greedy output after the prompt, then
// `stop` when a stop token ended it, else -1) on the session, as the scheduler runs it: per cycle,
// from the token t0 = out[p] the verifier emitted last, k drafts (at most what the request may
// still emit, max_new, minus one) under the draft policy, free-running (each fed the draft before
// it); then the verifier's rows t0, d1, .. as its decode steps one at a time. The drafts equal to
// the output's next tokens are kept, in order (a kept stop token ends the request); the verifier's
// KV of the committed tokens is what the next cycle sees (the drafts' own KV goes with the
// truncation). Counts verifies, drafts and those kept into `a`.
void speculate(Engine& engine, Session& session, int64_t n_prompt, const std::vector<int32_t>& out, int32_t stop,
               int max_new, const PolicySpec& verifier, const EvalOptions& o, int64_t n_vocab, Agg& a) {
  std::vector<int32_t> target = out;
  if (stop >= 0) target.push_back(stop);
  if (target.empty()) return;
  session.truncate(n_prompt);
  std::vector<float> lg;
  const int64_t n = static_cast<int64_t>(target.size());
  int64_t p = 0;  // target[0 .. p) committed with their KV; target[p] emitted, its KV not yet written
  while (p + 1 < n) {
    const int64_t room = max_new - (p + 1) - 1;  // the scheduler's: what may still be emitted, minus one
    const int k = static_cast<int>(std::min<int64_t>(o.speculative_k, room));
    if (k <= 0) {  // a plain decode row
      engine.set_policy(verifier);
      session.append({target[static_cast<size_t>(p)]}, &lg);
      ++p;
      continue;
    }
    engine.set_policy(o.draft);
    int32_t feed = target[static_cast<size_t>(p)];
    int kept = 0;
    bool all_right = true;
    session.set_drafting(true);  // (draft weights, where the backend keeps them)
    for (int j = 1; j <= k; ++j) {
      session.append({feed}, &lg);
      feed = argmax(lg, n_vocab);
      if (all_right && p + j < n && feed == target[static_cast<size_t>(p + j)]) ++kept;
      else all_right = false;
    }
    session.set_drafting(false);
    a.spec_verifies += 1;
    a.spec_drafted += k;
    a.spec_accepted += kept;
    if (stop >= 0 && p + kept == n - 1) break;  // the stop token was a kept draft: the request ends
    session.truncate(n_prompt + p);
    engine.set_policy(verifier);
    for (int j = 0; j <= kept; ++j) session.append({target[static_cast<size_t>(p + j)]}, &lg);  // the verify's rows
    p += kept + 1;
  }
  engine.take_page_counts();  // (not the policy's decode steps)
}

// One sample: its dense reference (greedy tokens, and the logits before each), then under each
// policy the reference teacher-forced (top-1 agreement, KL, pages read) and the policy's own greedy
// output from its first disagreement on, scored. All from one prefill, truncated between policies.
void eval_sample(Engine& engine, const std::vector<int32_t>& prompt, const eval::Sample& smp,
                 const std::vector<PolicySpec>& policies, const EvalOptions& o, int64_t n_vocab,
                 const std::function<bool(int32_t)>& is_stop,
                 const std::function<Agg&(int policy_index)>& agg_of) {
  auto session = engine.open_session();
  const int64_t n_prompt = static_cast<int64_t>(prompt.size());

  // Dense reference: greedy tokens and the logits before each.
  engine.set_policy(PolicySpec{});
  std::vector<std::vector<float>> ref_logits(1);
  session->append(prompt, &ref_logits[0]);
  std::vector<int32_t> ref;
  int32_t ref_stop = -1;  // the stop token that ended the reference, if one did
  for (int k = 0; k < smp.max_new_tokens; ++k) {
    const int32_t id = argmax(ref_logits.back(), n_vocab);
    if (is_stop(id)) {
      ref_stop = id;
      break;
    }
    ref.push_back(id);
    if (k + 1 == smp.max_new_tokens) break;
    ref_logits.emplace_back();
    session->append({id}, &ref_logits.back());
  }
  // ref_logits[k] precedes ref[k]; one more row (the stop) when the reference stopped.
  const std::string ref_text = engine.tokenizer().decode(ref, /*skip_special=*/true);
  Agg& ad = agg_of(0);
  ad.n += 1;
  ad.score += eval::score_output(smp, ref_text);
  engine.take_page_counts();
  if (o.speculative_k > 0) speculate(engine, *session, n_prompt, ref, ref_stop, smp.max_new_tokens, PolicySpec{}, o, n_vocab, ad);

  for (size_t pi = 1; pi < policies.size(); ++pi) {
    const PolicySpec& pol = policies[pi];
    Agg& a = agg_of(static_cast<int>(pi));
    session->truncate(n_prompt);
    engine.set_policy(pol);
    // Teacher-forced over the dense continuation; step k (k >= 1) predicts ref[k] (or the stop).
    int diverged = -1;
    std::vector<float> lg;
    const int n_steps = static_cast<int>(ref_logits.size());
    for (int k = 1; k < n_steps; ++k) {
      session->append({ref[static_cast<size_t>(k - 1)]}, &lg);
      a.add_counts(engine.take_page_counts());
      const bool agree = argmax(lg, n_vocab) == argmax(ref_logits[static_cast<size_t>(k)], n_vocab);
      const double kl = kl_div(ref_logits[static_cast<size_t>(k)], lg);
      a.steps += 1;
      a.top1 += agree;
      a.kl_sum += kl;
      a.kl_max = std::max(a.kl_max, kl);
      a.kls.push_back(kl);
      if (!agree && diverged < 0) diverged = k;
    }
    // The policy's own greedy output: the dense one up to the first disagreement.
    std::vector<int32_t> out(ref.begin(), ref.begin() + (diverged < 0 ? static_cast<long>(ref.size()) : diverged));
    int32_t out_stop = diverged < 0 ? ref_stop : -1;  // (agreeing throughout: the stop row too)
    if (diverged >= 0) {
      // Logits after prompt + ref[0 .. diverged-1]: re-run the last token of that prefix.
      session->truncate(n_prompt + diverged - 1);
      session->append({ref[static_cast<size_t>(diverged - 1)]}, &lg);
      for (int k = diverged; k < smp.max_new_tokens; ++k) {
        const int32_t id = argmax(lg, n_vocab);
        if (is_stop(id)) {
          out_stop = id;
          break;
        }
        out.push_back(id);
        if (k + 1 == smp.max_new_tokens) break;
        session->append({id}, &lg);
      }
      engine.take_page_counts();  // free-running steps are not counted
    }
    a.n += 1;
    a.score += eval::score_output(smp, engine.tokenizer().decode(out, /*skip_special=*/true));
    if (o.speculative_k > 0) speculate(engine, *session, n_prompt, out, out_stop, smp.max_new_tokens, pol, o, n_vocab, a);
  }
}

// One (task, length, policy)'s line of the table, its JSON row and its share of the trace.
void report(const Agg& a, eval::TaskKind task, int64_t len, const PolicySpec& pol, const EvalOptions& o,
            const ModelConfig& cfg, std::ofstream& out, nlohmann::json& trace) {
  const double score = 100.0 * a.score / std::max(1, a.n);
  const double top1 = a.steps ? 100.0 * static_cast<double>(a.top1) / static_cast<double>(a.steps) : 100.0;
  const double kl_mean = a.steps ? a.kl_sum / static_cast<double>(a.steps) : 0.0;
  const double frac = a.total ? static_cast<double>(a.read) / static_cast<double>(a.total) : 1.0;
  std::printf("%-16s %7lld %-22s %5d %8.2f %8.3f %9.2e %9.2e %7.3f", eval::task_name(task).c_str(),
              static_cast<long long>(len), pol.label(o.estimator).c_str(), a.n, score, top1, kl_mean, quantile(a.kls, 0.99), frac);
  if (o.speculative_k > 0)  // drafts kept / drafted per verification
    std::printf("  %5.2f / %4.2f", a.spec_verifies ? static_cast<double>(a.spec_accepted) / static_cast<double>(a.spec_verifies) : 0.0,
                a.spec_verifies ? static_cast<double>(a.spec_drafted) / static_cast<double>(a.spec_verifies) : 0.0);
  std::printf("\n");
  std::vector<double> lh;
  for (size_t i = 0; i < a.lh_read.size(); ++i)
    lh.push_back(a.lh_total[i] ? static_cast<double>(a.lh_read[i]) / static_cast<double>(a.lh_total[i]) : 1.0);
  if (out.is_open()) {
    nlohmann::json row = {{"commit", o.commit},
                          {"device", o.device},
                          {"model", o.model_name},
                          {"gpu_weights", o.gpu_weights},
                          {"quantization", o.quantization},
                          {"task", eval::task_name(task)},
                          {"length", len},
                          {"policy", pol.rule_name()},
                          {"spec", pol.str()},
                          {"label", pol.label(o.estimator)},
                          {"gamma", pol.dense() ? 1.0 : pol.gamma},
                          {"budget", pol.budget},
                          {"frac", pol.frac},
                          {"estimator", pol.estimator},
                          {"combine", pol.combine == GroupCombine::Max ? "max" : "sum"},
                          {"dense_below", pol.dense_below},
                          {"reselect_every", pol.reselect_every},
                          {"samples", a.n},
                          {"score", score},
                          {"decode_steps", a.steps},
                          {"top1_agree", top1},
                          {"kl_mean", kl_mean},
                          {"kl_p99", quantile(a.kls, 0.99)},
                          {"kl_max", a.kl_max},
                          {"pages_read_frac", frac},
                          {"n_layers", cfg.n_layers},
                          {"n_heads_kv", cfg.n_heads_kv},
                          {"layer_head_read_frac", lh},
                          {"hist_bins", kHistBins},
                          {"read_frac_hist", a.hist}};
    if (o.speculative_k > 0) {
      row["spec_k"] = o.speculative_k;
      row["draft_policy"] = o.draft.str();
      row["draft_quantization"] = o.draft_quantization;
      row["spec_verifies"] = a.spec_verifies;
      row["spec_drafted"] = a.spec_drafted;
      row["spec_accepted"] = a.spec_accepted;
      row["spec_accepted_per_verify"] = a.spec_verifies ? static_cast<double>(a.spec_accepted) / static_cast<double>(a.spec_verifies) : 0.0;
    }
    out << row.dump() << "\n";
  }
  if (!pol.dense() && !lh.empty()) {
    // Summed over tasks: one budget vector per (policy, length) for the benchmark to replay.
    nlohmann::json& t = trace[pol.label(o.estimator)][std::to_string(len)];
    if (t.is_null()) t = {{"read", std::vector<uint64_t>(a.lh_read.size(), 0)}, {"total", std::vector<uint64_t>(a.lh_read.size(), 0)}};
    for (size_t i = 0; i < a.lh_read.size(); ++i) {
      t["read"][i] = t["read"][i].get<uint64_t>() + a.lh_read[i];
      t["total"][i] = t["total"][i].get<uint64_t>() + a.lh_total[i];
    }
  }
}

}  // namespace

int run_eval(Engine& engine, const EvalOptions& o) {
  std::vector<eval::TaskKind> tasks;
  if (o.tasks.empty()) tasks = eval::all_tasks();
  for (const std::string& t : o.tasks) tasks.push_back(eval::parse_task(t));
  DHS_CHECK(o.samples >= 1, "--samples must be >= 1");
  std::vector<PolicySpec> policies{PolicySpec{}};  // dense first: the reference
  for (const PolicySpec& p : o.policies)
    if (!p.dense()) policies.push_back(p);
  const int64_t n_vocab = engine.tokenizer().vocab_size();
  if (o.log) {
    std::vector<std::string> labels;
    for (size_t i = 1; i < policies.size(); ++i) labels.push_back(policies[i].label(o.estimator));
    o.log(fmt::format("eval: {} x {} ({}) x {} = {}, each decoded dense{}{}",
                      plural(static_cast<int64_t>(tasks.size()), "task", "tasks"),
                      plural(static_cast<int64_t>(o.lengths.size()), "length", "lengths"), fmt::join(o.lengths, ", "),
                      plural(o.samples, "sample", "samples"),
                      plural(static_cast<int64_t>(tasks.size() * o.lengths.size()) * o.samples, "sample", "samples"),
                      labels.empty() ? "" : fmt::format(" and under {}: ", plural(static_cast<int64_t>(labels.size()), "policy", "policies")),
                      fmt::join(labels, ", ")));
  }
  const auto& stop_ids = engine.tokenizer().stop_ids();
  auto is_stop = [&](int32_t id) { return std::find(stop_ids.begin(), stop_ids.end(), id) != stop_ids.end(); };
  auto count_tokens = [&](const std::string& s) { return static_cast<int64_t>(engine.tokenize(s).size()); };
  bool chat = o.chat;
  try {
    (void)engine.render_chat({{"user", "x"}}, true);
  } catch (const Error&) {
    chat = false;  // no template
  }

  // The projected sketch's key basis (psketch4:R): fitted once, from a calibration sample of
  // its own seed (not one of the evaluated samples), before any evaluated prefill.
  int rank = 0, query_aware = -1;
  for (const PolicySpec& p : policies) {
    if (!p.scores()) continue;
    const auto est = make_estimator(p.estimator);
    const int r = est->projected_rank();
    if (r == 0) continue;
    DHS_CHECK((rank == 0 || r == rank) && (query_aware < 0 || query_aware == est->query_aware()),
              "eval: one key basis per run (rank {} and {}; psketch4 and qsketch4 need different bases)", rank, r);
    rank = r;
    query_aware = est->query_aware();
  }
  if (rank > 0) {
    const eval::Sample cal = eval::make_sample(tasks.front(), o.lengths.front(), o.seed * 1000003u + 0xCA11Bu, count_tokens);
    std::string text = chat ? engine.render_chat({{"user", cal.context + cal.question}}, true) : cal.context + cal.question + "\n";
    const std::vector<int32_t> ids = engine.tokenize(text + cal.answer_prefix);
    const double kept = engine.calibrate_key_basis(ids, rank, query_aware == 1);
    std::printf("key basis%s: rank %d from a %zu-token calibration prompt (%s, own seed): %.1f%% of the %s\n",
                query_aware == 1 ? " (query-aware)" : "", rank, ids.size(), eval::task_name(tasks.front()).c_str(), 100.0 * kept,
                query_aware == 1 ? "scores' second moment" : "keys' variance");
  }

  std::map<std::tuple<int, int64_t, int>, Agg> agg;  // (task, length, policy index)
  const int64_t n_total = static_cast<int64_t>(tasks.size() * o.lengths.size()) * o.samples;
  int64_t done = 0;
  // A sample's time grows with its length (prefill, and every decode step reads the whole
  // context): the estimates weigh each sample by its length, which the first one calibrates.
  using Clock = std::chrono::steady_clock;
  const auto t_start = Clock::now();
  auto elapsed = [&] { return std::chrono::duration<double>(Clock::now() - t_start).count(); };
  double work_total = 0, work_done = 0;
  for (const int64_t len : o.lengths) work_total += static_cast<double>(len) * static_cast<double>(tasks.size()) * o.samples;
  auto eta = [&] { return work_done > 0 ? elapsed() * (work_total - work_done) / work_done : 0.0; };
  std::ofstream out;
  if (!o.out.empty()) {
    out.open(o.out, std::ios::app);
    DHS_CHECK(out.good(), "cannot open {}", o.out);
  }
  nlohmann::json trace = nlohmann::json::object();
  const ModelConfig& cfg = engine.config();
  std::printf("\n%-16s %7s %-22s %5s %8s %8s %9s %9s %7s%s\n", "task", "length", "policy", "n", "score", "top1",
              "KL mean", "KL p99", "pages", o.speculative_k > 0 ? "  kept / drafted per verify" : "");
  for (const int64_t len : o.lengths) {
    for (const eval::TaskKind task : tasks)
      for (int s = 0; s < o.samples; ++s) {
        const uint64_t seed = o.seed * 1000003u + static_cast<uint64_t>(len) * 7919u + static_cast<uint64_t>(task) * 104729u +
                              static_cast<uint64_t>(s);
        const eval::Sample smp = eval::make_sample(task, len, seed, count_tokens);
        const std::string user = smp.context + smp.question;
        std::string text = chat ? engine.render_chat({{"user", user}}, true) : user + "\n";
        text += smp.answer_prefix;
        const std::vector<int32_t> prompt = engine.tokenize(text);
        DHS_CHECK(static_cast<int64_t>(prompt.size()) + smp.max_new_tokens <= engine.max_context(),
                  "eval: a {}-token prompt plus {} new tokens exceeds the context ({}); lower --lengths", prompt.size(),
                  smp.max_new_tokens, engine.max_context());
        eval_sample(engine, prompt, smp, policies, o, n_vocab, is_stop,
                    [&](int pi) -> Agg& { return agg[{static_cast<int>(task), len, pi}]; });
        ++done;
        work_done += static_cast<double>(len);
        if (o.progress) o.progress(done, n_total);
        if (o.log && done == 1 && n_total > 1)
          o.log(fmt::format("eval: the first sample took {}; estimated total {}", format_seconds(elapsed()),
                            format_seconds(elapsed() + eta())));
        if (o.log && s + 1 == o.samples)
          o.log(fmt::format("eval: {} at {} tokens done ({}/{} samples), {} elapsed, ETA {}", eval::task_name(task), len,
                            done, n_total, format_seconds(elapsed()), format_seconds(eta())));
      }

  // Rows, trace and table of this length (written as each length completes).
  for (auto& [key, a] : agg) {
    const auto [task, key_len, pi] = key;
    if (key_len == len) report(a, static_cast<eval::TaskKind>(task), len, policies[static_cast<size_t>(pi)], o, cfg, out, trace);
  }
  out.flush();
  if (!o.trace_out.empty()) {
    nlohmann::json doc = {{"model", o.model_name}, {"commit", o.commit}, {"n_layers", cfg.n_layers},
                          {"n_heads_kv", cfg.n_heads_kv}, {"page_size", 16}, {"policies", trace}};
    std::ofstream f(o.trace_out);
    DHS_CHECK(f.good(), "cannot open {}", o.trace_out);
    f << doc.dump(1) << "\n";
  }
  }  // lengths
  return 0;
}

}  // namespace dhs
