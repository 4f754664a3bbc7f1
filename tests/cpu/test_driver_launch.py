"""The prepacked driver launcher: what it hands cuLaunchKernelEx, read back from its own memory."""

from __future__ import annotations

import ctypes
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest

from sollat.device.driver_launch import BoundLaunch
from sollat.errors import SollatError


@dataclass
class _Param:
    offset: int
    size: int


class _FakeKernel:
    def __init__(self, sizes: list[int], handle: int = 0xABC0) -> None:
        self.arguments_info = [_Param(8 * i, s) for i, s in enumerate(sizes)]
        self.handle = handle


@dataclass
class _Config:
    grid: Any
    block: Any
    cluster: Any = None
    programmatic_stream_serialization: bool = False
    shmem_size: int = 0


class _Recorder:
    """Stands in for cuLaunchKernelEx and decodes what it was given."""

    def __init__(self, sizes: list[int], rc: int = 0) -> None:
        self.sizes, self.rc, self.calls = sizes, rc, []

    def __call__(self, cfg_ref: Any, func: ctypes.c_void_p, params: Any, extra: Any) -> int:
        cfg = cfg_ref._obj
        attrs = {cfg.attrs[i].id: cfg.attrs[i].value for i in range(cfg.num_attrs)}
        args = []
        for i, size in enumerate(self.sizes):
            ctype = ctypes.c_uint64 if size == 8 else ctypes.c_uint32
            args.append(ctype.from_address(params[i]).value)
        self.calls.append({
            "grid": tuple(cfg.grid), "block": tuple(cfg.block), "stream": cfg.stream or 0, "func": func.value,
            "cluster": tuple(attrs[4].dims) if 4 in attrs else None,
            "pdl": attrs[6].flag if 6 in attrs else None, "args": args, "extra": extra,
        })
        return self.rc


SIZES = [8] * 16 + [8, 8, 8, 4, 8, 4, 4, 4]  # the allreduce kernels' "vr" signature
TAIL = (np.uint64(96), 0x7000_0000_1000, np.uint64(4096), np.int32(64), 0x7000_0000_2000,
        np.uint32(0xDEADBEEF), np.int32(-1), np.int32(8))


def test_packs_pointers_tail_and_config() -> None:
    rec = _Recorder(SIZES)
    cfg = _Config(grid=(3, 8), block=256, programmatic_stream_serialization=True)
    bound = BoundLaunch(_FakeKernel(SIZES), cfg, TAIL, 16, launch_fn=rec)
    ptrs = [0x7F00_0000_0000 + 256 * i for i in range(16)]
    bound(0x55AA, ptrs)
    ptrs2 = [p + 7 for p in ptrs]
    bound(0, ptrs2)  # the default stream, other pointers: the slots are rewritten
    first, second = rec.calls
    assert first["grid"] == (3, 8, 1) and first["block"] == (256, 1, 1)
    assert first["stream"] == 0x55AA and second["stream"] == 0
    assert first["func"] == 0xABC0 and first["extra"] is None
    assert first["cluster"] is None and first["pdl"] == 1
    tail_words = [96, 0x7000_0000_1000, 4096, 64, 0x7000_0000_2000, 0xDEADBEEF, 0xFFFFFFFF, 8]
    assert first["args"] == ptrs + tail_words
    assert second["args"] == ptrs2 + tail_words


def test_cluster_grid_counts_blocks() -> None:
    sizes = [8, 8, 4]
    rec = _Recorder(sizes)
    # cuda.core counts clusters in `grid`; the driver wants blocks (grid * cluster).
    BoundLaunch(_FakeKernel(sizes), _Config(grid=(2, 1), block=128, cluster=(1, 4)), (np.int32(5),), 2,
                launch_fn=rec)(1, [10, 20])
    call = rec.calls[0]
    assert call["grid"] == (2, 4, 1) and call["cluster"] == (1, 4, 1) and call["pdl"] is None
    assert call["args"] == [10, 20, 5]


def test_parameter_count_mismatch_is_refused() -> None:
    with pytest.raises(SollatError, match="takes 3 parameters but the call packs 4"):
        BoundLaunch(_FakeKernel([8, 8, 8]), _Config(grid=1, block=32), (1, 2), 2, launch_fn=_Recorder([]))


def test_unsupported_parameter_size_is_refused() -> None:
    with pytest.raises(SollatError, match="4- and 8-byte"):
        BoundLaunch(_FakeKernel([8, 2]), _Config(grid=1, block=32), (1,), 1, launch_fn=_Recorder([]))


def test_launch_failure_raises_with_the_driver_code() -> None:
    sizes = [8]
    bound = BoundLaunch(_FakeKernel(sizes), _Config(grid=1, block=32), (), 1, launch_fn=_Recorder(sizes, rc=700))
    with pytest.raises(SollatError, match=r"cuLaunchKernelEx failed .*\(700\)"):
        bound(0, [1])


def test_rank_table_is_one_parameter() -> None:
    """A collective's entry point takes its pointers as one rank-table parameter (8 bytes per
    pointer): the driver gets one pointer to the table's first word, then one per tail parameter."""
    n_ptrs = 2 * 4  # in, out x 4 launch ranks
    sizes = [8 * n_ptrs, 8, 4]
    seen: list[list[int]] = []

    def fn(cfg_ref: Any, func: Any, params: Any, extra: Any) -> int:
        table = [ctypes.c_uint64.from_address(params[0] + 8 * i).value for i in range(n_ptrs)]
        seen.append(table + [ctypes.c_uint64.from_address(params[1]).value,
                             ctypes.c_uint32.from_address(params[2]).value])
        return 0

    bound = BoundLaunch(_FakeKernel(sizes), _Config(grid=(1, 4), block=128), (np.uint64(77), np.int32(-2)), n_ptrs,
                        launch_fn=fn)
    ptrs = list(range(100, 100 + n_ptrs))
    bound(0, ptrs)
    assert seen == [ptrs + [77, 0xFFFFFFFE]]
    # a table of another size than the call's pointers is no table: the counts then disagree
    with pytest.raises(SollatError, match="takes 3 parameters but the call packs 7"):
        BoundLaunch(_FakeKernel([8 * 4, 8, 4]), _Config(grid=1, block=32), (1, 2), 5, launch_fn=fn)


def test_rmsnorm_epilogue_packs_its_rank_table_and_tail() -> None:
    """The unfused RMSNorm's epilogue: one rank-table parameter of abi.ADD_RMSNORM_LISTS (in, out,
    residual, residual_out, weight, FP8 copy, scale; list l of launch rank y at l * table_ranks + y,
    zeros past the last launch rank and in the FP8 lists without the copy), then rows, hidden and
    eps's bits, as the kernel declares them; one launch serves every launch rank (grid.y)."""
    import torch

    from sollat.collectives import rmsnorm_epilogue
    from sollat.device import abi

    table_ranks, ranks = 4, 3
    n_ptrs = rmsnorm_epilogue.n_ptrs(table_ranks)
    assert n_ptrs == 7 * table_ranks and rmsnorm_epilogue.n_ptrs(1) == 7
    tail = abi.kernel_tail({"rows": 3, "hidden": 4096, "eps_bits": 0x358637BD}, abi.ADD_RMSNORM_TAIL_PARAMS)
    sizes = [8 * n_ptrs] + [struct_size(p.ctype) for p in abi.ADD_RMSNORM_TAIL_PARAMS]
    assert sizes[1:] == [8, 8, 4]
    seen: list[list[int]] = []

    def fn(cfg_ref: Any, func: Any, params: Any, extra: Any) -> int:
        assert tuple(cfg_ref._obj.grid) == (3, ranks, 1)
        table = [ctypes.c_uint64.from_address(params[0] + 8 * i).value for i in range(n_ptrs)]
        seen.append(table + [ctypes.c_uint64.from_address(params[1]).value,
                             ctypes.c_uint64.from_address(params[2]).value,
                             ctypes.c_uint32.from_address(params[3]).value])
        return 0

    bound = BoundLaunch(_FakeKernel(sizes), _Config(grid=(3, ranks), block=128,
                                                    programmatic_stream_serialization=True),
                        tail, n_ptrs, launch_fn=fn)
    x = [torch.zeros(3, 4096) for _ in range(ranks)]
    res, r_out = [torch.zeros(3, 4096) for _ in range(ranks)], [torch.zeros(3, 4096) for _ in range(ranks)]
    w = [torch.zeros(4096)] * ranks
    fp8 = [(torch.ones(1), torch.zeros(3, 4096, dtype=torch.uint8)) for _ in range(ranks)]
    bound(0, rmsnorm_epilogue.pointer_table(table_ranks, x, x, res, r_out, w, None))
    bound(0, rmsnorm_epilogue.pointer_table(table_ranks, x, x, res, r_out, w, fp8))
    plain, with_fp8 = seen

    def lists(*seqs: list[int]) -> list[int]:
        return [v for seq in seqs for v in [*seq, *[0] * (table_ranks - ranks)]]

    ptr = [[t.data_ptr() for t in seq] for seq in (x, x, res, r_out, w)]
    zeros = [0] * ranks
    assert plain == lists(*ptr, zeros, zeros) + [3, 4096, 0x358637BD]
    assert with_fp8 == lists(*ptr, [q.data_ptr() for _, q in fp8], [s.data_ptr() for s, _ in fp8]) + [3, 4096,
                                                                                                        0x358637BD]
    with pytest.raises(ValueError, match="one tensor per launch rank"):
        rmsnorm_epilogue.pointer_table(table_ranks, x, x, res, r_out, w[:2], None)
    with pytest.raises(ValueError, match="one tensor per launch rank"):
        rmsnorm_epilogue.pointer_table(2, x, x, res, r_out, w, None)


def struct_size(ctype: str) -> int:
    from sollat.device import abi

    return np.dtype(abi.ctype(ctype).np_type).itemsize
