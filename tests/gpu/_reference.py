"""Reference reductions and input generators shared by the GPU tests."""

from __future__ import annotations

import hashlib
import zlib

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


def _sum_and_bound(dtype: torch.dtype, xs: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """The float64 sum of ``xs`` and the bound ``assert_within_sum_bound`` states. For 16- and 32-bit
    inputs the float64 sum's own error is far below the bound (29 or more bits to spare); for float64
    inputs it is itself a sum in some order, with error up to (R-1) u sum|x_i|, so the bound counts
    that term twice."""
    r = len(xs)
    x64 = torch.stack([x.double() for x in xs])
    terms = 2 if dtype == torch.float64 else 1
    bound = terms * (r - 1) * UNIT_ROUNDOFF[dtype] * x64.abs().sum(0) + (r + 1) * torch.finfo(dtype).tiny
    return x64.sum(0), bound


def assert_within_sum_bound(out: torch.Tensor, xs: list[torch.Tensor], what: str) -> None:
    """Non-deterministic sums (LL128 atomic): the standard recursive-summation bound
    |y - sum| <= (R-1) u sum|x_i|  (accumulation in the dtype itself, any order), plus R times the
    smallest normal for fp32 vector atomics flushing denormals to zero. NaN never passes."""
    exact, bound = _sum_and_bound(out.dtype, xs)
    err = (out.double() - exact).abs()
    bad = ~(err <= bound)
    if bool(bad.any()):
        i = int(bad.nonzero()[0])
        raise AssertionError(f"{what}: {int(bad.sum())} elements outside the summation bound; first at {i}: "
                             f"got {out.flatten()[i].item()!r}, exact {exact.flatten()[i].item()!r}, "
                             f"bound {bound.flatten()[i].item():.3g}")


# ---- Real-rank helpers (tests/gpu/mp_suite.py) --------------------------------------------------
# Inputs are built from integer hashes only (no float arithmetic, no device RNG), so every rank
# draws bit-identical inputs for every rank on any device. Seeds come from seed_of(), a CRC32 of
# the parts' text: never from hash(), which Python randomises per process.

_M32 = 0xFFFFFFFF
INT_VIEW = {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def seed_of(*parts: object) -> int:
    """A 32-bit seed from the parts' text (identical in every process)."""
    return zlib.crc32("|".join(str(p) for p in parts).encode())


def mix32_int(x: int) -> int:
    """lowbias32 (C. Wellons) on a Python int: the reference for ``_mix32``."""
    x &= _M32
    x ^= x >> 16
    x = (x * 0x7FEB352D) & _M32
    x ^= x >> 15
    x = (x * 0x846CA68B) & _M32
    x ^= x >> 16
    return x


def _mul32(x: torch.Tensor, c: int) -> torch.Tensor:
    """(x * c) mod 2**32 for int64 x in [0, 2**32), without int64 overflow."""
    lo, hi = c & 0xFFFF, c >> 16
    return (x * lo + (((x * hi) & 0xFFFF) << 16)) & _M32


def _mix32(x: torch.Tensor) -> torch.Tensor:
    x = x ^ (x >> 16)
    x = _mul32(x, 0x7FEB352D)
    x = x ^ (x >> 15)
    x = _mul32(x, 0x846CA68B)
    return x ^ (x >> 16)


def hash_words(seed: int, n: int, device: torch.device | str) -> torch.Tensor:
    """n pseudo-random 32-bit words (int64 tensor, values in [0, 2**32)), a pure function of (seed, n)."""
    a, b = mix32_int(seed ^ 0x9E3779B9), mix32_int(seed + 0x632BE5AB)
    j = torch.arange(n, dtype=torch.int64, device=device)
    return _mix32(_mix32((j + a) & _M32) ^ b)


def hash_words_int(seed: int, j: int) -> int:
    """Word j of ``hash_words(seed, ...)`` in pure Python (for the CPU self-test)."""
    a, b = mix32_int(seed ^ 0x9E3779B9), mix32_int(seed + 0x632BE5AB)
    return mix32_int(mix32_int((j + a) & _M32) ^ b)


# (exponent bits, mantissa bits) of each float format
_FORMAT = {torch.float32: (8, 23), torch.float64: (11, 52), torch.bfloat16: (8, 7), torch.float16: (5, 10)}
ELEMENT_KINDS = ("normal", "zero", "denormal", "tiny", "huge", "inf", "nan", "sentinel", "canonical_nan", "bits")
# Input classes: per-mille weights of element kinds. "mix" adds whole 16-element runs of the sentinel
# pattern and of -0.0 (a full LL / sentinel line of them). Classes without signed zeros ("...nz", and
# the others) suit max/min, whose result for (-0.0, +0.0) is not specified bitwise.
INPUT_CLASSES: dict[str, dict[str, int]] = {
    "randn": {"normal": 1000},
    "nan": {"normal": 850, "nan": 100, "sentinel": 30, "canonical_nan": 20},
    "inf": {"normal": 850, "inf": 150},
    "negzero": {"normal": 400, "zero": 600},
    "denormal": {"denormal": 600, "zero": 200, "tiny": 200},
    "denormalnz": {"denormal": 700, "tiny": 300},
    "huge": {"huge": 500, "normal": 500},
    "bits": {"bits": 950, "sentinel": 50},
    "mix": {k: 100 for k in ELEMENT_KINDS},
    "mixnz": {k: (0 if k == "zero" else 111) for k in ELEMENT_KINDS},
}
# classes whose sums stay finite: what the summation bound of a non-deterministic algorithm accepts
FINITE_CLASSES = ("randn", "negzero", "denormal")
NO_SIGNED_ZERO_CLASSES = ("randn", "nan", "inf", "denormalnz", "huge", "bits", "mixnz")


def _to_signed(v: torch.Tensor, bits: int) -> torch.Tensor:
    """int64 values in [0, 2**bits) -> the same bit pattern as a signed int of that width."""
    return v - ((v >> (bits - 1)) << bits)


def make_input(kind: str, seed: int, n: int, dtype: torch.dtype, device: torch.device | str) -> torch.Tensor:
    """n elements of ``dtype`` of input class ``kind`` (INPUT_CLASSES), bit-exactly determined by
    (kind, seed, n, dtype) and identical on every device. Built as (sign, exponent, mantissa) fields."""
    ebits, mbits = _FORMAT[dtype]
    emax = (1 << ebits) - 1
    bias = emax >> 1
    mmask = (1 << mbits) - 1
    wide = mbits > 31
    words = hash_words(seed, n * (3 if wide else 2), device).view(n, -1)
    wk, wm = words[:, 0], words[:, 1]
    sign = wm >> 31
    mant = (((wm & 0xFFFFF) << 32) | words[:, 2]) if wide else (wm & mmask)
    sel = wk % 1000
    rnd_exp = (wk // 1000) % (1 << ebits)
    normal_exp = bias - 8 + (wk // 1000) % 17
    nonzero_mant = mant + (mant == 0).to(torch.int64)
    exp = torch.zeros_like(sel)
    man = torch.zeros_like(sel)
    sgn = sign.clone()
    lo = 0
    for k, w in INPUT_CLASSES[kind].items():
        if w == 0:
            continue
        m = (sel >= lo) & (sel < lo + w)
        lo += w
        e_k, m_k = {
            "normal": (normal_exp, mant),
            "zero": (0, 0),
            "denormal": (0, nonzero_mant),
            "tiny": (1, mant),
            "huge": (emax - 1, mant),
            "inf": (emax, 0),
            "nan": (emax, nonzero_mant),
            "sentinel": (emax, mmask),
            "canonical_nan": (emax, 1 << (mbits - 1)),
            "bits": (rnd_exp, mant),
        }[k]
        exp = torch.where(m, e_k, exp)
        man = torch.where(m, m_k, man)
        if k == "sentinel":
            sgn = torch.where(m, 1, sgn)
        elif k == "canonical_nan":
            sgn = torch.where(m, 0, sgn)
    if lo < 1000:  # weights below 1000 per mille: the rest stays normal
        rest = sel >= lo
        exp, man = torch.where(rest, normal_exp, exp), torch.where(rest, mant, man)
    if kind == "mix":
        runs = hash_words(seed ^ 0x5EED, (n + 15) // 16, device) % 8
        runs = runs.repeat_interleave(16)[:n]
        sent, negz = runs == 0, runs == 1
        exp = torch.where(sent, emax, torch.where(negz, 0, exp))
        man = torch.where(sent, mmask, torch.where(negz, 0, man))
        sgn = torch.where(sent | negz, 1, sgn)
    if wide:  # float64: assemble two 32-bit halves (little endian), no 64-bit shifts into the sign
        hi = (sgn << 31) | (exp << 20) | (man >> 32)
        lo32 = man & _M32
        pair = torch.stack([_to_signed(lo32, 32), _to_signed(hi, 32)], dim=1).to(torch.int32).contiguous()
        return pair.view(torch.float64).view(n)
    nbits = 1 + ebits + mbits
    bits = (sgn << (nbits - 1)) | (exp << mbits) | man
    return _to_signed(bits, nbits).to(INT_VIEW[nbits // 8]).view(dtype)


def make_inputs(kind: str, seed: int, n: int, dtype: torch.dtype, device: torch.device | str,
                world: int) -> list[torch.Tensor]:
    """Every rank's input of one call (rank r: seed_of(seed, "rank", r))."""
    return [make_input(kind, seed_of(seed, "rank", r), n, dtype, device) for r in range(world)]


def raw_bits(t: torch.Tensor) -> torch.Tensor:
    """The tensor's bits as a contiguous signed-int tensor of the same element size."""
    return t.contiguous().view(INT_VIEW[t.element_size()])


def digest(t: torch.Tensor, canonical_nan: bool = False) -> str:
    """SHA-256 (24 hex digits) of the raw bits, with dtype and shape; with ``canonical_nan`` every
    NaN is first replaced by one pattern (tells a NaN-payload difference from a value difference)."""
    if canonical_nan and t.is_floating_point():
        t = torch.where(torch.isnan(t), torch.full_like(t, float("nan")), t)
    data = raw_bits(t).cpu().numpy().tobytes()
    h = hashlib.sha256(f"{t.dtype}|{tuple(t.shape)}|".encode())
    h.update(data)
    return h.hexdigest()[:24]


def bitwise_bad(out: torch.Tensor, ref: torch.Tensor) -> torch.Tensor:
    """Number of elements (0-dim device tensor, no sync) that are neither bitwise equal nor both NaN."""
    return (~same_bits(out, ref)).sum()


def nan_or_exact_bad(out: torch.Tensor, ref: torch.Tensor) -> torch.Tensor:
    """Elements of a faulted call's output that are neither NaN nor bitwise the correct result."""
    return (~(same_bits(out, ref) | torch.isnan(out))).sum()


def sum_bound_ok(out: torch.Tensor, xs: list[torch.Tensor]) -> torch.Tensor:
    """Elementwise: within ``assert_within_sum_bound``'s bound (NaN never is)."""
    exact, bound = _sum_and_bound(out.dtype, xs)
    return (out.double() - exact).abs() <= bound


def sum_bound_bad(out: torch.Tensor, xs: list[torch.Tensor]) -> torch.Tensor:
    """Elements outside the summation bound (0-dim device tensor, no sync)."""
    return (~sum_bound_ok(out, xs)).sum()


def nan_or_within_bound_bad(out: torch.Tensor, xs: list[torch.Tensor]) -> torch.Tensor:
    """A faulted non-deterministic call: elements neither NaN nor within the summation bound."""
    return (~(sum_bound_ok(out, xs) | torch.isnan(out))).sum()


def first_difference(out: torch.Tensor, ref: torch.Tensor) -> str:
    """Where and how ``out`` first differs from ``ref`` bitwise (for failure messages)."""
    ok = same_bits(out, ref).flatten()
    bad = (~ok).nonzero().flatten()
    if bad.numel() == 0:
        return "no difference"
    i = int(bad[0])
    o, r = out.flatten()[i], ref.flatten()[i]
    return (f"{bad.numel()} of {ok.numel()} elements differ; first at {i}: got {o.item()!r} "
            f"(0x{int(raw_bits(o.reshape(1))[0]) & 0xFFFFFFFFFFFFFFFF:x}), expected {r.item()!r}")
