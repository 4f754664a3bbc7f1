"""The protocol model's fault path: timeouts, fault records, refusal, NaN outputs, reset().

Every fault configuration is clean (no hang, every output exact or NaN, no line of a faulted call
accepted later, every rank's record holds the fault, exact again after reset()); every planted
fault-path bug is caught by exhaustive search and by random schedules.
"""

from __future__ import annotations

import random
from collections import deque
from collections.abc import Callable
from dataclasses import replace

import pytest

from sollat.device import layout
from sollat.model import Config, Fault, Machine, Mutation, Report, exhaustive, program, random_runs
from sollat.model.fault_sweep import (
    FAULT_BENIGN,
    FAULT_EXHAUSTIVE,
    FAULT_EXHAUSTIVE_LARGE,
    FAULT_MUTATIONS,
    FAULT_PLANTED,
    FAULT_RANDOM,
    absent,
    fault_sweep,
    find_fault_config,
    mismatch,
)
from sollat.model.program import ADD, SEND
from sollat.model.state import GIVE_UP, Action, State
from sollat.model.sweep import Planted, SweepResult
from sollat.model.trace import replay

#: The default test run takes this share of FAULT_RANDOM's runs (the first ones of each
#: configuration); the tests marked slow (CI) take them all.
QUICK_SCALE = 0.2


@pytest.fixture(scope="module")
def swept() -> SweepResult:
    return fault_sweep(seed=0, scale=QUICK_SCALE)


def _report(swept: SweepResult, cfg: Config, method: str) -> Report:
    return next(r for r in swept.reports if r.method == method and r.config == cfg.label())


# ---- every fault configuration is clean --------------------------------------------------------------
def test_fault_sweep_is_clean(swept: SweepResult) -> None:
    print("\n" + "\n".join(r.summary() for r in swept.reports))
    assert swept.ok, [str(r.counterexample) for r in swept.failures]
    assert swept.exhaustive_interleavings > 10**40 and swept.random_interleavings >= 300


@pytest.mark.slow
def test_fault_sweep_random_schedules_in_full(swept: SweepResult) -> None:
    rest = fault_sweep(seed=0, exhaustive_configs=False, skip=QUICK_SCALE)  # the runs the quick sweep left
    print("\n" + "\n".join(r.summary() for r in rest.reports))
    assert rest.ok, [str(r.counterexample) for r in rest.failures]
    assert swept.random_interleavings + rest.random_interleavings == sum(n for _, n in FAULT_RANDOM) >= 1500
    assert all(len(r.adversaries) == 8 for r in rest.reports)


@pytest.mark.parametrize("name", [c.name for c in FAULT_EXHAUSTIVE])
def test_fault_exhaustive_config_is_clean_and_complete(swept: SweepResult, name: str) -> None:
    rep = _report(swept, find_fault_config(name), "exhaustive")
    assert rep.counterexample is None, str(rep.counterexample)
    assert rep.complete and rep.interleavings > 0


@pytest.mark.slow
@pytest.mark.parametrize("cfg", FAULT_EXHAUSTIVE_LARGE, ids=[c.name for c in FAULT_EXHAUSTIVE_LARGE])
def test_large_fault_config_is_clean_and_complete(cfg: Config) -> None:
    rep = exhaustive(cfg)
    assert rep.counterexample is None, str(rep.counterexample)
    assert rep.complete and rep.interleavings > 0


@pytest.mark.parametrize("name", [c.name for c, _ in FAULT_RANDOM])
def test_fault_random_config_is_clean(swept: SweepResult, name: str) -> None:
    rep = _report(swept, find_fault_config(name), "random")
    assert rep.counterexample is None, str(rep.counterexample)
    assert len(rep.adversaries) == 8


# ---- planted fault-path bugs -------------------------------------------------------------------------
@pytest.mark.parametrize("planted", FAULT_PLANTED, ids=[p.name for p in FAULT_PLANTED])
def test_fault_planted_bug_is_caught(planted: Planted) -> None:
    ex = exhaustive(planted.config)
    assert ex.counterexample is not None, f"{planted.name}: exhaustive search found nothing"
    assert ex.counterexample.violation.kind in planted.kinds, str(ex.counterexample.violation)
    assert "GIVES UP" in ex.counterexample.format()  # the trace shows where the fault path started
    rnd = random_runs(planted.config, 3000, seed=1)
    assert rnd.counterexample is not None, f"{planted.name}: random schedules found nothing"
    assert rnd.counterexample.violation.kind in planted.kinds, str(rnd.counterexample.violation)


@pytest.mark.parametrize("benign", FAULT_BENIGN, ids=[p.name for p in FAULT_BENIGN])
def test_fault_benign_mutation_is_proved_harmless(benign: Planted) -> None:
    rep = exhaustive(benign.config)
    assert rep.ok and rep.complete, str(rep.counterexample)


def test_every_fault_mutation_is_planted_or_proved_harmless() -> None:
    used = set().union(*(p.config.mutations for p in FAULT_PLANTED + FAULT_BENIGN))
    assert used == FAULT_MUTATIONS
    names = [c.name for c in FAULT_EXHAUSTIVE + FAULT_EXHAUSTIVE_LARGE] + [c.name for c, _ in FAULT_RANDOM] + \
        [p.name for p in FAULT_PLANTED + FAULT_BENIGN]
    assert len(names) == len(set(names))


# ---- what the fault path does, step by step ------------------------------------------------------------
def _drive(m: Machine, pick: Callable[[State, list[Action]], Action]) -> tuple[State, list[Action]]:
    """One complete run (no violation allowed); returns the final state and the schedule."""
    st = m.initial()
    path: list[Action] = []
    while acts := m.enabled(st):
        a = pick(st, acts)
        path.append(a)
        v = m.apply(st, a)
        assert v is None, str(v)
    assert m.finished(st)
    return st, path


def test_give_up_poisons_only_what_is_unwritten_and_later_calls_refuse_until_reset() -> None:
    # Two iterations in call 0 (2 lines, one thread); rank 1 gives up in the second one, its record
    # writes land at once. (Were rank 0 quicker than the write to its record, its call 1 would run
    # and give up at its record check: the fault path allows both.) The strong model: this test
    # follows the program counter through the program (PTX mode's counts windows).
    cfg = Config(algorithm="oneshot", protocol="ll", calls=(2, 1, 1), reset_at=2, timeouts="any", memory="strong")
    m = Machine(cfg)

    def pick(st: State, acts: list[Action]) -> Action:
        second = st.call[1] == 0 and st.pc[1] and st.pc[1][0] > len(m.vcode[st.var[1]][0]) // 2
        if second and (GIVE_UP, 1, 0) in acts:
            return (GIVE_UP, 1, 0)
        return min((a for a in acts if a[0] != GIVE_UP), key=lambda a: a[0] != 1)  # stores land first

    st, path = _drive(m, pick)
    text = "\n".join(replay(m, path)[0])
    assert "r1 call0 b0.t0 it1 slot0: GIVES UP" in text and "NaN into output line(s) [1]" in text
    assert "r1 call0 b0.t0 it0 slot0: OUT line 0" in text  # written before: stays exact
    assert "r1 REFUSES call 1" in text and "r0 REFUSES call 1" in text
    assert "reset(): every rank idle, records ['timeout', 'timeout']" in text
    assert "r0 call2 b0.t0 it0 slot0: OUT line 0" in text and "r1 call2 b0.t0 it0 slot0: OUT line 0" in text
    assert st.fx is not None and st.fx.rec == [layout.FAULT_OK] * 2 and st.fx.phase == 1


def test_every_rank_sees_the_fault() -> None:
    cfg = Config(algorithm="twoshot", protocol="ll", nranks=3, calls=(2, 5), faults=(mismatch(2, 1),))
    m = Machine(cfg)
    for seed in range(20):
        rng = random.Random(f"records/{seed}")
        st, _ = _drive(m, lambda _st, acts, rng=rng: rng.choice(acts))
        assert st.fx is not None and st.fx.rec == [layout.FAULT_MISMATCH] * 3


def test_without_the_fault_path_an_absent_peer_hangs() -> None:
    # The give-up step is what ends a wait for an absent peer: without it, every run deadlocks.
    cfg = next(c for c in FAULT_EXHAUSTIVE if c.name == "f-oneshot-ll-absent")
    m = Machine(cfg)
    actions = m._fault_actions

    def no_give_up(st: State, acts: list[Action]) -> None:
        actions(st, acts)
        acts[:] = [a for a in acts if a[0] != GIVE_UP]

    m._fault_actions = no_give_up  # type: ignore[method-assign]
    rep = exhaustive(cfg, machine=m)
    assert rep.counterexample is not None and rep.counterexample.violation.kind == "deadlock"
    assert "waits before call 1 (absent in call 0" in rep.counterexample.format()


def test_commit_after_give_up_is_live_but_never_read() -> None:
    # The mutation really changes what a faulted rank commits (a table only it reaches) ...
    cfg = Config(algorithm="oneshot", protocol="ll", calls=(2, 1), timeouts="any")

    def tables(c: Config) -> set[tuple[object, ...]]:
        m = Machine(c)
        seen, queue, out = {m.initial().key()}, deque([m.initial()]), set()
        while queue:
            st = queue.popleft()
            assert st.fx is not None
            out.update(m._table_list[t] for t in st.fx.ep)
            for a in m.enabled(st):
                child = st.copy()
                assert m.apply(child, a) is None
                if child.key() not in seen:
                    seen.add(child.key())
                    queue.append(child)
        return out

    half = ((("oneshot", 0), 1),)
    assert half in tables(cfg.with_mutation(Mutation.COMMIT_AFTER_GIVE_UP)) and half not in tables(cfg)
    # ... and refusal is what makes that harmless: without it the checker finds the damage.
    both = cfg.with_mutation(Mutation.COMMIT_AFTER_GIVE_UP, Mutation.NO_REFUSAL)
    assert exhaustive(both).counterexample is not None


def test_absent_rank_that_runs_ahead_is_another_call_sequence() -> None:
    # A process-group rank whose kernel returns early runs its next call at once: its data of
    # call 1 meets its peer's call 0. With equal signatures nothing can tell them apart (the fault
    # path is not a defence against different call sequences; the tests use the hook with a
    # VirtualCommunicator, where the next launch follows the whole faulted one).
    cfg = Config(algorithm="oneshot", protocol="ll", calls=(1, 1, 1), faults=(absent(1, 0, "ahead"),), reset_at=2)
    ce = exhaustive(cfg).counterexample
    assert ce is not None and ce.violation.kind == "stale"
    assert exhaustive(Config(algorithm="oneshot", protocol="ll", calls=(1, 1, 1), faults=(absent(1, 0),),
                             reset_at=2)).ok


@pytest.mark.parametrize("kw", [
    {"memory": "sc"},  # no such memory model
    {"ranks": "remote"},
    {"faults": (absent(1, 2),), "reset_at": 2},  # faults come before the reset
    {"faults": (absent(2, 0),)},  # no such rank
    {"reset_at": 0},
    {"timeouts": "sometimes"},
    {"faults": (Fault("absent", 1, 0, "later"),)},
])
def test_fault_config_validation(kw: dict[str, object]) -> None:
    with pytest.raises(ValueError):
        Config(algorithm="oneshot", calls=(1, 2, 1), **kw)  # type: ignore[arg-type]


def test_healthy_configs_stay_off_the_fault_path() -> None:
    cfg = Config(algorithm="oneshot", calls=(1, 2, 1))
    assert not cfg.fault_path and Machine(cfg).initial().fx is None
    assert Config(algorithm="oneshot", calls=(1, 2, 1), faults=(absent(1, 0),)).label() == \
        "oneshot-ll-2r1t[1,2,1] absent(r1@0)"


# ---- a call that differs between ranks: other signature, other data, no finite result anywhere ------
def _data(cfg: Config, r: int, k: int) -> list[object]:
    m = Machine(cfg)
    return [i.value for th in m.code[r][k] for i in th if i.op in (SEND, ADD) and i.value is not None
            and m.kinds[i.line] != "sig"]


@pytest.mark.parametrize(("algorithm", "protocol"), [("oneshot", "sentinel"), ("twoshot", "ll"), ("ll128", "ll"),
                                                     ("rmsnorm_twoshot", "sentinel")])
def test_the_mismatch_hook_sends_other_data(algorithm: str, protocol: str) -> None:
    base = Config(algorithm=algorithm, protocol=protocol, calls=(4, 4), reset_at=1)
    odd = replace(base, faults=(mismatch(1, 0),))
    sent, healthy = _data(odd, 1, 0), _data(base, 1, 0)
    assert len(sent) == len(healthy) > 0 and all(a != b for a, b in zip(sent, healthy, strict=True))
    assert _data(odd, 0, 0) == _data(base, 0, 0) and _data(odd, 1, 1) == _data(base, 1, 1)


def test_a_finite_output_of_a_differing_call_is_caught_whatever_its_value(monkeypatch: pytest.MonkeyPatch) -> None:
    # With the odd rank's data equal to the others' the sum it lets through is exact, and still the
    # output of calls that differ: reported.
    monkeypatch.setattr(program, "DIFFERING", 0)
    cfg = Config(algorithm="oneshot", protocol="ll", calls=(1,), faults=(mismatch(1, 0),))
    exact = program.input_value(0, 0, 0) + program.input_value(1, 0, 0)
    ce = exhaustive(cfg.with_mutation(Mutation.LL_TAG_IGNORED)).counterexample
    assert ce is not None and ce.violation.kind == "accepted" and f"= {exact} of call 0" in ce.violation.message
    assert exhaustive(cfg).ok  # the tags are what tells the calls apart


def test_a_rank_that_completes_a_differing_call_is_caught() -> None:
    # Kernel end: a rank whose threads all finished a call that differs, none having given up.
    m = Machine(Config(algorithm="oneshot", protocol="sentinel", calls=(1, 1), faults=(mismatch(1, 0),), reset_at=1))
    st = m.initial()
    assert st.fx is not None
    st.fx.outs[0] = 1
    v = m._end_call(st, 0, 0)
    assert v is not None and v.kind == "accepted" and "completes call 0 without a fault" in v.message
    st.fx.abort[0] = 1
    assert m._end_call(st, 0, 0) is None
    st.fx.abort[0] = 0
    assert m._end_call(st, 0, 1) is None  # call 1 is the same on every rank
