"""Is a group one NVLink domain? Every rank's GPU described, exchanged, and one decision.

sollat's kernels load and store peers' scratch directly (symmetric memory), so every pair of ranks
must reach each other over NVLink-class load/store: two GPUs of one host joined by NVLink
(direct links or NVSwitch), or GPUs of one multi-node NVLink domain (NVML's GPU fabric info: the
same cluster UUID and clique id, fabric registration completed). PCIe peer-to-peer works as
load/store too but is not what sollat is built and tuned for; ``SOLLAT_ALLOW_PCIE_PEERS=1`` (on
every rank) accepts such pairs of one host.

Each rank describes its own GPU (``describe_local``), the ranks exchange the descriptions
(``gather_descriptions``: ``torch.distributed.all_gather_object`` over the group), and pure
functions decide from the one list every rank holds, so every rank decides alike:
``unreachable_pairs``, ``check_nvlink_domain`` (raises ``NotOneNVLinkDomainError``) and
``outside_domain_path`` (``Communicator(outside_domain="error" | "nccl")``: refuse, or hand every
call of the group to NCCL), and ``check_shared_gpus`` (ranks on one GPU need torch's overlap
variable on every rank). docs/design.md, "Groups that are not one NVLink domain".
"""

from __future__ import annotations

import ctypes
import os
import socket
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ..errors import NotOneNVLinkDomainError, UnsupportedError
from . import environment

ALLOW_PCIE_ENV = "SOLLAT_ALLOW_PCIE_PEERS"
# torch's symmetric memory refuses two ranks on one device unless this is "1" in every process
# (its test mode: the processes' kernels then time-slice on the GPU, docs/testing.md).
ALLOW_OVERLAP_ENV = "TORCH_SYMM_MEM_ALLOW_OVERLAPPING_DEVICES"
OUTSIDE_DOMAIN = ("error", "nccl")  # Communicator(outside_domain=...): refuse, or NCCL for every call
SOLLAT, NCCL = "sollat", "nccl"  # what outside_domain_path returns

# A link between two GPUs of one host, as this rank sees it.
NVLINK = "nvlink"  # NVML: P2P over NVLink OK (or, without NVML, native peer atomics: never over PCIe)
PCIE = "pcie"  # peer access, not over NVLink
NO_PEER = "none"  # no peer access
UNKNOWN = "unknown"  # neither NVML nor CUDA could tell (the peer GPU is not visible to this process)


@dataclass(frozen=True)
class Fabric:
    """NVML's GPU fabric info of a GPU whose fabric registration completed (multi-node NVLink)."""

    cluster_uuid: str
    clique_id: int


@dataclass(frozen=True)
class GpuDescription:
    """What one rank tells the others about its GPU."""

    rank: int
    host: str
    device: int  # CUDA device index in that process
    pci_bus_id: str  # "dddd:bb:dd.0", lower case
    fabric: Fabric | None
    links: tuple[tuple[str, str], ...] = ()  # (PCI bus id of another GPU of this host, link kind)
    allow_pcie: bool = False  # SOLLAT_ALLOW_PCIE_PEERS=1 on this rank
    allow_overlap: bool = False  # TORCH_SYMM_MEM_ALLOW_OVERLAPPING_DEVICES=1 on this rank

    def where(self) -> str:
        return f"rank {self.rank} ({self.host}, cuda:{self.device}, {self.pci_bus_id})"


@dataclass(frozen=True)
class Unreachable:
    rank: int
    peer: int  # rank < peer
    why: str


def pci_id(domain: int, bus: int, device: int) -> str:
    return f"{domain:04x}:{bus:02x}:{device:02x}.0"


def allow_pcie_from_env() -> bool:
    return environment.flag(ALLOW_PCIE_ENV)


def allow_overlap_from_env() -> bool:
    return os.environ.get(ALLOW_OVERLAP_ENV, "").strip() == "1"


def check_shared_gpus(descriptions: Sequence[GpuDescription], rank: int) -> None:
    """Raises UnsupportedError (the same message on every rank) when ranks share a GPU and not
    every rank has ALLOW_OVERLAP_ENV=1: torch's symmetric memory would refuse them later, from
    inside the allocation, with a message that names neither the ranks nor the variable."""
    if all(d.allow_overlap for d in descriptions):
        return
    by_gpu: dict[tuple[str, str], list[GpuDescription]] = {}
    for d in descriptions:
        by_gpu.setdefault((d.host, d.pci_bus_id), []).append(d)
    shared = [ds for ds in by_gpu.values() if len(ds) > 1]
    if not shared:
        return
    where = "; ".join(f"ranks {', '.join(str(d.rank) for d in ds)} on {ds[0].host} {ds[0].pci_bus_id}" for ds in shared)
    missing = [d.rank for d in descriptions if not d.allow_overlap]
    raise UnsupportedError(
        f"sollat (rank {rank}): ranks share a GPU ({where}), and torch's symmetric memory accepts that only with "
        f"{ALLOW_OVERLAP_ENV}=1 in every process (not set on rank(s) {', '.join(map(str, missing))}). Ranks on one "
        "GPU are a test mode: their kernels time-slice, so it proves processes, memory sharing and faults, never "
        "speed. For one rank per GPU, give each process its own device (torch.cuda.set_device(LOCAL_RANK)).")


def _link(a: GpuDescription, b: GpuDescription) -> str:
    """The link of a same-host pair: what either side saw (where both saw it and they differ, the
    weaker link: a false refusal is an error message, a false acceptance a hang)."""
    seen = [dict(a.links).get(b.pci_bus_id, UNKNOWN), dict(b.links).get(a.pci_bus_id, UNKNOWN)]
    for kind in (NO_PEER, PCIE, NVLINK):
        if kind in seen:
            return kind
    return UNKNOWN


def _pair(a: GpuDescription, b: GpuDescription, allow_pcie: bool) -> str | None:
    """Why ``a`` and ``b`` cannot load/store each other's memory, or None when they can."""
    if a.fabric is not None and a.fabric == b.fabric:
        return None  # one multi-node NVLink clique (a host's own GPUs in it included)
    if a.host != b.host:
        if a.fabric is None or b.fabric is None:
            return "different hosts, not both in a multi-node NVLink fabric"
        return (f"different NVLink fabric cliques (cluster {a.fabric.cluster_uuid} clique {a.fabric.clique_id} "
                f"vs cluster {b.fabric.cluster_uuid} clique {b.fabric.clique_id})")
    if a.pci_bus_id == b.pci_bus_id:
        return None  # one GPU
    kind = _link(a, b)
    if kind == NVLINK or (kind == PCIE and allow_pcie):
        return None
    return {PCIE: f"same host, peer access over PCIe only ({ALLOW_PCIE_ENV}=1 on every rank accepts it)",
            NO_PEER: "same host, no peer access between them",
            UNKNOWN: "same host, link unknown (install nvidia-ml-py, or make every GPU of the host visible "
                     "to every rank, so the link can be seen)"}[kind]


def unreachable_pairs(descriptions: Sequence[GpuDescription]) -> list[Unreachable]:
    """Every pair of ranks (rank < peer) that cannot load/store each other's memory, with why.
    ``descriptions`` in rank order. PCIe pairs count only when every rank allows them."""
    allow = all(d.allow_pcie for d in descriptions)
    out = []
    for i, a in enumerate(descriptions):
        for b in descriptions[i + 1:]:
            why = _pair(a, b, allow)
            if why is not None:
                out.append(Unreachable(a.rank, b.rank, why))
    return out


def check_nvlink_domain(descriptions: Sequence[GpuDescription], rank: int) -> None:
    """Raises NotOneNVLinkDomainError (the same message on every rank) unless every pair of
    ``descriptions`` can load/store each other's memory."""
    bad = unreachable_pairs(descriptions)
    if not bad:
        return
    by_rank = {d.rank: d for d in descriptions}
    pairs = "; ".join(f"{by_rank[u.rank].where()} and {by_rank[u.peer].where()}: {u.why}" for u in bad)
    raise NotOneNVLinkDomainError(
        f"sollat (rank {rank}): the group is not one NVLink domain, {len(bad)} pair(s) of ranks cannot load/store "
        f"each other's memory: {pairs}. sollat needs every pair joined by NVLink: GPUs of one host (direct links "
        "or NVSwitch), or of one multi-node NVLink clique (same NVML fabric cluster UUID and clique id). "
        "Use torch.distributed's own collectives (NCCL) for such a group; "
        f"{ALLOW_PCIE_ENV}=1 on every rank accepts PCIe peer-to-peer pairs of one host.",
        rank=rank, pairs=[(u.rank, u.peer) for u in bad])


def checked_outside_domain(value: Any, where: str = "Communicator") -> str:
    if value not in OUTSIDE_DOMAIN:
        raise UnsupportedError(f"{where}: outside_domain must be one of {OUTSIDE_DOMAIN}, got {value!r}")
    return str(value)


def outside_domain_path(descriptions: Sequence[GpuDescription], rank: int, outside_domain: str) -> str:
    """``"sollat"`` when the group is one NVLink domain; otherwise ``"nccl"`` (every call of the
    group goes to torch.distributed, no symmetric memory is allocated) with ``outside_domain="nccl"``,
    NotOneNVLinkDomainError with ``"error"``."""
    checked_outside_domain(outside_domain)
    if not unreachable_pairs(descriptions):
        return SOLLAT
    if outside_domain == NCCL:
        return NCCL
    check_nvlink_domain(descriptions, rank)
    raise AssertionError("unreachable pairs were found")  # pragma: no cover


# ---- this rank's GPU (needs CUDA; NVML through nvidia-ml-py where installed) --------------------
class _FabricInfo(ctypes.Structure):
    """nvmlGpuFabricInfo_t as nvml.h declares it (some pynvml releases size theirs differently)."""

    _fields_ = [("clusterUuid", ctypes.c_ubyte * 16), ("status", ctypes.c_uint), ("cliqueId", ctypes.c_uint),
                ("state", ctypes.c_ubyte)]


# nvml.h's numbers (some pynvml releases spell NVML_P2P_CAPS_INDEX_READ as a tuple).
_FABRIC_STATE_COMPLETED = 3  # NVML_GPU_FABRIC_STATE_COMPLETED
_NVML_SUCCESS = 0
_P2P_CAPS_READ, _P2P_CAPS_NVLINK = 0, 2  # nvmlGpuP2PCapsIndex_t
_P2P_STATUS_OK = 0


def _nvml_fabric(nvml: Any, handle: Any) -> Fabric | None:
    info = _FabricInfo()
    try:
        nvml.nvmlDeviceGetGpuFabricInfo(handle, ctypes.byref(info))
    except Exception:  # no fabric on this GPU or driver
        return None
    uuid = bytes(info.clusterUuid).hex()
    if info.state != _FABRIC_STATE_COMPLETED or info.status != _NVML_SUCCESS or not uuid.strip("0"):
        return None
    return Fabric(uuid, int(info.cliqueId))


def _nvml_links(nvml: Any, mine: Any, my_pci: str) -> dict[str, str]:
    """The link to every other GPU NVML sees on this host (CUDA_VISIBLE_DEVICES hides none)."""
    out = {}
    for i in range(nvml.nvmlDeviceGetCount()):
        h = nvml.nvmlDeviceGetHandleByIndex(i)
        p = nvml.nvmlDeviceGetPciInfo(h)
        pci = pci_id(p.domain, p.bus, p.device)
        if pci == my_pci:
            continue
        if nvml.nvmlDeviceGetP2PStatus(mine, h, _P2P_CAPS_NVLINK) == _P2P_STATUS_OK:
            out[pci] = NVLINK
        elif nvml.nvmlDeviceGetP2PStatus(mine, h, _P2P_CAPS_READ) == _P2P_STATUS_OK:
            out[pci] = PCIE
        else:
            out[pci] = NO_PEER
    return out


def _cuda_links(device: int, pcis: dict[int, str]) -> dict[str, str]:
    """Peer access to every other visible GPU; native peer atomics stand for NVLink (PCIe has none)."""
    import torch

    out = {}
    for j, pci in pcis.items():
        if j != device:
            peer = torch.cuda.can_device_access_peer(device, j)
            out[pci] = (NVLINK if _native_atomics(device, j) else PCIE) if peer else NO_PEER
    return out


def _native_atomics(a: int, b: int) -> bool:
    try:
        from cuda.bindings import driver

        attr = driver.CUdevice_P2PAttribute.CU_DEVICE_P2P_ATTRIBUTE_NATIVE_ATOMIC_SUPPORTED
        err, value = driver.cuDeviceGetP2PAttribute(attr, a, b)
        return err == driver.CUresult.CUDA_SUCCESS and bool(value)
    except Exception:
        return False


def _nvml_view(pci: str) -> tuple[Fabric | None, dict[str, str]]:
    """NVML's fabric info and links of the GPU at ``pci`` ((None, {}) without nvidia-ml-py or a usable NVML)."""
    try:
        import pynvml as nvml

        nvml.nvmlInit()
    except Exception:
        return None, {}
    try:
        handle = nvml.nvmlDeviceGetHandleByPciBusId(pci)
        fabric = _nvml_fabric(nvml, handle)
        try:
            links = _nvml_links(nvml, handle, pci)
        except Exception:  # CUDA's view of the links stands
            links = {}
        return fabric, links
    except Exception:  # NVML present but unusable: CUDA's view stands
        return None, {}
    finally:
        nvml.nvmlShutdown()


def describe_local(device: int, rank: int) -> GpuDescription:
    """This rank's GPU ``device`` (a CUDA index of this process): host, PCI bus id, fabric and links
    (NVML's where it has them, else CUDA's)."""
    import torch

    pcis = {}
    for j in range(torch.cuda.device_count()):
        p = torch.cuda.get_device_properties(j)
        pcis[j] = pci_id(p.pci_domain_id, p.pci_bus_id, p.pci_device_id)
    fabric, nvml_links = _nvml_view(pcis[device])
    links = {**_cuda_links(device, pcis), **nvml_links}
    return GpuDescription(rank, socket.gethostname(), device, pcis[device], fabric, tuple(sorted(links.items())),
                          allow_pcie_from_env(), allow_overlap_from_env())


def gather_descriptions(group: Any, device: int) -> list[GpuDescription]:
    """Every rank's ``describe_local``, in rank order (collective over ``group``)."""
    import torch.distributed as dist

    mine = describe_local(device, dist.get_rank(group))
    out: list[Any] = [None] * dist.get_world_size(group)
    dist.all_gather_object(out, mine, group=group)
    return out


def check_group(group: Any, device: int, outside_domain: str) -> str:
    """Communicator's construction step (collective, before any symmetric memory): ``"sollat"``,
    ``"nccl"`` or NotOneNVLinkDomainError on every rank alike (``outside_domain_path``)."""
    import torch.distributed as dist

    checked_outside_domain(outside_domain)
    descriptions = gather_descriptions(group, device)
    check_shared_gpus(descriptions, dist.get_rank(group))
    return outside_domain_path(descriptions, dist.get_rank(group), outside_domain)
