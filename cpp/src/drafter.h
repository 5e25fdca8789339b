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
  std::optional<double> tau;
  Json target;

 private:
  std::unique_ptr<OrtSessionHandle> session_;
};

class DrafterProposer : public Proposer {
 public:
  DrafterProposer(Drafter& drafter, int branch, int64_t lookahead)
      : drafter_(drafter), branch_(branch), lookahead_(lookahead) {}
  std::vector<std::vector<Candidate>> propose(const std::vector<Node>& tree,
                                              const std::vector<int64_t>& nodes) override;
  int64_t lookahead() const override { return lookahead_; }

 private:
  Drafter& drafter_;
  int branch_;
  int64_t lookahead_;
};

}  // namespace spot
