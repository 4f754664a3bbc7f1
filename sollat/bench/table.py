"""The terminal tables: one block per (rank count, dtype), sizes down, implementations across.

Laid out like nccl-tests (size, count, type, then times), with the floor and the SoL from the
same run beside every size so the gap can be read off directly. Cell marks: ``-`` the
implementation refuses this size, ``n/a`` it was not run here (NCCL has no such algorithm/protocol
at this rank count; the reason is printed below the table), ``err`` it failed, ``~`` spread
(p10-p90) above 20 % of the median, ``!`` its outputs did not match the reference.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .results import ERROR, SKIPPED, UNSUPPORTED, BarrierRow, Row
from .sizes import format_bytes

SPREAD_MARK_PCT = 20.0
DTYPE_SIZES = {"float32": 4, "bfloat16": 2, "float16": 2, "float64": 8}


def fmt_us(v: float | None) -> str:
    if v is None:
        return "-"
    if v >= 1000:
        return f"{v:.0f}"
    if v >= 100:
        return f"{v:.1f}"
    return f"{v:.2f}"


def panels(meta: dict[str, Any], rows: Sequence[Row]) -> list[tuple[int, str]]:
    """(ranks, dtype) blocks in display order: the run's rank counts, then its dtypes."""
    ranks = list(meta.get("ranks") or sorted({r.ranks for r in rows if r.ranks > 1}) or [1])
    dtypes = list(meta.get("dtypes") or sorted({r.dtype for r in rows}))
    return [(R, dt) for R in ranks for dt in dtypes]


def panel_rows(rows: Sequence[Row], ranks: int, dtype: str, panel_ranks: Sequence[int]) -> list[Row]:
    """Rows shown in the (ranks, dtype) block: those run at ``ranks``, plus world-size-1
    references when 1 is not itself one of the blocks (they are shown next to every R)."""
    out = []
    for r in rows:
        if r.dtype != dtype:
            continue
        if r.ranks == ranks or (r.ranks == 1 and 1 not in panel_ranks):
            out.append(r)
    return out


def column_order(rows: Sequence[Row]) -> list[str]:
    """Labels in first-seen order, sollat algorithms first, ``sollat auto`` last of them."""
    seen: list[str] = []
    for r in rows:
        if r.label not in seen:
            seen.append(r.label)

    def key(label: str) -> tuple[int, int]:
        if label.startswith("sollat "):
            return (1 if _is_auto(label) else 0, seen.index(label))
        return (2, seen.index(label))

    return sorted(seen, key=key)


AUTO_LABELS = ("sollat auto", "sollat auto_symm")  # auto on ordinary inputs, on Communicator.empty inputs


def _is_auto(label: str) -> bool:
    return label in AUTO_LABELS


def best_peer(rows: Sequence[Row], nbytes: int) -> Row | None:
    """The fastest correct row of another library (not sollat) at ``nbytes`` among ``rows``."""
    peers = [r for r in rows if r.nbytes == nbytes and r.impl != "sollat" and r.ok and r.median_us is not None
             and not r.check.startswith("mismatch")]
    return min(peers, key=lambda r: r.median_us or 0.0, default=None)


def _cell(r: Row | None) -> str:
    if r is None:
        return ""
    if r.status == UNSUPPORTED:
        return "-"
    if r.status == SKIPPED:
        return "n/a"
    if not r.ok:
        return "err"
    s = fmt_us(r.median_us)
    if r.spread_pct is not None and r.spread_pct > SPREAD_MARK_PCT:
        s += "~"
    if r.check.startswith("mismatch"):
        s += "!"
    return s


def _short(label: str) -> str:
    if label.startswith("sollat "):
        return label[len("sollat "):]
    return label.replace("torch symm_mem ", "torch ")


def format_panel(meta: dict[str, Any], floor_us: float | None, sol_us: float | None, rows: Sequence[Row],
                 ranks: int, dtype: str) -> str:
    prs = panel_rows(rows, ranks, dtype, [R for R, _ in panels(meta, rows)])
    sized = [r for r in prs if r.nbytes is not None]
    whole = [r for r in prs if r.nbytes is None]
    labels = column_order(sized)
    sizes = sorted({r.nbytes for r in sized if r.nbytes is not None})
    cells: dict[tuple[str, int], Row] = {(r.label, r.nbytes): r for r in sized if r.nbytes is not None}

    mode = meta.get("mode", "virtual")
    where = f"R={ranks} virtual ranks on one GPU" if mode == "virtual" else f"{ranks} GPUs, one process each"
    lines = [
        f"# sollat bench: AllReduce (sum) latency, us per call | {meta.get('card', '?')} | {where} | {dtype}",
        f"# median over {meta.get('replays', '?')} graph replays of back-to-back calls on rotating inputs; "
        f"floor = empty kernel in the same kind of graph; SoL = 2 x L2 round trip + remote store",
    ]
    if floor_us is not None or sol_us is not None:
        lines.append(f"# floor {fmt_us(floor_us)} us   SoL {fmt_us(sol_us)} us")
    head = ["size", "count", "floor", "SoL", *(_short(lb) for lb in labels)]
    autos = [lb for lb in AUTO_LABELS if lb in labels]
    for lb in autos:
        head.append(f"{_short(lb)} picks")
    head.append("best")
    for lb in autos:
        head.append(f"{_short(lb)}/peer")
    table: list[list[str]] = []
    esize = DTYPE_SIZES.get(dtype, 4)
    for n in sizes:
        row = [format_bytes(n), str(max(1, n // esize)), fmt_us(floor_us), fmt_us(sol_us)]
        best: tuple[float, str] | None = None
        for lb in labels:
            r = cells.get((lb, n))
            row.append(_cell(r))
            if r is not None and r.ok and r.median_us is not None and not _is_auto(lb) \
                    and (r.ranks == ranks) and (best is None or r.median_us < best[0]):
                best = (r.median_us, _short(lb))
        for lb in autos:
            r = cells.get((lb, n))
            row.append(r.selected if r is not None and r.selected else "")
        row.append(best[1] if best else "")
        peer = best_peer([r for r in sized if r.ranks == ranks], n)
        for lb in autos:  # the yardstick: auto against the fastest other library, same size
            r = cells.get((lb, n))
            ok = r is not None and r.ok and r.median_us is not None and peer is not None and peer.median_us
            row.append(f"{(r.median_us or 0.0) / (peer.median_us or 1.0):.2f}" if ok and r and peer else "")
        table.append(row)
    widths = [max(len(h), *(len(t[i]) for t in table)) if table else len(h) for i, h in enumerate(head)]
    right = {0, 1, 2, 3, *range(4, 4 + len(labels))}
    lines.append("#")

    def join(cols: Sequence[str]) -> str:
        return "  ".join(c.rjust(widths[i]) if i in right else c.ljust(widths[i]) for i, c in enumerate(cols))

    lines.append("# " + join(head).rstrip())
    lines.extend("  " + join(t).rstrip() for t in table)
    for r in whole:
        lines.append(f"# {r.label}: not run - {r.reason}")
    said: set[tuple[str, str]] = set()
    for r in sized:
        if r.status == SKIPPED and (r.label, r.reason) not in said:
            said.add((r.label, r.reason))
            lines.append(f"# n/a {r.label}: {r.reason}")
    errors = [r for r in sized if r.status == ERROR]
    for r in errors[:12]:
        lines.append(f"# err {r.label} @ {format_bytes(r.nbytes or 0)}: {r.reason}")
    if len(errors) > 12:
        lines.append(f"# ... and {len(errors) - 12} more errors (see bench.json)")
    bad = [r for r in sized if r.check.startswith("mismatch")]
    for r in bad[:12]:
        lines.append(f"# ! {r.label} @ {format_bytes(r.nbytes or 0)}: {r.check}")
    return "\n".join(lines)


def format_bench(meta: dict[str, Any], floor_us: float | None, sol_us: float | None, rows: Sequence[Row]) -> str:
    """All blocks of a sweep, separated by blank lines."""
    return "\n\n".join(format_panel(meta, floor_us, sol_us, rows, R, dt) for R, dt in panels(meta, rows)) + "\n"


def format_sol(sol: dict[str, Any]) -> str:
    """The probe's components, method and spread, one per line."""
    lines = [f"# sollat sol: speed-of-light components | {sol.get('card', '?')}"]
    for key in ("fence", "fence_acq_rel", "fence_sys", "chase", "pingpong"):
        c = sol.get(key)
        if not c:
            continue
        if c.get("status", "ok") != "ok":
            lines.append(f"  {c.get('name', key):<34} not measured - {c.get('reason', '')}")
            continue
        lines.append(
            f"  {c['name']:<34} {c['median_ns']:8.1f} ns  (min {c['min_ns']:.1f}, max {c['max_ns']:.1f}, "
            f"spread {c['spread_pct']:.1f} %, {c['cycles']:.0f} cycles, n={c['n']})"
        )
        if c.get("method"):
            lines.append(f"  {'':<34} {c['method']}")
    if sol.get("sol_ns") is not None:
        lines.append(
            f"  SoL = 2 x {sol['l2_rtt_ns']:.1f} + {sol['remote_store_ns']:.1f} = {sol['sol_ns']:.1f} ns"
            f"  ({sol['sol_ns'] / 1000:.3f} us; remote store from {sol['remote_kind']})"
        )
    for key, ref in (sol.get("reference") or {}).items():
        verdict = "within 2x" if ref["within_2x"] else "NOT within 2x"
        lines.append(f"  vs H200 reference {key}: {ref['measured_ns']:.1f} / {ref['reference_ns']:.1f} ns = "
                     f"{ref['ratio']:.2f} ({verdict})")
    for note in sol.get("notes", []):
        lines.append(f"  note: {note}")
    return "\n".join(lines) + "\n"


def format_barrier(meta: dict[str, Any], rows: Sequence[BarrierRow], floor_us: float | None) -> str:
    variants: list[str] = []
    for r in rows:
        if r.label not in variants:
            variants.append(r.label)
    ranks = sorted({r.ranks for r in rows})
    cell = {(r.label, r.ranks): r for r in rows}
    mode = meta.get("mode", "virtual")
    lines = [
        f"# sollat barrier: all-to-all flag barrier latency, us | {meta.get('card', '?')} | "
        + ("virtual ranks on one GPU" if mode == "virtual" else "one process per GPU"),
        "# in-kernel: per barrier, back to back inside one launch (slowest rank, median over launches); "
        "graph: one barrier per launch in a CUDA graph, floor subtracted",
    ]
    if floor_us is not None:
        lines.append(f"# floor {fmt_us(floor_us)} us")
    head = ["ranks", *variants]
    table = []
    for R in ranks:
        line = [str(R)]
        for v in variants:
            r = cell.get((v, R))
            line.append("" if r is None else (fmt_us(r.median_us) if r.ok else ("-" if r.status == "skipped" else "err")))
        table.append(line)
    widths = [max(len(h), *(len(t[i]) for t in table)) if table else len(h) for i, h in enumerate(head)]
    lines.append("# " + "  ".join(h.rjust(widths[i]) for i, h in enumerate(head)))
    lines.extend("  " + "  ".join(c.rjust(widths[i]) for i, c in enumerate(t)) for t in table)
    said: set[tuple[str, str]] = set()
    for r in rows:
        if not r.ok and r.reason and (r.label, r.reason) not in said:
            said.add((r.label, r.reason))
            at = sorted(x.ranks for x in rows if x.label == r.label and x.reason == r.reason)
            lines.append(f"# {r.label} @ ranks {','.join(map(str, at))}: {r.status} - {r.reason}")
    return "\n".join(lines) + "\n"
