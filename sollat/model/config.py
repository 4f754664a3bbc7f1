"""What one model run is about: the ranks, the calls, the algorithm, the protocol, the switches.

A :class:`Config` fully determines the programs every modelled thread runs (see
:mod:`sollat.model.algorithms`); the scheduler only chooses the order in which their memory
operations happen. Mutations (:class:`Mutation`) are planted protocol bugs; the checker must
find a counterexample for each of them (``tests/cpu/test_model.py``).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field, replace


class Mutation(enum.Enum):
    """A planted protocol bug. Each names the device rule it breaks."""

    #: Parity is always 0: one copy of every line instead of two (``LLBuffer::line`` ignores
    #: ``epoch & 1``). Breaks the double-buffering argument of one-shot.
    SINGLE_BUFFER = "single-buffer"
    #: The sentinel receiver never stores the sentinel back (``ProtoSentinel::reset`` dropped).
    SKIP_SENTINEL_RESET = "skip-sentinel-reset"
    #: The LL flag carries no epoch, only the call signature (``ProtoLL::flag`` ignores epoch):
    #: a line still holding the previous use of that parity looks fresh.
    REUSED_FLAG = "reused-flag"
    #: The lazy fence before the first send after a reset/zeroing is dropped
    #: (``LLBuffer`` send without ``fence_acq_rel_gpu``): the reset may be performed after the
    #: next send, i.e. after the peer already got the credit to write the line again.
    RESET_AFTER_SEND = "reset-after-send"
    #: 128-byte adds are not line-atomic (the 8 lanes' 16-byte adds land independently, as for adds
    #: issued on one GPU) while the kernel relies on line atomicity (``SOLLAT_LL128_SPLIT=0``).
    TORN_LL128 = "torn-ll128"
    #: The LL128 owner never zeroes its accumulator line after reading it.
    SKIP_LL128_ZERO = "skip-ll128-zero"
    #: The kernel boundary does not order a kernel's stores before the next kernel's
    #: (e.g. touching scratch before ``griddepcontrol.wait`` under PDL).
    NO_BOUNDARY_ORDER = "no-boundary-order"
    #: Epoch counters are not written back at kernel end (``LLBuffer::commit`` skipped): the next
    #: call starts again from the epochs the previous one started from.
    SKIP_COMMIT = "skip-commit"
    #: Split-mode LL128 without the fence between the data adds and the counter add.
    SPLIT_NO_FENCE = "split-no-fence"
    #: Two-shot skips the lines of a chunk that lie past the end of the message instead of sending
    #: padding, while the channel's epoch still advances: a (sender, receiver) pair then skips
    #: epochs, and an LL line may hold e-4, e-6, ... (caught with few epoch bits).
    UNPADDED_CHUNKS = "unpadded-chunks"


ALGORITHMS = ("oneshot", "twoshot", "ll128")
PROTOCOLS = ("ll", "sentinel")


@dataclass(frozen=True)
class Config:
    """One modelled scenario: every rank makes the same sequence of AllReduce calls.

    Sizes are in *model lines*. A model thread stands for a bundle of
    ``layout.MAX_THREADS // threads`` real threads that always act together (see
    :func:`sollat.model.rules.model_geometry`), so the geometry of every call is the one
    :func:`sollat.layout.plan` chooses, at bundle granularity.
    """

    algorithm: str = "oneshot"  # "oneshot" | "twoshot" | "ll128"
    protocol: str = "ll"  # "ll" | "sentinel"; LL128's all-gather is always LL
    nranks: int = 2
    calls: tuple[int, ...] = (1, 2)  # model lines per call (message for one-shot, whole message for two-shot)
    threads: int = 1  # model threads per block at full width; divides MAX_THREADS // WARP
    max_blocks: int = 1
    max_slots: int = 1
    epoch_bits: int = 32  # SOLLAT_EPOCH_BITS
    #: Hardware assumption: a warp's 128-byte line add lands at the owner as one unit (NVLink).
    ll128_line_atomic: bool = True
    #: ``SOLLAT_LL128_SPLIT=1``: data lanes add with counter 0, fence, then a separate counter add.
    #: Correct without line atomicity.
    ll128_split: bool = False
    ll128_lines: int = 2  # lines per warp (device: 4)
    ll128_lanes: int = 2  # 16-byte lanes per line (device: 8)
    mutations: frozenset[Mutation] = field(default_factory=frozenset)
    name: str = ""

    def __post_init__(self) -> None:
        if self.algorithm not in ALGORITHMS:
            raise ValueError(f"algorithm must be one of {ALGORITHMS}, got {self.algorithm!r}")
        if self.protocol not in PROTOCOLS:
            raise ValueError(f"protocol must be one of {PROTOCOLS}, got {self.protocol!r}")
        if not 2 <= self.nranks <= 8:
            raise ValueError("nranks must be in 2..8")
        if not self.calls or min(self.calls) < 1:
            raise ValueError("calls must be a non-empty tuple of positive sizes")
        if self.epoch_bits < 1 or self.epoch_bits > 32:
            raise ValueError("epoch_bits must be in 1..32")
        if self.ll128_lines < 1 or self.ll128_lanes < 1:
            raise ValueError("ll128_lines and ll128_lanes must be positive")

    @property
    def proto(self) -> str:
        """Protocol of the LLBuffer phases (LL128's all-gather is LL)."""
        return "ll" if self.algorithm == "ll128" else self.protocol

    @property
    def line_atomic(self) -> bool:
        return self.ll128_line_atomic and Mutation.TORN_LL128 not in self.mutations

    def has(self, m: Mutation) -> bool:
        return m in self.mutations

    def with_mutation(self, *ms: Mutation) -> Config:
        return replace(self, mutations=self.mutations | frozenset(ms))

    def label(self) -> str:
        if self.name:
            base = self.name
        else:
            proto = "ll128" if self.algorithm == "ll128" else self.protocol
            base = f"{self.algorithm}-{proto}-{self.nranks}r{self.threads}t"
        extra = []
        if self.epoch_bits != 32:
            extra.append(f"bits={self.epoch_bits}")
        if self.algorithm == "ll128" and not self.ll128_line_atomic:
            extra.append("torn")
        if self.algorithm == "ll128" and self.ll128_split:
            extra.append("split")
        extra += sorted(m.value for m in self.mutations)
        calls = ",".join(map(str, self.calls))
        return f"{base}[{calls}]" + (" " + " ".join(extra) if extra else "")
