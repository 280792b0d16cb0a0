#include "kv/tier_land.h"

#include <algorithm>

#include "core/error.h"
#include "kv/tier_split.h"

namespace dhs {

int64_t land_late_pages(PageLists& lists, int64_t n_device, std::span<const int32_t> land_slots, PagePool* device,
                        const PagePool* host, std::vector<LandEntry>* log, const LandAdopt* adopt) {
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
  if (adopt) {
    DHS_CHECK(adopt->n_heads_kv == lists.n_heads_kv && adopt->n_lists > 0 && adopt->max_pages > 0 &&
                  adopt->layer >= 0 && adopt->layer * adopt->n_heads_kv + adopt->n_heads_kv <= adopt->n_lists &&
                  adopt->req_slot.size() >= static_cast<size_t>(lists.n_requests),
              "land_late_pages: a table of {} lists x {} pages for {} KV heads at layer {}, {} request slots for {} requests",
              adopt->n_lists, adopt->max_pages, adopt->n_heads_kv, adopt->layer, adopt->req_slot.size(), lists.n_requests);
    for (const LandAdopt::Rows& r : adopt->rows)
      DHS_CHECK(r.base && r.row_bytes > 0, "land_late_pages: a row array needs its base and a positive row size");
  }
  // The table entry of row r's page at page_pos (checked inside the table).
  const auto entry = [&](size_t r, int32_t page_pos) -> int32_t& {
    const size_t req = r / static_cast<size_t>(adopt->n_heads_kv), head = r % static_cast<size_t>(adopt->n_heads_kv);
    const int64_t list = static_cast<int64_t>(adopt->layer) * adopt->n_heads_kv + static_cast<int64_t>(head);
    DHS_CHECK(page_pos >= 0 && page_pos < adopt->max_pages, "land_late_pages: page {} outside the table's {}", page_pos,
              adopt->max_pages);
    const int64_t off = (static_cast<int64_t>(adopt->req_slot[req]) * adopt->n_lists + list) * adopt->max_pages + page_pos;
    DHS_CHECK(off >= 0 && static_cast<size_t>(off) < adopt->table.size(), "land_late_pages: request slot {} outside the table",
              adopt->req_slot[req]);
    return adopt->table[static_cast<size_t>(off)];
  };
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
      bool adopted = true;
      if (adopt) {
        int32_t& e = entry(r, lists.page_pos[static_cast<size_t>(k)]);
        adopted = e == key;  // (a page landed twice: the first landing took the entry)
        if (adopted) {
          e = d;
          for (const LandAdopt::Rows& rw : adopt->rows)
            std::copy_n(rw.base + static_cast<int64_t>(key) * rw.row_bytes, rw.row_bytes, rw.base + static_cast<int64_t>(d) * rw.row_bytes);
        }
      }
      key = d;
      if (log) log->push_back({static_cast<int32_t>(r), lists.page_pos[static_cast<size_t>(k)], d, p.slot, adopted});
    }
  }
  return landed;
}

}  // namespace dhs
