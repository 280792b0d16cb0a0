// Greedy speculative decoding's exactness on the GPU, with the divergences classified (issue 24):
// for each prompt, one engine (batch of one) generates N greedy tokens without speculation and
// with --speculative-k K; at the first step where the two differ, the non-speculative run's own
// top-2 logit gap there (its decode step, replayed through a Session under the same policy) says
// whether it was a near-tie (gap < --tie-gap, listed) or a divergence. Prompts as
// bench/spec_exactness.py makes them: chat questions from templates and subjects, and plain
// continuations of the repository's docs at varied offsets and lengths (--docs). One JSON row:
//   {"commit", "gpu", "model", "policy", "verify_selection", "spec_k", "draft_policy", "prompts",
//    "tokens", "identical", "near_ties", "diverged", "tie_gap", "cases": [{"prompt", "step", "plain",
//    "spec", "gap", "near_tie"} ...]}
//   spec_exactness_gpu -m MODEL --policy coverage:0.99 --verify-selection per-row -k 3 --prompts 500 -n 32
#include <CLI/CLI.hpp>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "bench/bench_text.h"
#include "dhisparse/engine.h"
#include "dhisparse/policy.h"

namespace {

const std::vector<std::string> kSubjects = {
    "the sea", "prime numbers", "bread", "volcanoes", "chess", "honey bees", "trains", "winter", "owls",
    "bridges", "the moon", "rivers", "coffee", "paper", "a violin", "gardening", "deserts", "snow",
    "the alphabet", "lighthouses", "penguins", "thunderstorms", "libraries", "clocks", "mountains"};
const std::vector<std::string> kTemplates = {
    "Write two sentences about {}.", "What is the most surprising fact about {}?", "Explain {} to a child.",
    "Give three tips about {}.", "Write a haiku about {}.", "Why do people like {}?", "Describe {} in one paragraph."};
const std::vector<size_t> kLengths = {300, 800, 2000};  // characters of free text

struct Prompt {
  bool chat;
  std::string text;
};

std::vector<Prompt> make_prompts(int n, uint32_t seed, const std::string& docs_dir) {
  std::vector<std::filesystem::path> files;
  for (const auto& e : std::filesystem::directory_iterator(docs_dir))
    if (e.path().extension() == ".md") files.push_back(e.path());
  std::sort(files.begin(), files.end());
  std::string docs;
  for (const auto& f : files) {
    std::ifstream in(f);
    std::stringstream ss;
    ss << in.rdbuf();
    docs += ss.str() + "\n\n";
  }
  if (docs.size() < 10000) throw std::runtime_error("too little text under " + docs_dir);
  std::mt19937 rng(seed);
  std::vector<Prompt> out;
  for (int i = 0; i < n; ++i) {
    if (i % 2 == 0) {
      std::string q = kTemplates[rng() % kTemplates.size()];
      q.replace(q.find("{}"), 2, kSubjects[rng() % kSubjects.size()]);
      out.push_back({true, q});
    } else {
      const size_t start = rng() % (docs.size() - 8000);
      out.push_back({false, docs.substr(start, kLengths[rng() % kLengths.size()])});
    }
  }
  return out;
}



using dhs::bench::json_escape;
using dhs::bench::top2_gap;

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Greedy speculative output against plain decoding on one GPU engine, divergences classified"};
  std::string model, out, commit = "unknown", policy = "dense", verify_selection = "last-row", draft = "sinkwindow:2";
  std::string docs_dir = "docs";
  int n_tokens = 32, n_prompts = 500, k = 3, max_cases = 40;
  uint32_t seed = 24;
  float tie_gap = 0.01f;
  app.add_option("-m,--model", model, "GGUF file")->required();
  app.add_option("--policy", policy, "the verifier's (and plain decoding's) sparse policy");
  app.add_option("--verify-selection", verify_selection, "last-row, all-rows or per-row");
  app.add_option("-k", k, "drafts per cycle")->check(CLI::Range(1, 16));
  app.add_option("--draft-policy", draft, "the drafts' pages");
  app.add_option("--prompts", n_prompts, "prompts")->check(CLI::Range(1, 100000));
  app.add_option("-n,--tokens", n_tokens, "greedy tokens per prompt")->check(CLI::Range(1, 4096));
  app.add_option("--seed", seed, "prompt choice");
  app.add_option("--docs", docs_dir, "directory of .md files for the free-text prompts");
  app.add_option("--tie-gap", tie_gap, "a divergence where plain decoding's top-2 gap is below this is a near-tie");
  app.add_option("--max-cases", max_cases, "cases listed in the row");
  app.add_option("--out", out, "append a JSON row here");
  app.add_option("--commit", commit, "commit recorded in the row");
  CLI11_PARSE(app, argc, argv);
  try {
    dhs::EngineOptions o;
    o.model_path = model;
    o.device = "cuda";
    o.policy = dhs::PolicySpec::parse(policy);
    o.verify_selection = verify_selection;
    o.max_context = 4096;
    auto e = dhs::Engine::load(o);
    const std::vector<Prompt> prompts = make_prompts(n_prompts, seed, docs_dir);
    dhs::GenerateOptions plain;
    plain.sampling.temperature = 0.0f;
    plain.max_tokens = n_tokens;
    plain.ignore_eos = true;
    plain.speculative_k = 0;
    dhs::GenerateOptions spec = plain;
    spec.speculative_k = k;
    spec.draft_policy = draft;
    int identical = 0, near = 0, diverged = 0, listed = 0;
    int64_t verifies = 0, drafted = 0, accepted = 0, checked = 0;
    std::string cases;
    for (size_t i = 0; i < prompts.size(); ++i) {
      const Prompt& p = prompts[i];
      const std::vector<int32_t> ids = p.chat ? e->tokenize_chat({{"user", p.text}}, true) : e->tokenize(p.text);
      const auto a = e->generate(ids, plain).tokens;
      const dhs::GenerateResult r = e->generate(ids, spec);
      const auto& b = r.tokens;
      verifies += r.spec_verifies;
      drafted += r.spec_drafted;
      accepted += r.spec_accepted;
      checked += static_cast<int64_t>(a.size());
      size_t s = 0;
      while (s < a.size() && s < b.size() && a[s] == b[s]) ++s;
      if (s == a.size() && s == b.size()) {
        ++identical;
        continue;
      }
      // Plain decoding's logits before step s: the prompt, then its own tokens one step at a time.
      auto sess = e->open_session();
      std::vector<float> lg;
      sess->append(ids, &lg);
      for (size_t j = 0; j < s; ++j) sess->append({a[j]}, &lg);
      const int64_t V = e->vocab_size();
      const float gap = top2_gap(lg, V);
      const int32_t replay = static_cast<int32_t>(std::max_element(lg.begin(), lg.begin() + V) - lg.begin());
      const bool tie = gap < tie_gap;
      (tie ? near : diverged) += 1;
      const int32_t pa = s < a.size() ? a[s] : -1, sb = s < b.size() ? b[s] : -1;
      std::printf("prompt %4zu: %s at step %zu: plain %d spec %d, plain's top-2 gap %.4f%s\n", i, tie ? "near-tie" : "DIVERGED",
                  s, pa, sb, gap, replay == pa ? "" : " (the replayed step's argmax differs from plain's token)");
      if (listed++ < max_cases) {
        if (!cases.empty()) cases += ",";
        char buf[640];
        std::snprintf(buf, sizeof buf,
                      "{\"prompt\":\"%s\",\"step\":%zu,\"plain\":%d,\"spec\":%d,\"gap\":%.5f,\"near_tie\":%s,\"replay_agrees\":%s}",
                      json_escape(p.text.substr(0, 60)).c_str(), s, pa, sb, gap, tie ? "true" : "false",
                      replay == pa ? "true" : "false");
        cases += buf;
      }
    }
    std::printf("%s, policy %s (%s), k %d, %s: %zu prompts x %d tokens: %d identical, %d near-ties (gap < %.3g), %d diverged; "
                "%.2f of %.2f drafts kept per verify\n",
                model.c_str(), policy.c_str(), verify_selection.c_str(), k, draft.c_str(), prompts.size(), n_tokens, identical,
                near, tie_gap, diverged, verifies ? static_cast<double>(accepted) / verifies : 0.0,
                verifies ? static_cast<double>(drafted) / verifies : 0.0);
    if (!out.empty()) {
      cudaDeviceProp prop{};
      cudaGetDeviceProperties(&prop, 0);
      std::ofstream f(out, std::ios::app);
      const std::string name = model.substr(model.find_last_of('/') == std::string::npos ? 0 : model.find_last_of('/') + 1);
      f << "{\"commit\":\"" << commit << "\",\"gpu\":\"" << prop.name << "\",\"device\":\"cuda\",\"model\":\"" << name
        << "\",\"policy\":\"" << policy << "\",\"verify_selection\":\"" << verify_selection << "\",\"spec_k\":" << k
        << ",\"draft_policy\":\"" << draft << "\",\"prompts\":" << prompts.size() << ",\"tokens\":" << checked
        << ",\"identical\":" << identical << ",\"near_ties\":" << near << ",\"diverged\":" << diverged
        << ",\"tie_gap\":" << tie_gap << ",\"accepted_per_verify\":" << (verifies ? static_cast<double>(accepted) / verifies : 0.0)
        << ",\"method\":\"one engine, one request at a time; the gap is plain decoding's own logits at the first differing step\""
        << ",\"cases\":[" << cases << "]}\n";
    }
    return diverged == 0 ? 0 : 1;
  } catch (const std::exception& ex) {
    std::fprintf(stderr, "error: %s\n", ex.what());
    return 2;
  }
}
