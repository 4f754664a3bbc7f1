"""Host-side checks of the communicators without a GPU (objects built with __new__, fields set by hand)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import sollat
from sollat.collectives import algorithms
from sollat.comm import real as communicator
from sollat.comm.fitting import Fitting
from sollat.comm.ranks import VirtualRanks
from sollat.comm.real import VirtualCommunicator
from sollat.device.dtypes import DTYPES


def fake_virtual(world_size: int = 4) -> VirtualCommunicator:
    c = VirtualCommunicator.__new__(VirtualCommunicator)
    c.world_size = world_size
    c.device = torch.device("cuda", 0)
    c._algos = tuple(algorithms.ALGORITHMS)
    c._faulted = False
    c.gpu_name = "Fake GPU"
    c.timeout_s = 1.0
    c._choices = {}
    c._table = None
    c._calls = {}
    c._dev_index = 0
    c._ranks = VirtualRanks(world_size, torch.empty(0, dtype=torch.uint8))
    c._batch_invariant = False
    c._rmsnorm_twoshot = False
    c._gather_scatter = False
    c._collectives = {}
    c.debug = False
    c._err_host = np.zeros(4, dtype=np.int32)  # the host-mapped fault flag, clear
    return c


def test_cpu_tensor_wrong_op_dtype_size() -> None:
    c = fake_virtual()
    x = torch.ones(4)
    with pytest.raises(sollat.UnsupportedError, match="CUDA tensors"):
        c._check_common(x, "sum", "tensors[0]")
    with pytest.raises(TypeError, match="torch.Tensor"):
        c._check_common([1, 2], "sum", "tensors[0]")  # type: ignore[arg-type]


def test_list_length_is_checked() -> None:
    c = fake_virtual(4)
    with pytest.raises(sollat.UnsupportedError, match="needs tensor as a list of 4 tensors, got 3 tensors"):
        c.all_reduce([torch.ones(2)] * 3)
    with pytest.raises(sollat.UnsupportedError, match="needs tensor as a list of 4 tensors, got a single tensor"):
        c.all_reduce(torch.ones(2))  # type: ignore[arg-type]
    with pytest.raises(sollat.UnsupportedError, match="needs out as a list of 4 tensors, got 2 tensors"):
        c.all_reduce([torch.ones(2)] * 4, out=[torch.ones(2)] * 2)
    c._check_common = lambda t, op, what: DTYPES[t.dtype]  # type: ignore[method-assign]  # CPU tensors pass
    with pytest.raises(sollat.UnsupportedError, match=r"tensor\[2\] is \(3,\) .* but tensor\[0\] is \(2,\)"):
        c.all_reduce([torch.ones(2)] * 2 + [torch.ones(3), torch.ones(2)])
    # a rank whose tensor matches rank 0's but for its device is checked, not passed as rank 0's
    with pytest.raises(sollat.UnsupportedError, match=r"tensor\[3\] is \(2,\) torch.float32 on meta but tensor\[0\]"):
        c.all_reduce([torch.ones(2)] * 3 + [torch.ones(2, device="meta")])

    def meta_only(t: torch.Tensor, op: str, what: str) -> object:  # "meta" plays this communicator's device
        if t.device.type != "meta":
            raise sollat.UnsupportedError(f"{what} is on {t.device}")
        return DTYPES[t.dtype]

    c._check_common = meta_only  # type: ignore[method-assign,assignment]
    with pytest.raises(sollat.UnsupportedError, match=r"^out\[1\] is on cpu$"):  # an output elsewhere is checked
        c._all_reduce_ranks([torch.ones(2, device="meta")] * 4, "sum", "auto",
                            [torch.ones(2, device="meta"), torch.ones(2)] + [torch.ones(2, device="meta")] * 2, False)


def test_algorithm_resolution_errors() -> None:
    c = fake_virtual()
    with pytest.raises(sollat.UnsupportedError, match="unknown algorithm 'ring'"):
        c._resolve("ring", 64, torch.float32, "sum", False)
    with pytest.raises(sollat.UnsupportedError, match="needs a process group"):
        c._resolve("nccl", 64, torch.float32, "sum", False)
    with pytest.raises(sollat.UnsupportedError, match="needs a process group"):
        c._resolve("torch_twoshot", 64, torch.float32, "sum", False)
    c._algos = ("oneshot_ll",)
    with pytest.raises(sollat.UnsupportedError, match="not enabled"):
        c._resolve("oneshot_sentinel", 64, torch.float32, "sum", False)
    assert c._resolve("oneshot_ll", 64, torch.float32, "sum", True) == "oneshot_ll"


def test_impossible_requests_are_clear_errors() -> None:
    alg = algorithms.get("oneshot_ll")
    with pytest.raises(sollat.UnsupportedError, match="does not support dtype torch.int32"):
        alg.check(torch.int32, "sum")
    with pytest.raises(sollat.UnsupportedError, match="does not support op 'prod'"):
        alg.check(torch.float32, "prod")
    with pytest.raises(sollat.UnsupportedError, match="at most 72 ranks"):
        algorithms.max_ranks_template(73)
    # the smallest rank cap that holds the world (abi.RANK_CAPS), non-powers of two included
    assert [algorithms.max_ranks_template(r) for r in (2, 3, 5, 8, 9, 16, 17, 33, 64, 72)] == \
        [2, 4, 8, 8, 72, 72, 72, 72, 72, 72]
    # LL128 and the bulk two-shot stop at 8 ranks: named at 9 they are refused, and not enabled by default
    with pytest.raises(sollat.UnsupportedError, match="'ll128' runs on 2 to 8 ranks"):
        algorithms.get("ll128").check_world(9)
    from sollat.collectives.validate import algorithm_names

    assert "ll128" in algorithm_names(None, 8) and "ll128" not in algorithm_names(None, 9)
    assert set(algorithm_names(None, 72)) == {"oneshot_ll", "oneshot_sentinel", "twoshot_ll", "twoshot_sentinel",
                                              "oneshot_ll_wide"}
    assert "oneshot_ll_wide" not in algorithm_names(None, 8)  # a kernel for wide groups only
    with pytest.raises(sollat.UnsupportedError, match="'twoshot_bulk' runs on 2 to 8 ranks"):
        algorithm_names(["oneshot_ll", "twoshot_bulk"], 16)
    with pytest.raises(sollat.UnsupportedError, match="'oneshot_ll_wide' runs on 9 to 72 ranks"):
        algorithm_names(["oneshot_ll_wide"], 4)


def test_auto_uses_the_table() -> None:
    c = fake_virtual(4)
    assert c.selected_algorithm(128, torch.bfloat16) in c.algorithms
    assert c.selected_algorithm(10 << 30, torch.bfloat16) in c.algorithms  # no NCCL with virtual ranks
    assert c._table is not None and len(c._choices) == 2  # read once, choices cached


def test_device_fault_records_become_exceptions() -> None:
    c = fake_virtual()
    records = {0: np.zeros(9, dtype=np.int32), 1: np.zeros(9, dtype=np.int32)}
    c._record_views = lambda: [(r, torch.from_numpy(v)) for r, v in records.items()]  # type: ignore[method-assign]
    c._raise_recorded()
    assert not c._faulted
    records[1][:] = [1, 0, 2, 3, 4, 5, 6, 0, 1]  # rank 0 timed out on peer 2 in an all_reduce; found in rank 1's record
    with pytest.raises(sollat.PeerTimeoutError, match="peer 2 did not deliver") as ei:
        c._raise_recorded()
    assert (ei.value.rank, ei.value.peer, ei.value.slot, ei.value.epoch) == (0, 2, 5, 6)
    assert "reported to rank 1 by rank 0" in str(ei.value)
    assert c._faulted
    with pytest.raises(sollat.CommunicatorFaultedError, match="reset"):
        c._guard()
    records[0][:] = [2, 1, 3, 0, 0, 0, 0, 0x1235, 1]
    with pytest.raises(sollat.CallMismatchError, match="peer 3 called all_reduce with different arguments"):
        c._raise_recorded()


def test_signatures_are_odd_and_distinguish_calls() -> None:
    from sollat.device.dtypes import DTYPES

    a, b = algorithms.get("oneshot_ll"), algorithms.get("oneshot_sentinel")
    f32, bf = DTYPES[torch.float32], DTYPES[torch.bfloat16]
    sigs = {algorithms.signature(alg, dt, op, n) for alg in (a, b) for dt in (f32, bf) for op in ("sum", "max")
            for n in (1, 2, 1000)}
    assert len(sigs) == 24 and all(s & 1 for s in sigs)


def test_virtual_communicator_without_gpu_is_a_clear_error(monkeypatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(sollat.UnsupportedError, match="no CUDA device"):
        VirtualCommunicator(2)


def test_communicator_needs_torch_distributed() -> None:
    import torch.distributed as dist

    if dist.is_initialized():
        pytest.skip("a process group exists")
    with pytest.raises(sollat.UnsupportedError, match="init_process_group"):
        sollat.Communicator()


def test_custom_ops_are_registered() -> None:
    """One op per public collective for both communicators, each over per-launch-rank lists."""
    for name in ("all_reduce", "all_reduce_rmsnorm", "all_reduce_rmsnorm_fp8", "gather_scatter"):
        assert hasattr(torch.ops.sollat, name), name
        assert not hasattr(torch.ops.sollat, name + "_virtual"), name
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        ys = torch.ops.sollat.all_reduce([torch.empty(3), torch.empty(3)], 1, "sum", "auto", False)
        assert [y.shape for y in ys] == [torch.Size([3])] * 2


def test_rank_clusters_only_for_small_virtual_grids(monkeypatch) -> None:
    """Virtual ranks launch block b of every rank as one (1, R) cluster up to CLUSTER_MAX_BLOCKS
    blocks per rank (grid counted in clusters), and a plain (blocks, R) grid above or when off."""
    made: list[tuple] = []
    monkeypatch.setattr(communicator.launch, "launch_config",
                        lambda grid, block, *, pdl, cluster=None: made.append((grid, block, pdl, cluster)) or made[-1])
    c = Fitting(real=False, launch_ranks=4, device=torch.device("cuda", 0), gpu_name="Fake GPU", num_sms=132,
                cluster_ranks=True)
    limit = communicator.CLUSTER_MAX_BLOCKS
    assert c.clustered(1) and c.clustered(limit) and not c.clustered(limit + 1)
    assert c.launch_config(2, 512) == ((2, 1), 512, True, (1, 4))
    assert c.launch_config(limit + 1, 512) == ((limit + 1, 4), 512, True, None)
    c.cluster_ranks = False
    assert not c.clustered(1)
    assert c.launch_config(1, 32) == ((1, 4), 32, True, None)


def test_every_algorithm_runs_on_a_protocol_that_detects_a_mismatch() -> None:
    """The claim that every algorithm sees a call that differs between ranks is a property of its
    protocol (algorithms.MISMATCH_DETECTION); an algorithm on any other protocol is refused."""
    import dataclasses

    from sollat.collectives import algorithms as alg_mod
    from sollat.collectives.custom import PROTOS

    every = [*alg_mod.ALGORITHMS.values(), *alg_mod.RMSNORM_ALGORITHMS.values(),
             *alg_mod.GATHER_SCATTER_ALGORITHMS.values()]
    assert {a.proto for a in every} == set(alg_mod.MISMATCH_DETECTION) and set(PROTOS) <= set(alg_mod.MISMATCH_DETECTION)
    assert not hasattr(alg_mod.ALGORITHMS["oneshot_ll"], "detects_mismatch")
    with pytest.raises(ValueError, match="protocol 'simple' has no mismatch detection"):
        dataclasses.replace(alg_mod.ALGORITHMS["oneshot_ll"], proto="simple")
