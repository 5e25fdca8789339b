#include "tree.h"

#include <algorithm>
#include <map>
#include <utility>

namespace spot {
namespace {

// -- the queue of tree.py's order rule (docs/decisions.md, "Trees"): entries ordered by the total key
// (neg logp, counter), the counter numbering pushes; any heap pops the same sequence, its layout decides nothing ---
struct HeapEntry {
  double neg;
  int64_t counter;
  int kind;          // 0: node awaiting expansion, 1: candidate child
  int64_t payload;   // kind 0: node index; kind 1: index into the candidate store
};

bool heap_less(const HeapEntry& a, const HeapEntry& b) {
  if (a.neg != b.neg) return a.neg < b.neg;   // as Python compares the tuples; counters are unique
  return a.counter < b.counter;
}

bool heap_greater(const HeapEntry& a, const HeapEntry& b) { return heap_less(b, a); }   // std:: heaps: max first

void heap_push(std::vector<HeapEntry>& h, const HeapEntry& e) {
  h.push_back(e);
  std::push_heap(h.begin(), h.end(), heap_greater);
}

HeapEntry heap_pop(std::vector<HeapEntry>& h) {
  std::pop_heap(h.begin(), h.end(), heap_greater);
  HeapEntry top = h.back();
  h.pop_back();
  return top;
}

}  // namespace

std::vector<Node> build_tree(const std::vector<int64_t>& root_state, uint32_t root_step, Proposer& proposer,
                             int64_t budget, int64_t max_depth, int64_t mask_id) {
  std::vector<Node> tree;
  tree.push_back({root_state, -1, 0, root_step, 0.0, {}});
  int64_t counter = 0;
  std::vector<HeapEntry> heap;
  struct Pending {
    int64_t parent;
    double logp;
    std::vector<int64_t> state;
  };
  std::vector<Pending> store;   // candidate children referenced by heap entries of kind 1
  std::map<int64_t, std::vector<Candidate>> prefetched;   // candidate counter -> its proposals (tree.py's lookahead)
  std::vector<int64_t> key_of = {-1};                     // tree index -> counter of the candidate it came from
  // (state, step) -> tree index: a state reached by two commit orders is one node with two parents (tree.py)
  std::map<std::pair<std::vector<int64_t>, uint32_t>, int64_t> index_of = {{{root_state, root_step}, 0}};
  const int64_t lookahead = proposer.lookahead();
  auto expandable = [&](int64_t depth, const std::vector<int64_t>& state) {
    return depth < max_depth && has_mask(state, mask_id);
  };
  if (expandable(0, root_state)) heap_push(heap, {0.0, counter, 0, 0});
  while (!heap.empty() && static_cast<int64_t>(tree.size()) < budget) {
    HeapEntry top = heap_pop(heap);
    if (top.kind == 0) {
      // every node awaiting expansion goes into one proposer call, in key order (tree.py's order rule)
      std::vector<HeapEntry> waiting, rest;
      for (const HeapEntry& h : heap) (h.kind == 0 ? waiting : rest).push_back(h);
      std::sort(waiting.begin(), waiting.end(), heap_less);
      std::vector<int64_t> pending = {top.payload};
      for (const HeapEntry& h : waiting) pending.push_back(h.payload);
      heap.swap(rest);
      std::make_heap(heap.begin(), heap.end(), heap_greater);
      std::vector<Node> batch;   // the nodes to propose for: pending ones not prefetched, then speculative ones
      std::vector<int64_t> ask, extra;
      for (int64_t i : pending)
        if (!prefetched.count(key_of[static_cast<size_t>(i)])) {
          ask.push_back(i);
          batch.push_back(tree[static_cast<size_t>(i)]);
        }
      const int64_t limit = std::min(lookahead, budget - static_cast<int64_t>(tree.size()));
      if (limit > 0 && !ask.empty()) {   // heapq.nsmallest over the queued candidates
        std::vector<HeapEntry> queued;
        for (const HeapEntry& h : heap)
          if (h.kind == 1) queued.push_back(h);
        const size_t n = std::min(queued.size(), static_cast<size_t>(limit));
        std::partial_sort(queued.begin(), queued.begin() + static_cast<std::ptrdiff_t>(n), queued.end(), heap_less);
        for (size_t j = 0; j < n; ++j) {
          const Pending& c = store[static_cast<size_t>(queued[j].payload)];
          const Node& p = tree[static_cast<size_t>(c.parent)];
          if (prefetched.count(queued[j].counter) || index_of.count({c.state, p.step + 1}) ||
              !expandable(p.depth + 1, c.state))
            continue;   // proposed already, or to be linked to an existing node (never expanded again)
          extra.push_back(queued[j].counter);
          batch.push_back({c.state, c.parent, p.depth + 1, p.step + 1, 0.0, {}});
        }
      }
      std::vector<int64_t> index(batch.size());
      for (size_t j = 0; j < index.size(); ++j) index[j] = static_cast<int64_t>(j);
      std::vector<std::vector<Candidate>> answers;
      if (!batch.empty()) answers = proposer.propose(batch, index);
      std::map<int64_t, size_t> fresh;   // tree index -> its answer
      for (size_t j = 0; j < ask.size(); ++j) fresh[ask[j]] = j;
      for (size_t j = 0; j < extra.size(); ++j) prefetched[extra[j]] = std::move(answers[ask.size() + j]);
      for (int64_t i : pending) {
        std::vector<Candidate> cands;
        auto f = fresh.find(i);
        if (f != fresh.end()) {
          cands = std::move(answers[f->second]);
        } else {
          auto it = prefetched.find(key_of[static_cast<size_t>(i)]);
          cands = std::move(it->second);
          prefetched.erase(it);
        }
        for (Candidate& c : cands) {
          ++counter;
          store.push_back({i, c.logp, std::move(c.state)});
          heap_push(heap, {-(tree[static_cast<size_t>(i)].logp + c.logp), counter, 1,
                           static_cast<int64_t>(store.size() - 1)});
        }
      }
      continue;
    }
    Pending& c = store[static_cast<size_t>(top.payload)];
    const Node& p = tree[static_cast<size_t>(c.parent)];
    const int64_t depth = p.depth + 1;
    auto known = index_of.find({c.state, p.step + 1});
    if (known != index_of.end()) {   // reached before by another commit order: link it, verify it once
      std::vector<int64_t>& siblings = tree[static_cast<size_t>(c.parent)].children;
      if (std::find(siblings.begin(), siblings.end(), known->second) == siblings.end())
        siblings.push_back(known->second);
      continue;
    }
    index_of[{c.state, p.step + 1}] = static_cast<int64_t>(tree.size());
    Node child{std::move(c.state), c.parent, depth, p.step + 1, p.logp + c.logp, {}};
    tree.push_back(std::move(child));
    const int64_t idx = static_cast<int64_t>(tree.size()) - 1;
    key_of.push_back(top.counter);
    tree[static_cast<size_t>(c.parent)].children.push_back(idx);
    if (expandable(depth, tree.back().state)) {
      ++counter;
      heap_push(heap, {top.neg, counter, 0, idx});
    }
  }
  return tree;
}

}  // namespace spot
