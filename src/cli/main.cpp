// `dhisparse`: the command-line front end. Uses only the public API.
//   dhisparse generate [-m MODEL] (-p PROMPT | -p @FILE | -p - | -f FILE) [--chat] [-n N] [sampling flags]
//   dhisparse info [MODEL]
//   dhisparse eval [...] | bench [...] | --version
// Every flag value is checked while parsing (cli/option_checks.h), before a model loads, so a
// typo costs no load and its message never lands in the generated text. One command per file:
// generate_command, eval_command, bench_command; info is here.
#include <CLI/CLI.hpp>

#include <algorithm>
#include <array>
#include <cstdio>
#include <iostream>
#include <new>
#include <string>
#include <string_view>

#include "cli/bench_command.h"
#include "cli/cli_common.h"
#include "cli/eval_command.h"
#include "cli/generate_command.h"
#include "cli/serve_command.h"
#include "cli/stdout_writer.h"
#include "cli/version.h"
#include "dhisparse/engine.h"

namespace {

constexpr std::array<std::string_view, 5> kCommands = {"generate", "info", "eval", "bench", "serve"};

// `dhisparse foo`: CLI11 would say "A subcommand is required"; name the commands instead.
std::string command_error(int argc, char** argv) {
  std::string list;
  for (const auto c : kCommands) list += (list.empty() ? "" : ", ") + std::string(c);
  if (argc < 2) return "a command is required; commands: " + list + " (dhisparse --help)";
  const std::string first = argv[1];
  if (first.empty() || first[0] != '-')
    if (std::find(kCommands.begin(), kCommands.end(), first) == kCommands.end())
      return "unknown command '" + first + "'; commands: " + list + " (dhisparse --help)";
  return "";
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"dhisparse: long-context LLM decoding engine.\n"
               "Examples:\n"
               "  dhisparse generate -p \"What is the capital of France?\" --chat\n"
               "  dhisparse generate -m model.gguf -p \"Once upon a time\" -n 64 --temperature 0.8\n"
               "  dhisparse generate -f prompt.txt -q > answer.txt\n"
               "  dhisparse info models/SmolLM2-135M-Instruct.Q4_1.gguf"};
  app.require_subcommand(1);
  app.set_version_flag("--version", dhs::cli::version_text());
  app.failure_message([](const CLI::App*, const CLI::Error& e) {
    return "error: " + std::string(e.what()) + "\nRun with --help for more information.\n";
  });
  if (const std::string err = command_error(argc, argv); !err.empty()) {
    std::fprintf(stderr, "error: %s\n", err.c_str());
    return 2;
  }

  dhs::cli::GenerateCommand generate(app);
  dhs::cli::BenchCommand bench(app);
  dhs::cli::EvalCommand eval(app);
  dhs::cli::ServeCommand serve(app);
  std::string model;
  auto* info = app.add_subcommand("info", "Print a model's architecture, shapes, dtypes, context, RoPE and tokenizer, "
                                          "after the checks loading makes (without loading the weights)");
  info->add_option("model", model, "GGUF file or Hugging Face directory (default: the bundled model)");

  try {
    app.parse(argc, argv);
    if (generate.parsed()) generate.check();
    if (eval.parsed()) eval.check();
    if (serve.parsed()) serve.check();
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }

  dhs::cli::StdoutWriter out;
  std::string oom_while = "loading the model";  // what an std::bad_alloc interrupted, for its message
  try {
    if (bench.parsed()) return bench.run(argv[0]);
    if (info->parsed()) {
      std::cout << dhs::describe_model(dhs::cli::resolve_model(model, info->count("model") > 0));
      return dhs::cli::stdout_status(0);
    }
    if (eval.parsed()) return eval.run(oom_while);
    if (serve.parsed()) return serve.run(oom_while);
    return generate.run(out, oom_while);
  } catch (const std::bad_alloc&) {
    out.end_line();
    std::fprintf(stderr, "error: out of memory %s; lower --ctx-size (-c), or use a smaller model\n", oom_while.c_str());
    return 1;
  } catch (const std::exception& e) {
    out.end_line();  // the message starts a line of its own, after any echoed prompt
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
}
