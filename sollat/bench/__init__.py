"""sollat's measurement suite: the SoL probe, the barrier cost, and the latency sweep.

    python -m sollat sol        L2 round trip, remote store and SoL = 2 x L2 + remote store
    python -m sollat barrier    all-to-all flag barrier latency vs rank count
    python -m sollat bench      every sollat algorithm and the peers (NCCL, torch symm_mem)
    python -m sollat plot RESULTS_DIR   re-draw the figures (no GPU needed)

Every command runs with virtual ranks on one GPU, and unchanged under torchrun on N GPUs.
The method is in docs/measurement.md. GPU-side code is imported lazily, so this package and
its writers and plots work without a GPU.
"""

from __future__ import annotations

from .cli import main

__all__ = ["main"]
