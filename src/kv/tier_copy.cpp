#include "kv/tier_copy.h"

#include <cstring>

#include "core/error.h"

namespace dhs {

int64_t copy_pages(const PagePool& src, PagePool& dst, std::span<const PageMove> moves) {
  DHS_CHECK(src.has_storage() && dst.has_storage(), "page copy needs pools with storage");
  DHS_CHECK(src.page_size() == dst.page_size() && src.head_dim() == dst.head_dim(),
            "page copy between pools of different page shapes");
  const size_t page_floats = static_cast<size_t>(src.page_size()) * static_cast<size_t>(src.head_dim());
  int64_t runs = 0;
  for (size_t i = 0; i < moves.size();) {
    const PageMove& m = moves[i];
    DHS_CHECK(m.src.tier == src.tier() && m.dst.tier == dst.tier(), "page copy: move {} names the wrong tiers", i);
    DHS_CHECK(src.is_used(m.src) && dst.is_used(m.dst), "page copy: move {} names a free slot", i);
    size_t n = 1;  // the run: consecutive slots on both sides
    while (i + n < moves.size() && moves[i + n].src.tier == src.tier() && moves[i + n].dst.tier == dst.tier() &&
           moves[i + n].src.slot == m.src.slot + static_cast<int32_t>(n) &&
           moves[i + n].dst.slot == m.dst.slot + static_cast<int32_t>(n) && src.is_used(moves[i + n].src) &&
           dst.is_used(moves[i + n].dst))
      ++n;
    std::memcpy(dst.k_page(m.dst), src.k_page(m.src), n * page_floats * sizeof(float));
    std::memcpy(dst.v_page(m.dst), src.v_page(m.src), n * page_floats * sizeof(float));
    ++runs;
    i += n;
  }
  return runs;
}

}  // namespace dhs
