"""Element types sollat reduces, their device names and the sentinel bit patterns.

The sentinel protocol marks an empty scratch slot with a bit pattern that is a NaN *in that dtype*,
and canonicalises every NaN it sends to a different NaN, so valid data never equals the sentinel
while NaN inputs still produce NaN outputs. Each dtype has its own pattern: the 16-bit word 0x7E00 is
a NaN in fp16 but the finite number 4.25e37 in bf16.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .abi import BITS


@dataclass(frozen=True)
class DType:
    torch_dtype: torch.dtype
    short: str  # used in kernel names: f32, bf16, f16, f64
    cxx: str  # device storage type (see csrc/include/sollat/types.h)
    size: int  # bytes per element
    sentinel: int  # bit pattern of an empty sentinel slot (a NaN of this dtype)
    canonical_nan: int  # every NaN is sent as this pattern (a NaN, never the sentinel)
    ll128: bool  # LL128 atomic has a vector atomic add for it


def _dtype(t: torch.dtype, short: str, cxx: str, ll128: bool) -> DType:
    b = BITS[short]  # bit patterns: abi.py
    return DType(t, short, cxx, b.width // 8, b.sentinel, b.canonical_nan, ll128)


DTYPES: dict[torch.dtype, DType] = {
    torch.float32: _dtype(torch.float32, "f32", "float", True),
    torch.bfloat16: _dtype(torch.bfloat16, "bf16", "sollat::bf16", True),
    torch.float16: _dtype(torch.float16, "f16", "sollat::f16", True),
    torch.float64: _dtype(torch.float64, "f64", "double", False),
}

OPS: tuple[str, ...] = ("sum", "max", "min")


def lookup(dtype: torch.dtype, opname: str = "all_reduce") -> DType:
    """Return the sollat description of ``dtype`` or raise a clear error."""
    try:
        return DTYPES[dtype]
    except KeyError:
        supported = ", ".join(str(d).replace("torch.", "") for d in DTYPES)
        raise _unsupported(f"{opname}: dtype {dtype} is not supported; supported dtypes: {supported}") from None


def _unsupported(msg: str) -> Exception:
    from ..errors import UnsupportedError

    return UnsupportedError(msg)
