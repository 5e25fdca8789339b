#include "outputs.h"

namespace spot {

// One target pass over N states [N*B] whose commit steps are steps [N]: the logits, or the epilogue's samples.
std::unique_ptr<PassOutputs> block_pass(TargetEngine& engine, const std::vector<int64_t>& states,
                                        const std::vector<int64_t>& steps, const BlockContext& ctx, uint32_t block,
                                        const std::vector<int64_t>* store) {
  const int64_t n = static_cast<int64_t>(steps.size());
  if (store != nullptr && n != 1) fail(SPOT_ERR_INTERNAL, "a fused store pass runs one state");
  if (store != nullptr && !engine.samples_on_device())
    return std::make_unique<HostPassOutputs>(engine, engine.fused_logits(*store, states), engine.block_size(),
                                             engine.vocab());
  if (store != nullptr)
    return std::make_unique<DevicePassOutputs>(engine, engine.fused_device_logits(*store, states), states, steps,
                                               ctx.sampling, block, 1);
  if (!engine.samples_on_device())
    return std::make_unique<HostPassOutputs>(engine, engine.block_logits(states, n, /*check_finite=*/false),
                                             engine.block_size(), engine.vocab());
  return std::make_unique<DevicePassOutputs>(engine, engine.block_device_logits(states, n), states, steps,
                                             ctx.sampling, block);
}

}  // namespace spot
