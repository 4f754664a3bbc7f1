"""A C++ header that a module of sollat renders and the repository commits (``abi.h`` from
``abi_header.py``, ``layout.h`` from ``abi_layout.py``): its frame, and whether the committed
file is still what the module renders (a CPU test checks each)."""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path


def framed(banner: Sequence[str], guard: str, body: Sequence[str]) -> str:
    """The header's text: the ``banner`` comment lines, then ``body`` inside the include guard ``guard``."""
    lines = [*banner, f"#ifndef {guard}", f"#define {guard}", "", *body, "", f"#endif  // {guard}"]
    return "\n".join(lines) + "\n"


@dataclass(frozen=True)
class GeneratedHeader:
    path: Path  # the committed file
    render: Callable[[], str]  # its text, as the module renders it now

    def write(self, path: Path | None = None) -> None:
        (path or self.path).write_text(self.render())

    def is_current(self, path: Path | None = None) -> bool:
        """Whether ``path`` (the committed file by default) is byte for byte what ``render()`` gives."""
        return (path or self.path).read_bytes() == self.render().encode()

    def print(self) -> None:
        """What ``python -m <module>`` does: the rendering on stdout (redirected onto the file)."""
        sys.stdout.write(self.render())
