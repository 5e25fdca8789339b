"""The ceilings (oracle, order-oracle) read the answer: their rows topped bench.md's tokens/s and the PNG with no label.
Every table and plot of a bench now marks them (spot.app.bench_run.row_label, CEILING_NOTE)."""
from __future__ import annotations

import pytest

from spot.app.bench_run import markdown_table
from spot.app.ceilings import CEILING_NOTE, row_label
from spot.runtime.registry import decoder_names


def row(variant: str, decoder: str, tokens_per_s: float, temperature: float = 0.0) -> dict:
    return {"variant": variant, "decoder": decoder, "rule": "static", "temperature": temperature,
            "passes_per_token": 0.5, "tokens_per_s": tokens_per_s, "identical_share": 1.0,
            "identical_cases": [1, 1], "acceptance_by_depth": [0.9, 0.5]}


RESULT = {"rows": [row("standard", "standard", 40.0), row("spot@16x8", "spot", 30.0),
                   row("oracle@16x8", "oracle", 70.0), row("order-oracle@16x8", "order-oracle", 60.0)]}


@pytest.mark.parametrize("decoder", decoder_names())
def test_only_the_ceilings_are_labelled(decoder):
    label = row_label({"variant": f"{decoder}@16x8", "decoder": decoder})
    assert label.endswith(" (ceiling)") == (decoder in decoder_names(ceiling=True))


def test_the_table_labels_ceilings_and_says_what_they_are():
    table = markdown_table(RESULT)
    assert "| oracle@16x8 (ceiling) |" in table and "| order-oracle@16x8 (ceiling) |" in table
    assert "| spot@16x8 |" in table and CEILING_NOTE in table
    plain = markdown_table({"rows": RESULT["rows"][:2]})
    assert "ceiling" not in plain


def test_the_plots_label_and_hatch_the_ceilings(tmp_path, monkeypatch):
    pytest.importorskip("matplotlib")
    import spot.app.plots as plots
    figures = []

    def keep(fig, path):
        figures.append(fig)
        return path
    monkeypatch.setattr(plots, "_save", keep)
    plots.plot_report(RESULT, tmp_path)
    bars_fig, acceptance_fig = figures
    ticks = [t.get_text() for t in bars_fig.axes[0].get_yticklabels()]
    assert "oracle@16x8 (ceiling)" in ticks and "order-oracle@16x8 (ceiling)" in ticks and "spot@16x8" in ticks
    hatched = {ticks[round(bar.get_y())]: bool(bar.get_hatch()) for bar in bars_fig.axes[1].patches}
    assert hatched == {"standard": False, "oracle@16x8 (ceiling)": True, "order-oracle@16x8 (ceiling)": True,
                       "spot@16x8": False}
    assert any(CEILING_NOTE in text.get_text() for text in bars_fig.texts)
    legend = [t.get_text() for t in acceptance_fig.axes[0].get_legend().get_texts()]
    assert "oracle@16x8 (ceiling)" in legend and "spot@16x8" in legend
