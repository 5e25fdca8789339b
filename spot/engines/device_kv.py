"""The target's KV cache kept where the target runs: per layer two OrtValues in the device's memory, appended by the
export's kv_append graph (spot.export.kv_append_graph) on the same provider.

With the host cache (OrtEngine's numpy arrays) every pass on a GPU provider sends the whole cache to the device:
L x Hkv x C x D x 2 values, ~300 MB for SDAR-8B (36 x 8 x 128, fp16) at 2k tokens of context, on every verify pass.
Here a pass binds each layer's cache where it already is (IOBinding: the graph's past_k_<l> / past_v_<l>), the
pass's new K/V stay on the device, and a stored block costs one device-side copy of the cache, one layer at a time
(the transient is one layer's cache). The empty cache is bound as zero-size host arrays, as the host cache passes
it. On the CPU provider "the device" is host memory: the same code runs there (tests), with nothing to save.
"""
from __future__ import annotations

import numpy as np

from spot.folder.kv_append import INPUTS, OUTPUTS
from spot.folder.manifest import past_input_names


class DeviceKVCache:
    """Per layer K and V [Hkv,C,D] as OrtValues on `place` ("cpu" | "cuda", device 0, where the target session runs).

    append_session: an InferenceSession of kv_append.onnx on the target's provider; empty [Hkv,0,D] in the model
    dtype; layers: the target's layer count."""

    def __init__(self, append_session, place: str, empty: np.ndarray, layers: int):
        self._append, self.place, self._empty = append_session, place, empty
        self._names = past_input_names(layers)
        self.k: list | None = None       # OrtValues per layer; None = empty
        self.v: list | None = None

    @property
    def length(self) -> int:
        return 0 if self.k is None else int(self.k[0].shape()[1])

    def reset(self) -> None:
        self.k = self.v = None

    def bind_past(self, binding) -> None:
        """Bind every layer's past_k_<l> / past_v_<l> of a target IOBinding to the cache, where it is."""
        for layer, (k_name, v_name) in enumerate(self._names):
            if self.k is None:
                binding.bind_cpu_input(k_name, self._empty)
                binding.bind_cpu_input(v_name, self._empty)
            else:
                binding.bind_ortvalue_input(k_name, self.k[layer])
                binding.bind_ortvalue_input(v_name, self.v[layer])

    def append(self, new_k, new_v) -> None:
        """Append the target's new_k / new_v OrtValues [L,1,Hkv,S,D] (on `place`) to the cache, layer by layer:
        the append graph reads each layer's slice in place, and a layer's old cache is released once its longer
        one exists."""
        shape = new_k.shape()
        layer_shape = [shape[2], shape[3], shape[4]]
        dtype = self._empty.dtype
        layer_bytes = int(np.prod(layer_shape)) * dtype.itemsize

        def bind_new(binding, layer: int) -> None:
            for name, value in zip(INPUTS[2:], (new_k, new_v)):
                binding.bind_input(name, self.place, 0, dtype, layer_shape, value.data_ptr() + layer * layer_bytes)
        self._append_layers(shape[0], bind_new)

    def append_host(self, new_k: np.ndarray, new_v: np.ndarray) -> None:
        """Append host arrays new_k / new_v [L,Hkv,S,D] (a fused pass's stored block: OrtEngine._append_host), one
        layer at a time: ONNX Runtime copies each layer's slice to `place` as kv_append's input."""
        def bind_new(binding, layer: int) -> None:
            for name, value in zip(INPUTS[2:], (new_k[layer], new_v[layer])):
                binding.bind_cpu_input(name, np.ascontiguousarray(value, self._empty.dtype))
        self._append_layers(new_k.shape[0], bind_new)

    def _append_layers(self, layers: int, bind_new) -> None:
        """kv_append per layer, its new K/V bound by bind_new(binding, layer)."""
        ks, vs = [], []
        for layer in range(layers):
            binding = self._append.io_binding()
            if self.k is None:
                binding.bind_cpu_input(INPUTS[0], self._empty)
                binding.bind_cpu_input(INPUTS[1], self._empty)
            else:
                binding.bind_ortvalue_input(INPUTS[0], self.k[layer])
                binding.bind_ortvalue_input(INPUTS[1], self.v[layer])
            bind_new(binding, layer)
            for name in OUTPUTS:
                binding.bind_output(name, self.place)
            self._append.run_with_iobinding(binding)
            k, v = binding.get_outputs()
            if self.k is not None:           # release the layer's old cache now, not after every layer
                self.k[layer], self.v[layer] = k, v
            ks.append(k)
            vs.append(v)
        self.k, self.v = ks, vs

    def host_copy(self) -> tuple[np.ndarray, np.ndarray]:
        """K, V [L,Hkv,C,D] as numpy arrays (tests and diagnostics: a device-to-host copy of the whole cache)."""
        if self.k is None:
            empty = np.stack([self._empty] * len(self._names))
            return empty, empty
        return np.stack([k.numpy() for k in self.k]), np.stack([v.numpy() for v in self.v])
