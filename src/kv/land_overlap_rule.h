// Which decode steps land their late pages beside the resident part's attention (issue 23, What
// item 4; CudaModelOptions::land_overlap, `--kv-land-overlap`). With the host tier and landing, a
// decode layer's late pages cross PCIe (the landing kernel, a block per list) while the pages
// already in HBM are attended; the overlapped form runs the two on two streams and merges by LSE,
// the serial form lands first. The overlapped form costs a fixed extra per layer (a second split,
// the fork and join, a third merge, the resident attention on fewer blocks) and saves what the
// landing would have added in series, so it pays only where a layer lands enough bytes:
//  - 8B shape, 128k x 3 (H100, session 38): ~13.6 MB landed a layer, +8-11% tok/s;
//  - the default model under the serving load (H100, session 38): ~0.2 MB a layer, -6% req/s (the
//    fixed extra, ~30 us a layer from its TPOT: 11.3 -> 12.4 ms over 30 layers).
// At the landing kernel's ~35 GB/s (13.6 MB in ~390 us a layer, session 32's timeline) 30 us is
// ~1 MB; `auto` takes the overlapped form when the last decode step's claims (the late entries
// that asked for a slot: what the landing side reads) come to at least twice that a layer. A
// step's late pages change slowly (the churn: 3-5.5% of the reads), so the last step predicts the
// next; the first step of a model has no history and runs serial.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace dhs {

struct LandOverlapRule {
  enum class Mode { Off, On, Auto };
  Mode mode = Mode::Off;
  int64_t min_bytes_per_layer = int64_t{2} << 20;

  bool enabled() const { return mode != Mode::Off; }
  // The next decode step's form, after one whose landing side read `claims` pages of
  // `page_bytes` (K and V) over `n_layers` layers.
  bool take(int64_t claims, int64_t page_bytes, int64_t n_layers) const {
    if (mode != Mode::Auto) return mode == Mode::On;
    if (claims <= 0 || page_bytes <= 0 || n_layers <= 0) return false;
    return static_cast<double>(claims) * static_cast<double>(page_bytes) / static_cast<double>(n_layers) >=
           static_cast<double>(min_bytes_per_layer);
  }

  // "off" (or "0"), "on" (or "1"), "auto"; nullopt for anything else.
  static std::optional<LandOverlapRule> parse(std::string_view s) {
    LandOverlapRule r;
    if (s == "off" || s == "0") r.mode = Mode::Off;
    else if (s == "on" || s == "1") r.mode = Mode::On;
    else if (s == "auto") r.mode = Mode::Auto;
    else return std::nullopt;
    return r;
  }
  std::string name() const { return mode == Mode::Off ? "off" : mode == Mode::On ? "on" : "auto"; }
};

}  // namespace dhs
