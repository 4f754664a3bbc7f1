"""A progress bar for anything that takes more than a few seconds.

On a terminal it is a rich bar; when output goes to a file or a pipe (CI, the GPU machine's
captured output) it prints one short line about every 10 % or 20 seconds instead, so logs stay
readable. Always on stderr, so the tables on stdout stay clean.
"""

from __future__ import annotations

import sys
import time
from types import TracebackType
from typing import Any, TextIO


def _mmss(seconds: float) -> str:
    seconds = max(0, int(seconds))
    return f"{seconds // 60:02d}:{seconds % 60:02d}"


class Progress:
    """``with Progress(total, "bench") as p: ... p.advance(note="R=2 f32 4 KiB")``."""

    def __init__(self, total: int, desc: str, *, enabled: bool = True, stream: TextIO | None = None,
                 interval_s: float = 20.0) -> None:
        self.total = max(1, int(total))
        self.desc = desc
        self.enabled = enabled
        self.stream = stream or sys.stderr
        self.interval_s = interval_s
        self.done = 0
        self.start = time.monotonic()
        self._last_print = self.start
        self._last_pct = -10
        self._rich: Any = None
        self._task: Any = None
        if enabled and getattr(self.stream, "isatty", lambda: False)():
            try:
                from rich.console import Console
                from rich.progress import (
                    BarColumn,
                    MofNCompleteColumn,
                    TextColumn,
                    TimeElapsedColumn,
                    TimeRemainingColumn,
                )
                from rich.progress import Progress as RichProgress

                self._rich = RichProgress(
                    TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                    TimeElapsedColumn(), TimeRemainingColumn(), TextColumn("{task.fields[note]}"),
                    console=Console(file=self.stream), transient=False,
                )
                self._rich.start()
                self._task = self._rich.add_task(desc, total=self.total, note="")
            except Exception:  # rich missing or broken: fall back to lines
                self._rich = None

    def advance(self, n: int = 1, note: str = "") -> None:
        self.done = min(self.total, self.done + n)
        if not self.enabled:
            return
        if self._rich is not None:
            self._rich.update(self._task, advance=n, note=note)
            return
        now = time.monotonic()
        pct = 100 * self.done // self.total
        if pct >= self._last_pct + 10 or now - self._last_print >= self.interval_s or self.done == self.total:
            elapsed = now - self.start
            left = elapsed / self.done * (self.total - self.done) if self.done else 0.0
            # below 5 % done the estimate of what is left is noise (start-up cost): not shown
            eta = f", ~{_mmss(left)} left" if 20 * self.done >= self.total else ""
            print(f"[{self.desc}] {self.done}/{self.total} ({pct}%) {_mmss(elapsed)} elapsed{eta}"
                  + (f"  {note}" if note else ""), file=self.stream, flush=True)
            self._last_print, self._last_pct = now, pct

    def close(self) -> None:
        if self._rich is not None:
            self._rich.stop()
            self._rich = None

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None) -> None:
        self.close()
