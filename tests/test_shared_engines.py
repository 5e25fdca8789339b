"""Many engines, one copy of the weights: the engines a server opens (spot serve --engines N, spot.engines.factory.
open_engines) share their model's sessions — ORT's one session per graph, torch's one module — each with its own KV
cache; they decode at the same time with run_decoder's tokens, and a process of N engines holds the weights once."""
from __future__ import annotations

import subprocess
import sys
import threading
from pathlib import Path

import pytest

from serving import Reference
from spot.config import ModelConfig
from spot.engines.factory import open_engines
from spot.engines.ort_sessions import shared_threads
from spot.errors import SpotError
from spot.serve.model import RequestDefaults, ServedModel

REPO = Path(__file__).resolve().parent.parent


def served(folder: Path, sampler: str = "auto", kv_cache: str = "auto") -> ServedModel:
    return ServedModel("embedded", folder, "ort", "cpu", sampler, kv_cache, None, None, None, RequestDefaults(), None,
                       folder / "drafter.onnx")


@pytest.mark.parametrize("placement", [("auto", "auto"), ("device", "device")])
def test_a_pools_engines_share_the_models_sessions_and_keep_their_own_caches(embedded_export, placement):
    """spot serve's pool (spot.serve.run.open_pool): every engine runs the same target, epilogue and kv_append
    sessions and the same drafter; each has its own KV cache. Before, each engine opened the folder again: N
    sessions per graph, the weights N times."""
    from spot.serve.run import open_pool
    pool = open_pool(served(embedded_export[1], *placement), 3, None, 4)
    try:
        (first, drafter), *others = pool.slots
        for engine, their_drafter in others:
            assert engine.sessions is first.sessions and engine.session is first.session
            assert engine.epilogue is first.epilogue and their_drafter is drafter
            if placement[1] == "device":
                assert engine.device_kv is not first.device_kv and engine.device_kv._append is first.device_kv._append
            else:
                assert engine.device_kv is None and engine._k is not first._k
        assert (first.epilogue is None) == (placement[0] == "auto")       # auto on a CPU: the host sampler
    finally:
        pool.close()


def test_torch_engines_share_one_module(tmp_path):
    from spot.reference.model import random_model
    cfg = ModelConfig(vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=1, num_attention_heads=2,
                      num_key_value_heads=1, head_dim=16, max_position_embeddings=64, block_size=4, mask_token_id=63,
                      stop_ids=(62,))
    random_model(cfg, seed=2).save_pretrained(tmp_path / "ckpt")
    engines = open_engines("torch", tmp_path / "ckpt", 3)
    assert len(engines) == 3 and all(e.model is engines[0].model for e in engines)


def test_open_engines_checks_its_count(embedded_export):
    for count in (0, -1, True, 1.5, "2"):
        with pytest.raises(SpotError, match="engines must be an int >= 1"):
            open_engines("ort", embedded_export[1], count)


@pytest.mark.parametrize("placement", [("auto", "auto"), ("device", "device")])
def test_engines_over_one_set_of_sessions_decode_at_once_with_run_decoders_tokens(embedded_export, placement):
    """Three engines over one set of sessions decode six requests on three threads at once (a barrier starts them
    together): each answer is the one a lone engine gives."""
    from spot.runtime.decode_plan import DecodeRequest, run_decoder
    from spot.runtime.drafter import load_drafter
    from spot.runtime.spot import TreeBudget
    from spot.runtime.step import Sampling
    folder = embedded_export[1]
    reference = Reference(folder)
    engines = open_engines("ort", folder, 3, sampler=placement[0], kv_cache=placement[1])
    drafter = load_drafter(folder)
    jobs = [(list(range(100 + 7 * i, 140 + 7 * i)), ("standard", "spot", "tree", "threshold", "spot-sets", "chain")[i],
             (0.0, 0.7, 1.0)[i % 3], 50 + i) for i in range(6)]
    results, errors, start = {}, [], threading.Barrier(3)

    def work(k: int) -> None:
        try:
            start.wait()
            for i in range(k, len(jobs), 3):
                prompt, decoder, temperature, seed = jobs[i]
                req = DecodeRequest(24, sampling=Sampling(temperature, seed=seed), budget=TreeBudget(16))
                results[i] = run_decoder(decoder, engines[k], prompt, req, drafter).token_ids[:24]
        except BaseException as e:      # noqa: BLE001 - reported below
            errors.append(e)
    threads = [threading.Thread(target=work, args=(k,)) for k in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(600)
    assert not errors and sorted(results) == list(range(6)), errors
    for i, (prompt, decoder, temperature, seed) in enumerate(jobs):
        assert results[i] == reference(prompt, decoder, temperature, seed, 24), (decoder, temperature)


def test_shared_sessions_keep_the_threads_separate_sessions_had():
    """N engines of T threads each: one session of N x (T - 1) + 1 (a pass runs on its caller plus the pool's)."""
    assert shared_threads(None, 4) is None and shared_threads(0, 4) == 0       # ORT's default stays the default
    assert shared_threads(1, 4) == 1 and shared_threads(3, 1) == 3 and shared_threads(4, 4) == 13


RSS_SCRIPT = """
import re, sys
from pathlib import Path
import numpy as np
from spot.serve.model import RequestDefaults, ServedModel
from spot.serve.run import open_pool
def rss():
    return int(re.search(r"VmRSS:\\s+(\\d+)", Path("/proc/self/status").read_text()).group(1)) * 1024
folder, count = Path(sys.argv[1]), int(sys.argv[2])
before = rss()
model = ServedModel("m", folder, "ort", "cpu", "auto", "auto", None, None, None, RequestDefaults(), None, None)
pool = open_pool(model, count, 1, 0)
for engine, _ in pool.slots:
    engine.prefill(np.arange(8))
    engine.block_logits(np.full((1, engine.block_size), engine.config.mask_token_id))
print(rss() - before)
"""


def test_a_process_of_four_engines_holds_the_weights_once(tmp_path):
    """The pool of `spot serve --engines 4` over a 134 MB export (a 65536-token vocabulary: the weights dwarf the
    caches and passes) holds less than a quarter of the weights more than the pool of one engine; before, each
    engine held its own copy (three more)."""
    from spot.export.export import export_checkpoint
    from spot.export.options import ExportOptions
    from spot.export.presets import resolve_source
    from spot.reference.model import random_model
    cfg = ModelConfig(vocab_size=65536, hidden_size=256, intermediate_size=512, num_hidden_layers=1,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=64, max_position_embeddings=256,
                      block_size=4, mask_token_id=65535, stop_ids=(65534,))
    random_model(cfg, seed=1).save_pretrained(tmp_path / "ckpt")
    folder = export_checkpoint(resolve_source(str(tmp_path / "ckpt")), tmp_path / "onnx",
                               ExportOptions(dtype="fp32", max_nodes=4, max_context=64, validate=False,
                                             epilogue_steps=0), lambda _: None)
    weights = (folder / "target.onnx.data").stat().st_size
    grown = {}
    for count in (1, 4):
        r = subprocess.run([sys.executable, "-c", RSS_SCRIPT, str(folder), str(count)], capture_output=True,
                           text=True, timeout=300, cwd=REPO)
        assert r.returncode == 0, r.stderr
        grown[count] = int(r.stdout.split()[-1])
    assert grown[1] > weights / 2                       # the measure sees the weights
    assert grown[4] - grown[1] < weights / 4, (grown, weights)
