// StepRunner on the CUDA backend (built only where nvcc is found).
#include "backend/cuda/cuda_check.h"
#include "core/error.h"
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
    co.max_batch = 1;
    co.max_step_tokens = 2048;
    co.max_context = max_ctx;
    co.page_size = o.page_size;
    if (o.progress) o.progress(0, 1);
    model_ = std::make_unique<LlamaCuda>(src, co);
    if (o.progress) o.progress(1, 1);
    if (o.sparse_policy != "dense") set_policy(policy_config(o));
  }
  void set_policy(const PolicyConfig& pc) override { model_->set_sparsity(pc); }
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
  int64_t max_step_tokens() const override { return 2048; }
  void step(PageTable& table, const int32_t* ids, int64_t n, std::vector<float>* logits) override {
    model_->forward({LlamaCuda::Seq{&table, 0, ids, n}}, logits);
  }

 private:
  std::unique_ptr<LlamaCuda> model_;
};

}  // namespace

std::unique_ptr<StepRunner> make_cuda_runner(const WeightSource& src, const EngineOptions& o, int64_t max_ctx) {
  return std::make_unique<CudaRunner>(src, o, max_ctx);
}

}  // namespace dhs
