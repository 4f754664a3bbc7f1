"""The Python front door as a new user meets it on a machine without CUDA: every argument is
checked before the hardware, and each error says what was wrong and what is accepted."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

import sollat
from sollat import testing
from sollat.collectives import rmsnorm
from sollat.collectives.algorithms import ALGORITHMS
from sollat.collectives.custom import Collective
from sollat.errors import UnsupportedError

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = "examples/maxabs_allreduce.cu"


@pytest.fixture
def no_cuda(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)


@pytest.fixture
def process_group(tmp_path: Path) -> Iterator[None]:
    """A one-rank gloo group in this process (what a user with torch.distributed set up has)."""
    import torch.distributed as dist

    if dist.is_initialized():
        pytest.skip("a process group exists")
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'pg'}", rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


# ---- algorithms= names sollat algorithms; 'auto' and library paths are values of algo= ----------
@pytest.mark.parametrize("name", ["auto", "nccl", "torch_twoshot"])
def test_algorithms_explains_values_of_algo(name: str, no_cuda: None) -> None:
    with pytest.raises(UnsupportedError) as info:
        sollat.VirtualCommunicator(2, algorithms=[name])
    text = str(info.value)
    assert text.startswith("VirtualCommunicator: algorithms= enables sollat's own AllReduce algorithms")
    assert f"{name!r} is not one of them but a value of algo= at call time" in text
    assert all(a in text for a in ALGORITHMS) and "no CUDA" not in text


@pytest.mark.parametrize(("value", "match"), [
    (["bogus"], "unknown algorithm 'bogus'; sollat's AllReduce algorithms: oneshot_ll"),
    ("oneshot_ll", "algorithms must be a list of sollat algorithm names"),
    ([], "algorithms must name at least one of oneshot_ll"),
    (3, "algorithms must be a list"),
])
def test_algorithms_argument_errors_come_before_the_hardware(value: object, match: str, no_cuda: None) -> None:
    with pytest.raises(UnsupportedError, match=match):
        sollat.VirtualCommunicator(2, algorithms=value)  # type: ignore[arg-type]


def test_a_known_algorithm_passes_the_name_check(no_cuda: None) -> None:
    with pytest.raises(UnsupportedError, match="no CUDA device"):  # the names were fine: the GPU is next
        sollat.VirtualCommunicator(2, algorithms=["oneshot_ll", "oneshot_sentinel"])


# ---- Communicator: arguments and the group's type before torch.distributed and CUDA --------------
@pytest.mark.parametrize(("kwargs", "match"), [
    ({"algorithms": ["bogus"]}, "Communicator: algorithms names an unknown algorithm 'bogus'"),
    ({"algorithms": ["nccl"]}, "'nccl' is not one of them but a value of algo="),
    ({"group": "tp"}, r"Communicator: group must be a torch.distributed.ProcessGroup .* got 'tp' \(str\)"),
    ({"group": [0, 1]}, r"group must be a torch.distributed.ProcessGroup .* got \[0, 1\] \(list\)"),
    ({"max_blocks": 0}, "max_blocks must be an integer"),
    ({"debug": "yes"}, "debug must be True or False"),
    ({"torch_twoshot_bytes": -1}, "torch_twoshot_bytes must be an integer >= 0"),
])
def test_communicator_checks_arguments_before_the_hardware(kwargs: dict[str, object], match: str, no_cuda: None,
                                                           process_group: None) -> None:
    with pytest.raises(UnsupportedError, match=match):
        sollat.Communicator(**kwargs)  # type: ignore[arg-type]


def test_communicator_checks_arguments_before_torch_distributed(no_cuda: None) -> None:
    import torch.distributed as dist

    if dist.is_initialized():
        pytest.skip("a process group exists")
    with pytest.raises(UnsupportedError, match="group must be"):
        sollat.Communicator("tp")  # type: ignore[arg-type]
    with pytest.raises(UnsupportedError, match="init_process_group"):  # good arguments: then the group
        sollat.Communicator(algorithms=["oneshot_ll"])


def test_communicator_with_good_arguments_reaches_the_hardware_check(no_cuda: None, process_group: None) -> None:
    import torch.distributed as dist

    with pytest.raises(UnsupportedError, match="no CUDA device"):
        sollat.Communicator(dist.group.WORLD, algorithms=["oneshot_ll"])


def test_virtual_communicator_checks_its_flags(no_cuda: None) -> None:
    with pytest.raises(UnsupportedError, match="cluster_ranks must be True or False"):
        sollat.VirtualCommunicator(2, cluster_ranks="0")  # type: ignore[arg-type]


# ---- sollat.testing ---------------------------------------------------------------------------------
@pytest.mark.parametrize("comm", [None, "comm", 3])
def test_testing_needs_a_communicator(comm: object) -> None:
    with pytest.raises(UnsupportedError, match="sollat.testing.inject: comm must be a sollat.Communicator"):
        testing.inject(comm, absent=1)
    with pytest.raises(UnsupportedError, match="sollat.testing.clear: comm must be"):
        testing.clear(comm)


@pytest.mark.parametrize(("kwargs", "match"), [({"absent": 2}, "absent must be a rank 0..1"),
                                               ({"mismatch": -1}, "mismatch must be a rank 0..1"),
                                               ({"absent": True}, "absent must be a rank")])
def test_inject_checks_its_ranks(kwargs: dict[str, object], match: str) -> None:
    from sollat.comm.virtual import VirtualCommunicator

    comm = object.__new__(VirtualCommunicator)
    comm.world_size = 2
    with pytest.raises(UnsupportedError, match=match):
        testing.inject(comm, **kwargs)  # type: ignore[arg-type]


# ---- rmsnorm.reference ------------------------------------------------------------------------------
def _rms_args(dtype: torch.dtype) -> tuple[list[torch.Tensor], torch.Tensor, torch.Tensor]:
    x = torch.arange(8).reshape(2, 4).to(dtype)
    return [x, x], x.clone(), torch.ones(4, dtype=dtype)


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64, torch.float64, torch.bool])
def test_rmsnorm_reference_refuses_other_dtypes(dtype: torch.dtype) -> None:
    xs, res, w = _rms_args(dtype)
    with pytest.raises(UnsupportedError, match=rf"xs\[0\] is {dtype}; supported dtypes: float32, bfloat16, float16"):
        rmsnorm.reference(xs, res, w, 1e-6)


def test_rmsnorm_reference_checks_every_input() -> None:
    xs, res, w = _rms_args(torch.float32)
    with pytest.raises(UnsupportedError, match="weight is torch.int32"):
        rmsnorm.reference(xs, res, w.int(), 1e-6)
    with pytest.raises(UnsupportedError, match="xs and residual must share one dtype"):
        rmsnorm.reference(xs, res.bfloat16(), w, 1e-6)
    with pytest.raises(UnsupportedError, match="xs must be a non-empty list"):
        rmsnorm.reference(xs[0], res, w, 1e-6)  # type: ignore[arg-type]
    with pytest.raises(UnsupportedError, match="xs must be a non-empty list"):
        rmsnorm.reference([], res, w, 1e-6)
    y, r = rmsnorm.reference(xs, res, w, 1e-6)
    assert y.dtype == r.dtype == torch.float32 and torch.equal(r, 3 * xs[0])


# ---- Collective: a str that names a .cu file is read like a Path ----------------------------------
def test_collective_reads_a_str_path_like_a_path(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(ROOT)
    text = (ROOT / EXAMPLE).read_text()
    assert Collective("maxabs", EXAMPLE).source == text
    assert Collective("maxabs", f"  {EXAMPLE}\n").source == text
    assert Collective("maxabs", str(ROOT / EXAMPLE)).source == Collective("maxabs", Path(EXAMPLE)).source


def test_collective_names_a_missing_source_file(tmp_path: Path) -> None:
    missing = os.fspath(tmp_path / "maxabs.cu")
    with pytest.raises(UnsupportedError, match=f"cannot read source file {missing}"):
        Collective("maxabs", missing)
    with pytest.raises(UnsupportedError, match="cannot read source file"):
        Collective("maxabs", "kernels/other.cuh")


def test_collective_source_text_is_still_text() -> None:
    text = (ROOT / EXAMPLE).read_text()
    assert Collective("maxabs", text).source == text
    with pytest.raises(UnsupportedError, match="SOLLAT_DEFINE_ENTRY_POINTS"):
        Collective("maxabs", "maxabs_allreduce.cu.txt")  # not a .cu name: text, without an entry point


def test_a_sentinel_collective_uses_at_most_two_slots() -> None:
    text = (ROOT / EXAMPLE).read_text()
    assert Collective("maxabs", text, proto="sentinel", max_slots=2).algorithm.max_slots(8) == 2
    assert Collective("maxabs", text, proto="ll", max_slots=4).algorithm.max_slots(8) == 4
    with pytest.raises(UnsupportedError, match="a sentinel collective handles at most 2 slots per thread"):
        Collective("maxabs", text, proto="sentinel", max_slots=4)
