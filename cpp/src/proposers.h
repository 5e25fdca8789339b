// Candidate children for SPOT trees, mirroring spot/runtime/proposers.py: the static rule's position candidates,
// SPOT-Sets' set candidates (flips and runner-up swaps), and the training-free stale-confidence order (chain / tree).
#pragma once

#include <cstdint>
#include <vector>

#include "stale.h"
#include "tree.h"

namespace spot {

// proposers.runner_up_alternatives: log weights log(weight) - gap [B] of the runner-up tokens (-inf: none there, or
// the mask id: that child would equal its parent)
std::vector<double> runner_up_log_weights(const StaleView::RunnerUp& r, double weight, int64_t mask_id);

// proposers.position_candidates: one child per top-`branch` masked position of logq [B], each followed by the child
// committing its runner-up token when runner_up_tokens is given (weight logq + log weight, skipped at -inf); best
// first, stable
std::vector<Candidate> position_candidates(const Node& node, const std::vector<double>& logq,
                                           const std::vector<int64_t>& tokens, int64_t mask_id, int branch,
                                           const std::vector<int64_t>* runner_up_tokens = nullptr,
                                           const std::vector<double>* runner_up_log_weight = nullptr);

// proposers.set_candidates: the predicted set {P(i in S) > 0.5} (else the best position), then up to branch - 1
// alternatives best first: flips of the least certain positions (log-probability under independence + log
// flip_weight; none at 0) and, given runner-ups, swaps of one member's token for its runner-up (the set's
// log-probability + the runner-up's log weight; skipped at -inf, which runner_up_log_weights gives the mask id)
std::vector<Candidate> set_candidates(const Node& node, const std::vector<double>& member_p, int64_t best,
                                      const std::vector<int64_t>& tokens, int64_t mask_id, int branch,
                                      const std::vector<int64_t>* runner_up_tokens = nullptr,
                                      const std::vector<double>* runner_up_log_weight = nullptr,
                                      double flip_weight = 1.0);

// np.argmax: the first index of the largest value
int64_t first_argmax(const std::vector<double>& v);

class ConfidenceOrderProposer : public Proposer {
 public:
  explicit ConfidenceOrderProposer(int branch, double sharpness = 8.0) : branch_(branch), sharpness_(sharpness) {}
  std::vector<std::vector<Candidate>> propose(const std::vector<Node>& tree,
                                              const std::vector<int64_t>& nodes) override;

 private:
  int branch_;
  double sharpness_;
};

}  // namespace spot
