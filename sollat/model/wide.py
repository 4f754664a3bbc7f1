"""The wide one-shot (``kernels/allreduce_oneshot_wide.cu``) as thread programs: a thread per
(peer group, line) channel, paired with its peers' threads by ``sendToSlot``.

Thread (g, j) of block b owns channel ``s(g, j) = slot_index(b, 0, g * lb + j)``, ``lb`` lines per
block whatever the message (``peer_group_lines``: the world size alone fixes it). In every pass
in which line j of the block exists it stores the line to each peer q of group g, into q's slot
``s(group of this rank, j)`` (``sendToSlot``: that slot's reader on q is the thread that sends
this rank line j), then polls line j from each peer of group g at its own slot (``recvWindow``,
which marks the channel used even when the group holds no peer), and advances its epoch. So rank
r's thread (group(q), j) and q's thread (group(r), j) form one credit loop of ``ll_buffer.h``: each
sends the other line j and receives line j from it once per pass, a receive and the next send
separated by the buffer's fence; their epochs agree because both count the passes in which line
j of the block existed.

The model checks, per line, the part of its sum a thread receives: the sum over its group's
ranks (``rules.out_lines``); the block's reduction of those parts from shared memory, after its
barrier, is local arithmetic. The model's window is ``Config.peer_window`` (the device's is 8), so
that a few ranks form several groups.
"""

from __future__ import annotations

from . import rules
from .config import Mutation
from .generator import ProgramGenerator
from .program import ADDC, OUT, SEND, Builder, Epochs, ThreadProgram, input_value


class WideOneshot(ProgramGenerator):
    """The wide one-shot's thread programs (``_Gen.make`` dispatches to ``oneshot_wide``)."""

    def oneshot_wide(self, r: int, k: int, n: int, epochs: Epochs) -> list[ThreadProgram]:
        cfg, R, W = self.cfg, self.cfg.nranks, self.cfg.peer_window
        groups = rules.wide_groups(cfg)
        geo = rules.wide_geometry(cfg, n)
        lb = geo.threads // groups
        sig = self.sig(r, k, n)
        threads = []
        for b in range(geo.blocks):
            for g in range(groups):
                peers = list(range(g * W, min(g * W + W, R)))  # the ranks of group g
                for j in range(lb):
                    B = Builder(cfg, f"r{r} call{k} b{b}.g{g}.l{j}")
                    s = rules.wide_channel(b, g, j, lb)
                    # the reader of this thread's line at every peer: thread (group of this rank, j)
                    reader = s if cfg.has(Mutation.WIDE_OWN_SLOT) else rules.wide_channel(b, r // W, j, lb)
                    for it in range(geo.iterations):
                        x = (it * geo.blocks + b) * lb + j  # line_of(base): the block's line j of the pass
                        if x >= n:
                            break  # lines only shrink at the end: no later pass has it either
                        B.at(it, 0)
                        e = epochs.get(("wide", s), 0)
                        for q in peers:  # buf.sendToSlot(q, reader_slot, v)
                            if q != r:
                                B.before_send("wide")
                                B.emit(SEND, line=self.line(q, "wide", e, r, reader), value=self.inp(r, k, x),
                                       flag=self.flag(sig, e), tag=(k, x, e), peer=q)
                        got = B.reg()
                        items = [(q, 0, s, got, (k, x, e)) for q in peers if q != r]
                        self._poll_all(B, r, "wide", items, sig, epochs)  # buf.recvWindow(1, q0, ...)
                        if r in peers:  # the own line (g == 0 keeps it in shared memory on the device)
                            B.emit(ADDC, reg=got, value=self.inp(r, k, x))
                        B.emit(OUT, reg=got, expect=sum(input_value(q, k, x) for q in peers), value=x * groups + g)
                        B.advance(epochs, ("wide", s))  # buf.advanceEpoch(): channel 0 used in every pass
                    threads.append(B.end())  # buf.commit()
        return threads
