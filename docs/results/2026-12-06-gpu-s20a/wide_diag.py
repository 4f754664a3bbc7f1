"""Where the wide one-shot's time goes, and what the 8 -> 9 step is, on virtual ranks (one GPU):
wide-diag.patch (beside this file, applied to a copy of the package) adds two diagnostic defines,
whose builds give wrong results on purpose (only the unpatched rows, define 0, are checked):
  SOLLAT_DIAG_WIDE  0 full, 1 no reduce (own line out), 2 send without waiting, 3 no
                    communication, 4 prologue (input and epoch loads, own line out), 5 empty body
  SOLLAT_POLL_BACKOFF_NS  a __nanosleep between polls (fewer polls in flight on the one L2)
Also: oneshot_ll at R = 2 and 8 with and without rank clusters, and at R = 8 built with the wide
rank cap (SOLLAT_MAX_RANKS=72: the table loads and window loops of R >= 9); the empty-kernel floor
in the wide launch's geometry. fp32, 128 B unless said; graph replay (50 calls, median of 11),
each case twice in alternating order, the lower median kept. Run from the repository root with
the patched copy first on PYTHONPATH."""

from __future__ import annotations

import sys

import torch

import sollat
from sollat import testing
from sollat.bench.timing import measure_floor
from sollat.bench.virtual import rank_order_sum, rotating_sets, time_rotating

dev = torch.device("cuda", 0)
print(f"sollat from {sollat.__file__}", flush=True)


def case(r: int, algo: str, defines: dict[str, str], *, cluster: bool = True, nbytes: int = 128) -> float:
    comm = sollat.VirtualCommunicator(r, dev, algorithms=[algo], cluster_ranks=cluster)
    if defines:
        testing.set_defines(comm, defines)
    sets = rotating_sets(r, max(1, nbytes // 4), torch.float32, dev, 2)
    t = time_rotating(comm, algo, sets, calls=50, replays=11, device=dev).stats.median
    if not defines or defines == {"SOLLAT_DIAG_WIDE": "0"}:
        ref = rank_order_sum(sets[0][0])
        assert all(torch.equal(o, ref) for o in sets[1][0]), (r, algo, defines, cluster)
    del comm
    return t


CASES: list[tuple[str, int, str, dict[str, str], bool, int]] = []
for r in (2, 8):
    CASES.append((f"R={r} oneshot_ll clusters", r, "oneshot_ll", {}, True, 128))
    CASES.append((f"R={r} oneshot_ll no-clusters", r, "oneshot_ll", {}, False, 128))
    CASES.append((f"R={r} oneshot_ll backoff32", r, "oneshot_ll", {"SOLLAT_POLL_BACKOFF_NS": "32"}, True, 128))
CASES.append(("R=8 oneshot_ll cap72 clusters", 8, "oneshot_ll", {"SOLLAT_MAX_RANKS": "72"}, True, 128))
CASES.append(("R=8 oneshot_ll cap72 no-clusters", 8, "oneshot_ll", {"SOLLAT_MAX_RANKS": "72"}, False, 128))
CASES.append(("R=9 oneshot_ll", 9, "oneshot_ll", {}, True, 128))
CASES.append(("R=64 oneshot_ll", 64, "oneshot_ll", {}, True, 128))
CASES.append(("R=64 oneshot_ll backoff32", 64, "oneshot_ll", {"SOLLAT_POLL_BACKOFF_NS": "32"}, True, 128))
VARIANTS = {"0": "full", "1": "no-reduce", "2": "send-no-wait", "3": "no-comm", "4": "prologue", "5": "empty-body"}
for r in (9, 16, 32, 64, 72):
    for k, label in VARIANTS.items():
        CASES.append((f"R={r} wide {label}", r, "oneshot_ll_wide", {"SOLLAT_DIAG_WIDE": k}, True, 128))
    for ns in ("32", "128"):
        CASES.append((f"R={r} wide backoff{ns}", r, "oneshot_ll_wide", {"SOLLAT_POLL_BACKOFF_NS": ns}, True, 128))
    CASES.append((f"R={r} wide full 8KiB", r, "oneshot_ll_wide", {"SOLLAT_DIAG_WIDE": "0"}, True, 8192))
    CASES.append((f"R={r} wide backoff32 8KiB", r, "oneshot_ll_wide", {"SOLLAT_POLL_BACKOFF_NS": "32"}, True, 8192))

best: dict[str, float] = {}
for rep in range(2):
    order = CASES if rep % 2 == 0 else CASES[::-1]
    for label, r, algo, defines, cluster, nbytes in order:
        try:
            t = case(r, algo, defines, cluster=cluster, nbytes=nbytes)
        except Exception as e:  # noqa: BLE001 - a diagnostic: report and go on
            print(f"FAIL {label}: {type(e).__name__}: {str(e)[:300]}", flush=True)
            continue
        best[label] = min(t, best.get(label, t))
        print(f"rep{rep} {label}: {t:.3f}", flush=True)
    for grid, block in (((1, 1), 32), ((1, 2), 32), ((1, 8), 32), ((1, 9), 512), ((1, 64), 512), ((1, 72), 512)):
        for pdl in (False, True):
            t = measure_floor(dev, calls=50, replays=11, pdl=pdl, grid=grid, block=block).stats.median
            key = f"floor grid={grid} block={block} pdl={pdl}"
            best[key] = min(t, best.get(key, t))
print("\nBEST (lower median of the two repetitions), us")
for k, v in best.items():
    print(f"{k}: {v:.3f}")
sys.exit(0)
