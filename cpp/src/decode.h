// Decoding, mirroring spot/runtime: the block loop (decode.py), stale views (stale.py), draft trees (tree.py),
// proposers (proposers.py, drafter.py), the SPOT round (spot.py) and the decoders by name (decoders.py).
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "engine.h"
#include "ort.h"
#include "step.h"

namespace spot {

constexpr int kTopkFeatures = 32;

// -- stale views (stale.py) --------------------------------------------------------------------------------------
// What a SPOT round drafts from: the coupled samples of s_m's logits at later steps.
class StaleView {
 public:
  virtual ~StaleView() = default;
  struct Coupled {
    std::vector<int64_t> tokens;   // [B], -1 where s_m is not masked
    std::vector<double> conf;      // [B], -inf there
  };
  virtual const Coupled& coupled(uint32_t step) = 0;
  struct RunnerUp {
    std::vector<int64_t> tokens;   // [B] second-best coupled sample, -1 where s_m is not masked
    std::vector<double> gap;       // [B] score(coupled sample) - score(runner-up), inf there or where none exists
  };
  virtual const RunnerUp* runner_up(uint32_t step) = 0;   // nullptr: none (an epilogue exported without them)
  virtual const std::vector<float>& topk_logprobs() = 0;   // [B, 32]
};

// From the logits on the host (stale.StaleView): rows scaled once, sampled lazily per step.
class HostStaleView : public StaleView {
 public:
  HostStaleView(const float* logits, int64_t block_size, int64_t vocab, const std::vector<int64_t>& state,
                int64_t mask_id, const Sampling& sampling, uint32_t block, NoiseRows* noise);
  const Coupled& coupled(uint32_t step) override;
  const RunnerUp* runner_up(uint32_t step) override;
  const std::vector<float>& topk_logprobs() override;

 private:
  const float* logits_;
  int64_t b_, vocab_;
  std::vector<int64_t> positions_;
  Sampling sampling_;
  uint32_t block_;
  NoiseRows* noise_;
  // scales the rows once, then calls visit(row k, position, the step's noise or nullptr at T = 0) per position
  void each_row(uint32_t step, const std::function<void(size_t, int64_t, const NoiseBinsRow*)>& visit);
  std::map<uint32_t, Coupled> cache_;
  std::map<uint32_t, RunnerUp> runner_up_;
  std::vector<ScaledRow> rows_;         // per masked position of s_m, scaled once per round
  std::vector<float> topk_;
};

// From the sampling epilogue's rows of one state (stale.SampledStaleView): steps first_step .. first_step + D - 1.
class SampledStaleView : public StaleView {
 public:
  SampledStaleView(const EpilogueResult& r, int64_t n, uint32_t first_step, const std::vector<int64_t>& state,
                   int64_t mask_id);
  const Coupled& coupled(uint32_t step) override;
  const RunnerUp* runner_up(uint32_t step) override;
  const std::vector<float>& topk_logprobs() override { return topk_; }

 private:
  int64_t row(uint32_t step) const;   // index into the future rows
  // src[at .. at + B) where s_m is masked, `fill` elsewhere (stale.SampledStaleView's np.where)
  template <typename T>
  std::vector<T> masked_row(const std::vector<T>& src, int64_t at, T fill) const {
    std::vector<T> out(masked_.size(), fill);
    for (size_t p = 0; p < masked_.size(); ++p)
      if (masked_[p]) out[p] = src[at + static_cast<int64_t>(p)];
    return out;
  }
  const EpilogueResult& r_;
  int64_t n_;
  uint32_t first_step_;
  std::vector<bool> masked_;
  std::vector<float> topk_;
  std::map<uint32_t, Coupled> cache_;
  std::map<uint32_t, RunnerUp> runner_up_;
};

// logits [rows, V] -> [rows, 32] float32 top-32 log-probabilities of softmax(logits / T), descending
std::vector<float> topk_logprobs(const float* logits, int64_t rows, int64_t vocab, double temperature);

// -- trees (tree.py) ---------------------------------------------------------------------------------------------
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

// -- proposers (proposers.py) --------------------------------------------------------------------------------------
class ConfidenceOrderProposer : public Proposer {
 public:
  explicit ConfidenceOrderProposer(int branch, double sharpness = 8.0) : branch_(branch), sharpness_(sharpness) {}
  std::vector<std::vector<Candidate>> propose(const std::vector<Node>& tree,
                                              const std::vector<int64_t>& nodes) override;

 private:
  int branch_;
  double sharpness_;
};

// -- the drafter (drafter.py) --------------------------------------------------------------------------------------
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

// -- decoding ------------------------------------------------------------------------------------------------------
struct DecodeStats {
  std::map<std::string, int64_t> passes;   // prefill, block, verify, store
  int64_t steps = 0, blocks = 0;
  double seconds = 0, draft_ms = 0, walk_ms = 0, target_ms = 0;
  std::vector<int64_t> accepted_per_verify, nodes_per_verify;
};

struct Generation {
  std::vector<int64_t> token_ids;
  bool stopped = false;
  DecodeStats stats;
};

struct DecodeRequest {
  std::string decoder = "standard";
  int64_t max_new_tokens = 64;
  bool threshold_mode = false;   // the commit rule of standard / chain / tree / spot (decoders.rule_for)
  double tau = 0.9;
  double temperature = 0.0;
  uint32_t seed = 0;
  int64_t top_k = 0;
  double top_p = 1.0;
  int64_t budget = 16;
  int64_t depth = 8;
  std::optional<std::vector<int64_t>> stop_ids;
};

Generation run_decoder(TargetEngine& engine, const ModelFacts& cfg, Drafter* drafter,
                       const std::vector<int64_t>& prompt, const DecodeRequest& req);

}  // namespace spot
