"""Where the fused AllReduce + residual + RMSNorm spends its time above the AllReduce, on virtual
ranks: kernels/allreduce_rmsnorm.cu (the row exchange on mbarriers) built with SOLLAT_DIAG_FUSED=K
(fused-diag.patch beside this file, applied to a copy of the package; diagnostic builds give wrong
results on purpose, nothing is checked):
  K6 the AllReduce alone in the fused kernel's geometry: no residual, no sum of squares, no row
     exchange, no normalisation; y = the rounded sum
  K1 K6 with the residual loaded, added and stored (res_out), y = r
  K3 everything through the row exchange and the combine of the chunk sums, then y = r
  K2 everything but the division chain (rstd = 1)
against the one-shot AllReduce alone at the same bytes, and the epilogue kernel and the compiled
norm over the same rows; bf16, timed as scripts/rmsnorm_bench.py times its rows (its Case, graph
replay, median). Run from the repository root with the patched copy first on PYTHONPATH."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import torch

import sollat
from sollat import testing
from sollat.bench import rmsnorm_sweep as sweep
from sollat.bench.timing import calls_for, measure_floor, time_calls

spec = importlib.util.spec_from_file_location("rmsnorm_bench", Path("scripts/rmsnorm_bench.py").resolve())
assert spec is not None and spec.loader is not None
bench = importlib.util.module_from_spec(spec)
sys.modules[spec.name] = bench
spec.loader.exec_module(bench)

dev = torch.device("cuda", 0)
print(f"sollat from {sollat.__file__}; args {sys.argv[1:]}; floor {measure_floor(dev).stats.median:.3f} us, "
      f"pdl floor {measure_floor(dev, pdl=True).stats.median:.3f} us", flush=True)


def t(fn, calls):  # type: ignore[no-untyped-def]
    return time_calls(fn, calls=calls, replays=15, warmup=1, eager=1, device=dev).stats.median


for ranks in (2, 8):
    for tokens, hidden in ((1, 4096), (1, 8192), (8, 8192)):
        shape = sweep.Shape(ranks, "bfloat16", False, tokens, hidden)
        calls = calls_for(tokens * shape.row_bytes * ranks, 20)
        cells = []
        for algo in ("oneshot_ll", "oneshot_sentinel"):
            for k in (0, 6, 1, 3, 2):
                comm = sollat.VirtualCommunicator(ranks, dev)
                testing.set_defines(comm, {"SOLLAT_DIAG_FUSED": str(k)} if k else {})
                case = bench.Case(comm, True, shape, dev, torch.Generator(device=dev).manual_seed(tokens * hidden))
                cells.append(f"{algo[8:]}:K{k}={t(case.fused(algo), calls):.2f}")
                if k == 0:
                    def ar(i: int, case=case, algo=algo) -> None:
                        i %= case.sets
                        case.comm.all_reduce(case.r[0][i], out=case.r[2][i], algo=algo)
                    cells.append(f"{algo[8:]}:ar={t(ar, calls):.2f}")
                    if algo == "oneshot_ll":
                        cells.append(f"epi={t(case.epilogue, calls):.2f} norm={t(case.norm, calls):.2f}")
                del case, comm
                torch.cuda.empty_cache()
        print(f"R={ranks} {tokens}x{hidden} bf16: " + " ".join(cells), flush=True)
