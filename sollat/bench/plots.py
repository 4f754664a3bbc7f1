"""Figures (matplotlib, PNG and SVG), drawn from the result files alone, so every figure can be
re-drawn on a machine without a GPU: ``python -m sollat plot RESULTS_DIR``.

* ``latency``: latency vs message size, log-log, one line per algorithm and peer, the SoL and
  the empty-kernel floor as horizontal lines; one panel per (rank count, dtype).
* ``speedup``: speed-up over NCCL (NCCL's own choice) vs size; when the run has no NCCL rows
  (virtual ranks on one GPU) the baseline is the best available peer and the title says so.
* ``barrier``: barrier latency vs rank count.

Titles name the card, the rank count, the date and the commit (``unknown`` when the result names
none, ``+dirty`` when the checkout had uncommitted changes).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .results import BarrierRow, Row, commit_label
from .sizes import format_bytes
from .table import column_order, panel_rows, panels

FORMATS = ("png", "svg")
BASELINE_PREFERENCE = ("nccl", "nccl symmetric", "torch symm_mem one_shot", "torch symm_mem one_shot (1 rank)")


BENCH_EXTRA = "pip install 'sollat[bench]' (in a checkout: pip install -e '.[bench]')"


class MatplotlibMissingError(ImportError):
    """The figures need matplotlib, which is not installed; the message is one line naming the extra."""


def _plt() -> Any:
    try:
        import matplotlib
    except ImportError as exc:
        raise MatplotlibMissingError(f"the figures need matplotlib, which is not installed ({exc}); install "
                                     f"sollat's bench extra: {BENCH_EXTRA}") from None

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    return plt


def title(meta: dict[str, Any], what: str, ranks: str | None = None) -> str:
    card = meta.get("card", "unknown GPU")
    if ranks is None:
        rs = meta.get("ranks") or []
        ranks = ("R=" + ",".join(str(r) for r in rs)) if rs else ""
        if meta.get("mode") == "virtual":
            ranks += " virtual ranks on one GPU"
        elif meta.get("mode") == "distributed":
            ranks = f"{meta.get('world_size', '?')} GPUs"
    date = str(meta.get("date", ""))[:16].replace("T", " ")
    return f"{what}\n{card} | {ranks} | {date} | commit {commit_label(meta)}"


# Line colours: tab10 and tab20b without red (red is the SoL line) and without black (auto).
_PALETTE = ("#1f77b4", "#ff7f0e", "#2ca02c", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf",
            "#393b79", "#637939", "#8c6d31", "#7b4173", "#3182bd", "#31a354", "#756bb1", "#636363")
SOL_STYLE = {"color": "red", "linewidth": 1.6, "linestyle": "--"}
FLOOR_STYLE = {"color": "gray", "linewidth": 1.0, "linestyle": "-."}


def _colors(labels: Sequence[str]) -> dict[str, str]:
    """One colour per label, the same in every panel of a figure."""
    return {lb: _PALETTE[i % len(_PALETTE)] for i, lb in enumerate(dict.fromkeys(labels))}


def _style(label: str, colors: dict[str, str] | None = None) -> dict[str, Any]:
    color = (colors or {}).get(label)
    if label == "sollat auto_symm":  # auto in place on Communicator.empty tensors: black, dotted
        return {"linestyle": ":", "linewidth": 2.4, "marker": "D", "markersize": 4, "color": "black"}
    if label.startswith("sollat auto"):
        return {"linestyle": "-", "linewidth": 2.4, "marker": "o", "markersize": 4, "color": "black"}
    style: dict[str, Any]
    if label.endswith("(1 rank)"):
        style = {"linestyle": ":", "marker": "x"}
    elif label.startswith("sollat"):
        style = {"linestyle": "-", "marker": "o", "markersize": 3}
    else:
        style = {"linestyle": "--", "marker": "s", "markersize": 3}
    if color:
        style["color"] = color
    return style


def _save(fig: Any, base: Path) -> list[Path]:
    out = []
    for ext in FORMATS:
        p = base.with_suffix("." + ext)
        fig.savefig(p, dpi=130, bbox_inches="tight")
        out.append(p)
    _plt().close(fig)
    return out


def _size_axis(ax: Any, sizes: Sequence[int]) -> None:
    ax.set_xscale("log", base=2)
    if sizes:
        lo, hi = min(sizes), max(sizes)
        ticks = [s for s in sizes if (s.bit_length() - 1) % 3 == (lo.bit_length() - 1) % 3] or list(sizes)
        ax.set_xticks(ticks)
        ax.set_xticklabels([format_bytes(s).replace(" ", "") for s in ticks], rotation=45, fontsize=7)
        ax.set_xlim(lo / 1.3, hi * 1.3)
    ax.set_xlabel("message size per rank")


def _grid(n_rows: int, n_cols: int) -> tuple[Any, Any]:
    plt = _plt()
    fig, axes = plt.subplots(n_rows, n_cols, figsize=(5.6 * n_cols, 4.4 * n_rows), squeeze=False,
                             constrained_layout=True)
    return fig, axes


def plot_latency(meta: dict[str, Any], floor_us: float | None, sol_us: float | None, rows: Sequence[Row],
                 out_base: str | Path) -> list[Path]:
    """latency.{png,svg}: one panel per (ranks, dtype)."""
    ps = panels(meta, rows)
    ranks_list = sorted({R for R, _ in ps})
    dtypes = sorted({dt for _, dt in ps}, key=lambda d: [R_dt[1] for R_dt in ps].index(d))
    fig, axes = _grid(len(dtypes), len(ranks_list))
    colors = _colors(column_order([r for r in rows if r.nbytes is not None]))
    for (R, dt) in ps:
        ax = axes[dtypes.index(dt)][ranks_list.index(R)]
        prs = [r for r in panel_rows(rows, R, dt, ranks_list) if r.nbytes is not None]
        sizes = sorted({r.nbytes for r in prs if r.nbytes is not None})
        for label in column_order(prs):
            pts = sorted((r.nbytes, r.median_us) for r in prs if r.label == label and r.ok
                         and r.nbytes is not None and r.median_us is not None)
            if pts:
                ax.plot([p[0] for p in pts], [p[1] for p in pts], label=label, **_style(label, colors))
        if sol_us is not None:
            ax.axhline(sol_us, label=f"SoL {sol_us:.2f} us", **SOL_STYLE)
        if floor_us is not None:
            ax.axhline(floor_us, label=f"empty kernel {floor_us:.2f} us", **FLOOR_STYLE)
        ax.set_yscale("log")
        _size_axis(ax, sizes)
        ax.set_ylabel("latency per call (us)")
        ax.set_title(f"R={R}, {dt}", fontsize=10)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=6, loc="upper left")
    fig.suptitle(title(meta, "AllReduce latency vs message size (median, CUDA-graph replay)"), fontsize=10)
    return _save(fig, Path(out_base))


def choose_baseline(labels: Sequence[str]) -> str | None:
    for b in BASELINE_PREFERENCE:
        if b in labels:
            return b
    return None


def plot_speedup(meta: dict[str, Any], rows: Sequence[Row], out_base: str | Path) -> list[Path]:
    """speedup.{png,svg}: baseline median / implementation median, per size (>1: faster)."""
    ps = panels(meta, rows)
    ranks_list = sorted({R for R, _ in ps})
    dtypes = sorted({dt for _, dt in ps}, key=lambda d: [R_dt[1] for R_dt in ps].index(d))
    fig, axes = _grid(len(dtypes), len(ranks_list))
    colors = _colors(column_order([r for r in rows if r.nbytes is not None]))
    used: set[str] = set()
    for (R, dt) in ps:
        ax = axes[dtypes.index(dt)][ranks_list.index(R)]
        prs = [r for r in panel_rows(rows, R, dt, ranks_list) if r.ok and r.nbytes is not None]
        labels = column_order(prs)
        base = choose_baseline(labels)
        sizes = sorted({r.nbytes for r in prs if r.nbytes is not None})
        if base is None:
            ax.text(0.5, 0.5, "no baseline in this run\n(NCCL needs >= 2 GPUs)", ha="center", va="center",
                    transform=ax.transAxes)
        else:
            used.add(base)
            ref = {r.nbytes: r.median_us for r in prs if r.label == base}
            for label in labels:
                if label == base:
                    continue
                pts = sorted((r.nbytes, ref[r.nbytes] / r.median_us) for r in prs
                             if r.label == label and r.nbytes in ref and r.median_us)
                if pts:
                    ax.plot([p[0] for p in pts], [p[1] for p in pts], label=label, **_style(label, colors))
            ax.axhline(1.0, color="gray", linewidth=1.0)
            ax.set_yscale("log", base=2)
            from matplotlib.ticker import FormatStrFormatter

            ax.yaxis.set_major_formatter(FormatStrFormatter("%gx"))
        _size_axis(ax, sizes)
        ax.set_ylabel(f"speed-up over {base}" if base else "speed-up")
        ax.set_title(f"R={R}, {dt}", fontsize=10)
        ax.grid(True, which="both", alpha=0.3)
        if base:
            ax.legend(fontsize=6, loc="best")
    what = "Speed-up over NCCL vs message size"
    if used and "nccl" not in used:
        what += f" (no NCCL rows in this run: baseline {', '.join(sorted(used))})"
    fig.suptitle(title(meta, what), fontsize=10)
    return _save(fig, Path(out_base))


def plot_barrier(meta: dict[str, Any], rows: Sequence[BarrierRow], out_base: str | Path,
                 floor_us: float | None = None) -> list[Path]:
    """barrier.{png,svg}: barrier latency vs rank count, one line per variant."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(6.4, 4.6), constrained_layout=True)
    labels: list[str] = []
    for r in rows:
        if r.label not in labels:
            labels.append(r.label)
    all_ranks: set[int] = set()
    for label in labels:
        pts = sorted((r for r in rows if r.label == label and r.ok and r.median_us is not None),
                     key=lambda r: r.ranks)
        if not pts:
            continue
        xs = [r.ranks for r in pts]
        ys = [float(r.median_us or 0.0) for r in pts]
        all_ranks.update(xs)
        err = None
        if all(r.p10_us is not None and r.p90_us is not None for r in pts):
            err = [[float(r.median_us or 0.0) - float(r.p10_us or 0.0) for r in pts],
                   [float(r.p90_us or 0.0) - float(r.median_us or 0.0) for r in pts]]
        ax.errorbar(xs, ys, yerr=err, label=label, marker="o", capsize=3,
                    linestyle="-" if "in-kernel" in label else "--")
    if floor_us is not None:
        ax.axhline(floor_us, label=f"empty kernel {floor_us:.2f} us", **FLOOR_STYLE)
    ax.set_xscale("log", base=2)
    if all_ranks:
        ticks = sorted(all_ranks)
        ax.set_xticks(ticks)
        ax.set_xticklabels([str(t) for t in ticks])
    ax.set_xlabel("ranks")
    ax.set_ylabel("latency per barrier (us)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7)
    rs = sorted(all_ranks)
    rdesc = f"{rs[0]}..{rs[-1]} ranks" if rs else ""
    rdesc += " (virtual, one GPU)" if meta.get("mode") == "virtual" else ""
    ax.set_title(title(meta, "All-to-all flag barrier latency vs rank count", rdesc), fontsize=9)
    return _save(fig, Path(out_base))


def plot_dir(run_dir: str | Path) -> list[Path]:
    """Re-draw every figure whose data file is in ``run_dir`` (bench.json, barrier.json)."""
    from .results import load_barrier, load_bench

    run_dir = Path(run_dir)
    out: list[Path] = []
    bench = run_dir / "bench.json"
    if bench.exists():
        doc, rows = load_bench(bench)
        meta = doc.get("meta", {})
        floor = (doc.get("floor") or {}).get("median_us")
        sol = (doc.get("sol") or {}).get("sol_ns")
        sol_us = sol / 1000.0 if sol is not None else None
        out += plot_latency(meta, floor, sol_us, rows, run_dir / "latency")
        out += plot_speedup(meta, rows, run_dir / "speedup")
    barrier = run_dir / "barrier.json"
    if barrier.exists():
        doc, brows = load_barrier(barrier)
        out += plot_barrier(doc.get("meta", {}), brows, run_dir / "barrier", (doc.get("floor") or {}).get("median_us"))
    return out
