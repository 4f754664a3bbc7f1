"""Reference reductions and input generators shared by the GPU tests."""

from __future__ import annotations

import torch

POISON = {torch.float32: float("nan"), torch.float64: float("nan"), torch.bfloat16: float("nan"),
          torch.float16: float("nan")}


def rank_order_reduce(xs: list[torch.Tensor], op: str) -> torch.Tensor:
    """What every deterministic sollat path computes: rank order 0..R-1, fp32 accumulation for
    16-bit types (fp64 for fp64), one rounding at the end."""
    acc_t = torch.float64 if xs[0].dtype == torch.float64 else torch.float32
    acc = xs[0].to(acc_t)
    for x in xs[1:]:
        v = x.to(acc_t)
        if op == "sum":
            acc = acc + v
        elif op == "max":
            acc = torch.maximum(acc, v)
        else:
            acc = torch.minimum(acc, v)
    return acc.to(xs[0].dtype)


def same_bits(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Elementwise: bitwise equal, or both NaN (NaN payloads are not specified)."""
    ib = {2: torch.int16, 4: torch.int32, 8: torch.int64}[a.element_size()]
    eq = a.contiguous().view(ib) == b.contiguous().view(ib)
    return eq | (torch.isnan(a) & torch.isnan(b))


def assert_bitwise(out: torch.Tensor, ref: torch.Tensor, what: str) -> None:
    ok = same_bits(out, ref)
    if not bool(ok.all()):
        bad = (~ok).nonzero().flatten()
        i = int(bad[0])
        raise AssertionError(f"{what}: {bad.numel()} of {ok.numel()} elements differ; first at {i}: "
                             f"got {out.flatten()[i].item()!r}, expected {ref.flatten()[i].item()!r}")


def random_inputs(r: int, n: int, dtype: torch.dtype, device: torch.device, gen: torch.Generator) -> list[torch.Tensor]:
    return [torch.randn(n, device=device, dtype=torch.float32, generator=gen).to(dtype) for _ in range(r)]


UNIT_ROUNDOFF = {torch.float32: 2.0**-24, torch.bfloat16: 2.0**-8, torch.float16: 2.0**-11, torch.float64: 2.0**-53}


def assert_within_sum_bound(out: torch.Tensor, xs: list[torch.Tensor], what: str) -> None:
    """Non-deterministic sums (LL128 atomic): the standard recursive-summation bound
    |y - sum| <= (R-1) u sum|x_i|  (accumulation in the dtype itself, any order), plus R times the
    smallest normal for fp32 vector atomics flushing denormals to zero. NaN never passes."""
    r = len(xs)
    x64 = torch.stack([x.double() for x in xs])
    exact = x64.sum(0)
    bound = (r - 1) * UNIT_ROUNDOFF[out.dtype] * x64.abs().sum(0) + (r + 1) * torch.finfo(out.dtype).tiny
    err = (out.double() - exact).abs()
    bad = ~(err <= bound)
    if bool(bad.any()):
        i = int(bad.nonzero()[0])
        raise AssertionError(f"{what}: {int(bad.sum())} elements outside the summation bound; first at {i}: "
                             f"got {out.flatten()[i].item()!r}, exact {exact.flatten()[i].item()!r}, "
                             f"bound {bound.flatten()[i].item():.3g}")
