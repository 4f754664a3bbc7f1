"""The protocol model checker (sollat.model): clean protocols pass, planted bugs are caught.

The default run checks the small exhaustive configurations (against the figures documented in
docs/protocol-model.md) and a few random schedules on every random configuration. The full bounded
sweep runs once per test run (module fixture) on up to 2 worker processes in the tests marked
``slow`` (``python3 -m pytest tests -m ''`` runs them, as CI does); set SOLLAT_MODEL_SOAK=<seconds>
with ``-m slow`` to also run the long random soak.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import pytest

from sollat.device import layout
from sollat.model import (
    BENIGN,
    EXHAUSTIVE,
    PLANTED,
    RANDOM,
    Config,
    Machine,
    Mutation,
    cli,
    exhaustive,
    protocols,
    random_runs,
    rules,
)
from sollat.model.explore import Report, shortest_counterexample
from sollat.model.fault_sweep import FAULT_MUTATIONS
from sollat.model.program import ADD, FENCE, POLL, POLL128, RESET, SEND
from sollat.model.scratch import SENTINEL_SIG_REST, SIG_REST
from sollat.model.state import State
from sollat.model.sweep import Planted, SweepResult, soak, sweep
from sollat.model.trace import replay

MIN_INTERLEAVINGS = 100_000
DOC = Path(__file__).resolve().parents[2] / "docs" / "protocol-model.md"
QUICK_STATES = 10_000  # exhaustive configurations up to this many states run in the default test run


def documented_configs() -> dict[str, tuple[int, int, str]]:
    """docs/protocol-model.md's table of exhaustive configurations: name -> (states, transitions, interleavings)."""
    rows = re.findall(r"^\| `([\w.-]+)` \| ([\d,]+) \| ([\d,]+) \| ([\d,.e+]+) \|$", DOC.read_text(), re.M)
    return {name: (int(st.replace(",", "")), int(tr.replace(",", "")), il) for name, st, tr, il in rows}


def interleavings_text(n: int) -> str:
    """As the doc and ``--exhaustive`` print it: exact below 10^10, else 3 decimals of an exponent."""
    return f"{n:,}" if n < 10**10 else f"{n:.3e}"


DOCUMENTED = documented_configs()


@pytest.fixture(scope="module")
def swept() -> SweepResult:
    return sweep(seed=0)


# ---- the bounded sweep ---------------------------------------------------------------------------
@pytest.mark.slow
def test_sweep_explores_enough_interleavings(swept: SweepResult) -> None:
    print("\n" + "\n".join(r.summary() for r in swept.reports))
    print(swept.summary())
    assert swept.ok, [str(r.counterexample) for r in swept.failures]
    # Executed one by one (each a complete adversarial schedule, every step checked):
    assert swept.random_interleavings >= MIN_INTERLEAVINGS
    # Plus every interleaving of every exhaustive configuration (counted on the state graph):
    assert swept.exhaustive_interleavings > swept.states > 10_000
    assert swept.random_interleavings + swept.exhaustive_interleavings >= MIN_INTERLEAVINGS


@pytest.mark.slow
@pytest.mark.parametrize("name", [c.name for c in EXHAUSTIVE])
def test_exhaustive_config_is_clean_and_complete(swept: SweepResult, name: str) -> None:
    cfg = next(c for c in EXHAUSTIVE if c.name == name)
    rep = next(r for r in swept.reports if r.method == "exhaustive" and r.config == cfg.label())
    assert rep.counterexample is None, str(rep.counterexample)
    assert rep.complete and rep.interleavings > 0
    documented = (rep.states, rep.steps, interleavings_text(rep.interleavings))
    assert DOCUMENTED.get(name) == documented, f"docs/protocol-model.md: | `{name}` | {documented} |"


@pytest.mark.slow
def test_sweep_totals_are_the_documented_ones(swept: SweepResult) -> None:
    n_ex = sum(1 for r in swept.reports if r.method == "exhaustive")
    text = (f"{swept.random_interleavings:,} random schedules executed on {len(RANDOM)} configurations "
            f"({swept.steps - sum(r.steps for r in swept.reports if r.method == 'exhaustive'):,} steps) + "
            f"{n_ex} exhaustive configurations ({swept.states:,} states, "
            f"{sum(r.steps for r in swept.reports if r.method == 'exhaustive'):,} transitions, covering "
            f"{swept.exhaustive_interleavings:.3e} interleavings)")
    assert text in DOC.read_text(), f"docs/protocol-model.md should say: {text}"


def test_every_exhaustive_config_is_documented() -> None:
    assert sorted(DOCUMENTED) == sorted(c.name for c in EXHAUSTIVE)
    assert sum(1 for st, _, _ in DOCUMENTED.values() if st <= QUICK_STATES) >= 10


@pytest.mark.parametrize("name", [n for n, (st, _, _) in DOCUMENTED.items() if st <= QUICK_STATES])
def test_small_exhaustive_config_is_clean_and_as_documented(name: str) -> None:
    rep = exhaustive(next(c for c in EXHAUSTIVE if c.name == name))
    assert rep.counterexample is None, str(rep.counterexample)
    assert rep.complete
    assert (rep.states, rep.steps, interleavings_text(rep.interleavings)) == DOCUMENTED[name]


@pytest.mark.parametrize("name", [c.name for c, _ in RANDOM])
def test_random_config_is_clean_in_brief(name: str) -> None:
    cfg = next(c for c, _ in RANDOM if c.name == name)
    rep = random_runs(cfg, 8, seed=3)
    assert rep.counterexample is None, str(rep.counterexample)
    assert rep.interleavings == 8 and len(rep.adversaries) == 8  # every adversary took part


@pytest.mark.slow
@pytest.mark.parametrize("name", [c.name for c, _ in RANDOM])
def test_random_config_is_clean(swept: SweepResult, name: str) -> None:
    cfg, runs = next((c, n) for c, n in RANDOM if c.name == name)
    rep = next(r for r in swept.reports if r.method == "random" and r.config == cfg.label())
    assert rep.counterexample is None, str(rep.counterexample)
    assert rep.interleavings == runs
    assert len(rep.adversaries) == 8  # every adversary took part


# ---- planted bugs ----------------------------------------------------------------------------------
@pytest.mark.parametrize("planted", PLANTED, ids=[p.name for p in PLANTED])
def test_planted_bug_is_caught_with_a_counterexample(planted: Planted) -> None:
    ex = exhaustive(planted.config, shortest=False)  # the shortest one: the slow test below
    assert ex.counterexample is not None, f"{planted.name}: exhaustive search found nothing"
    v = ex.counterexample.violation
    assert v.kind in planted.kinds, str(v)
    text = ex.counterexample.format()
    assert f"VIOLATION [{v.kind}]" in text and "trace" in text
    assert "#1 " in text  # numbered steps: which rank wrote what, when
    if v.line >= 0:  # the violating line is named and its history is marked
        name = Machine(planted.config).names[v.line]
        assert name in text and "*#" in text
    rnd = random_runs(planted.config, 3000, seed=1)
    assert rnd.counterexample is not None, f"{planted.name}: random schedules found nothing"
    assert rnd.counterexample.violation.kind in planted.kinds, str(rnd.counterexample.violation)


#: Proofs of more than QUICK_STATES states: in the tests marked slow (CI runs them).
SLOW_BENIGN = {"single-buffer/twoshot-ll"}


@pytest.mark.slow
@pytest.mark.parametrize("planted", PLANTED, ids=[p.name for p in PLANTED])
def test_planted_bug_has_a_short_counterexample(planted: Planted) -> None:
    # what --planted and --mutation print: a shortest violating schedule (breadth-first)
    m = Machine(planted.config)
    path = shortest_counterexample(m)
    assert path is not None and len(path) <= 40
    _, v = replay(m, path)
    assert v is not None and v.kind in planted.kinds, str(v)


@pytest.mark.parametrize("benign", [pytest.param(p, marks=pytest.mark.slow) if p.name in SLOW_BENIGN else p
                                    for p in BENIGN], ids=[p.name for p in BENIGN])
def test_benign_mutation_is_proved_harmless(benign: Planted) -> None:
    rep = exhaustive(benign.config)
    assert rep.ok and rep.complete, str(rep.counterexample)


@pytest.mark.parametrize("planted", [p for p in PLANTED if p.ptx_only], ids=lambda p: p.name)
def test_ptx_only_bug_is_harmless_in_the_strong_model(planted: Planted) -> None:
    # what only PTX's memory model breaks: the strong model (untorn lines, stores in program order,
    # every fence global) proves the same configuration clean on every schedule
    rep = exhaustive(replace(planted.config, memory="strong"))
    assert rep.ok and rep.complete, str(rep.counterexample)


#: PTX-only planted bugs and the one rule each breaks: a torn line, no fence, a fence too narrow.
PTX_ONLY = {Mutation.SINGLE_FLAG_LINE: {"stale"}, Mutation.NO_REUSE_FENCE: {"overwrite"},
            Mutation.GPU_FENCE: {"overwrite", "reset-race", "torn"}}


def test_ptx_only_bugs_are_the_new_mutations() -> None:
    got = {m for p in PLANTED if p.ptx_only for m in p.config.mutations}
    assert got == set(PTX_ONLY)
    for p in PLANTED:
        for m in p.config.mutations & set(PTX_ONLY):
            assert p.kinds <= PTX_ONLY[m] | {"stale"}, p.name  # each caught as what that rule breaks


@pytest.mark.parametrize("name", ["single-flag-line/oneshot-ll", "no-reuse-fence/oneshot-ll", "reused-flag/twoshot",
                                  "skip-sentinel-reset/oneshot", "gpu-fence/oneshot-sentinel"])
def test_split_lines_give_the_same_verdicts(name: str) -> None:
    # tear="flags" models a line whose every part its reader checks as one access; splitting every
    # line (tear="all") finds the same bug, as the same kind (and the *-tear configurations are clean)
    p = next(p for p in PLANTED if p.name == name)
    one, split = exhaustive(p.config), exhaustive(replace(p.config, tear="all"))
    assert one.counterexample is not None and split.counterexample is not None
    assert split.counterexample.violation.kind == one.counterexample.violation.kind


@pytest.mark.parametrize("kw", [
    {"memory": "sc"}, {"ranks": "remote"}, {"tear": "none"}, {"sig_epoch_bits": 0}, {"sig_epoch_bits": 33},
    {"epoch_bits": 17}, {"epoch_bits": 0}, {"algorithm": "bulk"}, {"protocol": "ll128"}, {"nranks": 9},
])
def test_config_validation(kw: dict[str, object]) -> None:
    with pytest.raises(ValueError):
        Config(**{"algorithm": "oneshot", "calls": (1, 2, 1), **kw})  # type: ignore[arg-type]


def test_config_labels_name_what_differs_from_the_device() -> None:
    base = Config(algorithm="oneshot", protocol="sentinel", calls=(1, 2))
    assert base.label() == "oneshot-sentinel-2r1t[1,2]" and base.ptx and base.signature_words
    assert replace(base, memory="strong", ranks="virtual", tear="all", sig_words=False).label() == \
        "oneshot-sentinel-2r1t[1,2] strong virtual tear=all no-sig-words"
    assert Config(algorithm="ll128", calls=(2,), sig_epoch_bits=2).label() == "ll128-ll128-2r1t[2] sig-bits=2"
    with pytest.raises(ValueError, match="LL128's"):  # a sentinel buffer's word has no epoch field
        replace(base, sig_epoch_bits=2)
    assert not base.with_mutation(Mutation.NO_SIGNATURE_LINE).signature_words
    assert not replace(base, protocol="ll").signature_words  # every LL line carries the signature
    assert rules.peer_scope(base) == "sys" and rules.peer_scope(replace(base, ranks="virtual")) == "gpu"
    assert rules.fence_scope(base.with_mutation(Mutation.GPU_FENCE)) == "gpu"
    assert not rules.fence_orders_peers(base, "gpu") and rules.fence_orders_peers(replace(base, ranks="virtual"), "gpu")
    assert rules.fence_orders_peers(replace(base, memory="strong"), "gpu")  # the strong model: every fence global


def test_the_device_files_the_model_names_exist() -> None:
    root = Path(__file__).resolve().parents[2]
    named = [v for k, v in vars(rules).items() if k.startswith("DEVICE_")]
    assert len(named) >= 8 and all((root / f).is_file() for f in named), named


def test_every_mutation_is_planted_somewhere() -> None:
    planted = set().union(*(p.config.mutations for p in PLANTED))
    assert planted | FAULT_MUTATIONS == set(Mutation)  # the fault path's: tests/cpu/test_model_faults.py


@pytest.mark.parametrize("memory", ["ptx", "strong"])
def test_counterexample_reads_well(memory: str) -> None:
    cfg = Config(algorithm="oneshot", protocol="sentinel", calls=(1, 2, 1), memory=memory)
    ce = exhaustive(cfg.with_mutation(Mutation.NO_BOUNDARY_ORDER)).counterexample
    assert ce is not None
    text = ce.format()
    assert "before the receiver's reset" in text
    assert "RESET r1.oneshot" in text and "issued (not yet performed)" in text
    assert "SEND" in text and "POLL" in text and "kernel boundary" in text
    if memory == "ptx":  # the fence that orders the pass, and the signature words, are in the trace
        assert "FENCE .sys (its earlier operations are performed)" in text
        assert "SEND signature word (sig=" in text and "channel 0's signature word epoch 0" in text


def test_torn_line_counterexample_is_short() -> None:
    cfg = Config(algorithm="ll128", calls=(2, 4)).with_mutation(Mutation.TORN_LL128)
    ce = exhaustive(cfg).counterexample
    assert ce is not None and ce.violation.kind == "torn"
    assert len(ce.schedule) <= 4  # breadth-first: two counter lanes land, the owner reads
    assert "counter says all 2 ranks added" in ce.format()


# ---- the checker's own machinery -----------------------------------------------------------------
@pytest.mark.parametrize("memory", ["ptx", "strong"])
def test_interleaving_count_is_exact(memory: str) -> None:
    # 2 ranks, one line: each rank SENDs then POLLs the other's line. Strong model: S0 S1 in either
    # order, then P0 P1 in either order -> 4 schedules. PTX: a rank's poll may also come before its
    # own send (nothing orders them), only S1 < P0 and S0 < P1 -> 4! / 4 = 6.
    one = exhaustive(Config(algorithm="oneshot", protocol="ll", calls=(1,), memory=memory))
    assert one.interleavings == {"strong": 4, "ptx": 6}[memory]
    # Brute-force enumeration (no state merging) agrees with the count on the state graph.
    cfg = Config(algorithm="oneshot", protocol="sentinel" if memory == "strong" else "ll", calls=(1, 2),
                 sig_words=False, memory=memory)
    m = Machine(cfg)

    def count(st: State) -> int:
        acts = m.enabled(st)
        if not acts:
            assert m.finished(st)
            return 1
        total = 0
        for a in acts:
            c = st.copy()
            assert m.apply(c, a) is None
            total += count(c)
        return total

    assert count(m.initial()) == exhaustive(cfg).interleavings


@pytest.mark.parametrize("memory", ["ptx", "strong"])
def test_deadlock_is_reported(memory: str) -> None:
    cfg = Config(algorithm="oneshot", protocol="ll", calls=(1, 1), memory=memory)
    m = Machine(cfg)
    code = list(m.code[1][1][0])
    code.remove(next(i for i in code if i.op == SEND))  # rank 1 never sends in call 1
    m.code[1][1][0] = tuple(code)
    rep = exhaustive(cfg, machine=m)
    assert rep.counterexample is not None and rep.counterexample.violation.kind == "deadlock"
    assert "waits on r0.oneshot" in rep.counterexample.format()
    rnd = random_runs(cfg, 5, machine=m)
    assert rnd.counterexample is not None and rnd.counterexample.violation.kind == "deadlock"


def test_random_runs_count_and_are_reproducible() -> None:
    cfg = next(c for c, _ in RANDOM if c.name == "twoshot-sentinel-3r1t-x3")
    a = random_runs(cfg, 40, seed=7)
    b = random_runs(cfg, 40, seed=7)
    assert a.interleavings == b.interleavings == 40 and a.steps == b.steps


def test_config_names_are_unique() -> None:
    names = [c.name for c in EXHAUSTIVE] + [c.name for c, _ in RANDOM] + [p.name for p in PLANTED + BENIGN]
    assert len(names) == len(set(names))


# ---- rules come from sollat.device.layout -----------------------------------------------------------------
@pytest.mark.parametrize("threads", [1, 2, 4, 8])
@pytest.mark.parametrize("lines", [1, 2, 3, 5, 9, 17, 40])
def test_model_geometry_is_layout_plan_at_bundle_granularity(threads: int, lines: int) -> None:
    cfg = Config(threads=threads, max_blocks=2, max_slots=2)
    g = layout.MAX_THREADS // threads
    # bundles up to BLOCK_THREADS wide follow the library's own plan exactly
    block_threads = layout.BLOCK_THREADS if g <= layout.BLOCK_THREADS else g
    real = layout.plan(lines * g, max_blocks=2, max_slots=2, block_threads=block_threads)
    geo = rules.model_geometry(cfg, lines)
    assert (geo.blocks, geo.threads * g, geo.slots, geo.iterations) == \
        (real.blocks, real.threads, real.slots, real.iterations)
    # every message line is handled exactly once, by a bundle that acts as a whole
    seen = sorted(rules.message_line(geo, it, b, i, t) for it in range(geo.iterations) for b in range(geo.blocks)
                  for i in range(geo.slots) for t in range(geo.threads))
    assert seen[:lines] == list(range(lines))
    assert rules.channel(cfg, 1, 1, 1) == layout.slot_index(1, 1, g)


@pytest.mark.parametrize("cfg", EXHAUSTIVE + [c for c, _ in RANDOM] + [p.config for p in PLANTED],
                         ids=lambda c: c.name)
def test_no_two_logical_lines_share_an_address(cfg: Config) -> None:
    m = Machine(cfg)
    assert not m.scratch.aliases
    lps = layout.lines_per_src(cfg.max_blocks)
    data = {(i.rank, i.buffer, i.address) for i in m.scratch.infos if i.kind != "sig"}
    for info in m.scratch.infos:  # addresses stay inside the region the host allocates
        if info.kind != "sig":
            assert 0 <= info.address < 2 * cfg.nranks * lps
            continue
        # a word: 4 bytes (LL128's: 8) in its (parity, part) part, in the lines of the signature slot,
        # never in a data line
        part = 1 if info.buffer == "acc" else info.src  # LL128's words: the accumulator buffer's source-1 part
        per_line = 2 if info.buffer == "acc" else 4
        line = info.address // per_line
        assert info.address == per_line * layout.line_index(info.parity, part, 0, nranks=cfg.nranks,
                                                              lines_per_src=lps) + info.sub
        assert line // lps == info.parity * cfg.nranks + part and line < 2 * cfg.nranks * lps
        assert line % lps // layout.MAX_THREADS % layout.MAX_SLOTS == layout.SIGNATURE_SLOT
        assert (info.rank, info.buffer, line) not in data


def test_signature_word_is_the_layouts() -> None:
    # the model addresses signature words with the formula abi_layout.py declares, not a copy
    assert rules.signature_word is layout.signature_word
    assert layout.signature_word(1, 5) == 4 * layout.slot_index(1, layout.SIGNATURE_SLOT, 0) + 5
    assert rules.ll128_signature_slot(Config(algorithm="ll128"), 1, 2, 3) == layout.ll128_signature_word(1, 67) == \
        2 * layout.slot_index(1, layout.SIGNATURE_SLOT, 0) + 67


def test_ll_flag_rules() -> None:
    # protocol_ll.h: word h = data32 | flag_h << 32, flag_h = tag_h << 16 | (epoch & mask),
    # tag_0 = sig & 0xFFFF, tag_1 = (sig >> 16) | 1; the model keeps (tag_h, epoch & mask).
    cfg = Config(epoch_bits=2)
    sig = 0xABCD1235
    f5 = rules.ll_flag(cfg, sig, 5)
    assert f5 == ((0x1235, 1), (0xABCD, 1)) and rules.ll_tags(0x00021235) == (0x1235, 3)  # tag_1 is never 0
    assert rules.ll_flag(cfg, sig, 3) != f5  # e-2 differs in 2 bits
    assert protocols.ll_try_load((7, f5), f5) == 1
    assert protocols.ll_try_load(protocols.LL_REST, f5) == 0  # flag 0 is never valid
    assert protocols.ll_try_load((7, ((0x1235, 1), (0, 0))), f5) == 0  # one word written: keep polling
    assert protocols.ll_try_load((7, ((0x1235, 1), (0x9999, 1))), f5) == -1  # this epoch, other tag: mismatch
    assert protocols.ll_try_load((7, ((0x1235, 2), (0xABCD, 1))), f5) == 0  # another epoch: not yet
    assert rules.ll_flag(cfg.with_mutation(Mutation.REUSED_FLAG), sig, 5) == \
        rules.ll_flag(cfg.with_mutation(Mutation.REUSED_FLAG), sig, 3)
    assert rules.ll_flag(cfg.with_mutation(Mutation.SINGLE_FLAG_LINE), sig, 5) == (sig, 1)  # one flag for 16 bytes


def test_signature_word_rules() -> None:
    # protocol_sentinel.h SentinelSignature: the 32-bit signature, no epoch; accepted when equal,
    # empty (keep polling) at 0, a call mismatch otherwise.
    cfg = Config(protocol="sentinel")
    sig = rules.signature(cfg, 3)
    want = rules.sig_word(sig)
    assert want == (sig, None)
    assert protocols.ll_check_flag(want, want) == 1
    assert protocols.ll_check_flag(SENTINEL_SIG_REST[1], want) == 0  # at rest, and after its reader's reset
    assert protocols.ll_check_flag(rules.sig_word(sig ^ 2), want) == -1  # the mismatch hook's signature: reported
    # ll128.h ll128::SignatureWord: sig << 32 | epoch (32 bits); a call mismatch when the low half is
    # the wanted epoch and the high half neither 0 nor the own sig.
    ll128 = Config(algorithm="ll128")
    want = rules.ll128_sig_word(ll128, sig, 7)
    assert want == (sig, 7) and rules.ll128_sig_word(ll128, sig, 7 + (1 << 32)) == want  # 32-bit field
    assert rules.ll128_sig_word(Config(algorithm="ll128", sig_epoch_bits=2), sig, 7) == (sig, 3)
    assert protocols.ll_check_flag(want, want) == 1
    assert protocols.ll_check_flag(SIG_REST[1], want) == 0  # at rest (scratch init zeroes the words)
    assert protocols.ll_check_flag((sig, 5), want) == 0  # e-2: keep polling
    assert protocols.ll_check_flag((sig ^ 2, 7), want) == -1  # the mismatch hook's signature: reported
    assert protocols.ll_check_flag((sig ^ 2, 5), want) == 0


@pytest.mark.parametrize("algorithm", ["oneshot", "twoshot", "rmsnorm_twoshot"])
def test_signature_word_travels_with_every_line0_send(algorithm: str) -> None:
    # Every thread's channel 0 carries a word: the thread stores it with each line-0 send to a peer
    # (every pass, every call, every peer) into the peer's (parity, sender) part, and polls the
    # peer's word with each receive from it (each receive has a line 0), then resets it before the
    # fence of its next send.
    cfg = Config(algorithm=algorithm, protocol="sentinel", nranks=3, calls=(5, 2, 9), threads=2, max_slots=2)
    m = Machine(cfg)
    g = rules.bundle(cfg)
    infos = m.scratch.infos
    for r, rank in enumerate(m.code):
        for threads in rank:
            for t, code in enumerate(threads):
                ch0 = rules.channel(cfg, 0, 0, t)
                words = [i for i in code if i.line >= 0 and m.kinds[i.line] == "sig"]
                line0 = [(i.op, i.peer, infos[i.line].buffer, i.tag[2]) for i in code
                         if i.op in (SEND, POLL) and m.kinds[i.line] == "sentinel" and infos[i.line].slot == ch0]
                got = [(i.op, i.peer, infos[i.line].buffer, i.tag[2]) for i in words if i.op != RESET]
                assert sorted(got) == sorted(line0) and got
                for i in words:
                    info = infos[i.line]
                    assert info.slot == ch0 and info.sub == rules.signature_word(0, t * g)
                    if i.op == RESET:  # the reader's reset of a word it polled (below)
                        continue
                    assert info.parity == i.tag[2] & 1 and i.tag[1] == -1 - ch0
                    assert i.flag == rules.sig_word(rules.signature(cfg, cfg.calls[i.tag[0]]))
                    assert (info.rank, info.src) == ((i.peer, r) if i.op == SEND else (r, i.peer))
                # a word goes before the line-0 data it travels with; a receive polls it in its own
                # wait, and resets it right after (no fence between: the next send's fence orders it)
                for n, i in enumerate(code):
                    if i in words and i.op == SEND:
                        data = code[n + 1]
                        assert data.op == SEND and data.peer == i.peer and infos[data.line].slot == ch0
                    if i in words and i.op == POLL:
                        assert code[n + 1].op == RESET and code[n + 1].line == i.line


@pytest.mark.parametrize("mutation", [Mutation.SIG_RING, Mutation.SIG_THREAD0])
def test_the_old_signature_schemes_are_mutations(mutation: Mutation) -> None:
    # SIG_RING: words only to rank + 1 and from rank - 1; SIG_THREAD0: only thread 0 of a block
    cfg = Config(algorithm="oneshot", protocol="sentinel", nranks=3, calls=(2,), threads=2).with_mutation(mutation)
    m = Machine(cfg)
    for r, rank in enumerate(m.code):
        assert len(rank[0]) == 2  # one pass of one line per thread
        for t, code in enumerate(rank[0]):
            words = [(i.op, i.peer) for i in code if m.kinds[i.line] == "sig" and i.op != RESET]
            if mutation is Mutation.SIG_RING:
                assert sorted(words) == [(SEND, (r + 1) % 3), (POLL, (r - 1) % 3)]
            else:
                assert len(words) == (4 if t == 0 else 0)


def test_ll128_reduce_scatter_carries_signature_words() -> None:
    # Each warp stores (sig, acc epoch) into every other owner before its adds, and the owner polls
    # every other source's word for this warp before its zeroing fence and all-gather sends.
    cfg = Config(algorithm="ll128", nranks=3, calls=(3, 6), threads=2)
    m = Machine(cfg)
    infos = m.scratch.infos
    for r, rank in enumerate(m.code):
        for k, threads in enumerate(rank):
            for code in threads:
                sends = [n for n, i in enumerate(code) if i.op == SEND and m.kinds[i.line] == "sig"]
                polls = [n for n, i in enumerate(code) if i.op == POLL and m.kinds[i.line] == "sig"]
                iters = sum(1 for i in code if i.op == POLL128) // cfg.ll128_lines
                assert len(sends) == len(polls) == 2 * iters > 0
                for n in sends:
                    i = code[n]
                    nxt = next(x for x in code[n:] if x.op in (ADD, POLL128))
                    assert nxt.op == ADD and i.peer != r and infos[i.line].src == r and infos[i.line].rank == i.peer
                    assert i.flag == rules.ll128_sig_word(cfg, rules.signature(cfg, cfg.calls[k]), i.tag[2])
                for n in polls:
                    i = code[n]
                    assert infos[i.line].rank == r and infos[i.line].src == i.peer != r
                    rest = code[n:]
                    fence = next(x for x in rest if x.op == FENCE)  # the zeroing fence comes after it
                    assert rest.index(fence) < next(x for x, y in enumerate(rest) if y.op == SEND and
                                                    m.kinds[y.line] == "ll")
    bare = Machine(cfg.with_mutation(Mutation.LL128_NO_SIG_WORDS))
    assert not any(bare.kinds[i.line] == "sig" for th in bare.code[0][0] for i in th)


@pytest.mark.parametrize("lines,lanes", [(1, 2), (2, 2), (2, 4), (4, 8)])
def test_ll128_pack_restore(lines: int, lanes: int) -> None:
    n = protocols.ll128_payload(lines, lanes)
    if (lines, lanes) == (4, 8):
        assert n == 124  # fp32 on the device: 31 lanes x 4 elements
    a = tuple(range(1, n + 1))
    b = tuple(range(100, 100 + n))
    pa, pb = protocols.ll128_pack(a, lines, lanes), protocols.ll128_pack(b, lines, lanes)
    summed = [protocols.line_add(x, y) for x, y in zip(pa, pb, strict=True)]
    assert all(protocols.ll128_counter(s) == 2 for s in summed)
    assert protocols.ll128_restore(summed, lines, lanes) == tuple(x + y for x, y in zip(a, b, strict=True))


# ---- command line --------------------------------------------------------------------------------
def test_cli(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["--list"]) == 0
    assert cli.main(["--config", "ll128-split-torn-2r1t", "--exhaustive"]) == 0
    assert cli.main(["--config", "ll128-split-torn-2r1t", "--exhaustive", "--memory", "strong"]) == 0
    assert cli.main(["--config", "oneshot-sentinel-8r1t", "--runs", "20"]) == 0
    assert cli.main(["--mutation", "torn-ll128"]) == 0
    assert cli.main(["--mutation", "single-flag-line/oneshot-ll"]) == 0
    out = capsys.readouterr().out
    assert "planted bugs" in out and "VIOLATION [torn]" in out and "caught" in out
    assert "VIOLATION [stale]" in out and "harmless in the strong model" in out
    assert f"{DOCUMENTED['ll128-split-torn-2r1t'][2]} interleavings" in out  # as documented
    assert "ll128-split-torn-2r1t[2,6,2] strong torn split" in out
    assert "caught as accepted; breaks:" in out  # --list names each planted bug's verdict


@pytest.mark.parametrize("argv", [
    ["--config", "no-such-config"], ["--mutation", "no-such-bug"], ["--soak", "-5"], ["--soak", "0"],
    ["--runs", "5"], ["--exhaustive"], ["--scale", "2"], ["--sweep", "--scale", "0"], ["--sweep", "--soak", "3"],
    ["--config", "ll128-3r1t", "--runs", "0"], ["--config", "ll128-3r1t", "--runs", "5", "--exhaustive"],
    ["--workers", "0"], ["--seed", "-1"], ["--bogus"],
])
def test_cli_refuses_bad_arguments(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        cli.main(argv)
    assert exc.value.code == 2
    captured = capsys.readouterr()
    assert captured.out == "" and len(captured.err.strip().splitlines()) == 1, captured.err
    assert captured.err.startswith("python -m sollat model: error: ")


def test_sweep_shows_progress(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cli, "TICK_SECONDS", 0.0)  # a line per task
    monkeypatch.setattr(cli, "sweep_tasks", lambda scale, seed: [("random", RANDOM[0][0], 3, 0)] * 4)
    monkeypatch.setattr(cli, "sweep", lambda scale, seed, workers, progress, memory: _fake_sweep(progress))
    monkeypatch.setattr(cli, "_bulk", lambda: 0)  # the bulk model's proofs: test_model_bulk.py
    assert cli.main(["--sweep"]) == 0
    captured = capsys.readouterr()
    assert "12 random schedules" in captured.out  # the start line names the work
    lines = captured.err.strip().splitlines()
    assert lines[-1].startswith("sweep: 4/4 tasks done") and "12 random schedules" in lines[-1]
    assert len(lines) == 4


def _fake_sweep(progress: Callable[[Report], None]) -> SweepResult:
    reports = [random_runs(RANDOM[0][0], 3, seed=i) for i in range(4)]
    for r in reports:
        progress(r)
    return SweepResult(reports, 0.1)


def test_ticker_is_quiet_between_ticks(capsys: pytest.CaptureFixture[str]) -> None:
    tick = cli.Ticker("soak", lambda r: None, deadline=60.0, every=3600.0)
    rep = random_runs(RANDOM[0][0], 2, seed=0)
    tick(rep)
    tick(rep)
    assert capsys.readouterr().err == ""  # no total: no last-task line; nothing before `every`
    assert tick.line(12.0) == "soak: 2 tasks done, 0 exhaustive states, 4 random schedules, 12 s of 60 s"


def test_cli_demo(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["--demo"]) == 0
    out = capsys.readouterr().out
    assert "interleavings" in out and "VIOLATION [overwrite]" in out and "all clean" in out
    assert "memory model: ptx" in out and "VIOLATION [stale]" in out  # the PTX-only planted bug
    # the planted bugs' lines are marked as the expected output: no line a reader takes for a failure
    violations = [line for line in out.splitlines() if "VIOLATION" in line and "VIOLATION lines" not in line]
    assert len(violations) >= 4 and all(line.startswith(cli.PLANTED_MARK) for line in violations), violations
    assert out.rstrip().endswith("all clean, and every planted bug caught as expected")


@pytest.mark.slow
@pytest.mark.skipif(not os.environ.get("SOLLAT_MODEL_SOAK"), reason="set SOLLAT_MODEL_SOAK=<seconds> for the soak")
def test_soak() -> None:
    res = soak(float(os.environ["SOLLAT_MODEL_SOAK"]), seed=int(os.environ.get("SOLLAT_MODEL_SEED", "1")))
    print(res.summary())
    assert res.ok, [str(r.counterexample) for r in res.failures]
