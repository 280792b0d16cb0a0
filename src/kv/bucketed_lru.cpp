#include "kv/bucketed_lru.h"

#include <algorithm>
#include <cstring>
#include <type_traits>

#include "core/error.h"
#include "core/thread_pool.h"

namespace dhs {

BucketedLru::BucketedLru(int64_t n_slots, LruParams p)
    : p_(p),
      use_own_(static_cast<size_t>(n_slots), 0),
      use_(use_own_),
      owner_(static_cast<size_t>(n_slots), -1),
      pinned_(static_cast<size_t>(n_slots), 0) {
  DHS_CHECK(n_slots >= 0 && n_slots < (int64_t{1} << 31), "LRU of {} slots", n_slots);
  DHS_CHECK(p.bucket_steps >= 1 && p.n_buckets >= 1 && int64_t{p.n_buckets} * p.bucket_steps <= (1 << 16),
            "LRU buckets: {} ticks each, {} buckets (need >= 1 each, at most 65,536 bins)", p.bucket_steps, p.n_buckets);
}

BucketedLru::BucketedLru(const BucketedLru& o) : p_(o.p_) { *this = o; }

BucketedLru& BucketedLru::operator=(const BucketedLru& o) {
  if (this == &o) return *this;
  p_ = o.p_;
  use_own_.assign(o.use_.begin(), o.use_.end());
  use_ = use_own_;
  base_ = o.base_, rebases_ = o.rebases_;
  owner_ = o.owner_;
  pinned_ = o.pinned_;
  n_pinned_ = o.n_pinned_;
  mirrored_ = patch_out_ = full_patch_ = patch_begun_ = seen_by_step_ = false;
  owner_at_patch_.clear();
  logged_.clear();
  block_first_.clear();
  return *this;
}

void BucketedLru::insert(int32_t s, int32_t owner, int64_t now) {
  DHS_CHECK(now >= 0, "LRU insert at step {}", now);
  DHS_CHECK(s >= 0 && s < n_slots() && owner >= 0, "LRU insert of slot {} owner {}", s, owner);
  DHS_CHECK(owner_[static_cast<size_t>(s)] < 0, "LRU insert: slot {} already holds a page of {}", s,
            owner_[static_cast<size_t>(s)]);
  advance(now);
  check_range(now);
  log_change(s, true);
  owner_[static_cast<size_t>(s)] = owner;
  use_[static_cast<size_t>(s)] = static_cast<int32_t>(now - base_);
  pinned_[static_cast<size_t>(s)] = 0;
}

void BucketedLru::touch(int32_t s, int64_t now) {
  DHS_CHECK(s >= 0 && s < n_slots() && resident(s), "LRU touch of slot {} that holds no page", s);
  advance(now);
  check_range(now);
  int32_t& u = use_[static_cast<size_t>(s)];
  if (u >= now - base_) return;
  log_change(s, false);
  u = static_cast<int32_t>(now - base_);
}

void BucketedLru::erase(int32_t s) {
  DHS_CHECK(s >= 0 && s < n_slots() && resident(s), "LRU erase of slot {} that holds no page", s);
  log_change(s, true);
  owner_[static_cast<size_t>(s)] = -1;
  n_pinned_ -= pinned_[static_cast<size_t>(s)];
  pinned_[static_cast<size_t>(s)] = 0;
}

void BucketedLru::set_pinned(int32_t s, bool pinned) {
  DHS_CHECK(s >= 0 && s < n_slots() && resident(s), "LRU pin of slot {} that holds no page", s);
  n_pinned_ += (pinned ? 1 : 0) - pinned_[static_cast<size_t>(s)];
  pinned_[static_cast<size_t>(s)] = pinned ? 1 : 0;
}

void BucketedLru::touch_stamped(std::span<const int32_t> stamps, int32_t stamp, int64_t now, const uint8_t* skip,
                                int64_t b, int64_t e, int64_t* counts) {
  DHS_CHECK(static_cast<int64_t>(stamps.size()) == n_slots() && 0 <= b && b <= e && e <= n_slots(),
            "LRU touch_stamped: slots [{}, {}) of {} stamps, {} slots", b, e, stamps.size(), n_slots());
  check_range(now);
  DHS_CHECK(!mirrored_, "LRU touch_stamped on a mirrored LRU (its reads come back with the mirror: take_mirror)");
  const int32_t* st = stamps.data();
  const int32_t* own = owner_.data();
  int32_t* use = use_.data();
  const int32_t rel_now = static_cast<int32_t>(now - base_);
  // Every slot's last use is rewritten (the same value where it was not read): at a step's read
  // fraction nearly every cache line of use_ holds a read slot, so the stores cost no more
  // traffic than the conditional ones, and the loop has no data-dependent branch.
  const auto run = [&](auto with_skip) {
    for (int64_t s = b; s < e; ++s) {
      const int32_t o = own[s];
      bool hit = (st[s] == stamp) & (o >= 0);
      if constexpr (decltype(with_skip)::value) hit &= skip[s] == 0;
      const int32_t u = use[s];
      use[s] = hit && u < rel_now ? rel_now : u;
      counts[o + 1] += hit;
    }
  };
  if (skip) run(std::true_type{});
  else run(std::false_type{});
}

void BucketedLru::unpin_all() {
  std::fill(pinned_.begin(), pinned_.end(), 0);
  n_pinned_ = 0;
}

int64_t BucketedLru::bucket(int32_t s, int64_t now) const {
  const int64_t oldest = now / p_.bucket_steps - (p_.n_buckets - 1);
  return std::max(last_use(s) / p_.bucket_steps, oldest);
}

void BucketedLru::rebase(int64_t now) {
  const int64_t base = now - kKeepBack, shift = base - base_;
  for (int32_t& u : use_) u = static_cast<int32_t>(std::max<int64_t>(int64_t{u} - shift, 0));
  base_ = base;
  ++rebases_;
  full_patch_ = true;  // (the mirror's offsets are from the old base)
}

void BucketedLru::mirror_on(std::span<int32_t> storage) {
  DHS_CHECK(!mirrored_, "LRU mirrored twice");
  DHS_CHECK(static_cast<int64_t>(storage.size()) == n_slots(), "LRU mirror storage of {} slots for {}", storage.size(),
            n_slots());
  std::copy(use_.begin(), use_.end(), storage.begin());
  use_ = storage;
  use_own_ = {};
  mirrored_ = full_patch_ = true;
  logged_.assign(static_cast<size_t>(n_slots()), 0);
  owner_at_patch_.assign(static_cast<size_t>(n_slots()), -1);
}

namespace {
// fn(b, e, thread) over the blocks [0, n_blocks): on the thread pool from two blocks on.
void for_blocks(int64_t n_blocks, const std::function<void(int64_t, int64_t, int)>& fn) {
  if (n_blocks >= 2) ThreadPool::global().parallel_for(n_blocks, fn, 1);
  else fn(0, n_blocks, 0);
}
// fn(s) for each slot of [b, e) whose flag is set, in order: 8 flags read at a time (a step
// changes a few percent of the slots, so most words are 0).
template <class Fn>
void for_flagged(const uint8_t* flags, int64_t b, int64_t e, Fn&& fn) {
  int64_t s = b;
  for (; s + 8 <= e; s += 8) {
    uint64_t w;
    std::memcpy(&w, flags + s, 8);
    if (w == 0) continue;
    for (int k = 0; k < 8; ++k)
      if (flags[s + k] != 0) fn(s + k);
  }
  for (; s < e; ++s)
    if (flags[s] != 0) fn(s);
}
}  // namespace

int64_t BucketedLru::count_logged() {
  const int64_t n = n_slots(), nb = (n + kLogBlock - 1) / kLogBlock;
  block_first_.assign(static_cast<size_t>(nb) + 1, 0);
  for_blocks(nb, [&](int64_t b0, int64_t b1, int) {
    for (int64_t b = b0; b < b1; ++b) {
      int32_t c = 0;  // (a block's count fits; a branch-free loop)
      const uint8_t* f = logged_.data();
      for (int64_t s = b * kLogBlock, e = std::min(n, s + kLogBlock); s < e; ++s) c += f[s] != 0;
      block_first_[static_cast<size_t>(b) + 1] = c;
    }
  });
  for (size_t b = 1; b < block_first_.size(); ++b) block_first_[b] += block_first_[b - 1];
  return block_first_.back();
}

int64_t BucketedLru::begin_patch(int64_t now, int32_t* tick, bool* full) {
  DHS_CHECK(mirrored_, "LRU patch without a mirror (mirror_on)");
  DHS_CHECK(!patch_begun_, "LRU patch begun twice (fill_patch ends it)");
  advance(now);
  check_range(now);
  *tick = static_cast<int32_t>(now - base_);
  *full = full_patch_ || patch_out_;
  full_patch_ = *full;  // (fill_patch's)
  patch_begun_ = true;
  patch_base_ = base_;
  patch_tick_ = *tick;
  return *full ? n_slots() : count_logged();
}

void BucketedLru::fill_patch(int32_t* slot, int32_t* use, int32_t* owner) {
  DHS_CHECK(patch_begun_, "LRU fill_patch without begin_patch");
  const bool full = full_patch_;
  const int64_t n = n_slots(), nb = (n + kLogBlock - 1) / kLogBlock;
  // Each block's logged slots (every slot: full) from its first entry on; the log reset as it goes.
  // A resident slot's last use at or after the tick would read as the step's (the mirror counts
  // last use == tick as a read): refused (a clock that does not move between the host's uses and
  // the step's, as one layer whose before-step inserts share the step's tick).
  std::vector<uint8_t> late(static_cast<size_t>(std::max<int64_t>(nb, 1)), 0);
  for_blocks(nb, [&](int64_t b0, int64_t b1, int) {
    for (int64_t b = b0; b < b1; ++b) {
      int64_t i = full ? b * kLogBlock : block_first_[static_cast<size_t>(b)];
      const int64_t s0 = b * kLogBlock, e = std::min(n, s0 + kLogBlock);
      const auto put = [&](int64_t s) {
        slot[i] = static_cast<int32_t>(s);
        use[i] = use_[static_cast<size_t>(s)];
        owner[i] = owner_[static_cast<size_t>(s)];
        late[static_cast<size_t>(b)] |= owner[i] >= 0 && use[i] >= patch_tick_;
        ++i;
      };
      if (full) {
        for (int64_t s = s0; s < e; ++s) put(s);
        std::fill(logged_.begin() + s0, logged_.begin() + e, uint8_t{0});
      } else {
        for_flagged(logged_.data(), s0, e, [&](int64_t s) {
          put(s);
          logged_[static_cast<size_t>(s)] = 0;
        });
      }
    }
  });
  full_patch_ = false;
  patch_begun_ = false;
  patch_out_ = true;
  DHS_CHECK(std::find(late.begin(), late.end(), uint8_t{1}) == late.end(),
            "LRU patch: a resident slot last used at or after the step's tick {} (the step's clock must be later than "
            "every use before it)", int64_t{patch_tick_} + base_);
}

std::span<int32_t> BucketedLru::take_mirror(std::span<int32_t> from, int64_t* counts) {
  DHS_CHECK(mirrored_ && patch_out_, "LRU take_mirror without a patch taken before the step (begin_patch / fill_patch)");
  DHS_CHECK(static_cast<int64_t>(from.size()) == n_slots() && from.data() != use_.data(),
            "LRU take_mirror: {} slots (of {}), or the LRU's own storage", from.size(), n_slots());
  int64_t tick = patch_tick_;
  if (base_ != patch_base_) {  // (the base moved since the patch: the mirror's offsets read in the new one)
    const int64_t shift = base_ - patch_base_;
    for (int32_t& u : from) u = static_cast<int32_t>(std::max<int64_t>(int64_t{u} - shift, 0));
    tick -= shift;
  }
  // The slots logged since the patch (changed while the step ran), by blocks on the thread pool;
  // the counts' corrections per thread as (owner, delta), summed after.
  const int64_t n = n_slots(), nb = (n + kLogBlock - 1) / kLogBlock;
  const int n_threads = nb >= 2 ? ThreadPool::global().n_threads() : 1;
  std::vector<std::vector<std::pair<int32_t, int32_t>>> fix(static_cast<size_t>(n_threads));
  for_blocks(nb, [&](int64_t b0, int64_t b1, int thread) {
    auto& fx = fix[static_cast<size_t>(thread)];
    for (int64_t b = b0; b < b1; ++b)
      for_flagged(logged_.data(), b * kLogBlock, std::min(n, (b + 1) * kLogBlock), [&](int64_t si) {
        const uint8_t f = logged_[static_cast<size_t>(si)];
        const size_t s = static_cast<size_t>(si);
        const int32_t o = owner_at_patch_[s];
        if (f & kReplaced) {
          if (from[s] == tick && o >= 0) fx.emplace_back(o, -1);
          from[s] = use_[s];
        } else {
          if ((f & kSeen) && from[s] == tick) {  // (the read is the new page's: its owner's)
            if (o >= 0) fx.emplace_back(o, -1);
            if (owner_[s] >= 0) fx.emplace_back(owner_[s], 1);
          }
          from[s] = std::max(from[s], use_[s]);
        }
      });
  });
  for (const auto& fx : fix)
    for (const auto& [o, d] : fx) counts[o + 1] += d;
  patch_out_ = false;
  std::swap(use_, from);
  return from;
}

void BucketedLru::range_error(int64_t now) const {
  throw Error(fmt::format("LRU clock at {}: outside the last uses' range from {} (advance first)", now, base_));
}

int64_t BucketedLru::order_bin_at(int64_t u, int64_t now) const {
  const int64_t P = p_.bucket_steps, B = p_.n_buckets;
  if (!p_.cyclic) return (std::max(u / P, now / P - (B - 1)) - (now / P - (B - 1))) * P;  // key2 = 0
  const int64_t age = std::min((now - u) / P, B - 1);
  return ((B - 1) - age) * P + std::min(now - age * P - u, P - 1);
}

BucketedLru::BinTable BucketedLru::bin_table(int64_t now) const {
  // Both orders are constant in d from d = (B + 1) * P on: cyclic at age B - 1 with key2 P - 1,
  // plain at the oldest bucket (u / P <= now / P - B). The table's entries are order_bin's own.
  const int64_t P = p_.bucket_steps, B = p_.n_buckets, n = (B + 2) * P;
  check_range(now);
  BinTable t{std::vector<int32_t>(static_cast<size_t>(std::min(n, now + 1))), now - base_};
  for (int64_t d = 0; d < static_cast<int64_t>(t.bin.size()); ++d) {
    const int64_t u = now - d;
    if (!p_.cyclic) {
      const int64_t oldest = now / P - (B - 1);
      t.bin[static_cast<size_t>(d)] = static_cast<int32_t>((std::max(u / P, oldest) - oldest) * P);
    } else {
      const int64_t age = std::min(d / P, B - 1);
      t.bin[static_cast<size_t>(d)] = static_cast<int32_t>(((B - 1) - age) * P + std::min(d - age * P, P - 1));
    }
  }
  return t;
}

std::vector<int32_t> BucketedLru::select(int32_t owner, int64_t n, int64_t now,
                                         const std::function<bool(int32_t)>& eligible) const {
  std::vector<int32_t> out;
  if (n <= 0) return out;
  // A large LRU without a filter: the passes on the thread pool (the same result: select_passes
  // joins its chunks in slot order). The hierarchy's reservation of landing slots takes this path
  // before every tiered decode step, over millions of slots.
  if (!eligible && n_slots() >= kParallelSlots) {
    const int64_t want_n[1] = {n};
    return std::move(select_passes(
        [&](size_t s) -> int32_t {
          const int32_t o = owner_[s];
          return o >= 0 && (owner < 0 || o == owner) && pinned_[s] == 0 ? 0 : -1;
        },
        want_n, now)[0]);
  }
  const int64_t n_bins = static_cast<int64_t>(p_.n_buckets) * p_.bucket_steps;
  const auto candidate = [&](size_t s) {
    return owner_[s] >= 0 && (owner < 0 || owner_[s] == owner) && pinned_[s] == 0 &&
           (!eligible || eligible(static_cast<int32_t>(s)));
  };
  const BinTable bins = bin_table(now);
  // Pass 1: the histogram of candidates over the order's bins.
  std::vector<int64_t> hist(static_cast<size_t>(n_bins), 0);
  for (size_t s = 0; s < owner_.size(); ++s) {
    if (!candidate(s)) continue;
    DHS_CHECK(use_[s] <= bins.rel_now, "LRU select at step {}: slot {} was used at step {}, later", now, s, base_ + use_[s]);
    ++hist[static_cast<size_t>(bins.at(use_[s]))];
  }
  // The cut: bins before it go whole; from the cut bin, `take_in_cut` slots.
  int64_t cut = 0, before = 0;
  while (cut < n_bins && before + hist[static_cast<size_t>(cut)] < n) before += hist[static_cast<size_t>(cut++)];
  const int64_t take_in_cut = cut < n_bins ? n - before : 0;
  // Pass 2: in slot order, every candidate of a bin before the cut and the first take_in_cut of
  // the cut bin; then the result in (bin, slot) order.
  std::vector<std::vector<int32_t>> by_bin(static_cast<size_t>(std::min<int64_t>(cut + 1, n_bins)));
  int64_t taken_in_cut = 0;
  for (size_t s = 0; s < owner_.size(); ++s) {
    if (!candidate(s)) continue;
    const int64_t b = bins.at(use_[s]);
    if (b < cut) by_bin[static_cast<size_t>(b)].push_back(static_cast<int32_t>(s));
    else if (b == cut && taken_in_cut < take_in_cut) {
      by_bin[static_cast<size_t>(b)].push_back(static_cast<int32_t>(s));
      ++taken_in_cut;
    }
  }
  for (const auto& v : by_bin) out.insert(out.end(), v.begin(), v.end());
  return out;
}

std::vector<std::vector<int32_t>> BucketedLru::select_many(std::span<const std::pair<int32_t, int64_t>> wants,
                                                          int64_t now) const {
  int32_t max_owner = -1;
  for (const auto& [o, n] : wants) {
    DHS_CHECK(o >= 0, "LRU select_many: owner {}", o);
    max_owner = std::max(max_owner, o);
  }
  std::vector<int32_t> want_of(static_cast<size_t>(max_owner + 1), -1);  // owner -> index in wants
  std::vector<int64_t> want_n(wants.size());
  for (size_t i = 0; i < wants.size(); ++i) {
    DHS_CHECK(want_of[static_cast<size_t>(wants[i].first)] < 0, "LRU select_many: owner {} twice", wants[i].first);
    want_n[i] = wants[i].second;
    if (wants[i].second > 0) want_of[static_cast<size_t>(wants[i].first)] = static_cast<int32_t>(i);
  }
  return select_passes(
      [&](size_t s) -> int32_t {  // the want a slot is a candidate of, or -1
        const int32_t o = owner_[s];
        if (o < 0 || o > max_owner || pinned_[s] != 0) return -1;
        return want_of[static_cast<size_t>(o)];
      },
      want_n, now);
}

template <class WantOf>
std::vector<std::vector<int32_t>> BucketedLru::select_passes(const WantOf& index, std::span<const int64_t> want_n,
                                                            int64_t now) const {
  const int64_t n_bins = static_cast<int64_t>(p_.n_buckets) * p_.bucket_steps;
  const size_t n_wants = want_n.size(), nb = static_cast<size_t>(n_bins);
  std::vector<std::vector<int32_t>> out(n_wants);
  // Nothing wanted (a step whose recalls fit the free slots): no pass over the slots.
  if (std::none_of(want_n.begin(), want_n.end(), [](int64_t n) { return n > 0; })) return out;
  const BinTable bins = bin_table(now);
  // Both passes run over contiguous chunks of the slots, one per thread of the pool (large LRUs:
  // the hierarchy's per-step selection over millions of HBM slots), each chunk's results kept
  // apart and joined in chunk order, so the result is the serial pass's, slot order included.
  ThreadPool* pool = n_slots() >= kParallelSlots ? &ThreadPool::global() : nullptr;
  const int n_chunks = pool ? pool->n_threads() : 1;
  const auto over_chunks = [&](const std::function<void(int64_t, int64_t, int)>& fn) {
    if (pool) pool->parallel_for(n_slots(), fn, 4096);
    else fn(0, n_slots(), 0);
  };
  // Pass 1: each want's histogram over the order's bins; then its cut, as select's.
  std::vector<std::vector<int64_t>> hist_of(static_cast<size_t>(n_chunks), std::vector<int64_t>(n_wants * nb, 0));
  std::vector<int64_t> late_slot(static_cast<size_t>(n_chunks), -1);  // a slot used after `now`, by chunk
  over_chunks([&](int64_t b, int64_t e, int c) {
    int64_t* hist = hist_of[static_cast<size_t>(c)].data();
    for (size_t s = static_cast<size_t>(b); s < static_cast<size_t>(e); ++s) {
      const int32_t i = index(s);
      if (i < 0) continue;
      if (use_[s] > bins.rel_now) {
        late_slot[static_cast<size_t>(c)] = static_cast<int64_t>(s);
        return;
      }
      ++hist[static_cast<size_t>(i) * nb + static_cast<size_t>(bins.at(use_[s]))];
    }
  });
  for (int64_t s : late_slot)
    DHS_CHECK(s < 0, "LRU select at step {}: slot {} was used at step {}, later", now, s, base_ + use_[static_cast<size_t>(s)]);
  std::vector<int64_t> cut(n_wants, 0), take_in_cut(n_wants, 0);
  for (size_t i = 0; i < n_wants; ++i) {
    const int64_t n = want_n[i];
    if (n <= 0) continue;
    std::vector<int64_t> h(nb, 0);
    for (const auto& hc : hist_of)
      for (size_t k = 0; k < nb; ++k) h[k] += hc[i * nb + k];
    int64_t c = 0, before = 0;
    while (c < n_bins && before + h[static_cast<size_t>(c)] < n) before += h[static_cast<size_t>(c++)];
    cut[i] = c;
    take_in_cut[i] = c < n_bins ? n - before : 0;
  }
  // Pass 2: per chunk, in slot order, the candidates of bins before each cut and up to
  // take_in_cut of the cut bin (a chunk cannot need more); joined in chunk order, the cut bin cut
  // to take_in_cut, then each result in (bin, slot) order.
  std::vector<std::vector<std::vector<std::vector<int32_t>>>> by_bin(
      static_cast<size_t>(n_chunks), std::vector<std::vector<std::vector<int32_t>>>(n_wants));
  for (auto& chunk : by_bin)
    for (size_t i = 0; i < n_wants; ++i)
      if (want_n[i] > 0) chunk[i].resize(static_cast<size_t>(std::min<int64_t>(cut[i] + 1, n_bins)));
  over_chunks([&](int64_t b, int64_t e, int c) {
    auto& mine = by_bin[static_cast<size_t>(c)];
    for (size_t s = static_cast<size_t>(b); s < static_cast<size_t>(e); ++s) {
      const int32_t i = index(s);
      if (i < 0) continue;
      const size_t k = static_cast<size_t>(i);
      const int64_t bin = bins.at(use_[s]);
      if (bin < cut[k] || (bin == cut[k] && static_cast<int64_t>(mine[k][static_cast<size_t>(bin)].size()) < take_in_cut[k]))
        mine[k][static_cast<size_t>(bin)].push_back(static_cast<int32_t>(s));
    }
  });
  for (size_t i = 0; i < n_wants; ++i) {
    if (want_n[i] <= 0) continue;
    for (int64_t bin = 0; bin < std::min<int64_t>(cut[i] + 1, n_bins); ++bin) {
      int64_t room = bin < cut[i] ? INT64_MAX : take_in_cut[i];
      for (const auto& chunk : by_bin) {
        const auto& v = chunk[i][static_cast<size_t>(bin)];
        const int64_t take = std::min<int64_t>(room, static_cast<int64_t>(v.size()));
        out[i].insert(out[i].end(), v.begin(), v.begin() + take);
        room -= take;
      }
    }
  }
  return out;
}

std::string BucketedLru::check_invariants(int64_t now) const {
  const int64_t pinned = std::count(pinned_.begin(), pinned_.end(), uint8_t{1});
  if (pinned != n_pinned_) return std::to_string(pinned) + " slots pinned, counted " + std::to_string(n_pinned_);
  for (size_t s = 0; s < owner_.size(); ++s) {
    if (owner_[s] < -1) return "slot " + std::to_string(s) + " has owner " + std::to_string(owner_[s]);
    if (owner_[s] < 0 && pinned_[s]) return "free slot " + std::to_string(s) + " is pinned";
    if (owner_[s] >= 0 && base_ + use_[s] > now)
      return "slot " + std::to_string(s) + " last used at step " + std::to_string(base_ + use_[s]) + ", after " +
             std::to_string(now);
  }
  return "";
}

}  // namespace dhs
