"""Line-level semantics of the three protocols: what a store writes and when a poll accepts.

Values are Python ints (exact sums, so any lost, duplicated or stale contribution changes the
result). Each function mirrors one device function, named in its docstring.
"""

from __future__ import annotations

from typing import Any

from .rules import ANY_TAG, DEVICE_LL, DEVICE_LL128, DEVICE_SENTINEL

#: Sentinel "empty": all ones, a NaN in every float dtype (``Bits<T>::kSentinel``). Data never
#: equals it because the sender canonicalises NaN (``ProtoSentinel::encode``); model data are ints.
EMPTY = None

#: LL line at rest: payload 0, every flag word 0 (``comm.state.DeviceMemory.init_scratch`` fills LL regions
#: with 0). ``rules.ll_rest`` gives the rest value of the configured line format.
LL_REST: tuple[int, Any] = (0, ((0, 0), (0, 0)))

#: One flag word: (tag, epoch & mask). A two-flag line's flag is a pair of them (one per 8-byte
#: word); the single-flag line (``Mutation.SINGLE_FLAG_LINE``) and LL128's signature word have one
#: (signature, epoch), a sentinel buffer's signature word (signature, None): no epoch field.
Flag = tuple[int, Any]


def _other_call(f: Flag, want: Flag) -> bool:
    """``ll_other_call``: a word that holds this epoch with another tag (another call). A flag whose
    tag is 0 is at rest (tags and signatures never are 0); a sentinel signature word has no epoch
    field (None on both sides), so any other signature is another call."""
    return f != want and f[0] != 0 and f[1] == want[1] and want[0] != ANY_TAG


def _epoch_only(f: Flag, want: Flag) -> bool:
    """``Mutation.LL_TAG_IGNORED``'s check of one word: written, and this epoch, whatever its tag."""
    return want[0] == ANY_TAG and f[1] == want[1] and f[0] != 0


def ll_check_flag(flag: Any, want: Any) -> int:
    """``ll_check`` (``protocol_ll.h``) on the flag part of a line, or a signature word
    (``SentinelSignature::check``, ``ll128::SignatureWord::check``): 1 when every word carries the
    wanted flag, -1 when a word carries this epoch (a sentinel word: none) with another tag, 0
    otherwise (not yet written, or torn: keep polling)."""
    if flag == want:
        return 1
    if isinstance(want[0], tuple):  # two-flag line: one flag per 8-byte word
        if _epoch_only(flag[0], want[0]) and _epoch_only(flag[1], want[1]):
            return 1
        return -1 if _other_call(flag[0], want[0]) or _other_call(flag[1], want[1]) else 0
    if _epoch_only(flag, want):
        return 1
    return -1 if _other_call(flag, want) else 0


def ll_try_load(content: tuple[Any, Any], want: Any) -> int:
    """``ProtoLL::check`` (``protocol_ll.h``): 1 data of this epoch and call, 0 not yet,
    -1 this epoch from a call with another signature (a call mismatch, reported)."""
    return ll_check_flag(content[1], want)


def sentinel_full(content: Any) -> bool:
    """``ProtoSentinel::check`` (``protocol_sentinel.h``): full when no element is the sentinel."""
    return content is not EMPTY


# ---- LL128 (ll128.h) ------------------------------------------------------------------------
# A warp covers W lines of L 16-byte lanes of E elements (device: W=4, L=8, E=4 fp32 elements).
# The first element of every line carries a counter (the sender puts 1 there); the last lane of
# the last line is free in the input and carries the W displaced first elements, so E == W.

Lane = tuple[int, ...]
Line128 = tuple[Lane, ...]


def ll128_payload(lines: int, lanes: int) -> int:
    """Elements one warp carries: every element slot but the counters and the displaced-elements lane."""
    return lines * lanes * lines - lines


def ll128_zero(lanes: int, elems: int) -> Line128:
    return tuple((0,) * elems for _ in range(lanes))


def ll128_pack(data: tuple[int, ...], lines: int, lanes: int, counter: int = 1) -> list[Line128]:
    """Sender side of ``ll128.h``: displace the first element of each line into the last lane of the
    last line and put the counter increment in its place (1; 0 in split mode, where the counter
    travels in a separate add)."""
    e = lines  # elements per lane
    per_line = lanes * e
    total = lines * per_line
    assert len(data) == total - e, (len(data), total, e)
    flat = list(data) + [0] * e
    for ln in range(lines):
        flat[total - e + ln] = flat[ln * per_line]
        flat[ln * per_line] = counter
    return [
        tuple(tuple(flat[ln * per_line + k * e: ln * per_line + (k + 1) * e]) for k in range(lanes))
        for ln in range(lines)
    ]


def ll128_counter(line: Line128) -> int:
    """The counter the owner polls: the first element of lane 0."""
    return line[0][0]


def ll128_restore(snapshots: list[Line128], lines: int, lanes: int) -> tuple[int, ...]:
    """Owner side of ``ll128.h``: restore the displaced first elements from the last lane."""
    e = lines
    per_line = lanes * e
    total = lines * per_line
    flat = [v for line in snapshots for lane in line for v in lane]
    for ln in range(lines):
        flat[ln * per_line] = flat[total - e + ln]
    return tuple(flat[: total - e])


def lane_add(line: Line128, lane: int, vals: Lane) -> Line128:
    """One lane's 16-byte add (``red.add.v4``), applied as a unit (the split kernel does not need
    more: its counter travels in a separate add after a fence)."""
    old = line[lane]
    new = tuple(a + b for a, b in zip(old, vals, strict=True))
    return line[:lane] + (new,) + line[lane + 1:]


def line_add(line: Line128, vals: Line128) -> Line128:
    """A 128-byte line-atomic add (the hardware assumption ``Config.ll128_line_atomic``)."""
    return tuple(tuple(a + b for a, b in zip(x, y, strict=True)) for x, y in zip(line, vals, strict=True))


def vadd(a: Any, b: Any) -> Any:
    """Reduction operator (sum) on scalars or element vectors; 0 is the identity of both."""
    if isinstance(a, tuple):
        return tuple(x + y for x, y in zip(a, b, strict=True)) if isinstance(b, tuple) else a
    if isinstance(b, tuple):
        return b if a == 0 else tuple(a + y for y in b)
    return a + b


__all__ = [
    "DEVICE_LL", "DEVICE_LL128", "DEVICE_SENTINEL", "EMPTY", "LL_REST", "Flag", "ll_check_flag", "ll_try_load",
    "sentinel_full", "ll128_payload", "ll128_zero", "ll128_pack", "ll128_counter", "ll128_restore",
    "lane_add", "line_add", "vadd",
]
