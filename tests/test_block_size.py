"""--block-size is one check (spot.config.check_block_size) in spot-export and every engine: the commands accept
and refuse the same block sizes, with the same message (issue 39)."""
from __future__ import annotations

import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from spot.cli import main
from spot.errors import SpotError
from spot.export.options import ExportOptions
from spot.export.presets import resolve_source


@pytest.mark.parametrize("block", ["0", "7", "300"])
def test_generate_and_export_agree_on_every_block_size(tiny_ckpt, tiny_onnx, tmp_path, block):
    """spot generate --block-size 7 decoded (ort) where spot-export --block-size 7 refused, and spot-export
    --block-size 0 exported blocks of the config's size. Now both refuse with the same message."""
    said = []
    for args in (["export", str(tiny_ckpt), "--out", str(tmp_path / "b"), "--quiet", "--no-validate"],
                 ["generate", "--model", str(tiny_onnx), "--backend", "ort", "--prompt-ids", "1,2", "--decoder",
                  "standard", "--max-new-tokens", "4"],
                 ["generate", "--model", str(tiny_ckpt), "--backend", "torch", "--prompt-ids", "1,2", "--decoder",
                  "standard", "--max-new-tokens", "4"]):
        r = CliRunner().invoke(main, [*args, "--block-size", block])
        assert r.exit_code == 2 and "Traceback" not in r.output, (args, r.output)
        said.append(next(line for line in r.stderr.splitlines() if line.startswith("error:")))
    assert len(set(said)) == 1 and "block size" in said[0], said
    assert not (tmp_path / "b").exists()


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(block=st.integers(-2, 300))
def test_the_exporter_and_the_engines_accept_the_same_block_sizes(tiny_ckpt, block):
    """One validator (spot.config.check_block_size) behind spot-export's --block-size and every engine's."""
    from spot.config import load_config
    from spot.engines.torch_engine import TorchEngine
    from spot.export.options import effective_config
    source = resolve_source(str(tiny_ckpt))
    outcomes = []
    for check in (lambda: effective_config(load_config(tiny_ckpt), source, ExportOptions(block_size=block), print),
                  lambda: TorchEngine.from_dir(tiny_ckpt, block)):
        try:
            check()
            outcomes.append("ok")
        except SpotError as e:
            outcomes.append(e.message)
    assert outcomes[0] == outcomes[1]
