"""The bulk protocol's area model (sollat/model/bulk.py): the kernel's order is clean under every
schedule, and each planted variant is caught with the violation it plants."""

from __future__ import annotations

import pytest

from sollat.model import bulk


@pytest.mark.parametrize(("name", "nranks", "calls", "variant"), bulk.BENIGN, ids=[b[0] for b in bulk.BENIGN])
def test_the_kernels_order_is_clean(name: str, nranks: int, calls: tuple[int, ...], variant: bulk.Variant) -> None:
    res = bulk.explore(nranks, calls, variant)
    assert res.ok, f"{name}: {res.violation}\n" + "\n".join(res.trace[-12:])
    assert res.states > 100  # the search explored interleavings, not one schedule


@pytest.mark.parametrize(("name", "nranks", "calls", "variant", "says"), [
    (*bulk.PLANTED[0], "has not read"),
    (*bulk.PLANTED[1], "write in progress"),
    (*bulk.PLANTED[2], "has not read"),
], ids=[p[0] for p in bulk.PLANTED])
def test_planted_bugs_are_caught(name: str, nranks: int, calls: tuple[int, ...], variant: bulk.Variant, says: str) -> None:
    res = bulk.explore(nranks, calls, variant)
    assert not res.ok and says in res.violation, f"{name}: {res.violation or 'not caught'}"
    assert res.trace, "a counterexample comes with its schedule"


def test_the_program_follows_the_kernel() -> None:
    # rank 0 of 2, one call of 2 rounds: RS 1 sent; round 1 (wait, reduce, AG, RS 2, wait, copy); round 2
    ops = [(s.op, "RS" if s.buf == bulk.RS else "AG", s.seq) for s in bulk.program(0, 2, (2,), bulk.Variant())]
    assert ops == [("W", "RS", 1), ("WE", "RS", 1), ("P", "RS", 1),
                   ("A", "RS", 1), ("R", "RS", 1), ("RE", "RS", 1), ("W", "AG", 1), ("WE", "AG", 1), ("P", "AG", 1),
                   ("W", "RS", 2), ("WE", "RS", 2), ("P", "RS", 2), ("A", "AG", 1), ("R", "AG", 1), ("RE", "AG", 1),
                   ("A", "RS", 2), ("R", "RS", 2), ("RE", "RS", 2), ("W", "AG", 2), ("WE", "AG", 2), ("P", "AG", 2),
                   ("A", "AG", 2), ("R", "AG", 2), ("RE", "AG", 2)]
