"""Groups that are not one NVLink domain (sollat.device.topology): synthetic GPU descriptions."""

from __future__ import annotations

import ctypes
import pickle
import sys
import types

import pytest

from sollat.device import topology
from sollat.device.topology import NCCL, NVLINK, PCIE, SOLLAT, Fabric, GpuDescription
from sollat.errors import NotOneNVLinkDomainError, UnsupportedError


def _pci(host: str, i: int) -> str:
    return topology.pci_id(0, 0x10 * (1 + i) + (len(host) % 7), 0)


def host(name: str, n: int, *, rank0: int = 0, link: str = NVLINK, fabric: Fabric | None = None,
         pair_links: dict[tuple[int, int], str] | None = None, allow_pcie: bool = False) -> list[GpuDescription]:
    """``n`` GPUs of host ``name`` (ranks rank0.., GPU i on cuda:i), every pair joined by ``link``
    unless ``pair_links`` (local indices) says otherwise."""
    kinds = pair_links or {}
    out = []
    for i in range(n):
        links = tuple((_pci(name, j), kinds.get((min(i, j), max(i, j)), link)) for j in range(n) if j != i)
        out.append(GpuDescription(rank0 + i, name, i, _pci(name, i), fabric, links, allow_pcie))
    return out


@pytest.mark.parametrize("n", [2, 4, 8])
def test_one_host_with_nvlink_is_one_domain(n: int) -> None:
    descs = host("node0", n)
    assert topology.unreachable_pairs(descs) == []
    for r in range(n):
        topology.check_nvlink_domain(descs, r)
        assert topology.outside_domain_path(descs, r, "error") == topology.outside_domain_path(descs, r, "nccl") == SOLLAT


def test_a_pcie_only_pair_is_refused_naming_both_ranks() -> None:
    descs = host("node0", 4, pair_links={(1, 2): PCIE})
    assert [(u.rank, u.peer) for u in topology.unreachable_pairs(descs)] == [(1, 2)]
    for r in range(4):  # every rank raises, naming the same pair
        with pytest.raises(NotOneNVLinkDomainError) as e:
            topology.check_nvlink_domain(descs, r)
        msg = str(e.value)
        assert e.value.pairs == [(1, 2)] and e.value.rank == r and isinstance(e.value, UnsupportedError)
        assert "rank 1 (node0, cuda:1" in msg and "rank 2 (node0, cuda:2" in msg and "rank 3 (" not in msg
        assert "PCIe only" in msg and "torch.distributed's own collectives" in msg and topology.ALLOW_PCIE_ENV in msg
        assert topology.outside_domain_path(descs, r, "nccl") == NCCL
        with pytest.raises(NotOneNVLinkDomainError):
            topology.outside_domain_path(descs, r, "error")


def test_no_peer_access_and_unknown_links_are_refused() -> None:
    descs = host("node0", 2, link="none")
    assert "no peer access" in topology.unreachable_pairs(descs)[0].why
    blind = [GpuDescription(r, "node0", 0, _pci("node0", r), None) for r in range(2)]  # one GPU visible per rank
    assert "install nvidia-ml-py" in topology.unreachable_pairs(blind)[0].why


def test_one_side_seeing_the_link_is_enough_and_the_weaker_view_wins() -> None:
    a, b = host("node0", 2)
    assert topology.unreachable_pairs([a, GpuDescription(1, "node0", 0, b.pci_bus_id, None)]) == []
    b_pcie = GpuDescription(1, "node0", 1, b.pci_bus_id, None, ((a.pci_bus_id, PCIE),))
    assert [(u.rank, u.peer) for u in topology.unreachable_pairs([a, b_pcie])] == [(0, 1)]


def test_two_hosts_without_a_fabric_are_refused() -> None:
    descs = host("node0", 2) + host("node1", 2, rank0=2)
    bad = topology.unreachable_pairs(descs)
    assert [(u.rank, u.peer) for u in bad] == [(0, 2), (0, 3), (1, 2), (1, 3)]
    assert all("different hosts" in u.why for u in bad)
    with pytest.raises(NotOneNVLinkDomainError, match=r"4 pair\(s\)"):
        topology.check_nvlink_domain(descs, 3)
    assert topology.outside_domain_path(descs, 0, "nccl") == NCCL


def test_two_hosts_of_one_nvlink_clique_are_one_domain() -> None:
    f = Fabric("a1" * 16, 7)
    descs = host("node0", 4, fabric=f) + host("node1", 4, rank0=4, fabric=f)
    assert topology.unreachable_pairs(descs) == []
    assert topology.outside_domain_path(descs, 5, "error") == SOLLAT


def test_two_hosts_of_different_cliques_are_refused() -> None:
    descs = host("node0", 2, fabric=Fabric("a1" * 16, 7)) + host("node1", 2, rank0=2, fabric=Fabric("a1" * 16, 8))
    bad = topology.unreachable_pairs(descs)
    assert len(bad) == 4 and all("different NVLink fabric cliques" in u.why for u in bad)
    other_cluster = host("node0", 1, fabric=Fabric("a1" * 16, 7)) + host("node1", 1, rank0=1, fabric=Fabric("b2" * 16, 7))
    assert len(topology.unreachable_pairs(other_cluster)) == 1
    half = host("node0", 1, fabric=Fabric("a1" * 16, 7)) + host("node1", 1, rank0=1)
    assert "not both in a multi-node NVLink fabric" in topology.unreachable_pairs(half)[0].why


def test_the_pcie_override_needs_every_rank(monkeypatch) -> None:
    monkeypatch.setenv(topology.ALLOW_PCIE_ENV, "1")
    assert topology.allow_pcie_from_env()
    monkeypatch.setenv(topology.ALLOW_PCIE_ENV, "0")
    assert not topology.allow_pcie_from_env()
    links = {(0, 1): PCIE}
    assert topology.unreachable_pairs(host("node0", 2, pair_links=links, allow_pcie=True)) == []
    some = host("node0", 2, pair_links=links, allow_pcie=True)
    some[1] = GpuDescription(**{**some[1].__dict__, "allow_pcie": False})
    assert [(u.rank, u.peer) for u in topology.unreachable_pairs(some)] == [(0, 1)]
    # the override never admits a pair with no peer access, nor two hosts
    assert topology.unreachable_pairs(host("node0", 2, link="none", allow_pcie=True))
    assert topology.unreachable_pairs(host("node0", 1, allow_pcie=True) + host("node1", 1, rank0=1, allow_pcie=True))


def test_outside_domain_is_checked() -> None:
    assert topology.checked_outside_domain("nccl") == "nccl"
    with pytest.raises(UnsupportedError, match="outside_domain"):
        topology.checked_outside_domain("auto")
    with pytest.raises(UnsupportedError):
        topology.outside_domain_path(host("node0", 2), 0, "NCCL")


def test_descriptions_travel_by_pickle() -> None:  # all_gather_object pickles them
    d = host("node0", 2, fabric=Fabric("a1" * 16, 3))[1]
    assert pickle.loads(pickle.dumps(d)) == d


def test_gather_and_decide_over_a_process_group(monkeypatch) -> None:
    import torch.distributed as dist

    monkeypatch.setattr(topology, "describe_local", lambda device, rank: host("node0", 1, pair_links={})[0])
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        assert topology.gather_descriptions(None, 0) == host("node0", 1)
        assert topology.check_group(None, 0, "error") == SOLLAT
    finally:
        dist.destroy_process_group()


def test_nvml_view_reads_fabric_info_and_links(monkeypatch) -> None:
    """A fake nvidia-ml-py: the fabric struct is nvml.h's (16-byte UUID), the links NVML's P2P status."""
    handles = {"0000:19:00.0": 0, "0000:3b:00.0": 1, "0000:4c:00.0": 2}
    nv = types.SimpleNamespace(
        NVML_P2P_CAPS_INDEX_READ=(0,),  # as some pynvml releases spell it: topology uses nvml.h's numbers
        nvmlInit=lambda: None, nvmlShutdown=lambda: None, nvmlDeviceGetCount=lambda: 3,
        nvmlDeviceGetHandleByPciBusId=handles.__getitem__, nvmlDeviceGetHandleByIndex=lambda i: i,
        nvmlDeviceGetPciInfo=lambda h: types.SimpleNamespace(domain=0, bus=(0x19, 0x3B, 0x4C)[h], device=0),
        # GPU 1: NVLink to GPU 0; GPU 2: PCIe read only
        nvmlDeviceGetP2PStatus=lambda a, b, cap: 0 if (b, cap) in ((1, 2), (2, 0)) else 5)

    def fabric(handle: int, ref) -> None:
        info = ctypes.cast(ref, ctypes.POINTER(topology._FabricInfo)).contents
        info.clusterUuid[:] = list(range(1, 17))
        info.status, info.cliqueId, info.state = 0, 5, 3

    nv.nvmlDeviceGetGpuFabricInfo = fabric
    monkeypatch.setitem(sys.modules, "pynvml", nv)
    f, links = topology._nvml_view("0000:19:00.0")
    assert f == Fabric(bytes(range(1, 17)).hex(), 5)
    assert links == {"0000:3b:00.0": NVLINK, "0000:4c:00.0": PCIE}
    nv.nvmlDeviceGetP2PStatus = lambda a, b, cap: 1 / 0  # links unreadable: the fabric still stands
    assert topology._nvml_view("0000:19:00.0") == (f, {})

    def incomplete(handle: int, ref) -> None:
        ctypes.cast(ref, ctypes.POINTER(topology._FabricInfo)).contents.state = 2  # in progress

    nv.nvmlDeviceGetGpuFabricInfo = incomplete
    assert topology._nvml_view("0000:19:00.0")[0] is None
    monkeypatch.setitem(sys.modules, "pynvml", None)  # not installed: CUDA's view alone
    assert topology._nvml_view("0000:19:00.0") == (None, {})


def _on(rank: int, pci: str, overlap: bool, host: str = "h") -> GpuDescription:
    return GpuDescription(rank, host, 0, pci, None, (), False, overlap)


def test_ranks_on_one_gpu_need_the_overlap_variable_on_every_rank() -> None:
    from sollat.device.topology import ALLOW_OVERLAP_ENV, check_shared_gpus

    gpu0 = "0000:1b:00.0"
    check_shared_gpus([_on(0, gpu0, True), _on(1, gpu0, True), _on(2, gpu0, True)], 0)  # the test mode: accepted
    check_shared_gpus([_on(0, gpu0, False), _on(1, "0000:2c:00.0", False)], 0)  # one GPU each: nothing to say
    check_shared_gpus([_on(0, gpu0, False), _on(1, gpu0, False, host="other")], 0)  # same bus id, two hosts
    for r in range(3):  # every rank raises the same words, naming the ranks, the GPU and the variable
        with pytest.raises(UnsupportedError) as e:
            check_shared_gpus([_on(0, gpu0, True), _on(1, gpu0, False), _on(2, "0000:2c:00.0", True)], r)
        msg = str(e.value)
        assert ALLOW_OVERLAP_ENV in msg and f"rank {r})" in msg
        assert f"ranks 0, 1 on h {gpu0}" in msg and "not set on rank(s) 1" in msg
