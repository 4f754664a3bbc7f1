"""How much device memory a decode of the model in ``llama.py`` takes (:func:`estimate_memory`,
:func:`max_context`) and how much there is (:func:`available_memory`, :func:`host_memory`)."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass

import torch

from .llama import GIB, LlamaConfig


@dataclass(frozen=True)
class MemoryEstimate:
    """Bytes one process allocates on its device (``n_local`` ranks' shards)."""

    weights: int
    kv_cache: int
    activations: int
    workspace: int

    @property
    def total(self) -> int:
        return self.weights + self.kv_cache + self.activations + self.workspace

    def describe(self) -> str:
        parts = ", ".join(f"{name} {getattr(self, name) / GIB:.2f}"
                          for name in ("weights", "kv_cache", "activations", "workspace"))
        return f"{self.total / GIB:.2f} GiB ({parts})"


# cuBLAS workspaces, NCCL and sollat buffers, allocator rounding: a fixed allowance.
FIXED_WORKSPACE = 3 * GIB


def estimate_memory(cfg: LlamaConfig, *, tp: int, n_local: int, batch: int, max_len: int,
                    dtype: torch.dtype, graphs: int = 2) -> MemoryEstimate:
    """What a process holding ``n_local`` of ``tp`` ranks needs, with ``graphs`` captured steps alive."""
    cfg.check(tp)
    es = torch.empty((), dtype=dtype).element_size()
    d, hd = cfg.hidden, cfg.head_dim
    sharded = cfg.n_layers * cfg.params_per_layer() // tp + cfg.vocab * d // tp
    replicated = cfg.vocab * d + (2 * cfg.n_layers + 1) * d
    weights = (n_local * sharded + replicated) * es
    kv_local = cfg.n_kv_heads // tp
    kv = n_local * cfg.n_layers * 2 * batch * kv_local * max_len * hd * es
    # Largest live intermediates of one step on one rank: the attention scores and probabilities,
    # the logit shard (+ its fp32 copy), the MLP activations, the rotary tables.
    q_local = cfg.n_heads // tp
    step = (2 * batch * q_local * max_len * es + batch * cfg.vocab // tp * (es + 8)
            + 4 * batch * cfg.ffn // tp * es + 16 * batch * d * 4)
    activations = graphs * n_local * step + 2 * max_len * hd * 4 + max_len * 8
    # Transient fp32 block while generating weights, plus the fixed allowance.
    block = max(cfg.ffn // cfg.n_kv_heads * d, cfg.vocab // cfg.n_kv_heads * d, max_len * hd) * 4
    return MemoryEstimate(weights=weights, kv_cache=kv, activations=activations,
                          workspace=block + FIXED_WORKSPACE)


def max_context(cfg: LlamaConfig, *, tp: int, n_local: int, batch: int, extra_tokens: int,
                dtype: torch.dtype, budget: int) -> int:
    """Largest prefilled context (tokens per sequence) whose estimate fits in ``budget`` bytes; 0 if none."""
    def fits(ctx: int) -> bool:
        return estimate_memory(cfg, tp=tp, n_local=n_local, batch=batch, max_len=ctx + extra_tokens,
                               dtype=dtype).total <= budget

    if not fits(1):
        return 0
    lo, hi = 1, 1
    while fits(hi * 2) and hi < 1 << 26:
        hi *= 2
    hi *= 2
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid)
    return lo


def largest_fitting(fits: Callable[[int], bool], hi: int) -> int:
    """Largest ``x`` in ``[1, hi]`` with ``fits(x)``, for ``fits`` true up to some point; 0 if none."""
    lo = 0
    while lo < hi:
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid - 1)
    return lo


def host_memory(meminfo: str = "/proc/meminfo", cgroup: str = "/sys/fs/cgroup") -> tuple[int, int]:
    """(available, total) bytes of host RAM: ``MemAvailable``/``MemTotal`` of /proc/meminfo (else
    sysconf), lowered to what a cgroup-v2 memory limit leaves, as in a container."""
    try:
        with open(meminfo) as f:
            kib = {k.strip(): int(v.split()[0]) for k, v in (line.split(":", 1) for line in f if ":" in line)}
        avail, total = kib["MemAvailable"] * 1024, kib["MemTotal"] * 1024
    except (OSError, KeyError, ValueError, IndexError):
        page = os.sysconf("SC_PAGE_SIZE")
        avail, total = os.sysconf("SC_AVPHYS_PAGES") * page, os.sysconf("SC_PHYS_PAGES") * page
    try:
        with open(os.path.join(cgroup, "memory.max")) as f:
            limit = int(f.read())
        with open(os.path.join(cgroup, "memory.current")) as f:
            used = int(f.read())
        avail, total = min(avail, max(0, limit - used)), min(total, limit)
    except (OSError, ValueError):  # no cgroup v2 here, or no limit ("max")
        pass
    return avail, total


def available_memory(device: torch.device) -> tuple[int, int]:
    """(free, total) bytes this process can allocate on ``device``: the GPU's, or the host RAM."""
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)
    return host_memory()
