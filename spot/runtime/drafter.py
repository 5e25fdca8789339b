"""The drafter (order model, docs/spec.md §6) at runtime: its input features, ONNX Runtime inference, and the
proposer that turns its logits into SPOT / SPOT-Sets children. numpy + onnxruntime only.

Features of K tree nodes of one round, all reading the same stale logits L~ = L(s_m) [B, V]:
  topk       [K, B, 32] float32  top-32 log-probabilities of softmax(L~/T) (softmax(L~) at T = 0), per position
  masked     [K, B]     float32  1 where the node's state holds the mask id
  stale_conf [K, B]     float32  confidence of the coupled sample for the node's step (0 where not masked)
  staleness  [K]        int64    node depth + 1 = steps between the stale logits and the node (clipped)
Training (spot.training.drafter) builds its inputs with `drafter_inputs` too, so the two cannot drift.

Outputs: order_logits [K, B] (softmax over masked positions = P(next commit)) and member_logits [K, B]
(sigmoid = P(position in the next committed set), SPOT-Sets). The membership threshold calibrated at training is
folded in here so that `set_candidates`' 0.5 cut equals the calibrated one; the order temperature calibrated per
target (drafter.json `order_temperature`, `spot calibrate-drafter`) divides the order logits.
"""
from __future__ import annotations

import copy
import hashlib
import json
import math
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from spot.config import MODEL_FIELDS, ModelConfig
from spot.descriptors import load_descriptor, sha256_file
from spot.drafter_files import DRAFTER_JSON, DRAFTER_ONNX, FORMAT, FORMAT_VERSION
from spot.errors import SpotError, path_arg
from spot.ortlib import load_onnxruntime
from spot.schema import SHA256, Integer, ListOf, Nullable, Number, Record, checked
from spot.runtime import libm
from spot.runtime.engine import check_threads
from spot.runtime.proposers import RoundInputs, position_candidates, runner_up_alternatives, set_candidates
from spot.runtime.stale import TOPK_FEATURES, StaleView
from spot.runtime.step import STATIC
from spot.runtime.tree import Node

MAX_STALENESS = 32        # staleness embedding has entries 0..MAX_STALENESS (0 unused)
MAX_BLOCK = 64            # learned position embedding size
INPUT_NAMES = ("topk", "masked", "stale_conf", "staleness")
# The inputs of a drafter exported as its training-free skips alone (its heads were zero: spot.training.drafter
# BaselineGraph); a graph reads a subset of INPUT_NAMES, and the runtime computes only what it reads.
BASELINE_INPUTS = ("masked", "stale_conf")
OUTPUT_NAMES = ("order_logits", "member_logits")
DEFAULT_BRANCH = 4
# Queued candidates proposed for ahead of time in each drafter call (spot.runtime.tree.build_tree): one ORT call costs
# about as much as a few more nodes in it, so fewer, larger calls (the figures: docs/benchmarks.md, "lookahead").
DEFAULT_LOOKAHEAD = 4
DRAFTER_THREADS = 1
# Divides the order logits before the softmax that ranks and weighs tree children (a light per-target calibration:
# `spot calibrate-drafter` picks it by target passes on training prompts; 1 = the model's own logits).
ORDER_TEMPERATURE = "order_temperature"
# Weight of the runner-up children (spot.runtime.proposers.runner_up_alternatives): a child committing a position's
# second-best coupled token, weighted weight * exp(-score gap). 0 turns them off. The default is the embedded
# target's calibration (`spot calibrate-drafter`, training prompts; docs/drafter.md).
RUNNER_UP_WEIGHT = "runner_up_weight"
DEFAULT_RUNNER_UP_WEIGHT = 0.17
# Weight of SPOT-Sets' flip variants (spot.runtime.proposers.set_candidates: the predicted set with its least certain
# position flipped), multiplying their independence-model probability. 1 = unweighted (drafters calibrated before
# this setting existed), 0 = none; `spot calibrate-drafter` picks it by spot-sets target passes.
SET_FLIP_WEIGHT = "set_flip_weight"
DEFAULT_SET_FLIP_WEIGHT = 1.0
# SPOT's tree shape per verify budget (`spot calibrate-drafter`, by replayed target passes): a list of {nodes, branch,
# depth, order_temperature, runner_up_weight, stale_top_bonus}; a budget of N nodes uses the entry with the most
# nodes <= N, else the drafter's own order_temperature and runner_up_weight with DEFAULT_BRANCH, the budget's depth
# and no bonus. stale_top_bonus is added to the (tempered) order logit of the node's most confident stale position:
# on a target whose confident positions nearly tie, the exact stale-confidence ranking names the next commit more
# often than an order model at small staleness, which is what a 2- or 4-node tree lives on (docs/drafter.md).
TREE_SHAPES = "tree_shapes"
MAX_TREE_SHAPES = 32
MAX_SHAPE_NODES = 4096    # an export's most nodes per verify pass (manifest.MAX_NODES)
MEMBER_SHARPNESS = 32.0   # stale-confidence membership when the rule's tau is not the one the drafter learned
# The target facts a drafter is tied to: its inputs are vocabulary-free, but its training distribution is one
# target's (block size is checked separately, against the engine's block size).
IDENTITY_FIELDS = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                   "num_key_value_heads", "head_dim", "mask_token_id")
# drafter.json's fields the hosts read (spot.schema; the C++ host checks the same, cpp/src/drafter.cpp): null is the
# default of an optional one; the others (accuracy, architecture, ...) are a report, read by neither host
UNIT = Number(0, 1)
STALE_TOP_BONUS = "stale_top_bonus"
MAX_STALE_TOP_BONUS = 100.0
TREE_SHAPE = Record({"nodes": Integer(1, MAX_SHAPE_NODES), "branch": Integer(1, MAX_BLOCK),
                     "depth": Integer(1, MAX_BLOCK), ORDER_TEMPERATURE: Number(0, lo_open=True),
                     RUNNER_UP_WEIGHT: UNIT, STALE_TOP_BONUS: Number(0, MAX_STALE_TOP_BONUS)},
                    ("nodes", "branch", "depth", ORDER_TEMPERATURE, RUNNER_UP_WEIGHT, STALE_TOP_BONUS), others=None,
                    what="a tree shape")
DRAFTER_FILE = Record({
    "block_size": Integer(1, MAX_BLOCK),
    "target": Record({f: MODEL_FIELDS[f] for f in IDENTITY_FIELDS}, what="an object of the target's facts"),
    "onnx_sha256": SHA256,
    "member_threshold": Nullable(Number(0, 1, lo_open=True, hi_open=True)),
    "max_staleness": Nullable(Integer(1, MAX_STALENESS)),
    "tau": Nullable(Number(0, 1, hi_open=True)),
    ORDER_TEMPERATURE: Nullable(Number(0, lo_open=True)),
    RUNNER_UP_WEIGHT: Nullable(UNIT),
    SET_FLIP_WEIGHT: Nullable(UNIT),
    TREE_SHAPES: Nullable(ListOf(TREE_SHAPE, MAX_TREE_SHAPES)),
}, ("block_size", "target", "onnx_sha256"))


@dataclass(frozen=True)
class TreeShape:
    """How SPOT's proposer grows a tree under the static rule: children per node, the deepest node it proposes
    children for (None: the budget's depth alone), the order temperature and the runner-up children's weight."""

    branch: int
    depth: int | None
    order_temperature: float
    runner_up_weight: float
    stale_top_bonus: float = 0.0


def shape_entry(shapes: list[dict], nodes: int) -> dict | None:
    """The entry of a tree_shapes list for a budget of `nodes` nodes: the one with the most nodes <= `nodes` (the first
    of equals), or None."""
    fitting = [e for e in shapes if e["nodes"] <= nodes]
    return max(fitting, key=lambda e: e["nodes"], default=None)


# -- features ------------------------------------------------------------------------------------------------------
def drafter_inputs(topk: np.ndarray | None, masked: np.ndarray, conf: np.ndarray, staleness: np.ndarray,
                   max_staleness: int = MAX_STALENESS) -> dict[str, np.ndarray]:
    """The ONNX inputs of K nodes.

    topk [B, 32] (one stale view shared by every node) or [K, B, 32], or None: no "topk" entry (a graph that does
    not read it); masked [K, B] bool (node state == mask); conf [K, B] coupled-sample confidence for each node's
    step (any value, -inf included, where not masked); staleness [K] int (node depth + 1), clipped to
    1..max_staleness."""
    masked = np.asarray(masked, dtype=bool)
    k, b = masked.shape
    stale_conf = np.where(masked, conf, 0.0).astype(np.float32)
    out = {"masked": masked.astype(np.float32), "stale_conf": stale_conf,
           "staleness": np.clip(np.asarray(staleness, dtype=np.int64), 1, max_staleness)}
    if topk is not None:
        topk = np.asarray(topk, dtype=np.float32)
        if topk.ndim == 2:
            topk = np.broadcast_to(topk[None], (k, b, topk.shape[-1]))
        if topk.shape != (k, b, TOPK_FEATURES):
            raise ValueError(f"topk: got shape {topk.shape}, expected [{k}, {b}, {TOPK_FEATURES}]")
        out["topk"] = np.ascontiguousarray(topk)
    return out


def node_inputs(stale: StaleView, nodes: list[Node], mask_id: int, max_staleness: int = MAX_STALENESS,
                with_topk: bool = True) -> dict[str, np.ndarray]:
    """Features of tree nodes of one round (stale = the round's view of L(s_m)); the top-32 features only
    with_topk (the round's view computes them on first use)."""
    masked = np.stack([n.state == mask_id for n in nodes])
    conf = np.stack([stale.coupled(n.step)[1] for n in nodes])
    staleness = np.array([n.depth + 1 for n in nodes], dtype=np.int64)
    return drafter_inputs(stale.topk_logprobs() if with_topk else None, masked, conf, staleness, max_staleness)


def masked_log_softmax(logits: np.ndarray, masked: np.ndarray, temperature: float = 1.0,
                       bonus: np.ndarray | None = None) -> np.ndarray:
    """logits [..., B], masked [..., B] bool -> log-softmax of logits / temperature (+ bonus [..., B], float64) over
    the masked positions (-inf elsewhere). float64 with the C library's exp/log (spot.runtime.libm), as the C++ host
    computes it."""
    z = logits.astype(np.float64) / temperature
    if bonus is not None:
        z = z + bonus
    z = np.where(masked, z, -np.inf)
    zmax = z.max(axis=-1, keepdims=True)
    zmax = np.where(np.isfinite(zmax), zmax, 0.0)
    return z - zmax - libm.log(libm.exp(z - zmax).sum(axis=-1, keepdims=True))


def sigmoid(x: np.ndarray) -> np.ndarray:
    """0.5 (1 + tanh(x / 2)) with the C library's tanh (numpy's SIMD tanh differs in the last bit from the C++
    host's, which could reorder near-tied tree candidates)."""
    return 0.5 * (1.0 + libm.tanh(0.5 * np.asarray(x, dtype=np.float64)))


def _checked_setting(name: str, value, path, valid, expected: str, hint: str) -> float:
    """A drafter.json tree setting as a float, or a SpotError naming the field and the file."""
    try:
        v = float(value)
    except (TypeError, ValueError):
        v = float("nan")
    if not (np.isfinite(v) and valid(v)):
        raise SpotError(f"drafter {path}: {name} is {value!r}, expected {expected}",
                        f"fix drafter.json ({hint}) or rerun `spot calibrate-drafter`")
    return v


def check_runner_up_weight(value, path) -> float:
    """drafter.json's runner_up_weight: a number in [0, 1]."""
    return _checked_setting(RUNNER_UP_WEIGHT, value, path, lambda w: 0.0 <= w <= 1.0, "a number in [0, 1]",
                            "0 = no runner-up children")


def check_set_flip_weight(value, path) -> float:
    """drafter.json's set_flip_weight: a number in [0, 1]."""
    return _checked_setting(SET_FLIP_WEIGHT, value, path, lambda w: 0.0 <= w <= 1.0, "a number in [0, 1]",
                            "0 = no flip variants")


def check_order_temperature(value, path) -> float:
    """drafter.json's order_temperature: a finite number > 0."""
    return _checked_setting(ORDER_TEMPERATURE, value, path, lambda t: t > 0, "a number > 0",
                            "1 = the order model's own logits")


def logit(p: float) -> float:
    p = min(max(float(p), 1e-6), 1 - 1e-6)
    return math.log(p) - math.log1p(-p)         # the C library's, as the C++ host computes member_offset


# -- target identity ------------------------------------------------------------------------------------------------
def target_identity(config: ModelConfig) -> dict:
    """The architecture facts of the target a drafter was trained on, plus a short hash of them."""
    ident = {f: getattr(config, f) for f in IDENTITY_FIELDS}
    ident["config_sha256"] = hashlib.sha256(json.dumps(ident, sort_keys=True).encode()).hexdigest()[:16]
    return ident


# -- the drafter ----------------------------------------------------------------------------------------------------
def resolve_paths(path: str | Path) -> tuple[Path, Path]:
    """A folder holding drafter.onnx + drafter.json, or the .onnx file (manifest beside it) -> (onnx, json)."""
    path = Path(path)
    if path.is_dir():
        onnx_path, json_path = path / DRAFTER_ONNX, path / DRAFTER_JSON
    else:
        onnx_path, json_path = path, path.with_name(DRAFTER_JSON)
        if path.name != DRAFTER_ONNX and path.is_file():     # drafter.json describes drafter.onnx, not this file
            raise SpotError(f"{path} is not a drafter: a drafter is {DRAFTER_ONNX} beside its {DRAFTER_JSON}",
                            f"pass the drafter's folder or its {DRAFTER_ONNX}")
    if not onnx_path.is_file():
        raise SpotError(f"drafter model {onnx_path} does not exist",
                        "train one with `spot train-drafter`, or pass the folder that holds drafter.onnx")
    if not json_path.is_file():
        raise SpotError(f"drafter manifest {json_path} does not exist (it belongs beside {onnx_path.name})",
                        "re-export the drafter with `spot train-drafter`")
    return onnx_path, json_path


class Drafter:
    """An order model exported by `spot train-drafter`: drafter.onnx run by ONNX Runtime, facts from drafter.json."""

    def __init__(self, onnx_path: Path, manifest: dict, threads: int | None = None):
        ort = load_onnxruntime()

        self.path = Path(onnx_path)
        self.manifest = manifest
        opts = ort.SessionOptions()
        # one thread by default, as the C++ host: a call covers a few nodes x B positions, too little work to split,
        # and waking a second thread costs more than it saves (AVX-512 CPU, 16x8: 4.3 -> 3.5 ms of ORT per round
        # at T = 0, 4.1 -> 3.0 at T = 1; benchmarks/host_split.py, 4 alternating runs each)
        opts.intra_op_num_threads = check_threads(threads) or DRAFTER_THREADS
        opts.inter_op_num_threads = 1
        # no spin-waiting after a run: spinning drafter threads would steal the cores of the target pass that follows
        opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
        opts.log_severity_level = 3
        try:
            self.session = ort.InferenceSession(str(self.path), opts, providers=["CPUExecutionProvider"])
        except Exception as e:  # onnxruntime raises its own exception types for unreadable graphs
            raise SpotError(f"cannot load drafter {self.path}: {e}", "re-export it with `spot train-drafter`") \
                from None
        names = tuple(i.name for i in self.session.get_inputs())
        if not names or not set(names) <= set(INPUT_NAMES):     # (ONNX input names are unique)
            raise SpotError(f"drafter {self.path} has inputs {names}, expected some of {INPUT_NAMES}",
                            "re-export it with `spot train-drafter`")
        self.input_names = names
        self.reads_topk = "topk" in names      # else the top-32 features are never computed

        def setting(key: str, default):
            return default if manifest.get(key) is None else manifest[key]
        self.block_size = manifest["block_size"]
        self.target = dict(manifest["target"])
        self.member_threshold = float(setting("member_threshold", 0.5))
        self.member_offset = logit(self.member_threshold)
        self.max_staleness = setting("max_staleness", MAX_STALENESS)
        self.tau = manifest.get("tau")     # the threshold rule's tau the membership head learned
        self.order_temperature = float(setting(ORDER_TEMPERATURE, 1.0))
        self.runner_up_weight = float(setting(RUNNER_UP_WEIGHT, DEFAULT_RUNNER_UP_WEIGHT))
        self.set_flip_weight = float(setting(SET_FLIP_WEIGHT, DEFAULT_SET_FLIP_WEIGHT))
        self.tree_shapes: list[dict] = list(setting(TREE_SHAPES, []))

    @staticmethod
    def load(path: str | Path, threads: int | None = None) -> "Drafter":
        onnx_path, json_path = resolve_paths(path)
        manifest = load_descriptor(json_path, FORMAT, FORMAT_VERSION, ("block_size", "target", "onnx_sha256"),
                                   "pass a drafter folder written by this version's `spot train-drafter`",
                                   strict=True)
        checked(manifest, DRAFTER_FILE, f"drafter {json_path}", "re-export it with `spot train-drafter`, or fix the "
                "field (`spot calibrate-drafter` writes the tree settings)")
        digest = sha256_file(onnx_path)
        if digest != manifest["onnx_sha256"]:
            raise SpotError(f"{onnx_path} does not match its manifest (sha256 {digest[:12]}..., expected "
                            f"{manifest['onnx_sha256'][:12]}...)",
                            f"{DRAFTER_ONNX} and {DRAFTER_JSON} are not one pair (a file changed or truncated, or a "
                            "`spot train-drafter` interrupted between them): run it again, or copy the pair again")
        return Drafter(onnx_path, manifest, threads)

    def check_compatible(self, engine) -> None:
        """SpotError unless this drafter was trained for the engine's target and block size."""
        if engine.block_size != self.block_size:
            raise SpotError(f"drafter {self.path} was trained for block size {self.block_size}, got an engine "
                            f"decoding blocks of {engine.block_size}: expected {self.block_size}",
                            f"use `block_size={self.block_size}`, or train a drafter for block size "
                            f"{engine.block_size} with `spot traces` + `spot train-drafter`")
        got = target_identity(engine.config)
        for f in IDENTITY_FIELDS:
            if f not in self.target:     # a drafter that does not say which target it fits fits none
                raise SpotError(f"drafter {self.path}'s drafter.json names no target {f}",
                                "re-export the drafter with `spot train-drafter`")
            if got[f] != self.target[f]:
                raise SpotError(f"drafter {self.path} was trained for another target: {f} is {got[f]} in the "
                                f"engine's model, expected {self.target[f]}",
                                "use the drafter shipped with this model, or train one with `spot traces` + "
                                "`spot train-drafter`")

    def with_settings(self, order_temperature: float | None = None, runner_up_weight: float | None = None,
                      set_flip_weight: float | None = None) -> "Drafter":
        """The same model (and ORT session) with other tree settings (spot.training.calibration); None keeps this
        drafter's."""
        other = copy.copy(self)
        if order_temperature is not None:
            other.order_temperature = check_order_temperature(order_temperature, self.path)
        if runner_up_weight is not None:
            other.runner_up_weight = check_runner_up_weight(runner_up_weight, self.path)
        if set_flip_weight is not None:
            other.set_flip_weight = check_set_flip_weight(set_flip_weight, self.path)
        return other

    def with_tree_shapes(self, shapes: list[dict]) -> "Drafter":
        """The same model with another tree_shapes table ([]: the drafter's own settings at every budget)."""
        other = copy.copy(self)
        other.tree_shapes = list(shapes)
        return other

    def shape_for(self, nodes: int | None) -> TreeShape:
        """The tree shape for a budget of `nodes` nodes (None: no budget's entry, the drafter's own settings)."""
        e = None if nodes is None else shape_entry(self.tree_shapes, nodes)
        if e is None:
            return TreeShape(DEFAULT_BRANCH, None, self.order_temperature, self.runner_up_weight)
        return TreeShape(int(e["branch"]), int(e["depth"]), float(e[ORDER_TEMPERATURE]), float(e[RUNNER_UP_WEIGHT]),
                         float(e[STALE_TOP_BONUS]))

    def run(self, inputs: dict[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
        """One ORT call: order_logits [K, B], member_logits [K, B] float32."""
        order, member = self.session.run(list(OUTPUT_NAMES), {n: inputs[n] for n in self.input_names})
        return order, member

    def proposer(self, branch: int | None = None, lookahead: int = DEFAULT_LOOKAHEAD,
                 nodes: int | None = None) -> "DrafterProposer":
        """SPOT's proposer for a budget of `nodes` nodes (its tree shape); branch, when given, overrides the shape's."""
        return DrafterProposer(self, branch, lookahead, self.shape_for(nodes))


class DrafterProposer:
    """SPOT / SPOT-Sets proposer: all nodes requested at once go through ONE drafter call.

    static rule (its TreeShape: the budget's tree_shapes entry, else the drafter's own settings): log-softmax of the
    order logits / order temperature over masked positions, one child per top-`branch` position, plus its runner-up
    token's child (runner-up weight; none at 0); no children below the shape's depth;
    threshold rule (the drafter's own settings, DEFAULT_BRANCH): the predicted set {sigmoid(member) > calibrated
    threshold} (else the top order position) and up to `branch - 1` alternatives: flips of the least certain
    positions (weighted by `set_flip_weight`) and swaps of one member's token for its runner-up (weighted as above);
    for a tau other than the one the drafter learned, membership comes from the stale confidence instead. Tokens: the
    coupled samples of the node's step. `branch`, when given, overrides both rules' branch."""

    def __init__(self, drafter: Drafter, branch: int | None = None, lookahead: int = DEFAULT_LOOKAHEAD,
                 shape: TreeShape | None = None):
        if branch is not None and branch < 1:
            raise SpotError(f"drafter branch must be >= 1, got {branch}")
        if lookahead < 0:
            raise SpotError(f"drafter lookahead must be >= 0, got {lookahead}")
        static, sets = shape or drafter.shape_for(None), drafter.shape_for(None)
        if branch is not None:
            static, sets = replace(static, branch=branch), replace(sets, branch=branch)
        self.drafter, self.lookahead, self.shapes = drafter, lookahead, {True: static, False: sets}
        self.round: RoundInputs | None = None
        self.calls = 0

    @property
    def shape(self) -> TreeShape:
        """The tree shape of the round's rule (the static rule's before the first round)."""
        return self.shapes[self.round is None or self.round.rule.kind == STATIC]

    @property
    def branch(self) -> int:
        return self.shape.branch

    def begin_round(self, round_inputs: RoundInputs, state: np.ndarray, step: int) -> None:
        self.round = round_inputs
        if self.shape.runner_up_weight > 0:
            round_inputs.stale.runner_ups_wanted = True     # sampled with the coupled samples, in one pass

    def propose(self, tree: list[Node], nodes: list[int]) -> list[list[tuple[float, np.ndarray]]]:
        shape = self.shape
        # the shape's depth: a node there gets no children (the tree as build_tree's max_depth would leave it)
        asked = [tree[i] for i in nodes if shape.depth is None or tree[i].depth < shape.depth]
        answers = iter(self.candidates(asked, shape) if asked else [])
        return [next(answers) if shape.depth is None or tree[i].depth < shape.depth else [] for i in nodes]

    def candidates(self, chosen: list[Node], shape: TreeShape) -> list[list[tuple[float, np.ndarray]]]:
        """Each node's children, from ONE drafter call over all of them."""
        r = self.round
        inputs = node_inputs(r.stale, chosen, r.mask_id, self.drafter.max_staleness, self.drafter.reads_topk)
        order, member = self.drafter.run(inputs)
        self.calls += 1
        masked = inputs["masked"] > 0
        bonus = stale_top_bonus(r.stale, chosen, masked, shape.stale_top_bonus)
        logq_all = masked_log_softmax(order, masked, shape.order_temperature, bonus)   # [K, B], every node
        out = []
        for j, node in enumerate(chosen):
            tokens = r.stale.coupled(node.step)[0]
            logq = logq_all[j]
            runner_up = runner_up_alternatives(r.stale, node.step, shape.runner_up_weight, r.mask_id)
            if r.rule.kind == STATIC:
                out.append(position_candidates(node, logq, tokens, r.mask_id, shape.branch, runner_up))
            else:
                best = int(np.argmax(logq))        # where the threshold rule falls back to one commit
                if self.drafter.tau is None or abs(r.rule.tau - self.drafter.tau) < 1e-9:
                    member_p = sigmoid(member[j].astype(np.float64) - self.drafter.member_offset)
                else:  # the head learned another tau: use the stale confidence against this one (still exact)
                    member_p = sigmoid(MEMBER_SHARPNESS * (inputs["stale_conf"][j] - r.rule.tau))
                out.append(set_candidates(node, member_p, best, tokens, r.mask_id, shape.branch, runner_up,
                                          self.drafter.set_flip_weight))
        return out


def stale_top_bonus(stale, nodes: list[Node], masked: np.ndarray, bonus: float) -> np.ndarray | None:
    """[K, B] float64: `bonus` at each node's most confident stale position among its masked ones (the first of
    equals), 0 elsewhere; None at bonus 0."""
    if bonus <= 0:
        return None
    out = np.zeros(masked.shape)
    for j, node in enumerate(nodes):
        out[j, int(np.argmax(np.where(masked[j], stale.coupled(node.step)[1], -np.inf)))] = bonus
    return out


def load_drafter(path: str | Path, threads: int | None = None) -> Drafter:
    return Drafter.load(path_arg(path, "the drafter path"), threads)
