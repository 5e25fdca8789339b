#include "step.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>

namespace spot {
namespace {

constexpr uint32_t kMixMul1 = 0x21F0AAADu;
constexpr uint32_t kMixMul2 = 0x735A2D97u;
constexpr uint32_t kLaneA = 0x9E3779B9u;
constexpr uint32_t kLaneB = 0x7F4A7C15u;
constexpr double kTwoPowM53 = 1.0 / 9007199254740992.0;   // 2**-53, exact
constexpr double kNegInf = -std::numeric_limits<double>::infinity();
constexpr int kPairwiseBlock = 128;                        // numpy's PW_BLOCKSIZE

}  // namespace

uint32_t mix32(uint32_t x) {
  x ^= x >> 16;
  x *= kMixMul1;
  x ^= x >> 15;
  x *= kMixMul2;
  return x ^ (x >> 15);
}

uint32_t lane_prefix(uint32_t lane, uint32_t seed, uint32_t block, uint32_t step, uint32_t position) {
  uint32_t h = mix32(seed ^ lane);
  h = mix32(h ^ block);
  h = mix32(h ^ step);
  return mix32(h ^ position);
}

double uniform_from_words(uint32_t a, uint32_t b) {
  uint64_t k = (uint64_t(a >> 5) << 26) | uint64_t(b >> 6);
  double kd = static_cast<double>(k);          // exact: k < 2**53
  return (kd < 0.5 ? 0.5 : kd) * kTwoPowM53;   // max(k, 0.5) * 2**-53
}

double gumbel(uint32_t seed, uint32_t block, uint32_t step, uint32_t position, uint32_t token) {
  uint32_t a = mix32(lane_prefix(kLaneA, seed, block, step, position) ^ token);
  uint32_t b = mix32(lane_prefix(kLaneB, seed, block, step, position) ^ token);
  return -std::log(-std::log(uniform_from_words(a, b)));
}

void gumbel_row(uint32_t seed, uint32_t block, uint32_t step, uint32_t position, int64_t vocab, double* out) {
  uint32_t pa = lane_prefix(kLaneA, seed, block, step, position);
  uint32_t pb = lane_prefix(kLaneB, seed, block, step, position);
  for (int64_t v = 0; v < vocab; ++v) {
    uint32_t t = static_cast<uint32_t>(v);
    out[v] = -std::log(-std::log(uniform_from_words(mix32(pa ^ t), mix32(pb ^ t))));
  }
}

// numpy's pairwise_sum (umath loops): < 8 terms in order; <= 128 terms with 8 interleaved partial sums;
// longer rows split in two halves at a multiple of 8. The reduction adds the result to its identity 0.0.
double pairwise_sum(const double* a, int64_t n) {
  if (n < 8) {
    double res = 0.0;
    for (int64_t i = 0; i < n; ++i) res += a[i];
    return res;
  }
  if (n <= kPairwiseBlock) {
    double r[8];
    for (int j = 0; j < 8; ++j) r[j] = a[j];
    int64_t i = 8;
    for (; i < n - (n % 8); i += 8)
      for (int j = 0; j < 8; ++j) r[j] += a[i + j];
    double res = ((r[0] + r[1]) + (r[2] + r[3])) + ((r[4] + r[5]) + (r[6] + r[7]));
    for (; i < n; ++i) res += a[i];
    return res;
  }
  int64_t n2 = n / 2;
  n2 -= n2 % 8;
  return pairwise_sum(a, n2) + pairwise_sum(a + n2, n - n2);
}

void NoiseRows::start_block(uint32_t block) {
  block_ = block;
  rows_.clear();
  cached_ = 0;
}

const double* NoiseRows::row(uint32_t step, uint32_t position, std::vector<double>& scratch) {
  uint64_t key = (uint64_t(step) << 32) | position;
  auto it = rows_.find(key);
  if (it != rows_.end()) return it->second.data();
  if (cached_ + vocab_ <= max_doubles_) {
    std::vector<double>& r = rows_[key];
    r.resize(static_cast<size_t>(vocab_));
    gumbel_row(seed_, block_, step, position, vocab_, r.data());
    cached_ += vocab_;
    return r.data();
  }
  scratch.resize(static_cast<size_t>(vocab_));
  gumbel_row(seed_, block_, step, position, vocab_, scratch.data());
  return scratch.data();
}

const double* noise_row(NoiseRows* noise, uint32_t seed, uint32_t block, uint32_t step, uint32_t position,
                        int64_t vocab, std::vector<double>& scratch) {
  if (noise != nullptr) return noise->row(step, position, scratch);
  scratch.resize(static_cast<size_t>(vocab));
  gumbel_row(seed, block, step, position, vocab, scratch.data());
  return scratch.data();
}

void filter_row(const std::vector<double>& z, int64_t top_k, double top_p, std::vector<double>& out) {
  const int64_t vocab = static_cast<int64_t>(z.size());
  out = z;
  if (top_k > 0 && top_k < vocab) {
    std::vector<double> tmp = z;
    std::nth_element(tmp.begin(), tmp.begin() + (top_k - 1), tmp.end(), std::greater<double>());
    const double kth = tmp[static_cast<size_t>(top_k - 1)];
    for (int64_t v = 0; v < vocab; ++v)
      if (out[v] < kth) out[v] = kNegInf;
  }
  if (top_p < 1.0) {
    std::vector<int64_t> order(static_cast<size_t>(vocab));
    for (int64_t v = 0; v < vocab; ++v) order[v] = v;
    std::sort(order.begin(), order.end(), [&](int64_t a, int64_t b) {   // numpy: lexsort((ids, -z))
      return out[a] > out[b] || (out[a] == out[b] && a < b);
    });
    std::vector<double> p(static_cast<size_t>(vocab));
    const double top = out[order[0]];
    for (int64_t i = 0; i < vocab; ++i) p[i] = std::exp(out[order[i]] - top);
    const double total = pairwise_sum(p.data(), vocab);
    double cum = 0.0;                                     // np.cumsum(p / total): sequential
    std::vector<bool> drop(static_cast<size_t>(vocab), false);
    for (int64_t i = 0; i < vocab; ++i) {
      if (i > 0 && cum > top_p) drop[order[i]] = true;    // drop_sorted[i] = cum[i - 1] > p
      cum += p[i] / total;
    }
    for (int64_t v = 0; v < vocab; ++v)
      if (drop[v]) out[v] = kNegInf;
  }
}

void scale_row(const float* row, int64_t vocab, const Sampling& sampling, ScaledRow& out) {
  const double temperature = sampling.temperature;
  out.z.resize(static_cast<size_t>(vocab));
  double* z = out.z.data();
  for (int64_t v = 0; v < vocab; ++v)
    z[v] = temperature > 0 ? static_cast<double>(row[v]) / temperature : static_cast<double>(row[v]);
  double zmax = z[0];
  for (int64_t v = 1; v < vocab; ++v)
    if (z[v] > zmax) zmax = z[v];
  std::vector<double> e(static_cast<size_t>(vocab));
  for (int64_t v = 0; v < vocab; ++v) e[v] = std::exp(z[v] - zmax);
  out.zmax = zmax;
  out.denom = pairwise_sum(e.data(), vocab);
  const bool filtering = (sampling.top_k > 0 && sampling.top_k < vocab) || sampling.top_p < 1.0;
  if (temperature > 0 && filtering)
    filter_row(out.z, sampling.top_k, sampling.top_p, out.z_sample);
  else
    out.z_sample.clear();
}

void sample_row(const ScaledRow& r, const double* g, int64_t exclude, int64_t& token, double& conf) {
  const int64_t vocab = static_cast<int64_t>(r.z.size());
  const double* z = r.z.data();
  const double* zs = r.z_sample.empty() ? z : r.z_sample.data();
  int64_t best = -1;
  double best_val = kNegInf;
  for (int64_t v = 0; v < vocab; ++v) {
    double p = g ? zs[v] + g[v] : zs[v];
    if (v == exclude) p = kNegInf;
    if (best < 0 || p > best_val) {
      best = v;
      best_val = p;
    }
  }
  token = best;
  conf = std::exp(z[best] - r.zmax) / r.denom;   // the same exp numpy takes of that entry of exp(z - max)
}

void runner_up_row(const ScaledRow& r, const double* g, int64_t exclude, int64_t winner, int64_t& token,
                   double& gap) {
  const int64_t vocab = static_cast<int64_t>(r.z.size());
  const double* zs = r.z_sample.empty() ? r.z.data() : r.z_sample.data();
  int64_t best = -1;
  double best_val = kNegInf;
  for (int64_t v = 0; v < vocab; ++v) {
    double p = g ? zs[v] + g[v] : zs[v];
    if (v == exclude || v == winner) p = kNegInf;
    if (best < 0 || p > best_val) {
      best = v;
      best_val = p;
    }
  }
  const double top = g ? zs[winner] + g[winner] : zs[winner];
  const bool some = std::isfinite(best_val);  // no other token can be sampled: no runner-up
  token = some ? best : -1;
  gap = some ? top - best_val : std::numeric_limits<double>::infinity();
}

void sample_positions(const float* logits, int64_t vocab, const std::vector<int64_t>& positions,
                      const Sampling& sampling, uint32_t block, uint32_t step, NoiseRows* noise,
                      std::vector<int64_t>& tokens, std::vector<double>& conf) {
  const double t = sampling.temperature;
  tokens.assign(positions.size(), 0);
  conf.assign(positions.size(), 0.0);
  ScaledRow row;
  std::vector<double> scratch;
  for (size_t k = 0; k < positions.size(); ++k) {
    const int64_t pos = positions[k];
    scale_row(logits + pos * vocab, vocab, sampling, row);
    const double* g = t > 0 ? noise_row(noise, sampling.seed, block, step, static_cast<uint32_t>(pos), vocab, scratch)
                            : nullptr;
    sample_row(row, g, sampling.exclude_token, tokens[k], conf[k]);
  }
}

std::vector<int64_t> select_commits(const std::vector<double>& conf, const CommitRule& rule) {
  int64_t best = 0;
  for (size_t i = 1; i < conf.size(); ++i)
    if (conf[i] > conf[best]) best = static_cast<int64_t>(i);
  if (rule.threshold) {
    std::vector<int64_t> chosen;
    for (size_t i = 0; i < conf.size(); ++i)
      if (conf[i] > rule.tau) chosen.push_back(static_cast<int64_t>(i));
    if (!chosen.empty()) return chosen;
  }
  return {best};
}

std::vector<int64_t> masked_positions(const std::vector<int64_t>& state, int64_t mask_id) {
  std::vector<int64_t> out;
  for (size_t i = 0; i < state.size(); ++i)
    if (state[i] == mask_id) out.push_back(static_cast<int64_t>(i));
  return out;
}

bool has_mask(const std::vector<int64_t>& state, int64_t mask_id) {
  for (int64_t t : state)
    if (t == mask_id) return true;
  return false;
}

std::vector<int64_t> step_fn(const std::vector<int64_t>& state, const float* logits, int64_t vocab, int64_t mask_id,
                             const CommitRule& rule, const Sampling& sampling, uint32_t block, uint32_t step,
                             NoiseRows* noise) {
  std::vector<int64_t> masked = masked_positions(state, mask_id);
  if (masked.empty()) return state;
  std::vector<int64_t> tokens;
  std::vector<double> conf;
  sample_positions(logits, vocab, masked, sampling, block, step, noise, tokens, conf);
  std::vector<int64_t> out = state;
  for (int64_t i : select_commits(conf, rule)) out[masked[i]] = tokens[i];
  return out;
}

}  // namespace spot
