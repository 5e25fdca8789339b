// What one target pass gives the host loop per state, mirroring spot/runtime/outputs.py: F's next state and the stale
// view of a round, from logits on the host or from the device sampling epilogue's samples.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "engine.h"
#include "errors.h"
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
  // fused store mode: the finished block not yet cached, which the next block's first pass stores (decode.py's
  // PendingStore); empty: none
  std::vector<int64_t>* pending;
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
  // only the n-th state is read from now on (a walk's end, drafted from next round): release what the others need
  virtual void settle(int64_t) {}
};

// The logits reached the host (outputs.HostOutputs).
// Non-finite logits fail when a state's rows are READ (outputs.host_outputs): a verify pass also runs candidates the
// walk never reaches, and standard decoding, which never runs them, must not fail where SPOT does not.
class HostPassOutputs : public PassOutputs {
 public:
  HostPassOutputs(const TargetEngine& engine, HostLogits logits, int64_t b, int64_t vocab)
      : engine_(engine), logits_(std::move(logits)), b_(b), v_(vocab) {}
  std::vector<int64_t> next_state(int64_t n, const std::vector<int64_t>& state, const BlockContext& ctx,
                                  uint32_t block, uint32_t step) const override {
    return step_fn(state, row(n), v_, ctx.mask_id, ctx.rule, ctx.sampling, block, step, ctx.noise);
  }
  std::unique_ptr<StaleView> stale(int64_t n, const std::vector<int64_t>& state, const BlockContext& ctx,
                                   uint32_t block, uint32_t) const override {
    return std::make_unique<HostStaleView>(row(n), b_, v_, state, ctx.mask_id, ctx.sampling, block, ctx.noise);
  }

 private:
  const float* row(int64_t n) const {
    const float* rows = logits_.data() + n * b_ * v_;
    engine_.check_finite_rows(rows, static_cast<size_t>(b_ * v_));
    return rows;
  }
  const TargetEngine& engine_;
  HostLogits logits_;
  int64_t b_, v_;
};

// The logits stayed where the target ran (outputs.DeferredOutputs): the epilogue samples a state when it is first
// read, over that state's rows alone, so a verify pass runs it for the states the walk visits (~accepted + 1), not
// N, and its memory is one state's. Its samples equal the host's bit for bit.
class DevicePassOutputs : public PassOutputs {
 public:
  // skip: blocks of logits rows before the states' own (a fused store pass: 1, its stored block's)
  DevicePassOutputs(TargetEngine& engine, OrtOutput logits, const std::vector<int64_t>& states,
                    std::vector<int64_t> steps, const Sampling& sampling, uint32_t block, int64_t skip = 0)
      : engine_(engine), logits_(std::make_unique<OrtOutput>(std::move(logits))), states_(states),
        steps_(std::move(steps)), sampling_(sampling), block_(block), skip_(skip), done_(steps_.size()) {}
  std::vector<int64_t> next_state(int64_t n, const std::vector<int64_t>& state, const BlockContext& ctx, uint32_t,
                                  uint32_t) const override {
    const std::vector<int64_t> masked = masked_positions(state, ctx.mask_id);
    if (masked.empty()) return state;
    const EpilogueResult& r = result(n);
    std::vector<int64_t> tokens(masked.size());
    std::vector<double> conf(masked.size());
    for (size_t k = 0; k < masked.size(); ++k) {
      tokens[k] = r.token[masked[k]];
      conf[k] = r.confidence[masked[k]];
    }
    return commit_samples(state, masked, tokens, conf, ctx.rule);
  }
  std::unique_ptr<StaleView> stale(int64_t n, const std::vector<int64_t>& state, const BlockContext& ctx, uint32_t,
                                   uint32_t step) const override {
    return std::make_unique<SampledStaleView>(result(n), 0, step + 1, state, ctx.mask_id);
  }
  void settle(int64_t n) override {   // the end node of a walk: nothing else is read, the logits can go
    result(n);
    logits_.reset();
  }

 private:
  const EpilogueResult& result(int64_t n) const {
    std::unique_ptr<EpilogueResult>& r = done_.at(static_cast<size_t>(n));
    if (!r) {
      if (!logits_) fail(SPOT_ERR_INTERNAL, "a settled pass's other states were read");
      const int64_t b = engine_.block_size();
      const std::vector<int64_t> state(states_.begin() + n * b, states_.begin() + (n + 1) * b);
      r = std::make_unique<EpilogueResult>(
          engine_.sample_state(*logits_, skip_ + n, state, steps_[n], sampling_, block_));
    }
    return *r;
  }
  TargetEngine& engine_;
  std::unique_ptr<OrtOutput> logits_;   // [N, B, V] where the target ran; freed by settle
  std::vector<int64_t> states_, steps_;
  Sampling sampling_;
  uint32_t block_;
  int64_t skip_;
  mutable std::vector<std::unique_ptr<EpilogueResult>> done_;
};

// One target pass over N states [N*B] whose commit steps are steps [N]: the logits, or the epilogue's samples.
// store: a finished block [B] the pass stores first (the fused store pass, N = 1; Engine.block_outputs' store).
std::unique_ptr<PassOutputs> block_pass(TargetEngine& engine, const std::vector<int64_t>& states,
                                        const std::vector<int64_t>& steps, const BlockContext& ctx, uint32_t block,
                                        const std::vector<int64_t>* store = nullptr);

}  // namespace spot
