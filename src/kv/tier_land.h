// Landing: a layer's late pages copied into HBM inside the step, before its attention (issue 23,
// docs/hierarchy.md "Landing"). On the recall-ahead schedule a page missing from HBM crosses PCIe
// twice — read in place by the step, then recalled for the next one. Landing makes it once: the
// step copies each late page of the layer's lists into a free device slot from a stack the host
// set aside before the step, rewrites the list's key to that slot (so the split finds it
// resident and the resident kernel reads it from HBM), and logs the landing; after the step the
// host adopts the logged pages as recalled ones (their host copies stay, clean). When the stack
// runs out the remaining late entries keep their host keys and are read in place as before.
//
// This is the CPU statement of the device op (backend/cuda/tier_land.h) and its oracle: entries
// land in list order, the i-th landing taking land_slots[i]. (The device claims slots with an
// atomic counter, so which entry takes which slot varies; which entries land does not when the
// stack holds every late entry, and the bytes never do.) A page named by two entries (a verify's
// rows under per-row selections) lands twice, into two slots: the host adopts the first and
// frees the other.
//
// Adopted where it lands (LandAdopt, docs/hierarchy.md "Landed pages adopted in the step"): the
// two things the next step's kernels need of a landed page are written by the landing itself —
// the page table's entry (the mirror the next step's lists are built from) rewritten from the
// page's host key to its device slot, and the rows kept under the page's key (its key sketch and
// summaries) copied from the host key's rows to the slot's. The entry is written only if it still
// holds the host key (a compare-and-swap on the device): of a page landed twice the first landing
// takes it (on the device, the first to swap), and its log entry says so (`adopted`); the host
// adopts exactly those, later, off the step's critical path.
//
//   lists.slots: [nnz] keys (tier_split.h: a device slot s as s, a host slot h as n_device + h)
//   land_slots:  [n_land] free device slots, taken in order
//   log:         one LandEntry per landing, in landing order
#pragma once
#include <cstdint>
#include <span>
#include <vector>

#include "kv/page_lists.h"
#include "kv/page_pool.h"

namespace dhs {

struct LandEntry {
  int32_t row = 0;        // the list's row (request x KV head)
  int32_t page_pos = 0;   // the page's index in its sequence
  int32_t dev_slot = 0;   // where it landed
  int32_t host_slot = 0;  // where it lives in the host tier (its copy stays there)
  bool adopted = true;    // with LandAdopt: this landing rewrote the page's table entry (else true)
  bool operator==(const LandEntry&) const = default;
};

// What a landing writes beside the page's bytes when it adopts the page itself (see above).
//   table:    [n_slots, n_lists, max_pages] keys (the device page table's layout), list =
//             layer * n_heads_kv + head; a row r of the lists is request r / n_heads_kv (its table
//             slot req_slot[r / n_heads_kv]), head r % n_heads_kv
//   rows:     arrays of rows kept by key ([n_device + n_host, row_bytes] each): the landed page's
//             row copied from key n_device + host slot to key device slot
struct LandAdopt {
  std::span<int32_t> table;
  std::span<const int32_t> req_slot;
  int n_lists = 0;
  int64_t max_pages = 0;
  int n_heads_kv = 1;
  int layer = 0;
  struct Rows {
    uint8_t* base = nullptr;
    int64_t row_bytes = 0;
  };
  std::vector<Rows> rows;
};

// Lands lists' late entries in order while land_slots last: each page's K and V copied from
// host to device (pools with storage, or nullptr for bookkeeping alone), its key rewritten to
// the device slot. Returns the landings (also appended to *log when given).
// adopt (optional): the table entry and key rows written as above.
int64_t land_late_pages(PageLists& lists, int64_t n_device, std::span<const int32_t> land_slots, PagePool* device,
                        const PagePool* host, std::vector<LandEntry>* log, const LandAdopt* adopt = nullptr);

}  // namespace dhs
