// Per-(layer, KV head) page budgets replayed from traces of a real model (src/eval: what the
// accuracy study leaves for the benchmarks) (DESIGN.md §3:
// sparse speed claims say which budgets they used). `dhisparse eval --trace-out` writes,
// per policy label and prompt length, the pages each (layer, KV head) read over all decode
// steps; the benchmarks map those fractions onto the 8B shape (32 layers x 8 KV heads):
// layer l -> l * L_src / 32 (same relative depth), head h -> h mod H_src.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace dhs {

struct BudgetTrace {
  std::string model, label;
  int64_t length = 0;
  int n_layers = 0, n_heads_kv = 0;
  std::vector<double> frac;  // [n_layers * n_heads_kv] pages read / pages, over all decode steps

  // Fractions for a model of n_layers x n_heads_kv ([n_layers * n_heads_kv]).
  std::vector<float> mapped(int n_layers_to, int n_heads_kv_to) const;
  double mean() const;
};

// Reads `label` (e.g. "coverage-0.99") at prompt length `length` (0: the longest in the file).
// Throws dhs::Error when the file, label or length is missing or malformed.
BudgetTrace load_budget_trace(const std::string& path, const std::string& label, int64_t length = 0);

// Every label in the file.
std::vector<std::string> budget_trace_labels(const std::string& path);

}  // namespace dhs
