"""The virtual-rank mismatch check of tests/gpu/test_faults.py on whichever sollat is on PYTHONPATH
(this tree, or another checkout's package such as 4c1dd9c's): one rank's call signature differs
(testing.inject(mismatch=...)) on a shape every rank used before; every output poisoned with a
finite value first. Prints, per case, whether the check raised and which ranks kept a finite
element; exits 1 if any rank of any case did (a result accepted from a differing call)."""

from __future__ import annotations

import sys

import torch

import sollat
from sollat import testing

dev = torch.device("cuda", 0)
tag = sys.argv[1] if len(sys.argv) > 1 else "tree"
accepted = 0
for r in (3, 4):
    c = sollat.VirtualCommunicator(r, dev, timeout_s=1.0)
    for algo in ("oneshot_sentinel", "twoshot_sentinel", "oneshot_ll", "twoshot_ll"):
        for n in (1000, 70001):
            for odd in sorted({r - 1, r // 2}):
                g = torch.Generator(device=dev).manual_seed(r * 100003 + n * 7 + odd)
                xs = [torch.randn(n, generator=g, device=dev) for _ in range(r)]
                c.all_reduce(xs, algo=algo)
                c.check()
                outs = [torch.full_like(x, 1234.5) for x in xs]
                testing.inject(c, mismatch=odd)
                c.all_reduce(xs, algo=algo, out=outs)
                torch.cuda.synchronize()
                try:
                    c.check()
                    raised = "nothing"
                except sollat.SollatError as exc:
                    raised = type(exc).__name__
                finite = [k for k, o in enumerate(outs) if bool(torch.isfinite(o).any())]
                accepted += bool(finite)
                print(f"MISMATCH {tag} R={r} {algo} n={n} rank {odd} differs: raised {raised}; "
                      f"ranks with a finite element: {finite}", flush=True)
                testing.clear(c)
                c.reset()
print(f"{tag}: {accepted} cases left a finite element on some rank")
sys.exit(1 if accepted else 0)
