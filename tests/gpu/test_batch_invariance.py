"""Batch invariance on the GPU (virtual ranks 2..8 on one GPU): a row's bits must not depend on the
batch it travels in, whichever algorithm ``auto`` picks at that batch size, eager or in a CUDA
graph, on every rank, and they must be the host reference's bits.

Row 0 of every input is fixed and the batch size B moves across every switch point: every rule of
every shipped tuning table of 2..8 ranks (sollat/collectives/tuning/*.json; the one a virtual communicator of R ranks finds,
and the real-rank table forced onto a 2-rank virtual communicator), every row count at which the
table's ``all_reduce_rmsnorm`` rule (``rmsnorm_rules``) changes its choice, every batch size at which
``rmsnorm.row_geometry`` / ``unfused_geometry`` cut a row differently (row clusters, slots,
threads), and the AllGather / ReduceScatter size rule. For each B: ``all_reduce`` (auto and every
deterministic algorithm forced; ``ll128`` refused), ``all_reduce_rmsnorm`` with and without the FP8
copy (auto and every algorithm forced), ``reduce_scatter`` (row 0 of each rank's chunk) and
``all_gather`` (row 0 of each rank's block), all dtypes, hidden sizes 7, 8192 and 12289 (odd).

Checks, in this order, so that a failure says what broke: every rank's row 0 bitwise equal to
rank 0's (NaN payloads included); row 0 the same bits at every batch size (NaN as NaN); equal to
the host reference (``gather_scatter``'s rank-order references, ``rmsnorm.reference``,
``rmsnorm.fp8_reference``).

``test_rmsnorm_auto_row_is_batch_invariant_in_every_mode`` needs nothing but the APIs main already
had: on main it fails (auto runs the fused one-shot for one or two rows of 16 KiB or more and
``unfused`` above, and the two rounded differently), which is the bug this file guards against.
"""

from __future__ import annotations

import itertools
import time
import zlib
from collections.abc import Callable, Iterable

import pytest
import torch

import sollat
from sollat.collectives import algorithms, gather_scatter, rmsnorm, rmsnorm_rules, select
from sollat.device import abi
from sollat.device.dtypes import DTYPES as DTYPE_INFO

from ._reference import rank_order_reduce, raw_bits, same_bits

pytestmark = pytest.mark.gpu

DEV = torch.device("cuda", 0) if torch.cuda.is_available() else None
DTYPES = [torch.float32, torch.bfloat16, torch.float16]
HIDDEN = [7, 8192, 12289]  # a tiny odd row (crosses the small rules), the measured case, an odd wide row
EPS = 1e-6
FP8_SCALE = 0.0173
FUSED_MAX_ROWS = 4096  # forced fused calls above this many rows take long (one exchange per row cluster)
GATHER_MAX_BYTES = 8 << 20  # per-peer bytes of the AllGather / ReduceScatter calls (memory)
GRAPH_MAX_BYTES = 16 << 20  # batches captured into the CUDA graph (memory)
RULE_MAX_ROWS = 1024  # the all_reduce_rmsnorm rule's switches looked for up to this many rows
TWOSHOT = algorithms.rmsnorm_twoshot_enabled()
RMSNORM_ALGOS = [a for a in rmsnorm.PUBLIC_ALGOS
                 if TWOSHOT or rmsnorm.internal_name(a) not in algorithms.RMSNORM_EXPERIMENTAL]
# Every rank-order AllReduce of 2..8 ranks, the tables' world sizes (the wide one-shot: test_wide_groups.py)
ALLREDUCE_FORCED = [n for n, a in algorithms.ALGORITHMS.items() if a.deterministic and a.runs_on(2) and a.runs_on(8)]


def shipped_tables() -> list[tuple[str, select.Table, list[int]]]:
    """(file stem, table, the world sizes it is tested with): its own, or 3, 5, 6, 7 for the generic
    one. Tables of wide groups (more than abi.PEER_WINDOW ranks) are left to test_wide_groups.py,
    which checks every algorithm they can pick bitwise against the rank-order sum at every size
    class: the forced algorithms and the ll128 refusal below are those of 2..8 ranks."""
    out = []
    for f in sorted(select.TUNING_DIR.glob("*.json")):
        t = select.load_table(f)
        if t.world_size <= abi.PEER_WINDOW:
            out.append((f.stem, t, [t.world_size] if t.world_size else [3, 5, 6, 7]))
    return out


CASES = [(stem, r) for stem, _, ranks in shipped_tables() for r in ranks]


def crossing(thresholds: Iterable[int], unit: int) -> set[int]:
    """Batch sizes B on both sides of every threshold t (B * unit <= t < (B + 1) * unit)."""
    out: set[int] = set()
    for t in thresholds:
        b = t // unit
        if b >= 1:
            out |= {b, b + 1}
    return out


def geometry_switches(dtype: torch.dtype, hidden: int, r: int, most: int = 300) -> set[int]:
    """Batch sizes at which a fused algorithm's or the epilogue's cut of a row changes (both sides)."""
    dt = DTYPE_INFO[dtype]
    out: set[int] = set()
    cuts: list[Callable[[int], object]] = [lambda b: dataclass_cut(rmsnorm.unfused_geometry(dt, b, hidden))]
    for alg in algorithms.RMSNORM_ALGORITHMS.values():
        cuts.append(lambda b, a=alg: dataclass_cut(rmsnorm.row_geometry(a, dt, b, hidden, r)))
    for cut in cuts:
        for b in range(2, most):
            if cut(b) != cut(b - 1):
                out |= {b - 1, b}
    return out


def dataclass_cut(g: rmsnorm.RowGeometry) -> tuple[int, ...]:
    """What decides which thread computes which subtree (not how many clusters run at once)."""
    return g.threads, g.slots, g.passes, g.row_blocks


def _plain(t: torch.Tensor) -> torch.Tensor:
    """FP8 bytes as uint8 (compared exactly; stack and compare need no float8 kernels)."""
    return t.view(torch.uint8) if t.dtype == torch.float8_e4m3fn else t


class RowLog:
    """Row 0 of every rank's output, per batch size, of one call kind; compared at the end (one
    device-to-host copy per entry, no sync per call)."""

    def __init__(self, what: str, want: torch.Tensor) -> None:
        self.what, self.want = what, _plain(want.cpu())
        self.got: list[tuple[int, str, torch.Tensor]] = []

    def add(self, b: int, how: str, per_rank: list[torch.Tensor]) -> None:
        self.got.append((b, how, torch.stack([_plain(t).reshape(self.want.shape) for t in per_rank]).clone()))

    def check(self, errors: list[str]) -> int:
        first: torch.Tensor | None = None
        first_b = 0
        for b, how, g in self.got:
            g = g.cpu()
            where = f"{self.what} B={b} {how}"
            bits = raw_bits(g)
            for k in range(1, g.shape[0]):
                if not torch.equal(bits[k], bits[0]):
                    errors.append(f"{where}: rank {k}'s row 0 differs from rank 0's in "
                                  f"{int((bits[k] != bits[0]).sum())} elements")
            exact = torch.eq if g.dtype == torch.uint8 else same_bits
            if first is None:
                first, first_b = g[0], b
            elif not bool(exact(g[0], first).all()):
                errors.append(f"{where}: row 0 differs from batch {first_b}'s in {int((~exact(g[0], first)).sum())} "
                              f"of {first.numel()} elements")
            if not bool(exact(g[0], self.want).all()):
                errors.append(f"{where}: row 0 differs from the host reference in "
                              f"{int((~exact(g[0], self.want)).sum())} of {self.want.numel()} elements")
        return len(self.got)


def fixed_rows(r: int, rows: int, hidden: int, dtype: torch.dtype, seed: int) -> list[torch.Tensor]:
    """One [rows, hidden] input per rank (random), row 0 sprinkled with denormals, signed zeros and
    large values (no NaN/Inf: a NaN would make the whole normalised row NaN and hide differences)."""
    gen = torch.Generator(device=DEV).manual_seed(seed)
    fi = torch.finfo(dtype)
    specials = torch.tensor([0.0, -0.0, fi.tiny / 4, -fi.tiny / 2, fi.max / 64, -1.0], device=DEV).to(dtype)
    out = []
    for _ in range(r):
        x = torch.randn(rows, hidden, device=DEV, generator=gen).to(dtype)
        pick = torch.rand(hidden, device=DEV, generator=gen) < 0.1
        x[0][pick] = specials[torch.randint(0, len(specials), (hidden,), device=DEV, generator=gen)][pick]
        out.append(x)
    return out


def communicator(stem: str, r: int) -> sollat.VirtualCommunicator:
    c = sollat.VirtualCommunicator(r, DEV, timeout_s=10.0, batch_invariant=True)
    assert c.batch_invariant
    table = next(t for s, t, _ in shipped_tables() if s == stem)
    if select.table_digest(c._selection_table()) != select.table_digest(table):
        c._table = table  # a table this communicator would not pick by itself (the real-rank one)
        c._choices.clear()
    assert select.table_digest(c._selection_table()) == select.table_digest(table)
    return c


@pytest.mark.parametrize(("stem", "r"), CASES, ids=[f"{s}-R{r}" for s, r in CASES])
def test_every_collective_gives_row_zero_the_same_bits_in_every_batch(stem: str, r: int) -> None:
    t0 = time.monotonic()
    c = communicator(stem, r)
    with pytest.raises(sollat.UnsupportedError, match="batch-invariant"):
        c.all_reduce([torch.ones(8, device=DEV)] * r, algo="ll128")
    errors: list[str] = []
    checked = 0
    chosen: dict[str, set[str]] = {"all_reduce": set(), "all_reduce_rmsnorm": set(), "gather_scatter": set(),
                                   "rmsnorm_rule": set()}
    for dtype, hidden in itertools.product(DTYPES, HIDDEN):
        checked += sweep(c, f"R={r} {stem} {str(dtype).replace('torch.', '')} hidden={hidden}", dtype, hidden,
                         errors, chosen)
        torch.cuda.empty_cache()
    c.check()
    # the sweep did cross the switches it is about
    # fused and unfused at least, wherever the table's rule names both for the sizes swept
    assert len(chosen["all_reduce_rmsnorm"]) >= min(2, len(chosen["rmsnorm_rule"])), chosen
    assert len(chosen["gather_scatter"]) == 2, chosen
    assert all(a not in select.LIBRARY_PATHS and algorithms.get(a).deterministic for a in chosen["all_reduce"])
    print(f"\n{stem} R={r}: {checked} row-0 results compared, auto chose {chosen}, {time.monotonic() - t0:.1f} s")
    assert not errors, f"{len(errors)} failures; first ones:\n" + "\n".join(errors[:20])


def sweep(c: sollat.VirtualCommunicator, tag: str, dtype: torch.dtype, hidden: int, errors: list[str],
          chosen: dict[str, set[str]]) -> int:
    """Every call kind at every batch size of one (dtype, hidden) on ``c``; returns the number of
    row-0 results compared (failures appended to ``errors``)."""
    r = c.world_size
    table = c._selection_table()
    scale = torch.tensor([FP8_SCALE], device=DEV)
    size = DTYPE_INFO[dtype].size
    row_bytes = hidden * size
    rules = {rule.max_bytes for rule in table.rules}
    ar_b = crossing(rules, row_bytes) | {1, 2, 3}
    rms_b = ({1, 2, 3} | rmsnorm_rules.switch_rows(rmsnorm_rules.rules_for(table.rmsnorm, r, c._ranks.real), row_bytes,
                                                       RULE_MAX_ROWS)
             | geometry_switches(dtype, hidden, r) | crossing(rules, row_bytes))
    gs_b = {b for b in crossing({gather_scatter.LL_MAX_BYTES}, row_bytes) | {1, 2, 3} | crossing(rules, row_bytes)
            if b * row_bytes <= GATHER_MAX_BYTES}
    most = max(ar_b | rms_b)
    seed = zlib.crc32(tag.encode())
    xs = fixed_rows(r, most, hidden, dtype, seed)
    res = fixed_rows(1, most, hidden, dtype, seed + 1)[0]
    w = (1 + 0.1 * torch.randn(hidden, device=DEV, generator=torch.Generator(device=DEV).manual_seed(seed + 2))
         ).to(dtype)
    gs_most = max(gs_b)
    gs_in = [x[:r * gs_most].reshape(r, gs_most, hidden) for x in fixed_rows(r, r * gs_most, hidden, dtype, seed + 3)]

    # the references of row 0 (the inputs' row 0 never changes)
    ar_want = rank_order_reduce([x[0].cpu() for x in xs], "sum")
    y_want, r_want = rmsnorm.reference([x[:1] for x in xs], res[:1], w, EPS)
    q_want = rmsnorm.fp8_reference(y_want, scale)
    rs_want = torch.stack([rank_order_reduce([g[j, 0].cpu() for g in gs_in], "sum") for j in range(r)])
    ag_want = torch.stack([g[0, 0].cpu() for g in gs_in])

    logs: dict[str, RowLog] = {}

    def log(key: str, want: torch.Tensor) -> RowLog:
        if key not in logs:
            logs[key] = RowLog(f"{tag} {key}", want)
        return logs[key]

    # ---- eager ------------------------------------------------------------------------------
    for b in sorted(ar_b):
        ins = [x[:b].reshape(-1) for x in xs]
        chosen["all_reduce"].add(c.selected_algorithm(b * row_bytes, dtype))
        for algo in ["auto", *(ALLREDUCE_FORCED if b in crossing(rules, row_bytes) | {1, 3} else ())]:
            outs = c.all_reduce(ins, algo=algo)
            log(f"all_reduce {algo}", ar_want).add(b, "eager", [o[:hidden] for o in outs])
    for b in sorted(rms_b):
        args = ([x[:b] for x in xs], [res[:b]] * r, w, EPS)
        chosen["all_reduce_rmsnorm"].add(c.selected_rmsnorm_algorithm(b * row_bytes, dtype, b))
        chosen["rmsnorm_rule"].add(rmsnorm_rules.choose(table.rmsnorm, b, row_bytes, rmsnorm_rules.FUSED))
        for algo in ["auto", *RMSNORM_ALGOS]:
            if algo != "auto" and algo != rmsnorm.UNFUSED and b > FUSED_MAX_ROWS:
                continue
            ys, rs = c.all_reduce_rmsnorm(*args, algo)
            log(f"rmsnorm {algo} y", y_want).add(b, "eager", [y[0] for y in ys])
            log(f"rmsnorm {algo} residual_out", r_want).add(b, "eager", [t[0] for t in rs])
            ys, rs, qs = c.all_reduce_rmsnorm(*args, algo, fp8_scale=scale)
            log(f"rmsnorm+fp8 {algo} y", y_want).add(b, "eager", [y[0] for y in ys])
            log(f"rmsnorm+fp8 {algo} residual_out", r_want).add(b, "eager", [t[0] for t in rs])
            log(f"rmsnorm+fp8 {algo} q", q_want).add(b, "eager", [q[0] for q in qs])
    for b in sorted(gs_b):
        rs_in = [g[:, :b].reshape(r * b, hidden) for g in gs_in]  # chunk j's row 0 is row j * b
        ag_in = [g[0, :b] for g in gs_in]
        for algo in ("auto", "ll", "sentinel"):
            outs = c.reduce_scatter(rs_in, algo=algo)
            # one entry: rank j's row 0 is its own chunk's (rs_want[j]), not the same on every rank
            log(f"reduce_scatter {algo}", rs_want).add(b, "eager", [torch.stack([outs[j][0] for j in range(r)])])
            gathered = c.all_gather(ag_in, algo=algo)
            log(f"all_gather {algo}", ag_want).add(b, "eager", [o[:, 0] for o in gathered])
        chosen["gather_scatter"].add(gather_scatter.resolve("reduce_scatter", "auto", b * row_bytes, library=False,
                                                            enabled=True))

    # ---- the same auto calls captured in one CUDA graph and replayed ------------------------
    graph_b = [b for b in sorted(ar_b | rms_b) if b * row_bytes * r <= GRAPH_MAX_BYTES]
    staged = []
    for b in graph_b:
        ins = [x[:b].reshape(-1) for x in xs]
        ar_out = [torch.empty_like(t) for t in ins]
        y_out = [torch.empty(b, hidden, dtype=dtype, device=DEV) for _ in range(r)]
        r_out = [torch.empty_like(t) for t in y_out]
        yq_out = [torch.empty_like(t) for t in y_out]
        rq_out = [torch.empty_like(t) for t in y_out]
        q_out = [torch.empty(b, hidden, dtype=torch.float8_e4m3fn, device=DEV) for _ in range(r)]
        staged.append((b, ins, ar_out, y_out, r_out, yq_out, rq_out, q_out))
        # plans for these exact calls (outputs given) exist before the capture
        c.all_reduce(ins, out=ar_out)
        c.all_reduce_rmsnorm([x[:b] for x in xs], [res[:b]] * r, w, EPS, out=y_out, residual_out=r_out)
        c.all_reduce_rmsnorm([x[:b] for x in xs], [res[:b]] * r, w, EPS, out=yq_out, residual_out=rq_out,
                             fp8_scale=scale, fp8_out=q_out)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for b, ins, ar_out, y_out, r_out, yq_out, rq_out, q_out in staged:
            c.all_reduce(ins, out=ar_out)
            c.all_reduce_rmsnorm([x[:b] for x in xs], [res[:b]] * r, w, EPS, out=y_out, residual_out=r_out)
            c.all_reduce_rmsnorm([x[:b] for x in xs], [res[:b]] * r, w, EPS, out=yq_out, residual_out=rq_out,
                                 fp8_scale=scale, fp8_out=q_out)
    for _b, _ins, ar_out, y_out, r_out, yq_out, rq_out, q_out in staged:  # the replay must write them again
        for t in [*ar_out, *y_out, *r_out, *yq_out, *rq_out]:
            t.fill_(float("nan"))
        for q in q_out:
            q.view(torch.uint8).fill_(0x55)
    graph.replay()
    torch.cuda.synchronize()
    for b, _ins, ar_out, y_out, r_out, yq_out, rq_out, q_out in staged:
        log("rmsnorm+fp8 auto residual_out", r_want).add(b, "graph", [t[0] for t in rq_out])
        log("all_reduce auto", ar_want).add(b, "graph", [o[:hidden] for o in ar_out])
        log("rmsnorm auto y", y_want).add(b, "graph", [y[0] for y in y_out])
        log("rmsnorm auto residual_out", r_want).add(b, "graph", [t[0] for t in r_out])
        log("rmsnorm+fp8 auto y", y_want).add(b, "graph", [y[0] for y in yq_out])
        log("rmsnorm+fp8 auto q", q_want).add(b, "graph", [q[0] for q in q_out])
    return sum(entry.check(errors) for entry in logs.values())


@pytest.mark.parametrize("r", [2, 4, 8])
def test_rmsnorm_auto_row_is_batch_invariant_in_every_mode(r: int) -> None:
    """The measured bug, with nothing but main's API: bf16, hidden 8192 (16 KiB rows), row 0 fixed;
    row 0 of y and of residual_out must have the same bits in batches of 1..5, 64 and on both sides
    of every switch of the table's all_reduce_rmsnorm rule up to 64 rows, on a default communicator."""
    c = sollat.VirtualCommunicator(r, DEV, timeout_s=10.0)
    switches = rmsnorm_rules.switch_rows(rmsnorm_rules.rules_for(c._selection_table().rmsnorm, r, False), 8192 * 2, 64)
    gen = torch.Generator(device=DEV).manual_seed(7 + r)
    xs = [torch.randn(64, 8192, device=DEV, generator=gen).to(torch.bfloat16) for _ in range(r)]
    res = torch.randn(64, 8192, device=DEV, generator=gen).to(torch.bfloat16)
    w = (1 + 0.1 * torch.randn(8192, device=DEV, generator=gen)).to(torch.bfloat16)
    picked, first = {}, None
    for b in sorted({1, 2, 3, 4, 5, 64} | switches):
        picked[b] = c.selected_rmsnorm_algorithm(b * 8192 * 2, torch.bfloat16, b)
        ys, rs = c.all_reduce_rmsnorm([x[:b] for x in xs], [res[:b]] * r, w, EPS)
        row = (ys[0][0].cpu(), rs[0][0].cpu())
        if first is None:
            first = row
            continue
        for name, got, want in (("y", row[0], first[0]), ("residual_out", row[1], first[1])):
            bad = ~same_bits(got, want)
            assert not bool(bad.any()), (f"R={r}: row 0 of {name} differs between a batch of 1 ({picked[1]}) and of {b} "
                                         f"({picked[b]}) in {int(bad.sum())} of 8192 elements")
    assert len(set(picked.values())) >= (2 if switches else 1), picked  # every switch was crossed
    c.check()


def test_the_mode_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SOLLAT_BATCH_INVARIANT", "1")
    assert sollat.VirtualCommunicator(2, DEV).batch_invariant
    assert not sollat.VirtualCommunicator(2, DEV, batch_invariant=False).batch_invariant
    monkeypatch.setenv("SOLLAT_BATCH_INVARIANT", "0")
    assert not sollat.VirtualCommunicator(2, DEV).batch_invariant


def test_compiled_calls_in_the_mode() -> None:
    """torch.compile keeps the sollat:: ops in its graph on a batch-invariant communicator, with the
    same bits as eager, at batch sizes on both sides of auto's fused / unfused switch."""
    r = 2
    c = sollat.VirtualCommunicator(r, DEV, timeout_s=10.0, batch_invariant=True)

    def f(a: torch.Tensor, b: torch.Tensor, res: torch.Tensor, w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        ys, rs = c.all_reduce_rmsnorm([a, b], [res, res], w, EPS)
        s = c.all_reduce([a.reshape(-1), b.reshape(-1)])
        return ys[1], s[0]

    cf = torch.compile(f, fullgraph=True)
    gen = torch.Generator(device=DEV).manual_seed(11)
    a, b, res = (torch.randn(8, 8192, device=DEV, generator=gen).to(torch.bfloat16) for _ in range(3))
    w = torch.randn(8192, device=DEV, generator=gen).to(torch.bfloat16)
    y_want, _ = rmsnorm.reference([a[:1], b[:1]], res[:1], w, EPS)
    for rows in (1, 2, 3, 8):
        y, s = cf(a[:rows], b[:rows], res[:rows], w)
        assert bool(same_bits(y[0].cpu(), y_want[0]).all()), rows
        assert bool(same_bits(s[:8192].cpu(), rank_order_reduce([a[0].cpu(), b[0].cpu()], "sum")).all()), rows
    c.check()

