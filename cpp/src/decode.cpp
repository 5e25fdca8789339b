#include "decode.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <map>
#include <set>

#include "drafter.h"
#include "errors.h"
#include "outputs.h"
#include "proposers.h"
#include "tree.h"

namespace spot {
namespace {

constexpr int kTreeBranch = 4;                            // decoders.TREE_BRANCH

double now_ms() {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// decode.state_pass: one pass over one state; a block's first pass stores the pending finished block too (fused)
std::unique_ptr<PassOutputs> state_pass(TargetEngine& engine, const std::vector<int64_t>& state, uint32_t step,
                                        uint32_t block, const BlockContext& ctx) {
  std::vector<int64_t> store;
  store.swap(*ctx.pending);
  std::unique_ptr<PassOutputs> out = block_pass(engine, state, {step}, ctx, block, store.empty() ? nullptr : &store);
  ctx.stats->passes[store.empty() ? "block" : "fused"] += 1;
  return out;
}

std::vector<int64_t> standard_block(TargetEngine& engine, std::vector<int64_t> state, uint32_t block,
                                    const BlockContext& ctx) {
  uint32_t step = 0;
  while (has_mask(state, ctx.mask_id)) {
    const double t0 = now_ms();
    std::unique_ptr<PassOutputs> out = state_pass(engine, state, step, block, ctx);
    ctx.stats->target_ms += now_ms() - t0;   // decode.standard_block: standard decoding's passes (the tuner's charge)
    state = out->next_state(0, state, ctx, block, step);
    ++step;
  }
  ctx.stats->steps += step;
  return state;
}

// spot.TreeBudget.check
void check_budget(int64_t nodes, int64_t depth, const TargetEngine& engine) {
  const int64_t block_size = engine.block_size();
  if (depth < 1 || depth > block_size)   // first: a chain's node count is its depth + 1
    fail(SPOT_ERR_INVALID_ARGUMENT, "depth must be in 1.." + std::to_string(block_size) +
                                        " (the block size), got " + std::to_string(depth));
  if (nodes < 1) fail(SPOT_ERR_INVALID_ARGUMENT, "budget must be >= 1 node, got " + std::to_string(nodes));
  if (nodes > engine.max_nodes())
    fail(SPOT_ERR_INVALID_ARGUMENT, "budget " + std::to_string(nodes) + " nodes exceeds the " +
                                        std::to_string(engine.max_nodes()) + " states one verify pass of this " +
                                        "engine takes (the export's max_nodes): use a smaller budget, or re-export " +
                                        "with a larger --max-nodes");
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
  check_budget(nodes, depth, engine);
  DecodeStats& stats = *ctx.stats;
  std::unique_ptr<PassOutputs> last = state_pass(engine, state, 0, block, ctx);
  int64_t last_row = 0;   // the row of `last` that `state` was seen in
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
      last->settle(last_row);   // a device sampler's logits are not kept into the next pass
    }
    root = std::move(next_root);
  }
  stats.steps += has_mask(state, ctx.mask_id) ? step + 1 : step;
  return root;
}

}  // namespace

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
  // step.MIN_TEMPERATURE: below it L / T leaves double's range for large logits
  if (!std::isfinite(req.temperature) || req.temperature < 0 || (req.temperature > 0 && req.temperature < 1e-6)) {
    fail(SPOT_ERR_INVALID_ARGUMENT, "temperature must be 0 or a finite number >= 1e-06, got " +
                                        number_text(req.temperature));
  }
  CommitRule rule;
  rule.tau = req.tau;
  // decoders.rule_for: threshold / spot-sets always use the threshold rule, every other decoder the request's mode
  rule.threshold = name == "threshold" || name == "spot-sets" || req.threshold_mode;
  if (rule.threshold && !(req.tau >= 0.0 && req.tau < 1.0))
    fail(SPOT_ERR_INVALID_ARGUMENT, "tau must be in [0, 1), got " + number_text(req.tau));
  const int64_t b = engine.block_size();
  std::unique_ptr<Proposer> proposer;
  int64_t nodes = req.budget, depth = req.depth;
  if (name != "standard" && name != "threshold") {
    if (name == "chain") {   // one node per depth: --budget does not size a chain, its depth does
      nodes = req.depth + 1;
      if (req.depth >= 1 && req.depth <= b && nodes > engine.max_nodes())
        fail(SPOT_ERR_INVALID_ARGUMENT, "a chain of depth " + std::to_string(req.depth) + " verifies " +
                                            std::to_string(nodes) + " states, more than the " +
                                            std::to_string(engine.max_nodes()) + " one verify pass of this engine " +
                                            "takes (the export's max_nodes): " +
                                            (engine.max_nodes() > 1
                                                 ? "use --depth " + std::to_string(engine.max_nodes() - 1) +
                                                       " or less"
                                                 : std::string("re-export with --max-nodes 2 or more")));
    }
    check_budget(nodes, req.depth, engine);
    if (name == "chain") {
      proposer = std::make_unique<ConfidenceOrderProposer>(1);
    } else if (name == "tree") {
      proposer = std::make_unique<ConfidenceOrderProposer>(kTreeBranch);
    } else {
      if (drafter == nullptr)
        fail(SPOT_ERR_INVALID_ARGUMENT, "decoder '" + name + "' needs a drafter (order model): open the model "
                                                             "with a drafter folder, or use a folder that ships "
                                                             "drafter.onnx + drafter.json");
      drafter->check_compatible(b, cfg);
      proposer = std::make_unique<DrafterProposer>(*drafter, nodes, kDrafterLookahead);   // its budget's shape
    }
  }
  if (engine.samples_on_device()) {   // what the sampling epilogue serves (epilogue.check_sampling, spot.py)
    if (req.top_p < 1.0)
      fail(SPOT_ERR_UNSUPPORTED, "the device sampling epilogue does not implement top-p (got top_p " +
                                     number_text(req.top_p) + "): use top_p 1 with it, or the host sampler");
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
  for (int64_t s : req.stop_ids ? stop : std::vector<int64_t>{})   // a request's, as decode.generate checks them
    if (s < 0 || s >= cfg.vocab_size)
      fail(SPOT_ERR_INVALID_ARGUMENT, "stop id " + std::to_string(s) + " is outside the vocabulary [0, " +
                                          std::to_string(cfg.vocab_size) + ")");
  Generation gen;
  Sampling sampling;
  sampling.temperature = req.temperature;
  sampling.seed = req.seed;
  sampling.exclude_token = cfg.mask_token_id;   // never commit the mask id itself
  sampling.top_k = req.top_k;
  sampling.top_p = req.top_p;
  NoiseRows noise(req.seed, cfg.vocab_size);
  std::vector<int64_t> pending;   // fused store: the finished block the next block's first pass stores
  BlockContext ctx{rule, sampling, cfg.mask_token_id, &gen.stats, &noise, &pending};
  const int64_t sampled_before = engine.epilogue_states();
  const double epilogue_ms_before = engine.epilogue_ms();
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
    if (!pending.empty()) {   // a decoder that ran no pass stored nothing: the cache needs it now (decode.py)
      engine.store(pending);
      pending.clear();
      gen.stats.passes["store"] += 1;
    }
    if (req.separate_store) {
      engine.store(state);
      gen.stats.passes["store"] += 1;
    } else {
      pending = state;
    }
    gen.stats.blocks += 1;
    // what this block adds to the output: cut before a stop id and at max_new_tokens (only the last block holds
    // more than the room left; the rest of it was decoded to finish the block, and is not output)
    const int64_t room = req.max_new_tokens - static_cast<int64_t>(gen.token_ids.size());
    std::vector<int64_t> added;
    for (int64_t i = lead; i < b && i - lead < room && !gen.stopped; ++i) {
      gen.stopped = std::find(stop.begin(), stop.end(), state[i]) != stop.end();
      if (!gen.stopped) added.push_back(state[i]);
    }
    gen.token_ids.insert(gen.token_ids.end(), added.begin(), added.end());
    if (req.on_block && req.on_block(added) && !gen.stopped && block < n_blocks - 1) gen.cancelled = true;
    if (gen.stopped || gen.cancelled) break;
  }
  gen.stats.epilogue_states = engine.epilogue_states() - sampled_before;
  gen.stats.epilogue_ms = engine.epilogue_ms() - epilogue_ms_before;
  gen.stats.seconds = (now_ms() - t_start) / 1e3;
  return gen;
}

}  // namespace spot
