"""The protocol model of the wide one-shot (sollat/model/wide.py, kernels/allreduce_oneshot_wide.cu):
its cut and channels are the layout's peer-group formulas, sendToSlot pairs every line's writer with
the reader that credits it, and the writer's and the reader's epochs of every line agree over
calls of different sizes (fitted lines per block break that). The configurations' verdicts and the
planted bugs are checked with the rest of the catalog (tests/cpu/test_model.py)."""

from __future__ import annotations

from collections import Counter

import pytest

from sollat.device import layout
from sollat.model import EXHAUSTIVE, PLANTED, RANDOM, Config, Machine, Mutation, rules
from sollat.model.program import OUT, POLL, SEND, input_value


@pytest.mark.parametrize("r", [9, 16, 17, 33, 72])
def test_the_cut_and_the_channels_are_the_layouts(r: int) -> None:
    lb, groups = layout.peer_group_lines(r), layout.peer_groups(r)
    for lines in (1, 16, 57, lb, lb + 1, 1000):
        for max_blocks in (1, 3, 16):
            assert rules.peer_group_plan(lines, lb, groups, max_blocks) == \
                layout.plan_peer_groups(lines, r, max_blocks=max_blocks)
    assert all(rules.wide_channel(b, g, j, lb) == layout.peer_group_slot(b, g, j, r)
               for b in (0, 2) for g in range(groups) for j in (0, 1, lb - 1))
    cfg = Config(algorithm="oneshot_wide", nranks=8, peer_window=2)
    assert rules.wide_groups(cfg) == 4 and rules.wide_groups(Config(algorithm="oneshot_wide", peer_window=8)) == 1


def _exchanges(cfg: Config) -> tuple[Counter[tuple[object, ...]], Counter[tuple[object, ...]], Machine]:
    """Every line store and every poll of the configuration as (line, call, message line, epoch, writer)."""
    m = Machine(cfg)
    sends: Counter[tuple[object, ...]] = Counter()
    polls: Counter[tuple[object, ...]] = Counter()
    for r, rank in enumerate(m.code):
        for threads in rank:
            for code in threads:
                for i in code:
                    if i.op == SEND:
                        sends[(i.line, *i.tag, r)] += 1
                    elif i.op == POLL:
                        polls[(i.line, *i.tag, i.peer)] += 1
    return sends, polls, m


WIDE = [c for c in EXHAUSTIVE + [c for c, _ in RANDOM] if c.algorithm == "oneshot_wide"]


@pytest.mark.parametrize("cfg", WIDE, ids=lambda c: c.name)
def test_every_line_is_polled_by_its_reader_at_the_writers_epoch(cfg: Config) -> None:
    sends, polls, m = _exchanges(cfg)
    assert sends == polls and sends  # each store is read once, at the epoch it was written with
    groups, w = rules.wide_groups(cfg), cfg.peer_window
    for r, rank in enumerate(m.code):
        for k, threads in enumerate(rank):
            lb = rules.wide_geometry(cfg, cfg.calls[k]).threads // groups
            for code in threads:
                sent = {i.peer for i in code if i.op == SEND}
                assert sent == {i.peer for i in code if i.op == POLL}  # line j to and from the same peers
                assert len({q // w for q in sent}) <= 1  # of one group
                for i in code:
                    if i.op == SEND:  # into the slot of the peer's thread (group of the writer, line)
                        info = m.scratch.infos[i.line]
                        assert info.src == r and info.slot % layout.MAX_THREADS // lb == r // w
                    elif i.op == OUT:  # output (line, group): the sum over the group's ranks
                        x, g = divmod(i.value, groups)
                        assert i.expect == sum(input_value(q, k, x) for q in range(g * w, min(g * w + w, cfg.nranks)))


def test_fitted_lines_per_block_make_writer_and_reader_disagree() -> None:
    # 1 line, then 2: fitted, the first call runs 1 line per block and the second 2, so slot 1 is
    # (group 1, line 0) in one call and (group 0, line 1) in the next (tests/cpu/test_wide_oneshot.py
    # replays the same on the host's cut)
    cfg = next(p.config for p in PLANTED if p.name == "wide-fitted-lines/oneshot-wide-3r")
    assert [rules.wide_geometry(cfg, n).threads for n in cfg.calls] == [2, 4]
    sends, polls, _ = _exchanges(cfg)
    assert sends != polls
    fixed = Config(algorithm="oneshot_wide", nranks=3, threads=2, calls=(1, 2))
    assert [rules.wide_geometry(fixed, n).threads for n in fixed.calls] == [4, 4]
    s2, p2, _ = _exchanges(fixed)
    assert s2 == p2


def test_own_slot_stores_where_no_reader_polls() -> None:
    cfg = next(p.config for p in PLANTED if p.name == "wide-own-slot/oneshot-wide-3r")
    sends, polls, _ = _exchanges(cfg)
    assert set(sends) - set(polls)  # a line stored where no thread polls it


@pytest.mark.parametrize("kw", [{"protocol": "sentinel"}, {"peer_window": 0}, {"threads": 300},
                                {"faults": (), "timeouts": "any"}])
def test_wide_config_validation(kw: dict[str, object]) -> None:
    with pytest.raises(ValueError):
        Config(**{"algorithm": "oneshot_wide", "nranks": 3, "calls": (1, 2), **kw})  # type: ignore[arg-type]


def test_the_wide_mutations_are_planted() -> None:
    names = {p.name for p in PLANTED}
    assert {"wide-fitted-lines/oneshot-wide-3r", "wide-own-slot/oneshot-wide-3r", "no-reuse-fence/oneshot-wide"} <= names
    assert Mutation.WIDE_OWN_SLOT in next(p.config for p in PLANTED if p.name.startswith("wide-own-slot")).mutations
