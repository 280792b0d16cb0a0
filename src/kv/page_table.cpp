#include "kv/page_table.h"

#include <algorithm>

#include <atomic>

#include "core/error.h"

namespace dhs {

namespace {
std::atomic<uint64_t> g_next_table_id{1};
}

PageTable::PageTable(int n_layers, int n_heads_kv, int page_size)
    : id_(g_next_table_id++),
      n_layers_(n_layers), n_heads_kv_(n_heads_kv), page_size_(page_size) {
  DHS_CHECK(n_layers > 0 && n_heads_kv > 0 && page_size > 0, "page table: bad shape");
  lists_.resize(static_cast<size_t>(n_layers) * n_heads_kv);
}

PageTable::~PageTable() = default;

int64_t PageTable::pages_needed(int64_t n_new_tokens) const {
  const int64_t want = (n_tokens_ + n_new_tokens + page_size_ - 1) / page_size_;
  const int64_t extra = want > n_pages_ ? want - n_pages_ : 0;
  return extra * n_layers_ * n_heads_kv_;
}

void PageTable::set_page(List& l, int64_t page_idx, PageRef p) {
  const size_t c = static_cast<size_t>(page_idx / kChunkPages);
  while (l.chunks.size() <= c) l.chunks.push_back(std::make_unique<Chunk>());
  (*l.chunks[c])[static_cast<size_t>(page_idx % kChunkPages)] = p;
}

bool PageTable::reserve(PagePool& pool, int64_t n_new_tokens) {
  DHS_CHECK(pool.page_size() == page_size_, "page table: pool page size {} != {}", pool.page_size(),
            page_size_);
  const int64_t need = pages_needed(n_new_tokens);
  if (need == 0) return true;
  std::vector<PageRef> fresh;
  fresh.reserve(static_cast<size_t>(need));
  if (!pool.allocate(need, &fresh)) return false;
  const int64_t per_list = need / (static_cast<int64_t>(n_layers_) * n_heads_kv_);
  size_t k = 0;
  for (int l = 0; l < n_layers_; ++l)
    for (int h = 0; h < n_heads_kv_; ++h)
      for (int64_t i = 0; i < per_list; ++i) set_page(list(l, h), n_pages_ + i, fresh[k++]);
  n_pages_ += per_list;
  return true;
}

void PageTable::commit(int64_t n_new_tokens) {
  DHS_CHECK(n_new_tokens >= 0 && n_tokens_ + n_new_tokens <= capacity_tokens(),
            "page table: commit of {} tokens beyond reserved capacity {}", n_new_tokens,
            capacity_tokens() - n_tokens_);
  n_tokens_ += n_new_tokens;
}

void PageTable::shrink_to_pages(FreePage free_page, void* ctx, int64_t n_pages) {
  if (n_pages < n_pages_) low_water_ = std::min(low_water_, n_pages);
  for (int layer = 0; layer < n_layers_; ++layer)
    for (int head = 0; head < n_heads_kv_; ++head) {
      List& l = list(layer, head);
      for (int64_t i = n_pages; i < n_pages_; ++i) {
        const size_t c = static_cast<size_t>(i / kChunkPages);
        free_page(ctx, (*l.chunks[c])[static_cast<size_t>(i % kChunkPages)], layer, head, i);
      }
      l.chunks.resize(static_cast<size_t>((n_pages + kChunkPages - 1) / kChunkPages));
    }
  n_pages_ = n_pages;
}

namespace {
void free_into_pool(void* pool, PageRef p, int, int, int64_t) { static_cast<PagePool*>(pool)->free(p); }
}  // namespace

void PageTable::truncate(PagePool& pool, int64_t n_tokens) { truncate(free_into_pool, &pool, n_tokens); }

void PageTable::truncate(FreePage free_page, void* ctx, int64_t n_tokens) {
  DHS_CHECK(n_tokens >= 0 && n_tokens <= n_tokens_, "page table: truncate to {} of {} tokens", n_tokens,
            n_tokens_);
  n_tokens_ = n_tokens;
  shrink_to_pages(free_page, ctx, (n_tokens + page_size_ - 1) / page_size_);
}

void PageTable::release(PagePool& pool) { release(free_into_pool, &pool); }

void PageTable::release(FreePage free_page, void* ctx) {
  n_tokens_ = 0;
  shrink_to_pages(free_page, ctx, 0);
}

void PageTable::relocate(int layer, int head, int64_t page_idx, PageRef p) {
  DHS_CHECK(layer >= 0 && layer < n_layers_ && head >= 0 && head < n_heads_kv_ && page_idx >= 0 && page_idx < n_pages_,
            "page table: relocate of page {} of ({}, {}) outside the table", page_idx, layer, head);
  DHS_CHECK(p.valid(), "page table: relocate to an invalid page");
  set_page(list(layer, head), page_idx, p);
}

PageRef PageTable::page(int layer, int head, int64_t page_idx) const {
  DHS_ASSERT(layer >= 0 && layer < n_layers_ && head >= 0 && head < n_heads_kv_);
  DHS_ASSERT(page_idx >= 0 && page_idx < n_pages_);
  const List& l = list(layer, head);
  return (*l.chunks[static_cast<size_t>(page_idx / kChunkPages)])[static_cast<size_t>(page_idx % kChunkPages)];
}

std::vector<PageRef> PageTable::all_pages() const {
  std::vector<PageRef> out;
  out.reserve(static_cast<size_t>(n_pages_) * lists_.size());
  for (int l = 0; l < n_layers_; ++l)
    for (int h = 0; h < n_heads_kv_; ++h)
      for (int64_t i = 0; i < n_pages_; ++i) out.push_back(page(l, h, i));
  return out;
}

}  // namespace dhs
