"""Where the one-GPU add + RMSNorm epilogue (kernels/add_rmsnorm.cu) spends its time: the kernel
built with SOLLAT_DIAG_EPI=K (diag.patch: 1 no L2 prefetch, 2 stop after the loads and the r
stores, 3 no division or square root, 4 no early launch of the next kernel, 5 no PDL wait (races,
timing only)), launched with and without the PDL attribute, against the compiled add + norm and
the empty kernel, all by graph replay (100 calls, median of 15 replays), bf16."""

from __future__ import annotations

import torch

from sollat.bench.timing import measure_floor, time_calls
from sollat.collectives import rmsnorm, rmsnorm_epilogue as E
from sollat.device import driver_launch, launch
from sollat.device.dtypes import DTYPES

dev = torch.device("cuda", 0)
launch.ensure_device(0)
torch._dynamo.config.automatic_dynamic_shapes = False
torch._dynamo.config.recompile_limit = 64


def post(y: torch.Tensor, res: torch.Tensor, w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    r = (y.float() + res.float()).to(y.dtype)
    rf = r.float()
    n = (rf * torch.rsqrt(rf.pow(2).mean(-1, keepdim=True) + 1e-6) * w.float()).to(y.dtype)
    return n, r


compiled = torch.compile(post)
base_defines = E.defines
print(f"floor plain {measure_floor(dev).stats.median:.3f} us, pdl {measure_floor(dev, pdl=True).stats.median:.3f} us", flush=True)
for rows, hidden in ((1, 4096), (8, 4096), (1, 8192), (64, 8192)):
    g = torch.Generator(device="cuda").manual_seed(rows * hidden)
    y = torch.randn(rows, hidden, generator=g, device=dev).to(torch.bfloat16)
    res = torch.randn(rows, hidden, generator=g, device=dev).to(torch.bfloat16)
    w = torch.randn(hidden, generator=g, device=dev).to(torch.bfloat16)
    cells = []
    t = time_calls(lambda _i: compiled(y, res, w), calls=100, replays=15, device=dev)
    cells.append(f"compiled={t.stats.median:.3f}")
    for diag in (0, 1, 2, 3, 4, 5):
        for pdl in (True, False):
            E.defines = (lambda dt, tr, diag=diag: dict(base_defines(dt, tr), SOLLAT_DIAG_EPI=str(diag)))
            dt = DTYPES[torch.bfloat16]
            kernel, config, tail = E.launch_parts(dt, rows, hidden, rmsnorm.eps_bits(1e-6))
            geo = rmsnorm.unfused_geometry(dt, rows, hidden)
            config = launch.launch_config((geo.blocks, 1), geo.threads, pdl=pdl)
            bound = driver_launch.BoundLaunch(kernel, config, tail, E.n_ptrs(1))
            ptrs = E.pointer_table(1, [y], [y], [res], [res], [w], None)
            t = time_calls(lambda _i, b=bound, p=ptrs: b(launch.stream_handle(0), p), calls=100, replays=15, device=dev)
            cells.append(f"d{diag}{'p' if pdl else 'n'}={t.stats.median:.3f}")
    print(f"EPI bf16 {rows}x{hidden}: " + " ".join(cells), flush=True)
