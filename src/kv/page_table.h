// Per-request page table: for each (layer, KV head) the ordered list of
// head-pages holding that head's tokens. Two-level (DESIGN.md §1.3): a small
// directory of fixed-size chunks per list, chunks allocated only for page
// ranges that exist, so a 128k-capable request costs nothing until it grows.
#pragma once
#include <array>
#include <cstdint>
#include <memory>
#include <vector>

#include "kv/page_pool.h"
#include "kv/page_ref.h"

namespace dhs {

class PageTable {
 public:
  static constexpr int kChunkPages = 64;

  PageTable(int n_layers, int n_heads_kv, int page_size);
  ~PageTable();
  PageTable(PageTable&&) noexcept = default;
  PageTable& operator=(PageTable&&) noexcept = default;

  // Unique per constructed table (never reused), so mirrors of it (the device page
  // table) can tell a new request in a reused slot from the one they copied.
  uint64_t id() const { return id_; }
  int n_layers() const { return n_layers_; }
  int n_heads_kv() const { return n_heads_kv_; }
  int page_size() const { return page_size_; }
  int64_t n_tokens() const { return n_tokens_; }        // committed tokens
  int64_t n_pages_per_list() const { return n_pages_; }  // pages per (layer, head) list
  int64_t capacity_tokens() const { return n_pages_ * page_size_; }

  // Pages `reserve(n_new)` would take from the pool (over all layers and heads).
  int64_t pages_needed(int64_t n_new_tokens) const;
  // Makes room for n_new more tokens in every list. All-or-nothing: returns false
  // and allocates nothing when the pool has too few free pages.
  bool reserve(PagePool& pool, int64_t n_new_tokens);
  // Marks n_new reserved tokens as written (after the step that appended them).
  void commit(int64_t n_new_tokens);
  // Drops tokens past n_tokens (rejected speculation) and frees pages no longer needed.
  void truncate(PagePool& pool, int64_t n_tokens);
  // Frees every page (request finished or cancelled).
  void release(PagePool& pool);
  // The same with pages in more than one tier (kv/tiered_kv.h): `free_page` frees each dropped
  // page wherever it lives.
  using FreePage = void (*)(void* ctx, PageRef p, int layer, int head, int64_t page_idx);
  void truncate(FreePage free_page, void* ctx, int64_t n_tokens);
  void release(FreePage free_page, void* ctx);
  // Page page_idx of (layer, head) now lives at p (moved between tiers by kv/tiered_kv.h, which
  // has copied it there and frees the old slot).
  void relocate(int layer, int head, int64_t page_idx, PageRef p);

  PageRef page(int layer, int head, int64_t page_idx) const;
  // Page and row of token `pos` in (layer, head).
  PageRef page_of_token(int layer, int head, int64_t pos, int* row) const {
    *row = static_cast<int>(pos % page_size_);
    return page(layer, head, pos / page_size_);
  }
  // Every page this table owns (for accounting checks).
  std::vector<PageRef> all_pages() const;

  // The fewest pages per list the table has had since the last call (INT64_MAX if it
  // never shrank), then forgets it. For the one mirror of the table (the device page
  // table): entries past this index may name other slots than the ones it copied.
  int64_t take_low_water_pages() const {
    const int64_t v = low_water_;
    low_water_ = INT64_MAX;
    return v;
  }

 private:
  using Chunk = std::array<PageRef, kChunkPages>;
  struct List {
    std::vector<std::unique_ptr<Chunk>> chunks;  // directory
  };
  List& list(int layer, int head) { return lists_[static_cast<size_t>(layer * n_heads_kv_ + head)]; }
  const List& list(int layer, int head) const {
    return lists_[static_cast<size_t>(layer * n_heads_kv_ + head)];
  }
  void set_page(List& l, int64_t page_idx, PageRef p);
  void shrink_to_pages(FreePage free_page, void* ctx, int64_t n_pages);

  uint64_t id_;
  int n_layers_, n_heads_kv_, page_size_;
  int64_t n_tokens_ = 0;
  int64_t n_pages_ = 0;
  mutable int64_t low_water_ = INT64_MAX;  // see take_low_water_pages()
  std::vector<List> lists_;  // [n_layers * n_heads_kv]
};

}  // namespace dhs
