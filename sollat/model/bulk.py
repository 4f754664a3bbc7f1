"""The bulk protocol's reuse argument, checked exhaustively (``kernels/allreduce_bulk.cu``).

The line model (``algorithms.py``, ``machine.py``) follows LL and sentinel kernels thread by
thread. The bulk two-shot moves whole areas and publishes each with one flag (``bulk_buffer.h``);
what can go wrong there is not a torn line but an area written again before its reader is done,
or read before it is full. This model follows one block's channel on every rank at that grain:

* ``write`` of an area is an interval (``W`` .. ``WE``), and so is a ``read`` (``R`` .. ``RE``);
  other ranks' steps interleave anywhere, so a write that overlaps a read, a read of an area that
  does not (yet, or any more) hold the round it expects, and a write over data no one has read
  are all visible;
* ``P`` posts a flag (after the block's writes: the barrier and release of ``post``), ``A`` waits
  for one (the acquire of ``wait``: enabled once the flag holds the sequence number);
* areas and flags exist per parity (``parities``; the kernel has 2), and a rank's calls follow one
  another (the kernel boundary);
* a flag carries its call's signature with the sequence number, and an area the signature of the
  call that wrote it: a wait that finds its sequence number with another signature records a call
  mismatch (that rank stops: ``D``), and a read of an area another call wrote is a wrong sum (the
  area holds that call's data: the calls differ in their data as well as their signature). A rank
  completes a call only after reading every peer's areas, so a rank that completes a call that
  differs has read one.

Every interleaving of the ranks' programs is explored (depth-first, states memoised). Planted
variants must fail: one parity, posting before the writes end, sending the reduce-scatter two
rounds ahead, and flags without the signature when the last rank's calls differ (``MISMATCH``:
with the signature every schedule ends in a recorded mismatch, never in a wrong sum, a finished
call or a silent wait).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple

RS, AG = 0, 1  # the kernel's two buffers


class Step(NamedTuple):
    op: str  # W WE R RE P A
    buf: int
    owner: int  # the rank whose region holds the area / flag
    src: int  # the source part of that region
    seq: int
    sig: int = 0  # the signature of the call the step belongs to


# A call: its number of rounds, or (rounds, signature). A bare count is its own signature: calls of
# one signature always have the same rounds (the signature hashes n; the rounds follow from n).
Call = int | tuple[int, int]


def _call(c: Call) -> tuple[int, int]:
    return (c, c) if isinstance(c, int) else c


@dataclass(frozen=True)
class Variant:
    parities: int = 2
    post_before_write_end: bool = False  # planted: the flag may pass the data
    send_ahead: int = 1  # rounds the reduce-scatter is sent ahead of the round being reduced (kernel: 1)
    early_send: bool = False  # the next round's reduce-scatter sent before this round's wait (kernel: after the reduce)
    signed: bool = True  # flags carry the call signature and waits check it (planted: False)
    #: The flag store is a release (``st.release`` after the block barrier): the area's data stores
    #: are performed before it. False (planted, PTX ISA §8.9.5: relaxed accesses to different
    #: locations are ordered by nothing): the flag may be posted before, or while, the data lands.
    release_post: bool = True
    #: The flag load is an acquire (``ld.acquire``, then the block barrier): the data accesses after
    #: the wait follow it. False (planted): the area's reads, and the next writes, may be performed
    #: before the flag is seen (load-load order and load buffering are not ordered by PTX either).
    acquire_wait: bool = True


#: How far a step may overtake earlier steps of its rank (the relaxed variants only).
_LOOKAHEAD = 8


def overtakes(v: Variant, later: Step, earlier: Step) -> bool:
    """Whether ``later`` may be performed before ``earlier`` (of the same rank): only what the
    relaxed flag variants allow; the kernel's release/acquire pairs order everything else."""
    if not v.release_post and later.op == "P" and earlier.op in ("W", "WE"):
        return True
    return not v.acquire_wait and earlier.op == "A" and later.op in ("R", "RE", "W", "WE")


def program(rank: int, nranks: int, calls: tuple[Call, ...], v: Variant) -> list[Step]:
    """Rank ``rank``'s steps for ``calls`` (one block's channel)."""
    peers = [q for q in range(nranks) if q != rank]
    steps: list[Step] = []

    sig = 0  # the current call's signature (set per call below; the helpers read it)

    def write_and_post(buf: int, to: list[int], seq: int) -> None:
        for q in to:
            steps.append(Step("W", buf, q, rank, seq, sig))
            if not v.post_before_write_end:
                steps.append(Step("WE", buf, q, rank, seq, sig))
        for q in to:
            steps.append(Step("P", buf, q, rank, seq, sig))
        if v.post_before_write_end:
            steps.extend(Step("WE", buf, q, rank, seq, sig) for q in to)

    def wait_and_read(buf: int, seq: int) -> None:
        steps.extend(Step("A", buf, rank, q, seq, sig) for q in peers)
        for q in peers:
            steps.append(Step("R", buf, rank, q, seq, sig))
            steps.append(Step("RE", buf, rank, q, seq, sig))

    seq0 = 0
    for c in calls:
        rounds, sig = _call(c)
        sent = 0
        for k in range(1, min(v.send_ahead, rounds) + 1):  # the first rounds' reduce-scatter
            write_and_post(RS, peers, seq0 + k)
            sent = k
        for k in range(1, rounds + 1):
            if v.early_send and sent < rounds:
                sent += 1
                write_and_post(RS, peers, seq0 + sent)
            wait_and_read(RS, seq0 + k)  # reduce
            write_and_post(AG, peers, seq0 + k)  # the reduced area to every peer
            if not v.early_send and sent < rounds and sent < k + v.send_ahead:
                sent += 1
                write_and_post(RS, peers, seq0 + sent)
            wait_and_read(AG, seq0 + k)  # copy out
        seq0 += rounds
    return steps


# An area's state: (sequence number of its data, 0 empty / 1 being written / 2 full / 3 read,
# readers inside a read, signature of the call that wrote it).
_EMPTY = (0, 3, 0, 0)


@dataclass
class Result:
    ok: bool
    states: int
    violation: str = ""
    trace: list[str] = field(default_factory=list)


def explore(nranks: int, calls: tuple[Call, ...], variant: Variant = Variant(), *,
            last_rank_calls: tuple[Call, ...] | None = None, max_states: int = 2_000_000) -> Result:
    """Every schedule of ``nranks`` ranks making ``calls`` (the last rank ``last_rank_calls`` if
    given: a call mismatch, which every schedule must end in a recorded mismatch)."""
    per_rank = [calls] * nranks
    if last_rank_calls is not None:
        per_rank[-1] = last_rank_calls
    mismatch = any(tuple(map(_call, c)) != tuple(map(_call, calls)) for c in per_rank)
    progs = [program(r, nranks, per_rank[r], variant) for r in range(nranks)]
    seen: set[tuple[object, ...]] = set()
    area: dict[tuple[int, int, int, int], tuple[int, int, int, int]] = {}
    flag: dict[tuple[int, int, int, int], tuple[int, int]] = {}
    pcs = [0] * nranks
    detected: set[int] = set()  # ranks that recorded a call mismatch (and stopped)
    trace: list[str] = []

    def key() -> tuple[object, ...]:
        return (tuple(pcs), tuple(sorted(area.items())), tuple(sorted(flag.items())), tuple(sorted(detected)))

    def where(s: Step) -> tuple[int, int, int, int]:
        return (s.buf, s.owner, s.src, s.seq % variant.parities)

    def fault(r: int, s: Step) -> str:
        """Why rank r may not take step s now ('' if it may; 'wait' if it must wait)."""
        a = area.get(where(s), _EMPTY)
        if s.op == "A":
            seq, sig = flag.get(where(s), (0, 0))
            if seq < s.seq:
                return "wait"
            return "mismatch" if variant.signed and sig != s.sig else ""
        if s.op == "W":
            if a[2]:
                return f"rank {r} writes {_name(s)} while rank {s.owner} reads round {a[0]} there"
            if a[1] == 2:
                return f"rank {r} writes {_name(s)} over round {a[0]}, which rank {s.owner} has not read"
            return ""
        if s.op == "R":
            if a[0] != s.seq or a[1] != 2:
                what = {0: "nothing", 1: "a write in progress", 2: "", 3: "data already read"}[a[1]]
                return f"rank {r} reads {_name(s)} but finds round {a[0]} ({what or 'full'})"
            if a[3] != s.sig:
                return f"rank {r} reads {_name(s)} written by a call with another signature: a wrong sum, not reported"
            return ""
        if s.op == "RE" and (a[0] != s.seq or a[1] != 2):
            return f"rank {r}'s read of {_name(s)} was overwritten (now round {a[0]})"
        return ""

    def apply(s: Step) -> None:
        w = where(s)
        a = area.get(w, _EMPTY)
        if s.op == "W":
            area[w] = (s.seq, 1, 0, s.sig)
        elif s.op == "WE":
            area[w] = (s.seq, 2, 0, s.sig)
        elif s.op == "P":
            flag[w] = (s.seq, s.sig)
        elif s.op == "R":
            area[w] = (a[0], a[1], a[2] + 1, a[3])
        elif s.op == "RE":
            area[w] = (a[0], 3 if a[2] == 1 else a[1], a[2] - 1, a[3])

    done = [0] * nranks  # steps after pcs[r] already taken (the relaxed variants), a bit mask from pcs[r]

    def candidates(r: int) -> list[int]:
        prog, pc = progs[r], pcs[r]
        out = []
        for i in range(pc, min(len(prog), pc + _LOOKAHEAD)):
            if done[r] >> (i - pc) & 1:
                continue
            if all(done[r] >> (q - pc) & 1 or overtakes(variant, prog[i], prog[q]) for q in range(pc, i)):
                out.append(i)
            if variant.release_post and variant.acquire_wait:
                break
        return out

    def take(r: int, i: int) -> None:
        done[r] |= 1 << (i - pcs[r])
        while done[r] & 1:
            done[r] >>= 1
            pcs[r] += 1

    def dfs() -> Result | None:
        k = (key(), tuple(done))
        if k in seen:
            return None
        seen.add(k)
        if len(seen) > max_states:
            return Result(False, len(seen), f"more than {max_states} states")
        moved = False
        for r in range(nranks):
            if pcs[r] == len(progs[r]):
                continue
            for i in candidates(r):
                s = progs[r][i]
                why = fault(r, s)
                if why == "wait":
                    continue
                stops = why == "mismatch"  # recorded: this rank stops (the others see the record at their next check)
                if stops and not mismatch:
                    why = f"rank {r} records a mismatch at {_name(s)} although every rank makes the same calls"
                elif stops:
                    why = ""
                if why:
                    return Result(False, len(seen), why, [*trace, f"r{r} {_name(s)} {'D' if stops else s.op}"])
                moved = True
                saved_pc, saved_done, saved_a, saved_f = pcs[r], done[r], dict(area), dict(flag)
                if stops:
                    pcs[r], done[r] = len(progs[r]), 0
                    detected.add(r)
                else:
                    apply(s)
                    take(r, i)
                trace.append(f"r{r} {'D' if stops else s.op} {_name(s)}")
                bad = dfs()
                trace.pop()
                pcs[r], done[r] = saved_pc, saved_done
                detected.discard(r)
                area.clear()
                area.update(saved_a)
                flag.clear()
                flag.update(saved_f)
                if bad is not None:
                    return bad
        if not moved and mismatch and not detected:
            return Result(False, len(seen), "the calls differ but no rank recorded a mismatch", list(trace))
        if not moved and not detected and any(pcs[r] < len(progs[r]) for r in range(nranks)):
            stuck = ", ".join(f"r{r} at {progs[r][pcs[r]].op} {_name(progs[r][pcs[r]])}"
                              for r in range(nranks) if pcs[r] < len(progs[r]))
            return Result(False, len(seen), f"deadlock: {stuck}", list(trace))
        return None

    import sys

    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(max(limit, 20 * sum(len(p) for p in progs) + 1000))
    try:
        bad = dfs()
    finally:
        sys.setrecursionlimit(limit)
    return bad if bad is not None else Result(True, len(seen))


def _name(s: Step) -> str:
    return f"{'RS' if s.buf == RS else 'AG'}[{s.owner}<-{s.src}] round {s.seq}"


# What the sweep checks: the kernel's order (and the deeper pipelining the credit also allows),
# and the planted variants each of which must fail.
BENIGN: tuple[tuple[str, int, tuple[int, ...], Variant], ...] = (
    ("bulk-r2-calls-3-1-2", 2, (3, 1, 2), Variant()),
    ("bulk-r2-calls-1-1-1-1", 2, (1, 1, 1, 1), Variant()),
    ("bulk-r3-calls-2-1", 3, (2, 1), Variant()),
    ("bulk-r2-early-send", 2, (3, 2), Variant(early_send=True)),
)
PLANTED: tuple[tuple[str, int, tuple[int, ...], Variant], ...] = (
    ("bulk-one-parity", 2, (2, 1), Variant(parities=1)),
    ("bulk-post-before-data", 2, (1, 1), Variant(post_before_write_end=True)),
    ("bulk-send-two-ahead", 2, (4,), Variant(send_ahead=2)),
    # PTX: the flag's release/acquire is what orders the area (a relaxed post or wait, e.g. raw
    # ld.global.cg asm and plain stores outside memory.h, leaves it unordered)
    ("bulk-relaxed-post", 2, (2, 1), Variant(release_post=False)),
    ("bulk-relaxed-wait", 2, (2, 1), Variant(acquire_wait=False)),
)
# Call mismatches (the last rank's calls differ, as with the signature hook or another size): with
# signed flags every schedule ends in a recorded mismatch; without, a wrong sum is read unreported.
# (rounds, signature): calls of one signature have one round count.
MISMATCH: tuple[tuple[str, int, tuple[Call, ...], tuple[Call, ...], Variant], ...] = (
    ("bulk-mismatch-same-rounds", 2, ((2, 1),), ((2, 2),), Variant()),
    ("bulk-mismatch-other-rounds", 2, ((1, 1), (2, 3)), ((2, 2), (1, 1)), Variant()),
    ("bulk-mismatch-second-call", 2, ((2, 1), (1, 3)), ((2, 1), (1, 4)), Variant()),
    ("bulk-mismatch-r3", 3, ((1, 1), (1, 2)), ((1, 1), (1, 5)), Variant()),
)
MISMATCH_PLANTED: tuple[tuple[str, int, tuple[Call, ...], tuple[Call, ...], Variant], ...] = (
    ("bulk-unsigned-flags", 2, ((2, 1),), ((2, 2),), Variant(signed=False)),
    ("bulk-unsigned-flags-r3", 3, ((1, 1), (1, 2)), ((1, 1), (1, 5)), Variant(signed=False)),
)
