"""The one-GPU epilogue of ``all_reduce_rmsnorm``'s ``unfused`` algorithm: kernels/add_rmsnorm.cu
(residual add + RMSNorm, optionally the FP8 copy) on the AllReduce's output, launched on torch's
current stream right after it (PDL: its launch overlaps the AllReduce's tail)."""

from __future__ import annotations

import numpy as np
import torch

from . import abi, build, launch, rmsnorm
from .dtypes import DType

KERNEL_FILE = "add_rmsnorm.cu"


class Epilogue:
    """One call shape's compiled epilogue: ``launch`` it after the AllReduce wrote ``x``."""

    def __init__(self, dt: DType, rows: int, hidden: int, eps_bits: int) -> None:
        geo = rmsnorm.unfused_geometry(dt, rows, hidden)
        self.kernel = build.get_kernel(KERNEL_FILE, abi.ADD_RMSNORM_ENTRY, defines={"SOLLAT_T": dt.cxx})
        self.config = launch.launch_config((geo.blocks, 1), geo.threads, pdl=True)
        self.tail = (np.uint64(rows), np.uint64(hidden), np.uint32(eps_bits))

    def launch(self, x: torch.Tensor, out: torch.Tensor, residual: torch.Tensor, residual_out: torch.Tensor,
               weight: torch.Tensor, fp8: tuple[torch.Tensor, torch.Tensor] | None) -> None:
        """``fp8``: (scale, q) of the FP8 copy, or None. ``out`` may be ``x`` and ``residual_out``
        may be ``residual``."""
        q, scale = (fp8[1].data_ptr(), fp8[0].data_ptr()) if fp8 is not None else (0, 0)
        ptrs = (x.data_ptr(), out.data_ptr(), residual.data_ptr(), residual_out.data_ptr(), weight.data_ptr(), q, scale)
        launch.launch(self.kernel, self.config, tuple(np.uint64(p) for p in ptrs) + self.tail, device=x.device)
