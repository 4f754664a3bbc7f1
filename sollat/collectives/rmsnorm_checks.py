"""The argument checks of ``all_reduce_rmsnorm`` (both communicators): one rank's tensors, the
optional FP8 copy and its scale, and writing results into given outputs. The arithmetic, the
geometry and the reference are ``sollat/collectives/rmsnorm.py``'s.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from ..device.dtypes import DTYPES, DType
from ..errors import UnsupportedError
from .rmsnorm import DTYPES_SUPPORTED, FP8_DTYPE, MAX_HIDDEN, OPNAME


def _span(t: torch.Tensor) -> tuple[int, int]:
    start = t.data_ptr()
    return start, start + t.numel() * t.element_size()


def _overlap(a: torch.Tensor, b: torch.Tensor) -> bool:
    (a0, a1), (b0, b1) = _span(a), _span(b)
    return a0 < b1 and b0 < a1 and a.numel() > 0 and b.numel() > 0


def _tensor(t: object, what: str) -> torch.Tensor:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{OPNAME}: {what} must be a torch.Tensor, got {type(t).__name__}")
    return t


def _on(t: torch.Tensor, device: torch.device, what: str) -> None:
    if device.type == "cuda" and t.device.type != "cuda":
        raise UnsupportedError(f"{OPNAME}: {what} is on {t.device}; sollat needs CUDA tensors on {device}")
    if t.device != device:
        raise UnsupportedError(f"{OPNAME}: {what} is on {t.device} but the communicator is on {device}")


def check_rank(x: object, residual: object, weight: object, out: object, residual_out: object,
               device: torch.device, tag: str = "", max_elements: int = 1 << 34
               ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, DType, int, int]:
    """One rank's arguments, each check with a clear error: (x, residual, weight, out, residual_out,
    dtype, rows, hidden). Non-contiguous inputs are copied; outputs (and a residual updated in
    place) must be contiguous; ``out`` may be ``x`` and ``residual_out`` may be ``residual``
    (exactly), no other tensors may overlap. Missing outputs are allocated."""
    x = _tensor(x, f"x{tag}")
    residual = _tensor(residual, f"residual{tag}")
    weight = _tensor(weight, f"weight{tag}")
    if x.dtype not in DTYPES_SUPPORTED:
        ok = ", ".join(str(d).replace("torch.", "") for d in DTYPES_SUPPORTED)
        raise UnsupportedError(f"{OPNAME}: dtype {x.dtype} is not supported; supported dtypes: {ok}")
    dt = DTYPES[x.dtype]
    if x.dim() < 1 or x.shape[-1] < 1:
        raise UnsupportedError(f"{OPNAME}: x{tag} must be [..., hidden] with hidden >= 1, got shape {tuple(x.shape)}")
    hidden = int(x.shape[-1])
    if hidden > MAX_HIDDEN:
        raise UnsupportedError(f"{OPNAME}: hidden size {hidden} is above the supported maximum {MAX_HIDDEN}")
    if x.numel() > max_elements:
        raise UnsupportedError(f"{OPNAME}: x{tag} has {x.numel()} elements; the limit is {max_elements}")
    if residual.shape != x.shape or residual.dtype != x.dtype:
        raise UnsupportedError(f"{OPNAME}: residual{tag} is {tuple(residual.shape)} {residual.dtype} but x{tag} is "
                               f"{tuple(x.shape)} {x.dtype}; they must match")
    if weight.shape != (hidden,) or weight.dtype != x.dtype:
        raise UnsupportedError(f"{OPNAME}: weight{tag} is {tuple(weight.shape)} {weight.dtype}; it must be "
                               f"({hidden},) {x.dtype} (x's last dimension and dtype)")
    for t, what in ((x, "x"), (residual, "residual"), (weight, "weight")):
        _on(t, device, what + tag)
    if residual_out is residual and not residual.is_contiguous():
        raise UnsupportedError(f"{OPNAME}: residual{tag} is updated in place (residual_out=residual) and must "
                               "be contiguous")
    outs: list[torch.Tensor] = []
    for o, what in ((out, "out"), (residual_out, "residual_out")):
        if o is None:
            continue
        o = _tensor(o, what + tag)
        if o.shape != x.shape or o.dtype != x.dtype:
            raise UnsupportedError(f"{OPNAME}: {what}{tag} is {tuple(o.shape)} {o.dtype}, expected "
                                   f"{tuple(x.shape)} {x.dtype}")
        _on(o, device, what + tag)
        if not o.is_contiguous():
            raise UnsupportedError(f"{OPNAME}: {what}{tag} must be contiguous")
        outs.append(o)
    if not residual.is_contiguous():
        residual = residual.contiguous()
    x = x if x.is_contiguous() else x.contiguous()
    weight = weight if weight.is_contiguous() else weight.contiguous()
    y = out if out is not None else torch.empty_like(x, memory_format=torch.contiguous_format)
    r_out = residual_out if residual_out is not None else torch.empty_like(x, memory_format=torch.contiguous_format)
    assert isinstance(y, torch.Tensor) and isinstance(r_out, torch.Tensor)
    # Only exact aliases that the kernel supports: y over x, the residual over itself.
    pairs = ((y, "out", r_out, "residual_out"), (y, "out", residual, "residual"), (y, "out", weight, "weight"),
             (r_out, "residual_out", x, "x"), (r_out, "residual_out", weight, "weight"))
    for a, an, b, bn in pairs:
        if _overlap(a, b):
            raise UnsupportedError(f"{OPNAME}: {an}{tag} overlaps {bn}{tag}; only out=x and residual_out=residual "
                                   "may share memory")
    if _overlap(y, x) and _span(y) != _span(x):
        raise UnsupportedError(f"{OPNAME}: out{tag} partly overlaps x{tag}; it may only be x itself")
    if _overlap(r_out, residual) and _span(r_out) != _span(residual):
        raise UnsupportedError(f"{OPNAME}: residual_out{tag} partly overlaps residual{tag}; it may only be the "
                               "residual itself")
    rows = x.numel() // hidden
    return x, residual, weight, y, r_out, dt, rows, hidden


def no_scale_no_copy(fp8_scale: object, fp8_out: object, tag: str = "") -> None:
    """``fp8_out`` without ``fp8_scale`` is an error (the copy would silently not be written)."""
    if fp8_scale is None and fp8_out is not None:
        raise UnsupportedError(f"{OPNAME}: fp8_out{tag} was given without fp8_scale; the FP8 copy needs its scale")


def check_fp8(fp8_scale: object, fp8_out: object, x: torch.Tensor, inputs: tuple[torch.Tensor, ...],
              outputs: tuple[torch.Tensor, ...], device: torch.device, tag: str = ""
              ) -> tuple[torch.Tensor, torch.Tensor] | None:
    """The FP8 copy's arguments of one rank, after ``check_rank``: None without ``fp8_scale``, else
    (scale, q). ``fp8_scale``: a float32 tensor of one element (any shape, vLLM's ``[1]`` or ``[]``)
    on the device, read by the kernel at every launch (never on the host: CUDA graphs replay its
    current value). ``fp8_out``: float8_e4m3fn of x's shape, contiguous, on the device, sharing no
    memory with ``inputs`` (x, the residual, the weight) or ``outputs`` (y, residual_out); None
    allocates it. The scale may not lie in an output (every block reads it while others write)."""
    no_scale_no_copy(fp8_scale, fp8_out, tag)
    if fp8_scale is None:
        return None
    scale = _tensor(fp8_scale, f"fp8_scale{tag}")
    if scale.dtype != torch.float32 or scale.numel() != 1:
        raise UnsupportedError(f"{OPNAME}: fp8_scale{tag} is {tuple(scale.shape)} {scale.dtype}; it must be one "
                               "torch.float32 element (a per-tensor static scale, as vLLM's)")
    _on(scale, device, f"fp8_scale{tag}")
    if fp8_out is None:
        q = torch.empty(x.shape, dtype=FP8_DTYPE, device=x.device)
    else:
        q = _tensor(fp8_out, f"fp8_out{tag}")
        if q.shape != x.shape or q.dtype != FP8_DTYPE:
            raise UnsupportedError(f"{OPNAME}: fp8_out{tag} is {tuple(q.shape)} {q.dtype}, expected "
                                   f"{tuple(x.shape)} {FP8_DTYPE}")
        _on(q, device, f"fp8_out{tag}")
        if not q.is_contiguous():
            raise UnsupportedError(f"{OPNAME}: fp8_out{tag} must be contiguous")
    if any(_overlap(q, t) for t in (*inputs, *outputs)):
        raise UnsupportedError(f"{OPNAME}: fp8_out{tag} shares memory with another argument; it must not")
    if any(_overlap(scale, t) for t in (*outputs, q)):
        raise UnsupportedError(f"{OPNAME}: fp8_scale{tag} lies inside an output; it must not")
    return scale, q


def into_outputs(got: tuple[torch.Tensor, ...] | list[torch.Tensor],
                 dsts: tuple[torch.Tensor | None, ...]) -> tuple[torch.Tensor, ...]:
    """A traced call's new tensors copied into the caller's outputs where given (torch.compile's
    functional custom ops; the compiler may turn the copies back into in-place writes)."""
    result = []
    for k, src in enumerate(got):
        dst = dsts[k]
        result.append(src if dst is None else dst.copy_(src))
    return tuple(result)


def check_fp8_ranks(checked: list[tuple], fp8_scale: list[object] | None, fp8_out: list[object] | None,
                    device: torch.device, suffix: Callable[[int], str]
                    ) -> list[tuple[torch.Tensor, torch.Tensor]] | None:
    """Every launch rank's (scale, copy), each checked by ``check_fp8`` against that rank's
    ``check_rank`` result, or None without scales. A copy may share memory with no rank's tensors
    and no scale may lie in any rank's copy (one launch writes them all)."""
    no_scale_no_copy(fp8_scale, fp8_out)
    if fp8_scale is None:
        return None
    ins = tuple(t for c in checked for t in c[:3])
    outs = tuple(t for c in checked for t in c[3:5])
    pairs: list[tuple[torch.Tensor, torch.Tensor]] = []
    for r, c in enumerate(checked):
        got = check_fp8(fp8_scale[r], None if fp8_out is None else fp8_out[r], c[0], ins,
                        outs + tuple(q for _, q in pairs), device, suffix(r))
        assert got is not None
        pairs.append(got)
    if any(_overlap(scale, q) for scale, _ in pairs for _, q in pairs):  # a later rank's copy
        raise UnsupportedError(f"{OPNAME}: an fp8_scale lies inside another rank's fp8_out; it must not")
    return pairs


def check_ranks_apart(checked: list[tuple], suffix: Callable[[int], str]) -> None:
    """One launch serves every launch rank of a virtual communicator, each rank's blocks reading
    its tensors while others write theirs: no rank's ``out`` or ``residual_out`` may share memory
    with another rank's tensors (``check_rank`` results). Inputs may be shared (one weight, or one
    residual that no rank updates in place)."""
    if len(checked) < 2:
        return
    names = ("x", "residual", "weight", "out", "residual_out")
    spans = sorted((*_span(c[k]), r, k) for r, c in enumerate(checked) for k in range(5) if c[k].numel())
    active: list[tuple[int, int, int, int]] = []
    for lo, hi, r, k in spans:  # by start: every earlier span still open overlaps this one
        active = [a for a in active if a[1] > lo]
        for _, _, r2, k2 in active:
            if r2 != r and (k >= 3 or k2 >= 3):
                raise UnsupportedError(f"{OPNAME}: {names[k2]}{suffix(r2)} and {names[k]}{suffix(r)} share memory; "
                                       "a rank's out and residual_out must be apart from every other rank's tensors")
        active.append((lo, hi, r, k))
