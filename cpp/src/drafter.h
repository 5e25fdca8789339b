// The SPOT drafter (order model) in the host loop, mirroring spot/runtime/drafter.py: drafter.onnx + drafter.json
// loaded and checked, run by ONNX Runtime on the CPU, and the proposer that turns its logits into tree children.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "engine.h"
#include "json.h"
#include "ort.h"
#include "tree.h"

namespace spot {

constexpr int kDrafterBranch = 4;                         // drafter.DEFAULT_BRANCH
constexpr int64_t kDrafterLookahead = 4;                  // drafter.DEFAULT_LOOKAHEAD

// drafter.TreeShape: how SPOT's proposer grows a tree under the static rule (depth 0: the budget's depth alone)
struct TreeShape {
  int branch = kDrafterBranch;
  int64_t depth = 0;
  double order_temperature = 1.0;
  double runner_up_weight = 0.17;
  double stale_top_bonus = 0.0;   // added to the order logit of the node's most confident stale position
};

class Drafter {
 public:
  static std::unique_ptr<Drafter> load(const std::string& dir);
  void check_compatible(int64_t block_size, const ModelFacts& target) const;
  // inputs of K nodes -> order_logits [K, B], member_logits [K, B]; the graph is fed the inputs it declares (topk may
  // be empty when reads_topk is false)
  void run(const std::vector<float>& topk, const std::vector<float>& masked, const std::vector<float>& stale_conf,
           const std::vector<int64_t>& staleness, int64_t k, int64_t b, std::vector<float>& order,
           std::vector<float>& member);

  std::string path;
  int64_t block_size = 0;
  int64_t max_staleness = 32;
  double member_threshold = 0.5;
  double member_offset = 0.0;
  double order_temperature = 1.0;   // drafter.json: divides the order logits (spot calibrate-drafter)
  double runner_up_weight = 0.17;   // drafter.json: weight of runner-up token children (drafter.py's default)
  double set_flip_weight = 1.0;     // drafter.json: weight of SPOT-Sets' flip variants (drafter.py's default)
  bool reads_topk = true;           // the graph has the topk input (a baseline-skip graph does not)
  std::vector<std::pair<int64_t, TreeShape>> tree_shapes;   // drafter.json tree_shapes: (nodes, shape), file order
  // drafter.shape_for: the entry with the most nodes <= nodes (the first of equals), else the drafter's own
  // settings with kDrafterBranch (nodes < 1: always those)
  TreeShape shape_for(int64_t nodes) const;
  std::optional<double> tau;
  Json target;

 private:
  std::unique_ptr<OrtSessionHandle> session_;
};

class DrafterProposer : public Proposer {
 public:
  // drafter.DrafterProposer: the static rule grows the tree shape of a budget of `nodes` nodes, the threshold rule
  // the drafter's own settings
  DrafterProposer(Drafter& drafter, int64_t nodes, int64_t lookahead)
      : drafter_(drafter), static_(drafter.shape_for(nodes)), sets_(drafter.shape_for(0)), lookahead_(lookahead) {}
  std::vector<std::vector<Candidate>> propose(const std::vector<Node>& tree,
                                              const std::vector<int64_t>& nodes) override;
  int64_t lookahead() const override { return lookahead_; }

 private:
  const TreeShape& shape() const { return round_.rule.threshold ? sets_ : static_; }
  std::vector<std::vector<Candidate>> candidates(const std::vector<Node>& tree, const std::vector<int64_t>& nodes,
                                                 const TreeShape& shape);
  Drafter& drafter_;
  TreeShape static_, sets_;
  int64_t lookahead_;
};

}  // namespace spot
