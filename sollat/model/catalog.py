"""The named configurations the sweep checks (:data:`EXHAUSTIVE`, :data:`RANDOM`) and the catalogue
of planted bugs (:data:`PLANTED`) and benign mutations (:data:`BENIGN`); ``sweep.py`` runs them."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace
from typing import Any

from .config import Config, Fault, Mutation


def _c(name: str, **kw: Any) -> Config:
    return Config(name=name, **kw)


#: Tiny configurations explored exhaustively (every interleaving, PTX mode): 2-3 ranks, 1-2 threads,
#: 2-5 calls of different sizes, covering chunked iterations, several slots/blocks, idle channels,
#: uneven two-shot chunks, 2-bit epochs (wrap-around), every line split into its 8-byte parts
#: (``tear="all"``), virtual ranks, signature words over four calls. PTX's freedom to reorder a window's
#: operations multiplies the states, so the 3-rank two-shot and the 2-thread 3-rank configurations
#: of the strong model are in RANDOM; ``sig_words=False`` configurations check the data lines only
#: (the signature words elsewhere: leaving them out only removes waits, ``Config.sig_words``).
EXHAUSTIVE: list[Config] = [
    _c("oneshot-ll-2r1t", algorithm="oneshot", protocol="ll", nranks=2, calls=(1, 2, 1)),
    _c("oneshot-sentinel-2r1t", algorithm="oneshot", protocol="sentinel", nranks=2, calls=(1, 2, 1)),
    _c("oneshot-ll-3r1t", algorithm="oneshot", protocol="ll", nranks=3, calls=(1, 2)),
    _c("oneshot-sentinel-3r1t", algorithm="oneshot", protocol="sentinel", nranks=3, calls=(1, 2), sig_words=False),
    _c("oneshot-ll-2r2t", algorithm="oneshot", protocol="ll", nranks=2, threads=2, calls=(2, 5, 1)),
    _c("oneshot-sentinel-2r2t", algorithm="oneshot", protocol="sentinel", nranks=2, threads=2, calls=(2, 3, 1)),
    _c("oneshot-ll-2r1t-bits2", algorithm="oneshot", protocol="ll", nranks=2, calls=(1, 2, 1, 3, 1), epoch_bits=2),
    _c("oneshot-sentinel-2r1t-slots2", algorithm="oneshot", protocol="sentinel", nranks=2, calls=(1, 3), max_slots=2),
    _c("oneshot-sentinel-2r1t-blocks2", algorithm="oneshot", protocol="sentinel", nranks=2, calls=(1, 3),
       max_blocks=2),
    _c("twoshot-ll-2r1t", algorithm="twoshot", protocol="ll", nranks=2, calls=(2, 4, 2)),
    _c("twoshot-sentinel-2r1t", algorithm="twoshot", protocol="sentinel", nranks=2, calls=(2, 4, 2)),
    _c("twoshot-ll-3r1t", algorithm="twoshot", protocol="ll", nranks=3, calls=(3, 2)),
    _c("twoshot-sentinel-2r2t", algorithm="twoshot", protocol="sentinel", nranks=2, threads=2, calls=(4, 6, 2),
       sig_words=False),
    _c("ll128-2r1t", algorithm="ll128", nranks=2, calls=(2, 4, 2)),
    # the fused RMSNorm two-shot's exchange (rows owned by row % R): ownership of a channel's slot
    # changes from call to call; 2-bit epochs wrap within these sequences
    _c("rmsnorm-twoshot-sentinel-2r1t-bits2", algorithm="rmsnorm_twoshot", protocol="sentinel", nranks=2,
       calls=(1, 3, 1, 2), epoch_bits=2),
    _c("rmsnorm-twoshot-sentinel-3r1t-bits2", algorithm="rmsnorm_twoshot", protocol="sentinel", nranks=3,
       calls=(1, 2, 3), epoch_bits=2),
    _c("rmsnorm-twoshot-sentinel-2r2t-bits2", algorithm="rmsnorm_twoshot", protocol="sentinel", nranks=2, threads=2,
       calls=(2, 5, 1, 3), epoch_bits=2),
    _c("ll128-split-torn-2r1t", algorithm="ll128", nranks=2, calls=(2, 6, 2), ll128_line_atomic=False,
       ll128_split=True, ll128_lines=1),
    # every 16-byte access as its two 8-byte parts (what the default, tear="flags", leaves out)
    _c("oneshot-ll-2r1t-tear", algorithm="oneshot", protocol="ll", nranks=2, calls=(1, 2, 1), tear="all"),
    _c("oneshot-sentinel-2r1t-tear", algorithm="oneshot", protocol="sentinel", nranks=2, calls=(1, 2, 1), tear="all"),
    _c("twoshot-ll-2r1t-tear", algorithm="twoshot", protocol="ll", nranks=2, calls=(2, 4, 2), tear="all"),
    # signature words over four calls of two signatures: each is empty from its reader's reset to the
    # sender's next store (no epoch field); and virtual ranks (one GPU: .gpu fences)
    _c("oneshot-sentinel-2r1t-words", algorithm="oneshot", protocol="sentinel", nranks=2, calls=(2, 1, 3, 1)),
    _c("oneshot-sentinel-2r1t-virtual", algorithm="oneshot", protocol="sentinel", nranks=2, calls=(1, 2, 1),
       ranks="virtual"),
    _c("ll128-split-torn-2r1t-virtual", algorithm="ll128", nranks=2, calls=(2, 6, 2), ll128_line_atomic=False,
       ll128_split=True, ll128_lines=1, ranks="virtual"),
    # the wide one-shot: a thread per (peer group, line), paired across groups by sendToSlot; a window
    # of 1 or 2 ranks makes several groups of 2-3 ranks (threads = lines per block)
    _c("oneshot-wide-2r2t-w1", algorithm="oneshot_wide", protocol="ll", nranks=2, threads=2, peer_window=1,
       calls=(1, 3, 2)),
    _c("oneshot-wide-3r1t-w1", algorithm="oneshot_wide", protocol="ll", nranks=3, threads=1, peer_window=1,
       calls=(1, 2)),
    _c("oneshot-wide-3r1t-w2", algorithm="oneshot_wide", protocol="ll", nranks=3, threads=1, peer_window=2,
       calls=(1, 3, 2)),
]

#: Larger configurations for random schedules: more ranks, blocks, slots, threads and calls.
#: (config, runs in the CI sweep); small ones get many runs, big ones fewer (similar CPU time).
RANDOM: list[tuple[Config, int]] = [
    (_c("oneshot-ll-2r1t-x4", algorithm="oneshot", protocol="ll", nranks=2, calls=(1, 2, 1, 3)), 43000),
    (_c("oneshot-sentinel-2r1t-x4", algorithm="oneshot", protocol="sentinel", nranks=2, calls=(1, 2, 1, 3)), 10000),
    # signature words reset by their readers, 3 ranks, four calls
    (_c("oneshot-sentinel-3r1t-words", algorithm="oneshot", protocol="sentinel", nranks=3, calls=(2, 1, 3, 1)),
     2000),
    (_c("oneshot-ll-3r1t-bits2", algorithm="oneshot", protocol="ll", nranks=3, calls=(2, 1, 3, 1, 2), epoch_bits=2),
     3000),
    (_c("twoshot-ll-2r1t-x4", algorithm="twoshot", protocol="ll", nranks=2, calls=(2, 5, 1, 3)), 18000),
    (_c("twoshot-sentinel-2r1t-x4", algorithm="twoshot", protocol="sentinel", nranks=2, calls=(2, 5, 1, 3)), 4000),
    (_c("twoshot-sentinel-3r1t-x3", algorithm="twoshot", protocol="sentinel", nranks=3, calls=(4, 2, 7)), 500),
    (_c("ll128-2r1t-x3", algorithm="ll128", nranks=2, calls=(2, 5, 1)), 3000),
    # LL128's signature words with a 2-bit epoch field: every iteration writes every owner's, so a
    # word holds e-2 at worst
    (_c("ll128-2r1t-sigbits2", algorithm="ll128", nranks=2, calls=(2, 1, 3, 1), sig_epoch_bits=2), 1000),
    (_c("ll128-split-torn-2r1t-w2", algorithm="ll128", nranks=2, calls=(2, 5, 1), ll128_line_atomic=False,
        ll128_split=True), 800),
    (_c("oneshot-ll-3r2t-b2s2", algorithm="oneshot", protocol="ll", nranks=3, threads=2, max_blocks=2, max_slots=2,
        calls=(1, 5, 2, 12, 3)), 300),
    (_c("oneshot-sentinel-4r2t-b2s2", algorithm="oneshot", protocol="sentinel", nranks=4, threads=2, max_blocks=2,
        max_slots=2, calls=(3, 1, 9, 2)), 120),
    (_c("oneshot-sentinel-8r1t", algorithm="oneshot", protocol="sentinel", nranks=8, calls=(1, 2, 1)), 80),
    (_c("twoshot-ll-3r2t-b2s2", algorithm="twoshot", protocol="ll", nranks=3, threads=2, max_blocks=2, max_slots=2,
        calls=(4, 13, 2, 24, 7)), 200),
    (_c("twoshot-sentinel-4r2t-b2s2", algorithm="twoshot", protocol="sentinel", nranks=4, threads=2, max_blocks=2,
        max_slots=2, calls=(4, 13, 2, 24, 7)), 60),
    (_c("ll128-3r2t", algorithm="ll128", nranks=3, threads=2, calls=(3, 7, 2)), 400),
    (_c("ll128-split-torn-3r1t", algorithm="ll128", nranks=3, calls=(3, 7, 2), ll128_line_atomic=False,
        ll128_split=True), 250),
    (_c("ll128-4r1t-lanes4", algorithm="ll128", nranks=4, calls=(4, 9), ll128_lines=2, ll128_lanes=4), 250),
    (_c("rmsnorm-twoshot-sentinel-4r2t-b2s2-bits2", algorithm="rmsnorm_twoshot", protocol="sentinel", nranks=4,
        threads=2, max_blocks=2, max_slots=2, calls=(3, 1, 9, 2, 5), epoch_bits=2), 200),
    # the strong model's exhaustive configurations PTX mode cannot afford to explore completely
    (_c("oneshot-ll-3r2t", algorithm="oneshot", protocol="ll", nranks=3, threads=2, calls=(2, 3, 1)), 6000),
    (_c("twoshot-ll-3r2t", algorithm="twoshot", protocol="ll", nranks=3, threads=2, calls=(6, 3)), 4000),
    (_c("twoshot-sentinel-3r1t", algorithm="twoshot", protocol="sentinel", nranks=3, calls=(3, 7, 2)), 400),
    (_c("ll128-3r1t", algorithm="ll128", nranks=3, calls=(3, 7)), 1500),
    # the fused two-shot over a sequence where a pair skips many passes (32-bit words: clean); torn lines
    (_c("rmsnorm-twoshot-sentinel-3r1t-x5", algorithm="rmsnorm_twoshot", protocol="sentinel", nranks=3,
        calls=(2, 1, 1, 1, 3)), 2000),
    (_c("oneshot-sentinel-3r1t-tear", algorithm="oneshot", protocol="sentinel", nranks=3, calls=(2, 1, 3), tear="all"),
     300),
    # the wide one-shot: 3 groups over 2 blocks and several passes; 2 lines per block, 3 ranks
    (_c("oneshot-wide-5r2t-w2-b2", algorithm="oneshot_wide", protocol="ll", nranks=5, threads=2, peer_window=2,
        max_blocks=2, calls=(1, 5, 2, 9, 3)), 300),
    (_c("oneshot-wide-3r2t-w2", algorithm="oneshot_wide", protocol="ll", nranks=3, threads=2, peer_window=2,
        calls=(1, 3, 2, 5)), 1000),
]


@dataclass(frozen=True)
class Planted:
    """A planted bug and a configuration on which the checker must produce a counterexample."""

    name: str
    config: Config
    kinds: frozenset[str]  # violation kinds that count as catching it
    rule: str  # the rule it breaks (for the docs and the printed report)
    #: only PTX mode catches it: the strong model proves the same configuration clean
    ptx_only: bool = False


def planted(name: str, cfg: Config, kinds: Iterable[str], rule: str, *, ptx_only: bool = False) -> Planted:
    """A planted bug named ``name`` (its configuration takes the name too)."""
    return Planted(name, replace(cfg, name=name), frozenset(kinds), rule, ptx_only)


_p = planted


_O_LL = Config(algorithm="oneshot", protocol="ll", nranks=2, calls=(1, 2, 1))
_O_SE = Config(algorithm="oneshot", protocol="sentinel", nranks=2, calls=(1, 2, 1))
_T_LL = Config(algorithm="twoshot", protocol="ll", nranks=2, calls=(2, 4, 2))
_T_SE = Config(algorithm="twoshot", protocol="sentinel", nranks=2, calls=(2, 4, 2))
_LL128 = Config(algorithm="ll128", nranks=2, calls=(2, 4, 2))
_RACE = ("reset-race", "overwrite", "stale", "wrong-sum", "deadlock")
#: A call that differs between ranks: some rank finishes it, or writes a finite output of it.
_ACCEPTED = ("accepted",)

PLANTED: list[Planted] = [
    _p("single-buffer/oneshot-ll", _O_LL.with_mutation(Mutation.SINGLE_BUFFER), ("overwrite",),
       "double buffering: a line is rewritten only after the credit for it"),
    _p("single-buffer/oneshot-sentinel", _O_SE.with_mutation(Mutation.SINGLE_BUFFER), ("overwrite", "reset-race"),
       "double buffering: a line is rewritten only after the credit for it"),
    _p("single-buffer/twoshot-sentinel", _T_SE.with_mutation(Mutation.SINGLE_BUFFER), ("reset-race", "overwrite"),
       "two-shot sentinel: per-buffer fences suffice only with two parities"),
    _p("skip-sentinel-reset/oneshot", _O_SE.with_mutation(Mutation.SKIP_SENTINEL_RESET), ("stale",),
       "sentinel: the receiver stores the sentinel back after reading"),
    _p("skip-sentinel-reset/twoshot", _T_SE.with_mutation(Mutation.SKIP_SENTINEL_RESET), ("stale",),
       "sentinel: the receiver stores the sentinel back after reading"),
    _p("reused-flag/oneshot-same-call", replace(_O_LL, calls=(2, 2)).with_mutation(Mutation.REUSED_FLAG),
       ("stale",), "LL: the flag carries the epoch"),
    _p("reused-flag/twoshot", _T_LL.with_mutation(Mutation.REUSED_FLAG), ("stale", "mismatch"),
       "LL: the flag carries the epoch"),
    _p("epoch-bits-1/oneshot", replace(_O_LL, calls=(2, 2), epoch_bits=1), ("stale",),
       "LL: at least 2 epoch bits (stale lines hold e-2)"),
    # Not a mutation: the fused RMSNorm two-shot in LL (its owner-only exchange leaves a pair's
    # line many epochs old); sollat ships that two-shot in sentinel only.
    _p("owner-only-slots/rmsnorm-twoshot-ll-bits2", Config(algorithm="rmsnorm_twoshot", protocol="ll", nranks=2,
                                                           calls=(1, 3, 1, 2), epoch_bits=2),
       ("stale", "mismatch"), "LL: a slot is rewritten at least every other epoch of its channel (the fused "
                              "two-shot writes s -> o only in passes whose row o owns)"),
    _p("reset-after-send/oneshot-sentinel", _O_SE.with_mutation(Mutation.RESET_AFTER_SEND), _RACE,
       "sentinel: the reset is fenced before the next send"),
    _p("reset-after-send/twoshot-sentinel", _T_SE.with_mutation(Mutation.RESET_AFTER_SEND), _RACE,
       "sentinel: the reset is fenced before the next send"),
    _p("zero-after-send/ll128", _LL128.with_mutation(Mutation.RESET_AFTER_SEND), _RACE,
       "LL128: the zeroing is fenced before the next all-gather send"),
    _p("torn-ll128", _LL128.with_mutation(Mutation.TORN_LL128), ("torn",),
       "LL128: a counter of R implies complete lanes (line-atomic adds, or data fenced before counter)"),
    _p("split-no-fence/ll128", replace(_LL128, ll128_split=True, ll128_line_atomic=False).with_mutation(
        Mutation.SPLIT_NO_FENCE), ("torn",), "LL128 split mode: data adds are fenced before the counter add"),
    _p("unpadded-chunks/twoshot-ll-bits2", Config(algorithm="twoshot", protocol="ll", nranks=2, calls=(4, 3, 4),
                                                  epoch_bits=2).with_mutation(Mutation.UNPADDED_CHUNKS),
       ("stale",), "two-shot: chunk lines past the message are sent as padding, so stale LL lines hold e-2"),
    _p("skip-ll128-zero", _LL128.with_mutation(Mutation.SKIP_LL128_ZERO), ("overwrite", "wrong-sum", "deadlock"),
       "LL128: the owner zeroes the line after reading (zero at rest)"),
    _p("skip-commit/oneshot-ll", replace(_O_LL, calls=(1, 1)).with_mutation(Mutation.SKIP_COMMIT),
       ("stale", "overwrite"), "epochs: counters are written back at kernel end (commit)"),
    _p("skip-commit/twoshot-sentinel", _T_SE.with_mutation(Mutation.SKIP_COMMIT), (*_RACE, "mismatch"),
       "epochs: counters are written back at kernel end (commit)"),
    _p("no-boundary-order/oneshot-sentinel", _O_SE.with_mutation(Mutation.NO_BOUNDARY_ORDER), _RACE,
       "kernel boundary: a kernel's stores are performed before the next kernel's"),
    # Bugs only PTX's memory model has (the strong model proves each configuration clean)
    _p("single-flag-line/oneshot-ll", _O_LL.with_mutation(Mutation.SINGLE_FLAG_LINE), ("stale",),
       "LL: each 8-byte word carries its own flag (PTX splits a 16-byte store into 8-byte parts)", ptx_only=True),
    _p("single-flag-line/twoshot-ll", _T_LL.with_mutation(Mutation.SINGLE_FLAG_LINE), ("stale",),
       "LL: each 8-byte word carries its own flag (PTX splits a 16-byte store into 8-byte parts)", ptx_only=True),
    # Caught under the model's reading of PTX: no order from a control dependency. PTX's No Thin Air
    # axiom (ISA §8.10.4) may exclude this execution for LL lines (docs/protocol-model.md, "Line
    # reuse and control dependencies").
    _p("no-reuse-fence/oneshot-ll", replace(_O_LL, calls=(3,)).with_mutation(Mutation.NO_REUSE_FENCE), ("overwrite",),
       "a fence between a receive and the next send (no order from a control dependency)", ptx_only=True),
    _p("no-reuse-fence/twoshot-ll", replace(_T_LL, calls=(6,)).with_mutation(Mutation.NO_REUSE_FENCE), ("overwrite",),
       "two-shot: one fence at the top of every pass after the first orders the last pass's receives before "
       "this pass's sends", ptx_only=True),
    _p("gpu-fence/oneshot-sentinel", _O_SE.with_mutation(Mutation.GPU_FENCE), ("overwrite", "reset-race"),
       "fences at the peers' scope: .sys when they are other GPUs", ptx_only=True),
    _p("gpu-fence/ll128-split", replace(_LL128, ll128_split=True, ll128_line_atomic=False, ll128_lines=1)
       .with_mutation(Mutation.GPU_FENCE), ("torn", "reset-race"), "fences at the peers' scope: .sys when they are other GPUs",
       ptx_only=True),
    _p("no-signature-line/oneshot-sentinel", Config(algorithm="oneshot", protocol="sentinel", calls=(1, 1, 1),
                                                    faults=(Fault("mismatch", 1, 0),), reset_at=2)
       .with_mutation(Mutation.NO_SIGNATURE_LINE), _ACCEPTED,
       "sentinel: a signature word with every line-0 send, checked by the receiver"),
    # The signature word carries no epoch: its reader stores 0 back once it has read it. Without
    # that reset the word of e-2 is still there at e: taken as e's (same signature) or reported as
    # a mismatch (an earlier call's); a reset issued after the reuse fence is not ordered before
    # the send that lets the sender write the word again, and may erase that word.
    _p("skip-sig-reset/oneshot-sentinel", _O_SE.with_mutation(Mutation.SKIP_SIG_RESET), ("stale", "mismatch"),
       "sentinel: the reader stores 0 back into a signature word it has read"),
    _p("skip-sig-reset/rmsnorm-twoshot-sentinel", Config(algorithm="rmsnorm_twoshot", protocol="sentinel",
                                                         calls=(1, 3, 1)).with_mutation(Mutation.SKIP_SIG_RESET),
       ("stale", "mismatch"), "sentinel: the reader stores 0 back into a signature word it has read"),
    _p("sig-reset-late/oneshot-sentinel", _O_SE.with_mutation(Mutation.SIG_RESET_LATE), _RACE,
       "sentinel: a signature word's reset is fenced before the next send, as a line's"),
    _p("no-signature-line/twoshot-sentinel", Config(algorithm="twoshot", protocol="sentinel", calls=(2, 2, 2),
                                                    faults=(Fault("mismatch", 0, 1),), reset_at=2)
       .with_mutation(Mutation.NO_SIGNATURE_LINE), _ACCEPTED,
       "sentinel: a signature word with every line-0 send, checked by the receiver"),
    # One detection scheme each, with the odd rank's call differing in its signature and its data:
    # a rank that finishes the call, or writes any finite output of it, is caught ("accepted").
    # The ring (words only to rank + 1): rank 0 checks rank 2's word only and sums rank 1's data.
    _p("sig-ring/oneshot-sentinel-3r", Config(algorithm="oneshot", protocol="sentinel", nranks=3, calls=(1,),
                                              faults=(Fault("mismatch", 1, 0),)).with_mutation(Mutation.SIG_RING),
       _ACCEPTED, "sentinel: every receive from a peer checks that peer's signature word, not only rank - 1's"),
    # One row, owned by rank 0, 4 ranks: the ring compares 3 -> 0 (reduce-scatter) and 0 -> 1
    # (all-gather) only; rank 2's call is compared with nobody's.
    _p("sig-ring/rmsnorm-twoshot-sentinel",
       Config(algorithm="rmsnorm_twoshot", protocol="sentinel", nranks=4, calls=(1, 1), faults=(Fault("mismatch", 2, 0),),
              reset_at=1).with_mutation(Mutation.SIG_RING), _ACCEPTED,
       "the fused two-shot's exchange is only with a row's owner: a signature word with every line-0 send"),
    # Words in thread 0 of a block only: thread 1 takes the odd rank's line unchecked.
    _p("sig-thread0/oneshot-sentinel-2t", Config(algorithm="oneshot", protocol="sentinel", threads=2, calls=(2,),
                                                 faults=(Fault("mismatch", 1, 0),)).with_mutation(Mutation.SIG_THREAD0),
       _ACCEPTED, "sentinel: every thread's receive checks a signature word, not only thread 0's"),
    _p("ll-tag-ignored/oneshot-ll", Config(algorithm="oneshot", protocol="ll", calls=(1,),
                                           faults=(Fault("mismatch", 1, 0),)).with_mutation(Mutation.LL_TAG_IGNORED),
       _ACCEPTED, "LL: a line is taken only when its flags carry the reader's tags, not its epoch alone"),
    _p("ll-tag-ignored/twoshot-ll-3r", Config(algorithm="twoshot", protocol="ll", nranks=3, calls=(3,),
                                              faults=(Fault("mismatch", 2, 0),)).with_mutation(Mutation.LL_TAG_IGNORED),
       _ACCEPTED, "LL: a line is taken only when its flags carry the reader's tags, not its epoch alone"),
    # The wide one-shot: lines per block fitted to each call make a slot index play another (group,
    # line) role in the next call (its writer and reader count different channels' epochs); a line
    # stored in the writer's own slot is read by no thread that credits the writer; no fence
    # between a receive and the next pass's sendToSlot.
    _p("wide-fitted-lines/oneshot-wide-3r", Config(algorithm="oneshot_wide", protocol="ll", nranks=3, threads=2,
                                                   calls=(1, 2)).with_mutation(Mutation.WIDE_FITTED_LINES),
       ("overwrite", "deadlock", "stale"), "wide one-shot: lines per block fixed per world size, whatever the message"),
    _p("wide-own-slot/oneshot-wide-3r", Config(algorithm="oneshot_wide", protocol="ll", nranks=3, calls=(1, 2))
       .with_mutation(Mutation.WIDE_OWN_SLOT), ("deadlock", "overwrite", "stale"),
       "wide one-shot: a line goes to the slot of its reader, the thread that sends the writer that line"),
    _p("no-reuse-fence/oneshot-wide", Config(algorithm="oneshot_wide", protocol="ll", peer_window=1, calls=(3,))
       .with_mutation(Mutation.NO_REUSE_FENCE), ("overwrite",),
       "wide one-shot: a fence between a receive and the next pass's sendToSlot", ptx_only=True),
    # The owner sums the odd rank's adds and writes its own chunk before any all-gather flag is seen.
    _p("ll128-no-sig-words/ll128", Config(algorithm="ll128", calls=(2,), faults=(Fault("mismatch", 1, 0),))
       .with_mutation(Mutation.LL128_NO_SIG_WORDS), _ACCEPTED,
       "LL128: the owner's counter poll also waits for every source's signature word"),
]

#: Mutations the checker proves harmless in a given algorithm (documented, and tested as such).
BENIGN: list[Planted] = [
    _p("single-buffer/twoshot-ll", Config(algorithm="twoshot", protocol="ll", nranks=3, calls=(3, 7, 2))
       .with_mutation(Mutation.SINGLE_BUFFER), (),
       "two-shot: the all-gather receive is the credit for the next reduce-scatter send"),
    _p("single-buffer/ll128", Config(algorithm="ll128", nranks=2, calls=(4, 6), ll128_lines=1)
       .with_mutation(Mutation.SINGLE_BUFFER), (),
       "two-shot: the all-gather receive is the credit for the next reduce-scatter add"),
    _p("no-reuse-fence/ll128", Config(algorithm="ll128", nranks=2, calls=(6, 2), ll128_lines=1)
       .with_mutation(Mutation.NO_REUSE_FENCE),
       (), "LL128: every rank's next adds follow its own counter poll, which saw the owner's adds of the round "
           "after the owner's zeroing fence (release/acquire through the counter): no fence at the top is needed"),
    _p("gpu-fence/oneshot-sentinel-virtual", replace(_O_SE, ranks="virtual").with_mutation(Mutation.GPU_FENCE), (),
       "virtual ranks: every peer runs on the one GPU, so .gpu fences order everything the protocol needs"),
    _p("gpu-fence/ll128-split-virtual", replace(_LL128, ll128_split=True, ll128_line_atomic=False, ll128_lines=1,
                                                ranks="virtual").with_mutation(Mutation.GPU_FENCE), (),
       "virtual ranks: every peer runs on the one GPU, so .gpu fences order everything the protocol needs"),
]
