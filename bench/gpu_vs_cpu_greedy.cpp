// Greedy tokens of the CUDA backend against the CPU backend's f32 path (issue 25): the same
// prompts through Engine::generate on both (temperature 0, --ignore-eos, N tokens each), the
// first step where the ids differ, and the CPU's top-2 logit gap there (a near-tie below
// --tie-gap is listed, not counted as a divergence). One JSON row per run:
//   {"commit", "gpu", "model", "gpu_weights", "tokens", "prompts", "equal", "near_ties", "diverged",
//    "cases": [{"prompt", "step", "cpu", "gpu", "gap"} ...]}
//   gpu_vs_cpu_greedy -m MODEL [--gpu-weights native|packed|f16] [--quantization none|fp8] [-n 32] [--tie-gap 0.01] [--out F.jsonl]
// Prompts: the README's examples, chat questions (rendered by the model's template) and plain
// continuations, 24 in all.
#include <CLI/CLI.hpp>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include "bench/bench_text.h"
#include "dhisparse/engine.h"

namespace {

struct Prompt {
  bool chat;
  std::string text;
};

const std::vector<Prompt>& prompts() {
  static const std::vector<Prompt> p = {
      {true, "What is the capital of France?"},  // README
      {false, "Once upon a time"},               // README
      {true, "Write a haiku about the sea."},
      {true, "Explain what a hash table is in two sentences."},
      {true, "What is 17 times 23?"},
      {true, "Give me three tips for learning a new language."},
      {true, "Translate 'good morning' into Spanish and German."},
      {true, "Who wrote Pride and Prejudice?"},
      {true, "Write a Python function that reverses a string."},
      {true, "What causes the seasons on Earth?"},
      {true, "Summarize the plot of Romeo and Juliet in one paragraph."},
      {true, "List the planets of the solar system in order."},
      {true, "How do I make a cup of tea?"},
      {true, "What is the difference between a list and a tuple in Python?"},
      {false, "The quick brown fox"},
      {false, "def fibonacci(n):\n"},
      {false, "In 1492, Columbus"},
      {false, "The three primary colors are"},
      {false, "#include <stdio.h>\n\nint main() {\n"},
      {false, "Water boils at a temperature of"},
      {false, "The French Revolution began in"},
      {false, "Machine learning is a field of"},
      {false, "Dear Sir or Madam,\n\nI am writing to"},
      {false, "1, 1, 2, 3, 5, 8,"},
  };
  return p;
}



using dhs::bench::json_escape;
using dhs::bench::top2_gap;

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Greedy tokens, CUDA backend against the CPU's f32 path"};
  std::string model, out, commit = "unknown", gpu_weights = "packed", quantization = "none";
  int n_tokens = 32;
  float tie_gap = 0.01f;
  app.add_option("-m,--model", model, "GGUF file")->required();
  app.add_option("--gpu-weights", gpu_weights, "native, packed or f16")->check(CLI::IsMember({"native", "packed", "f16"}));
  app.add_option("--quantization", quantization, "none or fp8 (both backends' projections: the CPU's f32 path with the same FP8-rounded weights is the oracle)")
      ->check(CLI::IsMember({"none", "fp8"}));
  app.add_option("-n,--tokens", n_tokens, "greedy tokens per prompt")->check(CLI::Range(1, 4096));
  app.add_option("--tie-gap", tie_gap, "a divergence where the CPU's top-2 gap is below this is a near-tie");
  app.add_option("--out", out, "append a JSON row here");
  app.add_option("--commit", commit, "commit recorded in the row");
  CLI11_PARSE(app, argc, argv);
  try {
    dhs::EngineOptions co;
    co.model_path = model;
    co.device = "cpu";
    co.weight_type = "f32";
    co.max_context = 2048;
    co.quantization = quantization;  // fp8: the CPU computes with the same FP8-rounded projections (the oracle)
    dhs::EngineOptions go = co;
    go.device = "cuda";
    go.gpu_weights = gpu_weights;
    go.quantization = quantization;
    auto cpu = dhs::Engine::load(co);
    auto gpu = dhs::Engine::load(go);
    dhs::GenerateOptions g;
    g.sampling.temperature = 0.0f;
    g.max_tokens = n_tokens;
    g.ignore_eos = true;
    int equal = 0, near = 0, diverged = 0;
    std::string cases;
    for (size_t i = 0; i < prompts().size(); ++i) {
      const Prompt& p = prompts()[i];
      const std::vector<int32_t> ids =
          p.chat ? cpu->tokenize_chat({{"user", p.text}}, true) : cpu->tokenize(p.text);
      const auto a = cpu->generate(ids, g).tokens;
      const auto b = gpu->generate(ids, g).tokens;
      size_t s = 0;
      while (s < a.size() && s < b.size() && a[s] == b[s]) ++s;
      if (s == a.size() && s == b.size()) {
        ++equal;
        std::printf("prompt %2zu: equal for %zu tokens\n", i, a.size());
        continue;
      }
      std::vector<int32_t> ctx = ids;
      ctx.insert(ctx.end(), a.begin(), a.begin() + static_cast<std::ptrdiff_t>(s));
      const std::vector<float> lg = cpu->prompt_logits(ctx);
      const float gap = top2_gap(lg, static_cast<int64_t>(lg.size()));
      const bool tie = gap < tie_gap;
      (tie ? near : diverged) += 1;
      const int32_t ca = s < a.size() ? a[s] : -1, gb = s < b.size() ? b[s] : -1;
      std::printf("prompt %2zu: %s at step %zu: cpu %d gpu %d, cpu top-2 gap %.4f\n", i, tie ? "near-tie" : "DIVERGED", s,
                  ca, gb, gap);
      if (!cases.empty()) cases += ",";
      char buf[512];
      std::snprintf(buf, sizeof buf, "{\"prompt\":\"%s\",\"step\":%zu,\"cpu\":%d,\"gpu\":%d,\"gap\":%.5f,\"near_tie\":%s}",
                    json_escape(p.text).c_str(), s, ca, gb, gap, tie ? "true" : "false");
      cases += buf;
    }
    std::printf("%s, %s weights: %d prompts x %d tokens: %d equal, %d near-ties (gap < %.3g), %d diverged\n",
                model.c_str(), gpu_weights.c_str(), static_cast<int>(prompts().size()), n_tokens, equal, near, tie_gap,
                diverged);
    if (!out.empty()) {
      cudaDeviceProp prop{};
      cudaGetDeviceProperties(&prop, 0);
      std::ofstream f(out, std::ios::app);
      const std::string name = model.substr(model.find_last_of('/') == std::string::npos ? 0 : model.find_last_of('/') + 1);
      f << "{\"commit\":\"" << commit << "\",\"gpu\":\"" << prop.name << "\",\"model\":\"" << name << "\",\"gpu_weights\":\""
        << gpu_weights << "\",\"quantization\":\"" << quantization << "\",\"tokens\":" << n_tokens << ",\"tie_gap\":" << tie_gap << ",\"prompts\":" << prompts().size()
        << ",\"equal\":" << equal << ",\"near_ties\":" << near << ",\"diverged\":" << diverged << ",\"cases\":[" << cases
        << "]}\n";
    }
    return diverged == 0 ? 0 : 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 2;
  }
}
