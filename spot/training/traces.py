"""Standard-decoding traces for training the drafter (docs/spec.md §6), collected through generate()'s observer hook.

For every standard step t of every block (state s_t, fresh logits L(s_t), next state s_{t+1}) a trace row keeps:
  state       [B] int32    s_t (mask id at undecided positions)
  committed   [B] bool     positions F committed at step t
  best        int16        the masked position with the largest fresh confidence (the static rule's commit)
  fresh_conf  [B] float64  fresh confidence of F's sample at step t (-1 where not masked): threshold labels for
                           any tau are {fresh_conf > tau} (else {best})
  topk        [B, 32] f32  StaleView topk features of L(s_t)
  future_conf [D, B] f32   coupled confidences StaleView(L(s_t), s_t masks).coupled(t + k)[1], k = 1..D
                           (0 where not masked): the stale_conf feature of a node at staleness k
Full logits are never stored. A teacher-forced example for staleness k is (stale row t, node row t + k of the same
block): the node's features are drafter_inputs(topk[t], state[t+k] == mask, future_conf[t, k-1], k) and its targets
are best / the committed set of row t + k.

Noise: the coupled sample of step tau is needed by D consecutive rows, so the Gumbel rows of (block, tau) are
computed once and reused (spot.runtime.noise.NoiseCache, as the decoders do); samples come from the runtime's own
spot.runtime.step.sample_positions with F's sampling (the mask id excluded, as generate() does), and every row checks
that its labels reproduce the committed set.
"""
from __future__ import annotations

import json
import math
import time
import zipfile
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable

import numpy as np

from spot.config import MAX_BLOCK_SIZE, MODEL_FIELDS, TOKEN_ID, training_corpus
from spot.descriptors import parse_json
from spot.errors import SpotError
from spot.files import atomic_output
from spot.prompts import load_prompts
from spot.runtime.decode import generate
from spot.runtime.drafter import IDENTITY_FIELDS, target_identity
from spot.runtime.engine import Engine
from spot.runtime.noise import NoiseCache
from spot.runtime.stale import TOPK_FEATURES, topk_logprobs
from spot.runtime.step import STATIC, THRESHOLD, CommitRule, Sampling, sample_positions, select_commits
from spot.schema import Integer, ListOf, Mismatch, Number, Record, Text, rule
from spot.training import corpus as corpus_module

TRACE_FORMAT = "spot-traces"
TRACE_VERSION = 1
DEFAULT_DEPTH = 16
DEFAULT_TEMPERATURES = (0.0, 0.5, 1.0)
RULE_CODES = {STATIC: 0, THRESHOLD: 1}
ROW_FIELDS = ("trace", "block", "step", "state", "committed", "best", "fresh_conf", "topk", "future_conf")
TRACE_FIELDS = ("temperature", "rule", "tau", "seed", "prompt", "prompt_len", "generated")


class TraceRecorder:
    """generate() observer that appends one trace row per standard step (see the module docstring)."""

    def __init__(self, trace_id: int, rule: CommitRule, sampling: Sampling, mask_id: int, block_size: int,
                 vocab_size: int, depth: int):
        self.trace_id, self.rule, self.mask_id, self.depth = trace_id, rule, mask_id, depth
        self.sampling = replace(sampling, exclude_token=mask_id)       # F's sampling (see generate())
        self.noise = NoiseCache(sampling.seed, vocab_size) if sampling.temperature > 0 else None
        self.rows: dict[str, list] = {f: [] for f in ROW_FIELDS}

    def _sample(self, logits, positions, block, step):
        return sample_positions(logits, positions, self.sampling, block, step, self.noise)

    def __call__(self, block: int, step: int, state: np.ndarray, outputs, nxt: np.ndarray) -> None:
        logits = outputs.host_logits()          # [B, V]: traces need the full distribution
        masked = np.flatnonzero(state == self.mask_id)
        b = state.shape[0]
        tokens, conf = self._sample(logits, masked, block, step)
        pick = select_commits(conf, self.rule)
        expected = state.copy()
        expected[masked[pick]] = tokens[pick]
        if not np.array_equal(expected, nxt):   # the labels must be F's own decision
            raise RuntimeError(f"trace labels drifted from the step function at block {block} step {step}: "
                               f"recomputed commits at {masked[pick].tolist()} differ from F's next state")
        committed = np.zeros(b, dtype=bool)
        committed[masked[pick]] = True
        fresh = np.full(b, -1.0)
        fresh[masked] = conf
        future = np.zeros((self.depth, b), dtype=np.float32)
        for k in range(1, self.depth + 1):
            if k > 1 and self.noise is None:      # T = 0: the coupled sample does not depend on the step
                future[k - 1] = future[0]
                continue
            future[k - 1, masked] = self._sample(logits, masked, block, step + k)[1]
        if self.noise is not None:
            self.noise.forget_before(step + 1)
        row = dict(trace=self.trace_id, block=block, step=step, state=state.astype(np.int32), committed=committed,
                   best=int(masked[np.argmax(conf)]), fresh_conf=fresh,
                   topk=topk_logprobs(logits, self.sampling.temperature), future_conf=future)
        for f in ROW_FIELDS:
            self.rows[f].append(row[f])


ROW_DTYPES = {"trace": np.int32, "block": np.int32, "step": np.int16, "state": np.int32, "committed": bool,
              "best": np.int16, "fresh_conf": np.float64, "topk": np.float32, "future_conf": np.float32}
TRACE_DTYPES = {"temperature": np.float32, "rule": np.int8, "tau": np.float32, "seed": np.int64, "prompt": np.int32,
                "prompt_len": np.int32, "generated": np.int32}


# the meta fields training reads (spot.schema); the others (engine, seconds, ...) are a report
TRACE_META = Record({
    "format": Text((TRACE_FORMAT,)), "format_version": Integer(TRACE_VERSION, TRACE_VERSION),
    "block_size": Integer(1, MAX_BLOCK_SIZE), "mask_token_id": TOKEN_ID, "depth": Integer(1, MAX_BLOCK_SIZE),
    "target": Record({f: MODEL_FIELDS[f] for f in IDENTITY_FIELDS}, what="an object of the target's facts"),
    "temperatures": ListOf(Number(0), 1024), "rules": ListOf(Text((STATIC, THRESHOLD)), 2),
}, ("format", "format_version", "block_size", "mask_token_id", "depth", "target", "temperatures", "rules"))


def _array_shapes(z: zipfile.ZipFile) -> dict[str, tuple[tuple[int, ...], np.dtype]]:
    """name -> (shape, dtype) of each array of an .npz, read from the .npy headers alone; ValueError unless each
    member holds exactly the bytes its header declares (np.load allocates an array by its header before reading)."""
    out = {}
    for info in z.infolist():
        if not info.filename.endswith(".npy"):
            raise ValueError(f"member {info.filename!r} is not an array")
        with z.open(info) as f:
            version = np.lib.format.read_magic(f)
            read = {(1, 0): np.lib.format.read_array_header_1_0, (2, 0): np.lib.format.read_array_header_2_0}
            if version not in read:
                raise ValueError(f"{info.filename}: .npy format version {version}")
            shape, _, dtype = read[version](f)
            declared = f.tell() + math.prod(shape) * dtype.itemsize
        if declared != info.file_size:
            raise ValueError(f"{info.filename} declares {declared} bytes, holds {info.file_size}")
        out[info.filename.removesuffix(".npy")] = (shape, dtype)
    return out


def check_trace_arrays(shapes: dict, meta: dict) -> None:
    """Mismatch unless each array has the dtype and shape its meta implies: rows [R, ...] and traces [T] of one
    R and T, each row's B = block_size positions and D = depth future steps (ROW_DTYPES, TRACE_DTYPES)."""
    b, d = meta["block_size"], meta["depth"]

    def length(name: str) -> tuple[int]:       # R or T: the first dim of a 1-d array (-1, which no shape has, else)
        shape = shapes.get(name, (None,))[0]
        return shape if shape is not None and len(shape) == 1 else (-1,)
    rows, traces = length("row_trace"), length("trace_rule")
    tails = {"state": (b,), "committed": (b,), "fresh_conf": (b,), "topk": (b, TOPK_FEATURES), "future_conf": (d, b)}
    want = {"meta": ((), None)}
    want.update({f"row_{f}": (rows + tails.get(f, ()), np.dtype(t)) for f, t in ROW_DTYPES.items()})
    want.update({f"trace_{f}": (traces, np.dtype(t)) for f, t in TRACE_DTYPES.items()})
    for name, (shape, dtype) in want.items():
        got_shape, got_dtype = shapes.get(name, (None, None))
        ok = got_shape == shape and (dtype == got_dtype if dtype is not None else got_dtype.kind == "U")
        rule(ok, name, f"{got_dtype} {list(got_shape)}" if got_shape is not None else "missing",
             f"{dtype or 'text'} {list(shape)}")


def check_trace_values(rows: dict, traces: dict, meta: dict) -> None:
    """Mismatch unless the values training indexes by are in range: each row's trace id among the traces, its best
    position within the block."""
    n, b = len(traces["rule"]), meta["block_size"]
    for name, values, top in (("row_trace", rows["trace"], n), ("row_best", rows["best"], b)):
        if values.size and not (0 <= values.min() and values.max() < top):
            rule(False, name, f"values {values.min()}..{values.max()}", f"values in 0..{top - 1}")


@dataclass
class Traces:
    """Rows (one per standard step) and per-trace facts (one per decoded request), plus file-level meta."""

    meta: dict
    rows: dict[str, np.ndarray] = field(default_factory=dict)
    traces: dict[str, np.ndarray] = field(default_factory=dict)

    @property
    def n_rows(self) -> int:
        return int(self.rows["trace"].shape[0]) if self.rows else 0

    @property
    def n_traces(self) -> int:
        return int(self.traces["rule"].shape[0]) if self.traces else 0

    @property
    def block_size(self) -> int:
        return int(self.meta["block_size"])

    @property
    def mask_id(self) -> int:
        return int(self.meta["mask_token_id"])

    @property
    def depth(self) -> int:
        return int(self.meta["depth"])

    def save(self, path: str | Path) -> Path:
        """Compressed .npz, written to a temporary name and renamed."""
        path = Path(path)
        arrays = {f"row_{k}": v for k, v in self.rows.items()}
        arrays.update({f"trace_{k}": v for k, v in self.traces.items()})
        with atomic_output(path, ".npz") as tmp:       # (savez adds .npz to a name without it)
            np.savez_compressed(tmp, meta=np.array(json.dumps(self.meta)), **arrays)
        return path

    @staticmethod
    def load(path: str | Path) -> "Traces":
        path = Path(path)
        if not path.is_file():
            raise SpotError(f"trace file {path} does not exist", "collect traces with `spot traces`")
        remedy = "collect traces with `spot traces`"
        try:
            with zipfile.ZipFile(path) as z:
                shapes = _array_shapes(z)
            with np.load(path, allow_pickle=False) as z:
                meta = parse_json(str(z["meta"]) if shapes.get("meta", ((0,),))[0] == () else "",
                                  f"{path}'s meta", remedy, strict=True)
                if not isinstance(meta, dict) or (meta.get("format"), meta.get("format_version")) != (
                        TRACE_FORMAT, TRACE_VERSION):
                    got = (meta.get("format"), meta.get("format_version")) if isinstance(meta, dict) else meta
                    raise SpotError(f"{path} has format {got!r}, expected {TRACE_FORMAT!r} v{TRACE_VERSION}",
                                    "collect traces again with `spot traces`")
                TRACE_META.check(meta)
                check_trace_arrays(shapes, meta)     # before a byte of the arrays is allocated
                rows = {f: z[f"row_{f}"] for f in ROW_FIELDS}
                traces = {f: z[f"trace_{f}"] for f in TRACE_FIELDS}
            check_trace_values(rows, traces, meta)
        except Mismatch as e:
            raise SpotError(e.message(str(path)), remedy) from None
        except (KeyError, ValueError, OSError, zipfile.BadZipFile, EOFError) as e:
            raise SpotError(f"{path} is not a trace file written by `spot traces` ({type(e).__name__}: {e})",
                            remedy) from None
        return Traces(meta, rows, traces)


def concat_traces(parts: list[Traces]) -> Traces:
    """One Traces from several files of the same target, block size and depth (trace ids renumbered)."""
    if not parts:
        raise SpotError("no trace files given", "pass --traces FILE (from `spot traces`)")
    first = parts[0].meta
    for p in parts[1:]:
        for key in ("block_size", "mask_token_id", "depth", "target"):
            if p.meta[key] != first[key]:
                raise SpotError(f"trace files disagree on {key}: got {p.meta[key]}, expected {first[key]}",
                                "train one drafter per target, block size and depth")
    rows = {f: [] for f in ROW_FIELDS}
    traces = {f: [] for f in TRACE_FIELDS}
    offset = 0
    for p in parts:
        for f in ROW_FIELDS:
            rows[f].append(p.rows[f] + offset if f == "trace" else p.rows[f])
        for f in TRACE_FIELDS:
            traces[f].append(p.traces[f])
        offset += p.n_traces
    meta = dict(first)
    meta["temperatures"] = sorted({t for p in parts for t in p.meta["temperatures"]})
    meta["rules"] = sorted({r for p in parts for r in p.meta["rules"]})
    return Traces(meta, {f: np.concatenate(v) for f, v in rows.items()},
                  {f: np.concatenate(v) for f, v in traces.items()})


@dataclass(frozen=True)
class TracePlan:
    """What to decode: every prompt x temperature x rule, with `seeds` seeds at T > 0 (one at T = 0); or, with
    `cycle`, one request per prompt going round those combinations (more prompts for the same time)."""

    temperatures: tuple[float, ...] = DEFAULT_TEMPERATURES
    rules: tuple[str, ...] = (STATIC, THRESHOLD)
    tau: float = 0.9
    seeds: int = 2
    max_new_tokens: int = 64
    depth: int = DEFAULT_DEPTH
    cycle: bool = False

    def __post_init__(self):
        for t in self.temperatures:         # checked now, not after decoding the combinations before it
            Sampling(t)

    def combos(self) -> list[tuple[float, str, int]]:
        return [(float(t), rule, s) for t in self.temperatures for rule in self.rules
                for s in range(self.seeds if t > 0 else 1)]

    def requests(self, n_prompts: int):
        """(prompt index, temperature, rule, seed) in collection order: prompt-major, so a time limit keeps the
        mix of temperatures and rules balanced."""
        combos = self.combos()
        for p in range(n_prompts):
            for t, rule, s in ([combos[p % len(combos)]] if self.cycle else combos):
                yield p, t, rule, (p * 1009 + s * 7919 + 17) % (2 ** 32)


def collect_traces(engine: Engine, prompts: list[list[int]], plan: TracePlan = TracePlan(), *,
                   minutes: float | None = None, progress: Callable[[str], None] | None = None,
                   model_dir: str | None = None) -> Traces:
    """Decode every request of `plan` with standard decoding on `engine` and record trace rows."""
    if plan.depth < 1 or plan.depth > engine.block_size:
        raise SpotError(f"trace depth must be in 1..{engine.block_size} (the block size), got {plan.depth}")
    if not prompts:
        raise SpotError("no prompts to collect traces from", "pass --prompts FILE.jsonl or --corpus-prompts N")
    for rule in plan.rules:
        CommitRule(rule, plan.tau)  # validates the rule name and tau
    cfg = engine.config
    t0 = time.perf_counter()
    recorders, facts = [], {f: [] for f in TRACE_FIELDS}
    for p, temperature, rule_kind, seed in plan.requests(len(prompts)):
        if minutes is not None and time.perf_counter() - t0 > 60 * minutes:
            if progress:
                progress(f"time limit of {minutes} min reached after {len(recorders)} traces")
            break
        rule, sampling = CommitRule(rule_kind, plan.tau), Sampling(temperature, seed=seed)
        rec = TraceRecorder(len(recorders), rule, sampling, cfg.mask_token_id, engine.block_size, cfg.vocab_size,
                            plan.depth)
        gen = generate(engine, prompts[p], max_new_tokens=plan.max_new_tokens, rule=rule, sampling=sampling,
                       observer=rec)
        recorders.append(rec)
        for f, v in zip(TRACE_FIELDS, (temperature, RULE_CODES[rule_kind], plan.tau, seed, p, len(prompts[p]),
                                       len(gen.token_ids))):
            facts[f].append(v)
        if progress:
            n_rows = sum(len(r.rows["trace"]) for r in recorders)
            progress(f"trace {len(recorders)}: prompt {p} T={temperature:g} {rule_kind} seed {seed}: "
                     f"{len(rec.rows['trace'])} steps, {len(gen.token_ids)} tokens "
                     f"({n_rows} rows, {time.perf_counter() - t0:.0f} s)")
    rows = {f: np.array([v for r in recorders for v in r.rows[f]], dtype=ROW_DTYPES[f]) for f in ROW_FIELDS}
    if rows["trace"].size == 0:
        raise SpotError("no trace rows were recorded", "give more time (--minutes) or more prompts")
    rows["topk"] = rows["topk"].reshape(-1, engine.block_size, TOPK_FEATURES)
    rows["future_conf"] = rows["future_conf"].reshape(-1, plan.depth, engine.block_size)
    meta = {"format": TRACE_FORMAT, "format_version": TRACE_VERSION, "block_size": engine.block_size,
            "mask_token_id": cfg.mask_token_id, "vocab_size": cfg.vocab_size, "depth": plan.depth,
            "topk": TOPK_FEATURES, "target": target_identity(cfg), "temperatures": sorted(set(plan.temperatures)),
            "rules": sorted(set(plan.rules)), "tau": plan.tau, "max_new_tokens": plan.max_new_tokens,
            "engine": engine.name, "model_dir": model_dir, "seconds": round(time.perf_counter() - t0, 1)}
    return Traces(meta, rows, {f: np.array(v, dtype=TRACE_DTYPES[f]) for f, v in facts.items()})


# -- prompts ----------------------------------------------------------------------------------------------------
def prompts_from_jsonl(path: str | Path, tokenizer=None) -> list[list[int]]:
    """Prompt token ids of a JSONL file (spot.prompts.load_prompts: "ids" / "prompt_ids" / "token_ids" or "text")."""
    return [p.ids for p in load_prompts(path, tokenizer)]


def training_prompts(prompts_file: str | Path | None, n: int, seed: int, tokenizer, folder) -> list[list[int]]:
    """The prompts of --prompts FILE.jsonl, else n prompts drawn (seed) from the TRAIN split of the corpus the model
    in `folder` was trained on, which needs its tokenizer (fit_prompts then cuts drawn ones to the context)."""
    if prompts_file is not None:
        return prompts_from_jsonl(prompts_file, tokenizer)
    if tokenizer is None:
        raise SpotError(f"--corpus-prompts needs the model's tokenizer, and {folder} has none",
                        "pass --prompts FILE.jsonl with token ids")
    return corpus_prompts(tokenizer, n, seed, corpus=training_corpus(folder))


def fit_prompts(prompts: list[list[int]], engine: Engine, max_new_tokens: int) -> list[list[int]]:
    """Drawn corpus prompts cut to their last tokens that leave max_new_tokens of room in the engine's context
    (a small model's context may be shorter than the draw's 64-448 tokens)."""
    room = engine.max_context - max_new_tokens - engine.block_size
    if room < 1:
        raise SpotError(f"--max-new-tokens {max_new_tokens} leaves no room for a prompt in the model's context of "
                        f"{engine.max_context} tokens", f"use --max-new-tokens <= {engine.max_context // 2}")
    return [p[-room:] for p in prompts]


def corpus_prompts(tokenizer, n: int, seed: int = 0, min_tokens: int = 64, max_tokens: int = 448,
                   root: Path | None = None, corpus: str = "code") -> list[list[int]]:
    """n prompts from the TRAIN split of a training corpus (spot.config.training_corpus names a model's), never
    from its held-out part. code: cut at line starts from the standard library's train files (a file drawn in
    proportion to its size, a random line start, a random length of min..max tokens); arithmetic: the questions of
    train-split problems (at most max_tokens)."""
    if corpus == "arithmetic":
        # tokenizers: spot.training.arithmetic_corpus imports it
        from spot.training.arithmetic_corpus import train_prompts
        return train_prompts(tokenizer, n, seed, max_tokens)

    train, _ = corpus_module.split_corpus(root)
    if not train:
        raise SpotError("the corpus train split is empty", "pass --prompts FILE.jsonl instead")
    rng = np.random.default_rng(seed + 101)
    sizes = np.array([len(f.text) for f in train], dtype=np.float64)
    prompts, tries = [], 0
    while len(prompts) < n and tries < 50 * n:
        tries += 1
        text = train[int(rng.choice(len(train), p=sizes / sizes.sum()))].text
        lines = text.splitlines(keepends=True)
        start = int(rng.integers(len(lines)))
        ids = tokenizer.encode("".join(lines[start:start + 400]))
        length = int(rng.integers(min_tokens, max_tokens + 1))
        if len(ids) < length + 64:   # leave a continuation so the model writes code, not the end of a file
            continue
        prompts.append(ids[:length])
    return prompts
