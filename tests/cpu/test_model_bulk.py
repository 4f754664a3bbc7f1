"""The bulk protocol's area model (sollat/model/bulk.py): the kernel's order is clean under every
schedule, each planted variant is caught with the violation it plants, and a call mismatch is
recorded in every schedule (the flags carry the call signature), never summed."""

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
    (*bulk.PLANTED[3], "write in progress"),
    (*bulk.PLANTED[4], "finds round 0"),
], ids=[p[0] for p in bulk.PLANTED])
def test_planted_bugs_are_caught(name: str, nranks: int, calls: tuple[int, ...], variant: bulk.Variant, says: str) -> None:
    res = bulk.explore(nranks, calls, variant)
    assert not res.ok and says in res.violation, f"{name}: {res.violation or 'not caught'}"
    assert res.trace, "a counterexample comes with its schedule"


def test_relaxed_flags_only_reorder_what_release_acquire_would_order() -> None:
    # PTX (ISA §8.8, §8.9.5): with release/acquire nothing of a rank's program moves; relaxed, a
    # post may pass its data and the data accesses after a wait may pass the wait, nothing else.
    v = bulk.Variant()
    w, we, p, a, r = (bulk.Step(op, bulk.RS, 0, 1, 1) for op in ("W", "WE", "P", "A", "R"))
    assert not any(bulk.overtakes(v, x, y) for x in (w, we, p, a, r) for y in (w, we, p, a, r))
    rel = bulk.Variant(release_post=False)
    assert bulk.overtakes(rel, p, we) and bulk.overtakes(rel, p, w) and not bulk.overtakes(rel, r, a)
    acq = bulk.Variant(acquire_wait=False)
    assert bulk.overtakes(acq, r, a) and bulk.overtakes(acq, w, a) and not bulk.overtakes(acq, p, we)
    assert not bulk.overtakes(acq, a, r)  # a wait never passes what comes before it


def test_the_program_follows_the_kernel() -> None:
    # rank 0 of 2, one call of 2 rounds: RS 1 sent; round 1 (wait, reduce, AG, RS 2, wait, copy); round 2
    ops = [(s.op, "RS" if s.buf == bulk.RS else "AG", s.seq) for s in bulk.program(0, 2, (2,), bulk.Variant())]
    assert ops == [("W", "RS", 1), ("WE", "RS", 1), ("P", "RS", 1),
                   ("A", "RS", 1), ("R", "RS", 1), ("RE", "RS", 1), ("W", "AG", 1), ("WE", "AG", 1), ("P", "AG", 1),
                   ("W", "RS", 2), ("WE", "RS", 2), ("P", "RS", 2), ("A", "AG", 1), ("R", "AG", 1), ("RE", "AG", 1),
                   ("A", "RS", 2), ("R", "RS", 2), ("RE", "RS", 2), ("W", "AG", 2), ("WE", "AG", 2), ("P", "AG", 2),
                   ("A", "AG", 2), ("R", "AG", 2), ("RE", "AG", 2)]


@pytest.mark.parametrize(("name", "nranks", "calls", "last", "variant"), bulk.MISMATCH, ids=[m[0] for m in bulk.MISMATCH])
def test_a_call_mismatch_is_recorded_in_every_schedule(name: str, nranks: int, calls: tuple[bulk.Call, ...],
                                                         last: tuple[bulk.Call, ...], variant: bulk.Variant) -> None:
    res = bulk.explore(nranks, calls, variant, last_rank_calls=last)
    assert res.ok, f"{name}: {res.violation}\n" + "\n".join(res.trace[-12:])


@pytest.mark.parametrize(("name", "nranks", "calls", "last", "variant"), bulk.MISMATCH_PLANTED,
                         ids=[m[0] for m in bulk.MISMATCH_PLANTED])
def test_flags_without_the_signature_sum_another_calls_data(name: str, nranks: int, calls: tuple[bulk.Call, ...],
                                                           last: tuple[bulk.Call, ...], variant: bulk.Variant) -> None:
    # the differing call's areas hold its own data: reading one is a wrong sum, reported as such
    assert not variant.signed
    res = bulk.explore(nranks, calls, variant, last_rank_calls=last)
    assert not res.ok and "another signature" in res.violation, f"{name}: {res.violation or 'not caught'}"
    assert res.trace and res.trace[-1].endswith(" R")  # caught at the read of the other call's area


def test_identical_calls_never_record_a_mismatch() -> None:
    # the same list on every rank, given as (rounds, signature) pairs: clean, and no rank stops early
    res = bulk.explore(2, ((2, 7), (1, 9)), bulk.Variant(), last_rank_calls=((2, 7), (1, 9)))
    assert res.ok and res.states > 100
