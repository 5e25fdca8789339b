#include "drafter.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>

#include "bounds.h"
#include "errors.h"
#include "paths.h"
#include "proposers.h"
#include "schema.h"
#include "sha256.h"

namespace spot {
namespace {

// drafter.json's fields the host reads, as spot.runtime.drafter.DRAFTER_FILE checks them
const schema::Field& drafter_fields() {
  using namespace schema;
  static const Field kField = [] {
    std::vector<std::pair<std::string, Field>> target = {
        {"vocab_size", integer(1, kMaxVocab)},         {"hidden_size", integer(1, kMaxHidden)},
        {"intermediate_size", integer(1, kMaxIntermediate)}, {"num_hidden_layers", integer(1, kMaxLayers)},
        {"num_attention_heads", integer(1, kMaxHeads)}, {"num_key_value_heads", integer(1, kMaxHeads)},
        {"head_dim", integer(1, kMaxHeadDim)},          {"mask_token_id", integer(0, kMaxVocab - 1)}};
    const Field unit = number(0, 1);
    return record({{"block_size", integer(1, kMaxDrafterBlock)},
                   {"target", record(target, {}, "an object of the target's facts")},
                   {"onnx_sha256", sha256()},
                   {"member_threshold", nullable(number(0, 1, true, true))},
                   {"max_staleness", nullable(integer(1, kMaxStaleness))},
                   {"tau", nullable(number(0, 1, false, true))},
                   {"order_temperature", nullable(number(0, HUGE_VAL, true))},
                   {"runner_up_weight", nullable(unit)},
                   {"set_flip_weight", nullable(unit)},
                   {"tree_shapes", nullable(list_of(record({{"nodes", integer(1, kMaxNodes)},
                                                            {"branch", integer(1, kMaxDrafterBlock)},
                                                            {"depth", integer(1, kMaxDrafterBlock)},
                                                            {"order_temperature", number(0, HUGE_VAL, true)},
                                                            {"runner_up_weight", unit},
                                                            {"stale_top_bonus", number(0, kMaxStaleTopBonus)}},
                                                           {"nodes", "branch", "depth", "order_temperature",
                                                            "runner_up_weight", "stale_top_bonus"},
                                                           "a tree shape", true),
                                                    kMaxTreeShapes))}},
                  {"block_size", "target", "onnx_sha256"}, "an object");
  }();
  return kField;
}

constexpr double kNegInf = -std::numeric_limits<double>::infinity();
constexpr float kMemberSharpness = 32.0f;                 // drafter.MEMBER_SHARPNESS
const char* kDrafterOnnx = "drafter.onnx";
const char* kDrafterJson = "drafter.json";
const std::vector<std::string> kDrafterInputs = {"topk", "masked", "stale_conf", "staleness"};
const std::vector<std::string> kDrafterOutputs = {"order_logits", "member_logits"};
const char* kIdentityFields[] = {"vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                                 "num_attention_heads", "num_key_value_heads", "head_dim", "mask_token_id"};

// drafter.sigmoid: 0.5 * (1 + tanh(x / 2)); the Python runtime calls the C library's tanh too (spot.runtime.libm),
// so both hosts weigh tree candidates alike. The values only order tree candidates, never decide the output.
double sigmoid(double x) { return 0.5 * (1.0 + std::tanh(0.5 * x)); }

// drafter.masked_log_softmax over one row: log-softmax of logits / temperature (+ bonus at position `at`, none when
// at < 0) at the masked positions, -inf elsewhere
std::vector<double> masked_log_softmax(const float* logits, const std::vector<bool>& masked, double temperature,
                                       int64_t at = -1, double bonus = 0.0) {
  const size_t b = masked.size();
  std::vector<double> z(b), e(b), out(b);
  double zmax = kNegInf;
  for (size_t i = 0; i < b; ++i) {
    double x = static_cast<double>(logits[i]) / temperature;
    if (static_cast<int64_t>(i) == at) x = x + bonus;
    z[i] = masked[i] ? x : kNegInf;
    if (z[i] > zmax) zmax = z[i];
  }
  if (!std::isfinite(zmax)) zmax = 0.0;
  for (size_t i = 0; i < b; ++i) e[i] = std::exp(z[i] - zmax);
  const double lse = std::log(pairwise_sum(e.data(), static_cast<int64_t>(b)));
  for (size_t i = 0; i < b; ++i) out[i] = (z[i] - zmax) - lse;
  return out;
}

}  // namespace

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
  if (ver == nullptr || !ver->is_integer() || ver->integer() != 1)
    fail(SPOT_ERR_INCOMPATIBLE, json_path + " has a format_version this host does not read (expected 1)");
  for (const char* key : {"block_size", "target", "onnx_sha256"})
    if (!m.has(key))
      fail(SPOT_ERR_CORRUPT, json_path + " lacks '" + key + "': re-export the drafter with `spot train-drafter`");
  try {   // every field the host reads, its type and range (drafter.DRAFTER_FILE); null: an optional one's default
    drafter_fields().check(m);
  } catch (const schema::Mismatch& e) {
    fail(SPOT_ERR_CORRUPT, e.message("drafter " + json_path) + " (re-export it with `spot train-drafter`, or fix the "
                                                                "field: `spot calibrate-drafter` writes the tree "
                                                                "settings)");
  }
  auto setting = [&](const char* key, double fallback) {
    const Json* t = m.find(key);
    return t && !t->is_null() ? t->number() : fallback;
  };
  d->block_size = m.at("block_size").integer();
  d->target = m.at("target");
  d->member_threshold = setting("member_threshold", 0.5);
  if (const Json* t = m.find("max_staleness"); t && !t->is_null()) d->max_staleness = t->integer();
  if (const Json* t = m.find("tau"); t && !t->is_null()) d->tau = t->number();
  d->order_temperature = setting("order_temperature", 1.0);
  d->runner_up_weight = setting("runner_up_weight", d->runner_up_weight);
  d->set_flip_weight = setting("set_flip_weight", d->set_flip_weight);
  if (const Json* t = m.find("tree_shapes"); t && !t->is_null())
    for (const Json& e : t->items())
      d->tree_shapes.push_back({e.at("nodes").integer(),
                                {static_cast<int>(e.at("branch").integer()), e.at("depth").integer(),
                                 e.at("order_temperature").number(), e.at("runner_up_weight").number(),
                                 e.at("stale_top_bonus").number()}});
  const std::string digest = sha256_file(onnx_path);
  if (digest != m.at("onnx_sha256").str())
    fail(SPOT_ERR_CORRUPT, onnx_path + " does not match its manifest (sha256 " + digest.substr(0, 12) +
                               "...): drafter.onnx and drafter.json are not one pair (a file changed or truncated, "
                               "or a `spot train-drafter` interrupted between them): run it again, or copy the "
                               "pair again");
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
    if (want == nullptr)   // a drafter that does not say which target it fits fits none (drafter.check_compatible)
      fail(SPOT_ERR_CORRUPT, "drafter " + path + "'s drafter.json names no target " + kIdentityFields[i] +
                                 " (re-export the drafter with `spot train-drafter`)");
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

TreeShape Drafter::shape_for(int64_t nodes) const {
  const std::pair<int64_t, TreeShape>* best = nullptr;
  for (const auto& e : tree_shapes)
    if (e.first <= nodes && (best == nullptr || e.first > best->first)) best = &e;
  if (best != nullptr) return best->second;
  return {kDrafterBranch, 0, order_temperature, runner_up_weight, 0.0};
}

std::vector<std::vector<Candidate>> DrafterProposer::propose(const std::vector<Node>& tree,
                                                             const std::vector<int64_t>& nodes) {
  const TreeShape& s = shape();
  auto grows = [&](int64_t i) { return s.depth == 0 || tree[static_cast<size_t>(i)].depth < s.depth; };
  std::vector<int64_t> asked;   // the shape's depth: a node there gets no children
  for (int64_t i : nodes)
    if (grows(i)) asked.push_back(i);
  std::vector<std::vector<Candidate>> answers = asked.empty() ? std::vector<std::vector<Candidate>>()
                                                              : candidates(tree, asked, s);
  std::vector<std::vector<Candidate>> out;
  size_t next = 0;
  for (int64_t i : nodes) out.push_back(grows(i) ? std::move(answers[next++]) : std::vector<Candidate>());
  return out;
}

std::vector<std::vector<Candidate>> DrafterProposer::candidates(const std::vector<Node>& tree,
                                                                const std::vector<int64_t>& nodes,
                                                                const TreeShape& shape) {
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
    int64_t top = -1;   // drafter.stale_top_bonus: the most confident stale masked position (the first of equals)
    if (shape.stale_top_bonus > 0) {
      std::vector<double> masked_conf(static_cast<size_t>(b));
      for (int64_t p = 0; p < b; ++p) masked_conf[p] = mrow[p] ? c.conf[p] : kNegInf;
      top = first_argmax(masked_conf);
    }
    std::vector<double> logq =
        masked_log_softmax(order.data() + j * b, mrow, shape.order_temperature, top, shape.stale_top_bonus);
    const StaleView::RunnerUp* up = shape.runner_up_weight > 0 ? &r.stale->runner_up(node.step) : nullptr;
    const std::vector<double> log_weight = up ? runner_up_log_weights(*up, shape.runner_up_weight, r.mask_id)
                                              : std::vector<double>();
    const std::vector<int64_t>* up_tokens = up ? &up->tokens : nullptr;
    const std::vector<double>* up_weight = up ? &log_weight : nullptr;
    if (!r.rule.threshold) {
      out.push_back(position_candidates(node, logq, c.tokens, r.mask_id, shape.branch, up_tokens, up_weight));
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
    out.push_back(set_candidates(node, member_p, best, c.tokens, r.mask_id, shape.branch, up_tokens, up_weight,
                                 drafter_.set_flip_weight));
  }
  return out;
}

}  // namespace spot
