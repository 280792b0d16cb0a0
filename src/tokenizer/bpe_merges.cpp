// BPE merge loop (see bpe_merges.h).
#include "tokenizer/bpe_merges.h"

#include <algorithm>
#include <queue>

namespace dhs {

void BpeMerges::add(int32_t left, int32_t right, int32_t merged, int32_t rank) {
  pairs_.try_emplace(key(left, right), Merge{rank, merged});
}

void BpeMerges::apply(std::vector<int32_t>& syms) const {
  // Most words are a few symbols long: rescanning beats building a heap there.
  // Both paths pick the same pair each step (lowest rank, then leftmost).
  if (syms.size() < 2) return;
  if (syms.size() <= 24) {
    apply_short(syms);
  } else {
    apply_long(syms);
  }
}

void BpeMerges::apply_short(std::vector<int32_t>& syms) const {
  while (syms.size() >= 2) {
    const Merge* best = nullptr;
    size_t best_pos = 0;
    for (size_t i = 0; i + 1 < syms.size(); ++i) {
      const Merge* m = find(syms[i], syms[i + 1]);
      if (m && (!best || m->rank < best->rank)) {
        best = m;
        best_pos = i;
      }
    }
    if (!best) return;
    syms[best_pos] = best->merged;
    syms.erase(syms.begin() + best_pos + 1);
  }
}

void BpeMerges::apply_long(std::vector<int32_t>& syms) const {
  struct Node {
    int32_t id, prev, next;
  };
  struct Candidate {
    int32_t rank, left;         // heap order: rank, then position
    int32_t left_id, right_id;  // the pair as it was when pushed, to spot stale entries
    bool operator>(const Candidate& o) const {
      return rank != o.rank ? rank > o.rank : left > o.left;
    }
  };
  const auto n = static_cast<int32_t>(syms.size());
  std::vector<Node> nodes(n);
  for (int32_t i = 0; i < n; ++i) nodes[i] = {syms[i], i - 1, i + 1 < n ? i + 1 : -1};

  std::priority_queue<Candidate, std::vector<Candidate>, std::greater<>> heap;
  auto push = [&](int32_t left) {
    if (left < 0 || nodes[left].next < 0) return;
    const Node& l = nodes[left];
    const Node& r = nodes[l.next];
    if (const Merge* m = find(l.id, r.id)) heap.push({m->rank, left, l.id, r.id});
  };
  for (int32_t i = 0; i + 1 < n; ++i) push(i);

  while (!heap.empty()) {
    const Candidate c = heap.top();
    heap.pop();
    Node& l = nodes[c.left];
    // A node's id only changes by merging into a longer token, so matching ids mean
    // the pair is still there.
    if (l.id != c.left_id || l.next < 0 || nodes[l.next].id != c.right_id) continue;
    const int32_t right = l.next;
    l.id = find(c.left_id, c.right_id)->merged;
    l.next = nodes[right].next;
    if (l.next >= 0) nodes[l.next].prev = c.left;
    nodes[right].id = -1;
    push(l.prev);
    push(c.left);
  }

  syms.clear();
  for (int32_t i = 0; i >= 0; i = nodes[i].next) syms.push_back(nodes[i].id);
}

}  // namespace dhs
