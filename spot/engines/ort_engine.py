"""ONNX Runtime engine over an exported folder (spot-export): no torch needed on the device.

The folder is opened by its manifest (hashes checked). One session runs the target graph for prefill, block steps
over N candidate states and store passes; the graph returns only the new tokens' K/V, appended to the cache, one
[Hkv,C,D] array per layer and per K / V in the model dtype, each fed to the graph as its own input (no copy of the
cache per pass): numpy arrays on the host (CPU), or OrtValues where the target runs (spot.engines.device_kv: on GPU
providers, so the cache does not cross to the device on every pass). The sessions are opened by
spot.engines.ort_sessions, once for all the engines of a process (OrtEngine.over): the cache is each engine's own.
"""
from __future__ import annotations

import time
from functools import partial
from pathlib import Path

import numpy as np

from spot.engines.device_kv import DeviceKVCache
from spot.engines.ort_sessions import OrtSessions, open_sessions
from spot.errors import SpotError
from spot.folder.epilogue import OUTPUTS, POSITION_INPUT, EpilogueResult, epilogue_scalars, join_runs
from spot.folder.manifest import past_input_names
from spot.runtime.engine import Engine
from spot.runtime.outputs import DeferredOutputs, sampled_outputs

class OrtEngine(Engine):
    """Engine over an exported folder. device: cpu | cuda | trt; threads: intra-op threads (None: ORT default);
    sampler, kv_cache: auto | host | device (spot.engines.ort_sessions.on_device). `OrtEngine.over(sessions)`: an
    engine over sessions other engines use as well (spot.engines.ort_sessions: the weights once, a KV cache per
    engine)."""

    name = "ort"

    def __init__(self, model_dir: str | Path, block_size: int | None = None, device: str = "cpu",
                 threads: int | None = None, verify: str = "quick", sampler: str = "auto", kv_cache: str = "auto"):
        self._attach(open_sessions(model_dir, block_size, device, threads, verify, sampler, kv_cache))

    @classmethod
    def over(cls, sessions: OrtSessions) -> "OrtEngine":
        """An engine over an opened folder's shared sessions (spot.engines.ort_sessions.OrtSessions), with its own
        KV cache: engines over the same sessions may decode at the same time, one request each."""
        engine = cls.__new__(cls)
        engine._attach(sessions)
        return engine

    def _attach(self, sessions: OrtSessions) -> None:
        self.sessions = sessions
        self.exported = sessions.exported
        super().__init__(self.exported.config, sessions.block_size)
        self.device, self.place, self.dtype = sessions.device, sessions.place, sessions.dtype
        self.trt_profile = sessions.trt_profile
        self.session = sessions.target
        cfg = self.config
        self._empty = np.zeros((cfg.num_key_value_heads, 0, cfg.head_dim), self.dtype)
        self._past = past_input_names(cfg.num_hidden_layers)
        self._reset_host_cache()
        self.device_kv = None               # None: the numpy cache self._k / self._v
        if sessions.kv_append is not None:
            self.device_kv = DeviceKVCache(sessions.kv_append, self.place, self._empty, cfg.num_hidden_layers)
        self.epilogue, self._future_steps = sessions.epilogue, sessions.future_steps
        self._epilogue_positions = sessions.epilogue_positions

    @staticmethod
    def from_dir(model_dir, block_size: int | None = None, device: str = "cpu", threads: int | None = None,
                 sampler: str = "auto", kv_cache: str = "auto"):
        return OrtEngine(model_dir, block_size, device, threads, sampler=sampler, kv_cache=kv_cache)

    @property
    def sampler_depth(self) -> int | None:
        return self._future_steps

    def _release(self) -> None:
        self._placement_at_close = self._placement()      # what it ran as (the sessions below are gone)
        self.sessions = self.session = self.device_kv = self.epilogue = None
        self._reset_host_cache()

    @property
    def placement(self) -> dict[str, str]:
        """What --device / --sampler / --kv-cache resolved to (auto included)."""
        return self._placement_at_close if self.closed else self._placement()

    def _placement(self) -> dict[str, str]:
        return {"device": self.device, "sampler": "host" if self.epilogue is None else "device",
                "kv_cache": "host" if self.device_kv is None else "device"}

    @property
    def max_context(self) -> int:
        return min(self.exported.max_context, self.config.max_position_embeddings)

    @property
    def max_nodes(self) -> int:
        return self.exported.max_nodes

    # -- graph calls -------------------------------------------------------------------------------------------
    def _cached(self) -> int:
        return self._k[0].shape[1] if self.device_kv is None else self.device_kv.length

    def _reset_host_cache(self) -> None:
        """The numpy cache: K and V [Hkv,C,D] per layer (fed as the graph's past_k_<l> / past_v_<l>), empty."""
        self._k = [self._empty] * len(self._past)
        self._v = [self._empty] * len(self._past)

    def _host_feeds(self, ids: np.ndarray, bias: np.ndarray) -> dict[str, np.ndarray]:
        """ids [N,S] at positions cached..cached+S-1 against the cache with additive mask bias [S,C+S]; the past
        K/V too when the cache is on the host."""
        start = self._cached()
        feeds = {"input_ids": np.ascontiguousarray(ids, dtype=np.int64),
                 "position_ids": np.arange(start, start + ids.shape[1], dtype=np.int64), "attn_bias": bias}
        if self.device_kv is None:
            for (k_name, v_name), k, v in zip(self._past, self._k, self._v):
                feeds |= {k_name: k, v_name: v}
        return feeds

    def _binding(self, ids: np.ndarray, bias: np.ndarray):
        """A target IOBinding with every input bound: host arrays, and the cache where it is."""
        binding = self.session.io_binding()
        for name, value in self._host_feeds(ids, bias).items():
            binding.bind_cpu_input(name, value)
        if self.device_kv is not None:
            self.device_kv.bind_past(binding)
        return binding

    def _run(self, outputs: list[str], ids: np.ndarray, bias: np.ndarray) -> list[np.ndarray]:
        """A target pass returning `outputs` as numpy arrays."""
        if self.device_kv is None:
            return self.session.run(outputs, self._host_feeds(ids, bias))
        binding = self._binding(ids, bias)
        for name in outputs:
            binding.bind_output(name, "cpu")
        self.session.run_with_iobinding(binding)
        return binding.copy_outputs_to_cpu()

    def _extend(self, ids: np.ndarray, bias: np.ndarray) -> None:
        """Run one state ids [S] and append its tokens' K/V to the cache (on the host, or on the device)."""
        if self.device_kv is None:
            self._append_host(*self._run(["new_k", "new_v"], ids[None], bias))
            return
        binding = self._binding(ids[None], bias)
        binding.bind_output("new_k", self.place)
        binding.bind_output("new_v", self.place)
        self.session.run_with_iobinding(binding)
        self.device_kv.append(*binding.get_outputs())

    def _append_host(self, new_k: np.ndarray, new_v: np.ndarray, tokens: int | None = None) -> None:
        """Append the first `tokens` (default: all) of a pass's host new_k / new_v [L,1,Hkv,S,D] to the cache: the
        numpy cache, or the device cache (a fused pass: kv_append reads one contiguous [Hkv,S,D] input, and the
        first B of 2B tokens are not one, so they come to the host: 2 x L x Hkv x 2B x D values, ~1 MB for SDAR-8B
        at B = 4, against a whole target pass saved)."""
        if self.device_kv is not None:
            self.device_kv.append_host(new_k[:, 0, :, :tokens], new_v[:, 0, :, :tokens])
            return
        for layer in range(len(self._past)):      # one layer's longer cache at a time beside the old ones
            self._k[layer] = np.concatenate([self._k[layer], new_k[layer, 0, :, :tokens]], axis=1)
            self._v[layer] = np.concatenate([self._v[layer], new_v[layer, 0, :, :tokens]], axis=1)

    def _reset(self) -> None:
        self._reset_host_cache()
        if self.device_kv is not None:
            self.device_kv.reset()

    @property
    def prefill_chunk(self) -> int:
        """Prompt tokens per prefill pass: max_nodes x B, so that no prefill pass needs more activation memory than
        the widest verify pass the export was planned for (ONNX Runtime computes every output, the logits of every
        prompt token included; spot.export.memory_plan). On --device trt: the TensorRT profile's longest pass (one
        block: spot.folder.trt_profile.dynamic_trt_profile says why)."""
        if self.trt_profile is not None:
            return self.trt_profile.shapes["position_ids"][2][0]
        return max(1, self.exported.max_nodes) * self.block_size

    def _prefill(self, ids: np.ndarray) -> None:
        for start in range(0, ids.shape[0], self.prefill_chunk):
            part = ids[start:start + self.prefill_chunk]
            blocks = np.arange(part.shape[0]) // self.block_size
            cached = self._cached()
            # [S, C+S] in the model's dtype directly: the cache (earlier blocks) visible, the chunk block-causal
            # (through float64 temporaries a 2048-token chunk at 30k cached tokens took 2.3 s and 1.1 GB)
            bias = np.zeros((part.shape[0], cached + part.shape[0]), self.dtype)
            bias[:, cached:][blocks[None, :] > blocks[:, None]] = -np.inf
            self._extend(part, bias)

    def _step_bias(self) -> np.ndarray:
        return np.zeros((self.block_size, self._cached() + self.block_size), self.dtype)

    def _fused_bias(self) -> np.ndarray:
        """[2B, C+2B]: the stored block and the state after it, block-causal (the block does not see the state)."""
        b, cached = self.block_size, self._cached()
        bias = np.zeros((2 * b, cached + 2 * b), self.dtype)
        bias[:b, cached + b:] = -np.inf
        return bias

    def _check_fused_pass(self) -> None:
        """SpotError when the TensorRT profile (--device trt) stops short of the fused pass's 2B tokens: a folder
        exported before the fused store pass records one block."""
        if self.trt_profile is not None and self.prefill_chunk < 2 * self.block_size:
            raise SpotError(f"{self.exported.folder}'s TensorRT shape profile takes passes of one block, the fused "
                            f"store pass runs two ({2 * self.block_size} tokens)",
                            f"run `spot upgrade-export {self.exported.folder}` (seconds: it records the profile "
                            "again), or decode with `store_mode=\"separate\"`")

    def _store_and_logits(self, store: np.ndarray, state: np.ndarray) -> np.ndarray:
        self._check_nodes(1)
        self._check_fused_pass()
        b = self.block_size
        logits, new_k, new_v = self._run(["logits", "new_k", "new_v"], np.concatenate([store, state])[None],
                                         self._fused_bias())
        self._append_host(new_k, new_v, b)
        return logits[:, b:]

    def _check_nodes(self, n: int) -> None:
        if n > self.exported.max_nodes:
            raise SpotError(f"{n} candidate states in one pass exceed the export's max_nodes "
                            f"{self.exported.max_nodes}",
                            "re-export with a larger max_nodes (`spot-export --max-nodes N`) or draft fewer nodes")

    def _block_logits(self, states: np.ndarray) -> np.ndarray:
        self._check_nodes(states.shape[0])
        (logits,) = self._run(["logits"], states, self._step_bias())
        return logits

    def _block_outputs(self, states: np.ndarray, steps: np.ndarray, sampling, block: int, noise,
                       store: np.ndarray | None = None) -> list:
        """With the device sampler: the target's logits stay in an OrtValue on the device (IOBinding); a state's
        outputs run the epilogue over that state's rows when first read (DeferredOutputs), so a pass costs the
        epilogue of the states the walk visits, not of all N, and its memory is one state's. Only the epilogue's
        O(B x (D + 32)) outputs per state come back to the host. A fused pass (store) binds its new K/V to the host
        (_append_host says why) and its state's rows are the logits' second block."""
        if self.epilogue is None:
            return super()._block_outputs(states, steps, sampling, block, noise, store)
        self._check_nodes(states.shape[0])
        scalars = epilogue_scalars(steps, sampling, block)     # checks top-p and the counters' ranges once
        if store is None:
            target = self._binding(states, self._step_bias())
        else:
            self._check_fused_pass()
            target = self._binding(np.concatenate([store, states[0]])[None], self._fused_bias())
            target.bind_output("new_k", "cpu")
            target.bind_output("new_v", "cpu")
        target.bind_output("logits", self.place)
        self.session.run_with_iobinding(target)
        outputs = target.get_outputs()
        logits = outputs[-1]
        if store is not None:
            self._append_host(outputs[0].numpy(), outputs[1].numpy(), self.block_size)
        if logits.data_type() != "tensor(float)":
            raise SpotError(f"{self.exported.graph_path('target')} returned logits of type {logits.data_type()}, "
                            "expected tensor(float) (the epilogue's input)", "re-export the folder with spot-export")
        skip = 0 if store is None else 1       # blocks of logits rows before the states' own
        return [DeferredOutputs(partial(self._sample_state, logits, skip + i, states[i], scalars, i))
                for i in range(states.shape[0])]

    def _sample_state(self, logits, row: int, state: np.ndarray, scalars: dict, i: int):
        """The epilogue over the rows of block `row` of a pass's logits [N, S, V] (an OrtValue where the target
        ran; S = B, or 2B in a fused pass) — the pass's state i — bound in place at their offset (no copy), in runs
        of the export's positions per call. state [B]: that state, for the error path."""
        t0 = time.perf_counter()
        b, v, p = self.block_size, self.config.vocab_size, self._epilogue_positions
        steps = scalars["node_steps"][i:i + 1]

        def run(first: int) -> EpilogueResult:
            epi = self.epilogue.io_binding()
            epi.bind_input("logits", self.place, 0, np.float32, [1, p, v],
                           logits.data_ptr() + (row * b + first) * v * 4)
            for name, value in scalars.items():
                epi.bind_cpu_input(name, steps if name == "node_steps" else value)
            epi.bind_cpu_input(POSITION_INPUT, np.array(first, np.int64))
            for name in OUTPUTS:
                epi.bind_output(name, "cpu")
            self._run_epilogue(epi, state)
            return EpilogueResult(*epi.copy_outputs_to_cpu())
        result = join_runs(b, p, run)
        self.epilogue_states += 1
        self.epilogue_seconds += time.perf_counter() - t0
        if not np.isfinite(result.confidence).all():   # NaN/inf logits make the softmax non-finite
            self._non_finite()
        return sampled_outputs(result, steps)[0]

    def _run_epilogue(self, binding, state: np.ndarray) -> None:
        try:
            self.epilogue.run_with_iobinding(binding)
        except Exception as e:  # onnxruntime's own error types
            # NaN / inf logits can send the epilogue's candidate indices out of range: a pass over this state with
            # host logits tells (the _checked_logits error) whether that was it. The walk reads a pass's outputs
            # before the next store, so the cache is the one the pass ran against (a fused pass's stored block
            # included, which its state saw).
            self._checked_logits(state[None])
            raise SpotError(f"onnxruntime failed running {self.exported.graph_path('epilogue')}: "
                            f"{str(e).splitlines()[0][:300]}",
                            "decode with `sampler=\"host\"`, or re-export the folder") from None

    def _store(self, state: np.ndarray) -> None:
        self._extend(state, self._step_bias())
