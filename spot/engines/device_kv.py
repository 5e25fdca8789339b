"""The target's KV cache kept where the target runs: two OrtValues in the device's memory, appended by the export's
kv_append graph (spot.export.kv_append) on the same provider.

With the host cache (OrtEngine's numpy arrays) every pass on a GPU provider sends the whole cache to the device:
L x Hkv x C x D x 2 values, ~300 MB for SDAR-8B (36 x 8 x 128, fp16) at 2k tokens of context, on every verify pass.
Here a pass binds the cache where it already is (IOBinding), the pass's new K/V stay on the device, and a stored
block costs one device-side copy of the cache. The empty cache is bound as a zero-size host array, as the host
cache passes it. On the CPU provider "the device" is host memory: the same code runs there (tests), with nothing to
save.
"""
from __future__ import annotations

import numpy as np

from spot.export.kv_append import INPUTS, OUTPUTS


class DeviceKVCache:
    """K and V [L,Hkv,C,D] as OrtValues on `place` ("cpu" | "cuda", device 0, where the target session runs).

    append_session: an InferenceSession of kv_append.onnx on the target's provider; empty [L,Hkv,0,D] in the
    model dtype."""

    def __init__(self, append_session, place: str, empty: np.ndarray):
        self._append, self.place, self._empty = append_session, place, empty
        self.k = self.v = None       # OrtValues; None = empty

    @property
    def length(self) -> int:
        return 0 if self.k is None else int(self.k.shape()[2])

    def reset(self) -> None:
        self.k = self.v = None

    def bind_past(self, binding) -> None:
        """Bind past_k / past_v of a target (or append) IOBinding to the cache, where it is."""
        if self.k is None:
            binding.bind_cpu_input(INPUTS[0], self._empty)
            binding.bind_cpu_input(INPUTS[1], self._empty)
        else:
            binding.bind_ortvalue_input(INPUTS[0], self.k)
            binding.bind_ortvalue_input(INPUTS[1], self.v)

    def append(self, new_k, new_v) -> None:
        """Append the target's new_k / new_v OrtValues [L,1,Hkv,S,D] (on `place`) to the cache."""
        binding = self._append.io_binding()
        self.bind_past(binding)
        binding.bind_ortvalue_input(INPUTS[2], new_k)
        binding.bind_ortvalue_input(INPUTS[3], new_v)
        for name in OUTPUTS:
            binding.bind_output(name, self.place)
        self._append.run_with_iobinding(binding)
        self.k, self.v = binding.get_outputs()

    def host_copy(self) -> tuple[np.ndarray, np.ndarray]:
        """K, V as numpy arrays (tests and diagnostics: a device-to-host copy of the whole cache)."""
        if self.k is None:
            return self._empty, self._empty
        return self.k.numpy(), self.v.numpy()
