// PolicySpec (see dhisparse/policy.h): the grammar, the checks and the canonical spellings.
#include "dhisparse/policy.h"

#include <fmt/format.h>

#include <charconv>
#include <cmath>

#include "core/error.h"
#include "sparse/mass_estimator.h"

namespace dhs {

const std::vector<RuleInfo>& rule_table() {
  static const std::vector<RuleInfo> kRules = {
      {SelectRule::Dense, "dense", RuleArg::None, false},
      {SelectRule::Coverage, "coverage", RuleArg::Mass, true},
      {SelectRule::TopK, "topk", RuleArg::Pages, true},
      {SelectRule::SinkWindow, "sinkwindow", RuleArg::Pages, false},
      {SelectRule::SoloHead, "solohead", RuleArg::MassOrPages, true},
      {SelectRule::TopFrac, "topfrac", RuleArg::Fraction, true},
  };
  return kRules;
}

const RuleInfo& rule_info(SelectRule rule) {
  for (const RuleInfo& r : rule_table())
    if (r.rule == rule) return r;
  throw Error(fmt::format("unknown selection rule {}", static_cast<int>(rule)));
}

namespace {

std::string rule_names() {
  std::string s;
  for (const RuleInfo& r : rule_table()) {
    if (!s.empty()) s += ", ";
    s += r.name;
    if (r.arg == RuleArg::Mass) s += ":G";
    if (r.arg == RuleArg::Pages) s += ":K";
    if (r.arg == RuleArg::MassOrPages) s += ":G|K";
    if (r.arg == RuleArg::Fraction) s += ":F";
  }
  return s;
}

// The whole of `text` as a number in [lo, hi], or a dhs::Error naming `what` and the spec.
double number_in(std::string_view text, double lo, double hi, std::string_view spec, const char* what) {
  double v = 0.0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  DHS_CHECK(!text.empty() && ec == std::errc() && end == text.data() + text.size() && std::isfinite(v) && v >= lo &&
                v <= hi,
            "policy '{}': '{}' is not {} in [{}, {}]", spec, text, what, lo, hi);
  return v;
}

int whole_in(std::string_view text, int lo, int hi, std::string_view spec, const char* what) {
  const double v = number_in(text, lo, hi, spec, what);
  DHS_CHECK(v == std::floor(v), "policy '{}': '{}' is not {} (a whole number)", spec, text, what);
  return static_cast<int>(v);
}

}  // namespace

PolicySpec PolicySpec::parse(std::string_view text, const PolicySpec& defaults) {
  PolicySpec p = defaults;
  std::string_view rest = text;
  if (const size_t at = rest.find('@'); at != std::string_view::npos) {
    p.estimator = std::string(rest.substr(at + 1));
    DHS_CHECK(!p.estimator.empty(), "policy '{}': give an estimator after '@'", text);
    rest = rest.substr(0, at);
  }
  if (const size_t sl = rest.find('/'); sl != std::string_view::npos) {
    p.reselect_every = whole_in(rest.substr(sl + 1), 1, 64, text, "a step count");
    rest = rest.substr(0, sl);
  }
  const size_t colon = rest.find(':');
  const std::string_view name = rest.substr(0, colon);
  std::string_view value = colon == std::string_view::npos ? std::string_view{} : rest.substr(colon + 1);
  const RuleInfo* info = nullptr;
  for (const RuleInfo& r : rule_table())
    if (name == r.name) info = &r;
  DHS_CHECK(info != nullptr, "unknown policy '{}' ({})", text, rule_names());
  p.rule = info->rule;
  DHS_CHECK(info->arg == RuleArg::None || colon == std::string_view::npos || !value.empty(),
            "policy '{}': give a value after ':'", text);
  switch (info->arg) {
    case RuleArg::None:
      DHS_CHECK(colon == std::string_view::npos, "policy '{}' takes no value", name);
      DHS_CHECK(text.find('/') == std::string_view::npos, "policy '{}' selects nothing to reuse ('{}')", name, text);
      break;
    case RuleArg::Mass:
      if (!value.empty()) p.gamma = number_in(value, 1e-6, 1.0, text, "a mass");
      break;
    case RuleArg::Pages:
      if (const size_t plus = value.find('+'); plus != std::string_view::npos) {
        DHS_CHECK(p.rule == SelectRule::SinkWindow, "policy '{}': only sinkwindow takes seed pages (K+M)", text);
        p.seed_pages = whole_in(value.substr(plus + 1), 1, 1 << 16, text, "a seed page count");
        value = value.substr(0, plus);
      }
      if (!value.empty()) p.budget = whole_in(value, 1, 1 << 24, text, "a page count");
      break;
    case RuleArg::Fraction:
      if (!value.empty()) p.frac = number_in(value, 1e-6, 1.0, text, "a fraction");
      break;
    case RuleArg::MassOrPages:
      if (!value.empty()) {
        // A mass is at most 1, a page count at least 1: 1 itself means every page's mass.
        const double v = number_in(value, 1e-6, 1 << 24, text, "a mass or a page count");
        if (v <= 1.0) {
          p.gamma = v;
          p.budget = 0;
        } else {
          p.budget = whole_in(value, 2, 1 << 24, text, "a page count");
        }
      }
      break;
  }
  p.validate();
  return p;
}

void PolicySpec::validate() const {
  const RuleInfo& info = rule_info(rule);
  DHS_CHECK(n_sink >= 0 && n_sink <= (1 << 20) && n_recent >= 0 && n_recent <= (1 << 20),
            "sink and recent page counts must be in [0, 2^20] (got {} and {})", n_sink, n_recent);
  DHS_CHECK(budget >= 0 && budget <= (1 << 24), "--budget must be in [0, 2^24] (got {})", budget);
  DHS_CHECK(seed_pages >= 0 && seed_pages <= (1 << 16), "seed pages must be in [0, 65536] (got {})", seed_pages);
  DHS_CHECK(seed_pages == 0 || rule == SelectRule::SinkWindow, "{}: only sinkwindow drafts take seed pages", info.name);
  DHS_CHECK(reselect_every >= 1 && reselect_every <= 64, "--reselect-every must be in [1, 64] (got {})", reselect_every);
  DHS_CHECK(dense_below >= 0, "--dense-below must be >= 0 (got {})", dense_below);
  DHS_CHECK(min_step_tokens >= 0, "--sparse-min-tokens must be >= 0 (got {})", min_step_tokens);
  const bool mass_ok = std::isfinite(gamma) && gamma > 0.0 && gamma <= 1.0;
  switch (info.arg) {
    case RuleArg::None:
      break;
    case RuleArg::Mass:
      DHS_CHECK(mass_ok, "{}: --gamma must be in (0, 1] (got {})", info.name, gamma);
      break;
    case RuleArg::Pages:
      DHS_CHECK(budget > 0 || rule == SelectRule::SinkWindow, "{} needs --budget > 0 (pages per list)", info.name);
      break;
    case RuleArg::MassOrPages:
      DHS_CHECK(budget > 0 || mass_ok, "{}: --gamma must be in (0, 1] (got {})", info.name, gamma);
      break;
    case RuleArg::Fraction:
      DHS_CHECK(std::isfinite(frac) && frac > 0.0 && frac <= 1.0, "{}: the fraction must be in (0, 1] (got {})",
                info.name, frac);
      break;
  }
  if (rule == SelectRule::SinkWindow && budget > 0)
    DHS_CHECK(budget >= n_sink, "sinkwindow: --budget {} is smaller than the {} sink pages", budget, n_sink);
  if (info.scores) (void)make_estimator(estimator);  // a dhs::Error naming the estimators when unknown
}

PolicySpec PolicySpec::as_request_policy(const PolicySpec& engine) const {
  validate();
  PolicySpec r = *this;
  if (r == engine) return r;
  DHS_CHECK(engine.rule != SelectRule::SoloHead,
            "a request's sparse policy {}: the engine runs {}, one page set shared over the KV heads, which takes no "
            "per-request policy", str(), engine.str());
  DHS_CHECK(rule != SelectRule::SoloHead,
            "a request's sparse policy {}: solohead shares one page set over the KV heads and is the engine's choice "
            "only (it runs {})", str(), engine.str());
  DHS_CHECK(r.dense() || !engine.dense(),
            "a request's sparse policy {}: the engine runs dense, with no selection step and no page data; start it "
            "with a sparse policy (--sparse-policy) to let requests choose theirs", str());
  DHS_CHECK(!scores() || engine.scores(),
            "a request's sparse policy {}: it scores pages, and the engine's policy {} does not (no page data or "
            "scoring kernels)", str(), engine.str());
  DHS_CHECK(!scores() || estimator == engine.estimator,
            "a request's sparse policy {}: the estimator is the engine's ({}); leave @ESTIMATOR out or give that one",
            str(), engine.estimator);
  DHS_CHECK(reselect_every == engine.reselect_every || r.dense(),
            "a request's sparse policy {}: --reselect-every is the engine's ({}); leave /R out or give that one",
            str(), engine.reselect_every);
  // The fields a request cannot spell are the engine's.
  r.estimator = engine.estimator;
  r.combine = engine.combine;
  r.reselect_every = engine.reselect_every;
  r.dense_below = engine.dense_below;
  r.min_step_tokens = engine.min_step_tokens;
  return r;
}

std::string PolicySpec::str() const {
  const RuleInfo& info = rule_info(rule);
  std::string s = info.name;
  const bool by_mass = info.arg == RuleArg::Mass || (info.arg == RuleArg::MassOrPages && budget == 0);
  if (by_mass) s += fmt::format(":{}", gamma);
  if (info.arg == RuleArg::Fraction) s += fmt::format(":{}", frac);
  if ((info.arg == RuleArg::Pages || info.arg == RuleArg::MassOrPages) && !by_mass && budget > 0)
    s += fmt::format(":{}", budget);
  if (seed_pages > 0) s += fmt::format("{}+{}", budget > 0 ? "" : ":", seed_pages);
  if (reselect_every > 1) s += fmt::format("/{}", reselect_every);
  if (info.scores) s += "@" + estimator;
  return s;
}

std::string PolicySpec::key() const {
  return fmt::format("{} combine={} sink={} recent={} dense_below={} min_step_tokens={}", str(),
                     combine == GroupCombine::Max ? "max" : "sum", n_sink, n_recent, dense_below, min_step_tokens);
}

std::string PolicySpec::label(const std::string& default_estimator) const {
  const RuleInfo& info = rule_info(rule);
  if (rule == SelectRule::Dense) return "dense";
  const std::string tail = (info.scores && estimator != default_estimator ? "-" + estimator : "") +
                           (reselect_every > 1 ? fmt::format("-r{}", reselect_every) : std::string());
  const bool by_mass = info.arg == RuleArg::Mass || (info.arg == RuleArg::MassOrPages && budget == 0);
  if (info.arg == RuleArg::Fraction) return fmt::format("{}-{}{}", info.name, frac, tail);
  const std::string seeds = seed_pages > 0 ? fmt::format("+{}", seed_pages) : std::string();
  return by_mass ? fmt::format("{}-{}{}", info.name, gamma, tail)
                 : fmt::format("{}-{}{}{}", info.name, budget, seeds, tail);
}

}  // namespace dhs
