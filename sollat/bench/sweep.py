"""The sollat part of the latency sweep: every algorithm plus ``auto`` x dtypes x sizes.

``VirtualTarget`` drives ``sollat.VirtualCommunicator`` (R ranks on one GPU, one launch per
call); ``DistributedTarget`` drives ``sollat.Communicator`` (one process per GPU under torchrun).
Both are timed by ``timing.time_calls`` and checked afterwards against a float32 sum of the
inputs (the outputs of the last replay of every input set). Adding a target means providing
``algorithms``, ``selected``, ``buffers``, ``call`` and ``check``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from .results import ERROR, OK, UNSUPPORTED, Row
from .timing import calls_for, sets_for, time_calls
from .virtual import rank_order_sum, rotating_sets

DTYPES = {"float32": "float32", "fp32": "float32", "f32": "float32", "bfloat16": "bfloat16", "bf16": "bfloat16",
          "float16": "float16", "fp16": "float16", "f16": "float16"}
AUTO_SYMM = "auto_symm"  # auto in place on tensors in symmetric memory (DistributedTarget only)
TOLERANCE = {"float32": (1e-5, 1e-5), "bfloat16": (1.6e-2, 1e-2), "float16": (2e-3, 1e-3)}


def torch_dtype(name: str) -> Any:
    import torch

    return getattr(torch, DTYPES.get(name, name))


@dataclass
class SweepConfig:
    sizes: list[int]
    dtypes: list[str]
    algos: list[str] | None  # None: every algorithm the communicator has, plus "auto"
    replays: int = 30
    warmup: int = 2
    max_calls: int = 100
    max_sets: int = 4
    check: bool = True


class Target(Protocol):
    ranks: int

    @property
    def algorithms(self) -> tuple[str, ...]: ...

    def selected(self, nbytes: int, dtype: str, algo: str = "auto") -> str: ...

    def buffers(self, nbytes: int, dtype: str, n_sets: int) -> Any: ...

    def call(self, bufs: Any, i: int, algo: str) -> None: ...

    def check(self, bufs: Any, dtype: str, algo: str = "") -> str: ...

    def finish(self) -> None: ...

    def recover(self) -> None: ...

    def sync(self) -> Callable[[], None] | None: ...


def _compare(out: Any, ref: Any, dtype: str) -> str | None:
    """None when equal within the dtype's tolerance, else a short description."""
    import torch

    rtol, atol = TOLERANCE.get(dtype, (1e-5, 1e-5))
    o, r = out.float(), ref.float()
    if torch.allclose(o, r, rtol=rtol, atol=atol * max(1.0, float(r.abs().max()))):
        return None
    bad = (~torch.isclose(o, r, rtol=rtol, atol=atol)).sum().item()
    err = (o - r).abs().nan_to_num(float("inf")).max().item()
    return f"mismatch ({bad} of {o.numel()} elements, max abs err {err:.3g})"


class _CommTarget:
    """What both targets answer straight from their communicator (``self.comm``)."""

    comm: Any

    @property
    def algorithms(self) -> tuple[str, ...]:
        return tuple(self.comm.algorithms)

    def selected(self, nbytes: int, dtype: str, algo: str = "auto") -> str:
        return str(self.comm.selected_algorithm(nbytes, torch_dtype(dtype), symmetric=algo == AUTO_SYMM))

    def call(self, bufs: Any, i: int, algo: str) -> None:
        """One call on input set ``i`` (mod the number of sets): a list of R tensors (virtual) or
        this rank's tensor (distributed), whichever ``buffers`` made."""
        ins, outs = bufs[0], bufs[1]
        s = i % len(ins)
        self.comm.all_reduce(ins[s], op="sum", algo=algo, out=outs[s])


class VirtualTarget(_CommTarget):
    """R virtual ranks on one GPU through ``sollat.VirtualCommunicator``."""

    def __init__(self, ranks: int, device: Any) -> None:
        import sollat

        self.ranks = ranks
        self.device = device
        self.comm = sollat.VirtualCommunicator(world_size=ranks, device=device)

    def buffers(self, nbytes: int, dtype: str, n_sets: int) -> Any:
        dt = torch_dtype(dtype)
        return rotating_sets(self.ranks, max(1, nbytes // dt.itemsize), dt, self.device, n_sets)

    def check(self, bufs: Any, dtype: str, algo: str = "") -> str:
        ins, outs = bufs
        for s in range(len(ins)):
            ref = rank_order_sum(ins[s])
            for r, o in enumerate(outs[s]):
                bad = _compare(o, ref, dtype)
                if bad:
                    return f"{bad} at rank {r}, input set {s}"
        return "ok"

    def finish(self) -> None:
        self.comm.check()  # raises the device-side error of any timed call

    def recover(self) -> None:
        self.comm.reset()

    def sync(self) -> Callable[[], None] | None:
        return None


class DistributedTarget(_CommTarget):
    """One rank per process through ``sollat.Communicator`` (torchrun). Besides every algorithm
    and ``auto`` it measures ``auto_symm``: ``auto`` in place on tensors in symmetric memory
    (``Communicator.empty``, holding copies of the same inputs), as torch's symmetric-memory and
    NCCL peers run (in place; their values grow from call to call, which none of them looks at).
    That row is checked on one fresh in-place call per input set (``check`` is told the row's
    algorithm)."""

    extra_rows = (AUTO_SYMM,)

    def __init__(self, device: Any) -> None:
        import torch.distributed as dist

        import sollat

        self.device = device
        self.comm = sollat.Communicator(group=None)
        self.ranks = dist.get_world_size()
        self.rank = dist.get_rank()
        self._pool: Any = None  # symmetric float32 elements, grown (collectively) as sizes grow

    def _symmetric(self, n: int, dt: Any, n_sets: int) -> list[Any]:
        """``n_sets`` views of ``n`` elements into the symmetric pool, each 256-byte aligned."""
        stride = -(-n * dt.itemsize // 256) * 256
        need = stride * n_sets // 4
        if self._pool is None or self._pool.numel() < need:  # every rank runs the same sizes: grows alike
            self._pool = self.comm.empty(max(need, 2 * (0 if self._pool is None else self._pool.numel())))
        raw = self._pool.view(dt)
        per = stride // dt.itemsize
        return [raw[k * per:k * per + n] for k in range(n_sets)]

    def buffers(self, nbytes: int, dtype: str, n_sets: int) -> Any:
        import torch

        dt = torch_dtype(dtype)
        n = max(1, nbytes // dt.itemsize)
        g = torch.Generator(device=self.device).manual_seed(1000 + self.rank)
        ins = [torch.randn(n, device=self.device, generator=g).to(dt) for _ in range(n_sets)]
        outs = [torch.full((n,), float("nan"), device=self.device, dtype=dt) for _ in range(n_sets)]
        syms = self._symmetric(n, dt, n_sets)
        for sym, x in zip(syms, ins, strict=True):
            sym.copy_(x)
        return ins, outs, syms

    def call(self, bufs: Any, i: int, algo: str) -> None:
        if algo != AUTO_SYMM:
            return super().call(bufs, i, algo)
        syms = bufs[2]
        x = syms[i % len(syms)]
        self.comm.all_reduce(x, op="sum", algo="auto", out=x)

    def check(self, bufs: Any, dtype: str, algo: str = "") -> str:
        import torch
        import torch.distributed as dist

        ins, outs = bufs[0], bufs[1]
        if algo == AUTO_SYMM:  # in place: one fresh call per set, compared like the others
            outs = bufs[2]
            for sym, x in zip(outs, ins, strict=True):
                sym.copy_(x)
                self.comm.all_reduce(sym, op="sum", algo="auto", out=sym)
        verdict = "ok"
        for s in range(len(ins)):
            ref = ins[s].to(torch.float32, copy=True)  # a copy: .float() of a float32 tensor is the tensor itself
            dist.all_reduce(ref)  # NCCL, other summation order: compared within tolerance
            bad = _compare(outs[s], ref.to(ins[s].dtype), dtype)
            if bad:
                verdict = f"{bad} at rank {self.rank}, input set {s}"
                break
        flags: list[Any] = [None] * self.ranks
        dist.all_gather_object(flags, verdict)
        return next((f for f in flags if f != "ok"), "ok")

    def finish(self) -> None:
        self.comm.check()

    def recover(self) -> None:
        self.comm.reset()  # collective: every rank gets here (errors are agreed on first)

    def sync(self) -> Callable[[], None] | None:
        import torch.distributed as dist

        return dist.barrier


def _is_unsupported(exc: BaseException) -> bool:
    try:
        from sollat.errors import UnsupportedError

        if isinstance(exc, UnsupportedError):
            return True
    except Exception:
        pass
    return type(exc).__name__ == "UnsupportedError"


def _reason(exc: BaseException) -> str:
    text = f"{type(exc).__name__}: {exc}".replace("\n", " ")
    return text if len(text) <= 300 else text[:297] + "..."


def algo_list(target: Target, wanted: Sequence[str] | None) -> list[str]:
    """The rows to run: every algorithm and ``auto`` (``wanted`` None), or those named; a target's
    ``extra_rows`` (variants of ``auto``) come with ``auto``."""
    have = list(target.algorithms)
    extra = list(getattr(target, "extra_rows", ()))
    if not wanted:
        return [*have, "auto", *extra]
    autos = ["auto", *extra]
    rows = [a for a in wanted if a in autos or a in have]
    if "auto" in wanted:
        rows += [a for a in extra if a not in rows]
    return rows + [f"?{a}" for a in wanted if a not in autos and a not in have]


def sweep_target(target: Target, cfg: SweepConfig, *, make_target: Callable[[], Target] | None = None,
                 progress: Any = None, gather: Callable[[list[float]], list[float]] | None = None,
                 agree: Callable[[tuple[str, str]], list[tuple[str, str]]] | None = None) -> list[Row]:
    """Measure every (dtype, size, algorithm) on ``target``.

    In a torchrun job ``gather`` turns this rank's per-replay times into the slowest rank's, and
    ``agree`` all-gathers (status, reason) so that every rank sees the same outcome and recovers
    together. After an error the communicator is reset (or rebuilt with ``make_target``); after
    a sticky CUDA error the remaining rows say so instead of running.
    """
    rows: list[Row] = []
    algos = algo_list(target, cfg.algos)
    lost: str | None = None
    for dtype in cfg.dtypes:
        esize = torch_dtype(dtype).itemsize
        for nbytes in cfg.sizes:
            bufs = None
            if lost is None:
                try:
                    n_sets = sets_for(target.ranks * max(nbytes, esize), max_sets=cfg.max_sets)
                    bufs = target.buffers(nbytes, dtype, n_sets)
                except Exception as exc:
                    for algo in algos:
                        rows.append(Row("sollat", algo.lstrip("?"), target.ranks, dtype, nbytes, status=ERROR,
                                        reason=f"allocating inputs: {_reason(exc)}"))
                    if progress is not None:
                        progress.advance(len(algos))
                    continue
            for algo in algos:
                row = Row("sollat", algo.lstrip("?"), target.ranks, dtype, nbytes)
                if lost is not None:
                    row.status, row.reason = ERROR, lost
                elif algo.startswith("?"):
                    row.status, row.reason = UNSUPPORTED, f"this communicator has no algorithm {algo[1:]!r}"
                else:
                    per_call = _measure_one(target, cfg, bufs, algo, nbytes, row)
                    if agree is not None:  # every rank ends with the same status, so all take the same path
                        _agree_status(row, agree((row.status, row.reason)))
                    if row.status == OK and per_call is not None:
                        _finish_row(target, cfg, bufs, dtype, row, gather(per_call) if gather else per_call)
                    if row.status == ERROR:
                        lost = _recover(target)
                        if lost is None and make_target is not None and getattr(target, "_broken", False):
                            target = make_target()
                rows.append(row)
                if progress is not None:
                    progress.advance(note=f"R={target.ranks} {dtype} {nbytes} B {row.algo}")
            del bufs
    return rows


def _agree_status(row: Row, statuses: list[tuple[str, str]]) -> None:
    """The worst status over all ranks (error > unsupported > ok) becomes this row's."""
    for worst in (ERROR, UNSUPPORTED):
        hit = [why for st, why in statuses if st == worst]
        if hit:
            if row.status != worst:
                row.status, row.reason = worst, f"on another rank: {hit[0]}"
            return


def _recover(target: Target) -> str | None:
    """Bring ``target`` back after an error; the reason when nothing more can run here."""
    import torch

    try:
        torch.cuda.synchronize()
    except Exception as exc:  # sticky CUDA error: the context is gone
        return f"CUDA context lost after an earlier error ({_reason(exc)})"
    try:
        target.recover()
    except Exception:
        target._broken = True  # type: ignore[attr-defined]
    return None


def _measure_one(target: Target, cfg: SweepConfig, bufs: Any, algo: str, nbytes: int, row: Row) -> list[float] | None:
    """Time one row on this rank: per-replay microseconds per call, or None (row says why)."""
    calls = calls_for(nbytes, cfg.max_calls)
    try:
        if algo == "auto":
            row.selected = target.selected(nbytes, row.dtype)
        elif algo == AUTO_SYMM:
            row.selected = target.selected(nbytes, row.dtype, algo)
        timing = time_calls(lambda i: target.call(bufs, i, algo), calls=calls, replays=cfg.replays,
                            warmup=cfg.warmup, sync=target.sync())
        target.finish()
        row.calls_per_graph, row.replays = calls, cfg.replays
        return timing.per_call_us
    except Exception as exc:
        row.status = UNSUPPORTED if _is_unsupported(exc) else ERROR
        row.reason = _reason(exc)
        return None


def _finish_row(target: Target, cfg: SweepConfig, bufs: Any, dtype: str, row: Row, per_call: list[float]) -> None:
    from .stats import Stats

    row.set_stats(Stats.of(per_call))
    try:
        row.check = target.check(bufs, dtype, row.algo) if cfg.check else "n/a"
    except Exception as exc:
        row.check = f"check failed: {_reason(exc)}"
