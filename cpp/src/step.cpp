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
// gumbel_max.py's constants: each bound's margin for the rounding of glibc's two logs, the level's for the rounding
// of score = z + g, and how far below the other tokens' logsumexp the level lies (~e^3 = 20 candidates per row)
constexpr double kBoundMargin = 1.0 / 1099511627776.0;     // 2^-40
constexpr double kSumMargin = 1.0 / 1099511627776.0;       // 2^-40
constexpr double kLevelDrop = 3.0;

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

namespace {

// The noise of (seed, block, step, position) without bins: its two lanes' prefixes (exact values on demand).
NoiseBinsRow counters_row(uint32_t seed, uint32_t block, uint32_t step, uint32_t position) {
  NoiseBinsRow r;
  r.prefix_a = lane_prefix(kLaneA, seed, block, step, position);
  r.prefix_b = lane_prefix(kLaneB, seed, block, step, position);
  return r;
}

}  // namespace

double gumbel(uint32_t seed, uint32_t block, uint32_t step, uint32_t position, uint32_t token) {
  return counters_row(seed, block, step, position).exact(token);
}

const std::vector<double>& gumbel_bounds() {
  static const std::vector<double> table = [] {
    std::vector<double> b(size_t(1) << kBinBits);
    for (size_t j = 0; j < b.size(); ++j) {
      // the bin's largest uniform ((j + 1) * 2^(53 - kBinBits) - 1) * 2^-53, exact in float64
      const double u = static_cast<double>(j + 1) / static_cast<double>(size_t(1) << kBinBits) - kTwoPowM53;
      const double g = -std::log(-std::log(u));
      b[j] = g + kBoundMargin * (1.0 + std::fabs(g));
    }
    return b;
  }();
  return table;
}

double NoiseBinsRow::exact(int64_t token) const {
  const uint32_t t = static_cast<uint32_t>(token);
  return -std::log(-std::log(uniform_from_words(mix32(prefix_a ^ t), mix32(prefix_b ^ t))));
}

namespace {

NoiseBinsRow bins_row(uint32_t seed, uint32_t block, uint32_t step, uint32_t position, int64_t vocab,
                      std::vector<uint16_t>& out) {
  NoiseBinsRow r = counters_row(seed, block, step, position);
  out.resize(static_cast<size_t>(vocab));
  for (int64_t v = 0; v < vocab; ++v)
    out[v] = static_cast<uint16_t>(mix32(r.prefix_a ^ static_cast<uint32_t>(v)) >> (32 - kBinBits));
  r.bins = out.data();
  return r;
}

}  // namespace

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

NoiseBinsRow NoiseRows::row(uint32_t step, uint32_t position, std::vector<uint16_t>& scratch) {
  const uint64_t key = (uint64_t(step) << 32) | position;
  auto it = rows_.find(key);
  if (it != rows_.end()) {
    NoiseBinsRow r = counters_row(seed_, block_, step, position);
    r.bins = it->second.data();
    return r;
  }
  if (cached_ + vocab_ <= max_bins_) {
    cached_ += vocab_;
    return bins_row(seed_, block_, step, position, vocab_, rows_[key]);
  }
  return bins_row(seed_, block_, step, position, vocab_, scratch);
}

NoiseBinsRow noise_row(NoiseRows* noise, uint32_t seed, uint32_t block, uint32_t step, uint32_t position,
                       int64_t vocab, std::vector<uint16_t>& scratch) {
  if (noise != nullptr) return noise->row(step, position, scratch);
  return bins_row(seed, block, step, position, vocab, scratch);
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
  if (temperature <= 0) return;
  // the level: any value is exact (a token whose bound stays below it cannot win; a winner below it is ranked
  // again over every token), so it is summed plainly; it only sets how many tokens are candidates
  const double* zs = out.z_sample.empty() ? z : out.z_sample.data();
  const int64_t exclude = sampling.exclude_token;
  int64_t top = -1, count = 0;
  for (int64_t v = 0; v < vocab; ++v) {
    if (v == exclude || !std::isfinite(zs[v])) continue;
    ++count;
    if (top < 0 || zs[v] > zs[top]) top = v;
  }
  out.top = top < 0 ? 0 : top;     // nothing samplable: argmax over -inf scores is token 0
  out.single = count <= 1;
  double rest = 0.0;               // exp(zs - zmax) of the other samplable tokens (= e where not filtered)
  for (int64_t v = 0; v < vocab; ++v)
    if (v != exclude && v != top && std::isfinite(zs[v])) rest += e[v];
  out.level = rest > 0 ? zmax + std::log(rest) - kLevelDrop : kNegInf;
  out.threshold = out.level - kSumMargin * (64.0 + std::fabs(out.level));
}

namespace {

struct TopTwo {
  int64_t token = -1, second = -1;
  double top = kNegInf, below = kNegInf;
};

// The best (and second) of zs + exact noise over the tokens whose score bound reaches `threshold`, and the row's
// top, in ascending id order (ties: smallest id); `exclude` never. threshold -inf: every token.
void ranked(const double* zs, int64_t vocab, const NoiseBinsRow& g, int64_t exclude, int64_t always,
            double threshold, TopTwo& out) {
  const std::vector<double>& bound = gumbel_bounds();
  out = TopTwo();
  for (int64_t v = 0; v < vocab; ++v) {
    if (v == exclude) continue;
    if (v != always && !(zs[v] + bound[g.bins[v]] >= threshold)) continue;
    const double score = zs[v] + g.exact(v);
    if (out.token < 0 || score > out.top) {
      out.second = out.token;
      out.below = out.top;
      out.token = v;
      out.top = score;
    } else if (out.second < 0 || score > out.below) {
      out.second = v;
      out.below = score;
    }
  }
}

// argmax of zs + g without `exclude` and its runner-up (want_second), exactly: from the candidates where the
// winner (and the runner-up) reach the row's level, else from every token (probability ~2e-9 per row)
TopTwo gumbel_top(const ScaledRow& r, const NoiseBinsRow& g, int64_t exclude, bool want_second) {
  const int64_t vocab = static_cast<int64_t>(r.z.size());
  const double* zs = r.z_sample.empty() ? r.z.data() : r.z_sample.data();
  TopTwo t;
  if (r.single) {             // no other token can be sampled: no noise needed
    t.token = r.top;
    t.top = zs[r.top] + g.exact(r.top);
    return t;
  }
  ranked(zs, vocab, g, exclude, r.top, r.threshold, t);
  const bool sure = t.top >= r.level && (!want_second || t.below >= r.level);
  if (!sure) ranked(zs, vocab, g, exclude, r.top, kNegInf, t);
  return t;
}

}  // namespace

void sample_row(const ScaledRow& r, const NoiseBinsRow* g, int64_t exclude, int64_t& token, double& conf) {
  const int64_t vocab = static_cast<int64_t>(r.z.size());
  const double* z = r.z.data();
  int64_t best = -1;
  if (g != nullptr) {
    best = gumbel_top(r, *g, exclude, false).token;
  } else {                    // T = 0: argmax of z without `exclude`
    double best_val = kNegInf;
    for (int64_t v = 0; v < vocab; ++v) {
      const double p = v == exclude ? kNegInf : z[v];
      if (best < 0 || p > best_val) {
        best = v;
        best_val = p;
      }
    }
  }
  token = best;
  conf = std::exp(z[best] - r.zmax) / r.denom;   // the same exp numpy takes of that entry of exp(z - max)
}

void runner_up_row(const ScaledRow& r, const NoiseBinsRow* g, int64_t exclude, int64_t winner, int64_t& token,
                   double& gap) {
  double top = kNegInf, best_val = kNegInf;
  int64_t best = -1;
  if (g != nullptr) {
    const TopTwo t = gumbel_top(r, *g, exclude, true);   // its winner is `winner` (the same definition)
    top = t.top;
    best = t.second;
    best_val = t.below;
  } else {                    // T = 0: the scores are z itself
    const int64_t vocab = static_cast<int64_t>(r.z.size());
    const double* z = r.z.data();
    top = z[winner];
    for (int64_t v = 0; v < vocab; ++v) {
      const double p = (v == exclude || v == winner) ? kNegInf : z[v];
      if (best < 0 || p > best_val) {
        best = v;
        best_val = p;
      }
    }
  }
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
  std::vector<uint16_t> scratch;
  for (size_t k = 0; k < positions.size(); ++k) {
    const int64_t pos = positions[k];
    scale_row(logits + pos * vocab, vocab, sampling, row);
    if (t > 0) {
      const NoiseBinsRow g = noise_row(noise, sampling.seed, block, step, static_cast<uint32_t>(pos), vocab, scratch);
      sample_row(row, &g, sampling.exclude_token, tokens[k], conf[k]);
    } else {
      sample_row(row, nullptr, sampling.exclude_token, tokens[k], conf[k]);
    }
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
  return commit_samples(state, masked, tokens, conf, rule);
}

std::vector<int64_t> commit_samples(const std::vector<int64_t>& state, const std::vector<int64_t>& masked,
                                    const std::vector<int64_t>& tokens, const std::vector<double>& conf,
                                    const CommitRule& rule) {
  std::vector<int64_t> out = state;
  for (int64_t i : select_commits(conf, rule)) out[masked[i]] = tokens[i];
  return out;
}

}  // namespace spot
