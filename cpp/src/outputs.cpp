#include "outputs.h"

namespace spot {

// One target pass over N states [N*B] whose commit steps are steps [N]: the logits, or the epilogue's samples.
std::unique_ptr<PassOutputs> block_pass(TargetEngine& engine, const std::vector<int64_t>& states,
                                        const std::vector<int64_t>& steps, const BlockContext& ctx, uint32_t block) {
  const int64_t n = static_cast<int64_t>(steps.size());
  if (!engine.samples_on_device())
    return std::make_unique<HostPassOutputs>(engine, engine.block_logits(states, n, /*check_finite=*/false),
                                             engine.block_size(), engine.vocab());
  return std::make_unique<DevicePassOutputs>(engine, engine.block_device_logits(states, n), states, steps,
                                             ctx.sampling, block);
}

}  // namespace spot
