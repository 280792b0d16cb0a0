// Limits of the chat-template interpreter: a model file carries its template and a
// server renders user text through it, so a hostile template must fail with a clear
// dhs::Error in well under a second instead of crashing, hanging or exhausting memory.
// Parse-time limits bound the syntax tree (and so the recursion that walks it); one
// RenderBudget per render bounds stack depth, time and memory at run time.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

namespace dhs::jinja {

// A runtime error raised where the source position is unknown (a builtin, a
// value operation); the interpreter turns it into dhs::Error with line:column.
class JinjaError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// --- parse time --------------------------------------------------------------------
// Real chat templates are a few kB (the bundled ones 0.2-5 kB; tool-calling ones reach
// tens of kB); 1 MiB leaves room for any of them and bounds the work of lexing.
inline constexpr size_t kMaxTemplateBytes = size_t{1} << 20;
// Nesting of block statements ({% if %}, {% for %}, {% macro %}, ...). Real templates
// nest fewer than 10 deep; each level is a few stack frames in the parser and the evaluator.
inline constexpr int kMaxStmtDepth = 256;
// Height of one expression's syntax tree. A left-associative chain "a ~ b ~ c ..." is
// flat in the source but one level deeper per term in the tree, and the evaluator
// recurses once per level. Real templates stay under 20; 512 admits a 300-term
// concatenation written out by hand (jinja2 itself runs into Python's recursion limit
// near 1000).
inline constexpr int kMaxExprDepth = 512;
// Recursion of the parser inside one expression (brackets, unary operators, the else
// branch of a conditional). A bracket counts twice and costs about a dozen parser
// frames, so this admits some 100 nested brackets; real templates nest fewer than 5.
inline constexpr int kMaxParseNesting = 200;

// --- render time -------------------------------------------------------------------
// Nested macro calls (a macro calling itself, caller() chains). Real templates call at
// most a few deep; recursion deeper than this is runaway.
inline constexpr int kMaxCallDepth = 64;
// Nesting of evaluation on the native stack: statements, expression nodes and macro
// calls together. Any template within the parse limits fits (256 + 512 < 1024); macro
// recursion multiplies nesting, and this caps it. Measured at these limits: at most
// 0.6 MiB of stack in release builds, 3 MiB under ASan, inside a thread's default 8 MiB.
inline constexpr int kMaxEvalDepth = 1024;
// For-loop iterations over one render. A long conversation (10,000 messages, looped
// over once or twice, with tool calls) takes tens of thousands; an empty iteration
// costs a few hundred nanoseconds.
inline constexpr int64_t kMaxLoopIterations = 1'000'000;
// The rendered prompt, and any single string value. A 1M-token prompt is about 4 MiB
// of text; 32 MiB is 8x that, and checking before building keeps a center(2e9) from
// allocating gigabytes.
inline constexpr size_t kMaxOutputBytes = size_t{32} << 20;
// Items of any single list (or the code points a string is split into): 48 MiB of values.
inline constexpr size_t kMaxListItems = size_t{1} << 20;
// Evaluation steps over one render: statements, expression nodes, loop iterations,
// element comparisons (a step is ~25 ns of work). The bundled templates take 22-78
// steps per message (10,000 messages: under 0.8M); 10M steps run in about 0.3 s.
inline constexpr int64_t kMaxSteps = 10'000'000;
// Bytes of values created or copied over one render (strings count their text, lists
// and dicts their 48-byte slots). It bounds live memory and the time spent copying
// and transforming text (at most ~0.3 s). The bundled templates create or copy 6-12x
// their output (10,000 messages of 400 bytes: 25-50 MiB), so a conversation of about
// 20 MiB, five times a 1M-token prompt, still renders.
inline constexpr int64_t kMaxWorkBytes = int64_t{256} << 20;

struct RenderLimits {
  int max_call_depth = kMaxCallDepth;
  int max_eval_depth = kMaxEvalDepth;
  int64_t max_loop_iterations = kMaxLoopIterations;
  size_t max_output_bytes = kMaxOutputBytes;  // the output and any one string
  size_t max_list_items = kMaxListItems;
  int64_t max_steps = kMaxSteps;
  int64_t max_work_bytes = kMaxWorkBytes;
};

struct Object;

// The running totals of one render, checked as they grow.
class RenderBudget {
 public:
  explicit RenderBudget(const RenderLimits& limits) : limits_(limits) {}
  RenderBudget(const RenderBudget&) = delete;
  RenderBudget& operator=(const RenderBudget&) = delete;

  const RenderLimits& limits() const { return limits_; }
  void steps(int64_t n) {
    steps_ += n;
    if (steps_ > limits_.max_steps) fail_steps();
  }
  void bytes(int64_t n) {
    bytes_ += n;
    if (bytes_ > limits_.max_work_bytes) fail_bytes();
  }
  int64_t steps_used() const { return steps_; }
  int64_t bytes_used() const { return bytes_; }

  // Namespaces created in this render: the only mutable values, so the only way to
  // build a reference cycle. The render clears them at its end to break any cycle.
  std::vector<std::shared_ptr<Object>> namespaces;

 private:
  [[noreturn]] void fail_steps() const;
  [[noreturn]] void fail_bytes() const;

  RenderLimits limits_;
  int64_t steps_ = 0;
  int64_t bytes_ = 0;
};

// The budget of the render running on this thread (renders on different threads count
// separately); null outside a render, e.g. while the context is built from JSON.
extern constinit thread_local RenderBudget* t_render_budget;

// Installs a budget for the current thread for the lifetime of the guard.
class BudgetScope {
 public:
  explicit BudgetScope(RenderBudget& b) : saved_(t_render_budget) { t_render_budget = &b; }
  ~BudgetScope() { t_render_budget = saved_; }
  BudgetScope(const BudgetScope&) = delete;
  BudgetScope& operator=(const BudgetScope&) = delete;

 private:
  RenderBudget* saved_;
};

inline void charge_steps(int64_t n) {
  if (RenderBudget* b = t_render_budget) b->steps(n);
}
inline void charge_bytes(size_t n) {
  if (RenderBudget* b = t_render_budget) b->bytes(static_cast<int64_t>(n));
}
inline size_t max_string_bytes() { return t_render_budget ? t_render_budget->limits().max_output_bytes : kMaxOutputBytes; }
inline size_t max_list_items() { return t_render_budget ? t_render_budget->limits().max_list_items : kMaxListItems; }

// Call BEFORE building a string of `n` bytes / a list of `n` items: throw instead of
// allocating past what any value may hold. `what` names the operation for the message.
[[noreturn]] void fail_string_size(const char* what, size_t n);
[[noreturn]] void fail_list_size(const char* what, size_t n);
inline void check_string_size(size_t n, const char* what) {
  if (n > max_string_bytes()) fail_string_size(what, n);
}
inline void check_list_size(size_t n, const char* what) {
  if (n > max_list_items()) fail_list_size(what, n);
}
// For strings built piece by piece from bounded pieces: call after each piece.
inline void check_growth(const std::string& out, const char* what) {
  if (out.size() > max_string_bytes()) fail_string_size(what, out.size());
}
// n * each without overflow, for sizes computed from template integers.
inline size_t checked_mul(size_t n, size_t each, const char* what) {
  if (each != 0 && n > max_string_bytes() / each) fail_string_size(what, n > SIZE_MAX / each ? SIZE_MAX : n * each);
  return n * each;
}

}  // namespace dhs::jinja
