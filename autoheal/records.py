"""``record``: a dataclass whose ``__init__``, ``__repr__``, ``__eq__`` (and, frozen, ``__setattr__``,
``__delattr__``, ``__hash__``) are shared functions instead of code generated and compiled per class.

``dataclasses.dataclass`` writes those methods as source text and ``exec``s it, once per method and class,
at import: for the config's 10 sections (``HooksSection`` and ``SyncSection`` have 60-70 fields each) and
the hooks' own records that was 20 ms of a healthcheck's 30 ms in autoheal's modules on a loaded lab
node (issue 24 section 6), paid by every hook process. A ``record`` is still a dataclass for everything
that reads one (``dataclasses.fields``, ``asdict``, ``replace``, ``is_dataclass``) and for mypy (which
sees ``dataclasses.dataclass`` itself); its methods behave as the generated ones: positional or keyword
arguments, defaults and default factories, ``__post_init__``, ``compare=False`` and ``repr=False``
fields, ``FrozenInstanceError``, a recursive repr printed as ``...``. Anything else a dataclass can be
asked for (``order``, ``slots``, ``kw_only``, ``InitVar``, ``init=False`` fields, ``unsafe_hash``, a field's
``hash=``), a base class that is a dataclass (inherited fields, frozen-ness rules) and a class with its own
``__setattr__`` (which a generated ``__init__`` runs) get a plain dataclass.

``cast`` is ``typing.cast`` for mypy and a no-op at run time, for the hot-path modules that keep typing out.
"""

from __future__ import annotations

import dataclasses

TYPE_CHECKING = False  # typing is for mypy only: not imported at run time (the hooks start fast)
if TYPE_CHECKING:
    from dataclasses import dataclass as record
    from typing import cast
else:
    import _thread  # built in: the recursive-repr guard without importing reprlib

    def cast(_type, value):
        """``typing.cast`` without importing typing."""
        return value

    _SIMPLE = {"init", "repr", "eq", "frozen"}

    def record(cls=None, /, **options):
        """``@record`` / ``@record(frozen=True)``: see the module docstring."""
        if cls is None:
            return lambda c: record(c, **options)
        if not _simple(cls, options):
            return dataclasses.dataclass(cls, **options)
        own = set(cls.__dict__)  # methods the class writes itself are kept, as a dataclass keeps them
        explicit_hash = "__hash__" in own and not (cls.__dict__["__hash__"] is None and "__eq__" in own)
        cls = dataclasses.dataclass(cls, init=False, repr=False, eq=False)
        params = cls.__dataclass_params__  # what the class does, for anything that asks (not what was generated)
        params.init = params.repr = params.eq = True
        params.frozen = bool(options.get("frozen"))
        fields = dataclasses.fields(cls)
        cls.__record_fields__ = fields
        cls.__record_compare__ = tuple(f.name for f in fields if f.compare)
        cls.__record_repr__ = tuple(f.name for f in fields if f.repr)
        methods = {"__init__": _init, "__repr__": _repr, "__eq__": _eq}
        if options.get("frozen"):
            methods.update(__setattr__=_frozen_setattr, __delattr__=_frozen_delattr)
        for name, fn in methods.items():
            if name not in own:
                setattr(cls, name, fn)
        if not explicit_hash:  # a dataclass with eq: hashable by its fields when frozen, else not at all
            cls.__hash__ = _hash if options.get("frozen") else None
        return cls

    def _simple(cls, options):
        """Only what the shared methods do: the options init/repr/eq (true) and frozen; fields that are
        all __init__ arguments, none keyword-only, none with ``hash=`` set; no InitVar or KW_ONLY; no base
        class that is a dataclass (its fields and frozen-ness would need the dataclass's own rules) and no
        ``__setattr__`` of the class's own (a generated ``__init__`` assigns through it)."""
        if set(options) - {"init", "repr", "eq", "frozen"} or not all(options.get(k, True)
                                                                       for k in ("init", "repr", "eq")):
            return False
        if any("__dataclass_fields__" in base.__dict__ for base in cls.__mro__[1:]):
            return False
        if cls.__setattr__ is not object.__setattr__:
            return False
        for value in cls.__dict__.values():
            if isinstance(value, dataclasses.Field) and (not value.init or value.hash is not None
                                                         or getattr(value, "kw_only", False) is True):
                return False
        notes = getattr(cls, "__annotations__", {})  # a base's too, when the class has none: cautious
        return not any("InitVar" in str(a) or "KW_ONLY" in str(a) for a in notes.values())

    _MISSING = dataclasses.MISSING

    def _init(self, *args, **kwargs):
        cls = type(self)
        fields = cls.__record_fields__
        if len(args) > len(fields):
            raise TypeError(f"{cls.__qualname__}.__init__() takes {len(fields) + 1} positional arguments but "
                            f"{len(args) + 1} were given")
        put = object.__setattr__
        for i, f in enumerate(fields):
            if i < len(args):
                if f.name in kwargs:
                    raise TypeError(f"{cls.__qualname__}.__init__() got multiple values for argument '{f.name}'")
                value = args[i]
            elif f.name in kwargs:
                value = kwargs.pop(f.name)
            elif f.default is not _MISSING:
                value = f.default
            elif f.default_factory is not _MISSING:
                value = f.default_factory()
            else:
                raise TypeError(f"{cls.__qualname__}.__init__() missing 1 required positional argument: "
                                f"'{f.name}'")
            put(self, f.name, value)
        if kwargs:
            raise TypeError(f"{cls.__qualname__}.__init__() got an unexpected keyword argument "
                            f"'{next(iter(kwargs))}'")
        post = getattr(self, "__post_init__", None)
        if post is not None:
            post()

    _IN_REPR = set()

    def _repr(self):
        key = (id(self), _thread.get_ident())  # as reprlib.recursive_repr (the generated __repr__ has it)
        if key in _IN_REPR:
            return "..."
        _IN_REPR.add(key)
        try:
            cls = type(self)
            inner = ", ".join(f"{name}={getattr(self, name)!r}" for name in cls.__record_repr__)
            return f"{cls.__qualname__}({inner})"
        finally:
            _IN_REPR.discard(key)

    def _values(self):
        return tuple(getattr(self, name) for name in type(self).__record_compare__)

    def _eq(self, other):
        if other.__class__ is self.__class__:
            return _values(self) == _values(other)
        return NotImplemented

    def _hash(self):
        return hash(_values(self))

    def _frozen_setattr(self, name, value):
        raise dataclasses.FrozenInstanceError(f"cannot assign to field '{name}'")

    def _frozen_delattr(self, name):
        raise dataclasses.FrozenInstanceError(f"cannot delete field '{name}'")


__all__ = ["cast", "record"]
