"""PNG plots of a bench result (optional extra: matplotlib)."""
from __future__ import annotations

from pathlib import Path

from spot.app.ceilings import CEILING_NOTE, row_label
from spot.errors import SpotError
from spot.files import atomic_output
from spot.runtime.registry import is_decoder


PLOT_FILES = ("passes_and_speed.png", "acceptance_by_depth.png", "latency_vs_nodes.png")


def _pyplot():
    try:
        # matplotlib: optional extra (spot[plots])
        import matplotlib
        matplotlib.use("Agg")
        # matplotlib: optional extra (spot[plots])
        import matplotlib.pyplot as plt
    except ImportError as e:        # not installed, or installed and broken
        raise SpotError(f"plots need matplotlib, which cannot be imported here ({e})",
                        "pip install 'spot-edge[plots]' or pass --no-plots") from None
    return plt


def can_plot() -> bool:
    """Whether matplotlib imports here (a find_spec check passes a broken install)."""
    try:
        _pyplot()
    except Exception:       # noqa: BLE001 - SpotError (ImportError), or whatever a broken install raises
        return False
    return True


def plot_choice(plots: bool | None) -> tuple[bool, bool]:
    """--plots / --no-plots / neither (None: when matplotlib imports) -> (plot, matplotlib missing where the default
    would have plotted); --plots without matplotlib is refused now, not after an hour of decoding."""
    no_matplotlib = plots is not False and not can_plot()
    if plots and no_matplotlib:
        raise SpotError("--plots needs matplotlib, which cannot be imported here",
                        "pip install 'spot-edge[plots]', or leave out --plots (the report is written without them)")
    return plots is not False and not no_matplotlib, no_matplotlib


def _save(fig, path: Path) -> Path:
    with atomic_output(path, ".png") as tmp:
        fig.savefig(tmp, dpi=110, bbox_inches="tight")
    return path


def plot_report(result: dict, out: Path) -> list[Path]:
    plt = _pyplot()
    rows = result["rows"]
    temps = sorted({r["temperature"] for r in rows})
    variants = sorted({r["variant"] for r in rows},
                      key=lambda v: (not is_decoder(v.split("@")[0], speculates=False), v))
    labels = {r["variant"]: row_label(r) for r in rows}
    ceilings = {r["variant"] for r in rows if row_label(r) != r["variant"]}
    written = []

    # one shared variant axis: the labels sit left of the first panel only, the legend below both
    fig, axes = plt.subplots(1, 2, figsize=(13, 0.35 * len(variants) + 2.5), sharey=True)
    width = 0.8 / max(len(temps), 1)
    for ax, key, title in ((axes[0], "passes_per_token", "target passes per token (lower is better)"),
                           (axes[1], "tokens_per_s", "tokens/s end to end (higher is better)")):
        for j, t in enumerate(temps):
            vals = [next((r[key] for r in rows if r["variant"] == v and r["temperature"] == t), 0) for v in variants]
            bars = ax.barh([i + j * width for i in range(len(variants))], vals, height=width, label=f"T={t:g}")
            for bar, v in zip(bars, variants):
                if v in ceilings:       # a ceiling reads the answer: hatched, apart from what a user can run
                    bar.set_hatch("//")
                    bar.set_alpha(0.5)
        ax.set_title(title)
        ax.grid(axis="x", alpha=0.3)
    axes[0].set_yticks([i + 0.4 - width / 2 for i in range(len(variants))], [labels[v] for v in variants])
    axes[0].invert_yaxis()
    handles, temp_labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, temp_labels, loc="lower center", ncol=len(temps), bbox_to_anchor=(0.5, -0.02))
    bottom = 0.04
    if ceilings:
        fig.text(0.5, 0.06, "hatched " + CEILING_NOTE, ha="center", va="bottom", fontsize=8, wrap=True)
        bottom = 0.1
    fig.tight_layout(rect=(0, bottom, 1, 1))
    written.append(_save(fig, out / PLOT_FILES[0]))
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(7, 4))
    for r in rows:
        acc = r.get("acceptance_by_depth")
        if acc and r["temperature"] == temps[-1] and "+indep" not in r["variant"]:
            ax.plot(range(1, len(acc) + 1), acc, marker="o", label=row_label(r),
                    ls="--" if r["variant"] in ceilings else "-")
    ax.set_xlabel("depth d")
    ax.set_ylabel("P(accepted depth >= d)")
    ax.set_title(f"acceptance by depth (T={temps[-1]:g})")
    ax.legend(fontsize=7)
    written.append(_save(fig, out / PLOT_FILES[1]))
    plt.close(fig)

    if "tune" in result:
        curve = result["tune"]["latency_ms"]
        xs = sorted(int(k) for k in curve)
        fig, ax = plt.subplots(figsize=(6, 4))
        ax.plot(xs, [curve[k] if k in curve else curve[str(k)] for k in xs], marker="o", label="verify pass")
        ax.plot(xs, [x * (curve[1] if 1 in curve else curve["1"]) for x in xs], ls="--", label="N x one pass")
        ax.set_xlabel("nodes in the verify pass (N)")
        ax.set_ylabel("latency (ms)")
        ax.set_xscale("log", base=2)
        ax.set_title("verify latency vs node count")
        ax.legend()
        written.append(_save(fig, out / PLOT_FILES[2]))
        plt.close(fig)
    return written
