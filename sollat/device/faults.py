"""The fault record and the timeouts: what the host makes of a device-side fault.

Every rank's symmetric scratch starts with its fault record (``abi.FAULT_RECORD_OFFSET``; the words
and codes are declared in ``abi.py``, the device side is ``csrc/include/sollat/fault.h``). A kernel thread that
detects a fault writes it into its own record and every peer's, so every rank raises the same
exception, naming the rank that detected it and the peer involved. Until ``reset()`` every
kernel of the communicator refuses to run and writes NaN outputs.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence

import numpy as np

from ..errors import CallMismatchError, PeerTimeoutError, SollatError, UnsupportedError
from . import abi, environment

# The timeouts' defaults and bound are their variables' (environment.py: SOLLAT_TIMEOUT_S,
# SOLLAT_SETUP_TIMEOUT_S), declared there once.
DEFAULT_TIMEOUT_S = environment.DEFAULT_TIMEOUT_S
DEFAULT_SETUP_TIMEOUT_S = environment.DEFAULT_SETUP_TIMEOUT_S
MAX_TIMEOUT_S = environment.MAX_TIMEOUT_S
OK, TIMEOUT, MISMATCH, CLAIMED = (abi.FAULT_CODES[k] for k in ("ok", "timeout", "mismatch", "claimed"))
_WORD = {name: i for i, name in enumerate(abi.FAULT_RECORD_WORDS)}
_COLLECTIVE = {code: name for name, code in abi.COLLECTIVES.items()}


def collective_label(code: int) -> str:
    """What a record's collective word names: the public call (``all_gather``), ``run`` for a
    user-written collective, or a neutral word for a build the host did not label."""
    name = _COLLECTIVE.get(code, "unknown")
    if name == "unknown":
        return "the collective"
    return "run (a user-written collective)" if name == "run" else name


def validated_timeout(value: object, *, what: str, env: str, default: float) -> float:
    """Seconds from an argument, else the environment variable ``env``, else ``default``:
    a finite number > 0 and at most a week, or an UnsupportedError saying what was wrong."""
    source = what
    if value is None:
        return default if environment.raw(env) is None else float(environment.value(env))
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise UnsupportedError(f"sollat: {source} must be a number of seconds, got {value!r}")
    v = float(value)
    if not math.isfinite(v) or v <= 0 or v > MAX_TIMEOUT_S:
        raise UnsupportedError(f"sollat: {source} must be > 0 and at most {MAX_TIMEOUT_S:g} s, got {value!r}")
    return v


def setup_timeout() -> float:
    """``$SOLLAT_SETUP_TIMEOUT_S`` (or the default) for a host wait of the integrations: a value
    that became invalid after start-up's check gives the default, since the wait needs a bound."""
    try:
        return validated_timeout(None, what="setup timeout", env="SOLLAT_SETUP_TIMEOUT_S",
                                 default=DEFAULT_SETUP_TIMEOUT_S)
    except UnsupportedError:
        return DEFAULT_SETUP_TIMEOUT_S


def read_record(read: Callable[[], np.ndarray], *, settle_s: float = 1.0) -> np.ndarray:
    """The record's words as int64 (a peer writes it with a claim, details, then the code: a
    claimed record is re-read until its writer has published the code, at most ``settle_s``)."""
    rec = read().astype(np.int64) & 0xFFFFFFFF
    deadline = time.monotonic() + settle_s
    while rec[_WORD['code']] == CLAIMED and time.monotonic() < deadline:
        time.sleep(0.001)
        rec = read().astype(np.int64) & 0xFFFFFFFF
    return rec


def first_fault(records: Sequence[np.ndarray]) -> np.ndarray | None:
    """The first record (in rank order) that holds a fault, or None."""
    for rec in records:
        if rec[_WORD['code']] != OK:
            return rec
    return None


def _signed(v: int) -> int:
    return v - (1 << 32) if v >= 1 << 31 else v


def to_exception(rec: np.ndarray, *, timeout_s: float, where_seen: int) -> SollatError:
    """The exception for a fault record (``where_seen``: the rank whose record it is)."""
    w = {name: int(rec[i]) for name, i in _WORD.items()}
    code, seen = w["code"], w["seen"]
    rank, peer, block, thread, slot, epoch = (_signed(w[k]) for k in ("rank", "peer", "block", "thread", "slot", "epoch"))
    what = collective_label(w["collective"])
    by = "" if rank == where_seen else f" (reported to rank {where_seen} by rank {rank})"
    where = f"rank {rank} waited for peer {peer}; block {block}, thread {thread}, slot {slot}, epoch {epoch}"
    fix = "Every later call of this communicator fails until reset() is called on every rank."
    if code == CLAIMED:
        return SollatError(f"sollat: a peer started to record a fault{by} but did not finish within 1 s; {fix}")
    if code == MISMATCH and peer < 0:
        return CallMismatchError(
            f"sollat {what}: an LL128 line counter on rank {rank} overshot the world size (0x{seen:08x}): a peer "
            f"called with different arguments{by}. {fix}", rank=rank, peer=peer)
    if code == TIMEOUT:
        who = f"peer {peer}" if peer >= 0 else "some peer (an LL128 line counter did not reach the world size)"
        return PeerTimeoutError(
            f"sollat {what}: {who} did not deliver its data to rank {rank} within {timeout_s:g} s ({where}){by}. "
            f"Is {who} alive, and did every rank make the same calls in the same order? {fix}",
            rank=rank, peer=peer, slot=slot, epoch=epoch)
    if code == MISMATCH:
        # `seen` is the peer's signature as the line carried it: exact from a sentinel signature word
        # or a bulk flag; from an LL line its two 16-bit tags (bit 16 always set, a half from another
        # epoch 0).
        return CallMismatchError(
            f"sollat {what}: peer {peer} called {what} with different arguments than rank {rank} (size, dtype, "
            f"op or algorithm, or, where this AllReduce serves all_reduce_rmsnorm's unfused algorithm, rows, "
            f"hidden size, eps or the FP8 copy; the signature it sent 0x{seen:08x}; {where}){by}. {fix}", rank=rank, peer=peer)
    return SollatError(f"sollat: unknown device fault code {code} ({where}){by}. {fix}")
