#include "cli/cli_common.h"

#include <unistd.h>

#include <charconv>
#include <cstdio>
#include <cstdlib>
#include <filesystem>

#include "cli/option_checks.h"
#include "cli/stdout_writer.h"

namespace dhs::cli {

std::string default_model_path() {
  const std::string name = "SmolLM2-135M-Instruct.Q4_1.gguf";
  if (const char* d = std::getenv("DHS_MODELS_DIR")) return std::string(d) + "/" + name;
#ifdef DHS_SOURCE_DIR
  const std::string src = std::string(DHS_SOURCE_DIR) + "/models/" + name;
  if (std::filesystem::exists(src)) return src;
#endif
  return "models/" + name;
}

void progress_bar(const char* what, int64_t done, int64_t total) {
  if (!isatty(STDERR_FILENO) && done != total) return;
  const int width = 30;
  const int filled = total > 0 ? static_cast<int>(width * done / total) : width;
  std::fprintf(stderr, "\r%s [%s%s] %3d%%", what, std::string(static_cast<size_t>(filled), '#').c_str(),
               std::string(static_cast<size_t>(width - filled), '.').c_str(),
               total > 0 ? static_cast<int>(100 * done / total) : 100);
  if (done == total) std::fprintf(stderr, "\n");
  std::fflush(stderr);
}

// A FIFO would block the open, a device (/dev/zero) would map or read forever; stat() answers
// without opening. (model_loader.cpp checks the same for library callers.)
std::string resolve_model(const std::string& m, bool given) {
  if (given && m.empty()) throw Error("-m/--model: empty path (leave -m out for the default model)");
  const std::string p = m.empty() ? default_model_path() : m;
  std::error_code ec;
  const auto st = std::filesystem::status(p, ec);
  if (m.empty() && !std::filesystem::exists(st))
    throw Error("the default model is not here (" + p + "); fetch it with `bash scripts/fetch_model.sh`, or pass -m MODEL");
  if (!std::filesystem::exists(st)) throw Error("model path '" + p + "' does not exist");
  if (!std::filesystem::is_regular_file(st) && !std::filesystem::is_directory(st))
    throw Error("model path '" + p + "' is neither a regular file nor a directory");
  return p;
}

int stdout_status(int rc) {
  bool gone = false;
  if (const std::string err = flush_stdout(&gone); !err.empty()) {
    if (gone) return kExitReaderGone;
    throw Error(err);
  }
  return rc;
}

void PolicyFlags::add(CLI::App* app, const std::string& estimator_help, bool any_estimator) {
  auto* est = app->add_option("--estimator", spec.estimator, estimator_help)->capture_default_str();
  if (!any_estimator) est->check(CLI::IsMember({"minmax", "meanspread", "gaussian", "sketch4"}));
  app->add_option("--combine", combine, "q heads of a GQA group: sum or max")->check(CLI::IsMember({"sum", "max"}))->capture_default_str();
  app->add_option("--sink-pages", spec.n_sink, "First pages every sparse list keeps")->check(int_in(0, 1 << 20))->capture_default_str();
  app->add_option("--recent-pages", spec.n_recent, "Last pages every sparse list keeps")->check(int_in(0, 1 << 20))->capture_default_str();
  app->add_option("--dense-below", spec.dense_below, "contexts shorter than this many tokens stay dense")->check(int_in(0, kNoLimit));
}

PolicySpec PolicyFlags::parse(const std::string& text, const std::string& option) {
  spec.combine = combine == "max" ? GroupCombine::Max : GroupCombine::Sum;
  try {
    return PolicySpec::parse(text, spec);
  } catch (const Error& e) {
    throw CLI::ValidationError(option, e.what());
  }
}

void add_gpu_weight_options(CLI::App* app, EngineOptions& eo) {
  app->add_option("--gpu-weights", eo.gpu_weights,
                  "CUDA weight storage: packed (GGUF block formats kept, Q8_0 and Q4_K repacked at load for the "
                  "tensor-core GEMV v2: the same numbers), native (every block format on the CUDA-core GEMV v1) "
                  "or f16")
      ->check(CLI::IsMember({"native", "packed", "f16"}))
      ->capture_default_str();
  app->add_option("--quantization", eo.quantization,
                  "fp8 quantizes every projection matrix at load to FP8 E4M3 with one scale per output row (the "
                  "embeddings and output head stay as loaded; CUDA stores the codes, the CPU their values, its "
                  "oracle with --weights f32); none keeps --gpu-weights")
      ->check(CLI::IsMember({"none", "fp8"}))
      ->capture_default_str();
  app->add_option("--draft-quantization", eo.draft_quantization,
                  "CUDA speculative decoding: fp8 keeps an FP8 copy of the projections (quantized as --quantization "
                  "fp8) that steps of drafts only read, about half a draft step's weight bytes over f16 projections "
                  "(--gpu-weights f16 or an f16 / bf16 checkpoint); verify and plain steps keep the model's weights, "
                  "so output is unchanged; none: drafts read the model's weights")
      ->check(CLI::IsMember({"none", "fp8"}))
      ->capture_default_str();
  app->add_option("--verify-selection", eo.verify_selection,
                  "CUDA speculative decoding under a sparse policy, what a verify's rows read: last-row (one page set "
                  "for all rows, the last row's), all-rows (one set scored from every row's queries) or per-row (each "
                  "row its own set: the output of decoding without speculation; the pages read once per row) or "
                  "per-row-union (the same sets, their union read once, each page masked to the rows that chose it)")
      ->check(CLI::IsMember({"last-row", "all-rows", "per-row", "per-row-union"}))
      ->capture_default_str();
}

void add_kv_tier_options(CLI::App* app, EngineOptions& eo) {
  app->add_option("--cpu-kv-gb,--swap-space", eo.cpu_kv_gb,
                  "KV hierarchy: a host tier of this many GiB behind the KV pool (on the GPU: pinned DRAM, with --kv-recall "
                  "ahead); 0 = none")
      ->check(CLI::Range(0.0, 1048576.0))
      ->capture_default_str();
  app->add_option_function<std::string>(
         "--kv-device-budget",
         [&eo](const std::string& v) {
           if (v == "auto") {
             eo.kv_budget_auto = true;
             return;
           }
           int64_t n = -1;
           const char* end = v.data() + v.size();
           const auto [p, ec] = std::from_chars(v.data(), end, n);
           if (ec != std::errc() || p != end || n < 0 || n > (int64_t{1} << 40))
             throw CLI::ValidationError("--kv-device-budget", "a page count in [0, 2^40] or auto, got '" + v + "'");
           eo.kv_device_budget = n;
           eo.kv_budget_auto = false;
         },
         "With --cpu-kv-gb: KV pages each request keeps in the device tier (its least recently used full "
         "pages go to the host tier past it); 0 = no limit; auto = sized after every step from the request's "
         "working set and misses and the device tier's room (kv/device_budgets.h)")
      ->default_str("0");
  app->add_option("--kv-budget-io-share", eo.kv_budget_io_share,
                  "With --kv-device-budget auto: the share of a decode step the misses the budgets allow may take on "
                  "the link, at a page's measured price; the budgets' miss target follows it (lower on a loaded link: "
                  "bigger buffers); 0 = a fixed target of 2.5% of the pages read")
      ->check(CLI::Range(0.0, 1.0))
      ->capture_default_str();
  app->add_option("--kv-io-gbps", eo.kv_io_gbps,
                  "With --cpu-kv-gb: the link between the tiers in GB/s, for the hierarchy's I/O load (IO-aware "
                  "admission: a request that needs running requests' pages offloaded waits while the load with it "
                  "running is above serve's --kv-io-admit-max, 0.8); 0 = measured at load")
      ->check(CLI::Range(0.0, 1e6))
      ->capture_default_str();
  app->add_option("--kv-recall", eo.kv_recall,
                  "With --cpu-kv-gb, when pages move: layer = before each layer's attention the pages it reads are "
                  "recalled; ahead = nothing moves inside a step (late pages are read in place from the host tier "
                  "and merged by log-sum-exp) and after it the pages it read are recalled for the next step "
                  "(the GPU's schedule); land = ahead, and the step copies its late pages into device slots set aside "
                  "before it and reads them there, so on the GPU each crosses PCIe once")
      ->check(CLI::IsMember({"layer", "ahead", "land"}))
      ->capture_default_str();
  app->add_flag_function(
      "--kv-sync-recalls", [&eo](int64_t) { eo.kv_overlap_recalls = false; },
      "With --kv-recall ahead / land on the GPU: plan and issue a step's recalls before the next step is launched "
      "(default: while it runs, their copies queued behind it)");
  app->add_option("--kv-land-overlap", eo.kv_land_overlap,
                  "With --kv-recall land or ahead on the GPU: land (or read in place) a decode step's late pages beside "
                  "the attention over its resident pages (two streams, merged by log-sum-exp): auto = on the steps "
                  "after one whose late pages came to at least 2 MiB a layer; on = every step; off = in series")
      ->check(CLI::IsMember({"auto", "on", "off"}))
      ->capture_default_str();
  app->add_option("--kv-lru-mirror", eo.kv_lru_mirror,
                  "With the host tier on the GPU: the LRU's last uses mirrored in HBM, a decode step's reads written "
                  "there and copied back in one piece instead of scanned on the host as read stamps")
      ->check(CLI::IsMember({"on", "off"}))
      ->capture_default_str();
}

}  // namespace dhs::cli
