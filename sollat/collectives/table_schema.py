"""A JSON object read into a frozen dataclass, checked against the dataclass's own declaration.

The tuning tables (``select.Table``, ``select.Rule``, ``rmsnorm_rules.Rules``, ``rmsnorm_rules.Rule``)
declare their file format as dataclass fields: the type (``int``, ``str``, a nested dataclass, a
``tuple[X, ...]`` of one, ``X | None``) and, in the field's metadata (``spec``), the bounds, the
values allowed and the value a file may leave out. ``load(cls, data, bad)`` checks a parsed JSON
value against that and builds the instance; a wrong value raises ``bad(message)``, one message
naming the key by its path (``rules[2].max_bytes``), what it takes and what it got. Keys the dataclass does not
declare are refused (a typo in a key is not ignored silently).
"""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

__all__ = ["FROM_FILE", "load", "spec"]

T = TypeVar("T")
#: ``spec(absent=...)``'s default: a file must give the key unless the dataclass has a default.
FROM_FILE: Any = object()
_SPEC = "sollat.table_schema"


def spec(*, minimum: int | None = None, choices: tuple[str, ...] | None = None, nonempty: bool = False,
         absent: Any = FROM_FILE, in_file: bool = True, sorted_by: str | None = None) -> dict[str, Any]:
    """Field metadata: ``minimum`` (an int's lower bound), ``choices`` (a string's values),
    ``nonempty`` (a non-empty string), ``absent`` (the value when the file leaves the key out, if it
    differs from the dataclass default), ``in_file=False`` (not read from the file), ``sorted_by``
    (a tuple of dataclasses must be sorted by that field)."""
    return {_SPEC: {"minimum": minimum, "choices": choices, "nonempty": nonempty, "absent": absent,
                    "in_file": in_file, "sorted_by": sorted_by}}


def _rules(f: dataclasses.Field[Any]) -> dict[str, Any]:
    return dict(f.metadata.get(_SPEC, spec()[_SPEC]))


def _describe(tp: Any, rules: Mapping[str, Any]) -> str:
    if tp is int:
        return "an integer" + (f" >= {rules['minimum']}" if rules["minimum"] is not None else "")
    if tp is str:
        if rules["choices"]:
            return "one of " + ", ".join(rules["choices"])
        return "a non-empty string" if rules["nonempty"] else "a string"
    if dataclasses.is_dataclass(tp):
        return "a JSON object of " + ", ".join(f.name for f in dataclasses.fields(tp) if _rules(f)["in_file"])
    return "a list"


def _at(path: str) -> str:
    return f"{path!r}" if path else "the table"


def _value(tp: Any, rules: Mapping[str, Any], value: Any, where: str, bad: Callable[[str], Exception]) -> Any:
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (typing.Union, types.UnionType) and type(None) in args:
        if value is None:
            return None
        (tp,) = [a for a in args if a is not type(None)]
        origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin is tuple:
        if not isinstance(value, list):
            raise bad(f"{_at(where)} must be a list, got {value!r}")
        items = tuple(_object(args[0], v, f"{where}[{i}]", bad) for i, v in enumerate(value))
        key = rules["sorted_by"]
        if key is not None and list(items) != sorted(items, key=lambda x: getattr(x, key)):
            raise bad(f"{_at(where)} must be sorted by {key}")
        return items
    if dataclasses.is_dataclass(tp):
        return _object(tp, value, where, bad)
    ok = (isinstance(value, int) and not isinstance(value, bool)) if tp is int else isinstance(value, tp)
    if ok and tp is int and rules["minimum"] is not None:
        ok = value >= rules["minimum"]
    if ok and tp is str:
        ok = (not rules["choices"] or value in rules["choices"]) and (not rules["nonempty"] or bool(value))
    if not ok:
        raise bad(f"{_at(where)} must be {_describe(tp, rules)}, got {value!r}")
    return value


def _object(cls: type[T], data: Any, where: str, bad: Callable[[str], Exception]) -> T:
    fields = [f for f in dataclasses.fields(cls) if _rules(f)["in_file"]]  # type: ignore[arg-type]
    if not isinstance(data, dict):
        raise bad(f"{_at(where)} must be {_describe(cls, {})}, got {data!r}")
    unknown = sorted(set(data) - {f.name for f in fields})
    if unknown:
        raise bad(f"{_at(where)} has keys it does not take: {', '.join(map(repr, unknown))} "
                  f"(it takes {', '.join(f.name for f in fields)})")
    hints = typing.get_type_hints(cls)
    kwargs: dict[str, Any] = {}
    for f in fields:
        rules = _rules(f)
        if f.name not in data:
            if rules["absent"] is not FROM_FILE:
                kwargs[f.name] = rules["absent"]
            elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                raise bad(f"{_at(where)} has no {f.name!r}: it must be {_describe(hints[f.name], rules)}")
            continue
        kwargs[f.name] = _value(hints[f.name], rules, data[f.name], f"{where}.{f.name}" if where else f.name, bad)
    return cls(**kwargs)


def load(cls: type[T], data: Any, bad: Callable[[str], Exception], path: str = "") -> T:
    """``data`` (parsed JSON) as a ``cls``, checked; ``path``: where it is in the file (``rmsnorm``;
    empty: the whole table)."""
    return _object(cls, data, path, bad)
