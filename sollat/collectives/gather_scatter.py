"""Built-in AllGather and ReduceScatter: the shape rules, the ``algo="auto"`` size rule and the
rank-order references (pure functions, no GPU). The calls are ``comm.all_gather`` /
``comm.reduce_scatter`` (``comm/gather_scatter_calls.py``); the kernels ``csrc/kernels/allgather.cu`` and
``reduce_scatter.cu``; the algorithms ``algorithms.GATHER_SCATTER_ALGORITHMS``.

* ``all_gather(x)`` -> ``[world_size, *x.shape]``, rank r's input at ``[r]`` (what ``torch.stack``
  of every rank's input gives; ``y.flatten(0, 1)`` is the concatenation that
  ``torch.distributed.all_gather_into_tensor`` writes, as a view). ``out`` may also be given in
  that concatenated shape ``[world_size * x.shape[0], *x.shape[1:]]``.
* ``reduce_scatter(x, op)`` splits ``x`` along dim 0 into ``world_size`` equal chunks, as
  ``torch.distributed.reduce_scatter_tensor`` does: rank j gets the reduction over ranks of chunk
  j, shape ``[x.shape[0] // world_size, *x.shape[1:]]``. ``x.shape[0]`` must be divisible by
  ``world_size`` (an ``UnsupportedError`` otherwise: no uneven rule). The reduction runs in rank
  order 0..R-1 with fp32 accumulation for bfloat16/float16 (fp64 for float64) and one rounding,
  like the deterministic AllReduce: ``reduce_scatter_reference`` is bitwise what the kernel computes.

Both are one-shot push kernels on the LL or the sentinel protocol, the same device API, fault
handling and bounded spins as ``all_reduce``. Scratch: one region per protocol, shared by the two
collectives, sized for ``algorithms.GATHER_SCATTER_BLOCKS`` blocks (``region_cost``: 2 x nranks MiB
per rank in all); ``gather_scatter=False`` at construction leaves it out.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from ..device.dtypes import OPS
from ..errors import UnsupportedError
from . import algorithms
from .algorithms import GATHER_SCATTER_ALGORITHMS, GatherScatterAlgorithm
from .select import NCCL

KINDS = ("all_gather", "reduce_scatter")
PROTOS = ("ll", "sentinel")
ALGOS = ("auto", *PROTOS, NCCL)  # what algo= accepts (NCCL: real ranks only)
# The ``algo="auto"`` rule, on the bytes one rank sends to one peer (all_gather: its whole input;
# reduce_scatter: one chunk). On real ranks, steps (up to bytes, protocol) measured on 2 H200s
# (docs/benchmarks.md, AllGather/ReduceScatter tuning; scripts/gather_scatter_bench.py, us per call, sollat LL / sentinel /
# NCCL): LL is as fast as the sentinel or faster up to 4 KiB; the sentinel from 16 KiB; at 512 KiB
# the AllGather is faster on LL (10.3 / 12.0 / 17.3) and the ReduceScatter on the sentinel
# (11.5 / 10.7 / 16.5); at 1 MiB the AllGather's LL still beats NCCL (18.5 / 24.5 / 19.6), the
# ReduceScatter's does not (21.0 / 21.8 / 18.6); at 4 MiB NCCL wins both by far (the built-in
# regions are sized for GATHER_SCATTER_BLOCKS blocks, so large messages take several passes).
# Above a kind's last step a Communicator hands the call to torch.distributed
# (all_gather_into_tensor / reduce_scatter_tensor). A VirtualCommunicator has no library path: LL
# up to LL_MAX_BYTES, the sentinel above (the real-rank steps were not measured there).
LL_MAX_BYTES = 4096
REAL_RANK_STEPS: dict[str, tuple[tuple[int, str], ...]] = {
    "all_gather": ((LL_MAX_BYTES, "ll"), (256 << 10, "sentinel"), (1 << 20, "ll")),
    "reduce_scatter": ((LL_MAX_BYTES, "ll"), (512 << 10, "sentinel")),
}
LIBRARY_ABOVE_BYTES = max(steps[-1][0] for steps in REAL_RANK_STEPS.values())  # every kind hands over above


def algorithm(kind: str, proto: str) -> GatherScatterAlgorithm:
    return GATHER_SCATTER_ALGORITHMS[f"{kind}_{proto}"]


def region_cost(world_size: int, max_blocks: int) -> int:
    """Scratch bytes per rank the built-in AllGather/ReduceScatter add to a communicator."""
    return sum(r.alg.scratch_bytes(world_size, r.blocks)
               for r in algorithms.regions((), max_blocks, gather_scatter=True) if r.alg.region)


def bytes_per_peer(kind: str, numel: int, element_size: int, world_size: int) -> int:
    """What the size rule looks at: all_gather sends its whole input to each peer,
    reduce_scatter one chunk of ``numel / world_size`` elements."""
    return numel * element_size // (world_size if kind == "reduce_scatter" else 1)


def resolve(kind: str, algo: str, nbytes_per_peer: int, *, library: bool, enabled: bool) -> str:
    """The algorithm (a key of GATHER_SCATTER_ALGORITHMS) or ``"nccl"`` for one call. ``library``:
    the communicator can hand over to torch.distributed (real ranks); ``enabled``: it has the
    built-in regions (``gather_scatter=True``)."""
    if not isinstance(algo, str) or algo not in ALGOS:
        raise UnsupportedError(f"{kind}: algo must be one of {', '.join(ALGOS)}, got {algo!r}")
    if algo == NCCL and not library:
        raise UnsupportedError(f"{kind}: algo='nccl' needs a process group (Communicator), not a VirtualCommunicator")
    if algo == "auto":
        if library:
            if not enabled:
                return NCCL
            algo = next((proto for upto, proto in REAL_RANK_STEPS[kind] if nbytes_per_peer <= upto), NCCL)
        else:
            algo = "ll" if nbytes_per_peer <= LL_MAX_BYTES else "sentinel"
    if algo == NCCL:
        return NCCL
    if not enabled:
        raise UnsupportedError(f"{kind}: this communicator was constructed with gather_scatter=False (no scratch for "
                               f"the built-in AllGather/ReduceScatter); construct it with gather_scatter=True"
                               + (" or pass algo='nccl'" if library else ""))
    return algorithm(kind, algo).name


def gather_shape(shape: Sequence[int], world_size: int) -> tuple[int, ...]:
    return (world_size, *shape)


def gather_out_ok(out_shape: Sequence[int], shape: Sequence[int], world_size: int) -> bool:
    """``out`` of all_gather: stacked ``[world_size, *shape]`` or concatenated along dim 0."""
    stacked = tuple(out_shape) == gather_shape(shape, world_size)
    concat = len(shape) >= 1 and tuple(out_shape) == (world_size * shape[0], *shape[1:])
    return stacked or concat


def scatter_shape(shape: Sequence[int], world_size: int, what: str = "tensor") -> tuple[int, ...]:
    """Output shape of reduce_scatter: dim 0 divided by ``world_size`` (a clear error otherwise)."""
    if len(shape) == 0:
        raise UnsupportedError(f"reduce_scatter: {what} is a 0-dim tensor; it needs a dim 0 of a multiple of "
                               f"world_size ({world_size}) elements to split into one chunk per rank")
    if shape[0] % world_size:
        raise UnsupportedError(f"reduce_scatter: {what} has shape {tuple(shape)}; its dim 0 ({shape[0]}) must be a "
                               f"multiple of world_size ({world_size}): rank j gets chunk j of dim 0, "
                               "as torch.distributed.reduce_scatter_tensor")
    return (shape[0] // world_size, *shape[1:])


# ---- references (bitwise what the kernels compute; CPU or GPU tensors) --------------------------
def _op_max(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``OpMax`` of types.h exactly: a NaN operand wins (the first one), else ``a > b ? a : b``."""
    return torch.where(torch.isnan(a) | torch.isnan(b), torch.where(torch.isnan(a), a, b), torch.where(a > b, a, b))


def _op_min(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return torch.where(torch.isnan(a) | torch.isnan(b), torch.where(torch.isnan(a), a, b), torch.where(a < b, a, b))


def rank_order_reduce(xs: Sequence[torch.Tensor], op: str) -> torch.Tensor:
    """Reduction in rank order 0..R-1 starting from rank 0's value, on the accumulation type
    (fp32 for 16-bit types, fp64 for float64), rounded once: recvReduce's order and arithmetic."""
    if op not in OPS:
        raise UnsupportedError(f"reduction op must be one of {', '.join(OPS)}, got {op!r}")
    acc_t = torch.float64 if xs[0].dtype == torch.float64 else torch.float32
    acc = xs[0].to(acc_t)
    for x in xs[1:]:
        v = x.to(acc_t)
        acc = acc + v if op == "sum" else _op_max(acc, v) if op == "max" else _op_min(acc, v)
    return acc.to(xs[0].dtype)


def all_gather_reference(xs: Sequence[torch.Tensor]) -> torch.Tensor:
    """Every rank's all_gather output: ``[R, *shape]``, rank r's input at ``[r]``."""
    return torch.stack(list(xs))


def reduce_scatter_reference(xs: Sequence[torch.Tensor], op: str = "sum") -> list[torch.Tensor]:
    """Every rank's reduce_scatter output: rank j's is the rank-order reduction of chunk j."""
    r = len(xs)
    shape = scatter_shape(xs[0].shape, r)
    chunks = [x.reshape(r, -1) for x in xs]
    return [rank_order_reduce([c[j] for c in chunks], op).reshape(shape) for j in range(r)]

