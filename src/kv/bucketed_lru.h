// Bucketed LRU over the device tier's page slots (issue 23, DESIGN.md §1.3): the eviction order of
// the KV hierarchy without a global sort. Each resident slot remembers the step it was last used
// in; steps are grouped into buckets of `bucket_steps`, and a bucket older than `n_buckets` buckets
// counts as the oldest one. Eviction takes every candidate of the oldest non-empty buckets and,
// from the bucket where the count is reached, the lowest slots: a histogram over buckets, a cut,
// one pass over the slots. That is what the GPU does inside the step (one thread per slot, no
// sort, no host round trip); this class is its CPU statement and the oracle of its test.
//
// Definition (what the tests check against a brute-force sort): select(owner, n, now) returns the
// first min(n, |C|) slots of C (the resident slots of `owner`, not pinned) ordered by
// (key1, key2, slot), where
//   plain:  key1 = max(last_use / P, now / P - (n_buckets - 1)),  key2 = 0;
//   cyclic: age = min((now - last_use) / P, n_buckets - 1),  key1 = -age,
//           key2 = min(now - age * P - last_use, P - 1),
// with P = bucket_steps. Cyclic is for a clock that runs through a fixed cycle of P ticks per
// step (the layers of a decode step): age counts the cycles since a page was used — the chances
// it has had since to be used again — and buckets are aligned to `now`, so the oldest go first;
// within an age the most recently used go first: in a cycle, their next use is the farthest
// (Belady's order for a cyclic scan; plain LRU there evicts exactly the page needed next). The
// clock (`now`) is the caller's counter.
#pragma once
#include <cstdint>
#include <algorithm>
#include <functional>
#include <span>
#include <string>
#include <utility>
#include <vector>

namespace dhs {

struct LruParams {
  int bucket_steps = 4;  // clock ticks per bucket (cyclic: the ticks of one cycle)
  int n_buckets = 16;    // buckets kept apart; older ones count as the oldest
  bool cyclic = false;   // the order above for a clock with a cycle of bucket_steps ticks
};

class BucketedLru {
 public:
  BucketedLru(int64_t n_slots, LruParams p);
  // A copy keeps its own last uses (a mirrored LRU's copy is not mirrored: its storage stays the
  // caller's).
  BucketedLru(const BucketedLru& o);
  BucketedLru& operator=(const BucketedLru& o);
  BucketedLru(BucketedLru&&) = default;
  BucketedLru& operator=(BucketedLru&&) = default;

  int64_t n_slots() const { return static_cast<int64_t>(use_.size()); }
  const LruParams& params() const { return p_; }

  // Slot s now holds a page of `owner` (a request's id), used at step `now`.
  void insert(int32_t s, int32_t owner, int64_t now);
  // Slot s was read at step `now` (its page was selected).
  void touch(int32_t s, int64_t now);
  // Slot s is free again (evicted, or its request finished).
  void erase(int32_t s);
  // Pinned slots are never selected (the pages the running step reads).
  void set_pinned(int32_t s, bool pinned);
  // A step's reads recorded as stamps ([n_slots]; stamps[s] == stamp: slot s was read): over the
  // slots [b, e), each resident one so stamped and not skipped (skip: null, or [n_slots] with
  // nonzero for a slot to leave out) is touched at `now` and counted in counts[owner + 1]
  // (counts: [max owner + 2]; counts[0] is never added to). Without a branch on the stamp: a
  // step's reads are scattered over the slots, and a branch per slot mispredicts on a large part
  // of them (the host's after-step scan at 128k x 4: docs/hierarchy.md, session 40).
  void touch_stamped(std::span<const int32_t> stamps, int32_t stamp, int64_t now, const uint8_t* skip, int64_t b,
                     int64_t e, int64_t* counts);
  void unpin_all();
  // Slots pinned now.
  int64_t n_pinned() const { return n_pinned_; }

  bool resident(int32_t s) const { return owner_[static_cast<size_t>(s)] >= 0; }
  int32_t owner(int32_t s) const { return owner_[static_cast<size_t>(s)]; }
  int64_t last_use(int32_t s) const { return base_ + use_[static_cast<size_t>(s)]; }
  bool pinned(int32_t s) const { return pinned_[static_cast<size_t>(s)] != 0; }
  int64_t bucket(int32_t s, int64_t now) const;  // (plain: key1)
  // The slot's place in the eviction order at `now` before the slot number: key1 relative to the
  // oldest bucket times bucket_steps, plus key2 (a bin in [0, n_buckets * bucket_steps)).
  int64_t order_bin(int32_t s, int64_t now) const { return order_bin_at(last_use(s), now); }
  // The same for a slot last used at u.
  int64_t order_bin_at(int64_t u, int64_t now) const;

  // Up to n victims of `owner` (-1: of every owner) at step `now`, in (bucket, slot) order.
  // `eligible` (optional) narrows the candidates further (the definition's C: those it accepts).
  std::vector<int32_t> select(int32_t owner, int64_t n, int64_t now,
                              const std::function<bool(int32_t)>& eligible = {}) const;

  // select(owner, n, now) for several owners at once (each owner >= 0, once), in two passes over
  // the slots for all of them: [wants.size()] lists, each what select would return.
  std::vector<std::vector<int32_t>> select_many(std::span<const std::pair<int32_t, int64_t>> wants, int64_t now) const;
  // From this many slots on, select_many's passes (and select's without `eligible`) run on the
  // thread pool (same result).
  static constexpr int64_t kParallelSlots = int64_t{1} << 16;

  // The clock's range: last uses are kept as 32-bit offsets from a base (half the bytes of the
  // per-step passes over millions of slots), so the clock may run at most 2^31 - 1 ticks past it.
  // advance(now) moves the base up to now - 2^29 once now is 2^30 past it, every older last use
  // then counted as the new base: both are then ages past the order's last bin (n_buckets *
  // bucket_steps ticks, at most 65,536) for every query within 2^29 ticks before `now` or after
  // it, so no order changes. insert and touch advance; touch_stamped (parallel over chunks) needs
  // the caller's advance(now) first. rebases(): how many times the base moved (a last use read
  // before one may since read otherwise).
  void advance(int64_t now) {
    if (now - base_ >= kRebaseAt) rebase(now);
  }
  int64_t rebases() const { return rebases_; }
  // The stored form, for a mirror on the device (backend/cuda/lru_select.h): [n_slots] last use −
  // use_base(), as 32-bit offsets.
  std::span<const int32_t> use_offsets() const { return use_; }
  int64_t use_base() const { return base_; }

  // A mirror of the last uses and owners elsewhere: the GPU's, where a decode step writes its tick
  // as the last use of each slot it reads, so that the host takes the last uses back in one copy
  // instead of scanning the step's read stamps (docs/hierarchy.md "The step's reads written into a
  // mirror of the LRU"; kv/lru_mirror.h states the mirror's side). mirror_on: the last uses move
  // into `storage` ([n_slots], the caller's: pinned memory a copy from the device lands in), and
  // from here each slot whose last use or owner changes is logged until the next patch.
  void mirror_on(std::span<int32_t> storage);
  bool mirrored() const { return mirrored_; }
  // What the mirror lacks: the slots changed since the last patch with their last use (offset from
  // use_base) and owner now — every slot after mirror_on, after the base moved, and when the last
  // patch was not followed by take_mirror (it may not have reached the mirror). advance(now) first:
  // `now` is the step's tick (its offset: tick).
  struct Patch {
    std::vector<int32_t> slot, use, owner;
    int32_t tick = 0;  // now - use_base
    bool full = false;
  };
  // Taken in two parts, so that a caller stages the patch where its copy starts (pinned memory):
  // begin_patch returns the entries' count (with *tick and *full), fill_patch writes them ([n]
  // slots, last uses, owners; on the thread pool for large patches) and ends the patch.
  int64_t begin_patch(int64_t now, int32_t* tick, bool* full);
  void fill_patch(int32_t* slot, int32_t* use, int32_t* owner);
  // The step ran on the mirror (the patch applied first), writing the patch's tick as the last use
  // of each slot it read; `from` ([n_slots], not the LRU's storage) holds the mirror's last uses
  // after it, and counts (counts[o + 1], as touch_stamped's) its slots with the tick and an owner o
  // at the patch. They become the LRU's last uses, the changes made since the patch (while the step
  // ran: it read the pages before them) kept: a slot whose page was replaced (inserted or erased)
  // keeps the LRU's last use, and a read of it is taken off its owner at the patch; a slot only
  // touched keeps the later of the two. So the LRU ends as touch_stamped leaves it with the replaced
  // slots skipped (free slots aside: their last use is the mirror's, and read by nothing). Returns
  // the storage given up, for the next copy.
  std::span<int32_t> take_mirror(std::span<int32_t> from, int64_t* counts);
  // Changes the running step saw already, logged while on: the landings it adopted on the device
  // before the host does (TieredKv's adoption in flight; its lists named the landing slots). Unless
  // the slot is replaced after them, a read of such a slot counts for its owner now (not its owner
  // at the patch) and its last use takes the later of the two, as touch_stamped leaves it.
  void set_seen_by_step(bool on) { seen_by_step_ = on; }

  // Consistency: owners >= -1, pins only on resident slots, last use not in the future of `now`.
  // "" when consistent.
  std::string check_invariants(int64_t now) const;

 private:
  // order_bin at `now` by the slot's distance d = now - last_use: a table over d (no division per
  // slot), the last entry standing for every larger d (both orders saturate there). `rel_now`:
  // now - base_, so at(use_[s]) is the slot's bin.
  struct BinTable {
    std::vector<int32_t> bin;
    int64_t rel_now;
    int64_t at(int64_t rel_u) const {
      const int64_t d = rel_now - rel_u;
      return bin[static_cast<size_t>(std::min<int64_t>(d, static_cast<int64_t>(bin.size()) - 1))];
    }
  };
  BinTable bin_table(int64_t now) const;
  // select_many's two passes for wants given per slot: index(s) is the want slot s is a candidate
  // of (-1: none), want_n each want's count; on the thread pool from kParallelSlots slots on.
  template <class WantOf>
  std::vector<std::vector<int32_t>> select_passes(const WantOf& index, std::span<const int64_t> want_n, int64_t now) const;

  // Throws unless last uses up to `now` fit the offsets (advance(now) makes them fit).
  void check_range(int64_t now) const {
    if (now < base_ || now - base_ > INT32_MAX) range_error(now);
  }
  [[noreturn]] void range_error(int64_t now) const;
  void rebase(int64_t now);
  static constexpr int64_t kRebaseAt = int64_t{1} << 30, kKeepBack = int64_t{1} << 29;

  // The mirror's log: slot s changed since the last patch (kChanged), its page replaced (kReplaced),
  // or replaced where the running step saw it already (kSeen: set_seen_by_step); its owner when
  // first logged. A flag and an owner per slot, no shared list: safe from threads that change
  // distinct slots (the hierarchy's batched recalls and adoptions: each request's own slots on the
  // thread pool), without an atomic counter they would contend on (it doubled the adoption's time).
  void log_change(int32_t s, bool replaced) {
    if (!mirrored_) return;
    uint8_t& f = logged_[static_cast<size_t>(s)];
    if (f == 0) owner_at_patch_[static_cast<size_t>(s)] = owner_[static_cast<size_t>(s)];
    f |= !replaced ? kChanged : seen_by_step_ ? kChanged | kSeen : kChanged | kReplaced;
  }
  // The log's slots in slot order, by blocks of kLogBlock on the thread pool: count_logged counts
  // them, each block's first index kept for fill_patch.
  static constexpr int64_t kLogBlock = int64_t{1} << 16;
  int64_t count_logged();
  static constexpr uint8_t kChanged = 1, kReplaced = 2, kSeen = 4;

  LruParams p_;
  std::vector<int32_t> use_own_;  // the last uses' storage, unless mirrored (the caller's then)
  std::span<int32_t> use_;        // [n_slots] last use - base_
  bool mirrored_ = false, patch_out_ = false, full_patch_ = false, seen_by_step_ = false;
  bool patch_begun_ = false;             // begin_patch without its fill_patch yet
  int64_t patch_base_ = 0;               // base_ when the last patch was taken
  int32_t patch_tick_ = 0;
  std::vector<int32_t> owner_at_patch_;  // [n_slots] a logged slot's owner when the patch was taken
  std::vector<uint8_t> logged_;          // [n_slots] kChanged | kReplaced | kSeen since the last patch
  std::vector<int64_t> block_first_;     // [blocks + 1] count_logged's: each block's first entry
  int64_t base_ = 0, rebases_ = 0;
  std::vector<int32_t> owner_;   // -1: free
  std::vector<uint8_t> pinned_;
  int64_t n_pinned_ = 0;
};

}  // namespace dhs
