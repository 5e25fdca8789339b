// Stale views, mirroring spot/runtime/stale.py: what a SPOT round drafts from — the coupled samples (and their
// runner-ups) of the last pass's logits at later steps, and the top-32 log-probabilities the drafter reads.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <vector>

#include "engine.h"
#include "step.h"

namespace spot {

constexpr int kTopkFeatures = 32;

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
  virtual const RunnerUp& runner_up(uint32_t step) = 0;
  virtual const std::vector<float>& topk_logprobs() = 0;   // [B, 32]
};

// From the logits on the host (stale.StaleView): rows scaled once, sampled lazily per step.
class HostStaleView : public StaleView {
 public:
  HostStaleView(const float* logits, int64_t block_size, int64_t vocab, const std::vector<int64_t>& state,
                int64_t mask_id, const Sampling& sampling, uint32_t block, NoiseRows* noise);
  const Coupled& coupled(uint32_t step) override;
  const RunnerUp& runner_up(uint32_t step) override;
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
  const RunnerUp& runner_up(uint32_t step) override;
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

}  // namespace spot
