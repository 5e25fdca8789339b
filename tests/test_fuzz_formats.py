"""Property-based checks (Hypothesis) of every file format spot reads: an export's manifest.json, a drafter's
drafter.json, a checkpoint's config.json, tuning records (`--budget auto`), prompt files (`spot bench --prompts`) and
trace files (.npz). Each starts from a valid file and edits it the ways a hand, a tool or an attacker does (a field
set to any JSON value, nudged, retyped or deleted, an unknown key added, nesting 100,000 deep, a duplicate key, a
number past double's range, a truncated file, an array header declaring terabytes).

Property: the reader returns a valid object or raises SpotError — never another exception, never after unbounded
time (an alarm) or allocation (tracemalloc's peak). And both hosts accept and refuse the same manifest.json and
drafter.json files: `spot_cli info` (where the C++ host is built, cpp/build: tests/test_cpp_host.py builds it) opens
the same generated folders as the Python engine.

A fixed example budget (SPOT_FUZZ_EXAMPLES scales it), derandomized when the environment variable CI is set.
"""
from __future__ import annotations

import copy
import io
import json
import math
import os
import resource
import shutil
import signal
import subprocess
import tempfile
import time
import tracemalloc
import zipfile
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, currently_in_test_context, event, given, settings
from hypothesis import strategies as st

from spot.config import MAX_BLOCK_SIZE, MAX_POSITIONS, MAX_VOCAB, ModelConfig, load_config
from spot.errors import SpotError
from spot.runtime.drafter import DRAFTER_JSON, DRAFTER_ONNX, Drafter, target_identity

ROOT = Path(__file__).resolve().parents[1]
SPOT_CLI = ROOT / "cpp" / "build" / "spot_cli"
SCALE = float(os.environ.get("SPOT_FUZZ_EXAMPLES", "1"))


def fuzz(examples: int):
    """Hypothesis settings of a test: a fixed budget of examples, no deadline (a shared, loaded CI machine; the alarm
    of `bounded` is the hang check), no example database written into the checkout, derandomized under CI."""
    return settings(max_examples=max(1, round(examples * SCALE)), deadline=None, database=None,
                    derandomize=bool(os.environ.get("CI")), suppress_health_check=list(HealthCheck))


TINY = ModelConfig(vocab_size=300, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                   num_key_value_heads=2, head_dim=8, max_position_embeddings=512, block_size=8, mask_token_id=299,
                   stop_ids=(298,))
SECONDS = 60                # a read that takes longer hangs
PEAK_BYTES = 256 << 20      # a read that allocates more (Python and numpy memory) allocates without bound


class Hung(Exception):
    pass


@contextmanager
def bounded(seconds: int = SECONDS, peak: int = PEAK_BYTES):
    """The body runs in under `seconds` (SIGALRM interrupts it: Hung) and allocates under `peak` bytes at once."""
    def alarm(signum, frame):
        raise Hung(f"a read took more than {seconds} s")
    previous = signal.signal(signal.SIGALRM, alarm)
    signal.alarm(seconds)
    tracemalloc.start()
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
        _, top = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        assert top < peak, f"a read allocated {top} bytes"


def outcome(read):
    """("ok", value) or ("refused", message): read() returns, or raises SpotError; anything else fails the test."""
    with bounded():
        try:
            got = "ok", read()
        except SpotError as e:
            assert e.message and "\n" not in e.message, e.message
            got = "refused", e.message
    if currently_in_test_context():     # --hypothesis-show-statistics: how many examples each reader took, refused
        event(got[0])
    return got


# -- edits of a JSON document ---------------------------------------------------------------------------------------
NUMBERS = [0, -1, -3, 1, 2, 3, 4, 7, 8, 32, 33, 64, 65, 255, 256, 257, 1024, 1025, 4096, 4097, MAX_VOCAB,
           MAX_VOCAB + 1, MAX_POSITIONS + 1, 10**9, 2**31, 2**53 + 1, 2**63 - 1, 2**63, 2**64 - 1, 2**64, 10**30,
           0.5, 4.0, 2048.5, 1e-6, -0.0, 1e300]
WORDS = ["", ".", "..", "../x", "/etc/passwd", "a\\b", "fp32", "fp16", "int8", "sdar", "static", "threshold",
         "config.json", "target.onnx", "kv_append.onnx", "epilogue.onnx", "drafter.onnx", "x\u0000y", "\u00e9",
         "0" * 64, "a" * 64, "spot-exported-model", "spot-drafter", "spot-tuning", "spot-traces"]
SCALARS = st.one_of(st.none(), st.booleans(), st.sampled_from(NUMBERS), st.integers(-2**70, 2**70),
                    st.floats(allow_nan=True, allow_infinity=True), st.sampled_from(WORDS), st.text(max_size=8))
VALUES = st.recursive(SCALARS, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(
    st.sampled_from(["file", "bytes", "min", "max", "x"]) | st.text(max_size=4), inner, max_size=3), max_leaves=6)
# text a JSON value becomes (nesting, numbers and strings both hosts must refuse alike)
RAW = ["[" * 255 + "]" * 255, "[" * 256 + "]" * 256, "[" * 257 + "]" * 257, "[" * 100_000 + "]" * 100_000,
       "{\"a\": " * 300 + "1" + "}" * 300, "1e999", "-1e999", "1" + "0" * 400, "NaN", "Infinity", "-Infinity",
       "\"\\ud800\"", "\"\\u0000\"", "\"\\ud83d\\ude00\"", "18446744073709551616", "-9223372036854775809", "4.0",
       "1E2"]
PLACEHOLDER = "@@raw@@"


def paths_of(doc, prefix=()) -> list[tuple]:
    out = [prefix] if prefix else []
    if isinstance(doc, dict):
        for k, v in doc.items():
            out += paths_of(v, (*prefix, k))
    elif isinstance(doc, list):
        for i, v in enumerate(doc):
            out += paths_of(v, (*prefix, i))
    return out


def parent_of(doc, path):
    """The container holding path's last step, or None when path does not lead anywhere now."""
    node = doc
    for step in path[:-1]:
        if isinstance(node, dict) and step in node or isinstance(node, list) and isinstance(step, int) and \
                -len(node) <= step < len(node):
            node = node[step]
        else:
            return None
    return node if isinstance(node, (dict, list)) else None


def nudged(v):
    """Values near v: off by one, scaled, of another type."""
    if isinstance(v, bool) or v is None:
        return [not v, 0, 1, "true", None]
    if isinstance(v, (int, float)):
        out = [v + 1, v - 1, -v, 0, v * 2**20, float(v), str(v), [v]]
        return out + ([v + 0.5] if math.isfinite(v) else [])
    if isinstance(v, str):
        return ["", v + "x", v.upper(), [v], v + "\u0000", "../" + v, 7]
    if isinstance(v, list):
        return [[], v * 2, v + v[:1], [v], v[:-1], {}, None]
    return [{}, [], None, "x", {**v, "x": 1}]


@st.composite
def edited(draw, base: dict, hot: list[tuple]) -> str:
    """base (a JSON object) edited 1-3 times, as text; hot: paths the readers read, drawn from more often."""
    doc = copy.deepcopy(base)
    raw = None
    for _ in range(draw(st.integers(1, 3))):
        paths = paths_of(doc) or [("x",)]
        path = draw(st.sampled_from(hot) if hot and draw(st.booleans()) else st.sampled_from(paths))
        parent = parent_of(doc, path)
        if parent is None:
            continue
        key = path[-1]
        exists = key in parent if isinstance(parent, dict) else isinstance(key, int) and key < len(parent)
        op = draw(st.sampled_from(["set", "nudge", "nudge", "delete", "add", "raw"]))
        if op == "delete" and exists:
            del parent[key]
        elif op == "add" and isinstance(parent, dict):
            parent[draw(st.sampled_from(["x", "extra", "model", "file", "nodes"]))] = draw(VALUES)
        elif op == "raw" and raw is None and (exists or isinstance(parent, dict)):
            raw = draw(st.sampled_from(RAW))
            parent[key] = PLACEHOLDER
        elif op == "nudge" and exists:
            parent[key] = draw(st.sampled_from(nudged(parent[key])))
        elif exists or isinstance(parent, dict):
            parent[key] = draw(VALUES)
    text = json.dumps(doc, allow_nan=True)
    if raw is not None:
        text = text.replace(json.dumps(PLACEHOLDER), raw, 1)
    tail = draw(st.sampled_from([None] * 12 + ["duplicate", "truncate", "trailing", "empty", "bom"]))
    if tail == "duplicate" and doc:
        text = text[:-1] + f", {json.dumps(draw(st.sampled_from(list(doc))))}: {json.dumps(draw(SCALARS))}}}"
    elif tail == "truncate":
        text = text[:draw(st.integers(0, max(0, len(text) - 1)))]
    elif tail == "trailing":
        text += " {}"
    elif tail == "empty":
        text = ""
    elif tail == "bom":
        text = "\ufeff" + text
    return text


def hot_paths(doc: dict, *prefixes) -> list[tuple]:
    """The paths of doc under `prefixes` (the fields a reader reads), plus those prefixes themselves."""
    return sorted({p for p in paths_of(doc) if any(p[:len(q)] == q for q in prefixes)} | set(prefixes), key=str)


# -- manifest.json --------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def tiny_export(tmp_path_factory) -> Path:
    import torch

    from spot.export.export import export_checkpoint
    from spot.export.options import ExportOptions
    from spot.export.presets import resolve_source
    from spot.reference.model import random_model
    tmp = tmp_path_factory.mktemp("fuzz")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        random_model(TINY, seed=3).save_pretrained(tmp / "ckpt")
        return export_checkpoint(resolve_source(str(tmp / "ckpt")), tmp / "tiny-fp32", ExportOptions(dtype="fp32"))
    finally:
        torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def manifest_case(tiny_export, tmp_path_factory):
    """(the folder each example rewrites manifest.json of, the export's manifest, the paths the hosts read)."""
    folder = tmp_path_factory.mktemp("fuzz-manifest") / "export"
    shutil.copytree(tiny_export, folder)
    base = json.loads((tiny_export / "manifest.json").read_text())
    hot = hot_paths(base, ("model",), ("dtype",), ("block_size",), ("max_nodes",), ("max_context",),
                    ("mask_token_id",), ("stop_ids",), ("format_version",), ("ort_session_config",),
                    ("graphs", "target", "file"), ("graphs", "target", "tensorrt_profile", "max"),
                    ("graphs", "epilogue", "file"), ("graphs", "epilogue", "future_steps"),
                    ("graphs", "epilogue", "positions_per_call"), ("graphs", "kv_append"), ("files",))
    return folder, base, hot


def test_the_unedited_files_open_in_both_hosts(manifest_case, drafter_case):
    """The harness: the files the edits start from are valid for both hosts."""
    from spot.engines.ort_engine import OrtEngine
    folder, base, _ = manifest_case
    (folder / "manifest.json").write_text(json.dumps(base))
    OrtEngine(folder)
    drafter, _, _ = drafter_case
    Drafter.load(drafter).check_compatible(OrtEngine(folder))
    if SPOT_CLI.is_file():
        assert cpp_opens(folder, drafter) == (0, "")


@given(st.data())
@fuzz(80)
def test_manifest_reader_returns_a_valid_model_or_refuses(manifest_case, data):
    from spot.folder.manifest import MANIFEST, ExportedModel, load_manifest
    folder, base, hot = manifest_case
    (folder / "manifest.json").write_bytes(data.draw(edited(base, hot)).encode("utf-8", "surrogatepass"))
    kind, got = outcome(lambda: load_manifest(folder))
    if kind == "ok":
        assert isinstance(got, ExportedModel) and MANIFEST.check(got.manifest.to_json())
        assert 1 <= got.config.num_hidden_layers <= 1024 and 1 <= got.max_context <= MAX_POSITIONS


def cpp_opens(folder: Path, drafter: Path | None = None) -> tuple[int, str]:
    """(exit status, first stderr line) of `spot_cli info` on folder: under 4 GiB of address space and 60 s (an
    allocation without bound fails, as a hang does)."""
    def limit():
        resource.setrlimit(resource.RLIMIT_AS, (4 << 30, 4 << 30))
    args = [str(SPOT_CLI), "info", "--model", str(folder)] + (["--drafter", str(drafter)] if drafter else [])
    proc = subprocess.run(args, capture_output=True, text=True, timeout=SECONDS, preexec_fn=limit)
    return proc.returncode, (proc.stderr.splitlines() or [""])[0]


def needs_cpp_host():
    if not SPOT_CLI.is_file():
        pytest.skip(f"the C++ host is not built ({SPOT_CLI.relative_to(ROOT)}; tests/test_cpp_host.py builds it): "
                    "the cross-host half of the fuzz suite needs it")


@given(st.data())
@fuzz(40)
def test_both_hosts_accept_and_refuse_the_same_manifests(manifest_case, data):
    from spot.engines.ort_engine import OrtEngine
    needs_cpp_host()
    folder, base, hot = manifest_case
    (folder / "manifest.json").write_bytes(data.draw(edited(base, hot)).encode("utf-8", "surrogatepass"))
    python, message = outcome(lambda: OrtEngine(folder))
    status, line = cpp_opens(folder)
    assert status in (0, 2, 3, 4, 5, 6), f"spot_cli info crashed or failed inside ({status}): {line}"
    assert (status == 0) == (python == "ok"), f"python: {message if python != 'ok' else 'opens'}; C++: {line}"


# -- drafter.json ---------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def drafter_case(tmp_path_factory):
    """(the folder each example rewrites drafter.json of, the base drafter.json, its read paths): the embedded
    drafter's graph, its drafter.json retargeted to the tiny export (so that both hosts open the base with it)."""
    from spot.assets import embedded_model_dir
    folder = tmp_path_factory.mktemp("fuzz-drafter") / "drafter"
    folder.mkdir()
    shutil.copyfile(embedded_model_dir() / DRAFTER_ONNX, folder / DRAFTER_ONNX)
    base = json.loads((embedded_model_dir() / DRAFTER_JSON).read_text())
    base.update(block_size=TINY.block_size, target=target_identity(TINY), max_staleness=8, tau=0.9)
    hot = hot_paths(base, ("block_size",), ("target",), ("onnx_sha256",), ("member_threshold",), ("max_staleness",),
                    ("tau",), ("order_temperature",), ("runner_up_weight",), ("set_flip_weight",),
                    ("format_version",))
    (folder / DRAFTER_JSON).write_text(json.dumps(base))
    return folder, base, hot


@given(st.data())
@fuzz(60)
def test_drafter_reader_returns_a_valid_drafter_or_refuses(drafter_case, data):
    from spot.runtime.drafter import DRAFTER_FILE
    folder, base, hot = drafter_case
    (folder / DRAFTER_JSON).write_bytes(data.draw(edited(base, hot)).encode("utf-8", "surrogatepass"))
    kind, got = outcome(lambda: Drafter.load(folder))
    if kind == "ok":
        assert DRAFTER_FILE.check(got.manifest) and 1 <= got.block_size <= 64 and 0 < got.member_threshold < 1


@given(st.data())
@fuzz(30)
def test_both_hosts_accept_and_refuse_the_same_drafters(manifest_case, drafter_case, data):
    from spot.engines.ort_engine import OrtEngine
    needs_cpp_host()
    model, base_manifest, _ = manifest_case
    (model / "manifest.json").write_text(json.dumps(base_manifest))
    folder, base, hot = drafter_case
    (folder / DRAFTER_JSON).write_bytes(data.draw(edited(base, hot)).encode("utf-8", "surrogatepass"))
    engine = OrtEngine(model)
    python, message = outcome(lambda: Drafter.load(folder).check_compatible(engine))
    status, line = cpp_opens(model, folder)
    assert status in (0, 2, 3, 4, 5, 6), f"spot_cli info crashed or failed inside ({status}): {line}"
    assert (status == 0) == (python == "ok"), f"python: {message if python != 'ok' else 'opens'}; C++: {line}"


# -- config.json ----------------------------------------------------------------------------------------------------
HF_CONFIG = {"architectures": ["SDARForCausalLM"], "model_type": "sdar", "vocab_size": 300, "hidden_size": 32,
             "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
             "head_dim": 8, "max_position_embeddings": 512, "rms_norm_eps": 1e-6, "rope_theta": 1e6,
             "rope_scaling": None, "block_size": 8, "mask_token_id": 299, "eos_token_id": [298, 297],
             "tie_word_embeddings": False, "torch_dtype": "float32", "hidden_act": "silu", "attention_bias": False}


@given(st.data())
@fuzz(80)
def test_config_reader_returns_a_valid_config_or_refuses(tmp_path_factory, data):
    folder = Path(tempfile.mkdtemp(dir=tmp_path_factory.getbasetemp()))
    (folder / "config.json").write_bytes(data.draw(edited(HF_CONFIG, hot_paths(HF_CONFIG, *[(k,) for k in HF_CONFIG])))
                                         .encode("utf-8", "surrogatepass"))
    if data.draw(st.booleans()):
        gen = {"eos_token_id": 298, "bos_token_id": 1}
        (folder / "generation_config.json").write_bytes(data.draw(edited(gen, [("eos_token_id",)])).encode(
            "utf-8", "surrogatepass"))
    kind, got = outcome(lambda: load_config(folder))
    if kind == "ok":
        assert isinstance(got, ModelConfig) and ModelConfig.from_dict(got.to_dict()) == got
    shutil.rmtree(folder)


# -- tuning records (--budget auto) ---------------------------------------------------------------------------------
@given(st.data())
@fuzz(60)
def test_tuning_record_reader_returns_a_budget_or_refuses(tmp_path_factory, data):
    from spot.runtime.spot import TreeBudget
    from spot.app.tuned_budgets import FORMAT, FORMAT_VERSION, record_path, tuned_budget
    key = {"model": "0" * 64, "decoder": "spot", "machine": {"host": "fuzz"}}
    base = {"format": FORMAT, "format_version": FORMAT_VERSION, "key": key,
            "by_temperature": {"0": {"nodes": 16, "depth": 8, "temperature": 0.0, "measured": "now", "tok_s": 1.5},
                               "1": {"nodes": 32, "depth": 4, "temperature": 1.0}}}
    text = data.draw(edited(base, hot_paths(base, ("by_temperature",), ("key",), ("format_version",))))
    cache = tempfile.mkdtemp(dir=tmp_path_factory.getbasetemp())
    before = os.environ.get("SPOT_CACHE")
    os.environ["SPOT_CACHE"] = cache
    try:
        path = record_path(key)
        path.parent.mkdir(parents=True)
        path.write_bytes(text.encode("utf-8", "surrogatepass"))
        kind, got = outcome(lambda: tuned_budget(key, data.draw(st.sampled_from([0.0, 0.7, 1.0])), "spot tune"))
    finally:
        os.environ.pop("SPOT_CACHE") if before is None else os.environ.__setitem__("SPOT_CACHE", before)
        shutil.rmtree(cache)
    if kind == "ok":
        budget, tuned_at, _ = got
        assert isinstance(budget, TreeBudget) and 1 <= budget.nodes <= 4096 and 1 <= budget.depth <= MAX_BLOCK_SIZE
        assert math.isfinite(tuned_at)


# -- prompt files (spot bench --prompts, spot traces --prompts) ------------------------------------------------------
PROMPT_LINES = [{"id": 0, "ids": [1, 2, 3]}, {"id": "b", "prompt_ids": [5], "answer": 42}, [7, 8, 9],
                {"id": 3, "token_ids": [], "file": "x.py", "solution": {"steps": [1]}}]


@given(st.data())
@fuzz(80)
def test_prompt_file_reader_returns_prompts_or_refuses(tmp_path_factory, data):
    from spot.prompts import Prompt, load_prompts
    lines = [data.draw(edited({"line": rec}, hot_paths({"line": rec}, ("line",))))
             for rec in data.draw(st.lists(st.sampled_from(PROMPT_LINES), min_size=1, max_size=4))]
    # each edit is of {"line": record}: the record's text is the line (the wrapper's text, where an edit removed it)
    texts = []
    for text in lines:
        try:
            doc = json.loads(text)
            texts.append(json.dumps(doc["line"], allow_nan=True) if isinstance(doc, dict) and "line" in doc else text)
        except (ValueError, RecursionError):
            texts.append(text)
    path = Path(tempfile.mkdtemp(dir=tmp_path_factory.getbasetemp())) / "prompts.jsonl"
    path.write_bytes("\n".join(texts).encode("utf-8", "surrogatepass"))
    kind, got = outcome(lambda: load_prompts(path))
    if kind == "ok":
        assert got and all(isinstance(p, Prompt) and all(type(i) is int and 0 <= i < MAX_VOCAB for i in p.ids)
                           for p in got)
        assert all(p.answer is None or type(p.answer) is int for p in got)
    shutil.rmtree(path.parent)


# -- trace files (.npz, spot train-drafter --traces) ----------------------------------------------------------------
def trace_file(meta: dict, arrays: dict[str, np.ndarray], bomb: str | None = None) -> bytes:
    """An .npz as Traces.save writes it (meta as a 0-d str array), from these arrays; bomb: that array's .npy
    header declares a shape of 2**40 rows its bytes do not hold."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as z:
        text = meta if isinstance(meta, str) else json.dumps(meta, allow_nan=True)
        for name, arr in {"meta": np.array(text), **arrays}.items():
            npy = io.BytesIO()
            np.lib.format.write_array(npy, np.asarray(arr), allow_pickle=False)
            body = npy.getvalue()
            if name == bomb:
                header = {"descr": np.lib.format.dtype_to_descr(np.asarray(arr).dtype), "fortran_order": False,
                          "shape": (2**40, *np.asarray(arr).shape[1:])}
                npy = io.BytesIO()
                np.lib.format.write_array_header_1_0(npy, header)
                body = npy.getvalue() + body[len(npy.getvalue()):]
            z.writestr(name + ".npy", body)
    return buf.getvalue()


def trace_arrays(rows: int = 6, n_traces: int = 2, b: int = 8, d: int = 2) -> dict[str, np.ndarray]:
    from spot.training.traces import ROW_DTYPES, TRACE_DTYPES
    rng = np.random.default_rng(0)
    shapes = {"state": (b,), "committed": (b,), "fresh_conf": (b,), "topk": (b, 32), "future_conf": (d, b)}
    out = {f"row_{f}": (rng.integers(0, 2, (rows, *shapes.get(f, ())))).astype(t) for f, t in ROW_DTYPES.items()}
    out["row_trace"] = np.arange(rows, dtype=np.int32) % n_traces
    out.update({f"trace_{f}": np.zeros(n_traces, t) for f, t in TRACE_DTYPES.items()})
    return out


TRACE_META = {"format": "spot-traces", "format_version": 1, "block_size": 8, "mask_token_id": 299, "vocab_size": 300,
              "depth": 2, "topk": 32, "target": target_identity(TINY), "temperatures": [0.0, 1.0],
              "rules": ["static", "threshold"], "tau": 0.9, "engine": "ort", "seconds": 1.0}


@st.composite
def trace_edits(draw) -> bytes:
    meta = TRACE_META
    arrays = trace_arrays()
    bomb = None
    what = draw(st.sampled_from(["meta", "meta", "array", "bomb", "drop", "none"]))
    if what == "meta":
        meta = draw(edited(TRACE_META, hot_paths(TRACE_META, *[(k,) for k in TRACE_META])))
        try:
            meta = json.loads(meta)
        except (ValueError, RecursionError):
            pass                  # the edited text itself is the meta string
    elif what == "array":
        name = draw(st.sampled_from(sorted(arrays)))
        arr = arrays[name]
        arrays[name] = draw(st.sampled_from([arr.astype(np.float64), arr[:-1], arr.reshape(-1), arr[None],
                                             np.full_like(arr, np.iinfo(arr.dtype).max if arr.dtype.kind in "iu"
                                                          else -1),
                                             np.array(7, arr.dtype), arr.astype("U3")]))
    elif what == "bomb":
        bomb = draw(st.sampled_from(["meta", *sorted(arrays)]))
    elif what == "drop":
        del arrays[draw(st.sampled_from(sorted(arrays)))]
    return trace_file(meta, arrays, bomb)


def test_the_unedited_trace_file_loads():
    from spot.training.traces import Traces
    path = Path(tempfile.mkdtemp()) / "t.npz"
    path.write_bytes(trace_file(TRACE_META, trace_arrays()))
    assert Traces.load(path).n_rows == 6
    shutil.rmtree(path.parent)


@given(trace_edits())
@fuzz(60)
def test_trace_reader_returns_traces_or_refuses(tmp_path_factory, blob):
    from spot.training.traces import TRACE_META as META, Traces, check_trace_values
    path = Path(tempfile.mkdtemp(dir=tmp_path_factory.getbasetemp())) / "traces.npz"
    path.write_bytes(blob)
    kind, got = outcome(lambda: Traces.load(path))
    if kind == "ok":
        assert META.check(got.meta) and got.n_rows == len(got.rows["state"]) and got.n_traces >= 1
        assert got.rows["topk"].shape[1:] == (got.block_size, 32)
        check_trace_values(got.rows, got.traces, got.meta)
    shutil.rmtree(path.parent)


# -- one set of bounds ---------------------------------------------------------------------------------------------
def test_the_hosts_share_their_bounds():
    """Each constant of cpp/src/bounds.h equals the Python constant its comment names (config.MAX_VOCAB, ...)."""
    import importlib
    import re
    modules = {"config": "spot.config", "manifest": "spot.folder.manifest", "drafter": "spot.runtime.drafter",
               "descriptors": "spot.descriptors"}
    text = (ROOT / "cpp" / "src" / "bounds.h").read_text()
    found = re.findall(r"constexpr \w+ (k\w+) = ([^;]+);\s*// (\w+)\.(\w+)", text)
    assert len(found) == text.count("constexpr"), "a bound without the Python constant it mirrors"
    for name, expression, module, constant in found:
        value = eval(expression.replace("int64_t(1)", "1").replace("INT64_MAX", str(2**63 - 1)), {})
        assert value == getattr(importlib.import_module(modules[module]), constant), (name, module, constant)


# -- the examples of issue 39, named ----------------------------------------------------------------------------------
@pytest.mark.parametrize("edit, says", [
    (lambda m: m["model"].update(num_hidden_layers=1_000_000_000), "model.num_hidden_layers is 1000000000, "
                                                                    "expected an integer in 1..1024"),
    (lambda m: m.update(dtype=["fp32"]), "dtype is ['fp32'], expected one of fp32, fp16"),
    (lambda m: m["model"].update(stop_ids=[[0]]), "model.stop_ids[0] is [0], expected an integer"),
    (lambda m: m["model"].update(vocab_size=2048.5), "model.vocab_size is 2048.5, expected an integer"),
    (lambda m: m["model"].update(num_hidden_layers=0), "model.num_hidden_layers is 0, expected an integer in 1.."),
    (lambda m: m["model"].update(num_hidden_layers=-3), "model.num_hidden_layers is -3, expected an integer in 1.."),
    (lambda m: "[" * 100_000, "is not valid JSON (nesting deeper than 256)"),
])
def test_the_named_manifests_are_refused_by_both_hosts_in_one_line(manifest_case, edit, says):
    from spot.engines.ort_engine import OrtEngine
    folder, base, _ = manifest_case
    manifest = copy.deepcopy(base)
    text = edit(manifest)
    (folder / "manifest.json").write_text(text if isinstance(text, str) else json.dumps(manifest))
    t0 = time.monotonic()
    kind, message = outcome(lambda: OrtEngine(folder))
    assert kind == "refused" and says in message, message
    if SPOT_CLI.is_file():
        status, line = cpp_opens(folder)
        assert status == 3 and says in line, line
    assert time.monotonic() - t0 < SECONDS
