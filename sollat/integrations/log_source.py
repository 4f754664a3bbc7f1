"""The source tag of the plugins' log lines: sollat's path, not a bare file name.

vLLM's log format prints ``[%(filename)s:%(lineno)d]``; for a line the plugin logs from
``sollat/integrations/vllm.py`` that reads ``[vllm.py:62]``, as if it were one of vLLM's own files.
``SollatSource`` (a filter on the plugin's logger) sets a record's ``filename`` to its path from
the package's parent, ``sollat/integrations/vllm.py``, for records logged from sollat's code; it
leaves other records and every other field alone.
"""

from __future__ import annotations

import logging
from pathlib import Path

__all__ = ["SollatSource", "tag_sollat_source"]

_PACKAGE = Path(__file__).resolve().parents[1]  # .../sollat


class SollatSource(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        try:
            inside = Path(record.pathname).resolve().relative_to(_PACKAGE)
        except (ValueError, OSError):
            return True
        record.filename = (Path(_PACKAGE.name) / inside).as_posix()
        return True


def tag_sollat_source(log: logging.Logger) -> logging.Logger:
    """``log`` with one SollatSource filter (added once)."""
    if not any(isinstance(f, SollatSource) for f in log.filters):
        log.addFilter(SollatSource())
    return log
