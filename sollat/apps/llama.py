"""A Llama-style decoder, sharded Megatron-style over tensor-parallel ranks, for decode benchmarks.

Shapes default to Llama-3.1-70B; the weights are random (nothing is downloaded) and the KV cache is
prefilled with random keys and values, so the numbers it produces mean nothing, but every kernel
moves the same bytes as the real model.

Sharding (Megatron-LM):

* attention: the fused QKV projection is split by KV-head group (column parallel), the output
  projection by the same heads (row parallel); each rank attends with its own heads over its own part
  of the KV cache and ends with a partial sum of the hidden state -> AllReduce;
* MLP: gate and up projections split by columns, the down projection by rows -> AllReduce;
* RMSNorm weights and the token embedding are replicated; the LM head is split over the vocabulary,
  and greedy sampling picks the token with two small AllReduces (``max`` of the shard maxima, then
  ``min`` of the indices that reach it, so ties go to the lowest index as in ``torch.argmax``).

A decode step therefore makes ``2 * n_layers`` AllReduces of ``batch * hidden`` elements, plus two of
``batch`` fp32 values. Each of the ``2 * n_layers`` is followed by the residual add and the next
RMSNorm (the next sublayer's, or the final norm after the last layer); a backend that fuses them
(``fused.FusedRMSNormBackend``, the ``sollat_fused`` spec) does all three in one call.

Weights are generated in blocks, one per KV head, from seeds that name the block; rank r of TP holds
blocks ``r*n_kv/tp .. (r+1)*n_kv/tp - 1``. The model is therefore the same for every TP that divides
the KV-head count, and a TP-1 instance is the unsharded reference of a TP-4 one.

Activations of rank i: ``x`` (the residual stream, replicated) is ``[batch, hidden]``; the KV cache of
one layer is ``[batch, local KV heads, max_len, head_dim]``.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

import torch
import torch.nn.functional as F

from .backend_base import AllReduceBackend
from .fused import FusedRMSNormBackend

GIB = 1 << 30


@dataclass(frozen=True)
class LlamaConfig:
    hidden: int = 8192
    n_heads: int = 64
    n_kv_heads: int = 8
    head_dim: int = 128
    ffn: int = 28672
    vocab: int = 128256
    n_layers: int = 80
    norm_eps: float = 1e-5
    rope_theta: float = 500000.0
    # Llama-3.1 frequency scaling (factor 8, low/high frequency factors 1/4, original context 8192).
    rope_llama3_scaling: bool = True

    def check(self, tp: int) -> None:
        """Raise ValueError unless this shape can be split over ``tp`` ranks."""
        if tp < 1:
            raise ValueError(f"tensor-parallel size must be >= 1, got {tp}")
        if self.n_heads % self.n_kv_heads:
            raise ValueError(f"{self.n_heads} query heads do not split into {self.n_kv_heads} KV groups")
        if self.n_kv_heads % tp:
            raise ValueError(f"TP {tp} must divide the {self.n_kv_heads} KV heads")
        for name, value in (("ffn", self.ffn), ("vocab", self.vocab)):
            if value % self.n_kv_heads:
                raise ValueError(f"{name} {value} must be divisible by the {self.n_kv_heads} KV heads")
        if self.head_dim % 2:
            raise ValueError(f"head_dim {self.head_dim} must be even for RoPE")
        if self.vocab >= 1 << 24:
            raise ValueError("vocab must be < 2**24 (token ids travel as fp32 in greedy sampling)")
        if self.n_layers < 1:
            raise ValueError(f"n_layers must be >= 1, got {self.n_layers}")

    @property
    def group(self) -> int:
        """Query heads per KV head."""
        return self.n_heads // self.n_kv_heads

    def params_per_layer(self) -> int:
        d, hd = self.hidden, self.head_dim
        return d * (self.n_heads + 2 * self.n_kv_heads) * hd + self.n_heads * hd * d + 3 * d * self.ffn

    def params(self) -> int:
        return self.n_layers * (self.params_per_layer() + 2 * self.hidden) + 2 * self.vocab * self.hidden + self.hidden


PRESETS: dict[str, LlamaConfig] = {
    "llama3.1-70b": LlamaConfig(),
    # Same structure, tiny sizes: CPU tests and smoke runs.
    "tiny": LlamaConfig(hidden=64, n_heads=8, n_kv_heads=4, head_dim=16, ffn=192, vocab=512, n_layers=2),
}


def preset(name: str, n_layers: int | None = None) -> LlamaConfig:
    try:
        cfg = PRESETS[name]
    except KeyError:
        raise ValueError(f"unknown model {name!r}; presets: {', '.join(PRESETS)}") from None
    return cfg if n_layers is None else replace(cfg, n_layers=n_layers)


# --------------------------------------------------------------------------------------------------
# Seeded random tensors: the value of a block depends only on (seed, name, indices), never on TP.


def block_seed(seed: int, *parts: object) -> int:
    digest = hashlib.blake2b(repr((seed, *parts)).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") & ((1 << 63) - 1)


def seeded_randn(shape: Sequence[int], seed: int, *, device: torch.device, std: float = 1.0,
                 mean: float = 0.0) -> torch.Tensor:
    """fp32 normal samples from a generator seeded with ``seed`` on ``device``."""
    gen = torch.Generator(device=device)
    gen.manual_seed(seed)
    out = torch.randn(tuple(shape), generator=gen, device=device, dtype=torch.float32)
    if std != 1.0:
        out.mul_(std)
    if mean != 0.0:
        out.add_(mean)
    return out


# --------------------------------------------------------------------------------------------------
# Weights


@dataclass
class ReplicatedWeights:
    """Held once per process: token embedding and RMSNorm weights."""

    embed: torch.Tensor  # [vocab, hidden]
    attn_norm: list[torch.Tensor]  # per layer [hidden]
    mlp_norm: list[torch.Tensor]
    final_norm: torch.Tensor

    @classmethod
    def generate(cls, cfg: LlamaConfig, *, seed: int, device: torch.device,
                 dtype: torch.dtype) -> ReplicatedWeights:
        rows = cfg.vocab // cfg.n_kv_heads
        embed = torch.empty(cfg.vocab, cfg.hidden, device=device, dtype=dtype)
        for b in range(cfg.n_kv_heads):
            embed[b * rows:(b + 1) * rows].copy_(
                seeded_randn((rows, cfg.hidden), block_seed(seed, "embed", b), device=device))

        def norm(*parts: object) -> torch.Tensor:
            return seeded_randn((cfg.hidden,), block_seed(seed, *parts), device=device, std=0.1,
                                mean=1.0).to(dtype)

        return cls(embed=embed,
                   attn_norm=[norm("attn_norm", layer) for layer in range(cfg.n_layers)],
                   mlp_norm=[norm("mlp_norm", layer) for layer in range(cfg.n_layers)],
                   final_norm=norm("final_norm"))


@dataclass
class ShardWeights:
    """One tensor-parallel rank's slice of every sharded matrix (``F.linear`` layout ``[out, in]``)."""

    rank: int
    wqkv: list[torch.Tensor]  # [(local q heads + 2 * local kv heads) * head_dim, hidden]
    wo: list[torch.Tensor]  # [hidden, local q heads * head_dim]
    w13: list[torch.Tensor]  # [2 * local ffn, hidden]: gate rows, then up rows
    w2: list[torch.Tensor]  # [hidden, local ffn]
    lm_head: torch.Tensor  # [vocab / tp, hidden]

    @classmethod
    def generate(cls, cfg: LlamaConfig, tp: int, rank: int, *, seed: int, device: torch.device,
                 dtype: torch.dtype) -> ShardWeights:
        cfg.check(tp)
        d, hd, grp = cfg.hidden, cfg.head_dim, cfg.group
        nb = cfg.n_kv_heads // tp  # blocks on this rank
        blocks = range(rank * nb, (rank + 1) * nb)
        fb = cfg.ffn // cfg.n_kv_heads  # ffn columns per block
        vb = cfg.vocab // cfg.n_kv_heads  # vocabulary rows per block
        # Residual branches are scaled by 1/sqrt(2 L) so the residual stream stays O(1) in a random model.
        branch = 1.0 / math.sqrt(2 * cfg.n_layers)

        def fill(dst: torch.Tensor, dim: int, size: int, std: float, *parts: object) -> None:
            """Write one block per KV head along ``dim`` of ``dst`` (a block of ``size`` rows/columns)."""
            for j, b in enumerate(blocks):
                shape = list(dst.shape)
                shape[dim] = size
                dst.narrow(dim, j * size, size).copy_(
                    seeded_randn(shape, block_seed(seed, *parts, b), device=device, std=std))

        def empty(*shape: int) -> torch.Tensor:
            return torch.empty(shape, device=device, dtype=dtype)

        wqkv, wo, w13, w2 = [], [], [], []
        for layer in range(cfg.n_layers):
            q_rows, kv_rows = nb * grp * hd, nb * hd
            qkv = empty(q_rows + 2 * kv_rows, d)
            fill(qkv.narrow(0, 0, q_rows), 0, grp * hd, d ** -0.5, "wq", layer)
            fill(qkv.narrow(0, q_rows, kv_rows), 0, hd, d ** -0.5, "wk", layer)
            fill(qkv.narrow(0, q_rows + kv_rows, kv_rows), 0, hd, d ** -0.5, "wv", layer)
            o = empty(d, q_rows)
            fill(o, 1, grp * hd, branch * (cfg.n_heads * hd) ** -0.5, "wo", layer)
            gate_up = empty(2 * nb * fb, d)
            fill(gate_up.narrow(0, 0, nb * fb), 0, fb, d ** -0.5, "w1", layer)
            fill(gate_up.narrow(0, nb * fb, nb * fb), 0, fb, d ** -0.5, "w3", layer)
            down = empty(d, nb * fb)
            fill(down, 1, fb, branch * cfg.ffn ** -0.5, "w2", layer)
            wqkv.append(qkv)
            wo.append(o)
            w13.append(gate_up)
            w2.append(down)
        head = empty(nb * vb, d)
        fill(head, 0, vb, d ** -0.5, "lm_head")
        return cls(rank=rank, wqkv=wqkv, wo=wo, w13=w13, w2=w2, lm_head=head)


@dataclass
class KVCache:
    """One rank's cache: per layer ``[batch, local KV heads, max_len, head_dim]``, K and V."""

    k: list[torch.Tensor]
    v: list[torch.Tensor]

    @classmethod
    def generate(cls, cfg: LlamaConfig, tp: int, rank: int, *, batch: int, context: int, max_len: int,
                 seed: int, device: torch.device, dtype: torch.dtype) -> KVCache:
        """Positions ``0..context-1`` hold random keys and values (a synthetic prefill); the rest are 0."""
        nb = cfg.n_kv_heads // tp
        ks, vs = [], []
        for layer in range(cfg.n_layers):
            pair = []
            for name in ("k", "v"):
                cache = torch.zeros(batch, nb, max_len, cfg.head_dim, device=device, dtype=dtype)
                for j in range(nb):
                    head = rank * nb + j
                    for row in range(batch):
                        cache[row, j, :context].copy_(seeded_randn(
                            (context, cfg.head_dim), block_seed(seed, name, layer, head, row), device=device))
                pair.append(cache)
            ks.append(pair[0])
            vs.append(pair[1])
        return cls(k=ks, v=vs)


# --------------------------------------------------------------------------------------------------
# Layers


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(dim=-1, keepdim=True) + eps)
    return (xf * weight.float()).to(x.dtype)


def rope_inv_freq(cfg: LlamaConfig) -> torch.Tensor:
    """Inverse frequencies, with Llama-3.1's scaling when the config asks for it (fp64, CPU)."""
    inv = 1.0 / (cfg.rope_theta ** (torch.arange(0, cfg.head_dim, 2, dtype=torch.float64) / cfg.head_dim))
    if not cfg.rope_llama3_scaling:
        return inv
    factor, low, high, old_ctx = 8.0, 1.0, 4.0, 8192.0
    wavelen = 2 * math.pi / inv
    scaled = torch.where(wavelen > old_ctx / low, inv / factor, inv)
    smooth = (old_ctx / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = (wavelen >= old_ctx / high) & (wavelen <= old_ctx / low)
    return torch.where(medium, smoothed, scaled)


def rope_tables(cfg: LlamaConfig, max_len: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """``cos, sin``: fp32 ``[max_len, head_dim]`` (each frequency twice, rotate-half layout)."""
    t = torch.arange(max_len, dtype=torch.float64)
    freqs = torch.outer(t, rope_inv_freq(cfg))
    emb = torch.cat([freqs, freqs], dim=-1)
    return emb.cos().float().to(device), emb.sin().float().to(device)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate ``x [batch, heads, head_dim]`` (fp32 result) by ``cos, sin [1, head_dim]``."""
    xf = x.float()
    half = xf.shape[-1] // 2
    rotated = torch.cat([-xf[..., half:], xf[..., :half]], dim=-1)
    return xf * cos + rotated * sin


@dataclass
class StepOutput:
    logits: list[torch.Tensor]  # per local rank: [batch, vocab / tp], model dtype
    next_tokens: torch.Tensor  # [batch] int64, greedy


class TPDecoder:
    """The model and KV cache of the tensor-parallel ranks ``ranks`` (all of them, or this process's one).

    ``step(tokens, pos, backend)`` runs one decode step: ``tokens [batch]`` int64 at position
    ``pos [1]`` int64 (a device tensor, so a CUDA graph can replay the step at the next position). It
    writes the new keys and values at ``pos`` and returns the logit shards and the greedy tokens. All
    AllReduces go through ``backend``, one call per sync point for all local ranks.
    """

    def __init__(self, cfg: LlamaConfig, *, tp: int, ranks: Sequence[int], batch: int, context: int,
                 max_len: int, device: torch.device | str, dtype: torch.dtype, seed: int = 0) -> None:
        cfg.check(tp)
        if not ranks or any(not 0 <= r < tp for r in ranks):
            raise ValueError(f"ranks {list(ranks)} must be in 0..{tp - 1}")
        if batch < 1 or context < 1 or max_len <= context:
            raise ValueError(f"need batch >= 1, context >= 1 and max_len > context "
                             f"(got {batch}, {context}, {max_len})")
        self.cfg = cfg
        self.tp = tp
        self.ranks = tuple(ranks)
        self.batch = batch
        self.context = context
        self.max_len = max_len
        self.device = torch.device(device)
        self.dtype = dtype
        self.shared = ReplicatedWeights.generate(cfg, seed=seed, device=self.device, dtype=dtype)
        self.shards = [ShardWeights.generate(cfg, tp, r, seed=seed, device=self.device, dtype=dtype)
                       for r in self.ranks]
        self.caches = [KVCache.generate(cfg, tp, r, batch=batch, context=context, max_len=max_len,
                                        seed=seed, device=self.device, dtype=dtype) for r in self.ranks]
        self.cos, self.sin = rope_tables(cfg, max_len, self.device)
        self.positions = torch.arange(max_len, device=self.device)
        self.vocab_local = cfg.vocab // tp
        self.n_kv_local = cfg.n_kv_heads // tp
        self.n_q_local = cfg.n_heads // tp

    # The step. Shapes are static and nothing reads back to the host, so it can be graph-captured.
    def step(self, tokens: torch.Tensor, pos: torch.Tensor, backend: AllReduceBackend) -> StepOutput:
        cfg = self.cfg
        cos = self.cos.index_select(0, pos)
        sin = self.sin.index_select(0, pos)
        invalid = self.positions > pos  # positions not yet written are masked out
        x0 = F.embedding(tokens, self.shared.embed)
        xs = [x0 for _ in self.ranks]  # the residual stream
        hs = [rms_norm(x, self.shared.attn_norm[0], cfg.norm_eps) for x in xs]  # the normed input of a layer
        norms = self.shared
        for layer in range(cfg.n_layers):
            partial = [self._attention(i, layer, h, cos, sin, pos, invalid) for i, h in enumerate(hs)]
            hs, xs = self._add_norm(backend, partial, xs, norms.mlp_norm[layer])
            partial = [self._mlp(i, layer, h) for i, h in enumerate(hs)]
            after = norms.attn_norm[layer + 1] if layer + 1 < cfg.n_layers else norms.final_norm
            hs, xs = self._add_norm(backend, partial, xs, after)
        logits = [F.linear(h, self.shards[i].lm_head) for i, h in enumerate(hs)]
        return StepOutput(logits=logits, next_tokens=self._greedy(logits, backend))

    def _add_norm(self, backend: AllReduceBackend, partial: list[torch.Tensor], xs: list[torch.Tensor],
                  weight: torch.Tensor) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """A fusion point: ``(rms_norm(x + allreduce(partial)) * weight, x + allreduce(partial))`` per
        local rank; one ``all_reduce_rmsnorm`` call when the backend fuses, else AllReduce, add, norm."""
        if isinstance(backend, FusedRMSNormBackend):
            return backend.all_reduce_rmsnorm(partial, xs, weight, self.cfg.norm_eps)
        xs = [x + y for x, y in zip(xs, backend.all_reduce(partial), strict=True)]
        return [rms_norm(x, weight, self.cfg.norm_eps) for x in xs], xs

    def _attention(self, i: int, layer: int, h: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                   pos: torch.Tensor, invalid: torch.Tensor) -> torch.Tensor:
        cfg, b, hd = self.cfg, self.batch, self.cfg.head_dim
        qkv = F.linear(h, self.shards[i].wqkv[layer])
        q, k, v = qkv.split([self.n_q_local * hd, self.n_kv_local * hd, self.n_kv_local * hd], dim=-1)
        # The softmax scale is folded into q while it is still fp32.
        q = (apply_rope(q.view(b, self.n_q_local, hd), cos, sin) * hd ** -0.5).to(self.dtype)
        k = apply_rope(k.view(b, self.n_kv_local, hd), cos, sin).to(self.dtype)
        k_cache, v_cache = self.caches[i].k[layer], self.caches[i].v[layer]
        k_cache.index_copy_(2, pos, k.unsqueeze(2))
        v_cache.index_copy_(2, pos, v.reshape(b, self.n_kv_local, 1, hd))
        # Grouped-query attention as two batched GEMMs over [batch, kv head]: q [.., group, hd].
        qg = q.view(b, self.n_kv_local, cfg.group, hd)
        scores = torch.matmul(qg, k_cache.transpose(-1, -2))  # [b, kv, group, max_len]
        scores.masked_fill_(invalid, float("-inf"))
        probs = torch.softmax(scores, dim=-1)  # fp32 accumulation inside, model-dtype result
        out = torch.matmul(probs, v_cache).reshape(b, self.n_q_local * hd)
        return F.linear(out, self.shards[i].wo[layer])

    def _mlp(self, i: int, layer: int, h: torch.Tensor) -> torch.Tensor:
        gate, up = F.linear(h, self.shards[i].w13[layer]).chunk(2, dim=-1)
        return F.linear(F.silu(gate) * up, self.shards[i].w2[layer])

    def _greedy(self, logits: list[torch.Tensor], backend: AllReduceBackend) -> torch.Tensor:
        maxima, where = [], []
        for lg in logits:
            m, j = lg.float().max(dim=-1)
            maxima.append(m)
            where.append(j)
        top = backend.all_reduce([m.clone() for m in maxima], op="max")
        candidates = [
            torch.where(m == t, (j + r * self.vocab_local).float(), float(self.cfg.vocab))
            for m, t, j, r in zip(maxima, top, where, self.ranks, strict=True)
        ]
        index = backend.all_reduce(candidates, op="min")[0]
        return index.clamp_(max=self.cfg.vocab - 1).long()


def full_logits(logits: Sequence[torch.Tensor]) -> torch.Tensor:
    """Concatenate the logit shards of all ranks (rank order) into ``[batch, vocab]`` fp32."""
    return torch.cat([lg.float() for lg in logits], dim=-1)
