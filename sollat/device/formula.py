"""A tiny expression language that Python and CUDA C++ evaluate the same way.

A formula is one integer expression over its parameters, named constants and other formulas:
``+``, ``-``, ``*``, ``//`` (integer division, non-negative operands only), parentheses, integer
literals, and ``widen(x)``: ``x`` computed at the formula's return type (C++: a cast where the
operands are narrower; Python: ``x``, its integers never overflow). ``sollat.device.abi_layout``
declares the layout formulas in it; this module checks an expression, renders it as C++,
compiles it to a Python function and evaluates it with C's fixed-width integers (the tests use
that to show no intermediate overflows at the limits).
"""

from __future__ import annotations

import ast
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

# C integer types a formula may use, by conversion rank (usual arithmetic conversions, for the
# mix that occurs here: int, then long long, then unsigned long long).
RANK: dict[str, int] = {"int": 0, "long long": 1, "u64": 2}
BITS: dict[str, tuple[int, bool]] = {"int": (32, True), "long long": (64, True), "u64": (64, False)}
_OPS: dict[type, tuple[str, int]] = {ast.Add: ("+", 1), ast.Sub: ("-", 1), ast.Mult: ("*", 2),
                                     ast.FloorDiv: ("/", 2)}  # C++ spelling, precedence
WIDEN = "widen"
KEYWORD_ONLY = "*"  # a parameter list entry: the Python parameters after it are keyword-only


@dataclass(frozen=True)
class Signature:
    """One C++ overload: ``(name, C type)`` per parameter and the return type."""

    params: tuple[tuple[str, str], ...]
    returns: str = "int"


@dataclass(frozen=True)
class Formula:
    name: str  # the Python name (sollat.device.layout) and, unless cxx_name says otherwise, the C++ one
    params: tuple[str, ...]  # Python parameter names (KEYWORD_ONLY allowed: host-only formulas)
    expr: str
    doc: str  # one paragraph: the C++ comment and the Python docstring
    device: tuple[Signature, ...] = ()  # C++ overloads in layout.h; () = host only
    cxx_name: str = ""

    @property
    def cxx(self) -> str:
        return self.cxx_name or self.name

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(p for p in self.params if p != KEYWORD_ONLY)


def parse(f: Formula, known: Sequence[str]) -> ast.expr:
    """``f.expr`` as a checked Python AST: only the subset above, only ``f``'s parameters and ``known``
    names (constants and formulas)."""
    tree = ast.parse(f.expr, mode="eval").body
    for node in ast.walk(tree):
        if isinstance(node, ast.BinOp):
            if type(node.op) not in _OPS:
                raise ValueError(f"{f.name}: operator {type(node.op).__name__} is not in the subset")
        elif isinstance(node, ast.Call):
            if not isinstance(node.func, ast.Name) or node.keywords:
                raise ValueError(f"{f.name}: only plain calls of named formulas")
            if node.func.id == WIDEN and len(node.args) != 1:
                raise ValueError(f"{f.name}: widen takes one argument")
        elif isinstance(node, ast.Name):
            if node.id not in f.names and node.id not in known and node.id != WIDEN:
                raise ValueError(f"{f.name}: unknown name {node.id}")
        elif isinstance(node, ast.Constant):
            if type(node.value) is not int or node.value < 0:
                raise ValueError(f"{f.name}: only non-negative integer literals")
        elif not isinstance(node, (ast.operator, ast.expr_context)):
            raise ValueError(f"{f.name}: {type(node).__name__} is not in the subset")
    return tree


def _callee(node: ast.Call) -> str:
    assert isinstance(node.func, ast.Name)  # parse() admits no other call
    return node.func.id


def _strip_widen(tree: ast.expr) -> ast.expr:
    class Strip(ast.NodeTransformer):
        def visit_Call(self, node: ast.Call) -> Any:
            self.generic_visit(node)
            return node.args[0] if isinstance(node.func, ast.Name) and node.func.id == WIDEN else node

    return Strip().visit(tree)


def python_function(f: Formula, namespace: dict[str, Any], known: Sequence[str]) -> Callable[..., int]:
    """``f`` as a Python function whose globals are ``namespace`` (constants and formulas by name)."""
    body = ast.unparse(_strip_widen(parse(f, known)))
    params = ", ".join(f.params)
    code = f"def {f.name}({params}) -> int:\n    return {body}\n"
    exec(compile(code, f"<sollat.device.abi_layout {f.name}>", "exec"), namespace)
    fn: Callable[..., int] = namespace[f.name]
    fn.__doc__ = f.doc + (f" Device: ``{f.cxx}`` (``layout.h``)." if f.device else "")
    fn.__module__ = "sollat.device.layout"
    return fn


@dataclass(frozen=True)
class CEnv:
    """What the C++ side knows about names: constants' spellings, types and values, formulas' return types."""

    constants: Mapping[str, tuple[str, int]]  # Python name -> (C++ spelling, value); all are int
    formulas: Mapping[str, Formula]


def c_type(tree: ast.expr, sig: Signature, env: CEnv) -> str:
    """The C type of a sub-expression under ``sig`` (usual arithmetic conversions)."""
    if isinstance(tree, ast.BinOp):
        return max(c_type(tree.left, sig, env), c_type(tree.right, sig, env), key=RANK.__getitem__)
    if isinstance(tree, ast.Call):
        name = _callee(tree)
        return sig.returns if name == WIDEN else env.formulas[name].device[0].returns
    if isinstance(tree, ast.Name):
        return dict(sig.params).get(tree.id, "int")
    return "int"


def render_cxx(tree: ast.expr, sig: Signature, env: CEnv, prec: int = 0) -> str:
    """C++ text of ``tree`` with the fewest parentheses (left-associative binary operators)."""
    if isinstance(tree, ast.BinOp):
        op, p = _OPS[type(tree.op)]
        text = f"{render_cxx(tree.left, sig, env, p)} {op} {render_cxx(tree.right, sig, env, p + 1)}"
        return f"({text})" if p < prec else text
    if isinstance(tree, ast.Call):
        name, args = _callee(tree), tree.args
        if name != WIDEN:
            return f"{env.formulas[name].cxx}({', '.join(render_cxx(a, sig, env) for a in args)})"
        if c_type(args[0], sig, env) == sig.returns:
            return render_cxx(args[0], sig, env, prec)
        return f"({sig.returns}){render_cxx(args[0], sig, env, 3)}"  # a cast binds tighter than * and /
    if isinstance(tree, ast.Name):
        return env.constants[tree.id][0] if tree.id in env.constants else tree.id
    assert isinstance(tree, ast.Constant)
    return str(tree.value)


def eval_c(tree: ast.expr, sig: Signature, env: CEnv, args: Mapping[str, int]) -> int:
    """``tree``'s value as the device computes it under ``sig``: signed overflow or a negative
    division operand raises OverflowError (C++: undefined), u64 wraps."""

    def fit(v: int, t: str) -> int:
        bits, signed = BITS[t]
        if not signed:
            return v % (1 << bits)
        if not -(1 << (bits - 1)) <= v < (1 << (bits - 1)):
            raise OverflowError(f"{v} overflows {t}")
        return v

    def go(node: ast.expr) -> int:
        t = c_type(node, sig, env)
        if isinstance(node, ast.BinOp):
            a, b = fit(go(node.left), t), fit(go(node.right), t)
            if isinstance(node.op, ast.FloorDiv):
                if a < 0 or b <= 0:
                    raise OverflowError("integer division needs non-negative operands")
                return a // b
            return fit(a + b if isinstance(node.op, ast.Add) else a - b if isinstance(node.op, ast.Sub) else a * b, t)
        if isinstance(node, ast.Call):
            name = _callee(node)
            if name == WIDEN:
                return fit(go(node.args[0]), t)
            g = env.formulas[name]
            return eval_c(parse(g, list(env.constants) + list(env.formulas)), g.device[0], env,
                          dict(zip(g.names, (go(a) for a in node.args), strict=True)))
        if isinstance(node, ast.Name):
            return fit(args[node.id] if node.id in args else env.constants[node.id][1], t)
        assert isinstance(node, ast.Constant) and isinstance(node.value, int)
        return node.value

    return fit(go(tree), sig.returns)
