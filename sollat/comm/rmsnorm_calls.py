"""The fused AllReduce + residual add + RMSNorm on a communicator (``sollat.rmsnorm`` has the
arithmetic, the geometry and the references): which algorithm a call runs and the plan of one call
(cached; a new call shape is compiled and agreed on by every rank before its first launch, as for
``all_reduce``). Both communicators mix it in; their ``all_reduce_rmsnorm`` methods check the
tensors of their calling convention and launch through ``_CommBase._launch``.
"""

from __future__ import annotations

from typing import Any

import torch

from ..collectives import algorithms, rmsnorm, select
from ..collectives import rmsnorm_epilogue as epilogue
from ..device import abi, driver_launch, layout
from ..device.dtypes import DType
from ..errors import UnsupportedError
from .base import _CommBase, _Plan


class RmsnormCalls(_CommBase):
    """``all_reduce_rmsnorm`` planning shared by ``Communicator`` and ``VirtualCommunicator``."""

    def selected_rmsnorm_algorithm(self, nbytes: int, dtype: torch.dtype, rows: int = 1) -> str:
        """What ``all_reduce_rmsnorm(algo="auto")`` picks for ``nbytes`` of ``x`` in ``rows`` rows
        (a public name: ``oneshot_ll``, ``oneshot_sentinel`` or ``unfused``)."""
        return rmsnorm.public_name(self._rmsnorm_resolve("auto", nbytes, dtype, rows))

    def _rmsnorm_resolve(self, algo: str, nbytes: int, dtype: torch.dtype, rows: int = 1) -> str:
        """Internal algorithm name. ``auto``: rmsnorm.auto_choice under the tuning table's rule
        (rmsnorm_rules: a fused one-shot, by name or as the AllReduce table's choice among
        rmsnorm.AUTO_ALGOS for the call's bytes, or the unfused hand-over; the fused two-shot only
        by name)."""
        if algo == "auto":
            key = ("rmsnorm", nbytes, dtype)
            choice = self._choices.get(key)
            if choice is None:
                choice = select.choose(self._selection_table(), nbytes, dtype, "sum", deterministic=True,
                                       handovers=frozenset(), available=rmsnorm.AUTO_ALGOS)
                self._choices[key] = choice
            return rmsnorm.internal_name(rmsnorm.auto_choice(rows, nbytes, choice, self._selection_table().rmsnorm))
        name = rmsnorm.internal_name(algo)
        if name in algorithms.RMSNORM_EXPERIMENTAL and not self._rmsnorm_twoshot:  # not enabled at construction
            raise UnsupportedError(f"{rmsnorm.OPNAME}: algo={algo!r} is experimental (slower than the one-shot on "
                                   "2 GPUs; a fault may name the wrong peer): construct the communicator with "
                                   f"{algorithms.RMSNORM_TWOSHOT_ENV}=1 in the environment of every rank to enable it")
        return name

    def _rmsnorm_plan(self, name: str, dt: DType, rows: int, hidden: int, eps_bits: int, fp8: bool = False) -> _Plan:
        """``fp8``: the variant that also writes the e4m3 copy (its own module and entry point, two
        more pointer lists in the rank table: abi.POINTER_LISTS["rmsnorm_fp8"])."""
        key = ("rmsnorm", name, dt.short, rows, hidden, eps_bits, fp8, self._test_hooks,
               tuple(sorted(self._defines.items())))
        plan = self._plans.get(key)
        if plan is not None:
            return plan
        alg = algorithms.RMSNORM_ALGORITHMS[name]
        alg.check(dt.torch_dtype, "sum", rmsnorm.OPNAME)
        alg.check_world(self.world_size, rmsnorm.OPNAME)
        rmax = self._rank_cap

        def build_for(max_blocks: int) -> tuple[rmsnorm.RowGeometry, Any]:  # fewer blocks: more rows per block
            geo = rmsnorm.row_geometry(alg, dt, rows, hidden, self.world_size, max_blocks)
            if geo.row_blocks > max_blocks:  # not one cluster of that width fits: narrower ones (same bits)
                geo = rmsnorm.row_geometry(alg, dt, rows, hidden, self.world_size, max_blocks, widest_blocks=max_blocks)
            return geo, self._kernel(alg, alg.kernel_file, dt, "sum", rmax, geo.slots, fp8)

        geo, kernel, config = self._fitting_launch(rmsnorm.OPNAME, build_for, self._region_blocks[name])
        rec0, rank_stride = self._record_args()
        tail = abi.kernel_tail({
            "n": rows * hidden, "st": self._state.data_ptr(), "region_off": self._region_off[name],
            "lines_per_src": layout.lines_per_src(self._region_blocks[name]), "epochs": self._epochs[name].data_ptr(),
            "sig": rmsnorm.signature(name, dt, rows, hidden, eps_bits, fp8), "rank_base": self._rank_arg(),
            "nranks": self.world_size, "rec0": rec0, "rank_stride": rank_stride, "hidden": hidden,
            "eps_bits": eps_bits}, abi.RMSNORM_TAIL_PARAMS)
        n_ptrs = abi.table_size("rmsnorm_fp8" if fp8 else "rmsnorm", self._table_ranks)
        bound = driver_launch.BoundLaunch(kernel, config, tail, n_ptrs)
        plan = _Plan(alg, kernel, config, tail, bound)
        self._plans[key] = plan
        return plan

    def _rmsnorm_epilogue_plan(self, dt: DType, rows: int, hidden: int, eps_bits: int) -> _Plan:
        """The unfused algorithm's epilogue (``alg`` None): one launch for every launch rank; its
        AllReduce plans its own call."""
        kernel, config, tail = epilogue.launch_parts(dt, rows, hidden, eps_bits, self._launch_ranks, self._table_ranks)
        bound = driver_launch.BoundLaunch(kernel, config, tail, epilogue.n_ptrs(self._table_ranks))
        return _Plan(None, kernel, config, tail, bound)

    def _rmsnorm_call_plan(self, rows: int, hidden: int, dt: DType, eps_bits: int, algo: str,
                           fp8: bool = False) -> _Plan:
        """As _call_plan: cached; a new call shape is compiled, then agreed on by every rank."""
        key = ("rmsnorm", rows, hidden, dt.torch_dtype, eps_bits, algo, fp8)
        entry = self._calls.get(key)
        if entry is None:
            name = self._rmsnorm_resolve(algo, rows * hidden * dt.size, dt.torch_dtype, rows)
            if name == rmsnorm.UNFUSED:
                entry = self._rmsnorm_epilogue_plan(dt, rows, hidden, eps_bits)
            else:
                entry = self._rmsnorm_plan(name, dt, rows, hidden, eps_bits, fp8)
            self._agreement.agree(rmsnorm.signature_text(name, dt, rows, hidden, eps_bits, fp8),
                                  "this call (algorithm|dtype|rows|hidden|eps[|fp8])")
            self._calls[key] = entry
        assert not isinstance(entry, str)
        return entry
