// Decoding, mirroring spot/runtime: the block loop (decode.py), the SPOT round (spot.py) and the decoders by name
// (decoders.py), over stale views (stale.h), draft trees (tree.h), proposers (proposers.h, drafter.h) and pass
// outputs (outputs.h).
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "engine.h"

namespace spot {

class Drafter;

struct DecodeStats {
  std::map<std::string, int64_t> passes;   // prefill, block, verify, store, fused (stats.PASS_KINDS)
  int64_t steps = 0, blocks = 0;
  double seconds = 0, draft_ms = 0, walk_ms = 0, target_ms = 0;
  int64_t epilogue_states = 0;            // states the device sampling epilogue sampled (0: host sampler)
  double epilogue_ms = 0;                 // time inside those epilogue calls (part of walk_ms / the block passes)
  std::vector<int64_t> accepted_per_verify, nodes_per_verify;
};

struct Generation {
  std::vector<int64_t> token_ids;
  bool stopped = false;
  bool cancelled = false;   // on_block ended generation before its last block
  DecodeStats stats;
};

struct DecodeRequest {
  std::string decoder = "standard";
  int64_t max_new_tokens = 64;
  bool threshold_mode = false;   // the commit rule of standard / chain / tree / spot (decoders.rule_for)
  double tau = 0.9;
  double temperature = 0.0;
  uint32_t seed = 0;
  int64_t top_k = 0;
  double top_p = 1.0;
  int64_t budget = 16;
  int64_t depth = 8;
  std::optional<std::vector<int64_t>> stop_ids;
  // decode.STORE_MODES: false (fused) = the next block's first pass stores a finished block; true = a store pass per
  // block (SDAR's accounting)
  bool separate_store = false;
  // streaming (decode.generate's on_block): after each finished block, the ids it adds to the output (cut before a
  // stop id and at max_new_tokens); true ends generation after that block
  std::function<bool(const std::vector<int64_t>&)> on_block;
};

Generation run_decoder(TargetEngine& engine, const ModelFacts& cfg, Drafter* drafter,
                       const std::vector<int64_t>& prompt, const DecodeRequest& req);

}  // namespace spot
