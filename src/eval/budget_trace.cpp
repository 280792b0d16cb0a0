#include "eval/budget_trace.h"

#include <fstream>
#include <nlohmann/json.hpp>
#include <numeric>

#include "core/error.h"

namespace dhs {

namespace {

nlohmann::json read_json(const std::string& path) {
  std::ifstream f(path);
  DHS_CHECK(f.good(), "budget trace {}: cannot open", path);
  try {
    return nlohmann::json::parse(f);
  } catch (const nlohmann::json::exception& e) {
    throw Error(fmt::format("budget trace {}: {}", path, e.what()));
  }
}

}  // namespace

std::vector<float> BudgetTrace::mapped(int n_layers_to, int n_heads_kv_to) const {
  std::vector<float> out(static_cast<size_t>(n_layers_to) * n_heads_kv_to);
  for (int l = 0; l < n_layers_to; ++l)
    for (int h = 0; h < n_heads_kv_to; ++h) {
      const int ls = static_cast<int>(static_cast<int64_t>(l) * n_layers / n_layers_to);
      const int hs = h % n_heads_kv;
      out[static_cast<size_t>(l) * n_heads_kv_to + h] = static_cast<float>(frac[static_cast<size_t>(ls) * n_heads_kv + hs]);
    }
  return out;
}

double BudgetTrace::mean() const {
  return frac.empty() ? 0.0 : std::accumulate(frac.begin(), frac.end(), 0.0) / static_cast<double>(frac.size());
}

BudgetTrace load_budget_trace(const std::string& path, const std::string& label, int64_t length) {
  const nlohmann::json doc = read_json(path);
  try {
    BudgetTrace t;
    t.model = doc.value("model", "");
    t.label = label;
    t.n_layers = doc.at("n_layers").get<int>();
    t.n_heads_kv = doc.at("n_heads_kv").get<int>();
    DHS_CHECK(t.n_layers > 0 && t.n_heads_kv > 0, "budget trace {}: bad shape", path);
    const auto& pol = doc.at("policies");
    DHS_CHECK(pol.contains(label), "budget trace {}: no policy '{}'", path, label);
    const auto& by_len = pol.at(label);
    if (length == 0)
      for (const auto& [k, v] : by_len.items()) {
        int64_t n = 0;
        try {
          n = std::stoll(k);
        } catch (const std::exception&) {
          throw Error(fmt::format("budget trace {}: length key '{}' is not a number", path, k));
        }
        length = std::max<int64_t>(length, n);
      }
    const std::string key = std::to_string(length);
    DHS_CHECK(by_len.contains(key), "budget trace {}: no length {} for '{}'", path, length, label);
    const auto read = by_len.at(key).at("read").get<std::vector<uint64_t>>();
    const auto total = by_len.at(key).at("total").get<std::vector<uint64_t>>();
    const size_t n = static_cast<size_t>(t.n_layers) * t.n_heads_kv;
    DHS_CHECK(read.size() == n && total.size() == n, "budget trace {}: {} values for {} x {}", path, read.size(),
              t.n_layers, t.n_heads_kv);
    t.length = length;
    for (size_t i = 0; i < n; ++i) t.frac.push_back(total[i] ? static_cast<double>(read[i]) / total[i] : 1.0);
    return t;
  } catch (const nlohmann::json::exception& e) {
    throw Error(fmt::format("budget trace {}: {}", path, e.what()));
  }
}

std::vector<std::string> budget_trace_labels(const std::string& path) {
  const nlohmann::json doc = read_json(path);
  std::vector<std::string> v;
  if (doc.contains("policies"))
    for (const auto& [k, _] : doc.at("policies").items()) v.push_back(k);
  return v;
}

}  // namespace dhs
