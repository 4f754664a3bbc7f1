"""Host cost of the ways Python can allocate an all-reduce's new output.

An eager ``comm.all_reduce(x)`` without ``out=`` allocates its output from Python; ``x + y``
allocates inside one C++ call. This times each allocation form sollat could use (host loops of
20,000, fastest of five runs) beside the yardsticks ``x.add_(y)`` and ``x + y`` (500 back-to-back
calls, one synchronize, fastest of five), on one GPU, one process: no collective is involved.

    python3 scripts/alloc_variants.py [--bytes 128,8192,131072] [--into DIR]
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from pathlib import Path

import torch
from _host_timing import eager_us, host_us

CALLS = 500


def variants(x: torch.Tensor) -> dict[str, Callable[[], object]]:
    shape, dtype, dev, idx, n = x.shape, x.dtype, x.device, x.get_device(), x.numel()
    return {
        "torch.empty_like(x)": lambda: torch.empty_like(x),
        "torch.empty_like(x, memory_format=contiguous)": lambda: torch.empty_like(x, memory_format=torch.contiguous_format),
        "x.new_empty(shape)": lambda: x.new_empty(shape),
        "x.new_empty(x.shape)": lambda: x.new_empty(x.shape),
        "torch.empty(shape, dtype=, device=torch.device)": lambda: torch.empty(shape, dtype=dtype, device=dev),
        "torch.empty(shape, dtype=, device=int)": lambda: torch.empty(shape, dtype=dtype, device=idx),
        "torch.empty(n, dtype=, device=torch.device)": lambda: torch.empty(n, dtype=dtype, device=dev),
        "torch.empty_strided(shape, stride, dtype=, device=)": lambda: torch.empty_strided(shape, (1,), dtype=dtype, device=dev),
        "torch.ops.aten.empty_like.default(x)": lambda: torch.ops.aten.empty_like.default(x),
        "empty loop": lambda: None,
    }


def one_size(nbytes: int) -> list[dict[str, object]]:
    x, y = torch.randn(nbytes // 4, device="cuda"), torch.randn(nbytes // 4, device="cuda")
    cases = [(name, "host", host_us(fn)) for name, fn in variants(x).items()]
    for name, fn in {"torch x.add_(y)": lambda: x.add_(y), "torch x + y": lambda: x + y}.items():
        x.normal_()  # add_ grows x; keep the values finite
        cases.append((name, "launched", eager_us(fn, CALLS)))
    for name, kind, us in cases:
        print(f"{nbytes:>8} B  {kind:<8} {name:<52} {us:7.3f} us", flush=True)
    return [{"bytes": nbytes, "case": name, "kind": kind, "us": us} for name, kind, us in cases]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--bytes", default="128,8192,131072", help="fp32 bytes, comma separated")
    p.add_argument("--into", default=None, help="folder for alloc-variants.json")
    args = p.parse_args()
    rows = [row for nbytes in args.bytes.split(",") for row in one_size(int(nbytes))]
    if args.into:
        Path(args.into).mkdir(parents=True, exist_ok=True)
        Path(args.into, "alloc-variants.json").write_text(json.dumps(
            {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
