"""Calls in place in symmetric memory (``Communicator.empty``): which views run zero-copy, which path
``auto`` takes on them, and the bench's auto-against-peers column. No GPU: the allocation itself
and the two-shot call run in the real-rank suite (tests/gpu/mp_suite.py, section ``symmetric``)."""

from __future__ import annotations

import pytest
import torch

from sollat.bench.results import Row
from sollat.bench.table import best_peer, format_panel
from sollat.collectives import handover, select
from sollat.comm.real import Communicator


def _held(t: torch.Tensor) -> handover.SymmetricTensors:
    st = handover.SymmetricTensors("g", torch.device("cpu"))
    st._bases[t.untyped_storage().data_ptr()] = t  # as SymmetricTensors.empty records it
    return st


def test_zero_copy_needs_a_held_allocation_in_place_and_16_byte_aligned() -> None:
    base = torch.empty(4096, dtype=torch.float32)
    st = _held(base)
    assert bool(st)
    assert st.zero_copy(base, base) and st.zero_copy(base[4:100], base[4:100])
    bf = base.view(torch.bfloat16)
    assert st.zero_copy(bf[8:], bf[8:])
    # out of place: the op overwrites this rank's chunk of its input, so never zero-copy
    assert not st.zero_copy(base, torch.empty(4096, dtype=torch.float32))
    assert not st.zero_copy(base[4:100], base[8:104])
    assert not st.zero_copy(base[1:], base[1:])  # 4-byte offset: the copy path
    assert not st.zero_copy(bf[3:], bf[3:])
    other = torch.empty(4096, dtype=torch.float32)
    assert not st.zero_copy(other, other)
    assert not handover.SymmetricTensors("g", torch.device("cpu"))


@pytest.mark.parametrize(("name", "algo", "nbytes", "dtype", "op", "want"), [
    ("nccl", "auto", 64 << 20, torch.float32, "sum", select.TORCH_TWOSHOT_ZERO_COPY),
    ("torch_twoshot", "auto", 8 << 20, torch.bfloat16, "sum", select.TORCH_TWOSHOT_ZERO_COPY),
    ("torch_twoshot", "torch_twoshot", 8 << 20, torch.float32, "sum", select.TORCH_TWOSHOT_ZERO_COPY),
    ("twoshot_bulk", "auto", 16 << 20, torch.float32, "sum", select.TORCH_TWOSHOT_ZERO_COPY),  # no copy either
    ("twoshot_bulk", "twoshot_bulk", 16 << 20, torch.float32, "sum", "twoshot_bulk"),  # named: honoured
    ("oneshot_sentinel", "auto", 1 << 20, torch.float32, "sum", "oneshot_sentinel"),  # sollat's own: unchanged
    ("nccl", "nccl", 64 << 20, torch.float32, "sum", "nccl"),  # named: honoured
    ("nccl", "auto", 64 << 20, torch.float16, "sum", "nccl"),  # torch's two-shot: fp32 and bf16 only
    ("nccl", "auto", 64 << 20, torch.float32, "max", "nccl"),  # sum only
    ("nccl", "auto", (8 << 20) + 2, torch.bfloat16, "sum", "nccl"),  # multiples of 4 bytes only
])
def test_auto_takes_the_zero_copy_two_shot_where_it_would_hand_over(
        monkeypatch: pytest.MonkeyPatch, name: str, algo: str, nbytes: int, dtype: torch.dtype, op: str,
        want: str) -> None:
    monkeypatch.setattr(handover, "torch_twoshot_available", lambda world_size: True)
    comm = Communicator.__new__(Communicator)  # the rule needs no process group
    comm.world_size, comm._batch_invariant = 4, False
    assert comm._symmetric_path(name, algo, nbytes, dtype, op) == want


def test_without_torchs_two_shot_the_handover_stays(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(handover, "torch_twoshot_available", lambda world_size: False)
    comm = Communicator.__new__(Communicator)
    comm.world_size, comm._batch_invariant = 4, False
    assert comm._symmetric_path("nccl", "auto", 64 << 20, torch.float32, "sum") == "nccl"


@pytest.mark.parametrize("world_size", [3, 5, 6, 7, 9, 16])
def test_torchs_symmetric_ops_are_never_chosen_where_they_raise(world_size: int) -> None:
    """torch's one- and two-shot kernels exist for 2, 4 and 8 ranks only ("Not implemented for
    world_size=3" from inside the op): at other sizes no two-shot buffer, no zero-copy path."""
    assert not handover.torch_twoshot_available(world_size)
    comm = Communicator.__new__(Communicator)
    comm.world_size, comm._batch_invariant = world_size, False
    assert comm._symmetric_path("nccl", "auto", 64 << 20, torch.float32, "sum") == "nccl"
    assert comm._symmetric_path("torch_twoshot", "torch_twoshot", 8 << 20, torch.float32, "sum") == "torch_twoshot"
    assert comm._torch_twoshot_capacity(64 << 20) == 0


def _row(impl: str, algo: str, nbytes: int, us: float, check: str = "ok") -> Row:
    return Row(impl, algo, 2, "float32", nbytes, median_us=us, check=check, selected="x" if "auto" in algo else "")


def test_best_peer_skips_sollat_failures_and_mismatches() -> None:
    rows = [_row("sollat", "oneshot_ll", 8, 1.0), _row("nccl", "default", 8, 15.0),
            _row("torch-symm", "two_shot", 8, 6.0, check="mismatch (x)"), _row("torch-symm", "one_shot", 8, 7.0),
            Row("nccl-window", "default", 2, "float32", 8, status="error")]
    peer = best_peer(rows, 8)
    assert peer is not None and (peer.impl, peer.algo) == ("torch-symm", "one_shot")
    assert best_peer(rows, 16) is None


def test_the_table_shows_each_auto_against_the_fastest_peer() -> None:
    rows = [_row("sollat", "oneshot_ll", 1 << 20, 5.0), _row("sollat", "auto", 1 << 20, 5.5),
            _row("sollat", "auto_symm", 1 << 20, 5.0), _row("nccl", "default", 1 << 20, 20.0),
            _row("torch-symm", "two_shot", 1 << 20, 10.0)]
    text = format_panel({"mode": "distributed", "ranks": [2], "dtypes": ["float32"]}, 0.6, 1.0, rows, 2, "float32")
    head = next(line for line in text.splitlines() if "auto/peer" in line).split()
    line = next(line for line in text.splitlines() if line.strip().startswith("1 MiB")).split()
    assert head[-2:] == ["auto/peer", "auto_symm/peer"]
    assert line[-2:] == ["0.55", "0.50"]  # 5.5 / 10 and 5.0 / 10: torch's two-shot is the best peer
    assert line[-3] == "oneshot_ll"  # best overall excludes the auto rows
