"""The launch plan of one call shape: which kernel, on what grid, with which arguments
(prepacked for one driver call). ``Kernels`` builds and caches them for one communicator: the
geometry (``layout.plan``, ``rmsnorm.row_geometry``) fitted to the GPU (``fitting.py``), the
compiled instantiation (``build.py``, with this communicator's extra defines and test hooks) and
the kernel's tail arguments (its regions in ``state.DeviceMemory``, its fault records in
``ranks.py``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..collectives import algorithms, rmsnorm
from ..collectives import rmsnorm_epilogue as epilogue
from ..collectives.algorithms import ALGORITHMS, Algorithm
from ..device import abi, build, driver_launch, layout
from ..device.dtypes import DType
from .fitting import Fitting
from .ranks import Ranks
from .state import DeviceMemory


@dataclass
class _Plan:
    """Everything one call needs that depends only on (algorithm, dtype, op, n): cached."""

    alg: Algorithm | None  # None: the unfused RMSNorm's epilogue (rmsnorm_epilogue.py: no scratch, no peers)
    kernel: Any
    config: Any            # cuda.core LaunchConfig (grid, block, PDL, rank cluster)
    tail: tuple[Any, ...]  # arguments after the tensor pointers
    bound: driver_launch.BoundLaunch  # the launch prepacked for one driver call
    # The unfused RMSNorm's epilogue only: its public call's arguments (rmsnorm.signature_text),
    # folded into the signature of the AllReduce that runs before it (algorithms.signature).
    call: str = ""


class Kernels:
    """Plans (cached) for one communicator of ``world_size`` ranks whose launches serve ``ranks``,
    in ``memory``, fitted by ``fitting``; ``customs``: the user-written collectives' algorithms by
    name. ``test_hooks`` (kernels that read the test hooks), ``defines`` (extra NVRTC defines) and
    ``kernel_files`` (algorithm -> diagnostic kernel file) are part of every plan's key."""

    def __init__(self, world_size: int, ranks: Ranks, memory: DeviceMemory, fitting: Fitting,
                 customs: dict[str, Any]) -> None:
        self.world_size = world_size
        self.ranks = ranks
        self.memory = memory
        self.fitting = fitting
        self.customs = customs
        self.test_hooks = False
        self.defines: dict[str, str] = {}
        self.kernel_files: dict[str, str] = {}
        self._plans: dict[tuple[Any, ...], _Plan] = {}

    def plan(self, name: str, dt: DType, op: str, n: int, call: str = "") -> _Plan:
        """An AllReduce, AllGather/ReduceScatter or user-written collective of ``n`` elements.
        ``call``: the public call's further arguments, folded into the signature
        (``algorithms.signature``; the unfused RMSNorm's AllReduce)."""
        key = (name, dt.short, op, n, call, self.test_hooks, tuple(sorted(self.defines.items())),
               self.kernel_files.get(name))
        plan = self._plans.get(key)
        if plan is not None:
            return plan
        alg = ALGORITHMS.get(name) or algorithms.GATHER_SCATTER_ALGORITHMS.get(name) or self.customs[name]
        region = alg.region or name  # its scratch region and epochs (shared by some built-ins)
        what = getattr(alg, "opname", "all_reduce")
        alg.check(dt.torch_dtype, op)
        alg.check_world(self.world_size, what)
        rmax = algorithms.rank_cap(alg, self.world_size)
        lines = alg.lines_per_rank(n, dt, self.world_size)
        kernel_file = self.kernel_files.get(name, alg.kernel_file)

        def build_for(max_blocks: int) -> tuple[layout.Geometry, Any]:
            if alg.peer_groups:
                geo = layout.plan_peer_groups(lines, self.world_size, max_blocks=max_blocks)
            else:
                geo = layout.plan(lines, max_blocks=max_blocks, max_slots=alg.max_slots(rmax), max_threads=alg.max_threads)
            return geo, self.kernel(alg, kernel_file, dt, op, geo.slots)

        mem = self.memory
        geo, kernel, config = self.fitting.fit(what, build_for, mem.region_blocks[region])
        rec0, rank_stride = self.ranks.record_args(mem.scratch_ptrs)
        tail = abi.kernel_tail({
            "n": n, "st": mem.state.data_ptr(), "region_off": mem.region_off[region],
            "lines_per_src": layout.lines_per_src(mem.region_blocks[region]), "epochs": mem.epochs[region].data_ptr(),
            "sig": algorithms.signature(alg, dt, op, n, call), "rank_base": self.ranks.rank_base,
            "nranks": self.world_size, "rec0": rec0, "rank_stride": rank_stride})
        n_ptrs = abi.table_size("collective", self.ranks.table_ranks)
        plan = _Plan(alg, kernel, config, tail, driver_launch.BoundLaunch(kernel, config, tail, n_ptrs))
        self._plans[key] = plan
        return plan

    def rmsnorm_plan(self, name: str, dt: DType, rows: int, hidden: int, eps_bits: int, fp8: bool = False) -> _Plan:
        """A fused AllReduce + RMSNorm of ``rows`` x ``hidden``. ``fp8``: the variant that also
        writes the e4m3 copy (its own module and entry point, two more pointer lists in the rank
        table: abi.POINTER_LISTS["rmsnorm_fp8"])."""
        key = ("rmsnorm", name, dt.short, rows, hidden, eps_bits, fp8, self.test_hooks,
               tuple(sorted(self.defines.items())))
        plan = self._plans.get(key)
        if plan is not None:
            return plan
        alg = algorithms.RMSNORM_ALGORITHMS[name]
        alg.check(dt.torch_dtype, "sum", rmsnorm.OPNAME)
        alg.check_world(self.world_size, rmsnorm.OPNAME)

        def build_for(max_blocks: int) -> tuple[rmsnorm.RowGeometry, Any]:  # fewer blocks: more rows per block
            geo = rmsnorm.row_geometry(alg, dt, rows, hidden, self.world_size, max_blocks)
            if geo.row_blocks > max_blocks:  # not one cluster of that width fits: narrower ones (same bits)
                geo = rmsnorm.row_geometry(alg, dt, rows, hidden, self.world_size, max_blocks, widest_blocks=max_blocks)
            return geo, self.kernel(alg, alg.kernel_file, dt, "sum", geo.slots, fp8)

        mem = self.memory
        region = alg.region or name  # its scratch region and epochs (the block kernel runs on oneshot_ll's)
        geo, kernel, config = self.fitting.fit(rmsnorm.OPNAME, build_for, mem.region_blocks[region])
        rec0, rank_stride = self.ranks.record_args(mem.scratch_ptrs)
        tail = abi.kernel_tail({
            "n": rows * hidden, "st": mem.state.data_ptr(), "region_off": mem.region_off[region],
            "lines_per_src": layout.lines_per_src(mem.region_blocks[region]), "epochs": mem.epochs[region].data_ptr(),
            "sig": rmsnorm.signature(name, dt, rows, hidden, eps_bits, fp8), "rank_base": self.ranks.rank_base,
            "nranks": self.world_size, "rec0": rec0, "rank_stride": rank_stride, "hidden": hidden,
            "eps_bits": eps_bits}, abi.RMSNORM_TAIL_PARAMS)
        n_ptrs = abi.table_size("rmsnorm_fp8" if fp8 else "rmsnorm", self.ranks.table_ranks)
        plan = _Plan(alg, kernel, config, tail, driver_launch.BoundLaunch(kernel, config, tail, n_ptrs))
        self._plans[key] = plan
        return plan

    def rmsnorm_epilogue_plan(self, dt: DType, rows: int, hidden: int, eps_bits: int, fp8: bool = False) -> _Plan:
        """The unfused algorithm's epilogue (``alg`` None): one launch for every launch rank; its
        AllReduce plans its own call, with ``call`` (this call's arguments) in its signature."""
        ranks = self.ranks
        kernel, config, tail = epilogue.launch_parts(dt, rows, hidden, eps_bits, ranks.launch_ranks, ranks.table_ranks)
        bound = driver_launch.BoundLaunch(kernel, config, tail, epilogue.n_ptrs(ranks.table_ranks))
        return _Plan(None, kernel, config, tail, bound,
                     call=rmsnorm.signature_text(rmsnorm.UNFUSED, dt, rows, hidden, eps_bits, fp8))

    def kernel(self, alg: Any, kernel_file: str, dt: DType, op: str, slots: int, fp8: bool = False) -> Any:
        """The compiled entry point of one instantiation (the extra defines included); a
        user-written collective (sollat.custom) is built from its own source. ``fp8``: the fused
        RMSNorm's FP8 variant."""
        cap = algorithms.rank_cap(alg, self.world_size)  # the kernel's rank template
        defines = algorithms.kernel_defines(alg, dt, op, cap, slots, self.test_hooks, real_ranks=self.ranks.real, fp8=fp8)
        defines.update(self.defines)
        entry = abi.rmsnorm_entry(alg.kernel, fp8)  # rmsnorm_entry(k, False) is k
        source = getattr(alg, "source", "")
        if source:
            return build.get_source_kernel(source, alg.kernel, entry, defines=defines)
        return build.get_kernel(kernel_file, entry, defines=defines)
