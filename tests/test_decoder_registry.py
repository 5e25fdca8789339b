"""The decoders live in one table (spot.runtime.registry): the C++ host's list is held to it, a decoder registered
from outside the package runs through every entry point, no module spells decoder-name sets of its own, and a
request's budget is resolved and checked once (spot.app.request_options.resolve_request), not again per block."""
from __future__ import annotations

import ast
import json
import re
from pathlib import Path

import numpy as np
import pytest
import torch
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from spot.app.bench_run import BenchConfig, run_bench, variants
from spot.cli import main
from spot.errors import SpotError
from spot.prompts import Prompt
from spot.app.request_options import RequestOptions, resolve_request
from spot.runtime import registry
from spot.runtime.decode_plan import DecodeRequest, run_decoder
from spot.runtime.proposers import RoundInputs, child_with
from spot.runtime.registry import Decoder, decoder_names, register
from spot.runtime.spot import TreeBudget
from spot.runtime.step import STATIC, THRESHOLD, Sampling
from tinymodels import PEAKED_MASK, peaked_engine as engine_for

ROOT = Path(__file__).resolve().parents[1]
CPP = ROOT / "cpp"
MASK = PEAKED_MASK


def cpp_literals(text: str) -> list[str]:
    """The string literals of a C++ fragment, adjacent ones as they are written."""
    return re.findall(r'"((?:[^"\\]|\\.)*)"', text)


def expected_one_of(source: str) -> list[str]:
    """The names an "unknown decoder" message of the C++ source lists (its literals joined across lines)."""
    start = source.index("expected one of ")
    statement = source[start:source.index(";", start)]
    text = "".join(cpp_literals('"' + statement))
    return [n.strip() for n in text.removeprefix("expected one of ").split(",")]


def test_the_cpp_host_lists_the_registry_decoders():
    """spot_c_api.cpp's names (the C enum's order), spot.h's enum, decode.cpp's accepted names and the unknown-decoder
    messages are the registry's C++ decoders, in the registry's order; the ones decode.cpp refuses as Python-only are
    the rest."""
    c_api = (CPP / "src" / "spot_c_api.cpp").read_text()
    decode = (CPP / "src" / "decode.cpp").read_text()
    header = (CPP / "include" / "spot" / "spot.h").read_text()
    hosted = list(decoder_names(in_cpp_host=True))
    names = cpp_literals(re.search(r"kDecoderNames\[\] = \{([^}]*)\}", c_api).group(1))
    assert names == hosted
    enum = re.search(r"typedef enum spot_decoder \{(.*?)\} spot_decoder;", header, re.S).group(1)
    members = re.findall(r"SPOT_DECODER_(\w+) = (\d+)", enum)
    assert [(m, int(v)) for m, v in members] == [(n.upper().replace("-", "_"), i) for i, n in enumerate(hosted)]
    assert set(cpp_literals(re.search(r"kNames = \{([^}]*)\}", decode).group(1))) == set(hosted)
    assert expected_one_of(decode) == hosted and expected_one_of(c_api) == hosted
    refused = re.search(r'if \((name == "[^)]*)\)\s*fail\(SPOT_ERR_UNSUPPORTED', decode).group(1)
    assert cpp_literals(refused) == list(decoder_names(in_cpp_host=False))


def test_the_table_keeps_the_traits_the_code_had():
    """The registry reproduces what the constants it replaced said (behaviour unchanged)."""
    assert decoder_names() == ("standard", "threshold", "chain", "tree", "oracle", "order-oracle", "spot",
                               "spot-sets")
    assert decoder_names(speculates=False) == ("standard", "threshold")
    assert decoder_names(ceiling=True) == ("oracle", "order-oracle")
    assert decoder_names(drafts=True) == ("spot", "spot-sets")
    assert set(decoder_names(tunable=True)) == {"spot", "spot-sets", "tree"}
    assert decoder_names(speculates=True, ceiling=False) == ("chain", "tree", "spot", "spot-sets")
    assert decoder_names(rule=THRESHOLD) == ("threshold", "spot-sets")
    assert decoder_names(nodes_from_depth=True) == ("chain",)
    for name in decoder_names():
        d = registry.decoder(name)
        assert d.baseline(STATIC) == ("threshold" if name in ("threshold", "spot-sets") else "standard")
        assert d.baseline(THRESHOLD) == "threshold"


# modules that name decoders for a choice of their own (which rows an ablation doubles, what the demo compares)
OWN_CHOICES = {"spot/app/bench_run.py": {"NOISE_ABLATION_DECODERS"}, "spot/app/demo.py": {None}}


def decoder_name_sets(path: Path) -> list[tuple[int, str | None]]:
    """(line, assigned name or None) of every tuple / list / set literal spelling two or more decoder names."""
    names = set(decoder_names())
    tree = ast.parse(path.read_text(), str(path))
    assigned = {id(node.value): node.targets[0].id for node in ast.walk(tree)
                if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name)}
    found = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
            spelled = [e.value for e in node.elts if isinstance(e, ast.Constant) and e.value in names]
            if len(spelled) >= 2:
                found.append((node.lineno, assigned.get(id(node))))
    return found


def test_no_module_but_the_registry_spells_sets_of_decoders():
    """{"spot", "spot-sets"}, DRAFTING_DECODERS, TUNABLE_DECODERS, SPEC_DECODERS...: a decoder's traits are read from
    the registry, so adding a decoder does not mean finding every such set."""
    repeats = []
    for path in sorted((ROOT / "spot").rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        if rel == "spot/runtime/registry.py":
            continue
        for line, name in decoder_name_sets(path):
            if rel in OWN_CHOICES and (name in OWN_CHOICES[rel] or None in OWN_CHOICES[rel]):
                continue
            repeats.append(f"{rel}:{line} {name or ''}")
    assert not repeats, repeats


class RightToLeftChain:
    """A toy proposer outside the package: one child per node, committing the rightmost masked position with its
    coupled stale token — an order no decoder uses, accepted where it happens to be right, exact either way."""

    lookahead = 0

    def begin_round(self, round_inputs: RoundInputs, state: np.ndarray, step: int) -> None:
        self.round = round_inputs

    def propose(self, tree, nodes):
        r = self.round
        out = []
        for i in nodes:
            node = tree[i]
            masked = np.flatnonzero(node.state == r.mask_id)
            out.append([(0.0, child_with(node.state, masked[-1:], r.stale.coupled(node.step)[0]))] if masked.size
                       else [])
        return out


REVERSE_CHAIN = Decoder("reverse-chain", "SPOT, rightmost position first", lambda inputs: RightToLeftChain(),
                        nodes_from_depth=True)


@pytest.fixture
def with_reverse_chain(monkeypatch):
    """The registry with the toy decoder added for one test (the table as it was afterwards)."""
    monkeypatch.setattr(registry, "REGISTRY", dict(registry.REGISTRY))
    register(REVERSE_CHAIN)



def test_a_decoder_registered_from_a_test_runs_exactly(with_reverse_chain):
    """Adding a decoder takes a proposer and a registry row: run_decoder, resolve_request and the bench run it, and
    its output is standard decoding's (threshold decoding's under the threshold rule) token for token."""
    engine, prompt = engine_for(), np.arange(1, 10)
    verified = 0
    for temperature in (0.0, 1.0):
        for mode in (STATIC, THRESHOLD):
            req = DecodeRequest(24, mode, 0.6, Sampling(temperature, seed=3), TreeBudget(16, 3))
            base = run_decoder("standard", engine, prompt, req)
            got = run_decoder("reverse-chain", engine, prompt, req)
            assert got.token_ids == base.token_ids, (temperature, mode)
            verified += got.stats.passes["verify"]
            options = RequestOptions("reverse-chain", 16, 3, 24, mode, 0.6, Sampling(temperature, seed=3))
            resolved = resolve_request(options, engine)
            assert resolved.budget_facts() == {"nodes": 4, "depth": 3, "tuned": None}     # a chain: depth + 1
            assert resolved.run(engine, prompt).token_ids == base.token_ids
    assert verified > 0         # it did speculate
    cfg = BenchConfig(("standard", "reverse-chain"), (0.0, 1.0), budgets=(TreeBudget(8, 3),), max_new_tokens=16,
                      independent_noise_ablation=False)
    assert [v.label for v in variants(cfg)] == ["standard", "reverse-chain@4x3"]  # labelled by what it verifies
    rows = run_bench(engine, [Prompt("p", list(range(1, 10)))], cfg)["rows"]
    assert {r["variant"]: r["identical_share"] for r in rows if r["decoder"] == "reverse-chain"} == \
        {"reverse-chain@4x3": 1.0}


def test_registering_refuses_a_taken_name_or_traits_without_a_proposer(with_reverse_chain):
    with pytest.raises(SpotError, match="empty or taken"):
        register(REVERSE_CHAIN)
    with pytest.raises(SpotError, match="builds no proposer"):
        register(Decoder("drafting-baseline", "x", drafts=True))
    with pytest.raises(SpotError, match="rule must be None or one of static, threshold"):
        register(Decoder("odd-rule", "x", rule="greedy"))


def count_calls(monkeypatch, owner, name: str) -> list:
    calls = []
    original = getattr(owner, name)

    def counted(*args, **kwargs):
        calls.append(args)
        return original(*args, **kwargs)
    monkeypatch.setattr(owner, name, counted)
    return calls


@pytest.mark.parametrize("decoder", ["tree", "chain"])
def test_spot_generate_resolves_and_checks_the_budget_once(monkeypatch, tiny_ckpt, decoder):
    """The budget was parsed before the model loaded, resolved after the engine opened, resolved again for --json
    and by run_decoder, and checked again for every block: now resolve_request resolves and checks it once and the
    decode reads the result."""
    resolved = count_calls(monkeypatch, Decoder, "verified_budget")
    checked = count_calls(monkeypatch, TreeBudget, "check")
    result = CliRunner().invoke(main, ["generate", "--model", str(tiny_ckpt), "--backend", "torch", "--decoder",
                                       decoder, "--prompt-ids", "1,2,3", "--max-new-tokens", "16", "--stop-ids", "",
                                       "--budget", "6", "--depth", "2", "--json"])
    assert result.exit_code == 0, result.output
    out = json.loads(result.output.strip().splitlines()[-1])
    assert out["blocks"] > 1 and out["budget"] == {"nodes": 3 if decoder == "chain" else 6, "depth": 2,
                                                    "tuned": None}
    assert len(resolved) == 1 and len(checked) == 1


ENGINE = engine_for(4, 1)


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(name=st.sampled_from(decoder_names(drafts=False)), nodes=st.integers(1, 12), depth=st.integers(1, 4),
       mode=st.sampled_from((STATIC, THRESHOLD)), temperature=st.sampled_from((0.0, 1.0)), seed=st.integers(0, 9))
def test_every_decoder_resolves_its_budget_once_and_decodes_as_run_decoder(monkeypatch, name, nodes, depth, mode,
                                                                           temperature, seed):
    """For any decoder without a drafter and any budget the engine takes: resolve_request checks the budget once and
    the decode never again (no block re-checks it), with run_decoder's tokens and passes."""
    prompt = np.arange(1, 8)
    options = RequestOptions(name, nodes, depth, 12, mode, 0.7, Sampling(temperature, seed=seed), stop_ids=())
    want = run_decoder(name, ENGINE, prompt, DecodeRequest(12, mode, 0.7, Sampling(temperature, seed=seed),
                                                           TreeBudget(nodes, depth), stop_ids=()))
    with monkeypatch.context() as m:
        checked = count_calls(m, TreeBudget, "check")
        resolved = resolve_request(options, ENGINE)
        at_resolve = len(checked)
        got = resolved.run(ENGINE, prompt)
    assert at_resolve == (1 if registry.decoder(name).speculates else 0) and len(checked) == at_resolve
    assert got.token_ids == want.token_ids and got.stats.passes == want.stats.passes
