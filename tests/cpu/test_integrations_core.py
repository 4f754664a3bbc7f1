"""The engine-free core of the engine plugins (sollat/integrations/core.py, settings.py): the
opt-in and every variable the plugins read, the rule and the engine limit, the communicator an
engine builds (its footprint, and that decode-size calls keep their algorithm and geometry), and a
GroupAdapter over three gloo processes with stand-in communicators that sum in rank order (no
engine, no GPU): the rank-order bits on every rank, one decision on every rank where a rank fails,
is absent, or has another engine limit, batch-invariant mode or own_pick_limit, one warning."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest
import torch

from sollat.collectives import select
from sollat.collectives.algorithms import ALGORITHMS
from sollat.collectives.validate import algorithm_names, checked_batch_invariant
from sollat.device import layout
from sollat.device.dtypes import DTYPES
from sollat.errors import UnsupportedError
from sollat.integrations import core, settings

from ._ranks import leave_together, processes

CPU = torch.device("cpu")


@pytest.mark.parametrize(("value", "on"), [(None, False), ("", False), ("0", False), (" 0 ", False), ("1", True)])
def test_opt_in_values(value: str | None, on: bool) -> None:
    assert core.opted_in(value) is on


@pytest.mark.parametrize("value", ["yes", "true", "2", "on", "1,0"])
def test_opt_in_value_not_understood(value: str) -> None:
    with pytest.raises(UnsupportedError, match=f"SOLLAT_ENGINE_PLUGIN={value!r} is not understood"):
        core.opted_in(value)


@pytest.mark.parametrize(("value", "on"), [(None, False), ("", False), ("0", False), ("1", True), (" 1 ", True)])
def test_batch_invariant_env(monkeypatch: pytest.MonkeyPatch, value: str | None, on: bool) -> None:
    if value is None:
        monkeypatch.delenv("SOLLAT_BATCH_INVARIANT", raising=False)
    else:
        monkeypatch.setenv("SOLLAT_BATCH_INVARIANT", value)
    assert core.sollat_batch_invariant_env() is on


# ---- the environment, checked at start-up ---------------------------------------------------------
BAD = [("SOLLAT_ENGINE_PLUGIN", "yes", "0 or 1 (or unset)"),
       ("SOLLAT_BATCH_INVARIANT", "yes", "0 or 1 (or unset)"),
       ("SOLLAT_ENGINE_MAX_BYTES", "lots", "a whole number of bytes >= 1024"),
       ("SOLLAT_ENGINE_MAX_BYTES", "0", "a whole number of bytes >= 1024"),
       ("SOLLAT_ENGINE_MAX_BYTES", "1023", "a whole number of bytes >= 1024 (1 KiB)"),
       ("SOLLAT_INTERCONNECT", "nvlnk", "nvlink, pcie, any"),
       ("SOLLAT_CLUSTER_RANKS", "false", "0 or 1 (or unset)"),
       ("SOLLAT_ENGINE_MAX_BYTES", "1.5MiB", "a whole number of bytes >= 1024"),
       ("SOLLAT_TIMEOUT_S", "soon", "a number of seconds > 0"),
       ("SOLLAT_TIMEOUT_S", "-1", "a number of seconds > 0"),
       ("SOLLAT_SETUP_TIMEOUT_S", "inf", "a number of seconds > 0"),
       ("SOLLAT_MAX_BLOCKS", "many", "an integer 1..128"),
       ("SOLLAT_MAX_BLOCKS", "0", "an integer 1..128"),
       ("SOLLAT_EXPERIMENTAL_RMSNORM_TWOSHOT", "on", "0 or 1 (or unset)"),
       ("SOLLAT_ALLOW_PCIE_PEERS", "true", "0 or 1 (or unset)")]


@pytest.mark.parametrize(("name", "value", "allowed"), BAD, ids=[f"{n}={v!r}" for n, v, _ in BAD])
def test_a_value_not_understood_is_one_line_naming_the_variable(name: str, value: str, allowed: str) -> None:
    env = {"SOLLAT_ENGINE_PLUGIN": "1", name: value}
    with pytest.raises(settings.EnvironmentValueError) as ei:
        settings.check_environment(env)
    text = str(ei.value)
    assert "\n" not in text and text.startswith(f"sollat: {name}={value!r} is not understood; it takes {allowed}")
    assert ei.value.name == name


def test_good_values_pass_and_are_read() -> None:
    env = {"SOLLAT_ENGINE_PLUGIN": "1", "SOLLAT_BATCH_INVARIANT": "1", "SOLLAT_ENGINE_MAX_BYTES": "4MiB",
           "SOLLAT_TIMEOUT_S": "12.5", "SOLLAT_SETUP_TIMEOUT_S": "60", "SOLLAT_MAX_BLOCKS": "32",
           "SOLLAT_EXPERIMENTAL_RMSNORM_TWOSHOT": "0", "SOLLAT_ALLOW_PCIE_PEERS": " 1 "}
    assert settings.check_environment(env) == settings.Settings(batch_invariant=True, max_bytes=4 << 20)
    assert settings.check_environment({}) == settings.Settings(batch_invariant=False,
                                                               max_bytes=settings.DEFAULT_MAX_BYTES)


def test_engine_checks_run_after_sollat_s() -> None:
    seen: list[str] = []
    settings.check_environment({}, engine_checks=lambda: seen.append("engine"))
    assert seen == ["engine"]
    with pytest.raises(settings.EnvironmentValueError, match="SOLLAT_TIMEOUT_S"):
        settings.check_environment({"SOLLAT_TIMEOUT_S": "x"}, engine_checks=lambda: seen.append("too early"))
    assert seen == ["engine"]


@pytest.mark.parametrize("value", ["", "0", "1", "yes", " 1", "1 ", "true", "01", "2"])
def test_the_plugin_accepts_batch_invariant_values_exactly_as_the_communicator(monkeypatch: pytest.MonkeyPatch,
                                                                               value: str) -> None:
    monkeypatch.setenv("SOLLAT_BATCH_INVARIANT", value)
    try:
        checked_batch_invariant(None, "X")
        communicator_ok = True
    except UnsupportedError:
        communicator_ok = False
    try:
        settings.check_environment({"SOLLAT_BATCH_INVARIANT": value})
        plugin_ok = True
    except settings.EnvironmentValueError:
        plugin_ok = False
    assert plugin_ok == communicator_ok


@pytest.mark.parametrize(("value", "n"), [(None, 1 << 20), ("", 1 << 20), ("4096", 4096), (" 2MiB ", 2 << 20),
                                          ("64kib", 64 << 10), ("1GiB", 1 << 30), ("1024", 1024)])
def test_max_message_bytes(value: str | None, n: int) -> None:
    assert settings.max_message_bytes(value) == n


def test_all_reduce_rule() -> None:
    x = torch.zeros(4, 8)
    assert core.all_reduce_refusal(x, CPU) is None
    for dtype in core.ALL_REDUCE_DTYPES:
        assert core.all_reduce_refusal(x.to(dtype), CPU) is None
    assert core.all_reduce_refusal(x, None) == "no sollat communicator"
    assert core.all_reduce_refusal(x, torch.device("meta")) == "on cpu, the communicator is on meta"
    assert core.all_reduce_refusal(x.to(torch.int32), CPU) == "dtype torch.int32"
    assert core.all_reduce_refusal(x.to(torch.float8_e4m3fn), CPU) == "dtype torch.float8_e4m3fn"
    assert core.all_reduce_refusal(x.t(), CPU) == "not contiguous"
    assert core.all_reduce_refusal(x[:, 1:5], CPU) == "not contiguous"
    assert core.all_reduce_refusal(x[1:3], CPU) is None  # contiguous view at an offset: sollat takes it
    assert core.all_reduce_refusal(torch.zeros(0, 8), CPU) == "empty"
    assert core.all_reduce_refusal("x", CPU) == "not a tensor (str)"
    huge = torch.empty(core.MAX_ELEMENTS + 1, device="meta")
    assert core.all_reduce_refusal(huge, torch.device("meta")) == f"{core.MAX_ELEMENTS + 1} elements > {core.MAX_ELEMENTS}"
    # nothing in the rule depends on the size below the limit (batch invariance)
    big = torch.empty(core.MAX_ELEMENTS, device="meta")
    assert core.all_reduce_refusal(big, torch.device("meta")) is None


def test_rmsnorm_rule() -> None:
    x, r, w = torch.zeros(3, 64, dtype=torch.bfloat16), torch.zeros(3, 64, dtype=torch.bfloat16), torch.ones(
        64, dtype=torch.bfloat16)
    scale = torch.ones(1, 1)
    assert core.rmsnorm_refusal(x, r, w, CPU) is None
    assert core.rmsnorm_refusal(x, r, w, CPU, scale) is None
    assert core.rmsnorm_refusal(x.double(), r.double(), w.double(), CPU).startswith("dtype torch.float64")
    assert core.rmsnorm_refusal(x, r.float(), w, CPU).startswith("residual")
    assert core.rmsnorm_refusal(x, torch.zeros(64, 3, dtype=torch.bfloat16).t(), w, CPU).startswith("residual")
    assert core.rmsnorm_refusal(x, r, w.float(), CPU).startswith("weight")
    assert core.rmsnorm_refusal(x, r, w[:32], CPU).startswith("weight")
    assert core.rmsnorm_refusal(x, r, w, CPU, torch.ones(2)).startswith("fp8 scale")
    assert core.rmsnorm_refusal(x, r, w, CPU, torch.ones(1, dtype=torch.float16)).startswith("fp8 scale")
    wide = torch.zeros(1, 65537, dtype=torch.float16)
    assert core.rmsnorm_refusal(wide, wide, torch.ones(65537, dtype=torch.float16), CPU) == "hidden 65537 > 65536"
    assert core.rmsnorm_refusal(x, r, w, None) == "no sollat communicator"


def test_the_engine_limit() -> None:
    x = torch.zeros(256, dtype=torch.float32)  # 1 KiB
    assert core.all_reduce_refusal(x, CPU, 1024) is None
    assert core.all_reduce_refusal(x, CPU, 1023) == "1024 bytes > SOLLAT_ENGINE_MAX_BYTES (1023)"
    assert core.all_reduce_refusal(x, CPU, None) is None
    w = torch.ones(256)
    assert core.rmsnorm_refusal(x[None], x[None], w, CPU, max_bytes=1023) == "1024 bytes > SOLLAT_ENGINE_MAX_BYTES (1023)"
    ad = core.GroupAdapter(engine="t", name="tp", device_group=None, cpu_group=None, device=CPU, world_size=2,
                           batch_invariant=False, max_bytes=1023)
    assert ad.max_bytes == 1023
    ad.batch_invariant = True  # no threshold in batch-invariant mode: a row never changes implementation
    assert ad.max_bytes is None


def test_domain_rule() -> None:
    assert core.domain_refusal(2, ["a", "a"]) is None
    assert core.domain_refusal(8, ["a"] * 8) is None
    assert core.domain_refusal(1, ["a"]).startswith("world size 1")
    assert core.domain_refusal(72, ["a"] * 72) is None
    assert core.domain_refusal(73, ["a"] * 73).startswith("world size 73")
    assert "spans hosts ['a', 'b']" in str(core.domain_refusal(2, ["a", "b"]))


# ---- the communicator an engine builds ------------------------------------------------------------
ROOT = Path(__file__).resolve().parents[2]
FOOTPRINT_MIB = {2: 36.0, 4: 40.0, 8: 48.0}  # docs/integrations.md states these
H200_SMS = 132


def test_engine_scratch_per_rank_is_at_most_64_mib_at_tp8_and_the_docs_say_how_much() -> None:
    from sollat.comm.state import scratch_bytes_per_rank

    assert settings.scratch_bytes(8) <= 64 << 20
    doc = " ".join((ROOT / "docs" / "integrations.md").read_text().split())
    for tp, mib in FOOTPRINT_MIB.items():
        got = settings.scratch_bytes(tp, sms=H200_SMS)
        assert got == settings.scratch_bytes(tp)  # an H200 has the SMs for the default blocks
        assert round(got / 2**20, 1) == mib, (tp, got / 2**20)
        blocks = min(H200_SMS, layout.default_max_blocks_real(tp))
        plain = scratch_bytes_per_rank(tp, algorithm_names(None, tp), blocks, (), True) / 2**20
        assert f"| {tp} | {mib:.1f} MiB | {plain:.1f} MiB |" in doc, tp
    for tp in (9, 16, 72):
        assert f"{settings.scratch_bytes(tp) / 2**20:.1f} MiB at {tp}" in doc, tp


def test_the_docs_show_the_log_lines_and_world_sizes_the_code_has() -> None:
    from sollat.integrations import sglang, vllm

    doc = (ROOT / "docs" / "integrations.md").read_text()
    assert vllm.summary_line(False, settings.DEFAULT_MAX_BYTES) in doc
    assert sglang.summary_line(False, settings.DEFAULT_MAX_BYTES) in doc
    assert f"world sizes {core.MIN_WORLD_SIZE}..{layout.MAX_RANKS}" in doc and "2..8" not in doc
    assert f"2 to {layout.MAX_RANKS} ranks" in " ".join(doc.split())


def test_the_default_factory_builds_the_engine_communicator(monkeypatch: pytest.MonkeyPatch) -> None:
    import torch.distributed as dist

    import sollat.comm.real as real

    made: list[tuple[Any, dict[str, Any]]] = []
    monkeypatch.setattr(dist, "is_initialized", lambda: True)
    monkeypatch.setattr(dist, "get_world_size", lambda group=None: 8)
    monkeypatch.setattr(real, "Communicator", lambda group, **kw: made.append((group, kw)) or "comm")
    assert core.sollat_communicator("tp-group", torch.device("cuda", 0), False) == "comm"
    assert core.sollat_communicator("tp-group", torch.device("cuda", 0), True) == "comm"
    opts = {"algorithms": ("oneshot_ll", "oneshot_sentinel"), "gather_scatter": False, "rmsnorm_max_blocks": 16}
    assert made == [("tp-group", opts), ("tp-group", {"batch_invariant": True, **opts})]


def _sizes() -> list[int]:
    out = set()
    for p in range(4, 21):  # 16 B .. 1 MiB, and either side of every power of two
        out |= {(1 << p) - 16, 1 << p, (1 << p) + 16}
    return sorted(n for n in out if 16 <= n <= settings.DEFAULT_MAX_BYTES)


# Where the engine's communicator runs another algorithm than a plain one for a decode-size call:
# the generic table (3 to 8 ranks) gives exactly 1 MiB to the two-shot, which the engine lacks (the
# table's next rule, the one-shot sentinel, would serve it 1.2-2x slower: docs/integrations.md), so
# the adapter hands those calls to the engine (GroupAdapter.own_limit).
CHANGED = {2: [], 4: [(1 << 20, "twoshot_sentinel", "oneshot_sentinel")],
           8: [(1 << 20, "twoshot_sentinel", "oneshot_sentinel")]}


@pytest.mark.parametrize("world", sorted(CHANGED))
def test_decode_size_calls_keep_their_algorithm_on_the_shipped_tables(monkeypatch: pytest.MonkeyPatch,
                                                                     tmp_path: Path, world: int) -> None:
    monkeypatch.setenv("SOLLAT_CACHE_DIR", str(tmp_path))  # the shipped tables only
    table = select.find_table("NVIDIA H200", world, mode="real", interconnect="nvlink")
    full = algorithm_names(None, world)
    engine = settings.communicator_options(world)["algorithms"]
    changed = []
    for nbytes in _sizes():
        for dtype in (torch.bfloat16, torch.float32, torch.float16):
            if nbytes % DTYPES[dtype].size:
                continue
            for bi in (False, True):
                d = select.choose(table, nbytes, dtype, "sum", deterministic=False, handovers={select.NCCL},
                                  available=full, batch_invariant=bi)
                e = select.choose(table, nbytes, dtype, "sum", deterministic=False, handovers={select.NCCL},
                                  available=engine, batch_invariant=bi)
                assert e in engine and ALGORITHMS[e].deterministic, (nbytes, dtype, e)
                if d != e and (nbytes, d, e) not in changed:
                    changed.append((nbytes, d, e))
    assert changed == CHANGED[world]
    # The adapter hands exactly those calls to the engine: every size up to the limit keeps its pick.
    limit = select.own_pick_limit(table, engine, world)
    assert all(nbytes > limit for nbytes, _, _ in changed) if limit is not None else not changed


def test_own_pick_limit_is_the_rule_before_the_first_left_out_algorithm() -> None:
    rules = tuple(select.Rule(m, a) for m, a in ((1024, "oneshot_ll_wide"), (16384, "oneshot_ll"),
                                                 (65536, select.NCCL), (1048575, "oneshot_sentinel"),
                                                 (2097152, "twoshot_sentinel")))
    table = select.Table("generic", 0, rules)
    engine = ("oneshot_ll", "oneshot_sentinel")
    assert select.own_pick_limit(table, engine, 8) == 1048575  # the wide one-shot does not run at 8
    assert select.own_pick_limit(table, engine, 9) == 0  # ... at 9 it leads the table
    assert select.own_pick_limit(table, engine + ("twoshot_sentinel", "oneshot_ll_wide"), 9) is None


class _Doubling:
    device = CPU

    def all_reduce(self, x: torch.Tensor, op: str = "sum", algo: str = "auto", *, out: Any = None) -> torch.Tensor:
        return x * 2

    def all_reduce_rmsnorm(self, x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6,
                           algo: str = "auto", **kw: Any) -> tuple[torch.Tensor, ...]:
        return x, residual

    def own_pick_limit(self) -> int:
        return 32


def test_calls_above_the_communicators_own_picks_go_to_the_engine() -> None:
    ad = core.GroupAdapter(engine="t", name="tp", device_group=None, cpu_group=None, device=CPU, world_size=2,
                           batch_invariant=False, max_bytes=1 << 20)
    ad.comm = _Doubling()
    ad.own_limit = ad.comm.own_pick_limit()
    assert ad.all_reduce(torch.ones(8)).tolist() == [2.0] * 8  # 32 bytes: served
    assert ad.all_reduce(torch.ones(9)) is None and not ad.serves(torch.ones(9))
    (why,) = [k for k in ad.counts if k.startswith("declined:")]
    assert why == "declined:36 bytes > 32, above which the table picks an algorithm the engine's communicator leaves out"
    x = torch.ones(1, 9)
    assert ad.all_reduce_rmsnorm(x, x, torch.ones(9), 1e-6) is None
    ad.batch_invariant = True  # that mode never hands a call over
    assert ad.all_reduce(torch.ones(9)) is not None


@pytest.mark.parametrize("world", [2, 4, 8])
def test_fused_calls_auto_makes_keep_their_geometry_in_the_engine_regions(world: int) -> None:
    from sollat.collectives import rmsnorm
    from sollat.collectives.algorithms import RMSNORM_ALGORITHMS, RMSNORM_MAX_BLOCKS

    def geometry(alg: Any, dt: Any, rows: int, hidden: int, blocks: int) -> Any:  # as plan.Kernels plans it
        geo = rmsnorm.row_geometry(alg, dt, rows, hidden, world, blocks)
        if geo.row_blocks > blocks:
            geo = rmsnorm.row_geometry(alg, dt, rows, hidden, world, blocks, widest_blocks=blocks)
        return geo

    for name in rmsnorm.AUTO_ALGOS:
        alg = RMSNORM_ALGORITHMS[rmsnorm.internal_name(name)]
        for dtype in rmsnorm.DTYPES_SUPPORTED:
            for hidden in (2048, 4096, 5120, 7168, 8192, 16384):
                for rows in range(1, rmsnorm.AUTO_FUSED_MAX_ROWS + 1):
                    dt = DTYPES[dtype]
                    assert (geometry(alg, dt, rows, hidden, settings.ENGINE_RMSNORM_MAX_BLOCKS)
                            == geometry(alg, dt, rows, hidden, RMSNORM_MAX_BLOCKS)), (name, dtype, hidden, rows)


def test_factory_seam_checks_and_restores() -> None:
    with pytest.raises(TypeError, match="expected a callable"):
        core.set_communicator_factory(42)  # type: ignore[arg-type]
    core.set_communicator_factory(lambda g, d, b: None)  # type: ignore[arg-type,return-value]
    core.set_communicator_factory(None)
    assert core._factory is core.sollat_communicator


def test_default_factory_refuses_without_cuda_or_batch_invariance() -> None:
    # On a CPU machine the real communicator cannot be built; the error is sollat's, not a crash.
    with pytest.raises(UnsupportedError):
        core.sollat_communicator(None, torch.device("cuda", 0), True)


def test_adapter_without_a_group_of_two() -> None:
    ad = core.GroupAdapter(engine="test", name="tp:0", device_group=None, cpu_group=None, device=CPU, world_size=1,
                           batch_invariant=False)
    assert ad.all_reduce(torch.ones(3)) is None
    assert ad.unavailable is not None and ad.unavailable.startswith("world size 1")
    assert ad.counts == {"declined:no sollat communicator": 1}
    assert "unavailable" in ad.describe()


# ---- three gloo processes ----------------------------------------------------------------------
WORLD = 3  # odd: the ranks' order of summation shows in the bits (at 2 ranks a + b == b + a)
SMALL = 1024  # a limit in bytes one rank may have (the smallest accepted): 256 float32 elements fit, 512 do not


class _RankOrderDouble:
    """Sums in rank order in float32 over the gloo group (a left fold, as sollat's kernels);
    rank ``fail_rank`` fails to construct; rank ``own_rank`` reports ``own_pick_limit`` SMALL."""

    fail_rank = -1
    own_rank = -1
    made = 0  # constructions in this process

    def __init__(self, group: Any, device: torch.device, batch_invariant: bool) -> None:
        import torch.distributed as dist

        _RankOrderDouble.made += 1
        if dist.get_rank() == _RankOrderDouble.fail_rank:
            raise RuntimeError("no peer memory here")
        self.group, self.device, self.batch_invariant = group, device, batch_invariant
        self.calls = 0
        if dist.get_rank() == _RankOrderDouble.own_rank:
            self.own_pick_limit = lambda: SMALL

    def all_reduce(self, x: torch.Tensor, op: str = "sum", algo: str = "auto", *, out: Any = None) -> torch.Tensor:
        import torch.distributed as dist

        self.calls += 1
        parts = [torch.empty_like(x) for _ in range(dist.get_world_size(self.group))]
        dist.all_gather(parts, x, group=self.group)
        acc = parts[0].float()
        for p in parts[1:]:
            acc = acc + p.float()
        return acc.to(x.dtype)

    def all_reduce_rmsnorm(self, x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6,
                           algo: str = "auto", **kw: Any) -> tuple[torch.Tensor, ...]:
        r = self.all_reduce(x) + residual
        y = r * torch.rsqrt(r.pow(2).mean(-1, keepdim=True) + eps) * weight
        return (y, r, y.to(torch.float8_e4m3fn)) if kw.get("fp8_scale") is not None else (y, r)


class _Lines(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[tuple[str, str]] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append((record.levelname, record.getMessage()))


def _rank_input(rank: int, call: int, n: int) -> torch.Tensor:
    """Rank ``rank``'s float32 input of call ``call``: every process draws the same for every rank."""
    return torch.randn(n, generator=torch.Generator().manual_seed(1000 * call + rank))


def _rank_order(call: int, n: int) -> torch.Tensor:
    from sollat.collectives.gather_scatter import rank_order_reduce

    return rank_order_reduce([_rank_input(r, call, n) for r in range(WORLD)], "sum")


# Each scenario: what one rank does differently (the others run the defaults: batch_invariant False,
# the default engine limit, a communicator built with no own_pick_limit).
SCENARIOS = ["built", "rank1_fails", "rank1_refuses", "rank1_absent", "rank1_limit", "rank1_batch_invariant",
             "rank2_own_limit"]


def _three_ranks(rank: int, port: int, scenario: str, out: str) -> None:
    import json
    import os
    import time
    from datetime import timedelta

    import torch.distributed as dist

    os.environ["SOLLAT_SETUP_TIMEOUT_S"] = "3"
    if scenario == "rank1_limit" and rank == 1:  # read as the engine shims read it
        os.environ[settings.MAX_BYTES_ENV] = str(SMALL)
    # A call routed to sollat on some ranks and to the engine on others makes the stand-in's
    # all_gather wait: bounded here, so that such a split fails the test instead of hanging it.
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=WORLD,
                            timeout=timedelta(seconds=20))
    _RankOrderDouble.fail_rank = 1 if scenario == "rank1_fails" else -1
    _RankOrderDouble.own_rank = 2 if scenario == "rank2_own_limit" else -1
    core.set_communicator_factory(_RankOrderDouble)
    group = dist.new_group(list(range(WORLD)), backend="gloo")
    log = logging.getLogger("engine.plugins.sollat")
    lines = _Lines()
    log.addHandler(lines)
    log.setLevel(logging.DEBUG)
    ad = core.GroupAdapter(engine="test", name="tp:0", device_group=group, cpu_group=group, device=CPU,
                           world_size=WORLD, batch_invariant=scenario == "rank1_batch_invariant" and rank == 1,
                           max_bytes=settings.max_message_bytes(os.environ.get(settings.MAX_BYTES_ENV)), log=log,
                           refusal=(lambda: "at its cap") if scenario == "rank1_refuses" and rank == 1 else None)
    got: dict[str, Any] = {}
    try:
        if scenario == "rank1_absent" and rank == 1:  # "absent": rank 1 never builds the adapter's communicator
            time.sleep(4)
            got["absent"] = True
        else:
            t0 = time.monotonic()
            got["int32_first"] = ad.all_reduce(torch.ones(2, dtype=torch.int32)) is None  # declined: nothing built
            got["built_after_int32"] = ad.comm is not None or ad.unavailable is not None
            # The first float call is above rank 1's own limit in rank1_limit: it builds the
            # communicator on every rank all the same (the limits are agreed there).
            big = ad.all_reduce(_rank_input(rank, 2, 512))  # 2048 bytes: above SMALL
            got["big"] = None if big is None else big.view(torch.int32).tolist()
            y = ad.all_reduce(_rank_input(rank, 1, 256))  # 1024 bytes: within every limit
            got["seconds"] = time.monotonic() - t0
            got["y"] = None if y is None else y.view(torch.int32).tolist()
            x, r, w = _rank_input(rank, 3, 8).reshape(2, 4), torch.ones(2, 4), torch.ones(4)
            fused = ad.all_reduce_rmsnorm(x, r, w, 1e-6)
            got["fused_r"] = None if fused is None else fused[1].reshape(-1).view(torch.int32).tolist()
            got["fp8"] = None if ad.all_reduce_rmsnorm(x, r, w, 1e-6, fp8_scale=torch.ones(1)) is None else 3
            with ad.capture():
                got["capturing"] = ad.capturing
            got["unavailable"] = ad.unavailable
            got["batch_invariant"] = ad.batch_invariant
            got["comm_batch_invariant"] = getattr(ad.comm, "batch_invariant", None)
            got["limits"] = [ad.limit, ad.own_limit]
            got["counts"] = dict(ad.counts)
            got["made"] = _RankOrderDouble.made
    except Exception as exc:  # a split decision: recorded, and the test fails on it
        got["error"] = f"{type(exc).__name__}: {exc}"
    got["log"] = lines.records
    Path(out, f"{rank}.json").write_text(json.dumps(got))
    leave_together(rank, "", 60, WORLD)


def _int_bits(t: torch.Tensor) -> list[int]:
    return t.reshape(-1).view(torch.int32).tolist()


def test_the_inputs_show_the_rank_order() -> None:
    """The three ranks' inputs of the processes below sum to other bits in another order, so a
    result in the wrong order cannot pass."""
    for call, n in ((1, 256), (2, 512), (3, 8)):
        xs = [_rank_input(r, call, n) for r in range(WORLD)]
        assert _int_bits(_rank_order(call, n)) != _int_bits((xs[2] + xs[1]) + xs[0])


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_adapter_agrees_on_every_rank(tmp_path: Path, scenario: str) -> None:
    got = processes(_three_ranks, (scenario,), tmp_path, WORLD)
    errors = {r: g["error"] for r, g in got.items() if "error" in g}
    assert not errors, f"a rank routed differently from its peers: {errors}"
    small, big = _int_bits(_rank_order(1, 256)), _int_bits(_rank_order(2, 512))
    fused = _int_bits(_rank_order(3, 8).reshape(2, 4) + 1.0)
    if scenario == "rank1_absent":
        assert got[1] == {"absent": True, "log": []}
        for rank in (0, 2):
            g = got[rank]
            assert g["y"] is None and g["seconds"] < 3 + 5  # within the setup timeout, not the store's own
            assert g["unavailable"].startswith(f"rank {rank}: PeerTimeoutError: sollat: rank(s) [1] did not reach")
        assert [lv for lv, _ in got[0]["log"]] == ["WARNING"] and "keeps the engine's all-reduce" in got[0]["log"][0][1]
        assert [lv for lv, _ in got[2]["log"]] == ["DEBUG"]
        return
    for rank in range(WORLD):
        g = got[rank]
        assert g["int32_first"] and not g["built_after_int32"]
        assert g["capturing"] is True
        if scenario in ("rank1_fails", "rank1_refuses"):  # one rank cannot build it: no rank routes to sollat
            assert g["y"] is None and g["big"] is None and g["fused_r"] is None and g["fp8"] is None
            assert g["counts"] == {"declined:no sollat communicator": 5}
            if scenario == "rank1_fails":
                assert g["unavailable"] == "rank 1: RuntimeError: no peer memory here" and g["made"] == 1
            else:  # refused before any rank entered the (collective) construction
                assert g["unavailable"] == "rank 1: at its cap" and g["made"] == 0
            continue
        assert g["y"] == small, f"rank {rank}: not the rank-order sum"
        assert g["fused_r"] == fused and g["fp8"] == 3
        assert g["unavailable"] is None
        invariant = scenario == "rank1_batch_invariant"
        assert g["batch_invariant"] is invariant and g["comm_batch_invariant"] is invariant
        limit = SMALL if scenario == "rank1_limit" else settings.DEFAULT_MAX_BYTES
        assert g["limits"] == [limit, SMALL if scenario == "rank2_own_limit" else None]
        if scenario in ("rank1_limit", "rank2_own_limit"):  # above the agreed limit: the engine's, on every rank
            assert g["big"] is None and g["counts"]["all_reduce"] == 1
        else:
            assert g["big"] == big and g["counts"]["all_reduce"] == 2
    warnings = [[m for lv, m in got[r]["log"] if lv == "WARNING"] for r in range(WORLD)]
    if scenario in ("rank1_fails", "rank1_refuses"):  # one warning for the group (rank 0's), the same on every rank
        why = "RuntimeError: no peer memory here" if scenario == "rank1_fails" else "at its cap"
        want = f"sollat: test group tp:0 keeps the engine's all-reduce: rank 1: {why}"
        assert got[0]["log"] == [["WARNING", want]]
        assert got[1]["log"] == got[2]["log"] == [["DEBUG", want]]
        return
    differs = {
        "built": None,
        "rank1_limit": f"SOLLAT_ENGINE_MAX_BYTES differs (ranks 0, 2: {settings.DEFAULT_MAX_BYTES}; rank 1: {SMALL}): "
                       f"every rank uses {SMALL} (the smallest)",
        "rank1_batch_invariant": "batch-invariant mode differs (ranks 0, 2: false; rank 1: true): every rank uses "
                                 "true (on where any rank asks for it)",
        "rank2_own_limit": f"own_limit (the communicator's own_pick_limit) differs (ranks 0, 1: null; rank 2: {SMALL}): "
                           f"every rank uses {SMALL} (the smallest)",
    }[scenario]
    if differs is None:
        assert all(g["log"] == [] for g in got.values())
        return
    want = f"sollat: test group tp:0: the ranks' settings differ; every rank uses the same: {differs}"
    assert warnings[0] == [want] and warnings[1] == warnings[2] == []  # exactly one, from rank 0
    assert got[1]["log"] == got[2]["log"] == [["DEBUG", want]]
