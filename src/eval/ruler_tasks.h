// RULER-style synthetic long-context tasks (needle retrieval, variable tracking,
// common words, QA), generated deterministically from a seed and grown with filler
// to a token budget. Used by the evaluation harness; knows nothing of the engine.
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace dhs::eval {

enum class TaskKind { NiahSingle, NiahMultiKey, NiahMultiValue, NiahMultiQuery, VariableTracking, CommonWords, Qa };

// "niah_single", "niah_multikey", "niah_multivalue", "niah_multiquery", "vt", "cwe", "qa".
std::string task_name(TaskKind task);
// Inverse of task_name. Throws dhs::Error on an unknown name, listing the valid ones.
TaskKind parse_task(const std::string& name);
std::vector<TaskKind> all_tasks();

// One generated prompt. The user turn is `context + question` (context ends with a
// blank line); the assistant turn starts with `answer_prefix` (may be empty).
struct Sample {
  TaskKind task;
  int64_t target_tokens;
  uint64_t seed;
  std::string context;        // the long document: filler with the inserted facts
  std::string question;       // asked after the context
  std::string answer_prefix;  // e.g. "The special magic number for quiet-harbor is"
  std::vector<std::string> answers;  // every string the output must contain
  int max_new_tokens;         // enough to write all answers
};

// token_count(text): number of tokens of `text` under the model's tokenizer. Injected
// so tests can use a fake; make_sample calls it O(log target) times.
// The result satisfies token_count(context + question) <= target_tokens and, unless
// one filler step is coarser than that, >= 0.97 x target_tokens.
// Throws dhs::Error when the task's fixed text alone exceeds target_tokens.
Sample make_sample(TaskKind task, int64_t target_tokens, uint64_t seed,
                   const std::function<int64_t(const std::string&)>& token_count);

// Fraction in [0, 1] of s.answers found in `output` (case-insensitive substring match
// of each whitespace-trimmed answer).
double score_output(const Sample& s, const std::string& output);

}  // namespace dhs::eval
