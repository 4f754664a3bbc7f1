"""Library paths that ``algo="auto"`` hands a size range to where they beat sollat's kernels
(``select.HANDOVERS``; real ranks only):

* ``"nccl"``: ``torch.distributed.all_reduce`` on the communicator's group (and, for the built-in
  AllGather / ReduceScatter above their size rule, ``all_gather_into_tensor`` /
  ``reduce_scatter_tensor``: ``sollat.gather_scatter``);
* ``"torch_twoshot"``: torch symmetric memory's two-shot all-reduce
  (``torch.ops.symm_mem.two_shot_all_reduce_out``) on a symmetric buffer this module owns: the
  input is copied in (one device copy), the result is written straight to the output. (The op
  overwrites this rank's chunk of its input with the reduced values, which is why the input is
  always a copy.) A call in place (``out=x``) on a tensor from ``Communicator.empty``
  (``SymmetricTensors``) skips the copy: the op reads every rank's ``x`` where it is and writes
  the result over it ("zero copy"). There the zero-copy two-shot also replaces NCCL wherever the
  table hands over: on 2 H200s torch's two-shot in place beat NCCL in place from 8 to 64 MiB
  (docs/benchmarks.md, library handover and zero copy for large messages).

Both carry their library's semantics, not sollat's: no signature, no sollat timeout or fault
record. So a Communicator agrees on every such call through the store before it calls the library
(``sollat/comm/each_call.py``): a call that differs between ranks, or a peer that does not come
within the timeout, raises on every rank instead of reaching the library; a peer that dies inside
the library call can still hang it as it hangs NCCL. The tuning table says where each is used.
"""

from __future__ import annotations

from typing import Any

import torch

from ..device.dtypes import DType
from ..errors import UnsupportedError
from .select import TORCH_TWOSHOT, handover_serves

# torch's two-shot loads and stores 16-byte vectors; it takes the alignment of its input (at most
# this) and refuses an output that is less aligned.
VECTOR_BYTES = 16


#: The world sizes torch's symmetric-memory one- and two-shot kernels are built for: on any other
#: the op raises "Not implemented for world_size=N" from inside, so sollat never hands it a call there.
TORCH_SYMM_WORLD_SIZES = (2, 4, 8)


def torch_twoshot_available(world_size: int) -> bool:
    """Whether this torch has the two-shot op (torch >= 2.6 built with CUDA) and runs it on
    ``world_size`` ranks (TORCH_SYMM_WORLD_SIZES)."""
    if world_size not in TORCH_SYMM_WORLD_SIZES:
        return False
    try:
        return hasattr(torch.ops.symm_mem, "two_shot_all_reduce_out")
    except (AttributeError, RuntimeError):
        return False


class TorchTwoShot:
    """A symmetric buffer of ``capacity`` bytes (collective: every rank of ``group`` constructs
    it with the same capacity) and the two-shot call on it."""

    def __init__(self, group: Any, device: torch.device, capacity: int) -> None:
        import torch.distributed._symmetric_memory as symm_mem

        self.capacity = capacity
        self.group_name: str = group.group_name
        self._buf = symm_mem.empty(capacity, dtype=torch.uint8, device=device)
        symm_mem.rendezvous(self._buf, self.group_name)

    def check(self, nbytes: int, dt: DType, op: str) -> None:
        if not handover_serves(TORCH_TWOSHOT, dt.torch_dtype, op, nbytes):
            raise UnsupportedError(f"all_reduce: algo={TORCH_TWOSHOT!r} (torch symmetric memory two-shot) serves "
                                   f"float32 and bfloat16 with op 'sum' in multiples of 4 bytes, not "
                                   f"{dt.torch_dtype} / {op!r} / {nbytes} bytes")
        if nbytes > self.capacity:
            raise UnsupportedError(f"all_reduce: algo={TORCH_TWOSHOT!r}: {nbytes} bytes exceed its buffer of "
                                   f"{self.capacity} bytes (Communicator(torch_twoshot_bytes=...))")

    def __call__(self, x: torch.Tensor, y: torch.Tensor) -> None:
        """``y`` = sum over ranks of ``x`` (contiguous, same shape and dtype; ``y`` may be ``x``)."""
        n = x.numel()
        buf = self._buf[: n * x.element_size()].view(x.dtype)
        buf.copy_(x.view(-1))
        if y.data_ptr() % VECTOR_BYTES == 0:
            torch.ops.symm_mem.two_shot_all_reduce_out(buf, "sum", self.group_name, y.view(-1))
        else:  # the op refuses an output less aligned than its input: reduce in the buffer, then copy
            torch.ops.symm_mem.two_shot_all_reduce_(buf, "sum", self.group_name)
            y.view(-1).copy_(buf)


class SymmetricTensors:
    """Tensors in torch symmetric memory, allocated for a communicator's group
    (``Communicator.empty``) and kept alive with it, so that ``zero_copy`` can never mistake a later
    allocation at the same address for one of them."""

    def __init__(self, group_name: str, device: torch.device) -> None:
        self.group_name = group_name
        self.device = device
        self._bases: dict[int, torch.Tensor] = {}  # storage address -> the allocation

    def __bool__(self) -> bool:
        return bool(self._bases)

    def empty(self, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        """A new symmetric tensor (collective: every rank of the group calls it alike)."""
        import torch.distributed._symmetric_memory as symm_mem

        t = symm_mem.empty(shape, dtype=dtype, device=self.device)
        symm_mem.rendezvous(t, self.group_name)
        self._bases[t.untyped_storage().data_ptr()] = t
        return t

    def zero_copy(self, x: torch.Tensor, y: torch.Tensor) -> bool:
        """Whether a call on ``x`` with output ``y`` can run zero-copy: in place (``y`` is ``x``),
        on a view into one of these allocations that starts ``VECTOR_BYTES`` aligned. Out of place
        it cannot: the op would overwrite part of the input."""
        return (bool(self._bases) and y.data_ptr() == x.data_ptr() and x.data_ptr() % VECTOR_BYTES == 0
                and x.untyped_storage().data_ptr() in self._bases)

    def two_shot(self, x: torch.Tensor) -> None:
        """``x`` = sum over ranks of ``x`` (a view ``zero_copy`` accepted), read from every rank's
        ``x`` in place: the op takes the allocation's peer addresses and ``x``'s offset into it."""
        torch.ops.symm_mem.two_shot_all_reduce_(x.view(-1), "sum", self.group_name)


def nccl_all_reduce(x: torch.Tensor, y: torch.Tensor, op: str, group: Any) -> None:
    """``y`` = reduction over ``group`` of ``x`` through NCCL (``y`` may be ``x``)."""
    import torch.distributed as dist

    if y.data_ptr() != x.data_ptr():
        y.copy_(x)
    dist.all_reduce(y, op=_reduce_op(op), group=group)


def _reduce_op(op: str) -> Any:
    import torch.distributed as dist

    return {"sum": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX, "min": dist.ReduceOp.MIN}[op]


def nccl_all_gather(x: torch.Tensor, y: torch.Tensor, group: Any) -> None:
    """``y`` (contiguous, ``world_size * x.numel()`` elements) = every rank's ``x``, rank order."""
    import torch.distributed as dist

    dist.all_gather_into_tensor(y.view(-1), x.reshape(-1), group=group)


def nccl_reduce_scatter(x: torch.Tensor, y: torch.Tensor, op: str, group: Any) -> None:
    """``y`` (contiguous, ``x.numel() / world_size`` elements) = reduction over ranks of this rank's chunk."""
    import torch.distributed as dist

    dist.reduce_scatter_tensor(y.view(-1), x.reshape(-1), op=_reduce_op(op), group=group)
