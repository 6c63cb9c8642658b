"""Preemption signal helpers: flag, callbacks, chaining, env-selected grace signal."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time

import pytest

from autoheal.sbatch_helpers import preempt


@pytest.fixture(autouse=True)
def restore_handlers():
    saved = {s: signal.getsignal(s) for s in (signal.SIGUSR1, signal.SIGUSR2, signal.SIGTERM)}
    yield
    preempt.uninstall()
    for s, h in saved.items():
        signal.signal(s, h)


def send(sig: signal.Signals) -> None:
    os.kill(os.getpid(), sig)
    deadline = time.monotonic() + 2
    while not preempt.preempt_requested() and time.monotonic() < deadline:
        time.sleep(0.001)  # the handler runs in the main thread at the next bytecode boundary


@pytest.mark.parametrize(
    "text, expected",
    [
        ("USR2", signal.SIGUSR2),
        ("SIGUSR1", signal.SIGUSR1),
        ("usr1", signal.SIGUSR1),
        ("B:USR2@90", signal.SIGUSR2),
        ("R:TERM", signal.SIGTERM),
        (" 15 ", signal.SIGTERM),
        (int(signal.SIGUSR2), signal.SIGUSR2),
        (signal.SIGINT, signal.SIGINT),
    ],
)
def test_parse_signal(text, expected):
    assert preempt.parse_signal(text) == expected


@pytest.mark.parametrize("bad", ["NOPE", "", "B:", 1.5, None])
def test_parse_signal_rejects(bad):
    with pytest.raises(ValueError):
        preempt.parse_signal(bad)


def test_signal_name():
    assert preempt.signal_name(signal.SIGUSR2) == "USR2"
    assert preempt.signal_name("SIGTERM") == "TERM"


@pytest.mark.parametrize(
    "env, expected",
    [
        ({}, (signal.SIGUSR2, signal.SIGTERM)),
        ({"AUTOHEAL_GRACE_SIGNAL": "USR1"}, (signal.SIGUSR1, signal.SIGTERM)),
        ({"AUTOHEAL_GRACE_SIGNAL": "B:SIGUSR1@120"}, (signal.SIGUSR1, signal.SIGTERM)),
        ({"AUTOHEAL_GRACE_SIGNAL": "TERM"}, (signal.SIGTERM,)),
        ({"AUTOHEAL_GRACE_SIGNAL": "bogus"}, (signal.SIGUSR2, signal.SIGTERM)),
        ({"AUTOHEAL_GRACE_SIGNAL": "KILL"}, (signal.SIGUSR2, signal.SIGTERM)),
        ({"AUTOHEAL_GRACE_SIGNAL": "  "}, (signal.SIGUSR2, signal.SIGTERM)),
    ],
)
def test_default_signals_from_env(env, expected):
    assert preempt.default_signals(env) == expected


def test_module_default_reads_env_at_import():
    code = "from autoheal.sbatch_helpers import preempt; print([s.name for s in preempt.PREEMPT_SIGNALS])"
    env = dict(os.environ, AUTOHEAL_GRACE_SIGNAL="USR1")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "['SIGUSR1', 'SIGTERM']"


def test_flag_and_callback_on_usr2():
    seen = []
    assert preempt.on_preempt(seen.append) == (signal.SIGUSR2, signal.SIGTERM)
    assert not preempt.preempt_requested()
    assert preempt.received_signal() is None
    send(signal.SIGUSR2)
    assert preempt.preempt_requested()
    assert preempt.received_signal() == signal.SIGUSR2
    assert preempt.received_at() is not None
    assert seen == [signal.SIGUSR2]
    preempt.clear()
    assert not preempt.preempt_requested() and preempt.received_signal() is None


def test_sigterm_sets_flag_instead_of_killing():
    preempt.on_preempt()
    send(signal.SIGTERM)  # without the handler this would end the test run
    assert preempt.preempt_requested()
    assert preempt.received_signal() == signal.SIGTERM


def test_custom_signals_only():
    preempt.on_preempt(signals=["USR1"])
    assert signal.getsignal(signal.SIGUSR2) is not preempt._handler
    send(signal.SIGUSR1)
    assert preempt.received_signal() == signal.SIGUSR1


def test_previous_handler_is_chained_once_and_restored():
    calls = []

    def previous(signum, frame):
        calls.append(signum)

    signal.signal(signal.SIGUSR2, previous)
    preempt.on_preempt(signals=[signal.SIGUSR2])
    preempt.on_preempt(signals=[signal.SIGUSR2])  # second install must not chain to itself
    send(signal.SIGUSR2)
    assert preempt.preempt_requested()
    assert calls == [signal.SIGUSR2]
    preempt.uninstall()
    assert signal.getsignal(signal.SIGUSR2) is previous
    assert not preempt.preempt_requested()


def test_several_callbacks_and_a_failing_one():
    seen = []

    def bad(signum):
        raise RuntimeError("callback bug")

    preempt.on_preempt(bad)
    preempt.on_preempt(seen.append)
    preempt.on_preempt(seen.append)  # same callback registered once
    send(signal.SIGUSR2)  # the RuntimeError must not surface here
    assert seen == [signal.SIGUSR2]


def test_main_thread_only_and_uncatchable():
    errors = []

    def run():
        try:
            preempt.on_preempt()
        except RuntimeError as exc:
            errors.append(exc)

    t = threading.Thread(target=run)
    t.start()
    t.join()
    assert errors and "main thread" in str(errors[0])
    with pytest.raises(ValueError):
        preempt.on_preempt(signals=["KILL"])
