"""Signal names: the one parser for every setting and option that names a signal.

Whatever spelling a user gives (``USR2``, ``SIGUSR2``, ``usr2``, `` SigUsr2 ``, ``12``) becomes one
canonical name without the ``SIG`` prefix (``"USR2"``), the form Slurm prints and accepts in
``--signal=B:USR2@90`` and ``scancel --signal=USR2``. Anything else is refused with a ``ValueError``
(:class:`SignalNameError`) whose message names the value, so a config loader can prefix the key.

Only the signals Slurm's own parser knows by name are accepted (``sig_name2num`` in Slurm's
``src/common/proc_args.c``, unchanged from 20.11 to 24.11): a name Slurm rejects would make every
``sbatch --signal`` or ``scancel --signal`` fail, so it can never work as a grace signal.
"""

from __future__ import annotations

import signal as _signal

#: The names Slurm maps to signal numbers, in its own order.
SLURM_SIGNALS = ("HUP", "INT", "QUIT", "ABRT", "KILL", "ALRM", "TERM", "USR1", "USR2", "URG", "CONT", "STOP",
                 "TSTP", "TTIN", "TTOU", "XCPU")
#: Signals a process cannot catch: a job told to checkpoint with one of these dies instead.
UNCATCHABLE = ("KILL", "STOP")

TYPE_CHECKING = False  # typing is for mypy only: not imported at run time (the hooks start fast)
if TYPE_CHECKING:
    from typing import Union

    SignalLike = Union[str, int, _signal.Signals]


class SignalNameError(ValueError):
    """The value is not a signal name Slurm knows (or cannot be caught where that is required)."""


def _show(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "...'"


def signal_name(value: SignalLike, *, catchable: bool = False) -> str:
    """``"USR2"``, ``"SIGUSR2"``, ``"usr2"``, ``"12"``, ``12`` or ``signal.SIGUSR2`` -> ``"USR2"``.

    Numbers are this machine's numbering (as ``kill -l``), turned into the name. With ``catchable``,
    KILL and STOP are refused: a grace signal must give the job a chance to checkpoint.
    """
    if isinstance(value, _signal.Signals):
        name = value.name[3:] if value.name.startswith("SIG") else value.name
    elif isinstance(value, int) and not isinstance(value, bool):
        name = _name_of_number(value, value)
    elif isinstance(value, str):
        text = value.strip().upper()
        if text.isascii() and text.isdigit():
            name = _name_of_number(int(text), value)
        else:
            name = text[3:] if text.startswith("SIG") else text
    else:
        raise SignalNameError(f"{_show(value)} is not a signal name")
    if name not in SLURM_SIGNALS:
        hint = " (give only the name: no B: scope, no @seconds)" if isinstance(value, str) and (
            ":" in value or "@" in value) else ""
        raise SignalNameError(f"{_show(value)} is not a signal name{hint}; use one of {', '.join(SLURM_SIGNALS)}")
    if catchable and name in UNCATCHABLE:
        raise SignalNameError(f"{_show(value)}: SIG{name} cannot be caught, so the job could never checkpoint; "
                              "use e.g. USR2 or TERM")
    return name


def to_signal(value: SignalLike, *, catchable: bool = False) -> _signal.Signals:
    """The ``signal.Signals`` member for ``value`` (parsed like :func:`signal_name`)."""
    return _signal.Signals["SIG" + signal_name(value, catchable=catchable)]


def _name_of_number(number: int, original: object) -> str:
    try:
        name = _signal.Signals(number).name
    except ValueError:
        raise SignalNameError(f"{_show(original)} is not a signal number on this machine") from None
    return name[3:] if name.startswith("SIG") else name
