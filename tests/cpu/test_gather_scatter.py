"""Built-in AllGather / ReduceScatter on the CPU: the kernels compile for sm_90, the shape rules,
the ``algo="auto"`` size rule, the scratch regions (one per protocol, shared), the rank-order
references, argument checks and the pointer arguments a virtual call launches with."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from sollat.collectives import algorithms, gather_scatter
from sollat.collectives.gather_scatter import (
    LIBRARY_ABOVE_BYTES,
    LL_MAX_BYTES,
    all_gather_reference,
    rank_order_reduce,
    reduce_scatter_reference,
    resolve,
)
from sollat.comm.ranks import RealRanks, VirtualRanks
from sollat.comm.state import scratch_bytes_per_rank
from sollat.comm.virtual import VirtualCommunicator
from sollat.device import build, layout
from sollat.device.dtypes import DTYPES
from sollat.errors import UnsupportedError

GS = algorithms.GATHER_SCATTER_ALGORITHMS


# ---- the kernels compile (the slow test_compile test compiles every instantiation) ------------------
@pytest.mark.parametrize("name,dtype,op", [
    ("all_gather_ll", torch.float32, ""), ("all_gather_sentinel", torch.bfloat16, ""),
    ("reduce_scatter_ll", torch.bfloat16, "max"), ("reduce_scatter_sentinel", torch.float64, "sum"),
    ("reduce_scatter_sentinel", torch.float16, "min")])
def test_kernels_compile_for_sm90(tmp_path, monkeypatch, name: str, dtype: torch.dtype, op: str) -> None:
    pytest.importorskip("cuda.core")
    monkeypatch.setenv("SOLLAT_CACHE_DIR", str(tmp_path))
    alg = GS[name]
    rmax, slots = alg.slot_choices[-1]  # 8 ranks
    for real in (True, False):
        d = algorithms.kernel_defines(alg, DTYPES[dtype], op, rmax, slots, test_hooks=True, real_ranks=real)
        assert ("SOLLAT_OP" in d) == (op != "")
        cubin = build.compile_cubin(build.kernel_source(alg.kernel_file), name=alg.kernel, arch="sm_90", defines=d)
        assert len(cubin) > 1000


def test_the_algorithms() -> None:
    assert set(GS) == {"all_gather_ll", "all_gather_sentinel", "reduce_scatter_ll", "reduce_scatter_sentinel"}
    for a in GS.values():
        assert a.deterministic and a.buffers == 1 and a.region == f"gather_scatter_{a.proto}"
        assert a.opname == ("all_gather" if a.kernel == "allgather" else "reduce_scatter")
        assert a.two_shot == (a.kernel == "reduce_scatter")  # the geometry covers one chunk
    assert GS["all_gather_ll"].ops == frozenset({""}) and GS["reduce_scatter_ll"].ops == frozenset({"sum", "max", "min"})
    # the geometry's lines: all_gather the whole input, reduce_scatter one chunk
    dt = DTYPES[torch.float32]
    assert GS["all_gather_ll"].lines_per_rank(1000, dt, 4) == 500
    assert GS["reduce_scatter_ll"].lines_per_rank(1000, dt, 4) == 125
    assert GS["reduce_scatter_sentinel"].lines_per_rank(1000, dt, 4) == 63


# ---- regions: one per protocol, shared by both collectives, small ---------------------------------
def test_regions_are_shared_per_protocol_and_sized_for_few_blocks() -> None:
    regs = algorithms.regions(("oneshot_ll",), 128, (), gather_scatter=True)
    names = [r.name for r in regs]
    assert names.count("gather_scatter_ll") == 1 and names.count("gather_scatter_sentinel") == 1
    assert names.index("gather_scatter_ll") > names.index("rmsnorm_oneshot_sentinel")
    for r in regs:
        if r.name.startswith("gather_scatter"):
            assert r.blocks == algorithms.GATHER_SCATTER_BLOCKS == 16 and r.alg.proto == r.name.rsplit("_", 1)[1]
    small = {r.name: r.blocks for r in algorithms.regions(("oneshot_ll",), 4, (), gather_scatter=True)}
    assert small["gather_scatter_ll"] == 4  # never more blocks than the communicator's
    assert "gather_scatter_ll" not in [r.name for r in algorithms.regions(("oneshot_ll",), 16)]
    for ws, blocks in ((2, 128), (4, 64), (8, 32), (8, 16)):
        extra = (scratch_bytes_per_rank(ws, ["oneshot_ll"], blocks, (), True)
                 - scratch_bytes_per_rank(ws, ["oneshot_ll"], blocks))
        # 2 x nranks MiB (the sentinel region's signature words live in its signature slot)
        assert extra == gather_scatter.region_cost(ws, blocks) == 2 * layout.region_bytes(ws, 16) == ws * 2**21


# ---- the size rule ------------------------------------------------------------------------------
def test_auto_rule() -> None:
    for kind in gather_scatter.KINDS:
        assert resolve(kind, "auto", LL_MAX_BYTES, library=False, enabled=True) == f"{kind}_ll"
        assert resolve(kind, "auto", LL_MAX_BYTES + 1, library=False, enabled=True) == f"{kind}_sentinel"
        assert resolve(kind, "auto", 1 << 30, library=False, enabled=True) == f"{kind}_sentinel"
        assert resolve(kind, "auto", LIBRARY_ABOVE_BYTES + 1, library=True, enabled=True) == "nccl"
        steps = gather_scatter.REAL_RANK_STEPS[kind]
        for (lo, _), (hi, proto) in zip(((0, ""), *steps), steps, strict=False):  # each step's range
            for n in (lo + 1, hi):
                assert resolve(kind, "auto", n, library=True, enabled=True) == f"{kind}_{proto}", (kind, n)
        assert resolve(kind, "auto", steps[-1][0] + 1, library=True, enabled=True) == "nccl"
    # the measured steps (gather_scatter.REAL_RANK_STEPS)
    assert resolve("all_gather", "auto", 512 << 10, library=True, enabled=True) == "all_gather_ll"
    assert resolve("all_gather", "auto", 1 << 20, library=True, enabled=True) == "all_gather_ll"
    assert resolve("reduce_scatter", "auto", 512 << 10, library=True, enabled=True) == "reduce_scatter_sentinel"
    assert resolve("reduce_scatter", "auto", (512 << 10) + 1, library=True, enabled=True) == "nccl"
    for kind in gather_scatter.KINDS:
        assert resolve(kind, "auto", 16, library=True, enabled=False) == "nccl"
        assert resolve(kind, "ll", 1 << 30, library=True, enabled=True) == f"{kind}_ll"  # named: never handed over
        assert resolve(kind, "nccl", 16, library=True, enabled=True) == "nccl"
        with pytest.raises(UnsupportedError, match="needs a process group"):
            resolve(kind, "nccl", 16, library=False, enabled=True)
        with pytest.raises(UnsupportedError, match="gather_scatter=False"):
            resolve(kind, "sentinel", 16, library=False, enabled=False)
        with pytest.raises(UnsupportedError, match="algo must be one of auto, ll, sentinel, nccl"):
            resolve(kind, "oneshot_ll", 16, library=True, enabled=True)
    assert gather_scatter.bytes_per_peer("all_gather", 1000, 2, 4) == 2000
    assert gather_scatter.bytes_per_peer("reduce_scatter", 1000, 2, 4) == 500


# ---- shapes --------------------------------------------------------------------------------------
def test_shape_rules() -> None:
    assert gather_scatter.gather_shape((5, 3), 4) == (4, 5, 3)
    assert gather_scatter.gather_shape((), 2) == (2,)
    assert gather_scatter.gather_out_ok((4, 5, 3), (5, 3), 4) and gather_scatter.gather_out_ok((20, 3), (5, 3), 4)
    assert not gather_scatter.gather_out_ok((4, 15), (5, 3), 4) and not gather_scatter.gather_out_ok((60,), (5, 3), 4)
    assert gather_scatter.scatter_shape((8, 3), 4) == (2, 3) and gather_scatter.scatter_shape((12,), 3) == (4,)
    assert gather_scatter.scatter_shape((0, 2), 2) == (0, 2)
    with pytest.raises(UnsupportedError, match=r"dim 0 \(10\) must be a multiple of world_size \(4\)"):
        gather_scatter.scatter_shape((10,), 4)
    with pytest.raises(UnsupportedError, match="0-dim"):
        gather_scatter.scatter_shape((), 2)


# ---- references -----------------------------------------------------------------------------------
def test_reduce_scatter_reference_is_rank_order_with_fp32_accumulation() -> None:
    one, tiny = torch.tensor([1.0]), torch.tensor([2.0**-8])
    xs = [one.bfloat16(), tiny.bfloat16(), tiny.bfloat16()]
    assert rank_order_reduce(xs, "sum").item() == 1.0 + 2.0**-7  # bf16 accumulation would give 1.0
    big = [torch.tensor([1e8]), torch.tensor([1.0]), torch.tensor([-1e8])]
    assert rank_order_reduce(big, "sum").item() == 0.0  # (1e8 + 1) rounds to 1e8 first: rank order
    assert rank_order_reduce([big[0], big[2], big[1]], "sum").item() == 1.0
    nan, z, nz = torch.tensor([float("nan")]), torch.tensor([0.0]), torch.tensor([-0.0])
    assert torch.isnan(rank_order_reduce([nan, one], "max")) and torch.isnan(rank_order_reduce([one, nan], "min"))
    # types.h OpMax: a > b ? a : b, so of two zeros the later rank's wins
    assert not torch.signbit(rank_order_reduce([nz, z], "max")) and torch.signbit(rank_order_reduce([z, nz], "max"))
    assert torch.signbit(rank_order_reduce([nz, nz], "sum")) and torch.signbit(rank_order_reduce([z, nz], "min"))
    assert rank_order_reduce([torch.tensor([float("inf")]), torch.tensor([-float("inf")])], "sum").isnan()
    assert rank_order_reduce([torch.tensor([1.0], dtype=torch.float64), torch.tensor([1e-17], dtype=torch.float64)],
                             "sum").item() == 1.0


def test_reduce_scatter_reference_cuts_dim_0_into_chunks() -> None:
    r = 4
    xs = [torch.arange(24, dtype=torch.float32).reshape(8, 3) * (k + 1) for k in range(r)]
    outs = reduce_scatter_reference(xs, "sum")
    assert len(outs) == r and all(o.shape == (2, 3) for o in outs)
    for j in range(r):
        assert torch.equal(outs[j], torch.arange(24, dtype=torch.float32).reshape(8, 3)[2 * j:2 * j + 2] * 10)
    assert torch.equal(reduce_scatter_reference(xs, "max")[3], xs[3][6:8])
    with pytest.raises(UnsupportedError, match="multiple of world_size"):
        reduce_scatter_reference([torch.ones(6)] * 4)


def test_all_gather_reference() -> None:
    xs = [torch.full((2, 3), float(k)) for k in range(3)]
    y = all_gather_reference(xs)
    assert y.shape == (3, 2, 3) and all(torch.equal(y[k], xs[k]) for k in range(3))


# ---- argument checks and the launch arguments (a VirtualCommunicator without a GPU) --------------
def _virtual(ws: int, launched: list[Any]) -> VirtualCommunicator:
    c = object.__new__(VirtualCommunicator)
    c.world_size, c.device, c._gather_scatter, c._batch_invariant = ws, torch.device("cpu"), True, False
    c._ranks = VirtualRanks(ws, torch.empty(0, dtype=torch.uint8))
    c._ranks.pad = (0,) * (8 - ws)  # a rank table of 8 slots
    c._before_call = lambda: None  # type: ignore[method-assign]
    c._after_call = lambda: None  # type: ignore[method-assign]
    c._gs_plan = lambda kind, n, dt, op, algo: (kind, n, dt.short, op, algo)  # type: ignore[method-assign]
    c._launch = lambda plan, ptrs: launched.append((plan, ptrs))  # type: ignore[method-assign]
    return c


def test_virtual_calls_launch_with_every_rank_s_pointers() -> None:
    launched: list[Any] = []
    c = _virtual(2, launched)
    xs = [torch.ones(6, 5), torch.zeros(6, 5)]
    ys = c.reduce_scatter(xs, op="max", algo="sentinel")
    assert [y.shape for y in ys] == [(3, 5), (3, 5)]
    plan, ptrs = launched[-1]
    assert plan == ("reduce_scatter", 30, "f32", "max", "sentinel")
    assert ptrs == (xs[0].data_ptr(), xs[1].data_ptr(), *(0,) * 6, ys[0].data_ptr(), ys[1].data_ptr(), *(0,) * 6)
    outs = [torch.empty(12, 5) for _ in range(2)]  # the concatenated shape
    assert c.all_gather(xs, out=outs) == outs
    assert launched[-1][0] == ("all_gather", 30, "f32", "", "auto")
    nc = [torch.ones(5, 6).t(), torch.ones(5, 6).t()]  # non-contiguous inputs are copied
    c.all_gather(nc)
    assert launched[-1][1][0] not in (nc[0].data_ptr(), nc[1].data_ptr())
    n_before = len(launched)
    assert [y.shape for y in c.all_gather([torch.ones(0), torch.ones(0)])] == [(2, 0), (2, 0)]
    assert len(launched) == n_before  # nothing to do: no launch


@pytest.mark.parametrize("call,kwargs,exc,match", [
    ("reduce_scatter", {"xs": [torch.ones(5)] * 2}, UnsupportedError, r"dim 0 \(5\) must be a multiple"),
    ("reduce_scatter", {"op": "prod"}, UnsupportedError, "op 'prod' is not supported; supported ops: sum, max, min"),
    ("all_gather", {"algo": "oneshot_ll"}, UnsupportedError, "algo must be one of"),
    ("all_gather", {"algo": "nccl"}, UnsupportedError, "needs a process group"),
    ("all_gather", {"xs": [torch.ones(4, dtype=torch.int32)] * 2}, UnsupportedError, "dtype torch.int32; supported"),
    ("all_gather", {"xs": [torch.ones(4)]}, UnsupportedError, "needs tensor as a list of 2"),
    ("all_gather", {"xs": torch.ones(2, 4)}, UnsupportedError, "got a single tensor"),
    ("all_gather", {"xs": [torch.ones(4), torch.ones(5)]}, UnsupportedError, "every rank must pass the same"),
    ("all_gather", {"xs": [torch.ones(4), torch.ones(4).double()]}, UnsupportedError, "every rank must pass the same"),
    ("all_gather", {"xs": [torch.ones(4), "x"]}, TypeError, "must be a torch.Tensor"),
    ("all_gather", {"xs": [torch.ones(4, device="meta")] * 2}, UnsupportedError, "is on meta; this communicator is on cpu"),
    ("all_gather", {"out": [torch.empty(7)] * 2}, UnsupportedError, r"out\[0\] must be a contiguous torch.float32 tensor of shape \(2, 4\)"),
    ("all_gather", {"out": [torch.empty(2, 4).double()] * 2}, UnsupportedError, "must be a contiguous torch.float32"),
    ("all_gather", {"out": [torch.empty(4, 2).t()] * 2}, UnsupportedError, r"\(not contiguous\)"),
    ("all_gather", {"out": [torch.empty(2, 4)]}, UnsupportedError, "needs out as a list of 2"),
    ("reduce_scatter", {"out": [torch.empty(4)] * 2}, UnsupportedError, r"of shape \(2,\)"),
])
def test_argument_errors(call: str, kwargs: dict, exc: type, match: str) -> None:
    c = _virtual(2, [])
    xs = kwargs.pop("xs", [torch.ones(4), torch.ones(4)])
    with pytest.raises(exc, match=match):
        getattr(c, call)(xs, **kwargs)


def test_outputs_may_not_overlap_inputs_or_each_other() -> None:
    c = _virtual(2, [])
    xs = [torch.ones(4), torch.ones(4)]
    shared = torch.empty(2, 4)
    with pytest.raises(UnsupportedError, match="overlaps"):
        c.all_gather(xs, out=[shared, shared])
    buf = torch.empty(12)
    with pytest.raises(UnsupportedError, match="overlaps"):
        c.reduce_scatter([buf[:4], buf[4:8]], out=[buf[8:10], buf[2:4]])


def test_gather_scatter_false_refuses_sollat_paths_with_a_clear_error() -> None:
    c = _virtual(2, [])
    c._gather_scatter = False
    del c._gs_plan  # the real plan: resolve refuses before anything is compiled
    c._calls, c._agreement = {}, None
    with pytest.raises(UnsupportedError, match="gather_scatter=False"):
        c.all_gather([torch.ones(4)] * 2)


def test_constructor_flag_is_checked_before_looking_for_a_gpu() -> None:
    with pytest.raises(UnsupportedError, match="gather_scatter must be True or False"):
        VirtualCommunicator(2, gather_scatter="yes")  # type: ignore[arg-type]


# ---- torch.compile: the custom ops keep the calls in one graph -----------------------------------
def test_compiled_calls_keep_one_graph_and_match_eager() -> None:
    """fullgraph=True (a graph break is an error): both communicators' all_gather and
    reduce_scatter go through the sollat::gather_scatter ops, whose eager body here is the CPU
    reference (a stand-in for the kernel); results and out= writes equal the eager ones."""
    from sollat.collectives import registry
    from sollat.comm.real import Communicator

    calls: list[str] = []
    virt = _virtual(2, [])
    peers = [torch.full((4, 3), 10.0), torch.full((4, 3), 20.0)]  # the other ranks' inputs, for the stand-in

    def virtual_body(kind: str, xs: list[torch.Tensor], out: Any, op: str, algo: str) -> list[torch.Tensor]:
        calls.append(f"virtual {kind}")
        ys = [all_gather_reference(xs) for _ in xs] if kind == "all_gather" else reduce_scatter_reference(xs, op)
        if out is None:
            return [y.clone() for y in ys]
        return [o.copy_(y.reshape(o.shape)) for o, y in zip(out, ys, strict=True)]

    real = object.__new__(Communicator)
    real.world_size, real.device, real._gather_scatter, real._batch_invariant = 2, torch.device("cpu"), True, False
    real._ranks = RealRanks(0, torch.empty(0, dtype=torch.uint8))

    def real_body(kind: str, xs: list[torch.Tensor], out: Any, op: str, algo: str) -> list[torch.Tensor]:
        calls.append(f"real {kind}")
        ranks = [xs[0], peers[1]]  # this is rank 0
        y = all_gather_reference(ranks) if kind == "all_gather" else reduce_scatter_reference(ranks, op)[0].clone()
        return [y if out is None else out[0].copy_(y.reshape(out[0].shape))]

    for c in (virt, real):
        c.comm_id = registry.register(c)
    eager = VirtualCommunicator._gs_ranks
    assert Communicator._gs_ranks is eager  # one definition for both

    def dispatch(self: Any, kind: str, xs: Any, out: Any, op: str, algo: str) -> Any:
        body = real_body if self is real else virtual_body
        return body(kind, list(xs), out, op, algo) if not torch.compiler.is_compiling() else \
            eager(self, kind, xs, out, op, algo)

    def step(x: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        g = real.all_gather(x)  # [2, 4, 3]
        s = real.reduce_scatter(x, op="max")  # [2, 3]
        vg = virt.all_gather([x, x * 2], out=[out, torch.empty_like(out)])
        vs = virt.reduce_scatter([x, x + 1])
        return g.sum() + s.sum() + vg[1].sum() + vs[0].sum() + vs[1].sum()

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(VirtualCommunicator, "_gs_ranks", dispatch)
        mp.setattr(Communicator, "_gs_ranks", dispatch)
        x = torch.randn(4, 3)
        out_e, out_c = torch.empty(2, 4, 3), torch.empty(2, 4, 3)
        expect = step(x, out_e)
        n_eager = len(calls)
        got = torch.compile(step, fullgraph=True, backend="eager")(x, out_c)
    assert torch.equal(got, expect) and torch.equal(out_c, out_e)
    assert len(calls) == 2 * n_eager  # the compiled graph ran every call through the ops
    assert out_e[0].equal(x) and out_e[1].equal(x * 2)
