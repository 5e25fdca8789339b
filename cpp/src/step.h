// The noise (docs/noise.md) and the step function F (docs/spec.md §3), bit-identical to spot/runtime/noise.py +
// step.py.
//
// Bit-identity rests on: the same IEEE float64 operations in the same order (no FMA contraction: the build uses
// -ffp-contract=off), glibc's exp / log / log1p (what numpy calls for float64 on x86-64 glibc), and numpy's
// pairwise summation order for the softmax denominators.
#pragma once

#include <cstdint>
#include <unordered_map>
#include <vector>

namespace spot {

// -- noise ---------------------------------------------------------------------------------------------------------
uint32_t mix32(uint32_t x);
uint32_t lane_prefix(uint32_t lane, uint32_t seed, uint32_t block, uint32_t step, uint32_t position);
double uniform_from_words(uint32_t a, uint32_t b);
double gumbel(uint32_t seed, uint32_t block, uint32_t step, uint32_t position, uint32_t token);

// -- numpy's float64 add.reduce over a contiguous row --------------------------------------------------------------
double pairwise_sum(const double* a, int64_t n);

// -- F ---------------------------------------------------------------------------------------------------------------
struct Sampling {
  double temperature = 0.0;
  uint32_t seed = 0;
  int64_t exclude_token = -1;   // the mask id: never sampled (removed from the argmax only)
  int64_t top_k = 0;            // 0 disables; filters the sample only, never the confidence (T > 0)
  double top_p = 1.0;           // 1 disables; applied after top-k (T > 0)
};

struct CommitRule {
  bool threshold = false;       // false: static (one commit per step)
  double tau = 0.9;
};

// Candidate sampling (docs/noise.md, spot/runtime/gumbel_max.py): a uniform's top kBinBits bits are its lane-A
// word's, so one hash per token gives a bin whose bound caps the token's Gumbel value; only tokens whose bound can
// reach a row's level get their exact value (two glibc logs), ~20 per row. The answers are the definition's.
constexpr int kBinBits = 10;
// bound[j] >= the Gumbel value of every uniform in bin j (the value at the bin's largest uniform, + 2^-40 relative)
const std::vector<double>& gumbel_bounds();

// The noise of one (step, position): every token's bin, and its exact value on demand.
struct NoiseBinsRow {
  const uint16_t* bins = nullptr;   // [vocab]
  uint32_t prefix_a = 0, prefix_b = 0;
  double exact(int64_t token) const;   // == gumbel(seed, block, step, position, token)
};

// The bins of one block, cached by (step, position): a SPOT round samples the same rows for the stale view and for
// the walk, and later rounds revisit steps of earlier trees. Bounded: beyond max_bins nothing more is cached.
class NoiseRows {
 public:
  NoiseRows(uint32_t seed, int64_t vocab, int64_t max_bins = int64_t(1) << 27)
      : seed_(seed), vocab_(vocab), max_bins_(max_bins) {}
  void start_block(uint32_t block);                 // forget the rows of the previous block
  NoiseBinsRow row(uint32_t step, uint32_t position, std::vector<uint16_t>& scratch);

 private:
  uint32_t seed_;
  int64_t vocab_;
  int64_t max_bins_;
  uint32_t block_ = 0;
  int64_t cached_ = 0;
  std::unordered_map<uint64_t, std::vector<uint16_t>> rows_;
};

// The noise of one position and step: the block's cached bins when `noise` is given, else computed into `scratch`
// (which the returned row then points into).
NoiseBinsRow noise_row(NoiseRows* noise, uint32_t seed, uint32_t block, uint32_t step, uint32_t position,
                       int64_t vocab, std::vector<uint16_t>& scratch);

// One logits row scaled for sampling: z = L / T (L at T = 0) in float64, its maximum and the softmax denominator
// sum(exp(z - max)) in numpy's order, and the row's sampling level. A stale view samples the same rows at many
// steps: only the noise changes.
struct ScaledRow {
  std::vector<double> z;
  std::vector<double> z_sample;   // z after top-k / top-p filtering (-inf = filtered); empty: no filtering
  double zmax = 0.0;
  double denom = 0.0;
  // candidate sampling (T > 0): top = argmax of the samplable scores (the exclude token out; ties: smallest id);
  // level = logsumexp of the other samplable tokens - 3 (-inf where that sum underflows: every token a candidate);
  // threshold = level less a rounding margin; single: no other token can be sampled (the answer is top)
  int64_t top = 0;
  double level = 0.0, threshold = 0.0;
  bool single = false;
};
void scale_row(const float* row, int64_t vocab, const Sampling& sampling, ScaledRow& out);
// Top-k then top-p filtering of one scaled row (spot.runtime.step.filter_scaled_logits): top-k keeps every value
// >= the k-th largest (ties kept); top-p keeps the shortest prefix of the order (value descending, id ascending)
// whose probability mass exceeds p (the token crossing p is the last kept), the first token always.
void filter_row(const std::vector<double>& z, int64_t top_k, double top_p, std::vector<double>& out);
// argmax of z_sample + g (z + g without filtering; no noise at T = 0: g null) without `exclude` (ties: smallest
// id); conf = exp(z_x - max) / denom from the unfiltered row
void sample_row(const ScaledRow& r, const NoiseBinsRow* g, int64_t exclude, int64_t& token, double& conf);

// step.top2_scaled's runner-up for one row: the argmax of the same scores without `exclude` and `winner` (ties:
// smallest id), and gap = score(winner) - score(runner-up) (token -1 and gap inf when no other token can be sampled)
void runner_up_row(const ScaledRow& r, const NoiseBinsRow* g, int64_t exclude, int64_t winner, int64_t& token,
                   double& gap);

// Sample tokens and confidences at `positions` of one state: logits [B, V] float32 (row-major).
// tokens[k], conf[k] for positions[k]: conf = softmax(L/T)[x] (softmax(L) at T = 0), float64.
void sample_positions(const float* logits, int64_t vocab, const std::vector<int64_t>& positions,
                      const Sampling& sampling, uint32_t block, uint32_t step, NoiseRows* noise,
                      std::vector<int64_t>& tokens, std::vector<double>& conf);

// Indices into conf (masked positions in ascending order) that the rule commits.
std::vector<int64_t> select_commits(const std::vector<double>& conf, const CommitRule& rule);

// The commit half of F (step.commit_samples): state [B]; masked [K] its masked positions (ascending); tokens [K],
// conf [K] the samples of F's step there (sample_positions', or the device epilogue's, equal bit for bit).
std::vector<int64_t> commit_samples(const std::vector<int64_t>& state, const std::vector<int64_t>& masked,
                                    const std::vector<int64_t>& tokens, const std::vector<double>& conf,
                                    const CommitRule& rule);

// F_step(state): state [B] with mask_id at undecided positions, logits [B, V].
std::vector<int64_t> step_fn(const std::vector<int64_t>& state, const float* logits, int64_t vocab, int64_t mask_id,
                             const CommitRule& rule, const Sampling& sampling, uint32_t block, uint32_t step,
                             NoiseRows* noise);

std::vector<int64_t> masked_positions(const std::vector<int64_t>& state, int64_t mask_id);
bool has_mask(const std::vector<int64_t>& state, int64_t mask_id);

}  // namespace spot
