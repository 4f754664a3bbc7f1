"""Diagnostics stay out of production paths: the scripts reach the library only through public
names (sollat.testing and the bench's own functions), and the testing hooks undo themselves."""

from __future__ import annotations

import ast
from pathlib import Path

from sollat import testing
from sollat.device import layout

SCRIPTS = Path(__file__).resolve().parents[2] / "scripts"


def _root(node: ast.expr) -> str:
    while isinstance(node, ast.Attribute | ast.Call | ast.Subscript):
        node = node.func if isinstance(node, ast.Call) else node.value
    return node.id if isinstance(node, ast.Name) else ""


def _is_private(node: ast.AST) -> bool:
    if not isinstance(node, ast.Attribute) or not node.attr.startswith("_") or node.attr.startswith("__"):
        return False
    return _root(node.value) not in ("torch", "np")  # other libraries' internals are not ours to police


def _private_uses(path: Path) -> list[str]:
    return [f"{path.name}:{n.lineno}: .{n.attr}" for n in ast.walk(ast.parse(path.read_text())) if _is_private(n)]


def test_scripts_use_no_private_member_of_the_library() -> None:
    found = [u for p in sorted(SCRIPTS.glob("*.py")) for u in _private_uses(p)]
    assert found == []


def test_override_block_threads_applies_inside_the_block_only() -> None:
    lines = 4096
    default = layout.plan(lines, max_blocks=64)
    with testing.override_block_threads(64):
        small = layout.plan(lines, max_blocks=64)
    assert small.threads <= 64 < default.threads or small.blocks > default.blocks
    assert layout.plan(lines, max_blocks=64) == default


def test_rotating_sets_and_rank_order_sum_on_cpu() -> None:
    import torch

    from sollat.bench.virtual import rank_order_sum, rotating_sets

    ins, outs = rotating_sets(3, 5, torch.bfloat16, "cpu", 2)
    assert len(ins) == len(outs) == 2 and all(len(s) == 3 for s in ins + outs)
    assert all(t.dtype == torch.bfloat16 and t.shape == (5,) and t.isnan().all() for s in outs for t in s)
    ref = rank_order_sum(ins[0])
    assert ref.dtype == torch.bfloat16
    assert torch.equal(ref, (ins[0][0].float() + ins[0][1].float() + ins[0][2].float()).to(torch.bfloat16))


def test_virtual_timing_is_written_once() -> None:
    root = SCRIPTS.parent
    for rel in ("sollat/tune.py", "sollat/bench/sweep.py"):
        text = (root / rel).read_text()
        assert "from sollat.bench.virtual import" in text or "from .virtual import" in text \
            or "from .bench.virtual import" in text, rel
