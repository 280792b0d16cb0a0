#include "kv/tiered_kv.h"

#include <algorithm>
#include <chrono>
#include <tuple>
#include <unordered_map>
#include <unordered_set>

#include "core/error.h"
#include "core/thread_pool.h"

namespace dhs {

TierStats& TierStats::operator+=(const TierStats& o) {
  recalled += o.recalled;
  offloaded += o.offloaded;
  dropped += o.dropped;
  hits += o.hits;
  late += o.late;
  recall_runs += o.recall_runs;
  offload_runs += o.offload_runs;
  return *this;
}

TieredKv::TieredKv(PagePool& device, PagePool& host, LruParams lru)
    : dev_(device),
      host_(host),
      lru_(device.n_pages(), lru),
      dev_where_(static_cast<size_t>(device.n_pages())),
      host_copy_(static_cast<size_t>(device.n_pages()), -1) {
  DHS_CHECK(device.tier() == Tier::Device && host.tier() == Tier::Host, "tiered KV: pools of the wrong tiers");
  DHS_CHECK(device.page_size() == host.page_size() && device.head_dim() == host.head_dim(),
            "tiered KV: the tiers' page shapes differ");
}

void TieredKv::check_in_table(const PageTable& t, const PageId& id) {
  DHS_CHECK(id.layer >= 0 && id.layer < t.n_layers() && id.head >= 0 && id.head < t.n_heads_kv() && id.idx >= 0 &&
                id.idx < t.n_pages_per_list(),
            "tiered KV: page {} of ({}, {}) is not in the table", id.idx, id.layer, id.head);
}

TieredKv::Owner& TieredKv::owner_of(const PageTable& t) {
  auto it = owners_.find(t.id());
  DHS_CHECK(it != owners_.end(), "tiered KV: page table {} is not registered", t.id());
  return it->second;
}
const TieredKv::Owner& TieredKv::owner_of(const PageTable& t) const {
  auto it = owners_.find(t.id());
  DHS_CHECK(it != owners_.end(), "tiered KV: page table {} is not registered", t.id());
  return it->second;
}

void TieredKv::track_device(Owner& o, PageRef p, const Where& w, int64_t now) {
  dev_where_[static_cast<size_t>(p.slot)] = w;
  host_copy_[static_cast<size_t>(p.slot)] = -1;
  lru_.insert(p.slot, o.id, now);
  slot_changed(p.slot);
  ++o.resident;
}

void TieredKv::add(PageTable& t, int64_t now, int64_t budget) {
  DHS_CHECK(owners_.count(t.id()) == 0, "tiered KV: page table {} is registered already", t.id());
  DHS_CHECK(budget >= 0, "tiered KV: budget {} < 0", budget);
  DHS_CHECK(t.page_size() == dev_.page_size(), "tiered KV: table page size {} != the pool's {}", t.page_size(),
            dev_.page_size());
  Owner fresh;
  // (a released owner's id is taken again: the per-step counts by owner id, the stamps' scan's
  // per thread and the device mirror's, stay sized by the requests held at once, not ever seen)
  if (!free_ids_.empty()) {
    fresh.id = free_ids_.back();
    free_ids_.pop_back();
  } else {
    fresh.id = next_owner_++;
  }
  fresh.t = &t;
  fresh.budget = budget;
  Owner& o = owners_.emplace(t.id(), std::move(fresh)).first->second;
  by_id_.resize(static_cast<size_t>(next_owner_), nullptr);
  by_id_[static_cast<size_t>(o.id)] = &o;
  for (int l = 0; l < t.n_layers(); ++l)
    for (int h = 0; h < t.n_heads_kv(); ++h)
      for (int64_t i = 0; i < t.n_pages_per_list(); ++i) {
        const PageRef p = t.page(l, h, i);
        if (p.tier == Tier::Device) track_device(o, p, {&t, l, h, i}, now);
      }
  o.tracked = t.n_pages_per_list();
}

TierStats TieredKv::set_budget(PageTable& t, int64_t budget, int64_t now) {
  DHS_CHECK(budget >= 0, "tiered KV: budget {} < 0", budget);
  Owner& o = owner_of(t);
  o.budget = budget;
  const int64_t over = movable_resident(o) - budget;
  return over > 0 ? offload(t, over, now) : TierStats{};
}
TierStats TieredKv::set_budgets(std::span<PageTable* const> tables, std::span<const int64_t> budgets, int64_t now) {
  DHS_CHECK(tables.size() == budgets.size(), "tiered KV: {} budgets for {} tables", budgets.size(), tables.size());
  TierStats st;
  std::unordered_set<const PageTable*> seen;
  for (PageTable* t : tables) seen.insert(t);
  if (seen.size() != tables.size()) {  // (a table listed twice: each in turn, as the definition)
    for (size_t i = 0; i < tables.size(); ++i) st += set_budget(*tables[i], budgets[i], now);
    return st;
  }
  for (size_t i = 0; i < tables.size(); ++i) {
    DHS_CHECK(budgets[i] >= 0, "tiered KV: budget {} < 0", budgets[i]);
    owner_of(*tables[i]).budget = budgets[i];
  }
  enforce_budgets(tables, now, st);
  return st;
}
int64_t TieredKv::budget(const PageTable& t) const { return owner_of(t).budget; }
int64_t TieredKv::resident_pages(const PageTable& t) const { return owner_of(t).resident; }

void TieredKv::sort_list_order(std::vector<PageId>& pages) {
  const auto before = [](const PageId& a, const PageId& b) {
    return std::tie(a.layer, a.head, a.idx) < std::tie(b.layer, b.head, b.idx);
  };
  if (std::is_sorted(pages.begin(), pages.end(), before)) return;
  const auto packable = [](const PageId& p) {
    return p.layer >= 0 && p.layer < (1 << 16) && p.head >= 0 && p.head < (1 << 16) && p.idx >= 0 && p.idx < (int64_t{1} << 32);
  };
  if (!std::all_of(pages.begin(), pages.end(), packable)) {
    std::sort(pages.begin(), pages.end(), before);
    return;
  }
  std::vector<uint64_t> keys(pages.size());
  for (size_t i = 0; i < pages.size(); ++i)
    keys[i] = (static_cast<uint64_t>(pages[i].layer) << 48) | (static_cast<uint64_t>(pages[i].head) << 32) |
              static_cast<uint64_t>(pages[i].idx);
  std::sort(keys.begin(), keys.end());
  for (size_t i = 0; i < pages.size(); ++i)
    pages[i] = {static_cast<int>(keys[i] >> 48), static_cast<int>((keys[i] >> 32) & 0xffff), static_cast<int64_t>(keys[i] & 0xffffffff)};
}

std::vector<int32_t> TieredKv::movable_prefix(std::span<const int32_t> order, int64_t n) const {
  std::vector<int32_t> out;
  for (int32_t s : order) {
    if (static_cast<int64_t>(out.size()) == n) break;
    const Where& w = dev_where_[static_cast<size_t>(s)];
    if (owner_at(s).swapped || movable(*w.t, w.idx)) out.push_back(s);
  }
  return out;
}

std::vector<int32_t> TieredKv::victims(int32_t owner, int64_t n, int64_t now, int64_t host_room) const {
  std::vector<int32_t> out;
  if (n <= 0) return out;
  // Room in the host tier for every copy: the first n pages that may move, in the LRU's order —
  // from the first n + (candidates that may not move) of that order, so the selection's passes
  // test nothing but the LRU's own arrays.
  if (host_room >= n) {
    int64_t fixed = 0;  // resident pages that may not move (the pages lists append into)
    for (const auto& [id, o] : owners_)
      if (owner < 0 || o.id == owner) fixed += o.resident - movable_resident(o);
    return movable_prefix(lru_.select(owner, n + fixed, now), n);
  }
  // Else the LRU's order over every candidate, then only pages that may move (full ones), and of
  // those needing a copy only as many as the host tier has room for (a page with a clean host
  // copy leaves for free).
  for (int32_t s : lru_.select(owner, lru_.n_slots(), now)) {
    if (!victim_fits(s, host_room)) continue;
    out.push_back(s);
    if (static_cast<int64_t>(out.size()) == n) break;
  }
  return out;
}

bool TieredKv::victim_fits(int32_t s, int64_t& host_room) const {
  const Where& w = dev_where_[static_cast<size_t>(s)];
  if (!may_move(*w.t, w.idx)) return false;
  if (host_copy_[static_cast<size_t>(s)] < 0) {
    if (host_room == 0) return false;
    --host_room;
  }
  return true;
}

void TieredKv::evict(std::span<const int32_t> slots, TierStats& st) {
  std::vector<PageMove> moves;
  int64_t need = 0;
  for (int32_t s : slots) need += host_copy_[static_cast<size_t>(s)] < 0;
  std::vector<PageRef> hs;
  DHS_CHECK(host_.allocate(need, &hs), "tiered KV: the host tier is full ({} pages to offload, {} free)", need,
            host_.n_free());
  size_t k = 0;
  for (int32_t s : slots)
    if (host_copy_[static_cast<size_t>(s)] < 0) moves.push_back({PageRef{Tier::Device, s}, hs[k++]});
  std::sort(moves.begin(), moves.end(), [](const PageMove& a, const PageMove& b) { return a.src.slot < b.src.slot; });
  st.offload_runs += move(dev_, host_, moves);
  st.offloaded += static_cast<int64_t>(moves.size());
  for (const PageMove& m : moves) {
    host_copy_[static_cast<size_t>(m.src.slot)] = m.dst.slot;
    if (on_move_) on_move_(m.src, m.dst);
  }
  st.dropped += static_cast<int64_t>(slots.size() - moves.size());
  // Each slot's page back at its host copy. A slot's entries (its table entry, host copy, LRU
  // entry, change mark) are its own, so a large eviction splits the slots over the thread pool
  // (an eviction of a churned step at 128k x 4 is ~100k pages: ~25 ms serially on the H100's
  // host); what is shared — the owners' counts, the relocate hook, the device pool's free list —
  // comes after, in slot order, so the result is the serial loop's.
  const int64_t n = static_cast<int64_t>(slots.size());
  ThreadPool* pool = n >= parallel_evict_from_ ? &ThreadPool::global() : nullptr;
  std::vector<std::vector<int64_t>> gone_of(static_cast<size_t>(pool ? pool->n_threads() : 1),
                                            std::vector<int64_t>(static_cast<size_t>(next_owner_), 0));
  const auto release = [&](int64_t b, int64_t e, int c) {
    int64_t* gone = gone_of[static_cast<size_t>(c)].data();
    for (int64_t k = b; k < e; ++k) {
      const int32_t s = slots[static_cast<size_t>(k)];
      const Where& w = dev_where_[static_cast<size_t>(s)];
      w.t->relocate(w.layer, w.head, w.idx, PageRef{Tier::Host, host_copy_[static_cast<size_t>(s)]});
      ++gone[lru_.owner(s)];
      host_copy_[static_cast<size_t>(s)] = -1;
      lru_.erase(s);
      slot_changed(s);
    }
  };
  if (pool) pool->parallel_for(n, release, 4096);
  else release(0, n, 0);
  for (const std::vector<int64_t>& g : gone_of)
    for (size_t id = 0; id < g.size(); ++id)
      if (g[id] != 0) by_id_[id]->resident -= g[id];
  for (int32_t s : slots) {
    if (on_relocate_) {
      const Where& w = dev_where_[static_cast<size_t>(s)];
      relocated(*w.t, w.layer, w.head, w.idx);
    }
    dev_.free(PageRef{Tier::Device, s});
  }
}

TierStats TieredKv::offload(PageTable& t, int64_t n, int64_t now) {
  TierStats st;
  const std::vector<int32_t> v = victims(owner_of(t).id, n, now, host_.n_free());
  evict(v, st);
  totals_ += st;
  return st;
}

TierStats TieredKv::evict_slots(std::span<const int32_t> slots) {
  std::vector<int32_t> v;
  int64_t host_room = host_.n_free();
  std::vector<uint8_t> seen;
  for (int32_t s : slots) {
    if (s < 0 || s >= lru_.n_slots() || !lru_.resident(s) || lru_.pinned(s)) continue;
    if (seen.empty()) seen.assign(static_cast<size_t>(lru_.n_slots()), 0);
    if (seen[static_cast<size_t>(s)]) continue;
    const Where& w = dev_where_[static_cast<size_t>(s)];
    if (!may_move(*w.t, w.idx)) continue;
    if (host_copy_[static_cast<size_t>(s)] < 0) {
      if (host_room == 0) continue;
      --host_room;
    }
    seen[static_cast<size_t>(s)] = 1;
    v.push_back(s);
  }
  TierStats st;
  evict(v, st);
  totals_ += st;
  return st;
}

TierStats TieredKv::adopt_new_pages(PageTable& t, int64_t now) {
  track_new_pages(t, now);
  const Owner& o = owner_of(t);
  const int64_t over = movable_resident(o) - o.budget;
  return over > 0 ? offload(t, over, now) : TierStats{};
}

void TieredKv::track_new_pages(PageTable& t, int64_t now) {
  Owner& o = owner_of(t);
  const int64_t first = std::min(o.tracked, t.n_pages_per_list());  // (below: tracked already)
  for (int l = 0; l < t.n_layers(); ++l)
    for (int h = 0; h < t.n_heads_kv(); ++h)
      for (int64_t i = first; i < t.n_pages_per_list(); ++i) {
        const PageRef p = t.page(l, h, i);
        if (p.tier == Tier::Device && !lru_.resident(p.slot)) track_device(o, p, {&t, l, h, i}, now);
      }
  o.tracked = t.n_pages_per_list();
}

TierStats TieredKv::ensure_resident(PageTable& t, std::span<const PageId> pages, int64_t now) {
  Owner& o = owner_of(t);
  std::vector<PageId> missing;
  std::vector<int32_t> pinned_here;
  TierStats st;
  for (const PageId& id : pages) {
    check_in_table(t, id);
    const PageRef p = t.page(id.layer, id.head, id.idx);
    if (p.tier == Tier::Host) {
      missing.push_back(id);
    } else {
      ++st.hits;
      lru_.touch(p.slot, now);
      if (!lru_.pinned(p.slot)) {
        lru_.set_pinned(p.slot, true);
        pinned_here.push_back(p.slot);
      }
    }
  }
  const auto same = [](const PageId& a, const PageId& b) { return a.layer == b.layer && a.head == b.head && a.idx == b.idx; };
  sort_list_order(missing);
  missing.erase(std::unique(missing.begin(), missing.end(), same), missing.end());
  recall_pages(o, t, missing, now, pinned_here, st);
  o.hits += st.hits;
  totals_.hits += st.hits;
  return st;
}

int64_t TieredKv::move(const PagePool& src, PagePool& dst, std::span<const PageMove> moves) {
  const auto t0 = std::chrono::steady_clock::now();
  const int64_t runs = mover_(src, dst, moves);
  times_.io_ms += std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  return runs;
}

void TieredKv::relocated(const PageTable& t, int layer, int head, int64_t idx) {
  if (!on_relocate_) return;
  if (!time_hooks_) {
    on_relocate_(t, layer, head, idx);
    return;
  }
  const auto t0 = std::chrono::steady_clock::now();
  on_relocate_(t, layer, head, idx);
  times_.hooks_ms += std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

void TieredKv::AnyVictims::add(std::vector<int32_t> slots) const {
  // (a sorted run merged in: the recalls of one request at a time, a few hundred slots each)
  std::sort(slots.begin(), slots.end());
  if (is_added.empty()) is_added.assign(static_cast<size_t>(n_slots), 0);
  size_t keep = 0;
  for (const int32_t s : slots) {
    if (is_added[static_cast<size_t>(s)]) continue;  // (reinserted again: listed once)
    is_added[static_cast<size_t>(s)] = 1;
    slots[keep++] = s;
  }
  slots.resize(keep);
  const size_t mid = added.size();
  added.insert(added.end(), slots.begin(), slots.end());
  std::inplace_merge(added.begin(), added.begin() + static_cast<std::ptrdiff_t>(mid), added.end());
}

TieredKv::AnyVictims TieredKv::take_any_victims(int64_t n, int64_t now) const {
  AnyVictims a;
  a.n_slots = lru_.n_slots();
  a.slots = lru_.select(-1, n, now);
  a.cut = static_cast<int64_t>(a.slots.size()) == n;
  a.rebases = lru_.rebases();
  for (const int32_t s : a.slots) {
    a.last_use.push_back(lru_.last_use(s));
    a.bin.push_back(lru_.order_bin(s, now));
  }
  return a;
}

bool TieredKv::any_victims(const AnyVictims& any, int64_t n, int64_t now, int64_t host_room, std::vector<int32_t>* out) const {
  // victims(-1, n, now, host_room) over the merge of the prefix's unchanged entries and the slots
  // inserted since (at the bin of `now`), in (bin, slot) order.
  out->clear();
  if (n <= 0) return true;
  if (lru_.rebases() != any.rebases) return false;  // (the prefix's last uses were read before the base moved)
  const auto gone = [&](size_t k) {
    const int32_t s = any.slots[k];
    return !lru_.resident(s) || lru_.last_use(s) != any.last_use[k] || (!any.is_added.empty() && any.is_added[static_cast<size_t>(s)]);
  };
  while (any.first < any.slots.size() && gone(any.first)) ++any.first;
  const int64_t b_now = lru_.order_bin_at(now, now);
  const auto before = [](int64_t b1, int32_t s1, int64_t b2, int32_t s2) { return b1 < b2 || (b1 == b2 && s1 < s2); };
  size_t k = any.first;
  auto it = any.added.begin();
  for (;;) {
    while (k < any.slots.size() && gone(k)) ++k;
    const bool from_prefix = k < any.slots.size() &&
                             (it == any.added.end() || before(any.bin[k], any.slots[k], b_now, *it));
    if (!from_prefix && it == any.added.end()) return false;  // (the merge ran out: a fresh selection)
    const int32_t s = from_prefix ? any.slots[k] : *it;
    if (!from_prefix && any.cut && before(any.bin.back(), any.slots.back(), b_now, s)) return false;  // (past the prefix)
    if (from_prefix) ++k;
    else ++it;
    if (!lru_.resident(s) || lru_.pinned(s) || !victim_fits(s, host_room)) continue;
    out->push_back(s);
    if (static_cast<int64_t>(out->size()) == n) {
      ++shared_victim_picks_;
      return true;
    }
  }
}

void TieredKv::recall_pages(Owner& o, PageTable& t, const std::vector<PageId>& missing_pages, int64_t now,
                            std::vector<int32_t>& pinned, TierStats& st, const std::vector<int32_t>* own_victims,
                            const AnyVictims* any) {
  const auto fail = [&](const std::string& why) {
    for (int32_t s : pinned) lru_.set_pinned(s, false);
    throw Error("tiered KV: " + why);
  };
  const int64_t missing = static_cast<int64_t>(missing_pages.size());
  if (missing == 0) return;
  // Room: the request's own pages past its budget, then any request's when the pool is full.
  const int64_t need_own = std::max<int64_t>(0, movable_resident(o) + missing - o.budget);
  // (fewer when the pinned pages alone pass the budget: then the request holds them past it until
  // end_step)
  std::vector<int32_t> out;
  if (own_victims) {  // chosen beforehand: those still its own, unpinned pages, in their order
    for (int32_t s : *own_victims) {
      if (static_cast<int64_t>(out.size()) == need_own) break;
      if (lru_.resident(s) && lru_.owner(s) == o.id && !lru_.pinned(s)) out.push_back(s);
    }
    if (static_cast<int64_t>(out.size()) < need_own) out = victims(o.id, need_own, now, host_.n_free());
  } else {
    out = victims(o.id, need_own, now, host_.n_free());
  }
  const int64_t need_any = std::max<int64_t>(0, missing - (dev_.n_free() + static_cast<int64_t>(out.size())));
  if (need_any > 0) {
    int64_t own_copies = 0;
    for (int32_t s : out) own_copies += host_copy_[static_cast<size_t>(s)] < 0;
    // (the own victims' copies count twice against the room here at most: conservative)
    const int64_t ask = need_any + static_cast<int64_t>(out.size()), room = std::max<int64_t>(0, host_.n_free() - own_copies);
    std::vector<int32_t> more;
    if (!any || !any_victims(*any, ask, now, room, &more)) more = victims(-1, ask, now, room);
    std::unordered_set<int32_t> chosen(out.begin(), out.end());
    int64_t added = 0;
    for (int32_t s : more) {
      if (added == need_any) break;
      if (!chosen.insert(s).second) continue;
      out.push_back(s);
      ++added;
    }
    if (added < need_any)
      fail(std::to_string(missing) + " pages to recall and the device tier has room for " +
           std::to_string(dev_.n_free() + static_cast<int64_t>(out.size())));
  }
  int64_t without_copy = 0;
  for (int32_t s : out) without_copy += host_copy_[static_cast<size_t>(s)] < 0;
  if (without_copy > host_.n_free())
    fail("the host tier is full (" + std::to_string(without_copy) + " pages to offload, " +
         std::to_string(host_.n_free()) + " free)");
  TierStats ev;
  evict(out, ev);
  st += ev;
  // The recalls: host -> device, the host slot kept as the page's clean copy.
  std::vector<PageRef> fresh;
  DHS_CHECK(dev_.allocate(missing, &fresh), "tiered KV: device slots vanished during a recall");
  std::vector<PageMove> moves;
  moves.reserve(missing_pages.size());
  for (size_t k = 0; k < missing_pages.size(); ++k) {
    const PageId& id = missing_pages[k];
    moves.push_back({t.page(id.layer, id.head, id.idx), fresh[k]});
  }
  TierStats rc;
  rc.recall_runs = move(host_, dev_, moves);
  if (on_move_)
    for (const PageMove& m : moves) on_move_(m.src, m.dst);
  rc.recalled = missing;
  for (size_t j = 0; j < moves.size(); ++j) {
    const PageId& id = missing_pages[j];
    const PageRef d = moves[j].dst;
    track_device(o, d, {&t, id.layer, id.head, id.idx}, now);
    host_copy_[static_cast<size_t>(d.slot)] = moves[j].src.slot;
    lru_.set_pinned(d.slot, true);
    pinned.push_back(d.slot);
    t.relocate(id.layer, id.head, id.idx, d);
    relocated(t, id.layer, id.head, id.idx);
  }
  o.recalled += missing;
  if (any) {  // (the shared order's new entries: at the bin of `now`)
    std::vector<int32_t> slots;
    slots.reserve(moves.size());
    for (const PageMove& m : moves) slots.push_back(m.dst.slot);
    any->add(std::move(slots));
  }
  totals_ += ev;
  totals_ += rc;
  st += rc;
}

TierStats TieredKv::request_stats(const PageTable& t) const {
  const Owner& o = owner_of(t);
  TierStats st;
  st.hits = o.hits;
  st.recalled = o.recalled;
  st.late = o.late;
  return st;
}

TierStats TieredKv::note_reads(PageTable& t, std::span<const PageId> pages, int64_t now) {
  const TierStats st = note_reads_of(owner_of(t), t, pages, now);
  totals_ += st;
  return st;
}

TierStats TieredKv::note_reads_of(Owner& o, PageTable& t, std::span<const PageId> pages, int64_t now) {
  TierStats st;
  for (const PageId& id : pages) {
    check_in_table(t, id);
    const PageRef p = t.page(id.layer, id.head, id.idx);
    if (p.tier == Tier::Host) {
      ++st.late;
    } else {
      ++st.hits;
      lru_.touch(p.slot, now);
    }
  }
  o.hits += st.hits;
  o.late += st.late;
  return st;
}

TierStats TieredKv::touch_slots(std::span<const int32_t> slots, int64_t now) {
  TierStats st;
  std::vector<int64_t> by_owner(static_cast<size_t>(next_owner_), 0);  // hits per owner id
  for (int32_t s : slots) {
    DHS_CHECK(s >= 0 && s < lru_.n_slots(), "tiered KV: device slot {} outside [0, {})", s, lru_.n_slots());
    if (!lru_.resident(s)) continue;
    lru_.touch(s, now);
    ++by_owner[static_cast<size_t>(lru_.owner(s))];
    ++st.hits;
  }
  for (auto& [id, o] : owners_) o.hits += by_owner[static_cast<size_t>(o.id)];
  totals_ += st;
  return st;
}

bool TieredKv::page_at(int32_t slot, const PageTable** t, PageId* id) const {
  if (slot < 0 || slot >= lru_.n_slots() || !lru_.resident(slot)) return false;
  const Where& w = dev_where_[static_cast<size_t>(slot)];
  *t = w.t;
  *id = {w.layer, w.head, w.idx};
  return true;
}

void TieredKv::begin_dedupe(Owner& o, const PageTable& t) {
  const size_t n_all = static_cast<size_t>(t.n_layers()) * static_cast<size_t>(t.n_heads_kv()) *
                       static_cast<size_t>(t.n_pages_per_list());
  if (o.seen.size() < n_all) o.seen.resize(n_all, 0);
  if (++o.epoch == 0) {  // (wrapped: the stamps start over)
    std::fill(o.seen.begin(), o.seen.end(), 0);
    o.epoch = 1;
  }
}

bool TieredKv::first_time(Owner& o, const PageTable& t, const PageId& id) {
  check_in_table(t, id);
  uint32_t& stamp = o.seen[(static_cast<size_t>(id.layer) * static_cast<size_t>(t.n_heads_kv()) + static_cast<size_t>(id.head)) *
                               static_cast<size_t>(t.n_pages_per_list()) +
                           static_cast<size_t>(id.idx)];
  if (stamp == o.epoch) return false;
  stamp = o.epoch;
  return true;
}

int64_t TieredKv::ahead_plan(const Owner& o, std::vector<PageId>& missing, int64_t keep_movable) const {
  const int64_t room = o.budget == kUnlimited ? static_cast<int64_t>(missing.size()) : o.budget - keep_movable;
  if (missing.empty() || room <= 0) {
    missing.clear();
    return 0;
  }
  missing.resize(static_cast<size_t>(std::min<int64_t>(room, static_cast<int64_t>(missing.size()))));
  sort_list_order(missing);
  return std::max<int64_t>(0, movable_resident(o) + static_cast<int64_t>(missing.size()) - o.budget);  // (recall_pages' need)
}

TierStats TieredKv::recall_ahead_of(Owner& o, PageTable& t, std::vector<PageId> missing, int64_t keep_movable, int64_t now,
                                    std::vector<int32_t>& pinned, const std::vector<int32_t>* own_victims,
                                    const AnyVictims* any) {
  const auto unpin = [&] {
    for (int32_t slot : pinned)
      if (lru_.resident(slot)) lru_.set_pinned(slot, false);
  };
  ahead_plan(o, missing, keep_movable);
  if (missing.empty()) {
    unpin();
    return {};
  }
  TierStats st;
  try {
    recall_pages(o, t, missing, now, pinned, st, own_victims, any);
  } catch (const Error&) {
    return {};  // (no room now: changed nothing but LRU stamps of pages that were read anyway)
  }
  unpin();  // (nothing else is pinned between steps)
  return st;
}

std::optional<std::vector<std::vector<int32_t>>> TieredKv::victims_many(std::span<const std::pair<int32_t, int64_t>> wants,
                                                                        int64_t now) const {
  int64_t total = 0;
  for (const auto& [id, n] : wants) total += n;
  if (host_.n_free() < total) return std::nullopt;  // (the room for copies could bind: one at a time)
  // As victims' fast path, per owner: the first n + (its pages that may not move) of its order.
  std::unordered_map<int32_t, const Owner*> by_id;
  for (const auto& [tid, o] : owners_) by_id.emplace(o.id, &o);
  std::vector<std::pair<int32_t, int64_t>> asks;
  for (const auto& [id, n] : wants) {
    const Owner& o = *by_id.at(id);
    asks.emplace_back(id, n > 0 ? n + o.resident - movable_resident(o) : 0);
  }
  std::vector<std::vector<int32_t>> out = lru_.select_many(asks, now);
  for (size_t i = 0; i < out.size(); ++i) out[i] = movable_prefix(out[i], wants[i].second);
  return out;
}

TierStats TieredKv::recall_ahead(PageTable& t, std::span<const PageId> pages, int64_t now) {
  Owner& o = owner_of(t);
  // The listed pages, once each: those resident stay (pinned for the call, touched at `now`), the
  // missing ones come in order while the budget has room beside them. The cost is the list's
  // length, not the pool's. No hits are counted: the step's reads were counted when it read them.
  begin_dedupe(o, t);
  std::vector<PageId> missing;
  std::vector<int32_t> pinned;
  int64_t keep_movable = 0;
  for (const PageId& id : pages) {
    if (!first_time(o, t, id)) continue;
    const PageRef p = t.page(id.layer, id.head, id.idx);
    if (p.tier == Tier::Host) {
      missing.push_back(id);
      continue;
    }
    keep_movable += may_move(t, id.idx);
    lru_.touch(p.slot, now);
    if (!lru_.pinned(p.slot)) {
      lru_.set_pinned(p.slot, true);
      pinned.push_back(p.slot);
    }
  }
  return recall_ahead_of(o, t, std::move(missing), keep_movable, now, pinned);
}

std::vector<int32_t> TieredKv::reserve_landing(int64_t n, int64_t now) {
  // (a reservation no after_decode_step took — its step failed — is freed: nothing names it)
  for (const int32_t s : landing_) {
    is_landing_[static_cast<size_t>(s)] = 0;
    dev_.free(PageRef{Tier::Device, s});
  }
  landing_.clear();
  if (n <= 0) return {};
  // Free slots first, then pages no step has read for a cycle of the clock (bucket_steps ticks: a
  // decode step's layers), least recently used first; never a page the last step read, which the
  // next step is likely to read again: evicting it for a landing slot would make it late, land it,
  // and ask for more slots the step after (under a full pool the hit rate fell to 0.11 that way).
  // Fewer slots than n when the pool has no such room (the rest of the step's late pages are read
  // in place).
  free_device_slots(n, now, /*spare_recent=*/true);
  std::vector<PageRef> got;
  DHS_CHECK(dev_.allocate(std::min(n, dev_.n_free()), &got), "tiered KV: free device slots vanished");
  if (is_landing_.empty()) is_landing_.assign(static_cast<size_t>(dev_.n_pages()), 0);
  for (const PageRef& p : got) {
    landing_.push_back(p.slot);
    is_landing_[static_cast<size_t>(p.slot)] = 1;
  }
  return landing_;
}

std::vector<std::vector<int32_t>> TieredKv::claim_landed(std::span<const Landed> landed, std::span<PageTable* const> tables) {
  DHS_CHECK(claimed_.empty(), "tiered KV: a step's landings claimed while the last step's await adoption");
  const size_t n_seq = tables.size();
  std::vector<std::vector<int32_t>> of_seq(n_seq);  // [sequence] its landings' indices
  for (size_t k = 0; k < landed.size(); ++k) {
    const Landed& l = landed[k];
    DHS_CHECK(l.seq >= 0 && static_cast<size_t>(l.seq) < n_seq, "tiered KV: a landing of sequence {} of {}", l.seq, n_seq);
    DHS_CHECK(l.dev_slot >= 0 && l.dev_slot < dev_.n_pages() && !is_landing_.empty() &&
                  is_landing_[static_cast<size_t>(l.dev_slot)] == 1,
              "tiered KV: a landing in device slot {}, not reserved for this step (or taken twice)", l.dev_slot);
    check_in_table(*tables[static_cast<size_t>(l.seq)], l.page);
    is_landing_[static_cast<size_t>(l.dev_slot)] = 2;
    claimed_.push_back(l.dev_slot);
    of_seq[static_cast<size_t>(l.seq)].push_back(static_cast<int32_t>(k));
  }
  for (const int32_t s : landing_)
    if (is_landing_[static_cast<size_t>(s)] == 1) {
      is_landing_[static_cast<size_t>(s)] = 0;
      dev_.free(PageRef{Tier::Device, s});
    }
  landing_.clear();
  return of_seq;
}

void TieredKv::adopt_claimed(std::span<const Landed> landed, const std::vector<std::vector<int32_t>>& of_seq,
                             std::span<PageTable* const> tables, int64_t now, TierStats& st, bool reads_noted) {
  // Each sequence's landings apart on the thread pool (each its own table, owner and slots), in
  // log order within it; the hooks after, in sequence order.
  const size_t n_seq = tables.size();
  DHS_CHECK(of_seq.size() == n_seq, "tiered KV: landings of {} sequences for {} tables", of_seq.size(), n_seq);
  std::vector<std::vector<PageMove>> adopted_of(n_seq);
  std::vector<std::string> failed(n_seq);
  ThreadPool::global().parallel_for(static_cast<int64_t>(n_seq), [&](int64_t b, int64_t e, int) {
    for (size_t i = static_cast<size_t>(b); i < static_cast<size_t>(e); ++i) {
      if (of_seq[i].empty()) continue;
      try {
        PageTable& t = *tables[i];
        Owner& o = owner_of(t);
        for (const int32_t k : of_seq[i]) {
          const Landed& l = landed[static_cast<size_t>(k)];
          if (!l.adopted) continue;  // (another landing of the page took it)
          const PageRef p = t.page(l.page.layer, l.page.head, l.page.idx);
          if (p.tier != Tier::Host || p.slot != l.host_slot) continue;  // (a second landing of one page)
          const PageRef d{Tier::Device, l.dev_slot};
          track_device(o, d, {&t, l.page.layer, l.page.head, l.page.idx}, now);
          host_copy_[static_cast<size_t>(d.slot)] = p.slot;
          t.relocate(l.page.layer, l.page.head, l.page.idx, d);
          ++o.recalled;
          if (!reads_noted) ++o.late;
          adopted_of[i].push_back({p, d});
        }
      } catch (const std::exception& ex) {
        failed[i] = ex.what();
      }
    }
  });
  for (const std::string& f : failed)
    if (!f.empty()) throw Error(f);
  std::vector<PageMove> adopted;
  adopted.reserve(landed.size());
  for (size_t i = 0; i < n_seq; ++i) {
    for (const PageMove& m : adopted_of[i]) {
      if (on_relocate_) {
        const Where& w = dev_where_[static_cast<size_t>(m.dst.slot)];
        relocated(*w.t, w.layer, w.head, w.idx);
      }
      adopted.push_back(m);
    }
  }
  if (on_move_)
    for (const PageMove& m : adopted) on_move_(m.src, m.dst);
  for (const int32_t s : claimed_) {
    const bool kept = lru_.resident(s);
    is_landing_[static_cast<size_t>(s)] = 0;
    if (!kept) dev_.free(PageRef{Tier::Device, s});
  }
  claimed_.clear();
  TierStats ad;
  ad.recalled = static_cast<int64_t>(adopted.size());
  ad.late = reads_noted ? 0 : ad.recalled;
  totals_ += ad;
  st += ad;
}

void TieredKv::enforce_budgets(std::span<PageTable* const> tables, int64_t now, TierStats& st) {
  // Every request's victims in one selection over the slots and one eviction (offload on each in
  // turn takes the same pages and host slots: each request's own pages, the host slots allocated in
  // request order), unless the host tier's room could bind: then one at a time.
  std::vector<std::pair<int32_t, int64_t>> wants;
  for (PageTable* t : tables) {
    const Owner& o = owner_of(*t);
    const int64_t over = movable_resident(o) - o.budget;
    if (over > 0) wants.emplace_back(o.id, over);
  }
  if (wants.empty()) return;
  if (batch_recalls_ && wants.size() > 1)
    if (const auto v = victims_many(wants, now)) {
      std::vector<int32_t> all;
      for (const std::vector<int32_t>& one : *v) all.insert(all.end(), one.begin(), one.end());
      TierStats e;
      evict(all, e);
      totals_ += e;
      st += e;
      return;
    }
  for (PageTable* t : tables) {
    Owner& o = owner_of(*t);
    const int64_t over = movable_resident(o) - o.budget;
    if (over > 0) st += offload(*t, over, now);
  }
}

TierStats TieredKv::after_decode_step(std::span<const int32_t> stamps, int32_t stamp, std::span<const LateRead> late,
                                      std::span<PageTable* const> tables, int64_t now, std::span<const Landed> landed) {
  TierStats st = after_step_reads(stamps, stamp, tables, now, landed);
  st += after_step_recalls(late, now);
  return st;
}

namespace {
using Clock = std::chrono::steady_clock;
// ms since t, t moved to now.
double lap(Clock::time_point& t) {
  const Clock::time_point n = Clock::now();
  const double ms = std::chrono::duration<double, std::milli>(n - t).count();
  t = n;
  return ms;
}
}  // namespace

TierStats TieredKv::after_step_reads(std::span<const int32_t> stamps, int32_t stamp, std::span<PageTable* const> tables,
                                     int64_t now, std::span<const Landed> landed) {
  DHS_CHECK(static_cast<int64_t>(stamps.size()) == lru_.n_slots(), "tiered KV: {} read stamps for {} device slots",
            stamps.size(), lru_.n_slots());
  DHS_CHECK(!pending_, "tiered KV: the last step's recalls were not run (after_step_recalls)");
  const Clock::time_point t = Clock::now();
  // The hits: touched, counted per owner; over chunks of the slots on the thread pool when the
  // pool of slots is large (each slot touched by one chunk; the counts summed after). Slots whose
  // page changed while the step ran are not its reads (after_step_recalls in flight).
  const int64_t n_slots = lru_.n_slots();
  ThreadPool* pool = n_slots >= BucketedLru::kParallelSlots ? &ThreadPool::global() : nullptr;
  // (hits_of[c][o + 1]: chunk c's hits of owner o; BucketedLru::touch_stamped)
  std::vector<std::vector<int64_t>> hits_of(static_cast<size_t>(pool ? pool->n_threads() : 1),
                                            std::vector<int64_t>(static_cast<size_t>(next_owner_) + 1, 0));
  const uint8_t* changed = changed_any_ ? changed_in_flight_.data() : nullptr;
  lru_.advance(now);  // (touch_stamped runs on chunks in parallel: the clock's range first)
  const auto scan = [&](int64_t b, int64_t e, int c) {
    lru_.touch_stamped(stamps, stamp, now, changed, b, e, hits_of[static_cast<size_t>(c)].data());
  };
  if (pool) pool->parallel_for(n_slots, scan, 4096);
  else scan(0, n_slots, 0);
  std::vector<int64_t> by_owner(static_cast<size_t>(next_owner_), 0);
  for (const auto& h : hits_of)
    for (size_t o = 0; o < by_owner.size(); ++o) by_owner[o] += h[o + 1];
  const std::vector<int64_t> tail = tail_reads(tables, [&](int32_t s) { return stamps[static_cast<size_t>(s)] == stamp; });
  return after_reads(std::move(by_owner), tail, tables, landed, t);
}

std::vector<int64_t> TieredKv::tail_reads(std::span<PageTable* const> tables, const std::function<bool(int32_t)>& read) {
  std::vector<int64_t> n(tables.size(), 0);
  for (size_t i = 0; i < tables.size(); ++i) {
    const PageTable& tb = *tables[i];
    for (int l = 0; l < tb.n_layers(); ++l)
      for (int h = 0; h < tb.n_heads_kv(); ++h)
        for (int64_t j = tb.n_tokens() / tb.page_size(); j < tb.n_pages_per_list(); ++j) {
          const PageRef r = tb.page(l, h, j);
          if (r.tier == Tier::Device) n[i] += read(r.slot);
        }
  }
  return n;
}

TieredKv::LruPatch TieredKv::take_lru_patch(int64_t now) {
  LruPatch p;
  const LruPatchSize z = begin_lru_patch(now);
  const size_t n = static_cast<size_t>(z.n);
  p.patch.slot.resize(n), p.patch.use.resize(n), p.patch.owner.resize(n);
  fill_lru_patch(p.patch.slot.data(), p.patch.use.data(), p.patch.owner.data());
  p.patch.tick = z.tick;
  p.patch.full = z.full;
  p.n_owners = z.n_owners;
  return p;
}

TieredKv::LruPatchSize TieredKv::begin_lru_patch(int64_t now) {
  // (the last step's recalls may be pending: run while this step runs, their changes come after
  // its reads — logged since this patch, kept by take_mirror)
  LruPatchSize z;
  z.n = lru_.begin_patch(now, &z.tick, &z.full);
  z.n_owners = next_owner_;
  patch_now_ = now;
  patch_tick_ = z.tick;
  return z;
}

TierStats TieredKv::after_step_reads(std::span<int32_t> mirror, std::span<const int64_t> counts,
                                     std::span<PageTable* const> tables, int64_t now, std::span<const Landed> landed,
                                     std::span<int32_t>* spare) {
  DHS_CHECK(!pending_, "tiered KV: the last step's recalls were not run (after_step_recalls)");
  DHS_CHECK(patch_now_ >= 0 && now == patch_now_, "tiered KV: the mirror's reads of step {}, its patch taken at {}", now,
            patch_now_);
  DHS_CHECK(static_cast<int64_t>(mirror.size()) == lru_.n_slots(), "tiered KV: a mirror of {} slots for {} device slots",
            mirror.size(), lru_.n_slots());
  const Clock::time_point t = Clock::now();
  patch_now_ = -1;
  // What the step read, as the mirror holds it before the LRU takes it (the pages appended into:
  // what the recalls keep), then the mirror taken: the hits per owner, less the reads of slots
  // whose page changed while the step ran (BucketedLru::take_mirror).
  const int32_t tick = patch_tick_;
  const std::vector<int64_t> tail = tail_reads(tables, [&](int32_t s) { return mirror[static_cast<size_t>(s)] == tick; });
  std::vector<int64_t> hits(static_cast<size_t>(next_owner_) + 1, 0);
  for (size_t i = 0; i < counts.size() && i < hits.size(); ++i) hits[i] = counts[i];
  *spare = lru_.take_mirror(mirror, hits.data());
  std::vector<int64_t> by_owner(hits.begin() + 1, hits.end());
  return after_reads(std::move(by_owner), tail, tables, landed, t);
}

TierStats TieredKv::after_reads(std::vector<int64_t> by_owner, std::span<const int64_t> tail_reads,
                                std::span<PageTable* const> tables, std::span<const Landed> landed, Clock::time_point t) {
  TierStats st;
  if (changed_any_) std::fill(changed_in_flight_.begin(), changed_in_flight_.end(), uint8_t{0});
  changed_any_ = false;
  for (auto& [id, o] : owners_) {
    o.hits += by_owner[static_cast<size_t>(o.id)];
    st.hits += by_owner[static_cast<size_t>(o.id)];
  }
  totals_.hits += st.hits;
  // What the recalls keep beside what they bring: each request's resident pages it read that may
  // move — its hits less those of the pages it appends into (now, while the tables are the step's).
  PendingRecalls p;
  p.tables.assign(tables.begin(), tables.end());
  p.keep.resize(tables.size());
  for (size_t i = 0; i < tables.size(); ++i) p.keep[i] = by_owner[static_cast<size_t>(owner_of(*tables[i]).id)] - tail_reads[i];
  times_.scan_ms = lap(t);
  // (the landed slots were stamped by the split but are not resident yet: the scan skipped them;
  // they are adopted by after_step_recalls)
  if (!landing_.empty() || !landed.empty()) {
    p.landed_of = claim_landed(landed, tables);
    p.landed.assign(landed.begin(), landed.end());
    p.budgets_due = true;
  }
  times_.claim_ms = lap(t);
  pending_ = std::move(p);
  return st;
}

TierStats TieredKv::after_step_recalls(std::span<const LateRead> late, int64_t now, bool in_flight) {
  DHS_CHECK(pending_, "tiered KV: after_step_recalls without after_step_reads");
  const PendingRecalls p = std::move(*pending_);
  pending_.reset();
  const std::span<PageTable* const> tables(p.tables);
  times_.io_ms = times_.hooks_ms = 0;
  Clock::time_point t = Clock::now();
  TierStats st;
  // The landings first, not marked as changed in flight: the running step's table named each
  // adopted page's landing slot already (the device adopted it), so its reads there are reads of
  // that page.
  if (p.budgets_due) {
    // (and with the LRU mirrored, logged as changes the running step saw: BucketedLru::set_seen_by_step,
    // off again however adopt_claimed ends)
    struct Seen {
      BucketedLru& lru;
      ~Seen() { lru.set_seen_by_step(false); }
    } seen{lru_};
    lru_.set_seen_by_step(in_flight);
    adopt_claimed(p.landed, p.landed_of, tables, now, st, /*reads_noted=*/false);
  }
  times_.adopt_ms = lap(t);
  if (in_flight) {
    if (changed_in_flight_.empty()) changed_in_flight_.assign(static_cast<size_t>(lru_.n_slots()), 0);
    changed_any_ = in_flight_ = true;
  }
  struct Reset {
    bool& f;
    ~Reset() { f = false; }
  } reset{in_flight_};
  if (p.budgets_due) enforce_budgets(tables, now, st);
  times_.budgets_ms = lap(t);
  std::vector<std::vector<PageId>> late_of(tables.size());
  for (const LateRead& r : late) {
    DHS_CHECK(r.seq >= 0 && static_cast<size_t>(r.seq) < tables.size(), "tiered KV: late read of sequence {} of {}", r.seq,
              tables.size());
    late_of[static_cast<size_t>(r.seq)].push_back(r.page);
  }
  // Each request's plan (its late pages to recall, cut to its room; requests apart on the thread
  // pool: each touches its own table, owner and slots), then every request's own victims in one
  // pass over the LRU, then the recalls (all at once where they need nothing but their own pages).
  const size_t n_req = tables.size();
  std::vector<std::vector<PageId>> missing_of(n_req);
  std::vector<int64_t> want_of(n_req, 0);
  std::vector<TierStats> noted(n_req);
  std::vector<std::string> failed(n_req);
  std::vector<Owner*> owner(n_req);
  for (size_t i = 0; i < n_req; ++i) owner[i] = &owner_of(*tables[i]);
  ThreadPool::global().parallel_for(static_cast<int64_t>(n_req), [&](int64_t b, int64_t e, int) {
    for (size_t i = static_cast<size_t>(b); i < static_cast<size_t>(e); ++i) {
      try {
        PageTable& t = *tables[i];
        Owner& o = *owner[i];
        noted[i] = note_reads_of(o, t, late_of[i], now);  // (hits: none, the log holds host pages; a page moved since is one)
        begin_dedupe(o, t);
        std::vector<PageId>& missing = missing_of[i];
        for (const PageId& id : late_of[i])
          if (first_time(o, t, id) && t.page(id.layer, id.head, id.idx).tier == Tier::Host) missing.push_back(id);
        want_of[i] = ahead_plan(o, missing, p.keep[i]);
      } catch (const std::exception& ex) {
        failed[i] = ex.what();
      }
    }
  });
  for (size_t i = 0; i < n_req; ++i) {
    if (!failed[i].empty()) throw Error(failed[i]);
    st.late += noted[i].late;
    st.hits += noted[i].hits;
    totals_ += noted[i];
  }
  times_.plan_ms = lap(t);
  std::vector<std::pair<int32_t, int64_t>> wants;
  for (size_t i = 0; i < n_req; ++i) wants.emplace_back(owner[i]->id, want_of[i]);
  const auto victims_of = victims_many(wants, now);
  times_.victims_ms = lap(t);
  if (batch_recalls_ && victims_of && recall_batch(tables, missing_of, *victims_of, now, st)) {
    ++batched_steps_;
    times_.recall_ms = lap(t);
    return st;
  }
  // One request at a time; their victims of any owner from one prefix of the LRU's order (at most
  // what they recall in all, twice over: the pages the recalls before evict are skipped in it).
  std::optional<AnyVictims> any;
  int64_t all_missing = 0;
  for (const std::vector<PageId>& m : missing_of) all_missing += static_cast<int64_t>(m.size());
  if (shared_victims_ && all_missing > 0 && lru_.n_pinned() == 0) any = take_any_victims(2 * all_missing + 64, now);
  for (size_t i = 0; i < n_req; ++i) {
    std::vector<int32_t> pinned;
    // (ahead_plan again on the planned list: the same cut and order)
    st += recall_ahead_of(*owner[i], *tables[i], std::move(missing_of[i]), p.keep[i], now, pinned,
                          victims_of ? &(*victims_of)[i] : nullptr, any ? &*any : nullptr);
  }
  times_.recall_ms = lap(t);
  return st;
}

bool TieredKv::recall_batch(std::span<PageTable* const> tables, const std::vector<std::vector<PageId>>& missing_of,
                            const std::vector<std::vector<int32_t>>& victims_of, int64_t now, TierStats& st) {
  const size_t n_req = tables.size();
  // The checks recall_pages makes, request after request, on counts alone.
  std::vector<std::vector<int32_t>> out(n_req);
  std::vector<int64_t> without_copy(n_req, 0);
  int64_t dev_free = dev_.n_free(), host_need = 0;
  for (size_t i = 0; i < n_req; ++i) {
    const Owner& o = owner_of(*tables[i]);
    const int64_t missing = static_cast<int64_t>(missing_of[i].size());
    if (missing == 0) continue;
    const int64_t need_own = std::max<int64_t>(0, movable_resident(o) + missing - o.budget);
    for (int32_t s : victims_of[i]) {
      if (static_cast<int64_t>(out[i].size()) == need_own) break;
      if (lru_.resident(s) && lru_.owner(s) == o.id && !lru_.pinned(s)) out[i].push_back(s);
    }
    if (static_cast<int64_t>(out[i].size()) < need_own) return false;  // (victims beyond its own list)
    if (missing > dev_free + static_cast<int64_t>(out[i].size())) return false;  // (other requests' pages)
    for (int32_t s : out[i]) without_copy[i] += host_copy_[static_cast<size_t>(s)] < 0;
    host_need += without_copy[i];
    dev_free += static_cast<int64_t>(out[i].size()) - missing;
  }
  if (host_need > host_.n_free()) return false;
  // The pools' free lists, in recall_pages' order: a request's host slots for its copies, its
  // evicted device slots freed, its recalls' device slots taken.
  std::vector<std::vector<PageRef>> host_slots(n_req), fresh(n_req);
  for (size_t i = 0; i < n_req; ++i) {
    if (missing_of[i].empty()) continue;
    DHS_CHECK(host_.allocate(without_copy[i], &host_slots[i]), "tiered KV: the host tier filled during a recall");
    for (int32_t s : out[i]) dev_.free(PageRef{Tier::Device, s});
    DHS_CHECK(dev_.allocate(static_cast<int64_t>(missing_of[i].size()), &fresh[i]), "tiered KV: device slots vanished during a recall");
  }
  // Requests apart on the thread pool: first every request's evictions (its own slots), then
  // every request's recalls (slots taken above: one request's recall may take a slot another's
  // eviction freed, hence the two phases).
  std::vector<std::vector<PageMove>> evict_moves(n_req), recall_moves(n_req);
  std::vector<std::vector<Where>> evicted(n_req);  // the evicted pages' entries (the relocation hook's)
  std::vector<TierStats> part(n_req);
  std::vector<std::string> failed(n_req);
  const auto per_request = [&](const std::function<void(size_t)>& fn) {
    ThreadPool::global().parallel_for(static_cast<int64_t>(n_req), [&](int64_t b, int64_t e, int) {
      for (size_t i = static_cast<size_t>(b); i < static_cast<size_t>(e); ++i) {
        try {
          if (!missing_of[i].empty()) fn(i);
        } catch (const std::exception& ex) {
          failed[i] = ex.what();
        }
      }
    });
    for (const std::string& f : failed)
      if (!f.empty()) throw Error(f);
  };
  per_request([&](size_t i) {
    Owner& o = owner_of(*tables[i]);
    size_t k = 0;
    for (int32_t s : out[i])
      if (host_copy_[static_cast<size_t>(s)] < 0) evict_moves[i].push_back({PageRef{Tier::Device, s}, host_slots[i][k++]});
    std::sort(evict_moves[i].begin(), evict_moves[i].end(), [](const PageMove& a, const PageMove& b) { return a.src.slot < b.src.slot; });
    for (const PageMove& m : evict_moves[i]) host_copy_[static_cast<size_t>(m.src.slot)] = m.dst.slot;
    for (int32_t s : out[i]) {
      const Where w = dev_where_[static_cast<size_t>(s)];
      w.t->relocate(w.layer, w.head, w.idx, PageRef{Tier::Host, host_copy_[static_cast<size_t>(s)]});
      evicted[i].push_back(w);
      --o.resident;
      host_copy_[static_cast<size_t>(s)] = -1;
      lru_.erase(s);
      slot_changed(s);
    }
    part[i].offloaded = static_cast<int64_t>(evict_moves[i].size());
    part[i].dropped = static_cast<int64_t>(out[i].size() - evict_moves[i].size());
  });
  per_request([&](size_t i) {
    PageTable& t = *tables[i];
    Owner& o = owner_of(t);
    const std::vector<PageId>& ids = missing_of[i];
    for (size_t j = 0; j < ids.size(); ++j) {
      const PageId& id = ids[j];
      const PageRef d = fresh[i][j];
      const PageRef src = t.page(id.layer, id.head, id.idx);
      recall_moves[i].push_back({src, d});
      track_device(o, d, {&t, id.layer, id.head, id.idx}, now);
      host_copy_[static_cast<size_t>(d.slot)] = src.slot;
      t.relocate(id.layer, id.head, id.idx, d);
    }
    o.recalled += static_cast<int64_t>(ids.size());
    part[i].recalled = static_cast<int64_t>(ids.size());
  });
  // The copies (every eviction before any recall: a recall may land in a slot an eviction
  // emptied), the hooks, the counts.
  std::vector<PageMove> all_evict, all_recall;
  for (size_t i = 0; i < n_req; ++i) {
    all_evict.insert(all_evict.end(), evict_moves[i].begin(), evict_moves[i].end());
    all_recall.insert(all_recall.end(), recall_moves[i].begin(), recall_moves[i].end());
  }
  TierStats sum;
  sum.offload_runs = move(dev_, host_, all_evict);
  if (on_move_)
    for (const PageMove& m : all_evict) on_move_(m.src, m.dst);
  sum.recall_runs = move(host_, dev_, all_recall);
  if (on_move_)
    for (const PageMove& m : all_recall) on_move_(m.src, m.dst);
  for (size_t i = 0; i < n_req; ++i) {
    if (on_relocate_) {
      for (const Where& w : evicted[i]) relocated(*w.t, w.layer, w.head, w.idx);
      for (const PageId& id : missing_of[i]) relocated(*tables[i], id.layer, id.head, id.idx);
    }
    sum += part[i];
  }
  totals_ += sum;
  st += sum;
  return true;
}

TierStats TieredKv::end_step(int64_t now) {
  lru_.unpin_all();
  TierStats st;
  for (auto& [id, o] : owners_) {
    const int64_t over = movable_resident(o) - o.budget;
    if (over > 0) st += offload(*o.t, over, now);
  }
  return st;
}

bool TieredKv::make_room(int64_t n, int64_t now) {
  free_device_slots(n, now, /*spare_recent=*/false);
  return dev_.n_free() >= n;
}

void TieredKv::free_device_slots(int64_t n, int64_t now, bool spare_recent) {
  const int64_t short_by = n - dev_.n_free();
  if (short_by <= 0) return;
  std::vector<int32_t> v = victims(-1, short_by, now, host_.n_free());
  if (spare_recent) {
    const int64_t recent = now - lru_.params().bucket_steps;
    std::erase_if(v, [&](int32_t slot) { return lru_.last_use(slot) > recent; });
  }
  TierStats st;
  evict(v, st);
  totals_ += st;
}

void TieredKv::check_no_recalls_pending(const PageTable& t, const char* what) const {
  DHS_CHECK(!pending_ || std::find(pending_->tables.begin(), pending_->tables.end(), &t) == pending_->tables.end(),
            "tiered KV: {} of a table whose step's recalls are pending (after_step_recalls first)", what);
}

int64_t TieredKv::reclaimable() const {
  int64_t with_copy = 0, without = 0;
  for (int32_t s = 0; s < lru_.n_slots(); ++s) {
    if (!lru_.resident(s) || lru_.pinned(s)) continue;
    const Where& w = dev_where_[static_cast<size_t>(s)];
    if (!may_move(*w.t, w.idx)) continue;
    (host_copy_[static_cast<size_t>(s)] >= 0 ? with_copy : without) += 1;
  }
  return with_copy + std::min(without, host_.n_free());  // a page without a copy needs a host slot
}

bool TieredKv::swap_out(PageTable& t, int64_t now) {
  check_no_recalls_pending(t, "swap_out");
  Owner& o = owner_of(t);
  const int64_t kept = (t.n_tokens() + t.page_size() - 1) / t.page_size();  // pages past it are only reserved
  std::vector<int32_t> slots;
  int64_t copies = 0;
  for (int l = 0; l < t.n_layers(); ++l)
    for (int h = 0; h < t.n_heads_kv(); ++h)
      for (int64_t i = 0; i < kept; ++i) {
        const PageRef p = t.page(l, h, i);
        if (p.tier != Tier::Device) continue;
        if (!lru_.resident(p.slot) || lru_.pinned(p.slot)) return false;  // (not adopted yet, or being read)
        slots.push_back(p.slot);
        copies += host_copy_[static_cast<size_t>(p.slot)] < 0;
      }
  if (copies > host_.n_free()) return false;  // (nothing changed yet)
  t.truncate(free_page_cb, this, t.n_tokens());  // the reserved pages past its tokens
  o.tracked = std::min(o.tracked, t.n_pages_per_list());
  o.swapped = true;
  TierStats st;
  evict(slots, st);
  totals_ += st;
  (void)now;
  return true;
}

int64_t TieredKv::swap_in_pages(const PageTable& t) const {
  return t.n_tokens() % t.page_size() == 0 ? 0 : static_cast<int64_t>(t.n_layers()) * t.n_heads_kv();
}

bool TieredKv::swap_in(PageTable& t, int64_t now) {
  Owner& o = owner_of(t);
  if (!o.swapped) return true;
  o.swapped = false;
  try {
    prepare_append(t, now);
  } catch (const Error&) {
    o.swapped = true;
    return false;
  }
  return true;
}

void TieredKv::free_page_cb(void* self_v, PageRef p, int, int, int64_t) {
  auto* self = static_cast<TieredKv*>(self_v);
  if (p.tier == Tier::Host) {
    self->host_.free(p);
    return;
  }
  const size_t s = static_cast<size_t>(p.slot);
  if (!self->lru_.resident(p.slot)) {  // reserved and not yet adopted: no bookkeeping of its own
    self->dev_.free(p);
    return;
  }
  --self->owner_at(p.slot).resident;
  if (self->host_copy_[s] >= 0) self->host_.free(PageRef{Tier::Host, self->host_copy_[s]});
  self->host_copy_[s] = -1;
  self->lru_.erase(p.slot);
  self->slot_changed(p.slot);
  self->dev_.free(p);
}

TierStats TieredKv::prepare_append(PageTable& t, int64_t now) {
  const Owner& o = owner_of(t);
  DHS_CHECK(!o.swapped, "tiered KV: appending to a swapped-out request");
  const int64_t first = t.n_tokens() / t.page_size();  // the pages a list appends into
  std::vector<PageId> back;
  for (int l = 0; l < t.n_layers(); ++l)
    for (int h = 0; h < t.n_heads_kv(); ++h)
      for (int64_t i = first; i < t.n_pages_per_list(); ++i)
        if (t.page(l, h, i).tier == Tier::Host) back.push_back({l, h, i});
  TierStats st;
  if (!back.empty()) st = ensure_resident(t, back, now);  // (throws, changing nothing)
  for (int l = 0; l < t.n_layers(); ++l)
    for (int h = 0; h < t.n_heads_kv(); ++h)
      for (int64_t i = first; i < t.n_pages_per_list(); ++i) {  // they change: their host copies go
        const int32_t s = t.page(l, h, i).slot;
        if (host_copy_[static_cast<size_t>(s)] >= 0) host_.free(PageRef{Tier::Host, host_copy_[static_cast<size_t>(s)]});
        host_copy_[static_cast<size_t>(s)] = -1;
        if (!back.empty() && lru_.resident(s)) lru_.set_pinned(s, false);
      }
  return st;
}

TierStats TieredKv::truncate(PageTable& t, int64_t n_tokens, int64_t now) {
  check_no_recalls_pending(t, "truncate");
  Owner& reg = owner_of(t);  // registered
  t.truncate(free_page_cb, this, n_tokens);
  reg.tracked = std::min(reg.tracked, t.n_pages_per_list());
  // The page each list appends into again: back and without a copy now, or, when the tiers have
  // no room for that now, before the next append (prepare_append, which the runner calls).
  TierStats st;
  try {
    st = prepare_append(t, now);
  } catch (const Error&) {
  }
  const Owner& o = owner_of(t);
  const int64_t over = movable_resident(o) - o.budget;  // (the pages it freed may let more leave)
  if (over > 0) st += offload(t, over, now);
  return st;
}

void TieredKv::release(PageTable& t) {
  check_no_recalls_pending(t, "release");
  const Owner& o = owner_of(t);
  t.release(free_page_cb, this);
  by_id_[static_cast<size_t>(o.id)] = nullptr;
  free_ids_.push_back(o.id);
  owners_.erase(t.id());
}

std::string TieredKv::check_invariants() const {
  if (std::string e = dev_.check_invariants(); !e.empty()) return "device pool: " + e;
  if (std::string e = host_.check_invariants(); !e.empty()) return "host pool: " + e;
  std::vector<uint8_t> seen_dev(static_cast<size_t>(dev_.n_pages()), 0), seen_host(static_cast<size_t>(host_.n_pages()), 0);
  int64_t n_dev = 0, n_host = 0;
  const auto at = [](int l, int h, int64_t i) {
    return "page " + std::to_string(i) + " of (" + std::to_string(l) + ", " + std::to_string(h) + ")";
  };
  for (const auto& [id, o] : owners_) {
    const PageTable& t = *o.t;
    int64_t resident = 0, resident_full = 0;
    bool movable_unpinned = false, droppable = false;  // (droppable: with a clean copy, leaves for free)
    for (int l = 0; l < t.n_layers(); ++l)
      for (int h = 0; h < t.n_heads_kv(); ++h)
        for (int64_t i = 0; i < t.n_pages_per_list(); ++i) {
          const PageRef p = t.page(l, h, i);
          if (!p.valid()) return "table " + std::to_string(id) + ": " + at(l, h, i) + " is invalid";
          if (p.tier == Tier::Host) {
            if (!host_.is_used(p) || seen_host[static_cast<size_t>(p.slot)]++)
              return "table " + std::to_string(id) + ": " + at(l, h, i) + " names host slot " + std::to_string(p.slot) +
                     " free or twice";
            ++n_host;
            continue;
          }
          const size_t s = static_cast<size_t>(p.slot);
          if (!dev_.is_used(p) || seen_dev[s]++)
            return "table " + std::to_string(id) + ": " + at(l, h, i) + " names device slot " + std::to_string(p.slot) +
                   " free or twice";
          ++n_dev;
          ++resident;
          const Where& w = dev_where_[s];
          if (!lru_.resident(p.slot) || lru_.owner(p.slot) != o.id || w.t != &t || w.layer != l || w.head != h ||
              w.idx != i)
            return "device slot " + std::to_string(p.slot) + " is not tracked as " + at(l, h, i);
          if (host_copy_[s] >= 0) {
            if (!may_move(t, i)) return at(l, h, i) + " appends and has a host copy";
            if (!host_.is_used(PageRef{Tier::Host, host_copy_[s]}) || seen_host[static_cast<size_t>(host_copy_[s])]++)
              return at(l, h, i) + ": its host copy " + std::to_string(host_copy_[s]) + " is free or named twice";
            ++n_host;
          }
          movable_unpinned = movable_unpinned || (may_move(t, i) && !lru_.pinned(p.slot));
          droppable = droppable || (may_move(t, i) && !lru_.pinned(p.slot) && host_copy_[s] >= 0);
          resident_full += may_move(t, i);
        }
    if (resident != o.resident)
      return "table " + std::to_string(id) + ": " + std::to_string(resident) + " resident pages, counted " +
             std::to_string(o.resident);
    // (past the budget only with nothing that could leave: pinned, appending, or no host room)
    if (resident_full > o.budget && (host_.n_free() > 0 ? movable_unpinned : droppable))
      return "table " + std::to_string(id) + " holds " + std::to_string(resident_full) + " full device pages, budget " +
             std::to_string(o.budget) + ", with unpinned ones it could offload";
  }
  // (reserved for landings, or claimed by the last step's and not adopted yet: used, named by no table)
  const int64_t set_aside = static_cast<int64_t>(landing_.size() + claimed_.size());
  n_dev += set_aside;
  if (n_dev != dev_.n_used()) return std::to_string(dev_.n_used()) + " device slots used, tables name " + std::to_string(n_dev);
  if (n_host != host_.n_used()) return std::to_string(host_.n_used()) + " host slots used, tables and copies name " + std::to_string(n_host);
  int64_t tracked = 0;
  for (int32_t s = 0; s < lru_.n_slots(); ++s) tracked += lru_.resident(s);
  if (tracked + set_aside != n_dev) return "the LRU tracks " + std::to_string(tracked) + " slots, tables name " + std::to_string(n_dev);
  return "";
}

}  // namespace dhs
