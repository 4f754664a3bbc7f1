"""Diagnostics stay out of production paths: the scripts reach the library only through public
names (sollat.testing and the bench's own functions), and the testing hooks undo themselves."""

from __future__ import annotations

import ast
from pathlib import Path

from sollat import layout, testing

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
