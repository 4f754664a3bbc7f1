"""``SOLLAT_DIST=1`` without a change to user code: torch runs :func:`autoload` at ``import torch``
(the ``torch.backends`` entry point). It imports nothing unless the variable is ``1``, so an
installed sollat costs an unrelated torch program nothing (sollat.integrations.dist_zero_change)."""

from __future__ import annotations

import os


def autoload() -> None:
    """Turn the zero-change mode on where ``$SOLLAT_DIST`` is ``1``; do nothing where it is unset,
    empty or ``0``; any other value raises sollat's one error naming the variable and its values."""
    if os.environ.get("SOLLAT_DIST", "").strip() in ("", "0"):
        return
    from sollat.device import environment
    from sollat.integrations import dist_zero_change

    if environment.flag("SOLLAT_DIST"):
        dist_zero_change.enable()
