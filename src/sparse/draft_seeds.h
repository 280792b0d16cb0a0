// Verification-seeded drafts (issue 24, after Vegas / SparseSpec): the heaviest of the pages a
// request's last scored decode step (a verify row, or a plain decode row under its policy)
// selected, by its estimated masses, per (layer, KV head), kept so that the request's next drafts read them beside their sink and
// recent pages (`sinkwindow:W+M`). A retrieval head's needle page is far from the recent window,
// so a window-only draft cannot copy from it; the verifier's estimate already found it.
//
// Seeds are a hint for the draft only: the verifier decides every token, so stale or missing
// seeds change how many drafts are kept, never the output.
#pragma once
#include <cstdint>
#include <vector>

namespace dhs {

class DraftSeeds {
 public:
  // Seeds kept per (layer, KV head); 0: none recorded.
  int capacity() const { return m_; }
  void set_capacity(int m);
  // Whether anything is recorded.
  bool empty() const { return first_pos_ < 0; }
  // The tokens in KV before the step that recorded them (-1: none).
  int64_t first_pos() const { return first_pos_; }

  // The runner calls this before a step of the request: a record made in it is stamped with
  // n_before (the first position it wrote).
  void begin_step(int64_t n_before) { pending_pos_ = n_before; }
  // Records layer / head's seeds: the capacity() heaviest of the `chosen` pages by `mass` (mass
  // over every page of the list), heaviest first (mass descending, page index ascending on ties).
  // Called by scoring policies, one request each.
  void record(int layer, int head, int n_heads_kv, const std::vector<double>& mass, const std::vector<int32_t>& chosen);
  // The m heaviest recorded seeds of (layer, head) that lie below n_pages, ascending. Empty when
  // none were recorded for that layer.
  std::vector<int32_t> pages(int layer, int head, int n_heads_kv, int m, int64_t n_pages) const;

  // A rollback to n_tokens forgets a record made at a step that started at or past it (that
  // step's query saw tokens that no longer exist); a verify's rollback of its rejected rows
  // keeps the verify's record (it started before them).
  void truncate(int64_t n_tokens);
  void clear();

 private:
  int m_ = 0;
  int64_t first_pos_ = -1, pending_pos_ = -1;
  std::vector<int32_t> pages_;  // [layers recorded, n_heads_kv, m] heaviest first, -1 padded
};

// The m heaviest of `pages` by `mass`, heaviest first (mass descending, index ascending on ties).
std::vector<int32_t> heaviest_pages(const std::vector<double>& mass, std::vector<int32_t> pages, int m);

}  // namespace dhs
