"""Which kernels NCCL really runs on a registered symmetric window: the bench's
``nccl-window`` peer allocates its buffers with torch symmetric memory on the NCCL backend, where
NCCL 2.28 may choose its symmetric-memory kernels. This records every CUDA kernel of
``dist.all_reduce`` with torch.profiler, on a window tensor and on an ordinary tensor, and prints
the kernel names per size: the names say which path ran.

    NCCL_DEBUG=INFO torchrun --nproc-per-node 2 scripts/nccl_window_check.py [--into DIR]
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed._symmetric_memory as symm_mem
from torch.profiler import ProfilerActivity, profile

SIZES = (128, 64 << 10, 4 << 20, 64 << 20)


def kernels(x: torch.Tensor) -> list[str]:
    for _ in range(3):
        dist.all_reduce(x)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(5):
            dist.all_reduce(x)
        torch.cuda.synchronize()
    return sorted({e.key for e in prof.key_averages() if "nccl" in e.key.lower() or "symk" in e.key.lower()})


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--into", default=None, help="folder for nccl-window.json")
    args = p.parse_args()
    rank = int(os.environ["LOCAL_RANK"])
    dev = torch.device("cuda", rank)
    torch.cuda.set_device(dev)
    symm_mem.set_backend("NCCL")
    dist.init_process_group("nccl", device_id=dev)
    group = dist.group.WORLD.group_name
    found = []
    for nbytes in SIZES:
        n = nbytes // 4
        win = symm_mem.empty(n, dtype=torch.float32, device=dev)
        symm_mem.rendezvous(win, group)
        win.normal_()
        plain = torch.randn(n, device=dev)
        for kind, x in (("window", win), ("plain", plain)):
            names = kernels(x)
            found.append({"bytes": nbytes, "tensor": kind, "kernels": names})
            if rank == 0:
                print(f"{nbytes:>9} B {kind:<6}: {'; '.join(names) or '(no NCCL kernel seen)'}", flush=True)
    if rank == 0 and args.into:
        Path(args.into).mkdir(parents=True, exist_ok=True)
        (Path(args.into) / "nccl-window.json").write_text(json.dumps(
            {"nccl": ".".join(map(str, torch.cuda.nccl.version())), "torch": torch.__version__, "rows": found},
            indent=1))
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
