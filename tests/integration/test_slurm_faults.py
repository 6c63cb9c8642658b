"""Faults the Slurm adapter must turn into typed errors within bounded time: never a hang, never a drain."""

from __future__ import annotations

import os
import signal
import time

import pytest
from helpers import wait_for

from autoheal import nodeops
from autoheal.errors import SlurmError, SlurmUnavailable
from autoheal.slurm.cli_backend import CliSlurm
from autoheal_lab import procs


def test_scontrol_missing_is_a_clear_error(tmp_path):
    empty = tmp_path / "bin"
    empty.mkdir()
    slurm = CliSlurm(bin_dir=str(empty), env={"PATH": str(empty)})
    import autoheal.slurm.binaries as binaries

    old = binaries.FALLBACK_DIRS
    binaries.FALLBACK_DIRS = (str(empty),)
    try:
        with pytest.raises(SlurmError, match="scontrol not found.*slurm.bin_dir"):
            slurm.list_nodes()
    finally:
        binaries.FALLBACK_DIRS = old


def test_hung_then_dead_slurmctld(lab_factory):
    handle = lab_factory(nodes=1, gpus=1, spares=0)
    ctld = handle.lab.records()["slurmctld"]
    slurm = handle.adapter(timeout=1.5, retries=1)
    slurm.version()  # cached: version needs no controller
    # A hung controller (stopped, not dead): every call must give up within the budget.
    os.kill(ctld.pid, signal.SIGSTOP)
    try:
        start = time.monotonic()
        with pytest.raises(SlurmUnavailable):
            slurm.list_nodes()
        assert time.monotonic() - start < 1.5 * 2 + 2.5  # two attempts plus one backoff
        with pytest.raises(SlurmUnavailable):
            nodeops.drain(slurm, "gpu1", "must not happen")
    finally:
        os.kill(ctld.pid, signal.SIGCONT)
    assert slurm.get_node("gpu1").drain is False  # nothing was drained while it hung
    # A dead controller: connection refused, typed error, quickly.
    handle.lab.records()  # still recorded
    os.kill(ctld.pid, signal.SIGKILL)
    # gone (its listening socket closed with it), not "0.3 s later"
    wait_for(lambda: not procs.is_alive(ctld), 10, "slurmctld to die")
    with pytest.raises(SlurmUnavailable):
        slurm.get_node("gpu1")
    assert slurm.ping() is False
