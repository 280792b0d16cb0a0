#include "kv/tier_land.h"

#include <algorithm>

#include "core/error.h"
#include "kv/tier_split.h"

namespace dhs {

int64_t land_late_pages(PageLists& lists, int64_t n_device, std::span<const int32_t> land_slots, PagePool* device,
                        const PagePool* host, std::vector<LandEntry>* log) {
  const size_t n_rows = static_cast<size_t>(lists.n_requests) * static_cast<size_t>(lists.n_heads_kv);
  DHS_CHECK(lists.indptr.size() == n_rows + 1 && lists.slots.size() == lists.page_pos.size() &&
                static_cast<size_t>(lists.indptr.back()) == lists.slots.size(),
            "land_late_pages: malformed lists ({} rows, indptr of {}, {} slots, {} positions)", n_rows, lists.indptr.size(),
            lists.slots.size(), lists.page_pos.size());
  DHS_CHECK((device == nullptr) == (host == nullptr), "land_late_pages: both pools or neither");
  if (device) {
    DHS_CHECK(device->tier() == Tier::Device && host->tier() == Tier::Host && device->has_storage() && host->has_storage() &&
                  device->page_size() == host->page_size() && device->head_dim() == host->head_dim() &&
                  device->n_pages() == n_device,
              "land_late_pages: a device pool of {} pages and a host tier of its page shape, both with storage", n_device);
  }
  for (const int32_t s : land_slots)
    DHS_CHECK(s >= 0 && s < n_device, "land_late_pages: landing slot {} outside the device pool's {} pages", s, n_device);
  const size_t page_elems = device ? static_cast<size_t>(device->page_size()) * static_cast<size_t>(device->head_dim()) : 0;
  int64_t landed = 0;
  for (size_t r = 0; r < n_rows; ++r) {
    for (int32_t k = lists.indptr[r]; k < lists.indptr[r + 1]; ++k) {
      if (landed == static_cast<int64_t>(land_slots.size())) return landed;
      int32_t& key = lists.slots[static_cast<size_t>(k)];
      const PageRef p = tier_of_key(key, n_device);
      if (p.tier == Tier::Device) continue;
      const int32_t d = land_slots[static_cast<size_t>(landed++)];
      if (device) {
        DHS_CHECK(p.slot < host->n_pages(), "land_late_pages: host slot {} outside the host tier's {} pages", p.slot,
                  host->n_pages());
        const PageRef to{Tier::Device, d};
        std::copy_n(host->k_page(p), page_elems, device->k_page(to));
        std::copy_n(host->v_page(p), page_elems, device->v_page(to));
      }
      key = d;
      if (log) log->push_back({static_cast<int32_t>(r), lists.page_pos[static_cast<size_t>(k)], d, p.slot});
    }
  }
  return landed;
}

}  // namespace dhs
