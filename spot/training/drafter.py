"""The order model (docs/spec.md §6) in torch: training on teacher-forced trace examples, membership-threshold
calibration, held-out accuracy, and export to drafter.onnx + drafter.json for the runtime (spot.runtime.drafter).

Model: pre-norm transformer encoder over the B block positions (reference shape: 3 layers, d 128, 8 heads, FFN 512,
~0.62M parameters; OrderModelConfig sizes it to small targets). Per-position input: Linear([topk(32), masked,
stale_conf, log(stale_conf + 1e-6), z, rel]) + learned position embedding (max block 64) + staleness embedding,
where z and rel are the node's log stale confidences standardised over its masked positions (computed in the graph
from the same four ONNX inputs). Heads: order logit (softmax over masked positions = P(next commit)) and membership
logit (sigmoid = P(position in the next committed set), SPOT-Sets), each added to a training-free skip. While the
heads are zero (a fresh model; training whose weight selection kept step 0) the encoder cannot change the outputs,
and export writes the skips alone (BaselineGraph: inputs masked and stale_conf; drafter.json `graph` "baseline").

Labels of an example (stale row t, node row t+k): order = the static rule's commit at s_{t+k} (argmax fresh
confidence); membership = {fresh conf > tau} at s_{t+k} for the trained tau. The threshold rule's set is that, or
{best} when it is empty, so a predicted set falls back to the top order position the same way. Every trace row
carries both labels, whichever rule produced its trajectory.
"""
from __future__ import annotations

import json
import math
import time
import warnings
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from spot.descriptors import sha256_file
from spot.errors import SpotError
from spot.files import atomic_output, check_output_path, present
from spot.ortlib import load_onnxruntime
from spot.owned import DRAFTER_PAIR, drafter_pair_vouched
from spot.runtime.drafter import (BASELINE_INPUTS, DRAFTER_JSON, DRAFTER_ONNX, FORMAT, FORMAT_VERSION, INPUT_NAMES,
                                  MAX_BLOCK, MAX_STALENESS, OUTPUT_NAMES, drafter_inputs)
from spot.runtime.stale import TOPK_FEATURES
from spot.training.traces import RULE_CODES, Traces

TOPK_FLOOR = -20.0        # log-probabilities below this carry no order information (and tiny vocabularies pad -1e4)
CONF_EPS = 1e-6
ORDER_SKIP_INIT = 4.0     # softmax(4 z): most mass on the most confident position
MEMBER_SKIP_INIT = 32.0   # sigmoid(32 (c - tau)): membership of the training-free threshold rule


# -- model ----------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class OrderModelConfig:
    d_model: int = 128
    heads: int = 8
    ffn: int = 512
    layers: int = 3
    max_block: int = MAX_BLOCK
    max_staleness: int = MAX_STALENESS

    def __post_init__(self) -> None:
        """SpotError unless the shape can be built (the width splits evenly over the heads)."""
        for name in ("d_model", "heads", "ffn", "layers"):
            if getattr(self, name) < 1:
                raise SpotError(f"drafter {name} must be >= 1, got {getattr(self, name)}")
        if self.d_model % self.heads:
            raise SpotError(f"drafter width {self.d_model} must be a multiple of its heads, got {self.heads} heads",
                            "e.g. --width 64 --heads 4, or --width 128 --heads 8 (the reference shape)")


class EncoderLayer(nn.Module):
    """Pre-norm self-attention + GELU FFN over the block positions; plain ops so the ONNX graph stays opset 17."""

    def __init__(self, d: int, heads: int, ffn: int):
        super().__init__()
        self.heads = heads
        self.norm1, self.norm2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.out = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.ff1, self.ff2 = nn.Linear(d, ffn), nn.Linear(ffn, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x [K, B, d] -> [K, B, d]."""
        k, b, d = x.shape
        h, dh = self.heads, d // self.heads
        q, key, v = self.qkv(self.norm1(x)).reshape(k, b, 3, h, dh).permute(2, 0, 3, 1, 4)   # each [K, H, B, dh]
        att = torch.softmax(torch.matmul(q * (1.0 / math.sqrt(dh)), key.transpose(-1, -2)), dim=-1)
        x = x + self.out(torch.matmul(att, v).transpose(1, 2).reshape(k, b, d))
        return x + self.ff2(F.gelu(self.ff1(self.norm2(x))))


def confidence_standardised(log_conf: torch.Tensor, masked: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per node, over its masked positions: z-score of log stale confidence, and log conf minus its maximum (0 at
    the most confident position); 0 at unmasked positions. log_conf, masked [K, B].
    Why: a weak or flat target's confidences differ in the 3rd-4th digit across positions; these make the ranking
    visible at unit scale, so the encoder's noise cannot swamp it."""
    n = masked.sum(-1, keepdim=True).clamp(min=1.0)
    mean = (log_conf * masked).sum(-1, keepdim=True) / n
    centred = (log_conf - mean) * masked
    std = torch.sqrt((centred * centred).sum(-1, keepdim=True) / n + 1e-12)
    top = torch.where(masked > 0, log_conf, torch.full_like(log_conf, -1e4)).max(-1, keepdim=True).values
    return centred / std, (log_conf - top) * masked


def standardised_confidence(masked: torch.Tensor, stale_conf: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """confidence_standardised of log(stale_conf + eps) over masked [K, B], computed in float64, returned float32.
    Why float64: z divides by spreads as small as 1e-4, which would magnify ulp differences between torch and ONNX
    Runtime in float32 beyond the export tolerance."""
    z, rel = confidence_standardised(torch.log(stale_conf.double() + CONF_EPS), masked.double())
    return z.float(), rel.float()


class OrderModel(nn.Module):
    """The encoder's two logits are added to the training-free baseline through learned skips (zero-initialised
    heads): order += a * z (standardised log stale confidence), member += c * stale_conf + d with d = -c * tau. A
    fresh model therefore ranks positions by stale confidence and learns corrections; without the skip it must first
    rediscover that ranking, which is near-perfect on weakly context-dependent targets."""

    def __init__(self, cfg: OrderModelConfig = OrderModelConfig(), tau: float = 0.9):
        super().__init__()
        self.cfg = cfg
        self.inp = nn.Linear(TOPK_FEATURES + 5, cfg.d_model)
        self.pos = nn.Embedding(cfg.max_block, cfg.d_model)
        self.staleness = nn.Embedding(cfg.max_staleness + 1, cfg.d_model)
        self.layers = nn.ModuleList(EncoderLayer(cfg.d_model, cfg.heads, cfg.ffn) for _ in range(cfg.layers))
        self.norm = nn.LayerNorm(cfg.d_model)
        self.head = nn.Linear(cfg.d_model, 2)      # [order, member]
        nn.init.zeros_(self.head.weight)
        nn.init.zeros_(self.head.bias)
        self.order_skip = nn.Parameter(torch.tensor(ORDER_SKIP_INIT))
        self.member_scale = nn.Parameter(torch.tensor(MEMBER_SKIP_INIT))
        self.member_bias = nn.Parameter(torch.tensor(-MEMBER_SKIP_INIT * tau))

    def forward(self, topk, masked, stale_conf, staleness):
        """topk [K,B,32], masked [K,B], stale_conf [K,B] float32, staleness [K] int64 ->
        order_logits [K,B], member_logits [K,B]."""
        z, rel = standardised_confidence(masked, stale_conf)
        log_conf = torch.log(stale_conf + CONF_EPS)
        feats = torch.cat([topk.clamp(min=TOPK_FLOOR) * (1.0 / -TOPK_FLOOR), masked.unsqueeze(-1),
                           stale_conf.unsqueeze(-1), log_conf.unsqueeze(-1) * 0.1, z.unsqueeze(-1),
                           rel.clamp(min=TOPK_FLOOR).unsqueeze(-1) * 0.1], dim=-1)
        positions = torch.arange(masked.shape[1], device=masked.device)
        x = self.inp(feats) + self.pos(positions).unsqueeze(0) \
            + self.staleness(staleness.clamp(0, self.cfg.max_staleness)).unsqueeze(1)
        for layer in self.layers:
            x = layer(x)
        out = self.head(self.norm(x))
        order, member = self.baseline(z, stale_conf)
        return out[..., 0] + order, out[..., 1] + member

    def baseline(self, z: torch.Tensor, stale_conf: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The skips: order a z, member c stale_conf + d ([K,B] each) — the whole output while the heads are zero."""
        return self.order_skip * z, self.member_scale * stale_conf + self.member_bias

    def heads_are_zero(self) -> bool:
        """True when the encoder cannot change the outputs: the heads' weights and biases are all exactly 0 (a fresh
        model, or training whose weight selection kept step 0 — the stale-confidence baseline)."""
        return not any(bool(t.detach().ne(0).any()) for t in (self.head.weight, self.head.bias))


class BaselineGraph(nn.Module):
    """What an OrderModel with zero heads computes, without the encoder that cannot change it (dead code: the same
    outputs bit for bit, checked at export). Reads only `masked` and `stale_conf`; the runtime then skips the
    top-32 features and the encoder's compute (docs/drafter.md)."""

    def __init__(self, model: OrderModel):
        super().__init__()
        self.model = model

    def forward(self, masked, stale_conf):
        """masked [K,B], stale_conf [K,B] float32 -> order_logits [K,B], member_logits [K,B]."""
        return self.model.baseline(standardised_confidence(masked, stale_conf)[0], stale_conf)


def parameter_count(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


# -- examples -------------------------------------------------------------------------------------------------------
@dataclass
class Examples:
    """Teacher-forced examples: stale row `src`, node row `src + k` of the same block."""

    src: np.ndarray     # [E] int64
    k: np.ndarray       # [E] int64, staleness 1..D

    def __len__(self) -> int:
        return int(self.src.shape[0])

    def subset(self, keep: np.ndarray) -> "Examples":
        return Examples(self.src[keep], self.k[keep])


def make_examples(traces: Traces, trace_ids: np.ndarray | None = None, depth: int | None = None) -> Examples:
    """Every (row t, staleness k) whose row t + k exists in the same block (the node still holds masks)."""
    depth = traces.depth if depth is None else min(depth, traces.depth)
    rows = traces.rows
    n = traces.n_rows
    keep_row = np.ones(n, bool) if trace_ids is None else np.isin(rows["trace"], trace_ids)
    srcs, ks = [], []
    for k in range(1, depth + 1):
        src = np.arange(n - k)
        same = (rows["trace"][src] == rows["trace"][src + k]) & (rows["block"][src] == rows["block"][src + k]) \
            & (rows["step"][src + k] == rows["step"][src] + k)
        src = src[same & keep_row[src]]
        srcs.append(src)
        ks.append(np.full(src.shape, k))
    return Examples(np.concatenate(srcs).astype(np.int64), np.concatenate(ks).astype(np.int64))


def example_inputs(traces: Traces, ex: Examples) -> dict[str, np.ndarray]:
    """The ONNX inputs of a batch of examples, built by the runtime's own feature function."""
    rows = traces.rows
    node = ex.src + ex.k
    masked = rows["state"][node] == traces.mask_id
    conf = rows["future_conf"][ex.src, ex.k - 1]
    return drafter_inputs(rows["topk"][ex.src], masked, conf, ex.k)


def example_labels(traces: Traces, ex: Examples, tau: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """order target [E] (position), over-threshold target [E, B] bool ({fresh conf > tau}: what the membership
    head learns) and the threshold rule's whole set [E, B] bool (over-threshold, else {best})."""
    node = ex.src + ex.k
    best = traces.rows["best"][node].astype(np.int64)
    over = traces.rows["fresh_conf"][node] > tau
    sets = over.copy()
    empty = ~sets.any(axis=1)
    sets[empty, best[empty]] = True
    return best, over, sets


def rule_of(traces: Traces, ex: Examples) -> np.ndarray:
    """[E] rule code of the trajectory each example comes from (0 static, 1 threshold)."""
    return traces.traces["rule"][traces.rows["trace"][ex.src]]


# -- training -------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class DrafterTrainSettings:
    epochs: int = 4
    batch_size: int = 256
    lr: float = 1e-3
    min_lr_ratio: float = 0.05
    warmup_steps: int = 50
    weight_decay: float = 0.01
    grad_clip: float = 1.0
    seed: int = 0
    threads: int = 1                # a shared, loaded CPU runs this small model faster on one thread
    minutes: float | None = None     # stop training after this long (the schedule follows elapsed time then)
    tau: float = 0.9                 # threshold rule the membership head is trained for
    heldout_fraction: float = 0.1    # of prompts, when no held-out trace file is given
    calib_fraction: float = 0.1      # of training traces, kept aside for the threshold calibration
    log_every: int = 50
    select_every: int = 100          # score on the calibration traces this often and keep the best weights
    eval_limit: int = 6000           # calibration / held-out examples scored (a seeded subset when more)


def to_torch(inputs: dict[str, np.ndarray]) -> tuple[torch.Tensor, ...]:
    return tuple(torch.from_numpy(np.array(inputs[n])) for n in INPUT_NAMES)   # a copy: inputs may be read-only views


def batch_loss(model: OrderModel, traces: Traces, ex: Examples, tau: float) -> tuple[torch.Tensor, dict]:
    """Order: cross-entropy over masked positions; membership: mean BCE over masked positions."""
    inputs = example_inputs(traces, ex)
    best, member, _ = example_labels(traces, ex, tau)
    order, member_logits = model(*to_torch(inputs))
    masked = torch.from_numpy(inputs["masked"] > 0)
    ce = F.cross_entropy(order.masked_fill(~masked, float("-inf")), torch.from_numpy(best))
    bce = F.binary_cross_entropy_with_logits(member_logits, torch.from_numpy(member).float(), reduction="none")
    bce = (bce * masked).sum() / masked.sum()
    return ce + bce, {"order": float(ce.detach()), "member": float(bce.detach())}


def lr_scale(progress: float, step: int, s: DrafterTrainSettings) -> float:
    warm = min(1.0, (step + 1) / max(s.warmup_steps, 1))
    cos = 0.5 * (1 + math.cos(math.pi * min(progress, 1.0)))
    return warm * (s.min_lr_ratio + (1 - s.min_lr_ratio) * cos)


def split_traces(traces: Traces, s: DrafterTrainSettings) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(train, calibration, held-out) trace ids; held-out by prompt so no prompt is in two splits."""
    rng = np.random.default_rng(s.seed + 5)
    prompts = np.unique(traces.traces["prompt"])
    n_held = max(1, int(round(s.heldout_fraction * prompts.size))) if prompts.size > 1 else 0
    held_prompts = rng.permutation(prompts)[:n_held]
    ids = np.arange(traces.n_traces)
    held = ids[np.isin(traces.traces["prompt"], held_prompts)]
    rest = rng.permutation(ids[~np.isin(ids, held)])
    n_cal = max(1, int(round(s.calib_fraction * rest.size))) if rest.size > 1 else 0
    return np.sort(rest[n_cal:]), np.sort(rest[:n_cal]), np.sort(held)


def train_order_model(traces: Traces, train_ids: np.ndarray, s: DrafterTrainSettings,
                      log: Callable[[str], None] = print, select: Examples | None = None,
                      config: OrderModelConfig = OrderModelConfig()) -> tuple[OrderModel, dict]:
    """AdamW on the training traces' examples. With `select` (calibration examples), the model is scored on them
    at the start (= the stale-confidence baseline, thanks to the skips), every `select_every` steps and at the
    end, and the best-scoring weights are returned."""
    torch.manual_seed(s.seed)
    threads = torch.get_num_threads()
    torch.set_num_threads(s.threads)
    try:
        return _train(traces, train_ids, s, log, select, config)
    finally:
        torch.set_num_threads(threads)


def selection_score(model: OrderModel, traces: Traces, ex: Examples, tau: float) -> float:
    """Mean of next-commit top-1 and whole-set match (membership cut at 0.5) on `ex`."""
    order, member = predict(model, traces, ex)
    masked = example_inputs(traces, ex)["masked"] > 0
    best, _, sets = example_labels(traces, ex, tau)
    top1 = (np.argmax(np.where(masked, order, -np.inf), axis=1) == best).mean()
    whole = (predicted_sets(member, order, masked, 0.5) == sets).all(axis=1).mean()
    return float(0.5 * (top1 + whole))


def _train(traces: Traces, train_ids: np.ndarray, s: DrafterTrainSettings, log: Callable[[str], None],
           select: Examples | None, config: OrderModelConfig) -> tuple[OrderModel, dict]:
    rng = np.random.default_rng(s.seed)
    ex = make_examples(traces, train_ids)
    if len(ex) == 0:
        raise SpotError("the training traces hold no teacher-forced examples",
                        "collect longer or more traces (each block needs at least two steps)")
    model = OrderModel(config, tau=s.tau)
    decayed = {n for n, p in model.named_parameters() if p.ndim >= 2 and "pos" not in n and "staleness" not in n}
    opt = torch.optim.AdamW([
        {"params": [p for n, p in model.named_parameters() if n in decayed], "weight_decay": s.weight_decay},
        {"params": [p for n, p in model.named_parameters() if n not in decayed], "weight_decay": 0.0}], lr=s.lr)
    steps_per_epoch = max(1, len(ex) // s.batch_size)
    total = s.epochs * steps_per_epoch
    log(f"order model: {parameter_count(model)} parameters; {len(ex)} training examples from {train_ids.size} "
        f"traces; {s.epochs} epochs x {steps_per_epoch} steps of {s.batch_size}")
    t0 = time.perf_counter()
    history, selection, step, running = [], [], 0, []
    best_state, best_score = None, -1.0

    def checkpoint():
        nonlocal best_state, best_score
        if select is None or len(select) == 0:
            return
        model.eval()
        value = selection_score(model, traces, select, s.tau)
        model.train()
        selection.append({"step": step, "score": round(value, 4)})
        if value > best_score:
            best_state, best_score = {k: v.detach().clone() for k, v in model.state_dict().items()}, value
        log(f"step {step}: calibration score {value:.4f} (best {best_score:.4f})")

    checkpoint()
    model.train()
    stop = False
    for epoch in range(s.epochs):
        perm = rng.permutation(len(ex))
        for i in range(steps_per_epoch):
            elapsed = time.perf_counter() - t0
            progress = step / total
            if s.minutes is not None:
                progress = max(progress, elapsed / (60 * s.minutes))
                if elapsed > 60 * s.minutes:
                    stop = True
                    break
            for g in opt.param_groups:
                g["lr"] = s.lr * lr_scale(progress, step, s)
            loss, parts = batch_loss(model, traces, ex.subset(perm[i * s.batch_size:(i + 1) * s.batch_size]), s.tau)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            nn.utils.clip_grad_norm_(model.parameters(), s.grad_clip)
            opt.step()
            running.append((float(loss.detach()), parts["order"], parts["member"]))
            step += 1
            if step % s.log_every == 0 or step == 1:
                m = np.mean(running, axis=0)
                history.append({"step": step, "loss": float(m[0]), "order": float(m[1]), "member": float(m[2])})
                log(f"epoch {epoch + 1} step {step}/{total} loss {m[0]:.4f} (order {m[1]:.4f}, member {m[2]:.4f}) "
                    f"lr {opt.param_groups[0]['lr']:.2e} {time.perf_counter() - t0:.0f} s")
                running = []
            if s.select_every and step % s.select_every == 0:
                checkpoint()
        if stop:
            log(f"time limit of {s.minutes} min reached at step {step}")
            break
    if not s.select_every or step % s.select_every:
        checkpoint()
    chosen = step
    if best_state is not None:
        model.load_state_dict(best_state)
        chosen = max(selection, key=lambda e: (e["score"], -e["step"]))["step"]
        log(f"kept the weights of step {chosen} (calibration score {best_score:.4f})")
    model.eval()
    return model, {"steps": step, "chosen_step": chosen, "examples": len(ex),
                   "seconds": round(time.perf_counter() - t0, 1), "history": history, "selection": selection}


# -- scoring --------------------------------------------------------------------------------------------------------
@torch.no_grad()
def predict(model, traces: Traces, ex: Examples, batch: int = 1024) -> tuple[np.ndarray, np.ndarray]:
    """order_logits, member_logits [E, B] float32 of a torch OrderModel or an exported Drafter (ONNX Runtime)."""
    orders, members = [], []
    for i in range(0, len(ex), batch):
        inputs = example_inputs(traces, ex.subset(np.arange(i, min(i + batch, len(ex)))))
        if isinstance(model, nn.Module):
            o, m = (t.numpy() for t in model(*to_torch(inputs)))
        else:
            o, m = model.run(inputs)
        orders.append(o)
        members.append(m)
    b = traces.block_size
    return (np.concatenate(orders) if orders else np.zeros((0, b), np.float32),
            np.concatenate(members) if members else np.zeros((0, b), np.float32))


def predicted_sets(member_logits: np.ndarray, order_logits: np.ndarray, masked: np.ndarray,
                   threshold: float) -> np.ndarray:
    """[E, B] bool: {masked i : sigmoid(member) > threshold}, else the top order position (DrafterProposer's rule)."""
    p = 1.0 / (1.0 + np.exp(-member_logits.astype(np.float64)))
    sets = masked & (p > threshold)
    empty = ~sets.any(axis=1)
    best = np.argmax(np.where(masked, order_logits, -np.inf), axis=1)
    sets[np.flatnonzero(empty), best[empty]] = True
    return sets


def baseline_sets(conf: np.ndarray, masked: np.ndarray, tau: float) -> np.ndarray:
    """Training-free SPOT-Sets prediction: {stale conf > tau}, else the most confident position."""
    sets = masked & (conf > tau)
    empty = ~sets.any(axis=1)
    best = np.argmax(np.where(masked, conf, -np.inf), axis=1)
    sets[np.flatnonzero(empty), best[empty]] = True
    return sets


def calibrate_threshold(member_logits, order_logits, masked, target_sets) -> tuple[float, float]:
    """The membership threshold maximising whole-set exact match: (threshold, match rate)."""
    best_thr, best_acc = 0.5, -1.0
    for thr in np.round(np.arange(0.05, 0.96, 0.025), 3):
        acc = float((predicted_sets(member_logits, order_logits, masked, thr) == target_sets).all(axis=1).mean())
        if acc > best_acc + 1e-12:
            best_thr, best_acc = float(thr), acc
    return best_thr, best_acc


def score(model, traces: Traces, ex: Examples, tau: float, threshold: float) -> dict:
    """Next-commit top-1 (static-rule trajectories; all when there are none) and whole-set exact match
    (threshold-rule trajectories; all when there are none), per staleness, against the stale-confidence baseline."""
    if len(ex) == 0:
        return {"examples": 0}
    order, member = predict(model, traces, ex)
    inputs = example_inputs(traces, ex)
    masked, conf = inputs["masked"] > 0, inputs["stale_conf"]
    best, _, target_sets = example_labels(traces, ex, tau)
    top1 = np.argmax(np.where(masked, order, -np.inf), axis=1) == best
    base1 = np.argmax(np.where(masked, conf, -np.inf), axis=1) == best
    whole = (predicted_sets(member, order, masked, threshold) == target_sets).all(axis=1)
    base_whole = (baseline_sets(conf, masked, tau) == target_sets).all(axis=1)
    rules = rule_of(traces, ex)
    out = {"examples": len(ex)}
    for name, rule, hit, base in (("top1", RULE_CODES["static"], top1, base1),
                                  ("whole_set", RULE_CODES["threshold"], whole, base_whole)):
        sel = rules == rule if (rules == rule).any() else np.ones(len(ex), bool)
        per_k = {}
        for k in np.unique(ex.k[sel]):
            s = sel & (ex.k == k)
            per_k[int(k)] = {"n": int(s.sum()), "model": round(float(hit[s].mean()), 4),
                             "baseline": round(float(base[s].mean()), 4)}
        out[name] = {"n": int(sel.sum()), "model": round(float(hit[sel].mean()), 4),
                     "baseline": round(float(base[sel].mean()), 4),
                     "staleness_1": per_k.get(1), "mean_over_staleness": {
                         "model": round(float(np.mean([v["model"] for v in per_k.values()])), 4),
                         "baseline": round(float(np.mean([v["baseline"] for v in per_k.values()])), 4)},
                     "per_staleness": per_k}
        temps = traces.traces["temperature"][traces.rows["trace"][ex.src]]
        out[name]["per_temperature"] = {
            f"{t:g}": {"model": round(float(hit[sel & (temps == t)].mean()), 4),
                       "baseline": round(float(base[sel & (temps == t)].mean()), 4)}
            for t in np.unique(temps[sel])}
    return out


def limit_examples(ex: Examples, limit: int, seed: int) -> Examples:
    if len(ex) <= limit:
        return ex
    return ex.subset(np.sort(np.random.default_rng(seed).choice(len(ex), limit, replace=False)))


# -- export ---------------------------------------------------------------------------------------------------------
GRAPH_ENCODER = "encoder"       # drafter.json `graph`: the whole order model
GRAPH_BASELINE = "baseline"     # its skips alone (BaselineGraph), exported when the heads are zero


def export_onnx(model: OrderModel, path: Path, sample: dict[str, np.ndarray], tol: float = 1e-4,
                graph: str | None = None) -> dict:
    """torch.onnx.export (opset 17, dynamic K and B), then check ORT against the torch model on `sample` and on
    other shapes; SpotError beyond tol. graph: GRAPH_ENCODER, GRAPH_BASELINE (only for zero heads) or None = the
    baseline graph exactly when the heads are zero. Returns {"graph", "inputs" (the graph's, in order),
    "max_abs_diff"}."""
    ort = load_onnxruntime()

    model.eval()
    graph = graph or (GRAPH_BASELINE if model.heads_are_zero() else GRAPH_ENCODER)
    if graph not in (GRAPH_ENCODER, GRAPH_BASELINE):
        raise SpotError(f"drafter graph {graph!r}: expected {GRAPH_ENCODER!r} or {GRAPH_BASELINE!r}")
    if graph == GRAPH_BASELINE and not model.heads_are_zero():
        raise SpotError("the baseline drafter graph needs an order model whose heads are zero, got trained heads",
                        f"export the whole model (graph {GRAPH_ENCODER!r})")
    exported, names = (model, INPUT_NAMES) if graph == GRAPH_ENCODER else (BaselineGraph(model), BASELINE_INPUTS)
    args = tuple(t for n, t in zip(INPUT_NAMES, to_torch(sample)) if n in names)
    dyn = {"topk": {0: "K", 1: "B"}, "masked": {0: "K", 1: "B"}, "stale_conf": {0: "K", 1: "B"},
           "staleness": {0: "K"}, "order_logits": {0: "K", 1: "B"}, "member_logits": {0: "K", 1: "B"}}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(exported, args, str(path), input_names=list(names), output_names=list(OUTPUT_NAMES),
                          opset_version=17, dynamic_axes={k: v for k, v in dyn.items() if k in names or
                                                          k in OUTPUT_NAMES}, dynamo=False)
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    got_names = tuple(i.name for i in sess.get_inputs())
    if got_names != names:
        raise SpotError(f"the exported drafter graph has inputs {got_names}, expected {names}")
    worst = 0.0
    b = sample["masked"].shape[1]
    for inputs in (sample, random_inputs(3, b, seed=1), random_inputs(1, max(2, b // 2), seed=2)):
        with torch.no_grad():
            ref = [t.numpy() for t in model(*to_torch(inputs))]     # always the whole model
        got = sess.run(list(OUTPUT_NAMES), {n: inputs[n] for n in names})
        worst = max(worst, *(float(np.abs(r - g).max()) for r, g in zip(ref, got)))
    if worst > tol:
        raise SpotError(f"the ONNX drafter differs from torch by {worst:.2e}, expected <= {tol:.0e}")
    return {"graph": graph, "inputs": list(names), "max_abs_diff": worst}


def random_inputs(k: int, b: int, seed: int = 0) -> dict[str, np.ndarray]:
    """Plausible random drafter inputs (export checks and tests)."""
    rng = np.random.default_rng(seed)
    logits = rng.normal(size=(b, 64)) * 3
    logp = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
    topk = -np.sort(-logp, axis=-1)[:, :TOPK_FEATURES]
    masked = rng.random((k, b)) < 0.6
    return drafter_inputs(topk, masked, rng.random((k, b)), rng.integers(1, 20, k))


def write_drafter(model: OrderModel, out_dir: Path, manifest: dict, sample: dict[str, np.ndarray]) -> dict:
    """Export to out_dir/drafter.onnx + drafter.json: temporary names, validated, then renamed (json last)."""
    out_dir = Path(out_dir)
    # unique temporary names (two runs into one folder do not write each other's), removed on any failure; the
    # inner block's file is renamed first: drafter.onnx, then the drafter.json that vouches for it
    with atomic_output(out_dir / DRAFTER_JSON, ".json") as tmp_json, \
            atomic_output(out_dir / DRAFTER_ONNX, ".onnx") as tmp_onnx:
        exported = export_onnx(model, tmp_onnx, sample)
        manifest = {**manifest, "onnx": DRAFTER_ONNX, "onnx_sha256": sha256_file(tmp_onnx),
                    "onnx_bytes": tmp_onnx.stat().st_size, "graph": exported["graph"],
                    "inputs": exported["inputs"], "onnx_vs_torch_max_abs_diff": exported["max_abs_diff"]}
        tmp_json.write_text(json.dumps(manifest, indent=2) + "\n")
    return manifest


def drafter_out_folder(out: str | Path | None, traces: Traces, overwrite: bool = False) -> str | Path:
    """Where train-drafter writes: --out, else the target folder the traces came from; refused now, before the
    training, where a drafter is there already (unless overwrite: e.g. the embedded model's shipped one) or the
    folder cannot be written."""
    if out is None:
        out = traces.meta.get("model_dir")
        if not out:
            raise SpotError("the traces do not name their target folder", "pass --out FOLDER")
    check_output_path(out, "--out", folder=True)
    there = [name for name in DRAFTER_PAIR if present(Path(out) / name)]
    if there and not overwrite:
        raise SpotError(f"{out} already has a drafter ({', '.join(there)})",
                        "pass --overwrite to replace it, or --out FOLDER")
    if there and not drafter_pair_vouched(Path(out)):
        raise SpotError(f"{out}'s {' and '.join(there)} are not a drafter spot wrote ({DRAFTER_JSON} is not a spot "
                        f"drafter descriptor whose onnx_sha256 is {DRAFTER_ONNX}'s), and --overwrite replaces only "
                        "spot's", f"move them out of {out} (or delete them: a `spot train-drafter` killed between "
                        "the two files leaves such a pair), or choose another --out")
    return out


def train_drafter(traces: Traces, out_dir: str | Path, settings: DrafterTrainSettings = DrafterTrainSettings(),
                  heldout: Traces | None = None, log: Callable[[str], None] = print,
                  config: OrderModelConfig = OrderModelConfig()) -> dict:
    """Train, calibrate, score and export; returns drafter.json's contents. `config`: the order model's shape
    (default the reference 0.62M one; a target of a few M parameters wants a smaller one, docs/drafter.md)."""
    s = settings
    if not 0.0 <= s.tau < 1.0:
        raise SpotError(f"tau must be in [0, 1), got {s.tau}")
    if traces.block_size > MAX_BLOCK:
        raise SpotError(f"block size {traces.block_size} exceeds the order model's limit of {MAX_BLOCK}")
    train_ids, calib_ids, held_ids = split_traces(traces, s)
    if heldout is not None:
        train_ids = np.sort(np.concatenate([train_ids, held_ids]))
        held_ids = None
    # a few traces the model does not train on: weight selection and the light threshold calibration
    cal = limit_examples(make_examples(traces, calib_ids), s.eval_limit, s.seed + 1)
    model, report = train_order_model(traces, train_ids, s, log, select=limit_examples(cal, 2000, s.seed + 3),
                                       config=config)
    threshold, cal_acc = 0.5, None
    if len(cal):
        order, member = predict(model, traces, cal)
        masked = example_inputs(traces, cal)["masked"] > 0
        _, _, target_sets = example_labels(traces, cal, s.tau)
        threshold, cal_acc = calibrate_threshold(member, order, masked, target_sets)
    log(f"membership threshold {threshold} (whole-set match {cal_acc} on {len(cal)} calibration examples)")
    held_traces = heldout if heldout is not None else traces
    held_ex = make_examples(held_traces, held_ids)
    accuracy = score(model, held_traces, limit_examples(held_ex, s.eval_limit, s.seed + 2), s.tau, threshold)
    for name in ("top1", "whole_set"):
        a = accuracy.get(name)
        if a:
            log(f"held-out {name}: staleness 1 {a['staleness_1']}, mean over staleness "
                f"{a['mean_over_staleness']}, all {a['model']} (baseline {a['baseline']})")
    cfg = model.cfg
    manifest = {
        "format": FORMAT, "format_version": FORMAT_VERSION,
        "block_size": traces.block_size, "target": traces.meta["target"],
        "temperatures": traces.meta["temperatures"], "rules": traces.meta["rules"], "tau": s.tau,
        "member_threshold": threshold, "calibration_whole_set": cal_acc,
        "max_staleness": min(traces.depth, MAX_STALENESS), "topk": TOPK_FEATURES,
        "outputs": list(OUTPUT_NAMES),
        "architecture": {**asdict(cfg), "parameters": parameter_count(model)},
        "accuracy": accuracy,
        "training": {**{k: v for k, v in asdict(s).items()}, "train_traces": int(train_ids.size),
                     "calibration_traces": int(calib_ids.size),
                     "heldout_traces": int(held_traces.n_traces if heldout is not None else held_ids.size),
                     "trace_rows": traces.n_rows, "model_dir": traces.meta.get("model_dir"), **report},
    }
    sample = example_inputs(held_traces, limit_examples(held_ex, 8, 0)) if len(held_ex) else \
        random_inputs(4, traces.block_size)
    manifest = write_drafter(model, Path(out_dir), manifest, sample)
    log(f"wrote {Path(out_dir) / DRAFTER_ONNX} ({manifest['onnx_bytes'] / 1e6:.2f} MB, ORT vs torch max |diff| "
        f"{manifest['onnx_vs_torch_max_abs_diff']:.1e}) and {DRAFTER_JSON}")
    if manifest["graph"] == GRAPH_BASELINE:
        log("the heads are zero (weight selection kept step 0): this drafter IS the stale-confidence baseline, and "
            "drafter.onnx computes only that (the encoder could not change its outputs)")
    return manifest
