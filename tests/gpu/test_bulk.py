"""GPU correctness of the bulk two-shot (``twoshot_bulk``, kernels/allreduce_bulk.cu) where the
generic tests do not reach: messages of several rounds (every area reused in both parities within
one call), calls of different round and block counts back to back (a channel's sequence continues
across calls), in place, misaligned views, eagerly and inside a CUDA graph. Bitwise against the
rank-order reference, outputs poisoned first, fresh inputs every call."""

from __future__ import annotations

import pytest
import torch

import sollat
from sollat import testing
from sollat.device import abi, layout

from ._graphs import capture_and_replay
from ._reference import assert_bitwise, nan_or_exact_bad, random_inputs, rank_order_reduce

pytestmark = pytest.mark.gpu

DEV = torch.device("cuda", 0) if torch.cuda.is_available() else None
ALGO = "twoshot_bulk"


def round_elems(r: int, dtype: torch.dtype, blocks: int = layout.MAX_BLOCKS_VIRTUAL) -> int:
    """Elements one round of the largest geometry moves (every block's area full, every chunk)."""
    per_line = layout.LINE_BYTES // torch.tensor([], dtype=dtype).element_size()
    return blocks * abi.BULK_DATA_LINES * per_line * r


def _check(c: sollat.VirtualCommunicator, xs: list[torch.Tensor], outs: list[torch.Tensor], what: str) -> None:
    ref = rank_order_reduce(xs, "sum")
    for k, y in enumerate(outs):
        assert_bitwise(y, ref, f"{what} rank {k}")


@pytest.mark.parametrize("r", [2, 4, 8])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64], ids=str)
def test_several_rounds_and_changing_geometry(r: int, dtype: torch.dtype) -> None:
    c = sollat.VirtualCommunicator(r, DEV, timeout_s=2.0, algorithms=[ALGO])
    gen = torch.Generator(device=DEV).manual_seed(11 * r)
    one = round_elems(r, dtype)
    # 3 rounds + a tail, 1 block, 2 rounds exactly, an odd tail, 5 rounds - 1 element, a small one
    sizes = [3 * one + 1001, 33, 2 * one, one + 7, 5 * one - 1, 4097, 3 * one + 1001]
    for i, n in enumerate(sizes):
        xs = random_inputs(r, n, dtype, DEV, gen)
        outs = [torch.full_like(x, float("nan")) for x in xs]
        c.all_reduce(xs, algo=ALGO, out=outs)
        _check(c, xs, outs, f"call {i} n={n} {dtype} R={r}")
    c.check()


@pytest.mark.parametrize("r", [2, 4])
def test_in_place_and_misaligned_over_several_rounds(r: int) -> None:
    c = sollat.VirtualCommunicator(r, DEV, timeout_s=2.0, algorithms=[ALGO])
    gen = torch.Generator(device=DEV).manual_seed(5)
    n = 2 * round_elems(r, torch.bfloat16) + 333
    xs = random_inputs(r, n, torch.bfloat16, DEV, gen)
    ys = [x.clone() for x in xs]
    c.all_reduce(ys, algo=ALGO, out=ys)
    _check(c, xs, ys, "in place")
    bufs = [torch.full((n + 8,), float("nan"), dtype=torch.bfloat16, device=DEV) for _ in range(r)]
    obufs = [torch.full((n + 8,), float("nan"), dtype=torch.bfloat16, device=DEV) for _ in range(r)]
    for b, x in zip(bufs, xs, strict=True):
        b[1:1 + n].copy_(x)
    outs = [o[3:3 + n] for o in obufs]
    c.all_reduce([b[1:1 + n] for b in bufs], algo=ALGO, out=outs)
    _check(c, xs, outs, "misaligned")
    for o in obufs:
        assert bool(torch.isnan(o[:3]).all()) and bool(torch.isnan(o[3 + n:]).all()), "wrote outside the view"
    c.check()


def test_graph_of_mixed_round_counts() -> None:
    """A CUDA graph of 40 calls of 1 to 4 rounds (and one-block calls), replayed with fresh inputs."""
    r = 2
    c = sollat.VirtualCommunicator(r, DEV, timeout_s=2.0, algorithms=[ALGO])
    gen = torch.Generator(device=DEV).manual_seed(9)
    one = round_elems(r, torch.float32)
    sizes = [one * k + 17 * k for k in (1, 2, 3, 4)] + [100, 5000]
    calls = []
    for k in range(40):
        xs = random_inputs(r, sizes[(k * 5) % len(sizes)], torch.float32, DEV, gen)
        calls.append((xs, [torch.empty_like(x) for x in xs]))
    for xs, outs in calls[:len(sizes) * 2]:
        c.all_reduce(xs, algo=ALGO, out=outs)
    torch.cuda.synchronize()

    def issue() -> None:
        for xs, outs in calls:
            c.all_reduce(xs, algo=ALGO, out=outs)

    def check_replay(replay: int) -> None:
        for k, (xs, outs) in enumerate(calls):
            _check(c, xs, outs, f"replay {replay} call {k}")

    capture_and_replay(issue, inputs=[x for xs, _ in calls for x in xs], poisoned=[o for _, outs in calls for o in outs],
                       gen=gen, replays=3, check=check_replay)
    c.check()


@pytest.mark.parametrize("r", [2, 4])
def test_a_peer_with_another_signature_is_a_mismatch_on_every_rank(r: int) -> None:
    """The area flags carry the call signature: a rank whose call differs (here the test hook flips
    a bit of the last rank's signature, on a shape every rank already used, so the host's first-use
    agreement does not see it) is reported as a call mismatch naming it, on every rank, and no
    output holds a wrong sum (each element NaN or exact). Then reset() and a correct call."""
    c = sollat.VirtualCommunicator(r, DEV, timeout_s=2.0, algorithms=[ALGO])
    gen = torch.Generator(device=DEV).manual_seed(31 + r)
    n = 3 * round_elems(r, torch.float32) + 1001
    xs = random_inputs(r, n, torch.float32, DEV, gen)
    c.all_reduce(xs, algo=ALGO, out=[torch.empty_like(x) for x in xs])
    c.check()
    testing.inject(c, mismatch=r - 1)
    outs = [torch.full_like(x, float("nan")) for x in xs]
    with pytest.raises(sollat.CallMismatchError) as e:
        c.all_reduce(xs, algo=ALGO, out=outs)
        c.check()
    assert r - 1 in (e.value.rank, e.value.peer), f"the error names neither rank {r - 1}: {e.value}"
    for rank, view in c._record_views():
        assert int(view[0]) == abi.FAULT_CODES["mismatch"], f"rank {rank}'s record: code {int(view[0])}"
    ref = rank_order_reduce(xs, "sum")
    for k, y in enumerate(outs):
        assert int(nan_or_exact_bad(y, ref)) == 0, f"rank {k}: a faulted call left a wrong value"
    testing.clear(c)
    c.reset()
    outs = [torch.full_like(x, float("nan")) for x in xs]
    c.all_reduce(xs, algo=ALGO, out=outs)
    _check(c, xs, outs, "after reset")
    c.check()
