"""No option of a torchrun-launched program may be taken by torchrun itself.

torchrun's argparse accepts abbreviations of its own long options anywhere on the command line, also
after ``-m module``: an app option that is a prefix of one of torchrun's (``--n`` of ``--nnodes``,
``--nproc-per-node``, ...) is an "ambiguous option" error or is eaten. The parsers are imported, not
copied, so a new option is checked the day it is added.
"""

from __future__ import annotations

import argparse
import re
import shlex
from collections.abc import Callable
from pathlib import Path
from unittest import mock

import pytest
from torch.distributed.run import get_args_parser

from sollat import tune
from sollat.apps import cg, decode
from sollat.bench import cli as bench_cli

ROOT = Path(__file__).resolve().parents[2]
CAMPAIGN = ROOT / "scripts" / "multi_gpu_campaign.sh"
HELP = frozenset({"-h", "--help"})  # argparse's own; an exact match passes through (checked below)


class _Captured(Exception):
    """Raised in place of parsing, to get hold of a parser built inside a main()."""


def _captured_parser(main: Callable[[list[str]], int]) -> argparse.ArgumentParser:
    seen: list[argparse.ArgumentParser] = []

    def capture(self: argparse.ArgumentParser, *_args: object, **_kw: object) -> argparse.Namespace:
        seen.append(self)
        raise _Captured

    with mock.patch.object(argparse.ArgumentParser, "parse_args", capture), pytest.raises(_Captured):
        main([])
    return seen[0]


def _subparser(parser: argparse.ArgumentParser, name: str) -> argparse.ArgumentParser:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return action.choices[name]
    raise LookupError(f"no subcommand {name}")


def _programs() -> dict[str, tuple[list[str], argparse.ArgumentParser]]:
    """torchrun-launched programs: ``-m`` module and leading arguments -> the parser of the rest."""
    bench = bench_cli.build_parser()
    progs = {"sollat.apps.cg": ([], cg.build_parser()), "sollat.apps.decode": ([], decode.build_parser()),
             "sollat tune": (["tune"], _captured_parser(tune.main))}
    for cmd in ("bench", "sol", "barrier"):
        progs[f"sollat {cmd}"] = ([cmd], _subparser(bench, cmd))
    return progs


PROGRAMS = _programs()
TORCHRUN_OPTIONS = frozenset(s for a in get_args_parser()._actions for s in a.option_strings)
CASES = [(prog, opt) for prog, (_, parser) in PROGRAMS.items()
         for a in parser._actions for opt in a.option_strings]


def _module(prog: str) -> str:
    return prog.split()[0]


def test_every_parser_was_collected() -> None:
    opts = {prog: {opt for p, opt in CASES if p == prog} for prog in PROGRAMS}
    assert {"--grid", "--nrhs", "--backends"} <= opts["sollat.apps.cg"]
    assert {"--layers", "--context", "--batch"} <= opts["sollat.apps.decode"]
    assert {"--quick", "--barrier", "--no-progress", "--into", "--out", "--sizes"} <= opts["sollat bench"]
    assert {"--out", "--sizes", "--ranks"} <= opts["sollat tune"]
    assert {"--nnodes", "--nproc-per-node", "--no-python", "--module"} <= TORCHRUN_OPTIONS


@pytest.mark.parametrize("prog,opt", CASES)
def test_no_option_is_a_prefix_of_a_torchrun_option(prog: str, opt: str) -> None:
    if opt in HELP:
        return
    taken = sorted(t for t in TORCHRUN_OPTIONS if t.startswith(opt))
    assert not taken, f"{prog} {opt} is a prefix of torchrun's {taken}: rename it"


@pytest.mark.parametrize("prog,opt", CASES)
def test_torchrun_passes_the_option_through(prog: str, opt: str) -> None:
    lead, _ = PROGRAMS[prog]
    rest = [*lead, opt, "1"]
    try:
        a = get_args_parser().parse_args(["--nproc-per-node", "2", "-m", _module(prog), *rest])
    except SystemExit as e:
        pytest.fail(f"torchrun refused `-m {prog} {opt}` (exit {e.code})")
    assert (a.training_script, a.training_script_args) == (_module(prog), rest)


def _campaign_commands() -> list[list[str]]:
    """Every torchrun command line of the campaign script, shell variables left as words."""
    text = CAMPAIGN.read_text().replace("\\\n", " ")
    return [shlex.split(m.group(1)) for m in re.finditer(r"\btorchrun\s+([^>\n]*)", text)]


def test_campaign_script_commands_parse_in_torchrun_and_the_program() -> None:
    commands = _campaign_commands()
    assert len(commands) >= 4, commands
    for words in commands:
        try:
            a = get_args_parser().parse_args(words)
        except SystemExit as e:
            pytest.fail(f"torchrun refused `torchrun {shlex.join(words)}` (exit {e.code})")
        args = words[words.index("-m") + 2:]
        assert a.training_script_args == args
        prog = a.training_script if a.training_script != "sollat" else f"sollat {args[0]}"
        lead, parser = PROGRAMS[prog]
        try:
            parser.parse_args(args[len(lead):])
        except SystemExit as e:
            pytest.fail(f"{prog} refused `{shlex.join(args)}` (exit {e.code})")
