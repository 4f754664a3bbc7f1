"""Real workloads on top of sollat's AllReduce.

* :mod:`sollat.apps.decode` -- tensor-parallel decode of a Llama-3.1-70B-shaped model
  (``python -m sollat.apps.decode``).
* :mod:`sollat.apps.cg` -- a distributed conjugate-gradient solver for the 3-D Poisson equation
  (``python -m sollat.apps.cg``).
* :mod:`sollat.apps.backends` -- the AllReduce switch both use: NCCL, sollat ``auto``, a forced sollat
  algorithm, or a rank-order reference sum.

Nothing here imports the compiled parts of sollat until a sollat backend is built, so the apps import
and their CPU paths run on machines without a GPU.
"""

from __future__ import annotations

__all__: list[str] = []
