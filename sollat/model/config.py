"""What one model run is about: the ranks, the calls, the algorithm, the protocol, the switches.

A :class:`Config` fully determines the programs every modelled thread runs (see
:mod:`sollat.model.algorithms`); the scheduler only chooses the order in which their memory
operations happen (and, on the fault path, which threads give up: then a rank's next call runs
from the epochs its threads actually committed). Mutations (:class:`Mutation`) are planted
protocol bugs; the checker must find a counterexample for each of them (``tests/cpu/test_model.py``,
``tests/cpu/test_model_faults.py``). Faults (:class:`Fault`) are the device's test hooks.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field, replace

from sollat.device import layout


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
    #: The fences that give a line back are dropped: the reuse fence between a receive and the
    #: next send (``LLBuffer::beforeSend``) and LL128's fence after zeroing. A reset or zeroing may
    #: be performed after the next send, i.e. after the peer already got the credit to write the
    #: line again (and, in the PTX mode, the send may pass the poll itself).
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
    #: Fault path: a thread that records a fault writes only its own rank's record
    #: (``FaultSink::raise`` without the loop over ``peer_scratch``).
    NO_PROPAGATION = "no-propagation"
    #: Fault path: a kernel runs although its rank's record holds a fault (``refused()`` dropped).
    NO_REFUSAL = "no-refusal"
    #: Fault path: a thread that gives up or refuses leaves the outputs it has not written as they
    #: were (``poison_from`` dropped).
    NO_POISON = "no-poison"
    #: Fault path: a thread that gives up still stores the epochs it advanced (``commit()`` on the
    #: fault path).
    COMMIT_AFTER_GIVE_UP = "commit-after-give-up"
    #: Fault path: the record code is loaded before ``griddepcontrol.wait`` (PDL): a kernel reads
    #: the record as it was when the previous kernel of its rank started.
    EARLY_PRIOR = "early-prior"
    #: An LL line of 8 bytes of payload and one 8-byte flag in one 16-byte store, instead of one flag
    #: per 8-byte word. Harmless if the store is never torn (``memory="strong"``); PTX performs a
    #: vector access as its 8-byte parts in any order, so the flag word may be seen before the
    #: payload word.
    SINGLE_FLAG_LINE = "single-flag-line"
    #: The fence between a completed receive and the next send of a buffer (``LLBuffer``'s
    #: ``received`` flag, ``releaseReceivesWith``, LL128's fence before the adds) only after sentinel
    #: resets: no fence after an LL receive, none at the top of a pass or before LL128's next adds.
    #: The next send then rests on the control dependency on the poll, which PTX does not order.
    NO_REUSE_FENCE = "no-reuse-fence"
    #: Every protocol fence at ``.gpu`` scope (``fence<Scope::Gpu>`` literals) although the ranks
    #: are on different GPUs (``Config.ranks="real"``): PTX's fences then order nothing for a peer.
    GPU_FENCE = "gpu-fence"
    #: Sentinel buffers without signature words: a peer that made another call with the same line
    #: count is summed, not reported.
    NO_SIGNATURE_LINE = "no-signature-line"
    #: Sentinel signature words in a ring: stored only to rank + 1 and polled only from rank - 1. A
    #: rank whose ring neighbour agrees with it sums the data of a rank whose call differs (from 3
    #: ranks on), and in the fused two-shot, whose exchange is only with a row's owner, a rank's call
    #: can be compared with nobody's.
    SIG_RING = "sig-ring"
    #: Sentinel signature words only in thread 0 of each block (its channel 0): every other thread
    #: accepts its peers' lines unchecked.
    SIG_THREAD0 = "sig-thread0"
    #: A sentinel signature word never stored back to 0 by the thread that read it
    #: (``LLBuffer::resetSignature`` dropped): at epoch e the word of e-2 still holds its signature,
    #: so the reader takes it before the sender's word of e (stale), or finds an earlier call's
    #: signature in it and reports a call mismatch although every rank made the same calls.
    SKIP_SIG_RESET = "skip-sig-reset"
    #: The reset of a sentinel signature word issued after the reuse fence that precedes the
    #: reader's next send (with that send) instead of before it: nothing orders it before the send
    #: that credits the sender's next word, which the late reset may erase.
    SIG_RESET_LATE = "sig-reset-late"
    #: An LL flag checked for its epoch only (``ProtoLL::check`` ignoring the tags): a line of this
    #: epoch from a call with another signature is taken as data.
    LL_TAG_IGNORED = "ll-tag-ignored"
    #: LL128's reduce-scatter without signature words: an owner sums the adds of a rank whose call
    #: differs once the counters read R, writes the sum and all-gathers it under its own signature.
    LL128_NO_SIG_WORDS = "ll128-no-sig-words"
    #: The wide one-shot with lines per block fitted to the message instead of fixed per world
    #: size: a slot index then plays another (group, line) role from one call to the next, and a
    #: line's writer and reader count its epochs on different channels.
    WIDE_FITTED_LINES = "wide-fitted-lines"
    #: The wide one-shot storing a peer's line into the writer's own slot (``send``) instead of the
    #: slot of its reader, thread (group of the writer, line) (``sendToSlot``): the line lands where
    #: no thread that credits the writer reads it.
    WIDE_OWN_SLOT = "wide-own-slot"


FAULT_KINDS = ("absent", "mismatch")
REJOIN = ("launch", "ahead")
TIMEOUTS = ("stuck", "any")


@dataclass(frozen=True)
class Fault:
    """A fault injected by the device test hooks (``SOLLAT_TEST_HOOKS``, ``CommState``).

    ``absent``: the rank's threads of call ``call`` end at once without sending (``prologue``
    returns false), so its peers time out. ``mismatch``: the rank makes another call, with the same
    cut: another signature (``call_signature`` flips bit 1) and other data (every value it sends or
    adds differs from the other ranks' call). LL peers see the right epoch with a foreign flag,
    sentinel peers a signature word with the right epoch and a foreign signature, LL128 owners a
    reduce-scatter signature word with a foreign signature; no finite output of that call is right
    on any rank.
    """

    kind: str  # "absent" | "mismatch"
    rank: int
    call: int
    #: absent only: when the absent rank starts its next call. "launch": once every rank has ended
    #: the faulted call (``VirtualCommunicator``: all ranks are one launch, the only way the tests
    #: use the hook); "ahead": at once (a rank of a process group whose kernel returned early, i.e.
    #: a rank that skipped a call: a different call sequence, not a fault the path can detect).
    rejoin: str = "launch"

    def label(self) -> str:
        extra = "" if self.rejoin == "launch" or self.kind != "absent" else f",{self.rejoin}"
        return f"{self.kind}(r{self.rank}@{self.call}{extra})"


ALGORITHMS = ("oneshot", "twoshot", "ll128", "rmsnorm_twoshot", "oneshot_wide")
PROTOCOLS = ("ll", "sentinel")
#: "ptx": the PTX memory consistency model (ptx.PtxMachine; docs/protocol-model.md, "The PTX
#: mode"); "strong": a model stronger than PTX (untorn 16-byte lines, stores to peers in program
#: order, no store before an earlier load).
MEMORY = ("ptx", "strong")
#: Where the ranks run: "real" (one GPU each: a peer is outside .gpu scope) or "virtual" (all on one
#: GPU, VirtualCommunicator: .gpu scope covers every peer).
RANKS = ("real", "virtual")
#: PTX mode: which 16-byte accesses are split into their two 8-byte parts. "flags": the lines whose
#: parts do not each carry what the reader checks (the single-flag LL line); a line whose every
#: part is checked by its reader (two-flag LL, sentinel) is one access, which loses no behaviour the
#: checks can tell apart (docs). "all": every line.
TEAR = ("flags", "all")
#: Width of the epoch field of LL128's signature word (``ll128.h``: ``sig << 32 | epoch``, 32 bits;
#: a sentinel buffer's word has none: its reader resets it).
SIG_EPOCH_FIELD_BITS = 32
#: Width of an LL flag's epoch field (``protocol_ll.h``: 16 bits; SOLLAT_EPOCH_BITS may mask fewer).
EPOCH_FIELD_BITS = 16


@dataclass(frozen=True)
class Config:
    """One modelled scenario: every rank makes the same sequence of AllReduce calls.

    Sizes are in *model lines*. A model thread stands for a bundle of
    ``layout.MAX_THREADS // threads`` real threads that always act together (see
    :func:`sollat.model.rules.model_geometry`), so the geometry of every call is the one
    :func:`sollat.device.layout.plan` chooses, at bundle granularity.
    """

    algorithm: str = "oneshot"  # "oneshot" | "twoshot" | "ll128" | "rmsnorm_twoshot" | "oneshot_wide"
    protocol: str = "ll"  # "ll" | "sentinel"; LL128's all-gather is always LL
    nranks: int = 2
    calls: tuple[int, ...] = (1, 2)  # model lines per call (message for one-shot, whole message for two-shot)
    #: model threads per block at full width; divides MAX_THREADS // WARP. The wide one-shot: its
    #: lines per block (a block has one thread per (peer group, line))
    threads: int = 1
    max_blocks: int = 1
    max_slots: int = 1
    epoch_bits: int = EPOCH_FIELD_BITS  # SOLLAT_EPOCH_BITS
    #: Hardware assumption: a warp's 128-byte line add lands at the owner as one unit (NVLink).
    ll128_line_atomic: bool = True
    #: ``SOLLAT_LL128_SPLIT=1``: data lanes add with counter 0, fence, then a separate counter add.
    #: Correct without line atomicity.
    ll128_split: bool = False
    ll128_lines: int = 2  # lines per warp (device: 4)
    ll128_lanes: int = 2  # 16-byte lanes per line (device: 8)
    #: The wide one-shot's peer window: ranks per peer group (device: abi.PEER_WINDOW, 8). The model
    #: runs the kernel's rules with a narrower window, so that its few ranks form several groups.
    peer_window: int = 2
    mutations: frozenset[Mutation] = field(default_factory=frozenset)
    name: str = ""
    #: Injected faults (the fault path: ``fault.h``, ``refused()``, ``poison_from``).
    faults: tuple[Fault, ...] = ()
    #: Collective ``reset()`` before this call (every rank idle first), or None.
    reset_at: int | None = None
    #: When a blocked poll may time out: "stuck" (only when no other step is enabled anywhere: the
    #: timeout is longer than any skew) or "any" (at any poll: spurious timeouts of slow peers).
    timeouts: str = "stuck"
    #: The memory model (``MEMORY``); "ptx" is what CI checks.
    memory: str = "ptx"
    ranks: str = "real"
    tear: str = "flags"
    #: Signature words (sentinel buffers: ``ll_buffer.h``, "Signature words"; LL128's reduce-scatter:
    #: ``allreduce_ll128.cu``). False: not modelled in this configuration (the data lines only).
    #: Leaving them out only removes stores, loads and resets that nothing else waits for (a
    #: thread's word poll and reset delay nothing but its own pass), so every data-line behaviour
    #: with them is one without
    #: them: large configurations check the data lines so, small ones the signature words too.
    #: Configurations with a call mismatch keep them (they are what detects it).
    sig_words: bool = True
    #: Width of the epoch field of LL128's signature words (the device: 32; fewer only to explore
    #: aliasing). LL128 only: a sentinel buffer's word carries no epoch.
    sig_epoch_bits: int = SIG_EPOCH_FIELD_BITS

    def __post_init__(self) -> None:
        if self.algorithm not in ALGORITHMS:
            raise ValueError(f"algorithm must be one of {ALGORITHMS}, got {self.algorithm!r}")
        if self.protocol not in PROTOCOLS:
            raise ValueError(f"protocol must be one of {PROTOCOLS}, got {self.protocol!r}")
        if not 2 <= self.nranks <= 8:
            raise ValueError("nranks must be in 2..8")
        if not self.calls or min(self.calls) < 1:
            raise ValueError("calls must be a non-empty tuple of positive sizes")
        if self.epoch_bits < 1 or self.epoch_bits > EPOCH_FIELD_BITS:
            raise ValueError(f"epoch_bits must be in 1..{EPOCH_FIELD_BITS} (the LL flag's epoch field)")
        if not 1 <= self.sig_epoch_bits <= SIG_EPOCH_FIELD_BITS:
            raise ValueError(f"sig_epoch_bits must be in 1..{SIG_EPOCH_FIELD_BITS} (LL128's signature word's epoch field)")
        if self.sig_epoch_bits != SIG_EPOCH_FIELD_BITS and self.algorithm != "ll128":
            raise ValueError("sig_epoch_bits is LL128's (a sentinel buffer's signature word has no epoch field)")
        for what, value, allowed in (("memory", self.memory, MEMORY), ("ranks", self.ranks, RANKS),
                                     ("tear", self.tear, TEAR)):
            if value not in allowed:
                raise ValueError(f"{what} must be one of {allowed}, got {value!r}")
        if self.ll128_lines < 1 or self.ll128_lanes < 1:
            raise ValueError("ll128_lines and ll128_lanes must be positive")
        if self.algorithm == "oneshot_wide":
            self._check_wide()
        self._check_faults()

    def _check_wide(self) -> None:
        groups = -(-self.nranks // max(self.peer_window, 1))
        if self.protocol != "ll" or self.peer_window < 1 or self.threads * groups > layout.MAX_THREADS:
            raise ValueError(f"the wide one-shot is LL, with a peer window >= 1 and lines per block x groups "
                             f"<= {layout.MAX_THREADS}")
        if self.fault_path:  # a fault stops the whole block at its barrier, which the model does not have
            raise ValueError("the wide one-shot is modelled without the fault path (its block barrier is not modelled)")

    def _check_faults(self) -> None:
        if self.timeouts not in TIMEOUTS:
            raise ValueError(f"timeouts must be one of {TIMEOUTS}, got {self.timeouts!r}")
        last = len(self.calls) if self.reset_at is None else self.reset_at
        if self.reset_at is not None and not 1 <= self.reset_at < len(self.calls):
            raise ValueError("reset_at must name a call after the first")
        for f in self.faults:
            if f.kind not in FAULT_KINDS or f.rejoin not in REJOIN:
                raise ValueError(f"bad fault {f}")
            if not (0 <= f.rank < self.nranks and 0 <= f.call < last):
                raise ValueError(f"fault {f.label()} must name a rank and a call before the reset")

    @property
    def fault_path(self) -> bool:
        """Whether threads may give up (injected faults, spurious timeouts or a reset)."""
        return bool(self.faults) or self.timeouts == "any" or self.reset_at is not None

    def fault_at(self, kind: str, rank: int, call: int) -> Fault | None:
        return next((f for f in self.faults if (f.kind, f.rank, f.call) == (kind, rank, call)), None)

    @property
    def proto(self) -> str:
        """Protocol of the LLBuffer phases (LL128's all-gather is LL)."""
        return "ll" if self.algorithm == "ll128" else self.protocol

    @property
    def line_atomic(self) -> bool:
        return self.ll128_line_atomic and Mutation.TORN_LL128 not in self.mutations

    def has(self, m: Mutation) -> bool:
        return m in self.mutations

    @property
    def ptx(self) -> bool:
        return self.memory == "ptx"

    @property
    def signature_words(self) -> bool:
        """Sentinel buffers carry a signature word per (parity, sender, block, thread) in every
        receiver's region, stored with every line-0 send, polled with every receive and reset by
        its reader (not LL: every LL line carries the signature)."""
        return self.proto == "sentinel" and self.sig_words and not self.has(Mutation.NO_SIGNATURE_LINE)

    @property
    def ll128_signature_words(self) -> bool:
        """LL128's reduce-scatter carries a signature word per (owner, parity, source, warp)."""
        return self.algorithm == "ll128" and self.sig_words and not self.has(Mutation.LL128_NO_SIG_WORDS)

    def mismatched(self, call: int) -> bool:
        """Whether some rank's call ``call`` differs from the others' (an injected mismatch)."""
        return any(f.kind == "mismatch" and f.call == call for f in self.faults)

    def with_mutation(self, *ms: Mutation) -> Config:
        return replace(self, mutations=self.mutations | frozenset(ms))

    def label(self) -> str:
        if self.name:
            base = self.name
        else:
            proto = "ll128" if self.algorithm == "ll128" else self.protocol
            base = f"{self.algorithm}-{proto}-{self.nranks}r{self.threads}t"
        extra = []
        if self.memory != "ptx":
            extra.append(self.memory)
        if self.ranks != "real":
            extra.append(self.ranks)
        if self.tear != "flags":
            extra.append(f"tear={self.tear}")
        if not self.sig_words and (self.proto == "sentinel" or self.algorithm == "ll128"):
            extra.append("no-sig-words")
        if self.algorithm == "ll128" and self.sig_epoch_bits != SIG_EPOCH_FIELD_BITS:
            extra.append(f"sig-bits={self.sig_epoch_bits}")
        if self.epoch_bits != EPOCH_FIELD_BITS:
            extra.append(f"bits={self.epoch_bits}")
        if self.algorithm == "ll128" and not self.ll128_line_atomic:
            extra.append("torn")
        if self.algorithm == "ll128" and self.ll128_split:
            extra.append("split")
        if self.algorithm == "oneshot_wide":
            extra.append(f"window={self.peer_window}")
        extra += [f.label() for f in self.faults]
        if self.reset_at is not None:
            extra.append(f"reset@{self.reset_at}")
        if self.timeouts != "stuck":
            extra.append(f"timeouts={self.timeouts}")
        extra += sorted(m.value for m in self.mutations)
        calls = ",".join(map(str, self.calls))
        return f"{base}[{calls}]" + (" " + " ".join(extra) if extra else "")
