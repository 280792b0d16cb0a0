// The KV hierarchy's bookkeeping (issue 23, DESIGN.md §1.3): the device tier as a cache over the
// host tier, per-request device budgets, eviction by the bucketed LRU (kv/bucketed_lru.h), page
// moves through the I/O engine (kv/tier_copy.h). This is the host-side statement the backends
// build on: on the CPU both tiers are host pools with storage (so CI runs the whole logic), on
// the GPU the device pool is HBM and the moves run as kernels.
//
// Where a page lives: a request's PageTable names the page's current location — a device slot
// (resident) or a host slot (offloaded). A resident page may also keep a clean host copy, made
// when it was offloaded before and recalled since: evicting it again costs no copy. Only full
// pages move: the page a list is appending into (index >= n_tokens / page_size) stays resident
// and has no host copy, so a page's bytes never change while a copy of them exists elsewhere.
//
// Budgets: each registered request may hold at most `budget` full pages in the device tier
// (set_budget; default unlimited), besides the pages it appends into (one per list, always
// resident). A recall for a request at its budget evicts its own least recently used pages; a
// recall that finds the device pool full evicts any request's. Pages the running step reads are
// pinned first (ensure_resident pins all of a call's pages before it evicts anything), so one
// list's recall never evicts a page the step still needs. The budget is soft for one layer: pages
// a layer reads at once stay resident even past it (the budget cannot be below what attention
// reads), and end_step offloads the excess once they are unpinned.
#pragma once
#include <chrono>
#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "kv/bucketed_lru.h"
#include "kv/page_pool.h"
#include "kv/page_table.h"
#include "kv/tier_copy.h"

namespace dhs {

struct PageId {
  int layer = 0, head = 0;
  int64_t idx = 0;
};

struct TierStats {
  int64_t recalled = 0;      // pages copied host -> device
  int64_t offloaded = 0;     // pages copied device -> host
  int64_t dropped = 0;       // evictions that needed no copy (a clean host copy existed)
  int64_t hits = 0;          // requested pages already resident
  int64_t late = 0;          // pages a step read where they were, in the host tier (note_reads)
  int64_t recall_runs = 0;   // coalesced copies of the recalls
  int64_t offload_runs = 0;  // and of the offloads
  TierStats& operator+=(const TierStats& o);
};

class TieredKv {
 public:
  TieredKv(PagePool& device, PagePool& host, LruParams lru = {});
  TieredKv(const TieredKv&) = delete;
  TieredKv& operator=(const TieredKv&) = delete;

  static constexpr int64_t kUnlimited = INT64_MAX;

  // A request's table: its device pages are tracked from now on (used at step `now`). The table
  // must outlive its registration (release() ends it).
  void add(PageTable& t, int64_t now, int64_t budget = kUnlimited);
  // A new budget; pages over it are offloaded now (least recently used first).
  TierStats set_budget(PageTable& t, int64_t budget, int64_t now);
  // set_budget on each table in turn, as one selection of every request's victims and one
  // eviction (enforce_budgets; one at a time where the host tier's room could bind): the same
  // pages, slots and tables. The cache manager's budgets for a step's batch.
  TierStats set_budgets(std::span<PageTable* const> tables, std::span<const int64_t> budgets, int64_t now);
  int64_t budget(const PageTable& t) const;
  int64_t resident_pages(const PageTable& t) const;
  // t's device pages that may move (resident minus the pages its lists append into).
  int64_t movable_resident_pages(const PageTable& t) const { return movable_resident(owner_of(t)); }
  // Pages t's ensure_resident calls found resident (hits) and recalled, since add(); with the
  // recall-ahead schedule, note_reads' hits and late reads and recall_ahead's recalls.
  TierStats request_stats(const PageTable& t) const;

  // After t.reserve(device pool, ...): its new device pages are tracked; then, if t is over its
  // budget, its least recently used full pages are offloaded down to it (as far as the host tier
  // has room). track_new_pages is the first half alone.
  void track_new_pages(PageTable& t, int64_t now);
  TierStats adopt_new_pages(PageTable& t, int64_t now);

  // Every listed page of t resident on the device and touched at `now`: pinned, then the missing
  // ones recalled (evicting by the budgets above). Throws dhs::Error, changing nothing, when the
  // pages cannot all be resident at once (more than the device pool holds beside other pinned
  // pages, or than the host tier can take in evictions).
  TierStats ensure_resident(PageTable& t, std::span<const PageId> pages, int64_t now);

  // The recall-ahead schedule (the GPU's, docs/hierarchy.md "Recall ahead"): a step reads each
  // page where it lives, with no move inside the step. note_reads records a layer's reads at
  // `now`: a device page is a hit (touched in the LRU), a host page a late read (read in place,
  // from the host tier; counted in `late`). Changes no page's tier.
  TierStats note_reads(PageTable& t, std::span<const PageId> pages, int64_t now);
  // The same for hits known by device slot (the GPU records which slots a step read): each slot
  // holding a page is touched at `now` and counted as a hit of the request that holds it; free
  // slots are skipped.
  TierStats touch_slots(std::span<const int32_t> slots, int64_t now);
  // The page a used device slot holds: its table and (layer, head, index); false for a free slot.
  bool page_at(int32_t slot, const PageTable** t, PageId* id) const;
  // After the step: the pages it read that live in the host tier recalled, in the given order
  // (the prediction of the next step's reads is this step's reads), as many as t's budget takes
  // beside the listed pages already resident; t's other pages are evicted for them (its least
  // recently used first, then any request's when the device pool is full). Best effort: when
  // the room is not there it recalls nothing and returns (the next step reads those pages in
  // place). Pins nothing past the call.
  TierStats recall_ahead(PageTable& t, std::span<const PageId> pages, int64_t now);

  // A decode step on the recall-ahead schedule as the GPU records it: a stamp per device slot
  // (stamps[s] == stamp: the step read slot s; [n_slots]) and its late reads by (sequence, page),
  // in the order read. One pass over the stamps touches the hits and counts them per request (no
  // per-hit work beyond that: a step at 128k x 4 reads millions of pages); the late reads are
  // noted, and each sequence's late pages recalled for the next step in the order read, as far as
  // its budget has room beside the pages it read that are resident (recall_ahead's rule). Those are
  // not pinned: they were touched now, so the LRU's order takes every older page first, and the
  // request's own evictions never reach them. tables[i]: sequence i's table.
  struct LateRead {
    int seq;
    PageId page;
  };
  // A landing as the step logged it: sequence, page, the slot it landed in, its host slot; and
  // whether it took the page (kv/tier_land.h LandEntry::adopted: of a page landed twice, the one
  // whose slot the device's table now names; always true where the step wrote no table).
  struct Landed {
    int seq;
    PageId page;
    int32_t dev_slot;
    int32_t host_slot;
    bool adopted = true;
  };
  // landed: the step's landings (reserve_landing), adopted after the hits are counted — each page
  // whose landing took it (Landed::adopted) and that still lives in the host slot it landed from
  // becomes resident in its landing slot, its host slot kept as its clean copy, touched now and
  // counted as a late read and a recall of its request; a page that landed twice keeps the landing
  // that took it (the first, where the step wrote no table) — then every reserved slot left is
  // freed, and requests past their budgets offload down to them.
  TierStats after_decode_step(std::span<const int32_t> stamps, int32_t stamp, std::span<const LateRead> late,
                              std::span<PageTable* const> tables, int64_t now, std::span<const Landed> landed = {});

  // after_decode_step in two halves, so that a runner can run the second while the next step's
  // GPU work runs (docs/hierarchy.md "After-step overlap"): after_step_reads, once the step is
  // done — the hits touched and counted, the landings' slots claimed (each slot a landing used
  // stays set aside, the rest of the stack is freed) and what the recalls need of the step's
  // record kept; after_step_recalls — the landings adopted, the late reads noted, budgets
  // enforced, the late pages recalled ahead — at any time before the next after_step_reads, the
  // tables of the step alive. Until then the host's tables still name a landed page's host slot:
  // the step adopted it on the device (kv/tier_land.h LandAdopt), whose table the next step's
  // lists come from, so the next step may run before the host catches up (docs/hierarchy.md
  // "Landed pages adopted in the step"); a reservation for the next step (reserve_landing) in
  // between leaves the claimed slots alone.
  // Back to back they are after_decode_step. in_flight: the next step is running; its lists were
  // taken before these moves, so each device slot whose page changes here is left out of the next
  // after_step_reads' hits (that step read the page the slot held before, or nothing).
  TierStats after_step_reads(std::span<const int32_t> stamps, int32_t stamp, std::span<PageTable* const> tables, int64_t now,
                             std::span<const Landed> landed = {});
  TierStats after_step_recalls(std::span<const LateRead> late, int64_t now, bool in_flight = false);
  bool recalls_pending() const { return pending_.has_value(); }

  // The LRU mirrored on the device (BucketedLru::mirror_on; kv/lru_mirror.h the mirror's side): a
  // decode step writes its tick as the last use of each HBM slot it reads, counts its reads per
  // owner, and copies the last uses back — no stamps to scan on the host. mirror_lru: from here;
  // storage [device slots] (the caller's pinned memory). take_lru_patch: before each step that
  // reads (now: the step's tick, its last layer's — after_step_reads' `now`); n_owners sizes the
  // step's counts. after_step_reads with the mirror: `mirror` ([device slots]) the mirror's last
  // uses after the step, counts [n_owners + 1] its reads per owner (counts[o + 1]); as the stamps'
  // form otherwise (the same hits, last uses and records: test_tiered_kv's twin); *spare: the
  // storage the LRU gave up, where the next step's copy lands.
  void mirror_lru(std::span<int32_t> storage) { lru_.mirror_on(storage); }
  bool lru_mirrored() const { return lru_.mirrored(); }
  struct LruPatch {
    BucketedLru::Patch patch;
    int32_t n_owners = 0;
  };
  LruPatch take_lru_patch(int64_t now);
  // The same staged by the caller (BucketedLru::begin_patch / fill_patch): the entries' count, then
  // they are written into [n] slots, last uses and owners.
  struct LruPatchSize {
    int64_t n = 0;
    int32_t tick = 0, n_owners = 0;
    bool full = false;
  };
  LruPatchSize begin_lru_patch(int64_t now);
  void fill_lru_patch(int32_t* slot, int32_t* use, int32_t* owner) { lru_.fill_patch(slot, use, owner); }
  TierStats after_step_reads(std::span<int32_t> mirror, std::span<const int64_t> counts, std::span<PageTable* const> tables,
                             int64_t now, std::span<const Landed> landed, std::span<int32_t>* spare);

  // Landing (kv/tier_land.h): the step copies its late pages into device slots set aside before
  // it, so a missing page crosses PCIe once instead of being read in place and recalled after.
  // reserve_landing sets aside up to n device slots (freeing least recently used pages first, as
  // make_room does, when fewer are free — but no page read within a cycle of the clock, bucket_steps
  // ticks before `now`: fewer slots then): used in the device pool, named by no table, until the
  // step's after_decode_step adopts the landings and frees the rest. Returns them, in the order
  // the step takes them.
  std::vector<int32_t> reserve_landing(int64_t n, int64_t now);
  int64_t landing_reserved() const { return static_cast<int64_t>(landing_.size()); }
  // Slots the last step's landings used, awaiting adoption (after_step_reads -> after_step_recalls).
  int64_t landing_claimed() const { return static_cast<int64_t>(claimed_.size()); }
  // The adoption alone, for a schedule that noted the step's reads itself (the CPU backend's:
  // note_reads counted the landed pages as late reads already, so they are counted as recalls
  // only): as after_decode_step's, then every reserved slot left is freed and budgets enforced.
  TierStats adopt_landings(std::span<const Landed> landed, std::span<PageTable* const> tables, int64_t now) {
    TierStats st;
    const std::vector<std::vector<int32_t>> of_seq = claim_landed(landed, tables);
    adopt_claimed(landed, of_seq, tables, now, st, /*reads_noted=*/true);
    enforce_budgets(tables, now, st);
    return st;
  }

  // Offloads up to n of t's least recently used full, unpinned device pages (fewer when the host
  // tier has no room for their copies); returns the stats.
  TierStats offload(PageTable& t, int64_t n, int64_t now);

  // Evicts these device slots now, each a full, unpinned page (others are skipped): the pages a
  // step's churn displaces, as the hierarchy bench replays it (bench/hierarchy_bench.cpp). Host
  // copies are made for pages without one, as far as the host tier has room.
  TierStats evict_slots(std::span<const int32_t> slots);

  // Unpins every page (the layer or step is over) and offloads what requests hold past their
  // budgets.
  TierStats end_step(int64_t now);

  // Room for n more device pages: any request's least recently used full, unpinned pages
  // offloaded until n slots are free. False (having offloaded what it could) when they do not
  // add up to n.
  bool make_room(int64_t n, int64_t now);
  // Device pages make_room could free now.
  int64_t reclaimable() const;

  // Preemption by swap (the scheduler's, instead of recompute): t's pages past its tokens freed,
  // every other page of t in the host tier — its appending pages too, since t does not run until
  // swap_in. False, changing nothing, when the host tier cannot take them.
  bool swap_out(PageTable& t, int64_t now);
  bool swapped(const PageTable& t) const { return owner_of(t).swapped; }
  // Device pages swap_in takes (the pages t's lists append into).
  int64_t swap_in_pages(const PageTable& t) const;
  // t's appending pages back in the device tier (the rest come back as steps read them). False,
  // changing nothing, when the device tier has no room.
  bool swap_in(PageTable& t, int64_t now);

  // Before a step appends to t: the pages its lists append into resident and without host copies
  // (after a rollback into an offloaded page). Throws dhs::Error, changing nothing, when the
  // tiers have no room for them.
  TierStats prepare_append(PageTable& t, int64_t now);

  // t.truncate / t.release with both tiers: frees each dropped page where it lives and its clean
  // copy. truncate also brings back the page each list then appends into and drops its copy (or
  // leaves that to prepare_append when the tiers have no room now).
  TierStats truncate(PageTable& t, int64_t n_tokens, int64_t now);
  void release(PageTable& t);

  // Every check of the hierarchy against the registered tables: each pool's invariants; every
  // table page used in its tier and named once (tables and clean copies together); the device
  // slots the LRU tracks are exactly the tables' device pages, with their owners; budgets kept;
  // no host copy of an appending page. "" when consistent.
  std::string check_invariants() const;

  // What copies the pages' bytes between the tiers (the I/O engine): copy_pages (kv/tier_copy.h)
  // by default, for pools with storage; a backend whose pools keep their bytes elsewhere (the
  // CUDA backend: HBM and pinned DRAM, storage-less PagePools for the accounting) gives its own.
  // Called with every move of one eviction or recall at once (one direction); returns the number
  // of copies issued (coalesced runs).
  using PageMover = std::function<int64_t(const PagePool& src, PagePool& dst, std::span<const PageMove> moves)>;
  void set_mover(PageMover mover) { mover_ = std::move(mover); }

  // Called for every page copied between the tiers, after its bytes (from, to): what follows a
  // page besides its K and V (its summary, kept per slot) moves there.
  void set_move_hook(std::function<void(PageRef from, PageRef to)> hook) { on_move_ = std::move(hook); }
  // Called for every page whose tier changed, after its table says where it is now: a backend
  // that mirrors the tables (the CUDA backend's device page table) rewrites that entry.
  void set_relocate_hook(std::function<void(const PageTable& t, int layer, int head, int64_t idx)> hook) {
    on_relocate_ = std::move(hook);
  }
  // Whether t is registered (add) and not released.
  bool has(const PageTable& t) const { return owners_.count(t.id()) != 0; }

  const TierStats& totals() const { return totals_; }
  // after_decode_step's recalls all at once (recall_batch) where they allow it (default), or one
  // request at a time always (the tests compare both); and how many steps ran batched.
  void set_batch_recalls(bool on) { batch_recalls_ = on; }
  // Evictions of at least this many slots release them on the thread pool (default
  // kParallelEvict; the tests compare both forms).
  void set_parallel_evict_from(int64_t n) { parallel_evict_from_ = n; }
  // The shared prefix of victims for recalls made one request at a time (AnyVictims; default on,
  // the tests compare both), and how many selections it answered.
  void set_shared_victims(bool on) { shared_victims_ = on; }
  int64_t shared_victim_picks() const { return shared_victim_picks_; }
  int64_t batched_steps() const { return batched_steps_; }
  // Where the last after_step_reads / after_step_recalls calls' host time went (ms): the stamps'
  // scan; the landings' adoption, budgets enforced, the recalls' plan, their victims, the recalls.
  // io_ms: time inside the mover (the backend's copies: staging and launches), hooks_ms: inside the
  // relocate hook (timed only with set_time_hooks: a clock read per page) — both since the last
  // after_step_recalls began, so they include what runs after it before the next (the budgets'
  // evictions). claim_ms: after_step_reads' claim of the step's landings (after the scan).
  struct AfterStepTimes {
    double scan_ms = 0, adopt_ms = 0, budgets_ms = 0, plan_ms = 0, victims_ms = 0, recall_ms = 0;
    double io_ms = 0, hooks_ms = 0;
    double claim_ms = 0;
  };
  void set_time_hooks(bool on) { time_hooks_ = on; }
  const AfterStepTimes& after_step_times() const { return times_; }
  const PagePool& host_pool() const { return host_; }
  const BucketedLru& lru() const { return lru_; }

 private:
  struct Where {
    PageTable* t = nullptr;
    int layer = 0, head = 0;
    int64_t idx = 0;
  };
  struct Owner {
    int32_t id = 0;
    PageTable* t = nullptr;
    int64_t budget = 0;
    int64_t resident = 0;
    bool swapped = false;  // swap_out: every page may move, none is appended to
    int64_t hits = 0, recalled = 0;  // its ensure_resident / note_reads / recall_ahead calls
    int64_t late = 0;                // its note_reads of host pages
    // Pages per list that track_new_pages has seen: pages come from t.reserve at the lists' ends,
    // and truncations go through truncate / swap_out, which lower the mark.
    int64_t tracked = 0;
    // recall_ahead's once-each check: a stamp per page of the table ((layer, head) major), the
    // call's own stamp `epoch` (no clearing between calls).
    std::vector<uint32_t> seen;
    uint32_t epoch = 0;
  };
  Owner& owner_of(const PageTable& t);
  // Throws dhs::Error naming the page when id is outside t.
  static void check_in_table(const PageTable& t, const PageId& id);
  const Owner& owner_of(const PageTable& t) const;
  // Full pages (they may move): index below n_tokens / page_size.
  static bool movable(const PageTable& t, int64_t idx) { return idx < t.n_tokens() / t.page_size(); }
  // The same, for a page of a registered table (a swapped request's pages all move).
  bool may_move(const PageTable& t, int64_t idx) const { return owner_of(t).swapped || movable(t, idx); }
  // Device pages of t that may move (resident minus the pages its lists append into).
  int64_t movable_resident(const Owner& o) const {
    if (o.swapped) return o.resident;
    const PageTable& t = *o.t;
    return o.resident - static_cast<int64_t>(t.n_layers()) * t.n_heads_kv() *
                            (t.n_pages_per_list() - t.n_tokens() / t.page_size());
  }
  void track_device(Owner& o, PageRef p, const Where& w, int64_t now);
  // Sorts pages in (layer, head, index) order, the order recalls take (consecutive host slots
  // coalesce): by a packed 64-bit key (a step's late pages sort in its host time), unless sorted.
  static void sort_list_order(std::vector<PageId>& pages);
  // The first n slots of `order` (an LRU order) whose pages may move.
  std::vector<int32_t> movable_prefix(std::span<const int32_t> order, int64_t n) const;
  // recall_ahead's once-each check over t's pages: begin_dedupe starts a call, first_time(id)
  // is true the first time the call sees id (and checks it is in t).
  void begin_dedupe(Owner& o, const PageTable& t);
  bool first_time(Owner& o, const PageTable& t, const PageId& id);
  // A step's recalls made one request at a time (after_step_recalls when they cannot run batched:
  // some request needs other requests' pages) each select victims of any owner over the whole LRU
  // (under the serving load 16 passes over 180k slots a step: 20-35 ms). Instead they share one
  // prefix of that order, taken once, and the slots the recalls insert since (used at `now`, so in
  // one known bin): the fresh order of the slots up to the prefix's last is the prefix's entries
  // still unchanged (resident, unpinned, the same last use, not reinserted) merged with the
  // inserted ones, by (bin, slot). any_victims takes from that merge what a fresh selection would;
  // past the prefix's last entry (the order beyond it is not known) a fresh selection instead.
  // Taken only when no slot is pinned (a slot pinned then could be unpinned later, in a fresh order).
  struct AnyVictims {
    std::vector<int32_t> slots;     // the order's first entries
    std::vector<int64_t> last_use;  // [slots] each one's last use when taken
    std::vector<int64_t> bin;       // [slots] its order bin then
    bool cut = false;               // there were more candidates than `slots` holds
    int64_t n_slots = 0;            // the device pool's
    int64_t rebases = 0;            // the LRU's base moves when taken (BucketedLru::rebases)
    // Slots the recalls inserted since (recall_pages), ascending, and a mark per device slot.
    mutable std::vector<int32_t> added;
    mutable std::vector<uint8_t> is_added;
    void add(std::vector<int32_t> slots) const;
    // Entries before it are gone for good (evicted or used again; a reinserted slot is in added).
    mutable size_t first = 0;
  };
  AnyVictims take_any_victims(int64_t n, int64_t now) const;
  // victims(-1, n, now, host_room) from the merge; false when it would pass the prefix's end.
  bool any_victims(const AnyVictims& any, int64_t n, int64_t now, int64_t host_room, std::vector<int32_t>* out) const;
  // recall_ahead's rule: `missing` (host pages of t, once each, in the order read) recalled as far
  // as t's budget has room beside keep_movable resident pages it read, evicting by the budgets;
  // best effort (no room: nothing). Every slot in `pinned` is unpinned on return.
  TierStats recall_ahead_of(Owner& o, PageTable& t, std::vector<PageId> missing, int64_t keep_movable, int64_t now,
                            std::vector<int32_t>& pinned, const std::vector<int32_t>* own_victims = nullptr,
                            const AnyVictims* any = nullptr);
  // recall_ahead_of's first half: `missing` cut to the room and sorted; its own evictions' count.
  int64_t ahead_plan(const Owner& o, std::vector<PageId>& missing, int64_t keep_movable) const;
  // The recall half of ensure_resident: `missing` (host pages of t, once each, in (layer, head,
  // index) order) brought in, evicting by the budgets; the recalled slots are pinned and added to
  // `pinned`. Throws dhs::Error, unpinning `pinned` and changing nothing else, when the room is not
  // there. Fills st (recalls, evictions).
  // own_victims (optional): the request's own victims chosen beforehand (in the LRU's order, at
  // least as many as it needs: after_decode_step picks every request's in one pass).
  void recall_pages(Owner& o, PageTable& t, const std::vector<PageId>& missing, int64_t now, std::vector<int32_t>& pinned,
                    TierStats& st, const std::vector<int32_t>* own_victims = nullptr, const AnyVictims* any = nullptr);
  // The victims of several requests at once, as victims(o, n, now, host room) would pick each
  // (their own pages only; nullopt when the host tier's room could bind: then one at a time).
  std::optional<std::vector<std::vector<int32_t>>> victims_many(std::span<const std::pair<int32_t, int64_t>> wants,
                                                                int64_t now) const;
  // after_decode_step's recalls for every request at once, equal to recall_ahead_of on each in
  // turn (the same slots taken and freed in the same order, the same tables, LRU and pools after):
  // the pools' free lists in that order first, then every request's evictions and then every
  // request's recalls applied to its own table, slots and owner on the thread pool (requests
  // touch disjoint slots within each phase), then the copies, evictions before recalls, and the
  // hooks. missing_of: each request's plan (ahead_plan's), victims_of: its own victims
  // (victims_many's). False, changing nothing, where recall_ahead_of would need anything else
  // (victims beyond its own, other requests' pages, a full host tier): then one at a time.
  bool recall_batch(std::span<PageTable* const> tables, const std::vector<std::vector<PageId>>& missing_of,
                    const std::vector<std::vector<int32_t>>& victims_of, int64_t now, TierStats& st);
  // note_reads without the totals (after_decode_step sums them).
  TierStats note_reads_of(Owner& o, PageTable& t, std::span<const PageId> pages, int64_t now);
  // make_room's eviction: least recently used pages offloaded until n device slots are free (fewer
  // when they do not add up). spare_recent: never a page read within the last clock cycle
  // (bucket_steps ticks; reserve_landing's rule).
  void free_device_slots(int64_t n, int64_t now, bool spare_recent);
  // Throws when t's step has recalls pending (`what` names the call refused).
  void check_no_recalls_pending(const PageTable& t, const char* what) const;
  // Evicts the given device slots (copying those without a clean host copy); fills st. From
  // kParallelEvict slots on, the slots' own entries are released on the thread pool.
  void evict(std::span<const int32_t> slots, TierStats& st);
  static constexpr int64_t kParallelEvict = 8192;
  // Up to n LRU victims: of `owner` (>= 0) or of anyone (-1), full pages only, and at most
  // host_room of them without a clean host copy (each takes a host slot).
  std::vector<int32_t> victims(int32_t owner, int64_t n, int64_t now, int64_t host_room) const;
  // victims' rule for a candidate in the order (shared with any_victims): its page may move, and a
  // page without a clean host copy takes one of host_room's slots (counted down when it does).
  bool victim_fits(int32_t s, int64_t& host_room) const;
  static void free_page_cb(void* self, PageRef p, int layer, int head, int64_t idx);

  PagePool& dev_;
  PagePool& host_;
  BucketedLru lru_;
  std::vector<Where> dev_where_;          // [device slots] the page a used slot holds
  std::vector<int32_t> host_copy_;        // [device slots] its clean host copy's slot, or -1
  std::unordered_map<uint64_t, Owner> owners_;  // by PageTable::id()
  std::vector<Owner*> by_id_;                    // [next_owner_] by Owner::id (null: released)
  std::vector<int32_t> landing_;                 // device slots reserved for the next step's landings
  std::vector<int32_t> claimed_;                 // the last step's landing slots, until adopted
  std::vector<uint8_t> is_landing_;              // [device slots] 1 while reserved, 2 while claimed
  // The adoption of a step's landings in two parts. claim_landed: the log checked (every landing
  // in a slot reserved for the step, once; its sequence and page in range), the used slots claimed
  // (claimed_), the rest of the reservation freed; returns each sequence's landings (indices into
  // landed, in log order). adopt_claimed: each sequence's taken landings adopted apart on the
  // thread pool, the hooks, the claimed slots no page took freed; fills st.
  std::vector<std::vector<int32_t>> claim_landed(std::span<const Landed> landed, std::span<PageTable* const> tables);
  void adopt_claimed(std::span<const Landed> landed, const std::vector<std::vector<int32_t>>& of_seq,
                     std::span<PageTable* const> tables, int64_t now, TierStats& st, bool reads_noted);
  // Requests past their budgets offload down to them (the landed pages were touched now, so older
  // pages go first).
  void enforce_budgets(std::span<PageTable* const> tables, int64_t now, TierStats& st);
  // What after_step_reads keeps for after_step_recalls.
  struct PendingRecalls {
    std::vector<PageTable*> tables;
    std::vector<int64_t> keep;  // [tables] resident pages each read that may move
    // The step's landings, claimed (claim_landed), adopted first by after_step_recalls.
    std::vector<Landed> landed;
    std::vector<std::vector<int32_t>> landed_of;
    bool budgets_due = false;  // landings to adopt: budgets are enforced after them
  };
  std::optional<PendingRecalls> pending_;
  // after_step_reads' part after the hits are counted (by_owner[o]: owner o's hits; tail_reads: of
  // the pages each table appends into, those the step read): the hits recorded, what the recalls
  // keep, the landings claimed; t: when the step's reads began to be counted.
  TierStats after_reads(std::vector<int64_t> by_owner, std::span<const int64_t> tail_reads,
                        std::span<PageTable* const> tables, std::span<const Landed> landed,
                        std::chrono::steady_clock::time_point t);
  // [tables] how many of each table's device pages it appends into the step read (read(slot)).
  static std::vector<int64_t> tail_reads(std::span<PageTable* const> tables, const std::function<bool(int32_t)>& read);
  int64_t patch_now_ = -1;  // the last LRU patch's step (take_lru_patch), until its mirror comes back
  int32_t patch_tick_ = 0;  // and its tick (the mirror's offset of it)
  // A device slot whose page changed (inserted or erased): marked while after_step_recalls runs
  // in flight, so the next after_step_reads skips it.
  void slot_changed(int32_t s) {
    if (in_flight_) changed_in_flight_[static_cast<size_t>(s)] = 1;
  }
  bool in_flight_ = false, changed_any_ = false;
  AfterStepTimes times_;
  std::vector<uint8_t> changed_in_flight_;  // [device slots], allocated on first use
  int32_t next_owner_ = 0;
  std::vector<int32_t> free_ids_;  // owner ids released, taken again first
  bool batch_recalls_ = true;
  int64_t parallel_evict_from_ = kParallelEvict;
  bool shared_victims_ = true;
  bool time_hooks_ = false;
  // The mover and the relocate hook, timed into times_.io_ms / hooks_ms.
  int64_t move(const PagePool& src, PagePool& dst, std::span<const PageMove> moves);
  void relocated(const PageTable& t, int layer, int head, int64_t idx);
  mutable int64_t shared_victim_picks_ = 0;
  int64_t batched_steps_ = 0;
  // The owner of the page in a resident device slot (its LRU owner), without a table lookup.
  Owner& owner_at(int32_t slot) { return *by_id_[static_cast<size_t>(lru_.owner(slot))]; }
  const Owner& owner_at(int32_t slot) const { return *by_id_[static_cast<size_t>(lru_.owner(slot))]; }
  TierStats totals_;
  std::function<void(PageRef, PageRef)> on_move_;
  PageMover mover_ = copy_pages;
  std::function<void(const PageTable&, int, int, int64_t)> on_relocate_;
};

}  // namespace dhs
