"""User-written collectives (sollat.custom) on the CPU: the examples' kernels compile with NVRTC
for sm_90 through the public API, argument and registration errors are clear, a source that does
not compile reports the NVRTC log, and the source is part of the cubin cache key."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch

from sollat.collectives import algorithms, custom
from sollat.collectives.custom import Collective
from sollat.comm import custom_calls
from sollat.comm.state import scratch_bytes_per_rank
from sollat.comm.virtual import VirtualCommunicator
from sollat.device import build, layout
from sollat.device.dtypes import DTYPES
from sollat.errors import UnsupportedError

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"

TINY = """#include <sollat/collective.h>
using namespace sollat;
constexpr int kBuffers = SOLLAT_BUFFERS;
__device__ void body(const CallArgs& a, const SOLLAT_T* in, SOLLAT_T* out) {
  if (refused(a)) return;
  if (threadIdx.x == 0 && blockIdx.x == 0 && a.n) out[0] = in[0];  // VARIANT
}
SOLLAT_DEFINE_ENTRY_POINTS(tiny, SOLLAT_T, body)
"""


def _example(name: str):
    spec = importlib.util.spec_from_file_location(f"sollat_example_{name}", EXAMPLES / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    assert spec.loader is not None
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture()
def cache(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("SOLLAT_CACHE_DIR", str(tmp_path))
    return tmp_path / "cubin"


# ---- the examples compile (public API: sollat.custom.compile) ---------------------------------
@pytest.mark.parametrize("proto", ["ll", "sentinel"])
def test_maxabs_example_compiles_for_every_dtype(cache, proto: str) -> None:
    pytest.importorskip("cuda.core")
    coll = _example("maxabs_allreduce").collective(proto)
    for dtype in coll.dtypes:
        cubin = custom.compile(coll, dtype, world_size=8, slots=2)
        assert len(cubin) > 1000
    assert len(list(cache.glob("maxabs-sm_90-*.cubin"))) == len(coll.dtypes)


@pytest.mark.parametrize("proto", ["ll", "sentinel"])
def test_allgather_example_compiles(cache, proto: str) -> None:
    pytest.importorskip("cuda.core")
    coll = _example("allgather").collective(proto)
    assert coll.algorithm.gathers
    custom.compile(coll, torch.bfloat16, world_size=4, slots=2, real_ranks=True)
    custom.compile(coll, torch.float64, world_size=2, slots=1, test_hooks=True)


@pytest.mark.slow  # every instantiation a communicator may build for both examples (minutes)
def test_every_example_instantiation_compiles(cache) -> None:
    pytest.importorskip("cuda.core")
    for name in ("maxabs_allreduce", "allgather"):
        mod = _example(name)
        for proto in ("ll", "sentinel"):
            coll = mod.collective(proto)
            for dtype, rmax, slots, real in custom.instantiations(coll):
                custom.compile(coll, dtype, world_size=rmax, slots=slots, real_ranks=real)


# ---- compile errors and the cache key -----------------------------------------------------------
def test_a_source_that_does_not_compile_reports_the_nvrtc_log(cache) -> None:
    pytest.importorskip("cuda.core")
    bad = Collective("tiny", TINY.replace("out[0] = in[0];", "out[0] = undefined_thing;"))
    with pytest.raises(RuntimeError, match="NVRTC failed to compile tiny") as ei:
        custom.compile(bad)
    assert "undefined_thing" in str(ei.value) and "error" in str(ei.value)


def test_the_source_hash_is_part_of_the_cache_key(cache) -> None:
    pytest.importorskip("cuda.core")
    a = Collective("tiny", TINY)
    b = Collective("tiny", TINY.replace("// VARIANT", "// another variant"))
    assert a.source_sha256 != b.source_sha256 and a.describe() != b.describe()
    custom.compile(a)
    custom.compile(a)  # from the cache: no second file
    assert len(list(cache.glob("tiny-*.cubin"))) == 1
    custom.compile(b)  # only a comment differs: still a new key, a new cubin
    assert len(list(cache.glob("tiny-*.cubin"))) == 2
    defines = algorithms.kernel_defines(a.algorithm, DTYPES[torch.float32], "", 2, 1, False, real_ranks=False)
    opts = build._options("sm_90", defines)
    keys = {build.cache_key(c.source, name="tiny", arch="sm_90", options=opts, defines=defines) for c in (a, b)}
    assert len(keys) == 2


def test_kernel_defines_of_a_custom_collective() -> None:
    coll = Collective("tiny", TINY, proto="sentinel", buffers=2)
    d = algorithms.kernel_defines(coll.algorithm, DTYPES[torch.float16], "", 4, 1, True, real_ranks=True)
    assert d["SOLLAT_BUFFERS"] == "2" and d["SOLLAT_PROTO"] == "ProtoSentinel" and d["SOLLAT_TEST_HOOKS"] == "1"
    assert d["SOLLAT_FENCE_SYS"] == "1" and d["SOLLAT_T"] == "sollat::f16" and "SOLLAT_OP" not in d
    assert coll.payload_bytes == 16 and coll.elements_per_line(torch.float16) == 8
    assert Collective("tiny", TINY).elements_per_line(torch.float64) == 1  # LL: 8 payload bytes


# ---- regions: a registered collective gets its own scratch and epochs ----------------------------
def test_a_registered_collective_gets_its_own_region_after_the_builtin_ones() -> None:
    c1, c2 = Collective("tiny", TINY, buffers=2), Collective("tiny", TINY, proto="sentinel")
    base = scratch_bytes_per_rank(4, ["oneshot_ll"], 16)
    with_one = scratch_bytes_per_rank(4, ["oneshot_ll"], 16, [c1.algorithm])
    assert with_one - base == 2 * layout.region_bytes(4, 16)
    regs = algorithms.regions(("oneshot_ll",), 16, (c2.algorithm,))
    assert regs[0].name == "oneshot_ll" and regs[-1].name == "custom:tiny" and regs[-1].alg.proto == "sentinel"
    assert regs[-1].blocks == 16 and regs[-1].alg.epoch_words(16) == layout.lines_per_src(16)


# ---- argument and registration errors --------------------------------------------------------------
@pytest.mark.parametrize("kwargs,match", [
    ({"name": "1bad"}, "C identifier"),
    ({"name": "has-dash"}, "C identifier"),
    ({"source": ""}, "CUDA C\\+\\+ text"),
    ({"source": 42}, "CUDA C\\+\\+ text"),
    ({"source": TINY.replace("(tiny,", "(other,")}, "SOLLAT_DEFINE_ENTRY_POINTS\\(tiny"),
    ({"proto": "ll128"}, "proto must be one of ll, sentinel"),
    ({"buffers": 0}, "buffers must be an integer 1..4"),
    ({"buffers": True}, "buffers must be an integer 1..4"),
    ({"dtypes": [torch.int32]}, "dtypes must be a non-empty subset"),
    ({"dtypes": []}, "dtypes must be a non-empty subset"),
    ({"output": "scatter"}, "output must be one of same, gather"),
    ({"max_slots": 3}, "max_slots must be 1, 2 or 4"),
    ({"proto": "sentinel", "max_slots": 4}, "sentinel collective handles at most 2 slots"),
    ({"output": "gather", "two_shot": True}, "two_shot must be False"),
])
def test_bad_collective_arguments_are_clear(kwargs: dict, match: str) -> None:
    args = {"name": "tiny", "source": TINY, **kwargs}
    name, source = args.pop("name"), args.pop("source")
    with pytest.raises(UnsupportedError, match=match):
        Collective(name, source, **args)


def test_source_from_a_path(tmp_path) -> None:
    p = tmp_path / "tiny.cu"
    p.write_text(TINY)
    assert Collective("tiny", p).source == TINY
    with pytest.raises(UnsupportedError, match="cannot read source file"):
        Collective("tiny", tmp_path / "missing.cu")


def test_compile_refuses_a_dtype_the_collective_was_not_registered_with() -> None:
    coll = Collective("tiny", TINY, dtypes=[torch.float32])
    with pytest.raises(UnsupportedError, match="does not support dtype torch.float16; it was registered with dtypes float32"):
        custom.compile(coll, torch.float16)


def test_collectives_argument_errors() -> None:
    a = Collective("tiny", TINY)
    with pytest.raises(UnsupportedError, match="must be a list"):
        custom.checked_collectives(a, "VirtualCommunicator")  # type: ignore[arg-type]
    with pytest.raises(UnsupportedError, match="must hold sollat.custom.Collective"):
        custom.checked_collectives(["tiny"], "VirtualCommunicator")  # type: ignore[list-item]
    with pytest.raises(UnsupportedError, match="two collectives are named tiny"):
        custom.checked_collectives([a, Collective("tiny", TINY, proto="sentinel")], "VirtualCommunicator")
    assert custom.checked_collectives(None, "x") == ()


def test_constructor_reports_a_bad_collectives_argument_before_looking_for_a_gpu() -> None:
    import sollat

    with pytest.raises(UnsupportedError, match="collectives must hold"):
        sollat.VirtualCommunicator(2, collectives=["tiny"])  # type: ignore[list-item]


def test_run_names_unknown_and_mismatched_collectives() -> None:
    registered = Collective("tiny", TINY)
    mine = {registered.name: registered}
    comm = object.__new__(VirtualCommunicator)
    comm._collectives = mine
    assert comm.collectives == ("tiny",)
    assert custom_calls.registered(mine, "tiny") is registered.algorithm
    assert custom_calls.registered(mine, Collective("tiny", TINY)) is registered.algorithm  # equal registration
    with pytest.raises(UnsupportedError, match="'nope' is not registered on this communicator \\(registered: tiny\\)"):
        custom_calls.registered(mine, "nope")
    with pytest.raises(UnsupportedError, match="differs from the one registered"):
        custom_calls.registered(mine, Collective("tiny", TINY, proto="sentinel"))
    with pytest.raises(TypeError, match="Collective or its name"):
        custom_calls.registered(mine, 3)
    with pytest.raises(UnsupportedError, match="torch.compile"):
        custom_calls.registered(mine, "tiny", compiling=True)


def test_ranks_that_registered_different_collectives_all_raise_at_construction() -> None:
    """The setup agreement (Communicator._agree_on_setup) covers the collectives: a rank whose
    source differs (one comment) makes every rank raise CallMismatchError."""
    from datetime import timedelta

    from torch.distributed import HashStore

    import sollat
    from sollat.collectives import select
    from sollat.comm import agree
    from sollat.comm.real import Communicator

    from ._ranks import on_threads

    store = HashStore()
    store.set_timeout(timedelta(seconds=5))
    table = select.find_table("generic", 2, mode="real")

    def make(rank: int, colls: list[Collective], seq: int) -> Communicator:
        c = Communicator.__new__(Communicator)
        c.timeout_s, c._algos, c.max_blocks, c._torch_twoshot_bytes = 30.0, ("oneshot_ll",), 16, 0
        c._agreement = agree.Agreement(store, "custom-setup", rank, 2, 5.0, seq=seq)
        c._selection_table = lambda: table  # type: ignore[method-assign]
        c._collectives = {x.name: x for x in colls}
        c._gather_scatter, c._rmsnorm_twoshot, c._batch_invariant, c._fused_blocks = False, False, False, None
        return c

    a, b = Collective("tiny", TINY), Collective("tiny", TINY.replace("// VARIANT", "// edited"))
    comms = [make(0, [a], 0), make(1, [Collective("tiny", TINY)], 0)]
    assert on_threads(2, lambda r: comms[r]._agree_on_setup()) == [None, None]
    comms = [make(0, [a], 1), make(1, [b], 1)]
    res = on_threads(2, lambda r: comms[r]._agree_on_setup())
    assert all(isinstance(e, sollat.CallMismatchError) and "collectives" in str(e) for e in res), res
    comms = [make(0, [a], 2), make(1, [], 2)]
    res = on_threads(2, lambda r: comms[r]._agree_on_setup())
    assert all(isinstance(e, sollat.CallMismatchError) for e in res), res
