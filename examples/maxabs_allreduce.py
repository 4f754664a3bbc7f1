"""A user-written collective: AllReduce of max(|x|) over ranks (the kernel: maxabs_allreduce.cu).

    python3 examples/maxabs_allreduce.py            # 4 virtual ranks on GPU 0; without a GPU: compiles only
    python3 examples/maxabs_allreduce.py --proto sentinel --ranks 8

docs/custom-collectives.md explains the kernel and the rules it follows. Its GPU test
(tests/gpu/test_custom.py) passed on an H200 on 2026-11-30.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

import sollat
from sollat.collectives.custom import Collective
from sollat.device.build import NvrtcMissingError

SOURCE = Path(__file__).with_name("maxabs_allreduce.cu")
DTYPES = (torch.float32, torch.bfloat16, torch.float16, torch.float64)


def collective(proto: str = "ll", max_slots: int = 2) -> Collective:
    """The collective, as every rank registers it (``collectives=[...]`` at construction)."""
    return Collective("maxabs", SOURCE, proto=proto, dtypes=DTYPES, max_slots=max_slots,
                      doc="AllReduce of max(|x|): every rank gets max over ranks of |x_r|, elementwise")


def reference(xs: list[torch.Tensor]) -> torch.Tensor:
    """What the kernel computes: max over ranks of |x_r| (exact in any order; NaN if any is NaN)."""
    acc = xs[0].abs()
    for x in xs[1:]:
        acc = torch.maximum(acc, x.abs())
    return acc


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--proto", choices=("ll", "sentinel"), default="ll")
    ap.add_argument("--ranks", type=int, default=4)
    ap.add_argument("--elements", type=int, default=100_003)
    args = ap.parse_args()
    coll = collective(args.proto)
    if not torch.cuda.is_available():
        for dtype in DTYPES:
            sollat.custom.compile(coll, dtype, world_size=args.ranks)
        print(f"no CUDA GPU: compiled {coll} for sm_90 for {len(DTYPES)} dtypes, ran nothing")
        return
    comm = sollat.VirtualCommunicator(args.ranks, collectives=[coll])
    for dtype in DTYPES:
        xs = [torch.randn(args.elements, device="cuda").to(dtype) for _ in range(args.ranks)]
        ys = comm.run(coll, xs)
        ref = reference(xs)
        same = all(torch.equal(y.view(torch.uint8), ref.view(torch.uint8)) for y in ys)
        print(f"maxabs {args.proto} {dtype} n={args.elements} on {args.ranks} virtual ranks: "
              f"{'bitwise equal to the reference' if same else 'DIFFERS from the reference'}")
    comm.check()


if __name__ == "__main__":
    try:
        main()
    except NvrtcMissingError as exc:  # no traceback for a missing install step: one line naming the extra
        raise SystemExit(str(exc)) from None
