"""The wide one-shot (``oneshot_ll_wide``, kernels/allreduce_oneshot_wide.cu) on the host: its
cut (layout.plan_peer_groups and the peer-group formulas), its place in the registry (R >= 9 by
name, never chosen by ``auto``), and a simulation of its line-channels' epochs over a sequence of
calls of different sizes: the writer's and the reader's epoch of every line must agree in every
pass, which they do only when lines per block depend on the world size alone (lines per block
fitted to the message disagree between calls of different sizes, and the peers time out)."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

import sollat
from sollat.collectives import algorithms, instantiations, select
from sollat.collectives.validate import algorithm_names
from sollat.device import abi, layout

WIDE = (9, 16, 17, 32, 33, 64, 72)
Plan = Callable[[int, int, int], layout.Geometry]  # (lines, world size, max blocks) -> cut


def test_peer_group_formulas() -> None:
    """Whole warps of lines (a warp serves one group), at most MAX_THREADS threads, and a pass's
    (line, rank) packs within the kernel's shared array, for every wide world size."""
    assert [layout.peer_groups(r) for r in (9, 16, 17, 64, 72)] == [2, 2, 3, 8, 9]
    assert [layout.peer_group_lines(r) for r in WIDE] == [256, 256, 160, 128, 96, 64, 32]
    assert abi.PEER_GROUP_PACKS == abi.MAX_THREADS * abi.PEER_WINDOW == 4096
    for r in range(abi.PEER_WINDOW + 1, abi.MAX_RANKS + 1):
        lb, groups = layout.peer_group_lines(r), layout.peer_groups(r)
        assert lb % abi.WARP == 0 and lb >= abi.WARP and lb * groups <= abi.MAX_THREADS
        assert lb * r <= abi.PEER_GROUP_PACKS
        slots = {layout.peer_group_slot(b, g, j, r) for b in (0, 2) for g in range(groups) for j in range(lb)}
        assert len(slots) == 2 * lb * groups  # one channel per (block, group, line)
        assert slots == {layout.slot_index(b, 0, t) for b in (0, 2) for t in range(lb * groups)}  # threadIdx.x = g * lb + j


def test_peer_group_geometry() -> None:
    """Lines per block fixed per world size, whatever the message; blocks up to max_blocks, then
    passes, never an empty block or pass."""
    for r in WIDE:
        lb, groups = layout.peer_group_lines(r), layout.peer_groups(r)
        for lines in (0, 1, 16, 57, lb, lb + 1, 1000, 100000):
            for max_blocks in (1, 3, 16):
                geo = layout.plan_peer_groups(lines, r, max_blocks=max_blocks)
                assert geo.threads == lb * groups and geo.threads % abi.WARP == 0 and geo.slots == 1
                assert 1 <= geo.blocks <= max_blocks and geo.blocks * lb * geo.iterations >= lines
                assert (geo.blocks - 1) * lb < max(lines, 1)  # no empty block
                assert geo.blocks * lb * (geo.iterations - 1) < max(lines, 1)  # no empty pass
    assert layout.plan_peer_groups(16, 72, max_blocks=3) == layout.Geometry(1, 32 * 9, 1, 1)
    assert layout.plan_peer_groups(1000, 9, max_blocks=3) == layout.Geometry(3, 512, 1, 2)


def test_registry_rules() -> None:
    alg = algorithms.ALGORITHMS["oneshot_ll_wide"]
    assert alg.runs_on(9) and alg.runs_on(72) and not alg.runs_on(8) and not alg.runs_on(73)
    assert alg.peer_groups and alg.deterministic and alg.proto == "ll" and alg.buffers == 1
    assert list(algorithms.ALGORITHMS)[-1] == "oneshot_ll_wide"  # the other regions keep their offsets
    assert "oneshot_ll_wide" in algorithm_names(None, 9) and "oneshot_ll_wide" not in algorithm_names(None, 8)
    with pytest.raises(sollat.UnsupportedError, match="'oneshot_ll_wide' runs on 9 to 72 ranks"):
        algorithm_names(["oneshot_ll_wide"], 8)
    with pytest.raises(sollat.UnsupportedError, match="'oneshot_ll_wide' runs on 9 to 72 ranks"):
        alg.check_world(4)
    # one LL region like oneshot_ll's: 2 parities x R sources x lines_per_src(max_blocks) lines of 16 bytes
    assert alg.scratch_bytes(64, 4) == algorithms.ALGORITHMS["oneshot_ll"].scratch_bytes(64, 4) == \
        2 * 64 * (4 * 4 * 512) * 16
    files = [f for f, _ in instantiations.all_instantiations()]
    # dtypes x ops x (real, virtual) x rank caps (16: bases held, sum unrolled; 72)
    assert files.count("allreduce_oneshot_wide.cu") == 4 * 3 * 2 * 2


def test_groups_of_up_to_16_ranks_run_the_16_rank_cap() -> None:
    """The wide one-shot's kernel for 9..16 ranks is its 16-rank instantiation (every peer's base held,
    the rank-order sum unrolled), wider groups the widest one; every other kernel keeps the
    communicator's cap, and the virtual ranks' pointer table keeps the communicator's size, so the
    host's table (VirtualRanks.table_ranks) and the kernel's (SOLLAT_TABLE_RANKS) agree."""
    wide, ll = algorithms.ALGORITHMS["oneshot_ll_wide"], algorithms.ALGORITHMS["oneshot_ll"]
    assert abi.WIDE_UNROLLED_RANKS == 2 * abi.PEER_WINDOW == 16
    assert [algorithms.rank_cap(wide, r) for r in (9, 12, 16, 17, 64, 72)] == [16, 16, 16, 72, 72, 72]
    for r in (2, 3, 4, 5, 8, 9, 16, 17, 72):
        for alg in (*algorithms.ALGORITHMS.values(), *algorithms.RMSNORM_ALGORITHMS.values()):
            if alg is not wide and alg.runs_on(r):
                assert algorithms.rank_cap(alg, r) == algorithms.max_ranks_template(r), (alg.name, r)
    dt = sollat.device.dtypes.DTYPES[torch.float32]
    for real in (True, False):
        d16 = algorithms.kernel_defines(wide, dt, "sum", 16, 1, test_hooks=False, real_ranks=real)
        d72 = algorithms.kernel_defines(wide, dt, "sum", 72, 1, test_hooks=False, real_ranks=real)
        assert d16["SOLLAT_MAX_RANKS"] == "16" and d72["SOLLAT_MAX_RANKS"] == "72"
        assert d16["SOLLAT_TABLE_RANKS"] == d72["SOLLAT_TABLE_RANKS"] == ("1" if real else "72")
    assert algorithms.kernel_defines(ll, dt, "sum", 4, 1, test_hooks=False, real_ranks=False)["SOLLAT_TABLE_RANKS"] == "4"
    from sollat.comm.ranks import VirtualRanks

    assert VirtualRanks(12, torch.empty(0)).table_ranks == 72


def test_generic_table_picks_it_above_the_peer_window_only() -> None:
    """The shipped default: the wide one-shot for small messages where it runs (R >= 9), the plain
    one-shot above its rule; at R <= 8 it is not enabled, so the same table gives oneshot_ll."""
    generic = select.find_table("Some GPU", 16, mode="real")
    assert generic.gpu == "generic"
    wide_rule = next(r for r in generic.rules if r.algorithm == "oneshot_ll_wide")
    for r in (8, 9, 72):
        available = algorithm_names(None, r)
        pick = [select.choose(generic, nbytes, torch.float32, "sum", deterministic=False, handovers=set(),
                              available=available) for nbytes in (4, wide_rule.max_bytes, wide_rule.max_bytes + 4)]
        assert pick == (["oneshot_ll_wide", "oneshot_ll_wide", "oneshot_ll"] if r > 8 else ["oneshot_ll"] * 3)
    # batch-invariant calls may take it too: its sum is in rank order, like every deterministic one
    assert select.choose(generic, 128, torch.bfloat16, "sum", deterministic=True, handovers=set(),
                         available=algorithm_names(None, 33), batch_invariant=True) == "oneshot_ll_wide"


# ---- the channels' epochs over a sequence of calls --------------------------------------------------
def fitted_plan(lines: int, r: int, max_blocks: int) -> layout.Geometry:
    """The first version's cut (commit 05a24fc): lines per block fitted to the message."""
    groups = layout.peer_groups(r)
    lb_max = min(abi.PEER_GROUP_PACKS // r, abi.MAX_THREADS // groups)
    lines = max(lines, 1)
    blocks = min(max_blocks, layout.ceil_div(lines, lb_max))
    lb = min(lb_max, layout.ceil_div(lines, blocks))
    return layout.Geometry(blocks, lb * groups, 1, layout.ceil_div(lines, blocks * lb))


def fixed_plan(lines: int, r: int, max_blocks: int) -> layout.Geometry:
    return layout.plan_peer_groups(lines, r, max_blocks=max_blocks)


def simulate(r: int, calls: list[tuple[int, int]], plan: Plan) -> str:
    """Runs the kernel's channel rules over ``calls`` ((lines, max_blocks) each) on every rank:
    thread (g, j) of block b owns slot_index(b, 0, g * lb + j) with lb = threads // groups (what
    the kernel's threadIdx.x means), rank r's line j for peer q is written by r's thread
    (group(q), j) at its epoch into q's slot of thread (group(r), j), which polls it at its own
    epoch. Returns "" when every line of every pass was written and polled at the same epoch,
    else the first disagreement (on the GPU: the reader waits for an epoch the writer never
    writes, a timeout)."""
    groups = layout.peer_groups(r)
    epochs = [dict[int, int]() for _ in range(r)]  # per rank: slot -> epoch (device memory, starts at 0)
    for call, (lines, max_blocks) in enumerate(calls):
        geo = plan(lines, r, max_blocks)
        lb = geo.threads // groups

        def slot(b: int, g: int, j: int, lb: int = lb) -> int:
            return layout.slot_index(b, 0, g * lb + j)

        for it in range(geo.iterations):
            used = []
            for b in range(geo.blocks):
                for j in range(lb):
                    if (it * geo.blocks + b) * lb + j >= lines:
                        continue
                    for w in range(r):  # writer rank
                        for q in range(r):
                            # the writer's own channel (its thread (group(q), j)) and the reader's on q
                            ew = epochs[w].get(slot(b, q // abi.PEER_WINDOW, j), 0)
                            er = epochs[q].get(slot(b, w // abi.PEER_WINDOW, j), 0)
                            if q != w and ew != er:
                                return (f"call {call} ({lines} lines, {lb} per block) pass {it} block {b} line {j}: "
                                        f"rank {w} writes epoch {ew}, rank {q} polls epoch {er}")
                    used += [slot(b, g, j) for g in range(groups)]
            for e in epochs:  # every thread with a line advances once per pass (recvWindow marks channel 0 used)
                for s in used:
                    e[s] = e.get(s, 0) + 1
    return ""


# Calls of one communicator: sizes from one line to several passes, and fewer blocks now and then
# (a virtual-rank launch that did not fit retries with fewer).
CALLS = [(1, 16), (16, 16), (57, 16), (1, 16), (700, 2), (300, 16), (3, 1), (600, 1), (16, 16), (2, 16)]


@pytest.mark.parametrize("r", [9, 17, 33])
def test_epochs_agree_with_lines_per_block_fixed_per_world_size(r: int) -> None:
    for calls in (CALLS, CALLS[::-1]):
        assert all(fixed_plan(n, r, b).threads // layout.peer_groups(r) == layout.peer_group_lines(r) for n, b in calls)
        assert simulate(r, calls, fixed_plan) == ""


@pytest.mark.parametrize("r", [9, 17, 33])
def test_epochs_drift_apart_with_lines_per_block_fitted_to_the_message(r: int) -> None:
    """The failure the GPU saw (a timeout at R = 9), reproduced: two calls cut with different
    lines per block make one slot index serve two (group, line) roles."""
    assert simulate(r, CALLS[:1], fitted_plan) == ""  # one call alone is consistent
    assert "writes epoch" in simulate(r, CALLS, fitted_plan)
    # 16 lines then 57: thread (g, 0) owns slot 16 g in the first call and 57 g in the second, so
    # rank 0 writes line 0 for a rank of a later group at the epoch of a slot the first call did not
    # use (0), while that rank's reader (0, 0) polls slot 0's epoch 1 (R = 9: rank 8, slot 57)
    bad = simulate(r, [(16, 16), (57, 16)], fitted_plan)
    assert "pass 0 block 0 line 0: rank 0 writes epoch 0, rank " in bad and bad.endswith("polls epoch 1"), bad
