#include "stale.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <string>

#include "errors.h"

namespace spot {
namespace {

constexpr double kNegInf = -std::numeric_limits<double>::infinity();

}  // namespace

HostStaleView::HostStaleView(const float* logits, int64_t block_size, int64_t vocab, const std::vector<int64_t>& state,
                     int64_t mask_id, const Sampling& sampling, uint32_t block, NoiseRows* noise)
    : logits_(logits), b_(block_size), vocab_(vocab), positions_(masked_positions(state, mask_id)),
      sampling_(sampling), block_(block), noise_(noise) {}

void HostStaleView::each_row(uint32_t step, const std::function<void(size_t, int64_t, const NoiseBinsRow*)>& visit) {
  if (rows_.empty()) {
    rows_.resize(positions_.size());
    for (size_t k = 0; k < positions_.size(); ++k)
      scale_row(logits_ + positions_[k] * vocab_, vocab_, sampling_, rows_[k]);
  }
  const bool noisy = sampling_.temperature > 0;
  std::vector<uint16_t> scratch;
  for (size_t k = 0; k < positions_.size(); ++k) {
    const int64_t pos = positions_[k];
    if (noisy) {
      const NoiseBinsRow g = noise_row(noise_, sampling_.seed, block_, step, static_cast<uint32_t>(pos), vocab_,
                                       scratch);
      visit(k, pos, &g);
    } else {
      visit(k, pos, nullptr);
    }
  }
}

const StaleView::Coupled& HostStaleView::coupled(uint32_t step) {
  const uint32_t key = sampling_.temperature > 0 ? step : 0;   // at T = 0 no step differs: argmax and softmax of
  auto it = cache_.find(key);                                   // the same rows
  if (it != cache_.end()) return it->second;
  Coupled c;
  c.tokens.assign(static_cast<size_t>(b_), -1);
  c.conf.assign(static_cast<size_t>(b_), kNegInf);
  each_row(step, [&](size_t k, int64_t pos, const NoiseBinsRow* g) {
    sample_row(rows_[k], g, sampling_.exclude_token, c.tokens[pos], c.conf[pos]);
  });
  return cache_.emplace(key, std::move(c)).first->second;
}

const StaleView::RunnerUp& HostStaleView::runner_up(uint32_t step) {
  const uint32_t key = sampling_.temperature > 0 ? step : 0;
  auto it = runner_up_.find(key);
  if (it != runner_up_.end()) return it->second;
  const Coupled& c = coupled(step);
  RunnerUp r;
  r.tokens.assign(static_cast<size_t>(b_), -1);
  r.gap.assign(static_cast<size_t>(b_), std::numeric_limits<double>::infinity());
  each_row(step, [&](size_t k, int64_t pos, const NoiseBinsRow* g) {
    runner_up_row(rows_[k], g, sampling_.exclude_token, c.tokens[pos], r.tokens[pos], r.gap[pos]);
  });
  return runner_up_.emplace(key, std::move(r)).first->second;
}

const std::vector<float>& HostStaleView::topk_logprobs() {
  if (topk_.empty()) topk_ = spot::topk_logprobs(logits_, b_, vocab_, sampling_.temperature);
  return topk_;
}

SampledStaleView::SampledStaleView(const EpilogueResult& r, int64_t n, uint32_t first_step,
                                   const std::vector<int64_t>& state, int64_t mask_id)
    : r_(r), n_(n), first_step_(first_step), masked_(state.size()) {
  for (size_t p = 0; p < state.size(); ++p) masked_[p] = state[p] == mask_id;
  const float* top = r.top_logprobs.data() + n * r.b * kTopkFeatures;
  topk_.assign(top, top + r.b * kTopkFeatures);
}

int64_t SampledStaleView::row(uint32_t step) const {
  const int64_t j = static_cast<int64_t>(step) - static_cast<int64_t>(first_step_);
  if (j < 0 || j >= r_.d)   // run_decoder keeps trees within the epilogue's depth
    fail(SPOT_ERR_INTERNAL, "the device epilogue computed coupled samples for steps " + std::to_string(first_step_) +
                                ".." + std::to_string(first_step_ + r_.d - 1) + ", got a request for step " +
                                std::to_string(step));
  return (n_ * r_.d + j) * r_.b;
}

const StaleView::Coupled& SampledStaleView::coupled(uint32_t step) {
  auto it = cache_.find(step);
  if (it != cache_.end()) return it->second;
  const int64_t at = row(step);
  Coupled c{masked_row(r_.future_tokens, at, int64_t{-1}), masked_row(r_.future_conf, at, kNegInf)};
  return cache_.emplace(step, std::move(c)).first->second;
}

const StaleView::RunnerUp& SampledStaleView::runner_up(uint32_t step) {
  auto it = runner_up_.find(step);
  if (it != runner_up_.end()) return it->second;
  const int64_t at = row(step);
  RunnerUp u{masked_row(r_.future_runner_up, at, int64_t{-1}),
             masked_row(r_.future_gap, at, std::numeric_limits<double>::infinity())};
  return runner_up_.emplace(step, std::move(u)).first->second;
}

std::vector<float> topk_logprobs(const float* logits, int64_t rows, int64_t vocab, double temperature) {
  std::vector<float> out(static_cast<size_t>(rows * kTopkFeatures), -1e4f);   // tiny vocabularies: -1e4 floor
  std::vector<double> z(static_cast<size_t>(vocab)), e(static_cast<size_t>(vocab));
  const int64_t k = std::min<int64_t>(kTopkFeatures, vocab);
  for (int64_t r = 0; r < rows; ++r) {
    const float* row = logits + r * vocab;
    double zmax = kNegInf;
    for (int64_t v = 0; v < vocab; ++v) {
      z[v] = temperature > 0 ? static_cast<double>(row[v]) / temperature : static_cast<double>(row[v]);
      if (v == 0 || z[v] > zmax) zmax = z[v];
    }
    for (int64_t v = 0; v < vocab; ++v) {
      z[v] = z[v] - zmax;
      e[v] = std::exp(z[v]);
    }
    const double lse = std::log(pairwise_sum(e.data(), vocab));
    for (int64_t v = 0; v < vocab; ++v) z[v] = z[v] - lse;
    std::partial_sort(z.begin(), z.begin() + k, z.end(), std::greater<double>());
    for (int64_t i = 0; i < k; ++i) out[r * kTopkFeatures + i] = static_cast<float>(z[i]);
  }
  return out;
}

}  // namespace spot
