"""The one-GPU epilogue of ``all_reduce_rmsnorm``'s ``unfused`` algorithm: kernels/add_rmsnorm.cu
(residual add + RMSNorm, optionally the FP8 copy) on the AllReduce's output. A communicator makes
it one of its launch plans (``_CommBase._rmsnorm_epilogue_plan``) and launches it on torch's current
stream right after the AllReduce (PDL: its launch overlaps the AllReduce's tail)."""

from __future__ import annotations

from typing import Any

import torch

from ..device import abi, build, launch
from ..device.dtypes import DType
from . import rmsnorm

KERNEL_FILE = "add_rmsnorm.cu"
N_PTRS = len(abi.ADD_RMSNORM_PARAMS) - len(abi.ADD_RMSNORM_TAIL_PARAMS)


def launch_parts(dt: DType, rows: int, hidden: int, eps_bits: int) -> tuple[Any, Any, tuple[Any, ...]]:
    """(kernel, LaunchConfig, trailing arguments) of one call shape: ``unfused_geometry``'s grid."""
    geo = rmsnorm.unfused_geometry(dt, rows, hidden)
    kernel = build.get_kernel(KERNEL_FILE, abi.ADD_RMSNORM_ENTRY, defines={"SOLLAT_T": dt.cxx})
    config = launch.launch_config((geo.blocks, 1), geo.threads, pdl=True)
    tail = abi.kernel_tail({"rows": rows, "hidden": hidden, "eps_bits": eps_bits}, abi.ADD_RMSNORM_TAIL_PARAMS)
    return kernel, config, tail


def pointers(x: torch.Tensor, out: torch.Tensor, residual: torch.Tensor, residual_out: torch.Tensor,
             weight: torch.Tensor, fp8: tuple[torch.Tensor, torch.Tensor] | None) -> tuple[int, ...]:
    """The leading arguments (abi.ADD_RMSNORM_PARAMS). ``fp8``: (scale, q) of the FP8 copy, or None
    (two null pointers). ``out`` may be ``x`` and ``residual_out`` may be ``residual``."""
    q, scale = (fp8[1].data_ptr(), fp8[0].data_ptr()) if fp8 is not None else (0, 0)
    return x.data_ptr(), out.data_ptr(), residual.data_ptr(), residual_out.data_ptr(), weight.data_ptr(), q, scale
