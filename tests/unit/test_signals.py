"""The one signal-name parser: every spelling to one canonical name, everything else refused."""

from __future__ import annotations

import signal

import pytest
from hypothesis import given
from hypothesis import strategies as st

from autoheal.signals import SLURM_SIGNALS, SignalNameError, signal_name, to_signal


@pytest.mark.parametrize("value", ["USR2", "SIGUSR2", "usr2", "sigusr2", " SigUsr2 ", "\tUSR2\n",
                                   str(int(signal.SIGUSR2)), int(signal.SIGUSR2), signal.SIGUSR2])
def test_spellings_of_usr2_become_one_name(value):
    assert signal_name(value) == "USR2"
    assert to_signal(value) is signal.SIGUSR2


@pytest.mark.parametrize("name", SLURM_SIGNALS)
def test_every_slurm_name_round_trips_through_this_machine(name):
    assert signal_name(name) == name
    assert signal_name(to_signal(name)) == name
    assert signal_name("SIG" + name.lower()) == name


@pytest.mark.parametrize("value", ["USR2; rm -rf /", "FOO", "", "SIG", "SIGSIGUSR2", "US R2", "USR2\x00",
                                   "B:USR2@90", "USR2@90", "CHLD", "SEGV", "RTMIN", "0", "-12", "99999",
                                   "１２", "usr\u0662", 0, 999, True, None, 12.0, ["USR2"]])  # noqa: RUF001
def test_non_signals_are_refused_naming_the_value(value):
    with pytest.raises(SignalNameError) as err:
        signal_name(value)
    msg = str(err.value)
    assert repr(value)[:20] in msg
    assert "\n" not in msg
    assert isinstance(err.value, ValueError)  # callers that only know ValueError still catch it


def test_scope_and_grace_get_a_hint():
    with pytest.raises(SignalNameError, match="no B: scope, no @seconds"):
        signal_name("B:USR2@90")


def test_unknown_name_lists_the_allowed_ones():
    with pytest.raises(SignalNameError, match="use one of HUP, INT, .*USR2"):
        signal_name("FOO")


@pytest.mark.parametrize("value", ["KILL", "SIGSTOP", signal.SIGKILL, int(signal.SIGSTOP)])
def test_uncatchable_refused_when_a_checkpoint_is_needed(value):
    assert signal_name(value) in ("KILL", "STOP")  # fine to send
    with pytest.raises(SignalNameError, match="cannot be caught"):
        signal_name(value, catchable=True)


def test_long_hostile_value_is_shortened_in_the_message():
    with pytest.raises(SignalNameError) as err:
        signal_name("X" * 10000)
    assert len(str(err.value)) < 300


@given(st.text(max_size=20))
def test_any_text_is_a_slurm_name_or_refused(text):
    try:
        name = signal_name(text)
    except SignalNameError:
        return
    assert name in SLURM_SIGNALS
