// What one target pass gives the host loop per state, mirroring spot/runtime/outputs.py: F's next state and the stale
// view of a round, from logits on the host or from the device sampling epilogue's samples.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "engine.h"
#include "stale.h"
#include "step.h"

namespace spot {

struct DecodeStats;

struct BlockContext {
  CommitRule rule;
  Sampling sampling;
  int64_t mask_id;
  DecodeStats* stats;
  NoiseRows* noise;
};

// What one target pass gives the host loop per state (outputs.py): F's next state and the stale view of a round.
class PassOutputs {
 public:
  virtual ~PassOutputs() = default;
  // F of `state`, the pass's n-th state, at its commit step `step`
  virtual std::vector<int64_t> next_state(int64_t n, const std::vector<int64_t>& state, const BlockContext& ctx,
                                          uint32_t block, uint32_t step) const = 0;
  // the stale view of a round drafting from the n-th state (committed at `step`); the outputs outlive it
  virtual std::unique_ptr<StaleView> stale(int64_t n, const std::vector<int64_t>& state, const BlockContext& ctx,
                                           uint32_t block, uint32_t step) const = 0;
};

// The logits reached the host (outputs.HostOutputs).
class HostPassOutputs : public PassOutputs {
 public:
  HostPassOutputs(HostLogits logits, int64_t b, int64_t vocab) : logits_(std::move(logits)), b_(b), v_(vocab) {}
  std::vector<int64_t> next_state(int64_t n, const std::vector<int64_t>& state, const BlockContext& ctx,
                                  uint32_t block, uint32_t step) const override {
    return step_fn(state, row(n), v_, ctx.mask_id, ctx.rule, ctx.sampling, block, step, ctx.noise);
  }
  std::unique_ptr<StaleView> stale(int64_t n, const std::vector<int64_t>& state, const BlockContext& ctx,
                                   uint32_t block, uint32_t) const override {
    return std::make_unique<HostStaleView>(row(n), b_, v_, state, ctx.mask_id, ctx.sampling, block, ctx.noise);
  }

 private:
  const float* row(int64_t n) const { return logits_.data() + n * b_ * v_; }
  HostLogits logits_;
  int64_t b_, v_;
};

// The sampling epilogue ran next to the target (outputs.SampledOutputs): its samples equal the host's bit for bit.
class SampledPassOutputs : public PassOutputs {
 public:
  explicit SampledPassOutputs(EpilogueResult r) : r_(std::move(r)) {}
  std::vector<int64_t> next_state(int64_t n, const std::vector<int64_t>& state, const BlockContext& ctx, uint32_t,
                                  uint32_t) const override {
    const std::vector<int64_t> masked = masked_positions(state, ctx.mask_id);
    if (masked.empty()) return state;
    std::vector<int64_t> tokens(masked.size());
    std::vector<double> conf(masked.size());
    for (size_t k = 0; k < masked.size(); ++k) {
      tokens[k] = r_.token[n * r_.b + masked[k]];
      conf[k] = r_.confidence[n * r_.b + masked[k]];
    }
    return commit_samples(state, masked, tokens, conf, ctx.rule);
  }
  std::unique_ptr<StaleView> stale(int64_t n, const std::vector<int64_t>& state, const BlockContext& ctx, uint32_t,
                                   uint32_t step) const override {
    return std::make_unique<SampledStaleView>(r_, n, step + 1, state, ctx.mask_id);
  }

 private:
  EpilogueResult r_;
};

// One target pass over N states [N*B] whose commit steps are steps [N]: the logits, or the epilogue's samples.
std::unique_ptr<PassOutputs> block_pass(TargetEngine& engine, const std::vector<int64_t>& states,
                                        const std::vector<int64_t>& steps, const BlockContext& ctx, uint32_t block);

}  // namespace spot
