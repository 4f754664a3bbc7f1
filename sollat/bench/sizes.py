"""Message sizes: parsing ``--sizes`` and printing byte counts the way nccl-tests users read them."""

from __future__ import annotations

import re

_UNITS = {"": 1, "B": 1, "K": 1 << 10, "KB": 1 << 10, "KIB": 1 << 10, "M": 1 << 20, "MB": 1 << 20,
          "MIB": 1 << 20, "G": 1 << 30, "GB": 1 << 30, "GIB": 1 << 30}

DEFAULT_SIZES = "4:64M"  # 4 B to 64 MiB in x2 steps (25 sizes)
QUICK_SIZES = "4:64M:8"  # 4 B, 32 B, 256 B ... 64 MiB in x8 steps (9 sizes)


def parse_bytes(text: str) -> int:
    """``"4"``, ``"128B"``, ``"1K"``, ``"64MiB"`` -> bytes (K/M/G are powers of 1024)."""
    m = re.fullmatch(r"\s*(\d+)\s*([A-Za-z]*)\s*", text)
    if not m:
        raise ValueError(f"not a byte count: {text!r} (examples: 4, 128B, 1K, 64M)")
    unit = m.group(2).upper()
    if unit not in _UNITS:
        raise ValueError(f"unknown unit {m.group(2)!r} in {text!r} (use B, K, M or G)")
    value = int(m.group(1)) * _UNITS[unit]
    if value <= 0:
        raise ValueError(f"byte count must be positive: {text!r}")
    return value


def parse_sizes(spec: str) -> list[int]:
    """Parse a ``--sizes`` spec into a sorted list of distinct byte counts.

    ``LO:HI`` is LO, 2*LO, ... up to HI; ``LO:HI:F`` steps by a factor F; a comma list mixes
    ranges and single sizes: ``"4:1K,64M"``.
    """
    out: set[int] = set()
    for part in spec.split(","):
        part = part.strip()
        if not part:
            continue
        if ":" in part:
            fields = part.split(":")
            if len(fields) not in (2, 3):
                raise ValueError(f"bad size range {part!r}: use LO:HI or LO:HI:FACTOR")
            lo, hi = parse_bytes(fields[0]), parse_bytes(fields[1])
            factor = int(fields[2]) if len(fields) == 3 else 2
            if factor < 2:
                raise ValueError(f"size step factor must be >= 2 in {part!r}")
            if hi < lo:
                raise ValueError(f"size range {part!r} runs backwards")
            n = lo
            while n <= hi:
                out.add(n)
                n *= factor
        else:
            out.add(parse_bytes(part))
    if not out:
        raise ValueError(f"no sizes in {spec!r}")
    return sorted(out)


def format_bytes(n: int) -> str:
    """4 -> '4 B', 2048 -> '2 KiB', 3 MiB -> '3 MiB' (exact powers only get the short form)."""
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale and n % scale == 0:
            return f"{n // scale} {unit}"
    return f"{n} B"


def parse_int_list(spec: str) -> list[int]:
    """``"2,4,8"`` -> [2, 4, 8] (also accepts ``"2:8"`` for 2, 4, 8)."""
    out: list[int] = []
    for part in spec.split(","):
        part = part.strip()
        if not part:
            continue
        if ":" in part:
            lo, hi = (int(x) for x in part.split(":", 1))
            n = lo
            while n <= hi:
                out.append(n)
                n *= 2
        else:
            out.append(int(part))
    if not out or any(v < 1 for v in out):
        raise ValueError(f"expected a list of positive integers, got {spec!r}")
    return sorted(set(out))
