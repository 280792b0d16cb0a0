// The BPE merge loop shared by both tokenizers: a word starts as a sequence of
// symbol ids and adjacent pairs merge, lowest rank first (leftmost among equal
// ranks), until no listed pair is left. Byte-level BPE ranks pairs by their line in
// the merges list; SentencePiece ranks them by the merged piece's score.
#pragma once
#include <cstddef>
#include <cstdint>
#include <unordered_map>
#include <vector>

namespace dhs {

class BpeMerges {
 public:
  void reserve(size_t n) { pairs_.reserve(n); }
  // Registers (left, right) -> merged. A pair listed twice keeps its first (best) rank.
  void add(int32_t left, int32_t right, int32_t merged, int32_t rank);
  size_t size() const { return pairs_.size(); }

  // Merges `syms` (token ids) in place. O(n log n): a heap of candidate pairs over
  // a linked list, so a long word (a 100 KB run without spaces) stays fast.
  void apply(std::vector<int32_t>& syms) const;

 private:
  struct Merge {
    int32_t rank;
    int32_t merged;
  };
  static uint64_t key(int32_t left, int32_t right) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(left)) << 32) |
           static_cast<uint32_t>(right);
  }
  const Merge* find(int32_t left, int32_t right) const {
    const auto it = pairs_.find(key(left, right));
    return it == pairs_.end() ? nullptr : &it->second;
  }
  void apply_short(std::vector<int32_t>& syms) const;
  void apply_long(std::vector<int32_t>& syms) const;

  std::unordered_map<uint64_t, Merge> pairs_;
};

}  // namespace dhs
