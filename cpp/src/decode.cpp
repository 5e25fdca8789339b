#include "decode.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <functional>
#include <limits>
#include <map>
#include <set>

#include "errors.h"
#include "paths.h"
#include "sha256.h"

namespace spot {
namespace {

constexpr double kNegInf = -std::numeric_limits<double>::infinity();
constexpr double kLogFloor = -30.0;                       // proposers.LOG_FLOOR
constexpr double kNpyLogE2 = 0.693147180559945309417232121458176568;   // numpy's NPY_LOGE2
constexpr float kMemberSharpness = 32.0f;                 // drafter.MEMBER_SHARPNESS
constexpr int kTreeBranch = 4;                            // decoders.TREE_BRANCH
constexpr int kDrafterBranch = 4;                         // drafter.DEFAULT_BRANCH
constexpr int64_t kDrafterLookahead = 4;                  // drafter.DEFAULT_LOOKAHEAD
const char* kDrafterOnnx = "drafter.onnx";
const char* kDrafterJson = "drafter.json";
const std::vector<std::string> kDrafterInputs = {"topk", "masked", "stale_conf", "staleness"};
const std::vector<std::string> kDrafterOutputs = {"order_logits", "member_logits"};
const char* kIdentityFields[] = {"vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                                 "num_attention_heads", "num_key_value_heads", "head_dim", "mask_token_id"};

double now_ms() {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// numpy's npy_logaddexp (scalar libm exp / log1p)
double logaddexp(double x, double y) {
  if (x == y) return x + kNpyLogE2;
  const double tmp = x - y;
  if (tmp > 0) return x + std::log1p(std::exp(-tmp));
  if (tmp <= 0) return y + std::log1p(std::exp(tmp));
  return tmp;
}

// drafter.sigmoid: 0.5 * (1 + tanh(x / 2)); the Python runtime calls the C library's tanh too (spot.runtime.libm),
// so both hosts weigh tree candidates alike. The values only order tree candidates, never decide the output.
double sigmoid(double x) { return 0.5 * (1.0 + std::tanh(0.5 * x)); }

std::vector<int64_t> child_with(const std::vector<int64_t>& state, const std::vector<int64_t>& positions,
                                const std::vector<int64_t>& tokens) {
  std::vector<int64_t> child = state;
  for (int64_t p : positions) child[p] = tokens[p];
  return child;
}

// proposers.runner_up_alternatives: log weights log(weight) - gap [B] of the runner-up tokens (-inf: none there, or
// the mask id: that child would equal its parent)
std::vector<double> runner_up_log_weights(const StaleView::RunnerUp& r, double weight, int64_t mask_id) {
  std::vector<double> out(r.gap.size());
  const double log_weight = std::log(weight);
  for (size_t p = 0; p < r.gap.size(); ++p) out[p] = r.tokens[p] == mask_id ? kNegInf : log_weight - r.gap[p];
  return out;
}

// proposers.position_candidates: one child per top-`branch` masked position of logq [B], each followed by the child
// committing its runner-up token when runner_up_tokens is given (weight logq + log weight, skipped at -inf); best
// first, stable
std::vector<Candidate> position_candidates(const Node& node, const std::vector<double>& logq,
                                           const std::vector<int64_t>& tokens, int64_t mask_id, int branch,
                                           const std::vector<int64_t>* runner_up_tokens = nullptr,
                                           const std::vector<double>* runner_up_log_weight = nullptr) {
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

// proposers.set_candidates: the predicted set {P(i in S) > 0.5} (else the best position), then up to branch - 1
// alternatives best first: flips of the least certain positions (log-probability under independence + log
// flip_weight; none at 0) and, given runner-ups, swaps of one member's token for its runner-up (the set's
// log-probability + the runner-up's log weight; skipped at -inf, which runner_up_log_weights gives the mask id)
std::vector<Candidate> set_candidates(const Node& node, const std::vector<double>& member_p, int64_t best,
                                      const std::vector<int64_t>& tokens, int64_t mask_id, int branch,
                                      const std::vector<int64_t>* runner_up_tokens = nullptr,
                                      const std::vector<double>* runner_up_log_weight = nullptr,
                                      double flip_weight = 1.0) {
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

// drafter.masked_log_softmax over one row: log-softmax of logits / temperature at the masked positions, -inf elsewhere
std::vector<double> masked_log_softmax(const float* logits, const std::vector<bool>& masked, double temperature) {
  const size_t b = masked.size();
  std::vector<double> z(b), e(b), out(b);
  double zmax = kNegInf;
  for (size_t i = 0; i < b; ++i) {
    z[i] = masked[i] ? static_cast<double>(logits[i]) / temperature : kNegInf;
    if (z[i] > zmax) zmax = z[i];
  }
  if (!std::isfinite(zmax)) zmax = 0.0;
  for (size_t i = 0; i < b; ++i) e[i] = std::exp(z[i] - zmax);
  const double lse = std::log(pairwise_sum(e.data(), static_cast<int64_t>(b)));
  for (size_t i = 0; i < b; ++i) out[i] = (z[i] - zmax) - lse;
  return out;
}

int64_t first_argmax(const std::vector<double>& v) {
  int64_t best = 0;
  for (size_t i = 1; i < v.size(); ++i)
    if (v[i] > v[best]) best = static_cast<int64_t>(i);
  return best;
}

// -- Python's heapq on (neg logp, counter, kind, payload) tuples: same sift order, so the same pending order -----
struct HeapEntry {
  double neg;
  int64_t counter;
  int kind;          // 0: node awaiting expansion, 1: candidate child
  int64_t payload;   // kind 0: node index; kind 1: index into the candidate store
};

bool heap_less(const HeapEntry& a, const HeapEntry& b) {
  if (a.neg != b.neg) return a.neg < b.neg;   // tuples compare element by element; counters are unique
  return a.counter < b.counter;
}

void sift_down(std::vector<HeapEntry>& h, size_t start, size_t pos) {   // CPython heapq._siftdown
  HeapEntry item = h[pos];
  while (pos > start) {
    size_t parent = (pos - 1) >> 1;
    if (heap_less(item, h[parent])) {
      h[pos] = h[parent];
      pos = parent;
      continue;
    }
    break;
  }
  h[pos] = item;
}

void sift_up(std::vector<HeapEntry>& h, size_t pos) {                  // CPython heapq._siftup
  const size_t end = h.size(), start = pos;
  HeapEntry item = h[pos];
  size_t child = 2 * pos + 1;
  while (child < end) {
    size_t right = child + 1;
    if (right < end && !heap_less(h[child], h[right])) child = right;
    h[pos] = h[child];
    pos = child;
    child = 2 * pos + 1;
  }
  h[pos] = item;
  sift_down(h, start, pos);
}

void heap_push(std::vector<HeapEntry>& h, const HeapEntry& e) {
  h.push_back(e);
  sift_down(h, 0, h.size() - 1);
}

HeapEntry heap_pop(std::vector<HeapEntry>& h) {
  HeapEntry last = h.back();
  h.pop_back();
  if (h.empty()) return last;
  HeapEntry top = h[0];
  h[0] = last;
  sift_up(h, 0);
  return top;
}

void heapify(std::vector<HeapEntry>& h) {
  const size_t n = h.size();
  if (n > 2500) {   // CPython's cache_friendly_heapify for large heaps (a different, equally valid layout)
    size_t m = n >> 1;
    size_t top = 1;
    while ((top << 1) <= m + 1) top <<= 1;
    const size_t leftmost = top - 1, mhalf = m >> 1;
    auto sweep = [&](size_t hi, size_t lo) {
      for (size_t i = hi; i-- > lo;) {
        size_t j = i;
        while (true) {
          sift_up(h, j);
          if (!(j & 1)) break;
          j >>= 1;
        }
      }
    };
    sweep(leftmost, mhalf);
    sweep(m, leftmost);
    return;
  }
  for (size_t i = n / 2; i-- > 0;) sift_up(h, i);
}

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
  HostPassOutputs(std::vector<float> logits, int64_t b, int64_t vocab) : logits_(std::move(logits)), b_(b), v_(vocab) {}
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
  std::vector<float> logits_;
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
                                        const std::vector<int64_t>& steps, const BlockContext& ctx, uint32_t block) {
  const int64_t n = static_cast<int64_t>(steps.size());
  if (!engine.samples_on_device())
    return std::make_unique<HostPassOutputs>(engine.block_logits(states, n), engine.block_size(), engine.vocab());
  return std::make_unique<SampledPassOutputs>(engine.block_samples(states, n, steps, ctx.sampling, block));
}

std::vector<int64_t> standard_block(TargetEngine& engine, std::vector<int64_t> state, uint32_t block,
                                    const BlockContext& ctx) {
  uint32_t step = 0;
  while (has_mask(state, ctx.mask_id)) {
    std::unique_ptr<PassOutputs> out = block_pass(engine, state, {step}, ctx, block);
    ctx.stats->passes["block"] += 1;
    state = out->next_state(0, state, ctx, block, step);
    ++step;
  }
  ctx.stats->steps += step;
  return state;
}

void check_budget(int64_t nodes, int64_t depth, int64_t block_size) {
  if (nodes < 1) fail(SPOT_ERR_INVALID_ARGUMENT, "budget must be >= 1 node, got " + std::to_string(nodes));
  if (depth < 1 || depth > block_size)
    fail(SPOT_ERR_INVALID_ARGUMENT, "depth must be in 1.." + std::to_string(block_size) +
                                        " (the block size), got " + std::to_string(depth));
}

// spot.walk: from the root, follow the child equal to F of the node's fresh outputs (row_of: tree index -> row of
// the verify pass; complete nodes have none)
std::pair<int64_t, std::vector<int64_t>> walk(const std::vector<Node>& tree, const PassOutputs& fresh,
                                              const std::map<int64_t, int64_t>& row_of, const BlockContext& ctx,
                                              uint32_t block) {
  int64_t u = 0;
  while (true) {
    const Node& node = tree[u];
    std::vector<int64_t> nxt = fresh.next_state(row_of.at(u), node.state, ctx, block, node.step);
    int64_t match = -1;
    for (int64_t c : node.children)
      if (tree[c].state == nxt) {
        match = c;
        break;
      }
    if (match < 0) return {u, nxt};
    u = match;
    if (row_of.find(u) == row_of.end()) return {u, tree[u].state};   // complete: the block ends there
  }
}

std::vector<int64_t> spot_block(TargetEngine& engine, std::vector<int64_t> state, uint32_t block,
                                const BlockContext& ctx, Proposer& proposer, int64_t nodes, int64_t depth) {
  check_budget(nodes, depth, engine.block_size());
  DecodeStats& stats = *ctx.stats;
  std::unique_ptr<PassOutputs> last = block_pass(engine, state, {0}, ctx, block);
  int64_t last_row = 0;   // the row of `last` that `state` was seen in
  stats.passes["block"] += 1;
  uint32_t step = 0;
  std::vector<int64_t> root = last->next_state(0, state, ctx, block, step);
  while (has_mask(root, ctx.mask_id)) {
    const double t0 = now_ms();
    std::unique_ptr<StaleView> stale = last->stale(last_row, state, ctx, block, step);
    proposer.begin_round({stale.get(), ctx.rule, ctx.mask_id, block});
    std::vector<Node> tree = build_tree(root, step + 1, proposer, nodes, depth, ctx.mask_id);
    std::map<int64_t, int64_t> row_of;
    std::vector<int64_t> states, steps;
    for (size_t i = 0; i < tree.size(); ++i)
      if (has_mask(tree[i].state, ctx.mask_id)) {
        row_of[static_cast<int64_t>(i)] = static_cast<int64_t>(steps.size());
        states.insert(states.end(), tree[i].state.begin(), tree[i].state.end());
        steps.push_back(tree[i].step);
      }
    const double t1 = now_ms();
    std::unique_ptr<PassOutputs> fresh = block_pass(engine, states, steps, ctx, block);
    const double t2 = now_ms();
    stats.passes["verify"] += 1;
    auto [end, next_root] = walk(tree, *fresh, row_of, ctx, block);
    const double t3 = now_ms();
    stats.draft_ms += t1 - t0;
    stats.target_ms += t2 - t1;
    stats.walk_ms += t3 - t2;
    stats.accepted_per_verify.push_back(tree[end].depth);
    stats.nodes_per_verify.push_back(static_cast<int64_t>(steps.size()));
    state = tree[end].state;
    step = tree[end].step;
    auto it = row_of.find(end);
    if (it != row_of.end()) {   // a complete end node ends the loop: nothing drafts from it
      stale.reset();
      last = std::move(fresh);
      last_row = it->second;
    }
    root = std::move(next_root);
  }
  stats.steps += has_mask(state, ctx.mask_id) ? step + 1 : step;
  return root;
}

}  // namespace

// -- stale view ----------------------------------------------------------------------------------------------------
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

const StaleView::RunnerUp* HostStaleView::runner_up(uint32_t step) {
  const uint32_t key = sampling_.temperature > 0 ? step : 0;
  auto it = runner_up_.find(key);
  if (it != runner_up_.end()) return &it->second;
  const Coupled& c = coupled(step);
  RunnerUp r;
  r.tokens.assign(static_cast<size_t>(b_), -1);
  r.gap.assign(static_cast<size_t>(b_), std::numeric_limits<double>::infinity());
  each_row(step, [&](size_t k, int64_t pos, const NoiseBinsRow* g) {
    runner_up_row(rows_[k], g, sampling_.exclude_token, c.tokens[pos], r.tokens[pos], r.gap[pos]);
  });
  return &runner_up_.emplace(key, std::move(r)).first->second;
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

const StaleView::RunnerUp* SampledStaleView::runner_up(uint32_t step) {
  if (r_.future_runner_up.empty()) return nullptr;
  auto it = runner_up_.find(step);
  if (it != runner_up_.end()) return &it->second;
  const int64_t at = row(step);
  RunnerUp u{masked_row(r_.future_runner_up, at, int64_t{-1}),
             masked_row(r_.future_gap, at, std::numeric_limits<double>::infinity())};
  return &runner_up_.emplace(step, std::move(u)).first->second;
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

// -- tree ----------------------------------------------------------------------------------------------------------
std::vector<Node> build_tree(const std::vector<int64_t>& root_state, uint32_t root_step, Proposer& proposer,
                             int64_t budget, int64_t max_depth, int64_t mask_id) {
  std::vector<Node> tree;
  tree.push_back({root_state, -1, 0, root_step, 0.0, {}});
  int64_t counter = 0;
  std::vector<HeapEntry> heap;
  struct Pending {
    int64_t parent;
    double logp;
    std::vector<int64_t> state;
  };
  std::vector<Pending> store;   // candidate children referenced by heap entries of kind 1
  std::map<int64_t, std::vector<Candidate>> prefetched;   // candidate counter -> its proposals (tree.py's lookahead)
  std::vector<int64_t> key_of = {-1};                     // tree index -> counter of the candidate it came from
  // (state, step) -> tree index: a state reached by two commit orders is one node with two parents (tree.py)
  std::map<std::pair<std::vector<int64_t>, uint32_t>, int64_t> index_of = {{{root_state, root_step}, 0}};
  const int64_t lookahead = proposer.lookahead();
  auto expandable = [&](int64_t depth, const std::vector<int64_t>& state) {
    return depth < max_depth && has_mask(state, mask_id);
  };
  if (expandable(0, root_state)) heap_push(heap, {0.0, counter, 0, 0});
  while (!heap.empty() && static_cast<int64_t>(tree.size()) < budget) {
    HeapEntry top = heap_pop(heap);
    if (top.kind == 0) {
      // every node awaiting expansion goes into one proposer call, in the heap's list order (as tree.py)
      std::vector<int64_t> pending = {top.payload};
      std::vector<HeapEntry> rest;
      for (const HeapEntry& h : heap) {
        if (h.kind == 0) pending.push_back(h.payload);
        else rest.push_back(h);
      }
      heap.swap(rest);
      heapify(heap);
      std::vector<Node> batch;   // the nodes to propose for: pending ones not prefetched, then speculative ones
      std::vector<int64_t> ask, extra;
      for (int64_t i : pending)
        if (!prefetched.count(key_of[static_cast<size_t>(i)])) {
          ask.push_back(i);
          batch.push_back(tree[static_cast<size_t>(i)]);
        }
      const int64_t limit = std::min(lookahead, budget - static_cast<int64_t>(tree.size()));
      if (limit > 0 && !ask.empty()) {   // heapq.nsmallest over the queued candidates
        std::vector<HeapEntry> queued;
        for (const HeapEntry& h : heap)
          if (h.kind == 1) queued.push_back(h);
        const size_t n = std::min(queued.size(), static_cast<size_t>(limit));
        std::partial_sort(queued.begin(), queued.begin() + static_cast<std::ptrdiff_t>(n), queued.end(), heap_less);
        for (size_t j = 0; j < n; ++j) {
          const Pending& c = store[static_cast<size_t>(queued[j].payload)];
          const Node& p = tree[static_cast<size_t>(c.parent)];
          if (prefetched.count(queued[j].counter) || index_of.count({c.state, p.step + 1}) ||
              !expandable(p.depth + 1, c.state))
            continue;   // proposed already, or to be linked to an existing node (never expanded again)
          extra.push_back(queued[j].counter);
          batch.push_back({c.state, c.parent, p.depth + 1, p.step + 1, 0.0, {}});
        }
      }
      std::vector<int64_t> index(batch.size());
      for (size_t j = 0; j < index.size(); ++j) index[j] = static_cast<int64_t>(j);
      std::vector<std::vector<Candidate>> answers;
      if (!batch.empty()) answers = proposer.propose(batch, index);
      std::map<int64_t, size_t> fresh;   // tree index -> its answer
      for (size_t j = 0; j < ask.size(); ++j) fresh[ask[j]] = j;
      for (size_t j = 0; j < extra.size(); ++j) prefetched[extra[j]] = std::move(answers[ask.size() + j]);
      for (int64_t i : pending) {
        std::vector<Candidate> cands;
        auto f = fresh.find(i);
        if (f != fresh.end()) {
          cands = std::move(answers[f->second]);
        } else {
          auto it = prefetched.find(key_of[static_cast<size_t>(i)]);
          cands = std::move(it->second);
          prefetched.erase(it);
        }
        for (Candidate& c : cands) {
          ++counter;
          store.push_back({i, c.logp, std::move(c.state)});
          heap_push(heap, {-(tree[static_cast<size_t>(i)].logp + c.logp), counter, 1,
                           static_cast<int64_t>(store.size() - 1)});
        }
      }
      continue;
    }
    Pending& c = store[static_cast<size_t>(top.payload)];
    const Node& p = tree[static_cast<size_t>(c.parent)];
    const int64_t depth = p.depth + 1;
    auto known = index_of.find({c.state, p.step + 1});
    if (known != index_of.end()) {   // reached before by another commit order: link it, verify it once
      std::vector<int64_t>& siblings = tree[static_cast<size_t>(c.parent)].children;
      if (std::find(siblings.begin(), siblings.end(), known->second) == siblings.end())
        siblings.push_back(known->second);
      continue;
    }
    index_of[{c.state, p.step + 1}] = static_cast<int64_t>(tree.size());
    Node child{std::move(c.state), c.parent, depth, p.step + 1, p.logp + c.logp, {}};
    tree.push_back(std::move(child));
    const int64_t idx = static_cast<int64_t>(tree.size()) - 1;
    key_of.push_back(top.counter);
    tree[static_cast<size_t>(c.parent)].children.push_back(idx);
    if (expandable(depth, tree.back().state)) {
      ++counter;
      heap_push(heap, {top.neg, counter, 0, idx});
    }
  }
  return tree;
}

// -- proposers -----------------------------------------------------------------------------------------------------
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

std::unique_ptr<Drafter> Drafter::load(const std::string& path_in) {
  std::string onnx_path, json_path;
  if (is_dir(path_in)) {
    onnx_path = join(path_in, kDrafterOnnx);
    json_path = join(path_in, kDrafterJson);
  } else {
    onnx_path = path_in;
    json_path = join(parent_dir(path_in), kDrafterJson);
  }
  if (!is_file(onnx_path))
    fail(SPOT_ERR_NOT_FOUND, "drafter model " + onnx_path + " does not exist: train one with `spot train-drafter`, "
                                                            "or pass the folder that holds drafter.onnx");
  if (!is_file(json_path))
    fail(SPOT_ERR_NOT_FOUND, "drafter manifest " + json_path + " does not exist (it belongs beside drafter.onnx)");
  auto d = std::make_unique<Drafter>();
  d->path = onnx_path;
  Json m;
  try {
    m = Json::parse(read_text_file(json_path));
  } catch (const SpotException& e) {
    fail(SPOT_ERR_CORRUPT, json_path + " is not valid JSON (" + e.what() + "): re-export the drafter");
  }
  const Json* fmt = m.find("format");
  if (fmt == nullptr || !fmt->is_string() || fmt->str() != "spot-drafter")
    fail(SPOT_ERR_CORRUPT, json_path + " is not a spot drafter manifest (format is not 'spot-drafter')");
  const Json* ver = m.find("format_version");
  if (ver == nullptr || !ver->is_number() || ver->integer() != 1)
    fail(SPOT_ERR_INCOMPATIBLE, json_path + " has a format_version this host does not read (expected 1)");
  for (const char* key : {"block_size", "target", "onnx_sha256"})
    if (!m.has(key))
      fail(SPOT_ERR_CORRUPT, json_path + " lacks '" + key + "': re-export the drafter with `spot train-drafter`");
  try {
    d->block_size = m.at("block_size").integer();
    d->target = m.at("target");
    d->target.members();
    if (const Json* t = m.find("member_threshold"); t && !t->is_null()) d->member_threshold = t->number();
    if (const Json* t = m.find("max_staleness"); t && !t->is_null()) d->max_staleness = t->integer();
    if (const Json* t = m.find("tau"); t && !t->is_null()) d->tau = t->number();
    if (const Json* t = m.find("order_temperature"); t && !t->is_null()) {
      d->order_temperature = t->number();
      if (!std::isfinite(d->order_temperature) || d->order_temperature <= 0)
        fail(SPOT_ERR_CORRUPT, "order_temperature is " + std::to_string(d->order_temperature) +
                                   ", expected a number > 0 (1 = the order model's own logits)");
    }
    if (const Json* t = m.find("runner_up_weight"); t && !t->is_null()) {
      d->runner_up_weight = t->number();
      if (!(d->runner_up_weight >= 0 && d->runner_up_weight <= 1))
        fail(SPOT_ERR_CORRUPT, "runner_up_weight is " + std::to_string(d->runner_up_weight) +
                                   ", expected a number in [0, 1] (0 = no runner-up children)");
    }
    if (const Json* t = m.find("set_flip_weight"); t && !t->is_null()) {
      d->set_flip_weight = t->number();
      if (!(d->set_flip_weight >= 0 && d->set_flip_weight <= 1))
        fail(SPOT_ERR_CORRUPT, "set_flip_weight is " + std::to_string(d->set_flip_weight) +
                                   ", expected a number in [0, 1] (0 = no flip variants)");
    }
    const std::string digest = sha256_file(onnx_path);
    if (digest != m.at("onnx_sha256").str())
      fail(SPOT_ERR_CORRUPT, onnx_path + " does not match its manifest (sha256 " + digest.substr(0, 12) +
                                 "...): the file was changed or truncated: re-export it");
  } catch (const SpotException& e) {
    if (e.code() != SPOT_ERR_CORRUPT) throw;
    std::string what = e.what();
    if (what.rfind(onnx_path, 0) == 0) throw;
    fail(SPOT_ERR_CORRUPT, json_path + ": " + what);
  }
  const double p = std::min(std::max(d->member_threshold, 1e-6), 1 - 1e-6);
  d->member_offset = std::log(p) - std::log1p(-p);   // drafter.logit
  SessionConfig sc;
  sc.intra_threads = 1;
  sc.single_inter_thread = true;
  d->session_ = std::make_unique<OrtSessionHandle>(onnx_path, sc);
  // a graph reads some of the four inputs (a drafter exported as its baseline skips reads masked and stale_conf)
  const std::vector<std::string>& names = d->session_->input_names();
  for (const std::string& n : names)    // (ONNX input names are unique)
    if (std::find(kDrafterInputs.begin(), kDrafterInputs.end(), n) == kDrafterInputs.end())
      fail(SPOT_ERR_INCOMPATIBLE, "drafter " + onnx_path + " has an input '" + n + "', expected some of topk, "
                                                           "masked, stale_conf, staleness: re-export it with "
                                                           "`spot train-drafter`");
  if (names.empty())
    fail(SPOT_ERR_INCOMPATIBLE, "drafter " + onnx_path + " has no inputs, expected some of topk, masked, "
                                                         "stale_conf, staleness: re-export it with "
                                                         "`spot train-drafter`");
  d->reads_topk = std::find(names.begin(), names.end(), "topk") != names.end();
  return d;
}

void Drafter::check_compatible(int64_t engine_block, const ModelFacts& cfg) const {
  if (engine_block != block_size)
    fail(SPOT_ERR_INCOMPATIBLE, "drafter " + path + " was trained for block size " + std::to_string(block_size) +
                                    ", got a model decoding blocks of " + std::to_string(engine_block) +
                                    ": expected " + std::to_string(block_size) +
                                    " (train a drafter for this block size with `spot traces` + "
                                    "`spot train-drafter`)");
  const int64_t got[] = {cfg.vocab_size, cfg.hidden_size, cfg.intermediate_size, cfg.num_hidden_layers,
                         cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim, cfg.mask_token_id};
  for (size_t i = 0; i < sizeof(kIdentityFields) / sizeof(kIdentityFields[0]); ++i) {
    const Json* want = target.find(kIdentityFields[i]);
    if (want == nullptr) continue;
    if (!want->is_number() || want->integer() != got[i])
      fail(SPOT_ERR_INCOMPATIBLE, "drafter " + path + " was trained for another target: " + kIdentityFields[i] +
                                      " is " + std::to_string(got[i]) + " in the model, expected " +
                                      (want->is_number() ? std::to_string(want->integer()) : "?") +
                                      " (use the drafter shipped with this model)");
  }
}

void Drafter::run(const std::vector<float>& topk, const std::vector<float>& masked,
                  const std::vector<float>& stale_conf, const std::vector<int64_t>& staleness, int64_t k, int64_t b,
                  std::vector<float>& order, std::vector<float>& member) {
  const std::map<std::string, InputTensor> all = {
      {"topk", {ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT, {k, b, kTopkFeatures}, topk.data(), topk.size() * sizeof(float)}},
      {"masked", {ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT, {k, b}, masked.data(), masked.size() * sizeof(float)}},
      {"stale_conf",
       {ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT, {k, b}, stale_conf.data(), stale_conf.size() * sizeof(float)}},
      {"staleness", {ONNX_TENSOR_ELEMENT_DATA_TYPE_INT64, {k}, staleness.data(), staleness.size() * sizeof(int64_t)}},
  };
  std::vector<InputTensor> in;
  for (const std::string& n : session_->input_names()) in.push_back(all.at(n));   // the graph's inputs, in order
  std::vector<OrtOutput> out = session_->run(session_->input_names(), in, kDrafterOutputs);
  const std::vector<int64_t> want = {k, b};
  for (const OrtOutput& o : out)
    if (o.shape() != want || o.type() != ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT)
      fail(SPOT_ERR_RUNTIME, "drafter " + path + " returned outputs of an unexpected shape or type");
  const float* po = static_cast<const float*>(out[0].data());
  const float* pm = static_cast<const float*>(out[1].data());
  order.assign(po, po + k * b);
  member.assign(pm, pm + k * b);
}

std::vector<std::vector<Candidate>> DrafterProposer::propose(const std::vector<Node>& tree,
                                                             const std::vector<int64_t>& nodes) {
  if (nodes.empty()) return {};
  const RoundInputs& r = round_;
  const int64_t k = static_cast<int64_t>(nodes.size());
  const int64_t b = static_cast<int64_t>(tree[nodes[0]].state.size());
  std::vector<float> topk, masked(static_cast<size_t>(k * b)), stale_conf(static_cast<size_t>(k * b));
  std::vector<int64_t> staleness(static_cast<size_t>(k));
  if (drafter_.reads_topk) {   // else never computed: the graph does not read it
    const std::vector<float>& topk_row = r.stale->topk_logprobs();
    topk.reserve(static_cast<size_t>(k * b * kTopkFeatures));
    for (int64_t j = 0; j < k; ++j) topk.insert(topk.end(), topk_row.begin(), topk_row.end());
  }
  for (int64_t j = 0; j < k; ++j) {
    const Node& node = tree[nodes[j]];
    const StaleView::Coupled& c = r.stale->coupled(node.step);
    for (int64_t p = 0; p < b; ++p) {
      const bool m = node.state[p] == r.mask_id;
      masked[j * b + p] = m ? 1.0f : 0.0f;
      stale_conf[j * b + p] = m ? static_cast<float>(c.conf[p]) : 0.0f;
    }
    staleness[j] = std::min<int64_t>(std::max<int64_t>(node.depth + 1, 1), drafter_.max_staleness);
  }
  std::vector<float> order, member;
  drafter_.run(topk, masked, stale_conf, staleness, k, b, order, member);
  std::vector<std::vector<Candidate>> out;
  for (int64_t j = 0; j < k; ++j) {
    const Node& node = tree[nodes[j]];
    const StaleView::Coupled& c = r.stale->coupled(node.step);
    std::vector<bool> mrow(static_cast<size_t>(b));
    for (int64_t p = 0; p < b; ++p) mrow[p] = masked[j * b + p] > 0;
    std::vector<double> logq = masked_log_softmax(order.data() + j * b, mrow, drafter_.order_temperature);
    const StaleView::RunnerUp* up = drafter_.runner_up_weight > 0 ? r.stale->runner_up(node.step) : nullptr;
    const std::vector<double> log_weight = up ? runner_up_log_weights(*up, drafter_.runner_up_weight, r.mask_id)
                                              : std::vector<double>();
    const std::vector<int64_t>* up_tokens = up ? &up->tokens : nullptr;
    const std::vector<double>* up_weight = up ? &log_weight : nullptr;
    if (!r.rule.threshold) {
      out.push_back(position_candidates(node, logq, c.tokens, r.mask_id, branch_, up_tokens, up_weight));
      continue;
    }
    const int64_t best = first_argmax(logq);   // where the threshold rule falls back to one commit
    std::vector<double> member_p(static_cast<size_t>(b));
    const bool learned_tau = !drafter_.tau || std::fabs(r.rule.tau - *drafter_.tau) < 1e-9;
    for (int64_t p = 0; p < b; ++p) {
      if (learned_tau) {
        member_p[p] = sigmoid(static_cast<double>(member[j * b + p]) - drafter_.member_offset);
      } else {   // float32 arithmetic, as numpy does on the float32 feature array
        const float x = kMemberSharpness * (stale_conf[j * b + p] - static_cast<float>(r.rule.tau));
        member_p[p] = sigmoid(static_cast<double>(x));
      }
    }
    out.push_back(set_candidates(node, member_p, best, c.tokens, r.mask_id, branch_, up_tokens, up_weight,
                                 drafter_.set_flip_weight));
  }
  return out;
}

// -- generate (decode.py) + decoders by name (decoders.py) --------------------------------------------------------
Generation run_decoder(TargetEngine& engine, const ModelFacts& cfg, Drafter* drafter,
                       const std::vector<int64_t>& prompt, const DecodeRequest& req) {
  const double t_start = now_ms();
  const std::string& name = req.decoder;
  static const std::set<std::string> kNames = {"standard", "threshold", "chain", "tree", "spot", "spot-sets"};
  if (name == "oracle" || name == "order-oracle")
    fail(SPOT_ERR_UNSUPPORTED, "the " + name + " decoder (a diagnostic that needs a standard run first) is not in the "
                               "C++ host: use the Python runtime");
  if (!kNames.count(name))
    fail(SPOT_ERR_INVALID_ARGUMENT, "unknown decoder '" + name + "', expected one of standard, threshold, chain, "
                                                                 "tree, spot, spot-sets");
  if (!std::isfinite(req.temperature) || req.temperature < 0)
    fail(SPOT_ERR_INVALID_ARGUMENT, "temperature must be a finite number >= 0, got " +
                                        std::to_string(req.temperature));
  CommitRule rule;
  rule.tau = req.tau;
  // decoders.rule_for: threshold / spot-sets always use the threshold rule, every other decoder the request's mode
  rule.threshold = name == "threshold" || name == "spot-sets" || req.threshold_mode;
  if (rule.threshold && !(req.tau >= 0.0 && req.tau < 1.0))
    fail(SPOT_ERR_INVALID_ARGUMENT, "tau must be in [0, 1), got " + std::to_string(req.tau));
  const int64_t b = engine.block_size();
  std::unique_ptr<Proposer> proposer;
  int64_t nodes = req.budget, depth = req.depth;
  if (name != "standard" && name != "threshold") {
    check_budget(req.budget, req.depth, b);
    if (name == "chain") {
      proposer = std::make_unique<ConfidenceOrderProposer>(1);
      nodes = req.depth + 1;   // a chain: one node per depth
    } else if (name == "tree") {
      proposer = std::make_unique<ConfidenceOrderProposer>(kTreeBranch);
    } else {
      if (drafter == nullptr)
        fail(SPOT_ERR_INVALID_ARGUMENT, "decoder '" + name + "' needs a drafter (order model): open the model "
                                                             "with a drafter folder, or use a folder that ships "
                                                             "drafter.onnx + drafter.json");
      drafter->check_compatible(b, cfg);
      proposer = std::make_unique<DrafterProposer>(*drafter, kDrafterBranch, kDrafterLookahead);
    }
  }
  if (engine.samples_on_device()) {   // what the sampling epilogue serves (epilogue.check_sampling, spot.py)
    if (req.top_p < 1.0)
      fail(SPOT_ERR_UNSUPPORTED, "the device sampling epilogue does not implement top-p (got top_p " +
                                     std::to_string(req.top_p) + "): use top_p 1 with it, or the host sampler");
    if (proposer && nodes > 1 && depth > engine.sampler_depth())
      fail(SPOT_ERR_INVALID_ARGUMENT, "tree depth " + std::to_string(depth) + " exceeds the " +
                                          std::to_string(engine.sampler_depth()) + " future steps the device " +
                                          "sampling epilogue computes: use depth <= " +
                                          std::to_string(engine.sampler_depth()) + ", or re-export with more " +
                                          "--epilogue-steps, or use the host sampler");
  }
  // generate(): the request checks of decode.check_request
  for (int64_t t : prompt)
    if (t < 0 || t >= cfg.vocab_size)
      fail(SPOT_ERR_INVALID_ARGUMENT, "prompt token id " + std::to_string(t) + " is outside the vocabulary [0, " +
                                          std::to_string(cfg.vocab_size) +
                                          "): the ids do not belong to this model's tokenizer");
  for (int64_t t : prompt)
    if (t == cfg.mask_token_id)
      fail(SPOT_ERR_INVALID_ARGUMENT, "the prompt contains the mask token id " + std::to_string(cfg.mask_token_id) +
                                          ": remove <|MASK|> from the prompt, it marks undecided positions");
  if (req.max_new_tokens < 1)
    fail(SPOT_ERR_INVALID_ARGUMENT, "max_new_tokens must be >= 1, got " + std::to_string(req.max_new_tokens));
  const int64_t p = static_cast<int64_t>(prompt.size());
  const int64_t n_blocks = (p + req.max_new_tokens + b - 1) / b;
  if (n_blocks * b > engine.max_context())
    fail(SPOT_ERR_INVALID_ARGUMENT, "prompt (" + std::to_string(p) + " tokens) + max_new_tokens (" +
                                        std::to_string(req.max_new_tokens) + ") needs " +
                                        std::to_string(n_blocks * b) + " positions, more than the model's limit of " +
                                        std::to_string(engine.max_context()));
  const std::vector<int64_t> stop = req.stop_ids ? *req.stop_ids : cfg.stop_ids;
  Generation gen;
  Sampling sampling;
  sampling.temperature = req.temperature;
  sampling.seed = req.seed;
  sampling.exclude_token = cfg.mask_token_id;   // never commit the mask id itself
  sampling.top_k = req.top_k;
  sampling.top_p = req.top_p;
  NoiseRows noise(req.seed, cfg.vocab_size);
  BlockContext ctx{rule, sampling, cfg.mask_token_id, &gen.stats, &noise};
  const int64_t first = p / b;
  engine.prefill(std::vector<int64_t>(prompt.begin(), prompt.begin() + first * b));
  if (first) gen.stats.passes["prefill"] += 1;
  for (int64_t block = first; block < n_blocks; ++block) {
    std::vector<int64_t> state(static_cast<size_t>(b), cfg.mask_token_id);
    const int64_t lead = std::max<int64_t>(0, p - block * b);
    for (int64_t i = 0; i < lead; ++i) state[i] = prompt[block * b + i];
    noise.start_block(static_cast<uint32_t>(block));
    // a one-node tree is its root alone: one standard step per round (spot.SpotBlockDecoder does the same)
    state = proposer && nodes > 1
                ? spot_block(engine, state, static_cast<uint32_t>(block), ctx, *proposer, nodes, depth)
                : standard_block(engine, state, static_cast<uint32_t>(block), ctx);
    engine.store(state);
    gen.stats.passes["store"] += 1;
    gen.stats.blocks += 1;
    bool hit = false;
    for (int64_t i = lead; i < b; ++i) {
      gen.token_ids.push_back(state[i]);
      hit |= std::find(stop.begin(), stop.end(), state[i]) != stop.end();
    }
    if (hit) {
      gen.stopped = true;
      break;
    }
  }
  if (gen.stopped) {
    auto it = std::find_if(gen.token_ids.begin(), gen.token_ids.end(),
                           [&](int64_t t) { return std::find(stop.begin(), stop.end(), t) != stop.end(); });
    gen.token_ids.erase(it, gen.token_ids.end());
  }
  gen.stats.seconds = (now_ms() - t_start) / 1e3;
  return gen;
}

}  // namespace spot
