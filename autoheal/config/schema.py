"""Turning TOML tables into typed, documented dataclasses, and back.

Every config section is a dataclass whose fields carry a docstring (``doc``) and validation rules in
their metadata: allowed values (``choices``), bounds (``min``/``max``), and ``parse``, a function that
checks (and may normalise) the value, raising ``ValueError`` with a message that names the value
(``item`` does the same for each element of a list or value of a table). ``from_mapping`` validates a
TOML table against such a class; every error is a one-line ``ConfigError`` naming the key path and the
bad value.

Rules for every string, whatever the field: no NUL, no control characters (a path, URL, name or reason
holding one can never work and may smuggle a second line into a Slurm reason, a header or a batch
script), no lone surrogates (they cannot be encoded to reach a file name or Slurm). ``multiline=True``
lets a field (or a list's items) hold tab and newline, e.g. a JSON template written as a TOML
multi-line string.
"""

from __future__ import annotations

import dataclasses

from autoheal.errors import ConfigError
from autoheal.lazyre import LazyPattern

# typing (and math, unicodedata) only where a TOML table is validated: the sections' modules define
# their dataclasses with this module's ``setting`` on every hook's path, a valid snapshot parses nothing
# (autoheal.config.snapshot; issue 24 section 6)
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Callable, Dict, Iterable, Optional

    Parser = Callable[[Any], Any]


def _hints(cls: type) -> Dict[str, Any]:
    """``typing.get_type_hints(cls)``, with typing's names given: the sections import them for mypy
    only (under TYPE_CHECKING), so their modules do not hold them at run time."""
    import typing

    names = {n: getattr(typing, n) for n in ("Any", "Callable", "Dict", "List", "Optional", "Tuple", "Union")}
    return typing.get_type_hints(cls, localns=names)


def setting(default: Any = dataclasses.MISSING, *, doc: str, choices: Optional[Iterable[Any]] = None,
            min: Optional[float] = None, max: Optional[float] = None,
            default_factory: Any = dataclasses.MISSING, parse: Optional[Parser] = None,
            item: Optional[Parser] = None, multiline: bool = False) -> Any:
    """A dataclass field with its docstring and validation rules in metadata."""
    meta = {"doc": doc, "choices": tuple(choices) if choices else None, "min": min, "max": max,
            "parse": parse, "item": item, "multiline": multiline}
    if default_factory is not dataclasses.MISSING:
        return dataclasses.field(default_factory=default_factory, metadata=meta)
    return dataclasses.field(default=default, metadata=meta)


def show(value: Any, limit: int = 60) -> str:
    """``repr`` of a value for an error message: escaped (one line) and cut to ``limit`` characters."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 4] + "...'"


_BARE_KEY = LazyPattern(r"[A-Za-z0-9_-]+")


def key_path(prefix: str, key: Any) -> str:
    """``prefix.key`` for messages, quoting a key that is not a bare TOML key (as TOML would write it), so
    a key holding a dot, a space or a control character cannot garble the message; long keys are cut."""
    text = str(key)
    if not _BARE_KEY.fullmatch(text):
        text = '"' + text.encode("unicode_escape").decode("ascii").replace('"', '\\"') + '"'
    if len(text) > 60:  # only ever shown in messages: a 3000-character key would drown them
        text = text[:50] + "..." + text[-7:]
    return f"{prefix}.{text}" if prefix else text


_ALLOWED_IN_MULTILINE = frozenset("\t\n\r")


def _check_string(key: str, value: str, multiline: bool) -> None:
    import unicodedata

    for ch in value:
        cat = unicodedata.category(ch)
        if cat == "Cs":
            raise ConfigError(f"{key}: {show(value)} holds a lone surrogate {ch!r}, which no file name or "
                              "program can receive")
        if cat == "Cc" and not (multiline and ch in _ALLOWED_IN_MULTILINE):
            raise ConfigError(f"{key}: {show(value)} holds the control character {ch!r}; "
                              "remove it (it can never be part of a working value)")


def _check_value(key: str, value: Any, tp: Any, meta: Dict[str, Any]) -> Any:
    import math
    import typing

    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        if not isinstance(value, dict):
            raise ConfigError(f"{key}: expected a table, got {show(value)}")
        return from_mapping(tp, value, prefix=key)
    if origin is typing.Union:  # Optional[X]
        if value is None:
            return None
        inner = [a for a in args if a is not type(None)]
        return _check_value(key, value, inner[0], meta)
    item_meta = {"parse": meta.get("item"), "multiline": meta.get("multiline", False)}
    if origin in (list, tuple):
        if not isinstance(value, list):
            raise ConfigError(f"{key}: expected a list, got {show(value)}")
        item_type = args[0] if args else typing.Any  # typing's Any: the module's is mypy's only
        value = [_check_value(f"{key}[{i}]", v, item_type, item_meta) for i, v in enumerate(value)]
    elif origin is dict:
        if not isinstance(value, dict):
            raise ConfigError(f"{key}: expected a table, got {show(value)}")
        _kt, vt = args if args else (str, typing.Any)
        out = {}
        for k, v in value.items():
            sub = key_path(key, k)
            _check_string(sub, str(k), multiline=False)
            out[str(k)] = _check_value(sub, v, vt, item_meta)
        value = out
    elif tp is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{key}: expected true or false, got {show(value)}")
    elif tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{key}: expected an integer, got {show(value)}")
    elif tp is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"{key}: expected a number, got {show(value)}")
        try:
            value = float(value)
        except OverflowError:  # an integer with hundreds of digits
            raise ConfigError(f"{key}: expected a finite number, got {show(value)}") from None
        if not math.isfinite(value):
            raise ConfigError(f"{key}: expected a finite number, got {show(value)}")
    elif tp is str:
        if not isinstance(value, str):
            raise ConfigError(f"{key}: expected a string, got {show(value)}")
        _check_string(key, value, multiline=bool(meta.get("multiline")))
    return _check_rules(key, value, meta)


def _check_rules(key: str, value: Any, meta: Dict[str, Any]) -> Any:
    """A value of the right type against the field's own rules: choices, bounds, its parser."""
    if meta.get("choices") and value not in meta["choices"]:
        allowed = ", ".join(repr(c) for c in meta["choices"])
        raise ConfigError(f"{key}: {show(value)} is not allowed; use one of {allowed}")
    if meta.get("min") is not None and value < meta["min"]:
        raise ConfigError(f"{key}: {show(value)} is below the minimum {meta['min']}")
    if meta.get("max") is not None and value > meta["max"]:
        raise ConfigError(f"{key}: {show(value)} is above the maximum {meta['max']}")
    parse = meta.get("parse")
    if parse is not None:
        try:
            value = parse(value)
        except ValueError as exc:  # parsers name the value; we add where it is
            raise ConfigError(f"{key}: {exc}") from None
    return value


def from_mapping(cls: type, data: Dict[Any, Any], prefix: str = "") -> Any:
    """Build ``cls`` from a TOML table, rejecting unknown keys (with a "did you mean") and a setting
    given twice under its two spellings (``max_restarts`` and ``max-restarts``)."""
    hints = _hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    kwargs: dict[str, Any] = {}
    given: dict[str, str] = {}
    for key, value in data.items():
        full = key_path(prefix, key)
        name = str(key).replace("-", "_")
        if name not in fields:
            import difflib  # only for an unknown key: every hook loads the config

            close = difflib.get_close_matches(name, list(fields), n=1)
            hint = f"; did you mean '{key_path(prefix, close[0])}'?" if close else ""
            known = ", ".join(sorted(fields))
            if len(known) > 300:  # a long section: point to the list instead of flooding one line
                known = f"{len(fields)} keys, see `autoheal config show --docs`"
            raise ConfigError(f"unknown key '{full}'{hint} (known here: {known})")
        if name in given:
            raise ConfigError(f"'{given[name]}' and '{full}' are the same setting, set twice; keep one")
        given[name] = full
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
    hints = _hints(cls)
    for f in dataclasses.fields(cls):
        key = f"{prefix}.{f.name}" if prefix else f.name
        tp = hints[f.name]
        if isinstance(tp, type) and dataclasses.is_dataclass(tp):
            out.extend(describe(tp, key))
            continue
        default = f.default if f.default is not dataclasses.MISSING else (
            f.default_factory() if f.default_factory is not dataclasses.MISSING else None)
        out.append((key, f.metadata.get("doc", ""), default))
    return out
