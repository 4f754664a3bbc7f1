"""Host time per eager call (no graph): the loop is host-bound when a call's GPU time is shorter
than its Python time, so wall time / calls is the Python + launch overhead. Reference: torch's
own `x.add_(1)` measured the same way, through sollat's one launcher (the prepacked driver call;
cuda.core.launch cannot pass the rank table). Each figure is
the fastest of five runs of 2000 calls: host noise (other tenants, frequency changes) only ever adds time."""

from __future__ import annotations

import argparse
import sys

import torch
from _host_timing import eager_us

import sollat
from sollat import testing

CALLS = 2000


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--ranks", type=int, nargs="+", choices=range(2, 9), default=[2, 4, 8], metavar="R",
                   help="virtual rank counts (default: 2 4 8)")
    a = p.parse_args(argv)
    dev = torch.device("cuda", 0)
    x = torch.randn(32, device=dev)
    print(f"torch x.add_(1): {eager_us(lambda: x.add_(1), CALLS):.2f} us", flush=True)
    for r in a.ranks:
        c = sollat.VirtualCommunicator(r, dev)
        xs = [torch.randn(32, device=dev) for _ in range(r)]
        outs = [torch.empty_like(v) for v in xs]
        a = eager_us(lambda c=c, xs=xs, outs=outs: c.all_reduce(xs, algo="oneshot_ll", out=outs), CALLS)
        b = eager_us(lambda c=c, xs=xs: c.all_reduce(xs, algo="oneshot_ll"), CALLS)
        d = eager_us(lambda c=c, xs=xs: c.all_reduce(xs), CALLS)
        # The same kernel launched directly with prepacked arguments: the launch's own cost.
        e = eager_us(testing.bare_launch(c, xs, outs, algo="oneshot_ll"), CALLS)
        print(f"R={r} virtual: out given {a:.2f} us; new outputs {b:.2f} us; "
              f"algo=auto, new outputs {d:.2f} us; bare launch of the same kernel and arguments {e:.2f} us",
              flush=True)
    communicator_path(dev)
    return 0


def communicator_path(dev: torch.device) -> None:
    """Communicator.all_reduce's eager path (one tensor per rank) needs a process group and a GPU
    per rank, so it cannot run here as is. Its host cost is measured with a Communicator object
    that borrows a 2-rank VirtualCommunicator's state and whose launch is that communicator's
    (the same prepacked driver call, with 24 instead of 10 arguments): every call still runs a
    real kernel, and everything else is Communicator's own hot path."""
    vc = sollat.VirtualCommunicator(2, dev)
    xs = [torch.randn(32, device=dev) for _ in range(2)]
    outs = [torch.empty_like(v) for v in xs]
    comm = testing.borrowed_communicator(vc, testing.bare_launch(vc, xs, outs, algo="oneshot_ll"))
    a = eager_us(lambda: comm.all_reduce(xs[0], algo="oneshot_ll", out=outs[0]), CALLS)
    b = eager_us(lambda: comm.all_reduce(xs[0], algo="oneshot_ll"), CALLS)
    print(f"Communicator hot path (one tensor), driver launcher: out given {a:.2f} us; new output {b:.2f} us",
          flush=True)


if __name__ == "__main__":
    sys.exit(main())
