// Best-first draft trees under a node budget and depth, mirroring spot/runtime/tree.py and its order rule
// (docs/decisions.md, "Trees"), and the proposer interface they call.
#pragma once

#include <cstdint>
#include <vector>

#include "stale.h"
#include "step.h"

namespace spot {

struct Node {
  std::vector<int64_t> state;
  int64_t parent;
  int64_t depth;
  uint32_t step;
  double logp = 0.0;
  std::vector<int64_t> children;
};

struct Candidate {
  double logp;
  std::vector<int64_t> state;
};

struct RoundInputs {
  StaleView* stale;
  CommitRule rule;
  int64_t mask_id;
  uint32_t block;
};

class Proposer {
 public:
  virtual ~Proposer() = default;
  virtual void begin_round(const RoundInputs& r) { round_ = r; }
  virtual std::vector<std::vector<Candidate>> propose(const std::vector<Node>& tree,
                                                      const std::vector<int64_t>& nodes) = 0;
  // queued candidates build_tree proposes for ahead of time per call (tree.py's lookahead; the tree is unchanged)
  virtual int64_t lookahead() const { return 0; }

 protected:
  RoundInputs round_{};
};

std::vector<Node> build_tree(const std::vector<int64_t>& root_state, uint32_t root_step, Proposer& proposer,
                             int64_t budget, int64_t max_depth, int64_t mask_id);

}  // namespace spot
