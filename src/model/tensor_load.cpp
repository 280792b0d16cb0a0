#include "model/tensor_load.h"

#include "core/error.h"
#include "core/thread_pool.h"
#include "model/dequant.h"

namespace dhs {

const RawTensor& checked_tensor(const WeightSource& src, const std::string& name, const std::vector<int64_t>& shape) {
  const RawTensor* t = src.find(name);
  DHS_CHECK(t != nullptr, "model: missing tensor '{}'", name);
  DHS_CHECK(t->shape == shape, "model: tensor '{}' has shape [{}], expected [{}]", name, fmt::join(t->shape, ", "),
            fmt::join(shape, ", "));
  DHS_CHECK(dequant_supported(t->dtype), "model: tensor '{}' has unsupported type {}", name, dtype_traits(t->dtype).name);
  const int64_t cols = shape.back();
  const int64_t rows = t->n_elems() / cols;
  const size_t row_bytes = dtype_row_bytes(t->dtype, cols);
  DHS_CHECK(row_bytes * static_cast<size_t>(rows) <= t->n_bytes, "model: tensor '{}' is truncated", name);
  return *t;
}

std::vector<float> load_tensor_f32(const WeightSource& src, const std::string& name, const std::vector<int64_t>& shape) {
  const RawTensor* t = &checked_tensor(src, name, shape);
  const int64_t cols = shape.back();
  const int64_t rows = t->n_elems() / cols;
  const size_t row_bytes = dtype_row_bytes(t->dtype, cols);
  std::vector<float> out(static_cast<size_t>(t->n_elems()));
  ThreadPool::global().parallel_for(rows, [&](int64_t b, int64_t e, int) {
    for (int64_t r = b; r < e; ++r)
      dequantize_row(t->dtype, t->data + static_cast<size_t>(r) * row_bytes, out.data() + r * cols, cols);
  }, 64);
  return out;
}

}  // namespace dhs
