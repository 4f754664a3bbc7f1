"""The engine plugins' sollat-backed adapter (sollat/integrations/core.py) on real ranks, without any
engine: one process per GPU under torchrun, 2 or more GPUs of one host.

    torchrun --nproc-per-node 2 scripts/engine_adapter_real.py [--batch-invariant] [--into results]

Checks, each logged with its outcome (results/engine_adapter_real[_bi].json; exit 1 if one fails):

* the communicator is built collectively over the NCCL group (agreed over a gloo group);
* the rule: int32, non-contiguous, empty and CPU tensors go back to the caller (``None``);
* ``all_reduce`` bitwise equal to the rank-order reference (rank 0..R-1, fp32 accumulation for
  16-bit types, one rounding) for float32 / bfloat16 / float16 at sizes from 1 element to 8 MiB,
  except where ``auto`` hands the size to a library (NCCL, torch's two-shot; not in
  batch-invariant mode, where every size must be bitwise);
* the fused ``all_reduce_rmsnorm`` (with and without the FP8 copy): the same bits on every rank,
  within rounding of the torch composition;
* CUDA-graph capture inside ``capture()``: replays with new inputs give the reference bits;
* batch invariance: a batch of 1..2048 rows of 4096 bf16 whose row 0 is fixed: row 0 of the
  all-reduce and of the fused RMSNorm's y has the same bits at every batch size (required with
  ``--batch-invariant``; without it, where ``auto`` may hand large batches to NCCL and the fused
  op switches algorithms, logged only).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _real_ranks  # noqa: E402

from sollat.integrations import core  # noqa: E402

DTYPES = (torch.float32, torch.bfloat16, torch.float16)
SIZES = (1, 7, 1000, 4096, 65536, 1 << 20, 4 << 20)  # elements
ROWS = (1, 2, 3, 4, 8, 16, 64, 256, 1024, 2048)
HIDDEN = 4096


def rank_order(xs: list[torch.Tensor]) -> torch.Tensor:
    acc_t = torch.float64 if xs[0].dtype == torch.float64 else torch.float32
    acc = xs[0].to(acc_t)
    for x in xs[1:]:
        acc = acc + x.to(acc_t)
    return acc.to(xs[0].dtype)


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    ib = {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[a.element_size()]
    return bool(torch.equal(a.contiguous().view(ib), b.contiguous().view(ib)))


def gathered(x: torch.Tensor) -> list[torch.Tensor]:
    parts = [torch.empty_like(x) for _ in range(dist.get_world_size())]
    dist.all_gather(parts, x.contiguous())
    return parts


def everyone_agrees(ok: bool) -> bool:
    t = torch.tensor([int(ok)], device="cuda")
    dist.all_reduce(t, op=dist.ReduceOp.MIN)
    return bool(t.item())


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--batch-invariant", action="store_true", help="build the communicator in batch-invariant mode")
    ap.add_argument("--into", default="results", help="folder for the log (default results/)")
    args = ap.parse_args()
    local = _real_ranks.start()
    rank, ws = dist.get_rank(), dist.get_world_size()
    dev = torch.device("cuda", local)
    cpu_group = dist.new_group(backend="gloo")
    rows: list[dict[str, Any]] = []

    def log(check: str, ok: bool, required: bool = True, **what: Any) -> None:
        ok = everyone_agrees(ok)
        rows.append({"check": check, "ok": ok, "required": required, **what})
        if rank == 0:
            print(f"{'ok  ' if ok else 'FAIL'} {'' if required else '(logged) '}{check} {what or ''}", flush=True)

    ad = core.GroupAdapter(engine="torchrun", name="world", device_group=dist.group.WORLD, cpu_group=cpu_group,
                           device=dev, world_size=ws, batch_invariant=args.batch_invariant)
    built = ad.ensure()
    log("communicator built on every rank", built, unavailable=ad.unavailable, batch_invariant=ad.batch_invariant)
    if not built:
        return finish(args, rows)
    comm: Any = ad.comm
    g = torch.Generator(device="cuda").manual_seed(1234 + rank)

    # the rule
    x = torch.randn(64, 32, device=dev, generator=g)
    for name, t in (("int32", x.to(torch.int32)), ("non-contiguous", x.t()), ("empty", x[:0]), ("cpu", x.cpu())):
        log(f"rule: {name} goes to the engine", ad.all_reduce(t) is None)

    # bitwise against the rank-order reference
    for dtype in DTYPES:
        for n in SIZES:
            x = torch.randn(n, device=dev, generator=g).to(dtype)
            y = ad.all_reduce(x)
            assert y is not None
            path = comm.selected_algorithm(n * x.element_size(), dtype)
            library = path in ("nccl", "torch_twoshot", "torch_twoshot_zero_copy")
            ref = rank_order(gathered(x))
            exact = same_bits(y, ref)
            log(f"all_reduce {dtype} n={n} bitwise", exact or (library and not args.batch_invariant),
                path=path, bitwise=exact)

    # the fused AllReduce + residual + RMSNorm, with and without the FP8 copy
    for dtype in DTYPES:
        for nrows in (1, 2, 16):
            x = torch.randn(nrows, HIDDEN, device=dev, generator=g).to(dtype)
            res = torch.randn(nrows, HIDDEN, device=dev, generator=torch.Generator(device="cuda").manual_seed(7)).to(dtype)
            w = torch.randn(HIDDEN, device=dev, generator=torch.Generator(device="cuda").manual_seed(8)).to(dtype)
            scale = torch.full((1,), 0.05, device=dev)
            got = ad.all_reduce_rmsnorm(x, res, w, 1e-6)
            got8 = ad.all_reduce_rmsnorm(x, res, w, 1e-6, fp8_scale=scale)
            assert got is not None and got8 is not None
            s = rank_order(gathered(x)).float() + res.float()
            ref = (s * torch.rsqrt(s.pow(2).mean(-1, keepdim=True) + 1e-6) * w.float())
            same = all(same_bits(p, got[0]) for p in gathered(got[0])) and all(
                same_bits(p, got8[2]) for p in gathered(got8[2]))
            close = bool(torch.allclose(got[0].float(), ref, rtol=3e-2, atol=3e-2))
            log(f"all_reduce_rmsnorm {dtype} rows={nrows}: same bits on every rank, close to torch", same and close,
                max_err=float((got[0].float() - ref).abs().max()))

    # CUDA-graph capture
    for dtype in (torch.bfloat16, torch.float32):
        static = torch.randn(2, HIDDEN, device=dev, generator=g).to(dtype)
        res = torch.randn(2, HIDDEN, device=dev, generator=g).to(dtype)
        w = torch.ones(HIDDEN, device=dev, dtype=dtype)
        side = torch.cuda.Stream(dev)
        side.wait_stream(torch.cuda.current_stream(dev))
        with torch.cuda.stream(side):  # warm-up: first use of each shape (compile, agreement)
            ad.all_reduce(static)
            ad.all_reduce_rmsnorm(static, res, w, 1e-6)
        torch.cuda.current_stream(dev).wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with ad.capture(), torch.cuda.graph(graph):
            out = ad.all_reduce(static)
            fused = ad.all_reduce_rmsnorm(static, res, w, 1e-6)
        assert out is not None and fused is not None
        path = comm.selected_algorithm(static.numel() * static.element_size(), dtype)
        ok, exact = True, True
        for _ in range(3):
            static.copy_(torch.randn(2, HIDDEN, device=dev, generator=g).to(dtype))
            graph.replay()
            torch.cuda.synchronize(dev)
            ref = rank_order(gathered(static))
            exact = exact and same_bits(out, ref)
            ok = ok and bool(torch.allclose(out.float(), ref.float(), rtol=1e-2, atol=1e-2))
        library = path in ("nccl", "torch_twoshot", "torch_twoshot_zero_copy")
        log(f"CUDA graph capture and replay {dtype}", ok and (exact or (library and not args.batch_invariant)),
            path=path, bitwise=exact)

    # batch invariance: row 0 fixed, batches of 1..2048 rows
    fixed = torch.randn(1, HIDDEN, device=dev, generator=torch.Generator(device="cuda").manual_seed(99 + rank))
    fixed = fixed.to(torch.bfloat16)
    res0 = torch.randn(1, HIDDEN, device=dev, generator=torch.Generator(device="cuda").manual_seed(5)).to(torch.bfloat16)
    w = torch.randn(HIDDEN, device=dev, generator=torch.Generator(device="cuda").manual_seed(6)).to(torch.bfloat16)
    shared = torch.Generator(device="cuda").manual_seed(4321)  # the residual is the same on every rank
    first: dict[str, torch.Tensor] = {}
    ar_ok, fused_ok = True, True
    for nrows in ROWS:
        x = torch.cat([fixed, torch.randn(nrows - 1, HIDDEN, device=dev, generator=g).to(torch.bfloat16)])
        res = torch.cat([res0, torch.randn(nrows - 1, HIDDEN, device=dev, generator=shared).to(torch.bfloat16)])
        y = ad.all_reduce(x)
        fy = ad.all_reduce_rmsnorm(x, res, w, 1e-6)
        assert y is not None and fy is not None
        first.setdefault("ar", y[0].clone())
        first.setdefault("fused", fy[0][0].clone())
        ar_ok = ar_ok and same_bits(y[0], first["ar"])
        fused_ok = fused_ok and same_bits(fy[0][0], first["fused"])
    # Without batch-invariant mode, auto may hand the larger batches to NCCL: logged, not required.
    log("batch invariance: all_reduce row 0 over batches 1..2048", ar_ok, required=args.batch_invariant)
    log("batch invariance: all_reduce_rmsnorm y row 0 over batches 1..2048", fused_ok,
        required=args.batch_invariant)
    return finish(args, rows)


def finish(args: argparse.Namespace, rows: list[dict[str, Any]]) -> int:
    name = "engine_adapter_real_bi.json" if args.batch_invariant else "engine_adapter_real.json"
    if dist.get_rank() == 0:
        _real_ranks.write(args.into, name, rows, batch_invariant=args.batch_invariant,
                          script="scripts/engine_adapter_real.py")
    failed = [r["check"] for r in rows if r["required"] and not r["ok"]]
    if dist.get_rank() == 0:
        print(f"{len(rows) - len(failed)} passed, {len(failed)} failed", flush=True)
    _real_ranks.finish()
    return 1 if failed else 0


if __name__ == "__main__":
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
    os.environ.setdefault("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")
    raise SystemExit(main())
