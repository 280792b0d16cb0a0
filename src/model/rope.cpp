#include "model/rope.h"

#include <cmath>

namespace dhs {

void rope_inv_freq(const ModelConfig& cfg, float* inv_freq) {
  const int64_t half = cfg.head_dim / 2;
  const auto& sc = cfg.rope_scaling;
  for (int64_t i = 0; i < half; ++i) {
    double f = 1.0 / std::pow(static_cast<double>(cfg.rope_theta), static_cast<double>(2 * i) / cfg.head_dim);
    if (sc.kind == RopeScaling::Kind::Linear) {
      f /= sc.factor;
    } else if (sc.kind == RopeScaling::Kind::Llama3) {
      // Llama-3.1: keep high frequencies, divide low ones by factor, blend between.
      const double low_wavelen = sc.original_max_position / sc.low_freq_factor;
      const double high_wavelen = sc.original_max_position / sc.high_freq_factor;
      const double wavelen = 2.0 * M_PI / f;
      if (wavelen > low_wavelen) {
        f /= sc.factor;
      } else if (wavelen >= high_wavelen) {
        const double smooth = (sc.original_max_position / wavelen - sc.low_freq_factor) /
                              (sc.high_freq_factor - sc.low_freq_factor);
        f = (1.0 - smooth) * f / sc.factor + smooth * f;
      }
    }
    if (!cfg.rope_freq_factors.empty()) f /= cfg.rope_freq_factors[static_cast<size_t>(i)];
    inv_freq[i] = static_cast<float>(f);
  }
}

}  // namespace dhs
