// StepRunner on the CUDA backend (built only where nvcc is found).
#include "backend/cuda/cuda_check.h"
#include "core/error.h"
#include "engine/host_sampling.h"
#include "engine/step_runner.h"
#include "model/arch/llama_cuda.h"

namespace dhs {

namespace {

class CudaRunner final : public StepRunner {
 public:
  CudaRunner(const WeightSource& src, const EngineOptions& o, int64_t max_ctx) {
    DHS_CHECK(cuda::device_count() > 0, "--device cuda: no GPU found");
    CudaModelOptions co;
    const GpuPageData pd = gpu_page_data(o);  // only what the estimator reads (eval: all)
    co.summaries = pd.summaries;
    co.key_sketch = pd.key_sketch;
    co.max_batch = kMaxBatch;
    co.max_step_tokens = 2048;
    co.max_context = max_ctx;
    co.page_size = o.page_size;
    if (o.progress) o.progress(0, 1);
    model_ = std::make_unique<LlamaCuda>(src, co);
    sampling_ = std::make_unique<HostSampling>(model_->config().vocab_size, kMaxBatch);
    if (o.progress) o.progress(1, 1);
    if (!o.policy.dense()) set_policy(o.policy);
  }
  void set_policy(const PolicySpec& spec) override { model_->set_sparsity(spec); }
  double fit_key_basis(const PageTable&, int64_t, int, bool) override {
    throw Error("the projected key sketch (psketch4:R, qsketch4:R) is a CPU experiment so far: --device cpu");
  }
  void capture_queries(bool) override {}
  PageCounts take_page_counts() override {
    const CudaSparsityStats st = model_->sparsity_stats();
    model_->reset_sparsity_stats();
    PageCounts c;
    c.layer_head_read = st.read;
    c.layer_head_total = st.total;
    for (size_t i = 0; i < st.read.size(); ++i) {
      c.read += st.read[i];
      c.total += st.total[i];
    }
    return c;
  }
  const ModelConfig& config() const override { return model_->config(); }
  PagePool& pages() override { return model_->allocator(); }
  // One request for now: LlamaCuda's pool is sized max_batch x max_context; the serving
  // issue sizes it from --max-num-seqs and the HBM left.
  int max_batch() const override { return kMaxBatch; }
  int64_t max_step_tokens() const override { return 2048; }
  void set_sampled_vocab(int64_t n) override { sampling_->set_sampled_vocab(n); }
  void begin_request(int slot, const SamplingParams& p) override { sampling_->begin(slot, p); }
  // Samples on the host from the copied logits, as before; the device sampler (already the
  // graph's last kernel) takes over once LlamaCuda takes per-request sampling rows.
  void step(const std::vector<StepRequest>& batch, StepOutput* out, bool want_logits) override {
    std::vector<LlamaCuda::Seq> seqs;
    bool any_sample = false;
    for (const StepRequest& r : batch) {
      DHS_CHECK(r.slot >= 0 && r.slot < kMaxBatch, "request slot {} outside [0, {})", r.slot, kMaxBatch);
      seqs.push_back(LlamaCuda::Seq{r.table, r.slot, r.tokens, r.n_new});
      any_sample = any_sample || r.sample;
    }
    out->logits.clear();
    model_->forward(seqs, want_logits || any_sample ? &out->logits : nullptr);
    sampling_->sample(batch, out, want_logits);
  }

 private:
  static constexpr int kMaxBatch = 1;
  std::unique_ptr<LlamaCuda> model_;
  std::unique_ptr<HostSampling> sampling_;
};

}  // namespace

std::unique_ptr<StepRunner> make_cuda_runner(const WeightSource& src, const EngineOptions& o, int64_t max_ctx) {
  return std::make_unique<CudaRunner>(src, o, max_ctx);
}

}  // namespace dhs
