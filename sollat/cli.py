"""``python -m sollat <command>``: the main job and the tools around it.

  bench      latency sweep against peers (the main job; on a machine without a GPU it says so)
  sol        speed-of-light probe        barrier   barrier cost vs rank count
  tune       measure every algorithm here and write the selection table
  model      protocol model checker (CPU; ``model --demo`` is the no-GPU demo)
  precompile compile every kernel instantiation into the disk cache
  info       versions, device, cache
"""

from __future__ import annotations

import argparse
import sys


def _precompile(argv: list[str]) -> int:
    from . import instantiations

    p = argparse.ArgumentParser(prog="sollat precompile")
    p.add_argument("--arch", default=None, help="sm_XY (default: this GPU, or sm_90 without one)")
    p.add_argument("-j", "--jobs", type=int, default=8)
    a = p.parse_args(argv)
    import time

    t = time.time()
    n = instantiations.precompile(a.arch, a.jobs)
    print(f"sollat: compiled {n} kernel modules in {time.time() - t:.1f} s")
    return 0


def _info(argv: list[str]) -> int:
    import torch

    from . import __version__, build

    print(f"sollat {__version__}; torch {torch.__version__}; arch {build.device_arch()}; cache {build.cache_dir()}")
    if torch.cuda.is_available():
        print(f"GPU: {torch.cuda.get_device_name()} x {torch.cuda.device_count()}")
    else:
        print("GPU: none visible")
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__)
        return 0
    cmd, rest = argv[0], argv[1:]
    if cmd in ("bench", "sol", "barrier"):
        from .bench import cli as bench_cli

        return bench_cli.main([cmd, *rest])
    if cmd == "model":
        from .model import cli as model_cli

        return model_cli.main(rest)
    if cmd == "tune":
        from . import tune

        return tune.main(rest)
    if cmd == "precompile":
        return _precompile(rest)
    if cmd == "info":
        return _info(rest)
    print(f"sollat: unknown command {cmd!r}\n{__doc__}", file=sys.stderr)
    return 2
