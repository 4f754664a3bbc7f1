"""The one-GPU epilogue of ``all_reduce_rmsnorm``'s ``unfused`` algorithm: kernels/add_rmsnorm.cu
(residual add + RMSNorm, optionally the FP8 copy) on the AllReduce's output. One launch serves every
launch rank of a communicator (grid.y = the rank; its pointers are a rank table, as the collectives'),
so R virtual ranks cost one launch, as one real rank does. A communicator makes it one of its launch
plans (``comm.plan.Kernels.rmsnorm_epilogue_plan``) and launches it on torch's current stream right after
the AllReduce (PDL: its launch overlaps the AllReduce's tail).

``add_rmsnorm`` runs the same kernel on its own, on one GPU without a communicator: the residual
add and RMSNorm of ``rmsnorm.reference``'s arithmetic on a given sum (scripts/rmsnorm_bench.py times
it against a compiled add + norm).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from ..device import abi, build, driver_launch, launch
from ..device.dtypes import DType
from ..errors import UnsupportedError
from . import rmsnorm, rmsnorm_checks

KERNEL_FILE = "add_rmsnorm.cu"
LISTS = tuple(name for name, _ in abi.POINTER_LISTS[abi.ADD_RMSNORM_LISTS])
assert LISTS == ("in", "out", "res", "res_out", "weight", "fp8_out", "fp8_scale"), LISTS  # pointer_table's order
TABLE_RANKS: tuple[int, ...] = tuple(sorted({1, *abi.RANK_CAPS}))  # a Communicator's table, then each rank cap's


@dataclass(frozen=True)
class Variant:
    """A build of kernels/add_rmsnorm.cu for measuring against the default (the same bits by
    construction; scripts/rmsnorm_bench.py --ab times them): ``slots`` 16-byte lines per thread and
    pass (module define SOLLAT_ADD_RMSNORM_SLOTS; the geometry follows), ``pow2_mean`` ss / hidden
    as a multiply by the exact reciprocal where hidden is a power of two
    (SOLLAT_ADD_RMSNORM_POW2_MEAN). The default adds no define: its build is unchanged."""

    slots: int | None = None  # None: the dtype's (abi.add_rmsnorm_slots)
    pow2_mean: bool = False

    def defines(self) -> dict[str, str]:
        d = {}
        if self.slots is not None:
            d["SOLLAT_ADD_RMSNORM_SLOTS"] = str(self.slots)
        if self.pow2_mean:
            d["SOLLAT_ADD_RMSNORM_POW2_MEAN"] = "1"
        return d


DEFAULT_VARIANT = Variant()
_variant = DEFAULT_VARIANT


@contextlib.contextmanager
def variant(v: Variant) -> Iterator[None]:
    """Builds and launches made inside use ``v`` (this process; for A/B measurements)."""
    global _variant
    if v.slots not in (None, 1, 2, 4):
        raise ValueError(f"add_rmsnorm variant: slots must be 1, 2 or 4, got {v.slots}")
    before, _variant = _variant, v
    try:
        yield
    finally:
        _variant = before


def defines(dt: DType, table_ranks: int) -> dict[str, str]:
    """NVRTC defines of one build: the dtype, and the rank table's launch ranks (1 on real ranks,
    the kernels' rank cap on virtual ranks, as for the collectives); a variant's own (``variant``)."""
    return {"SOLLAT_T": dt.cxx, "SOLLAT_TABLE_RANKS": str(table_ranks), **_variant.defines()}


def n_ptrs(table_ranks: int) -> int:
    """Pointers in the kernel's rank table."""
    return abi.table_size(abi.ADD_RMSNORM_LISTS, table_ranks)


def launch_parts(dt: DType, rows: int, hidden: int, eps_bits: int, launch_ranks: int = 1,
                 table_ranks: int = 1) -> tuple[Any, Any, tuple[Any, ...]]:
    """(kernel, LaunchConfig, trailing arguments) of one call shape: ``unfused_geometry``'s blocks
    per launch rank, ``launch_ranks`` ranks (grid.y), a build for a table of ``table_ranks``."""
    if not 1 <= launch_ranks <= table_ranks:
        raise ValueError(f"add_rmsnorm: {launch_ranks} launch ranks need 1..{table_ranks} (the table's)")
    geo = rmsnorm.unfused_geometry(dt, rows, hidden, _variant.slots)
    kernel = build.get_kernel(KERNEL_FILE, abi.ADD_RMSNORM_ENTRY, defines=defines(dt, table_ranks))
    config = launch.launch_config((geo.blocks, launch_ranks), geo.threads, pdl=True)
    tail = abi.kernel_tail({"rows": rows, "hidden": hidden, "eps_bits": eps_bits}, abi.ADD_RMSNORM_TAIL_PARAMS)
    return kernel, config, tail


def pointer_table(table_ranks: int, ins: Sequence[torch.Tensor], outs: Sequence[torch.Tensor],
                  residuals: Sequence[torch.Tensor], residual_outs: Sequence[torch.Tensor],
                  weights: Sequence[torch.Tensor], fp8: Sequence[tuple[torch.Tensor, torch.Tensor]] | None
                  ) -> tuple[int, ...]:
    """The kernel's rank table: list l (``LISTS`` order) of launch rank y at ``l * table_ranks + y``,
    one tensor per launch rank in each sequence, zeros past the last rank. ``fp8``: each rank's
    (scale, copy), or None (the two lists all zeros: no FP8 copy)."""
    ranks = len(ins)
    seqs = (ins, outs, residuals, residual_outs, weights)
    if not 1 <= ranks <= table_ranks or any(len(s) != ranks for s in seqs) or (fp8 is not None and len(fp8) != ranks):
        raise ValueError(f"add_rmsnorm: every list needs one tensor per launch rank (1..{table_ranks}), got "
                         f"{[len(s) for s in seqs]} and {None if fp8 is None else len(fp8)} FP8 pairs")
    pad = (0,) * (table_ranks - ranks)
    ptrs: list[int] = []
    for seq in seqs:
        ptrs += [t.data_ptr() for t in seq]
        ptrs += pad
    ptrs += ([q.data_ptr() for _, q in fp8] if fp8 is not None else [0] * ranks) + list(pad)
    ptrs += ([s.data_ptr() for s, _ in fp8] if fp8 is not None else [0] * ranks) + list(pad)
    return tuple(ptrs)


_bound: dict[tuple[Any, ...], driver_launch.BoundLaunch] = {}


def add_rmsnorm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6, *,
                out: torch.Tensor | None = None, residual_out: torch.Tensor | None = None,
                fp8_scale: torch.Tensor | None = None, fp8_out: torch.Tensor | None = None
                ) -> tuple[torch.Tensor, ...]:
    """``(y, residual_out[, q])``: the residual add and RMSNorm of ``all_reduce_rmsnorm`` on one
    GPU, ``x`` taken as the already reduced sum ``s`` (``rmsnorm.reference([x], ...)`` gives the
    same bits). The same argument rules (``out=x`` and ``residual_out=residual`` may alias) and
    the same kernel as the ``unfused`` algorithm's epilogue; launched on torch's current stream
    (CUDA graphs capture it)."""
    dev = x.device if isinstance(x, torch.Tensor) else torch.device("cpu")
    if dev.type != "cuda":
        raise UnsupportedError(f"{rmsnorm.OPNAME}: add_rmsnorm needs CUDA tensors, x is on {dev}")
    checked = rmsnorm_checks.check_rank(x, residual, weight, out, residual_out, dev)
    xc, res, w, y, r_out, dt, rows, hidden = checked
    fp8 = rmsnorm_checks.check_fp8_ranks([checked], None if fp8_scale is None else [fp8_scale],
                                         None if fp8_out is None else [fp8_out], dev, lambda _r: "")
    if rows == 0:
        return (y, r_out) if fp8 is None else (y, r_out, fp8[0][1])
    bits = rmsnorm.eps_bits(eps)
    key = (dev.index, dt.short, rows, hidden, bits, _variant)
    bound = _bound.get(key)
    if bound is None:
        launch.ensure_device(dev.index)
        kernel, config, tail = launch_parts(dt, rows, hidden, bits)
        bound = _bound[key] = driver_launch.BoundLaunch(kernel, config, tail, n_ptrs(1))
    bound(launch.stream_handle(dev.index), pointer_table(1, [xc], [y], [res], [r_out], [w], fp8))
    return (y, r_out) if fp8 is None else (y, r_out, fp8[0][1])
