"""What ptxas reports about each compiled function: registers, stack frame and spills.

NVRTC runs ptxas itself when it compiles to a cubin; with ``-Xptxas -v`` (ProgramOptions'
``ptxas_options="-v"``) ptxas writes one "Function properties" block per function into NVRTC's
program log. That is the same report the ptxas binary gives, with nothing but the NVRTC wheel
(no CUDA toolkit, no GPU), so CI checks it on a CPU machine. The check compiles outside the cubin
cache: a cached cubin carries no log. ``-v`` asks for the report only; the code is the same cubin
``build.compile_cubin`` makes from the same options.
"""

from __future__ import annotations

import dataclasses
import io
import re
from collections.abc import Mapping
from dataclasses import dataclass

from . import build

_PROPERTIES = re.compile(r"Function properties for (\S+)")
_FRAME = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
_ENTRY = re.compile(r"Compiling entry function '([^']+)'")
_REGISTERS = re.compile(r"Used (\d+) registers")


@dataclass(frozen=True)
class FunctionResources:
    """One function's figures from ptxas -v (registers: None for a function that is not an entry)."""

    name: str
    stack_frame: int
    spill_stores: int
    spill_loads: int
    registers: int | None = None

    @property
    def spills(self) -> bool:
        return self.spill_stores > 0 or self.spill_loads > 0

    def __str__(self) -> str:
        regs = "" if self.registers is None else f"{self.registers} registers, "
        return (f"{self.name}: {regs}{self.stack_frame} B stack frame, {self.spill_stores} B spill stores, "
                f"{self.spill_loads} B spill loads")


def parse_ptxas_log(log: str) -> list[FunctionResources]:
    """Every "Function properties" block of a ptxas -v log, in log order. The registers come from
    the "Used N registers" line of the entry function being compiled when the block appears.
    ValueError for a block without its stack frame and spill line (a log format this does not know)."""
    out: list[FunctionResources] = []
    entry: str | None = None
    lines = log.splitlines()
    for k, line in enumerate(lines):
        if m := _ENTRY.search(line):
            entry = m.group(1)
            continue
        m = _PROPERTIES.search(line)
        if m is None:
            continue
        name = m.group(1)
        frame = _FRAME.search(lines[k + 1]) if k + 1 < len(lines) else None
        if frame is None:
            raise ValueError(f"ptxas -v log: no stack frame and spill line after 'Function properties for {name}'")
        regs = None
        if name == entry:
            for later in lines[k + 2:k + 4]:
                if r := _REGISTERS.search(later):
                    regs = int(r.group(1))
                    break
        stack, stores, loads = (int(g) for g in frame.groups())
        out.append(FunctionResources(name, stack, stores, loads, regs))
    return out


def compile_resources(source: str, *, arch: str = build.DEFAULT_ARCH,
                      defines: Mapping[str, str] | None = None) -> list[FunctionResources]:
    """Compile ``source`` with sollat's options (build.compile_cubin's) plus ptxas -v, uncached,
    and return ptxas's figures for every function. RuntimeError when NVRTC fails (its log in the
    message), or when the log holds no function at all."""
    missing = build.nvrtc_missing()
    if missing is not None:
        raise build.NvrtcMissingError(missing)
    from cuda.core import Program

    options = dataclasses.replace(build._options(arch, dict(defines or {})), ptxas_options="-v")
    log = io.StringIO()
    try:
        Program(source, code_type="c++", options=options).compile("cubin", logs=log)
    except Exception as exc:  # NVRTC puts the compile log in the message
        raise RuntimeError(f"sollat: NVRTC failed to compile for {arch}:\n{exc}") from exc
    found = parse_ptxas_log(log.getvalue())
    if not found:
        raise RuntimeError(f"sollat: ptxas -v reported no function for {arch}; its log:\n{log.getvalue()}")
    return found
