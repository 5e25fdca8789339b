#include "proposers.h"

#include <algorithm>
#include <cmath>
#include <limits>

namespace spot {
namespace {

constexpr double kNegInf = -std::numeric_limits<double>::infinity();
constexpr double kLogFloor = -30.0;                       // proposers.LOG_FLOOR
constexpr double kNpyLogE2 = 0.693147180559945309417232121458176568;   // numpy's NPY_LOGE2

// numpy's npy_logaddexp (scalar libm exp / log1p)
double logaddexp(double x, double y) {
  if (x == y) return x + kNpyLogE2;
  const double tmp = x - y;
  if (tmp > 0) return x + std::log1p(std::exp(-tmp));
  if (tmp <= 0) return y + std::log1p(std::exp(tmp));
  return tmp;
}

std::vector<int64_t> child_with(const std::vector<int64_t>& state, const std::vector<int64_t>& positions,
                                const std::vector<int64_t>& tokens) {
  std::vector<int64_t> child = state;
  for (int64_t p : positions) child[p] = tokens[p];
  return child;
}

// proposers.merged_best_first: the first n of two candidate lists (each best first) merged best first, ties: a's
std::vector<Candidate> merged_best_first(const std::vector<Candidate>& a, const std::vector<Candidate>& b, size_t n) {
  std::vector<Candidate> out;
  size_t i = 0, j = 0;
  while (out.size() < n && (i < a.size() || j < b.size())) {
    if (j >= b.size() || (i < a.size() && a[i].logp >= b[j].logp)) {
      out.push_back(a[i++]);
    } else {
      out.push_back(b[j++]);
    }
  }
  return out;
}

}  // namespace

std::vector<double> runner_up_log_weights(const StaleView::RunnerUp& r, double weight, int64_t mask_id) {
  std::vector<double> out(r.gap.size());
  const double log_weight = std::log(weight);
  for (size_t p = 0; p < r.gap.size(); ++p) out[p] = r.tokens[p] == mask_id ? kNegInf : log_weight - r.gap[p];
  return out;
}

std::vector<Candidate> position_candidates(const Node& node, const std::vector<double>& logq,
                                           const std::vector<int64_t>& tokens, int64_t mask_id, int branch,
                                           const std::vector<int64_t>* runner_up_tokens,
                                           const std::vector<double>* runner_up_log_weight) {
  std::vector<int64_t> masked = masked_positions(node.state, mask_id);
  std::stable_sort(masked.begin(), masked.end(), [&](int64_t a, int64_t b) { return -logq[a] < -logq[b]; });
  std::vector<Candidate> out;
  for (size_t i = 0; i < masked.size() && i < static_cast<size_t>(branch); ++i) {
    int64_t p = masked[i];
    out.push_back({std::max(logq[p], kLogFloor), child_with(node.state, {p}, tokens)});
    if (runner_up_tokens != nullptr && (*runner_up_log_weight)[p] > kNegInf)
      out.push_back({std::max(logq[p] + (*runner_up_log_weight)[p], kLogFloor),
                     child_with(node.state, {p}, *runner_up_tokens)});
  }
  std::stable_sort(out.begin(), out.end(), [](const Candidate& a, const Candidate& b) { return -a.logp < -b.logp; });
  return out;
}

std::vector<Candidate> set_candidates(const Node& node, const std::vector<double>& member_p, int64_t best,
                                      const std::vector<int64_t>& tokens, int64_t mask_id, int branch,
                                      const std::vector<int64_t>* runner_up_tokens,
                                      const std::vector<double>* runner_up_log_weight, double flip_weight) {
  std::vector<int64_t> masked = masked_positions(node.state, mask_id);
  const size_t n = masked.size();
  const double floor = kLogFloor * static_cast<double>(n);
  std::vector<double> p(n);
  for (size_t i = 0; i < n; ++i) p[i] = std::min(std::max(member_p[masked[i]], 1e-6), 1 - 1e-6);
  std::vector<double> terms(n);
  auto candidate = [&](const std::vector<bool>& s) {
    std::vector<int64_t> chosen;
    for (size_t i = 0; i < n; ++i) {
      terms[i] = s[i] ? std::log(p[i]) : std::log1p(-p[i]);
      if (s[i]) chosen.push_back(masked[i]);
    }
    return Candidate{pairwise_sum(terms.data(), static_cast<int64_t>(n)), child_with(node.state, chosen, tokens)};
  };
  std::vector<bool> base(n);
  bool any = false;
  for (size_t i = 0; i < n; ++i) {
    base[i] = p[i] > 0.5;
    any = any || base[i];
  }
  if (!any)
    for (size_t i = 0; i < n; ++i) base[i] = masked[i] == best;
  const Candidate predicted = candidate(base);
  const size_t alternatives = branch > 1 ? static_cast<size_t>(branch - 1) : 0;
  std::vector<Candidate> flips;
  if (flip_weight > 0) {
    const double log_flip = std::log(flip_weight);
    std::vector<size_t> order(n);
    for (size_t i = 0; i < n; ++i) order[i] = i;
    std::stable_sort(order.begin(), order.end(),
                     [&](size_t a, size_t b) { return std::fabs(p[a] - 0.5) < std::fabs(p[b] - 0.5); });
    for (size_t j : order) {
      if (flips.size() >= alternatives) break;
      std::vector<bool> flipped = base;
      flipped[j] = !flipped[j];
      if (std::find(flipped.begin(), flipped.end(), true) == flipped.end()) continue;
      Candidate c = candidate(flipped);
      c.logp += log_flip;
      flips.push_back(std::move(c));
    }
  }
  std::vector<Candidate> swaps;
  if (runner_up_tokens != nullptr) {
    for (size_t i = 0; i < n; ++i) {
      const int64_t pos = masked[i];
      if (!base[i] || !((*runner_up_log_weight)[pos] > kNegInf)) continue;
      std::vector<int64_t> child = predicted.state;
      child[pos] = (*runner_up_tokens)[pos];
      swaps.push_back({predicted.logp + (*runner_up_log_weight)[pos], std::move(child)});
    }
    std::stable_sort(swaps.begin(), swaps.end(),
                     [](const Candidate& a, const Candidate& b) { return -a.logp < -b.logp; });
  }
  std::vector<Candidate> out = {{std::max(predicted.logp, floor), predicted.state}};
  for (Candidate& c : merged_best_first(flips, swaps, alternatives)) {
    c.logp = std::max(c.logp, floor);
    out.push_back(std::move(c));
  }
  return out;
}

int64_t first_argmax(const std::vector<double>& v) {
  int64_t best = 0;
  for (size_t i = 1; i < v.size(); ++i)
    if (v[i] > v[best]) best = static_cast<int64_t>(i);
  return best;
}

std::vector<std::vector<Candidate>> ConfidenceOrderProposer::propose(const std::vector<Node>& tree,
                                                                     const std::vector<int64_t>& nodes) {
  const RoundInputs& r = round_;
  std::vector<std::vector<Candidate>> out;
  for (int64_t i : nodes) {
    const Node& node = tree[i];
    const StaleView::Coupled& c = r.stale->coupled(node.step);
    const size_t b = node.state.size();
    if (!r.rule.threshold) {
      std::vector<double> score(b);
      bool first = true;
      double lse = kNegInf;
      for (size_t p = 0; p < b; ++p) {
        const bool masked = node.state[p] == r.mask_id;
        score[p] = masked ? sharpness_ * std::log(std::max(c.conf[p], 1e-30)) : kNegInf;
        if (masked) {   // np.logaddexp.reduce over the masked scores, in position order
          lse = first ? score[p] : logaddexp(lse, score[p]);
          first = false;
        }
      }
      std::vector<double> logq(b);
      for (size_t p = 0; p < b; ++p) logq[p] = score[p] - lse;
      out.push_back(position_candidates(node, logq, c.tokens, r.mask_id, branch_));
    } else {
      std::vector<double> member(b), masked_conf(b);
      const double scale = -sharpness_ * 4;
      for (size_t p = 0; p < b; ++p) {
        member[p] = 1.0 / (1.0 + std::exp(scale * (c.conf[p] - r.rule.tau)));
        masked_conf[p] = node.state[p] == r.mask_id ? c.conf[p] : kNegInf;
      }
      out.push_back(set_candidates(node, member, first_argmax(masked_conf), c.tokens, r.mask_id, branch_));
    }
  }
  return out;
}

}  // namespace spot
