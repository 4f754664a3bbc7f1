"""The AllReduce switch the apps run on: NCCL, sollat ``auto``, a forced sollat algorithm, or a reference.

``backend.all_reduce(shards, op="sum") -> list[Tensor]``

``shards`` holds one tensor per tensor-parallel rank *that this process owns*:

* virtual ranks (one process, one device, all R ranks): R tensors, one per rank, in rank order;
* one process per GPU (torchrun): one tensor, this rank's.

The result is a list of the same length; entry i is what rank i ends up with. A backend may reduce in
place, so the inputs must not be used afterwards (NCCL through ``torch.distributed`` does; sollat
returns new tensors). Every call works under CUDA-graph capture. The backends themselves live in
``backend_base.py`` (the plain ones) and ``fused.py``; this module parses specs and builds them.

========================  ===========================================================================
spec                      what runs
========================  ===========================================================================
``nccl``                  ``torch.distributed.all_reduce`` (one process per GPU). With virtual ranks
                          NCCL cannot run R ranks on one GPU, so it means ``reference``.
``sollat``                sollat, ``algo="auto"``.
``sollat:<algo>``         sollat with that algorithm forced for sums (``max``/``min`` fall back to
                          ``auto`` when the algorithm only adds, as LL128 atomic does).
``reference`` / ``cpu``   virtual ranks only: a rank-order sum in torch, 16-bit types accumulated in
                          fp32 and rounded once, the same arithmetic as sollat's deterministic kernels.
``sollat_fused[:<algo>]`` decode only: sollat, with each AllReduce that a residual add and RMSNorm
                          follow fused with them into one ``all_reduce_rmsnorm`` call (``fused.py``).
``dist_sollat``           one process per GPU: plain ``torch.distributed.all_reduce`` on a group of
                          the ``sollat`` torch.distributed backend (docs/torch-distributed.md), as a
                          user's unchanged code reaches sollat.
``noop``                  returns the inputs: a stand-in used to time a step without its AllReduces,
                          and the exact AllReduce of a world of one.
========================  ===========================================================================
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from .backend_base import (
    OPS,
    AllReduceBackend,
    CallRecord,
    DistSollatBackend,
    NcclBackend,
    NoOpBackend,
    ReferenceBackend,
    SollatDistBackend,
    SollatVirtualBackend,
    rank_order_reduce,
)
from .fused import SollatFusedDistBackend, SollatFusedVirtualBackend, check_fused_algo

__all__ = ["KINDS", "OPS", "SOLLAT_KINDS", "AllReduceBackend", "BackendSpec", "CallRecord", "DistSollatBackend",
           "NcclBackend",
           "NoOpBackend", "ReferenceBackend", "SollatDistBackend", "SollatFusedDistBackend",
           "SollatFusedVirtualBackend", "SollatVirtualBackend", "make_backend", "parse_backend_list",
           "parse_backend_spec", "rank_order_reduce", "setup_device", "teardown"]

KINDS: tuple[str, ...] = ("nccl", "sollat", "sollat_fused", "dist_sollat", "reference", "cpu", "noop")
SOLLAT_KINDS: tuple[str, ...] = ("sollat", "sollat_fused")  # need a CUDA device; take an algorithm


@dataclass(frozen=True)
class BackendSpec:
    kind: str  # one of KINDS
    algo: str  # sollat algorithm ("auto" unless forced); "" for the others

    @property
    def label(self) -> str:
        if self.kind in SOLLAT_KINDS:
            return self.kind if self.algo == "auto" else f"{self.kind}:{self.algo}"
        return self.kind


def parse_backend_spec(spec: str) -> BackendSpec:
    """``parse_backend_spec("sollat:oneshot_ll") -> BackendSpec("sollat", "oneshot_ll")``; ValueError if unknown."""
    text = spec.strip()
    kind, sep, algo = text.partition(":")
    if kind not in KINDS:
        raise ValueError(f"backend {spec!r}: unknown kind {kind!r}; expected one of {', '.join(KINDS)} "
                         f"or sollat:<algorithm>")
    if kind in SOLLAT_KINDS:
        if sep and not algo:
            raise ValueError(f"backend {spec!r}: missing algorithm name after '{kind}:'")
        if kind == "sollat_fused":
            check_fused_algo(algo or "auto")
        return BackendSpec(kind, algo or "auto")
    if sep:
        raise ValueError(f"backend {spec!r}: only sollat and sollat_fused take an algorithm "
                         f"(sollat:<algorithm>)")
    return BackendSpec(kind, "")


def parse_backend_list(text: str) -> list[BackendSpec]:
    """Comma-separated specs, e.g. ``"nccl,sollat,sollat:oneshot_ll"``; duplicates are an error."""
    specs = [parse_backend_spec(s) for s in text.split(",") if s.strip()]
    if not specs:
        raise ValueError("no backend given")
    labels = [s.label for s in specs]
    dup = {x for x in labels if labels.count(x) > 1}
    if dup:
        raise ValueError(f"backend listed twice: {', '.join(sorted(dup))}")
    return specs


def make_backend(spec: BackendSpec | str, *, world_size: int, device: torch.device | str,
                 distributed: bool, group: Any | None = None) -> AllReduceBackend:
    """Build the backend ``spec`` names.

    ``distributed=False``: virtual ranks, all ``world_size`` ranks in this process on ``device``.
    ``distributed=True``: one rank per process over ``group`` (torch.distributed must be initialised).
    """
    if isinstance(spec, str):
        spec = parse_backend_spec(spec)
    device = torch.device(device)
    if spec.kind == "noop":
        return NoOpBackend(world_size, 1 if distributed else world_size)
    if distributed:
        if spec.kind == "nccl":
            return NcclBackend(group)
        if spec.kind == "sollat":
            return SollatDistBackend(group, spec.algo)
        if spec.kind == "sollat_fused":
            return SollatFusedDistBackend(group, spec.algo)
        if spec.kind == "dist_sollat":
            return DistSollatBackend(group, device)
        raise ValueError(f"backend {spec.label!r} runs only with virtual ranks (--virtual-tp); "
                         f"under torchrun use nccl, sollat or sollat_fused")
    if spec.kind == "dist_sollat":
        raise ValueError("backend 'dist_sollat' runs only under torchrun (one process per GPU)")
    if spec.kind in ("reference", "cpu"):
        return ReferenceBackend(world_size, name=spec.kind)
    if spec.kind == "nccl":
        # NCCL cannot host R ranks on one GPU; its stand-in is the rank-order sum.
        return ReferenceBackend(world_size, name="nccl(reference)")
    if device.type != "cuda":
        raise ValueError(f"backend {spec.label!r} needs a CUDA device, got {device}")
    if spec.kind == "sollat_fused":
        return SollatFusedVirtualBackend(world_size, device, spec.algo)
    return SollatVirtualBackend(world_size, device, spec.algo)


def setup_device(distributed: bool, device_name: str, app: str) -> torch.device:
    """The device an app runs on; under torchrun also the NCCL process group (once)."""
    device = torch.device(device_name)
    if distributed:
        import torch.distributed as dist

        torch.cuda.set_device(device)
        if not dist.is_initialized():
            dist.init_process_group("nccl", device_id=device)
        return device
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise SystemExit(f"{app}: no CUDA device; use --device cpu")
        if device.index is None:
            device = torch.device("cuda", torch.cuda.current_device())
        torch.cuda.set_device(device)
    return device


def teardown(distributed: bool) -> None:
    """Destroy the process group an app created (no-op for virtual ranks)."""
    if distributed:
        import torch.distributed as dist

        if dist.is_initialized():
            dist.destroy_process_group()
