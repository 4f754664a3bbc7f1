"""Where the fused AllReduce + residual + RMSNorm spends its time above the AllReduce, on virtual
ranks: kernels/allreduce_rmsnorm.cu built with SOLLAT_DIAG_FUSED=K (fused-diag.patch, applied to a
copy of the package: 1 no sum of squares, no row barrier, no normalisation, y = r; 2 no division
chain, rstd = 1; 3 everything through the row barrier and the combine of the chunk sums, then
y = r), against the one-shot AllReduce alone at the same bytes, bf16, timed as
scripts/rmsnorm_bench.py times its rows (its Case, graph replay, median). Diagnostic builds give
wrong results on purpose; nothing is checked. Run from the repository root with the patched copy
first on PYTHONPATH."""

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
print(f"sollat from {sollat.__file__}; floor {measure_floor(dev).stats.median:.3f} us", flush=True)
for ranks in (2, 8):
    for tokens, hidden in ((1, 4096), (1, 8192), (8, 8192)):
        shape = sweep.Shape(ranks, "bfloat16", False, tokens, hidden)
        cells = []
        for algo in ("oneshot_ll", "oneshot_sentinel"):
            for k in (0, 1, 2, 3):
                comm = sollat.VirtualCommunicator(ranks, dev)
                testing.set_defines(comm, {"SOLLAT_DIAG_FUSED": str(k)} if k else {})
                case = bench.Case(comm, True, shape, dev, torch.Generator(device=dev).manual_seed(tokens * hidden))
                calls = calls_for(tokens * shape.row_bytes * ranks, 20)
                fused = time_calls(case.fused(algo), calls=calls, replays=15, warmup=1, eager=1, device=dev)
                cells.append(f"{algo[8:]}:K{k}={fused.stats.median:.2f}")
                if k == 0:
                    def ar(i: int, case=case, algo=algo) -> None:
                        i %= case.sets
                        case.comm.all_reduce(case.r[0][i], out=case.r[2][i], algo=algo)
                    t = time_calls(ar, calls=calls, replays=15, warmup=1, eager=1, device=dev)
                    cells.append(f"{algo[8:]}:ar={t.stats.median:.2f}")
                del case, comm
                torch.cuda.empty_cache()
        print(f"R={ranks} {tokens}x{hidden} bf16: " + " ".join(cells), flush=True)
