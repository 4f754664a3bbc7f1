"""How the model's traces and violations word what a line holds: tags, flags, ghost states, ranks."""

from __future__ import annotations

from typing import Any

from .program import POLL128, Instr
from .scratch import FREE, STATUS_NAMES, Ghost


def fmt_tag(tag: Any) -> str:
    """A ghost tag: the call, message line and epoch of the data (and its sender, if known)."""
    if tag is None:
        return "nothing"
    (k, m, e), *rest = tag if isinstance(tag[0], tuple) else (tag,)
    who = f" from r{rest[0]}" if rest else ""
    what = f"line {m}" if m >= 0 else f"channel {-1 - m}'s signature word"  # ProgramGenerator.sig_send
    return f"call {k} {what} epoch {e}{who}"


def line_status(g: Ghost) -> str:
    """A line's ghost state in words."""
    if g[0] == FREE and g[1] is not None:
        return "already consumed"
    return STATUS_NAMES[g[0]]


def ranks_text(mask: int, nranks: int) -> str:
    """The ranks of a contributor bit mask."""
    got = [q for q in range(nranks) if mask >> q & 1]
    return f"ranks {got} only" if got else "no rank yet"


def fmt_flag(flag: Any) -> str:
    """An LL flag (signature, epoch), a two-flag line's flags, a sentinel signature word
    (signature, None), or a sentinel line's none."""
    if flag is None:
        return "no flag"
    if isinstance(flag[0], tuple):  # two-flag line: (tag, epoch) per 8-byte word
        return "flags(" + ", ".join(f"w{h}={f[0]:#06x}:{f[1]}" for h, f in enumerate(flag)) + ")"
    if flag[1] is None:  # a sentinel buffer's signature word: 0 is empty
        return f"(sig={flag[0]:#010x})" if flag[0] else "(empty)"
    return f"(sig={flag[0]:#010x}, epoch={flag[1]})"


def waiting_text(ins: Instr, name: str, held: Any, g: Ghost) -> str:
    """A deadlock's account of a poll that waits: what it wants, what the line ``name`` holds."""
    if ins.flag is not None:
        want = fmt_flag(ins.flag)
    else:
        want = f"counter == {ins.expect}" if ins.op == POLL128 else "data"
    return (f"{ins.where} waits on {name} for {want} ({fmt_tag(ins.tag)}); "
            f"it holds {held!r}, {fmt_tag(g[1])} ({line_status(g)})")
