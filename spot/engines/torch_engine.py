"""The torch reference model behind the engine interface (CPU, or CUDA when available)."""
from __future__ import annotations

import numpy as np

from spot.checkpoint import Checkpoint
from spot.errors import SpotError
from spot.runtime.engine import Engine

try:
    import torch
except ImportError:  # pragma: no cover - exercised only without the export extra
    torch = None


def torch_device(name: str):
    """torch.device for --device (cpu, cuda, cuda:N, ...); SpotError when torch cannot use it here."""
    try:
        device = torch.device(name)
    except (RuntimeError, TypeError, ValueError):     # (None, a number out of range, a list: not device names)
        raise SpotError(f"unknown device {name!r} for the torch backend, expected cpu or cuda (cuda:N)",
                        "`device=\"cpu\"` runs anywhere; cuda needs a CUDA build of torch and an NVIDIA GPU") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SpotError(f"`device=\"{name}\"`: this torch {torch.__version__} has no usable CUDA device",
                        "install a CUDA build of torch (Jetson: NVIDIA's JetPack wheel), or use `device=\"cpu\"`, or "
                        "`backend=\"ort\"` with `device=\"cuda\"` on an exported folder")
    return device


# prompt blocks per prefill pass: an export's default max_nodes, so that both engines run a long prompt in the same
# passes (spot.engines.ort_engine.OrtEngine.prefill_chunk)
PREFILL_BLOCKS = 64


class TorchEngine(Engine):
    name = "torch"

    def __init__(self, model, block_size: int | None = None, device: str = "cpu"):
        if torch is None:
            raise SpotError("the torch backend needs torch", "pip install 'spot-edge[export]' (torch==2.13.0)")
        super().__init__(model.cfg, block_size)
        self.device = torch_device(device)
        self.model = model.to(self.device).eval()
        self._k = self._v = None

    def _release(self) -> None:
        self.model = self._k = self._v = None

    @property
    def placement(self) -> dict[str, str]:
        """The torch device, with the GPU's name on cuda (a tuned budget holds for one device: spot.app.tuned_budgets)."""
        if self.device.type == "cuda":
            return {"device": f"cuda ({torch.cuda.get_device_name(self.device)})"}
        return {"device": str(self.device)}

    @staticmethod
    def from_dir(model_dir, block_size: int | None = None, device: str = "cpu", dtype: str = "fp32") -> "TorchEngine":
        if torch is None:
            raise SpotError("the torch backend needs torch", "pip install 'spot-edge[export]' (torch==2.13.0)")
        torch_device(device)          # before the weights are read
        dtypes = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
        if dtype not in dtypes:
            raise SpotError(f"torch dtype {dtype!r} is not supported, expected one of {', '.join(dtypes)}")
        from spot.reference.model import SDARModel    # torch at its top: after the check above names the extra
        return TorchEngine(SDARModel.from_checkpoint(Checkpoint(model_dir), dtypes[dtype]), block_size, device)

    def _reset(self):
        self._k = self._v = None

    def _forward(self, ids: np.ndarray, start: int, bias):
        t_ids = torch.from_numpy(ids).to(self.device)
        positions = torch.arange(start, start + ids.shape[1], device=self.device)
        with torch.inference_mode():
            return self.model(t_ids, positions, bias.to(self.device), self._k, self._v)

    def _prefill(self, ids):
        """In passes of PREFILL_BLOCKS blocks: one pass over a whole prompt holds its attention scores (P^2 per
        head) and the logits of every prompt token (P x V) at once — 911 MB for a 4064-token prompt of a tiny model,
        tens of GB for SDAR-8B's 32k context."""
        from spot.reference.model import block_causal_bias    # torch at its top: loaded with the engine's model
        chunk = PREFILL_BLOCKS * self.block_size
        for start in range(0, ids.shape[0], chunk):
            part = ids[start:start + chunk]
            bias = block_causal_bias(part.shape[0], self.block_size, prefix=start).to(self.model.norm.dtype)
            _, k, v = self._forward(part[None], start, bias)
            self._append(k[:, 0], v[:, 0])

    def _bias(self):
        return torch.zeros(self.block_size, self.cached_len + self.block_size, dtype=self.model.norm.dtype)

    def _block_logits(self, states):
        """One forward per state. Why: a batch must give each state the logits it gets alone (SPOT's verify pass is
        compared token for token with standard decoding's single passes), and MKL's CPU GEMM sums in an order that
        depends on the number of rows on some processors (1e-5 apart at hidden 128). The reference engine pays N
        forwards for that; the product engines (ONNX Runtime, TensorRT) run the batch as one pass."""
        rows = [self._forward(states[i:i + 1], self.cached_len, self._bias())[0] for i in range(states.shape[0])]
        return torch.cat(rows).float().cpu().numpy()

    def _store(self, state):
        _, k, v = self._forward(state[None], self.cached_len, self._bias())
        self._append(k[:, 0], v[:, 0])

    def _store_and_logits(self, store, state):
        """The fused pass: [store, state] as one sequence of 2B tokens, block-causal; store's K/V cached."""
        from spot.reference.model import block_causal_bias    # torch at its top: loaded with the engine's model
        b = self.block_size
        bias = block_causal_bias(2 * b, b, prefix=self.cached_len).to(self.model.norm.dtype)
        logits, k, v = self._forward(np.concatenate([store, state])[None], self.cached_len, bias)
        self._append(k[:, 0, :, :b], v[:, 0, :, :b])
        return logits[:, b:].float().cpu().numpy()

    def _append(self, k, v):
        self._k = k if self._k is None else torch.cat([self._k, k], dim=2)
        self._v = v if self._v is None else torch.cat([self._v, v], dim=2)
