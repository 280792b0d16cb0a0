// A reference to one head-page: `page_size` tokens x head_dim of ONE KV head of
// ONE layer (DESIGN.md §1.3). The tier is part of the type so a slot number is
// never read against the wrong pool (TensorRT-LLM's KVCacheIndex idea).
#pragma once
#include <cstdint>
#include <functional>

namespace dhs {

enum class Tier : uint8_t { Device = 0, Host = 1 };

struct PageRef {
  static constexpr int32_t kNone = -1;
  Tier tier = Tier::Host;
  int32_t slot = kNone;  // index into that tier's pool

  bool valid() const { return slot != kNone; }
  friend bool operator==(const PageRef&, const PageRef&) = default;
};

inline const char* tier_name(Tier t) { return t == Tier::Device ? "device" : "host"; }

}  // namespace dhs
