"""Notice the grace signal Slurm (or the autoheal wrapper) sends before a job is stopped.

Handlers only set a flag and call the registered callbacks; a training loop checks
:func:`preempt_requested` at each step boundary, saves a checkpoint and exits::

    on_preempt()
    for step in ...:
        train_one_step()
        if preempt_requested():
            save(); sys.exit(99)

SIGTERM is handled as well by default: preemption without ``send_user_signal`` sends only SIGTERM
(and Slurm sends SIGTERM before SIGKILL on cancel, requeue and time limit).
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from types import FrameType
from typing import Any, Callable, Dict, Iterable, List, Mapping, Optional, Tuple, Union

log = logging.getLogger(__name__)

SignalLike = Union[int, str, signal.Signals]
Callback = Callable[[int], object]  # called with the signal number; what it returns is ignored
#: What ``signal.signal`` takes and ``signal.getsignal`` returns: a Python handler, SIG_DFL/SIG_IGN, or None.
SignalHandler = Union[Callable[[int, Optional[FrameType]], Any], int, None]

ENV_GRACE_SIGNAL = "AUTOHEAL_GRACE_SIGNAL"
DEFAULT_GRACE_SIGNAL = signal.SIGUSR2


def parse_signal(value: SignalLike) -> signal.Signals:
    """``"USR2"``, ``"SIGUSR2"``, ``"B:USR2"``, ``"USR2@90"``, ``"12"`` or 12 -> ``signal.SIGUSR2``."""
    if isinstance(value, signal.Signals):
        return value
    if isinstance(value, int) and not isinstance(value, bool):
        return signal.Signals(value)
    if not isinstance(value, str):
        raise ValueError(f"not a signal: {value!r}")
    text = value.strip().upper()
    if ":" in text:  # sbatch --signal syntax: [{R|B}:]SIG[@secs]
        text = text.split(":", 1)[1]
    text = text.split("@", 1)[0].strip()
    if text.isdigit():
        return signal.Signals(int(text))
    if not text.startswith("SIG"):
        text = "SIG" + text
    try:
        return signal.Signals[text]
    except KeyError:
        raise ValueError(f"unknown signal name {value!r}") from None


def signal_name(sig: SignalLike) -> str:
    """``signal.SIGUSR2`` -> ``"USR2"``."""
    name = parse_signal(sig).name
    return name[3:] if name.startswith("SIG") else name


def default_signals(environ: Optional[Mapping[str, str]] = None) -> Tuple[signal.Signals, ...]:
    """The grace signal from ``AUTOHEAL_GRACE_SIGNAL`` (default USR2), plus SIGTERM."""
    env = os.environ if environ is None else environ
    grace = DEFAULT_GRACE_SIGNAL
    raw = env.get(ENV_GRACE_SIGNAL, "").strip()
    if raw:
        try:
            grace = parse_signal(raw)
        except ValueError:
            log.warning("%s=%r is not a signal name; using %s", ENV_GRACE_SIGNAL, raw, signal_name(grace))
    if grace in (signal.SIGKILL, signal.SIGSTOP):
        log.warning("%s=%r cannot be caught; using %s", ENV_GRACE_SIGNAL, raw, signal_name(DEFAULT_GRACE_SIGNAL))
        grace = DEFAULT_GRACE_SIGNAL
    return (grace,) if grace == signal.SIGTERM else (grace, signal.SIGTERM)


PREEMPT_SIGNALS: Tuple[signal.Signals, ...] = default_signals()


class _State:
    def __init__(self) -> None:
        self.flag = threading.Event()
        self.signum: Optional[int] = None
        self.when: Optional[float] = None
        self.callbacks: List[Callback] = []
        self.previous: Dict[int, SignalHandler] = {}  # signum -> handler that was installed before ours


_state = _State()


def _handler(signum: int, frame: Optional[FrameType]) -> None:
    _state.signum = signum
    _state.when = time.time()
    _state.flag.set()
    for cb in list(_state.callbacks):
        try:
            cb(signum)
        except Exception:  # an exception here would surface at a random point in the training loop
            log.exception("preempt callback %r failed", cb)
    prev = _state.previous.get(signum)
    if callable(prev) and prev is not _handler:
        prev(signum, frame)


def on_preempt(
    callback: Optional[Callback] = None, signals: Optional[Iterable[SignalLike]] = None
) -> Tuple[signal.Signals, ...]:
    """Install the preemption handler for ``signals`` (default :data:`PREEMPT_SIGNALS`).

    ``callback(signum)``, if given, runs inside the handler: keep it tiny (set a flag, note the time);
    do the checkpoint at the next step boundary instead. Python-level handlers installed before are
    chained (called after ours); the default action and SIG_IGN are replaced. Calling it again adds
    the callback and signals without chaining to itself. Must be called from the main thread
    (RuntimeError otherwise). Returns the signals handled.
    """
    if threading.current_thread() is not threading.main_thread():
        raise RuntimeError("on_preempt() must be called from the main thread (Python delivers signals there)")
    sigs = tuple(dict.fromkeys(parse_signal(s) for s in (PREEMPT_SIGNALS if signals is None else signals)))
    for sig in sigs:
        if sig in (signal.SIGKILL, signal.SIGSTOP):
            raise ValueError(f"{signal_name(sig)} cannot be caught")
    if callback is not None and callback not in _state.callbacks:
        _state.callbacks.append(callback)
    for sig in sigs:
        current = signal.getsignal(sig)
        if current is _handler:
            continue
        _state.previous[int(sig)] = current
        signal.signal(sig, _handler)
    return sigs


def uninstall() -> None:
    """Restore the handlers that were in place before :func:`on_preempt`, drop callbacks, clear the flag."""
    for signum, prev in list(_state.previous.items()):
        if signal.getsignal(signum) is _handler:
            signal.signal(signum, prev if prev is not None else signal.SIG_DFL)
    _state.previous.clear()
    _state.callbacks.clear()
    clear()


def preempt_requested() -> bool:
    """True once a preemption signal arrived (until :func:`clear`)."""
    return _state.flag.is_set()


def received_signal() -> Optional[signal.Signals]:
    """The last preemption signal received, or None."""
    return None if _state.signum is None else signal.Signals(_state.signum)


def received_at() -> Optional[float]:
    """Wall-clock time the last preemption signal arrived, or None."""
    return _state.when


def clear() -> None:
    """Forget a received signal (e.g. after the checkpoint when the job continues)."""
    _state.flag.clear()
    _state.signum = None
    _state.when = None
