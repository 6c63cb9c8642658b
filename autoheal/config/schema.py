"""Turning TOML tables into typed, documented dataclasses, and back.

Every config section is a dataclass whose fields carry a docstring (``doc``) and optional allowed
values (``choices``) or bounds (``min``/``max``) in their metadata. ``from_mapping`` validates a TOML
table against such a class and names the key, the bad value and what is allowed in its error.
"""

from __future__ import annotations

import dataclasses
import difflib
import typing
from typing import Any

from autoheal.errors import ConfigError


def setting(default: Any = dataclasses.MISSING, *, doc: str, choices=None, min=None, max=None,
            default_factory: Any = dataclasses.MISSING):
    """A dataclass field with its docstring and validation rules in metadata."""
    meta = {"doc": doc, "choices": tuple(choices) if choices else None, "min": min, "max": max}
    if default_factory is not dataclasses.MISSING:
        return dataclasses.field(default_factory=default_factory, metadata=meta)
    return dataclasses.field(default=default, metadata=meta)


def _type_name(tp: Any) -> str:
    return getattr(tp, "__name__", str(tp).replace("typing.", ""))


def _check_value(key: str, value: Any, tp: Any, meta: dict) -> Any:
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if dataclasses.is_dataclass(tp):
        if not isinstance(value, dict):
            raise ConfigError(f"{key}: expected a table, got {value!r}")
        return from_mapping(tp, value, prefix=key)
    if origin is typing.Union:  # Optional[X]
        if value is None:
            return None
        inner = [a for a in args if a is not type(None)]
        return _check_value(key, value, inner[0], meta)
    if origin in (list, tuple):
        if not isinstance(value, list):
            raise ConfigError(f"{key}: expected a list, got {value!r}")
        return [_check_value(f"{key}[{i}]", v, args[0] if args else Any, {}) for i, v in enumerate(value)]
    if origin is dict:
        if not isinstance(value, dict):
            raise ConfigError(f"{key}: expected a table, got {value!r}")
        kt, vt = args if args else (str, Any)
        return {str(k): _check_value(f"{key}.{k}", v, vt, {}) for k, v in value.items()}
    if tp is Any:
        return value
    if tp is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{key}: expected true or false, got {value!r}")
    elif tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{key}: expected an integer, got {value!r}")
    elif tp is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"{key}: expected a number, got {value!r}")
        value = float(value)
        if value != value or value in (float("inf"), float("-inf")):
            raise ConfigError(f"{key}: expected a finite number, got {value!r}")
    elif tp is str:
        if not isinstance(value, str):
            raise ConfigError(f"{key}: expected a string, got {value!r}")
    if meta.get("choices") and value not in meta["choices"]:
        allowed = ", ".join(repr(c) for c in meta["choices"])
        raise ConfigError(f"{key}: {value!r} is not allowed; use one of {allowed}")
    if meta.get("min") is not None and value < meta["min"]:
        raise ConfigError(f"{key}: {value!r} is below the minimum {meta['min']}")
    if meta.get("max") is not None and value > meta["max"]:
        raise ConfigError(f"{key}: {value!r} is above the maximum {meta['max']}")
    return value


def from_mapping(cls: type, data: dict, prefix: str = "") -> Any:
    """Build ``cls`` from a TOML table, rejecting unknown keys (with a "did you mean")."""
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    kwargs = {}
    for key, value in data.items():
        full = f"{prefix}.{key}" if prefix else key
        name = key.replace("-", "_")
        if name not in fields:
            close = difflib.get_close_matches(name, list(fields), n=1)
            hint = f"; did you mean {(prefix + '.' if prefix else '') + close[0]!r}?" if close else ""
            known = ", ".join(sorted(fields))
            raise ConfigError(f"unknown key {full!r}{hint} (known here: {known})")
        kwargs[name] = _check_value(full, value, hints[name], dict(fields[name].metadata))
    try:
        obj = cls(**kwargs)
    except TypeError as exc:  # a required field without default
        raise ConfigError(f"{prefix or 'config'}: {exc}") from None
    check = getattr(obj, "validate", None)
    if check is not None:
        check()
    return obj


def to_mapping(obj: Any) -> Any:
    """The dataclass tree as plain dicts/lists (for ``config show --json``)."""
    if dataclasses.is_dataclass(obj):
        return {f.name: to_mapping(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, (list, tuple)):
        return [to_mapping(v) for v in obj]
    if isinstance(obj, dict):
        return {k: to_mapping(v) for k, v in obj.items()}
    return obj


def describe(cls: type, prefix: str = "") -> list[tuple[str, str, Any]]:
    """(key, doc, default) for every setting, depth first: the source of ``config show --docs``."""
    out = []
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        key = f"{prefix}.{f.name}" if prefix else f.name
        tp = hints[f.name]
        if dataclasses.is_dataclass(tp):
            out.extend(describe(tp, key))
            continue
        default = f.default if f.default is not dataclasses.MISSING else (
            f.default_factory() if f.default_factory is not dataclasses.MISSING else None)
        out.append((key, f.metadata.get("doc", ""), default))
    return out
