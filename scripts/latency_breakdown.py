"""Where the one-shot's time goes at small sizes (development tool; kernels built with
SOLLAT_BREAKDOWN give wrong results on purpose and are never used by the library: they come from
csrc/probes/diag_oneshot_breakdown.cu, selected through sollat.testing.set_defines).

Rows: full kernel; send without waiting; no communication (copy); prologue only; the empty-kernel
floor with and without PDL; for LL also "+resets": LL clearing every consumed line the way the
sentinel protocol must (ProtoLLReset, results still right), i.e. what the resets cost. Same timing as the benchmark (CUDA-graph replay, median).
"""

from __future__ import annotations

import argparse
import sys

import torch

import sollat
from sollat import testing
from sollat.bench.timing import time_calls
from sollat.device import build, launch


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--ranks", type=int, nargs="+", choices=range(2, 9), default=[2, 4, 8], metavar="R",
                   help="virtual rank counts (default: 2 4 8)")
    a = p.parse_args(argv)
    dev = torch.device("cuda", 0)
    launch.ensure_device(0)
    from cuda.core import ObjectCode

    k = ObjectCode.from_cubin(build.compile_cubin('extern "C" __global__ void e() {}', name="empty",
                                                  arch=build.device_arch())).get_kernel("e")
    for pdl in (False, True):
        t = time_calls(lambda i, pdl=pdl: launch.launch(k, launch.launch_config((1, 1), 32, pdl=pdl), (), device=dev), calls=100,
                       replays=15, device=dev)
        print(f"empty kernel pdl={pdl}: {t.stats.median:.3f} us", flush=True)
    for r in a.ranks:
        for algo in ("oneshot_ll", "oneshot_sentinel"):
            cells = []
            modes = [(0, "full"), (4, "self-loop"), (1, "send-no-wait"), (2, "no-comm"), (3, "prologue")]
            if algo == "oneshot_ll":
                modes.append((-1, "+resets"))
            for mode, label in modes:
                c = sollat.VirtualCommunicator(r, dev, algorithms=[algo])
                diag = {algo: testing.DIAG_ONESHOT_BREAKDOWN}
                if mode > 0:
                    testing.set_defines(c, {"SOLLAT_BREAKDOWN": str(mode)}, kernel_files=diag)
                elif mode < 0:
                    testing.set_defines(c, {"SOLLAT_PROTO": "ProtoLLReset"}, kernel_files=diag)
                sets = [[torch.randn(32, device=dev) for _ in range(r)] for _ in range(4)]
                outs = [[torch.empty_like(x) for x in s] for s in sets]
                t = time_calls(lambda i, c=c, sets=sets, outs=outs, algo=algo: c.all_reduce(
                    sets[i % 4], algo=algo, out=outs[i % 4]), calls=100, replays=15, device=dev)
                cells.append(f"{label}={t.stats.median:.3f}")
                del c
            print(f"R={r} {algo} 128B fp32: " + "  ".join(cells), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
