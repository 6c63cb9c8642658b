"""Issue 15: with ``hooks.grace_signal`` set to any allowed value, a plain job (no ``--signal``, no
``autoheal sbatch``) on a node that loses a GPU is requeued and never ends FAILED.

The job is the plainest a researcher writes: a bash batch script whose last line is ``srun python``, with
no signal handler anywhere. Its first run computes for a minute, the XID 79 comes while it does; a later
run (``SLURM_RESTART_COUNT`` > 0) finishes in a second. One lab for the module; for each value only
the node daemons (xid-watch) are restarted with a config naming it.
"""

from __future__ import annotations

import re
import subprocess
import sys
import time

import pytest
from helpers import wait_epilogs_done, wait_for

from autoheal.config.hooks_section import GRACE_SIGNALS
from autoheal_lab import wiring
from autoheal_lab.fakenvml import state as gstate
from autoheal_lab.gpus import inject

GRACE = 3.0
FINAL = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "BOOT_FAIL", "DEADLINE",
         "PREEMPTED")
SCRIPT = """#!/bin/bash
srun {py} -u -c '
import os, time
if int(os.environ.get("SLURM_RESTART_COUNT") or 0) == 0:
    for i in range(120):
        print("step", i, flush=True)
        time.sleep(0.5)
print("done on", os.environ["SLURMD_NODENAME"], flush=True)
'
"""

requeued_jobs = {}  # grace_signal -> job id, checked for completion by the last test


@pytest.fixture(scope="module")
def gslab(tmp_path_factory):
    from conftest import _start

    handle = _start(tmp_path_factory.mktemp("gracelab"), nodes=3, gpus=2, spares=0)
    try:
        yield handle
    finally:
        for jid in requeued_jobs.values():
            subprocess.run(["scancel", jid], env=handle.env, capture_output=True, timeout=20)
        handle.lab.down()


def _job(handle, jid: str) -> dict:
    out = subprocess.run(["scontrol", "-o", "show", "job", jid], env=handle.env, capture_output=True, text=True,
                         timeout=10).stdout
    return dict(re.findall(r"(\w+)=(\S*)", out))


def _use_grace_signal(handle, value: str, tmp_path) -> None:
    """Restart every node's xid-watch with a config whose hooks.grace_signal is ``value``."""
    text = handle.layout.autoheal_conf.read_text()
    text = re.sub(r"(?m)^grace_seconds = .*$", f'grace_seconds = {GRACE}\ngrace_signal = "{value}"', text, count=1)
    assert f'grace_signal = "{value}"' in text
    conf = tmp_path / "autoheal.toml"
    conf.write_text(text)
    logs = {node: handle.root / "log" / f"xid-watch-{node}.log" for node in handle.layout.nodes}
    started = {node: _read(log).count("xid-watch: watching node") for node, log in logs.items()}
    for node in handle.layout.nodes:
        handle.lab.start_node_daemon(f"xid-watch-{node}", node, wiring.xid_watch_argv(node) + ["--config", str(conf)])
    wait_for(lambda: all(_read(log).count("xid-watch: watching node") > started[node] for node, log in logs.items()),
             30, "xid-watch restarted on every node", step=0.2)


def _read(path) -> str:
    return path.read_text(errors="replace") if path.exists() else ""


def _heal(handle, node: str) -> None:
    wait_epilogs_done(handle.env, node)
    for gpu in range(handle.layout.gpus):
        gstate.inject(handle.layout.gpu_state(node), gpu, "clear")
    env = dict(handle.env, **handle.lab.node_env(node))
    subprocess.run([sys.executable, "-m", "autoheal.cli.main", "check", "--clear-faults", "--node", node], env=env,
                   capture_output=True, timeout=30)
    subprocess.run(["scontrol", "update", f"nodename={node}", "state=resume"], env=handle.env, capture_output=True,
                   timeout=10)
    wait_for(lambda: "DRAIN" not in _node_state(handle, node), 30, f"{node} resumed")


def _node_state(handle, node: str) -> str:
    out = subprocess.run(["scontrol", "-o", "show", "node", node], env=handle.env, capture_output=True, text=True,
                         timeout=10).stdout
    m = re.search(r"State=(\S+)", out)
    return m.group(1) if m else ""


@pytest.mark.parametrize("grace_signal", GRACE_SIGNALS)
def test_plain_job_under_a_fault_is_requeued_never_failed(gslab, grace_signal, tmp_path):
    handle = gslab
    _use_grace_signal(handle, grace_signal, tmp_path)
    script = tmp_path / "plain.sbatch"
    script.write_text(SCRIPT.format(py=sys.executable))
    out = tmp_path / "job.out"
    res = subprocess.run(["sbatch", "--parsable", "-J", f"plain-{grace_signal}", "-o", str(out), "--open-mode=append",
                          str(script)], env=handle.env, capture_output=True, text=True, timeout=30, cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    jid = res.stdout.strip().split(";")[0]
    wait_for(lambda: out.exists() and "step 0" in out.read_text(), 60, f"job {jid} computing", step=0.2)
    node = _job(handle, jid)["NodeList"]
    try:
        inject(handle.lab, node, 1, "xid", xid=79)
        # requeued (Restarts counts it) within the grace; a step that died of the signal may have ended
        # the job first (FAILED for a moment): xid-watch then requeues the ended job
        deadline, job = time.monotonic() + GRACE + 30, {}
        while time.monotonic() < deadline:
            job = _job(handle, jid)
            if int(job.get("Restarts") or 0) >= 1:
                break
            time.sleep(0.2)
    finally:
        _heal(handle, node)
    assert int(job.get("Restarts") or 0) >= 1, (f"grace_signal={grace_signal}: not requeued: {job.get('JobState')} "
                                                f"exit {job.get('ExitCode')}\n{out.read_text()[-2000:]}")
    requeued_jobs[grace_signal] = jid


def test_every_requeued_plain_job_completes_elsewhere(gslab):
    """The runs after the requeue (one per grace_signal above) finish COMPLETED, not FAILED."""
    handle = gslab
    if not requeued_jobs:
        pytest.skip("no job of the tests above was requeued")
    states = {}
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        states = {sig: _job(handle, jid) for sig, jid in requeued_jobs.items()}
        if all(j.get("JobState") in FINAL for j in states.values()):
            break
        time.sleep(1)
    bad = {sig: (j.get("JobState"), j.get("Restarts"), j.get("ExitCode")) for sig, j in states.items()
           if j.get("JobState") != "COMPLETED" or int(j.get("Restarts") or 0) < 1}
    assert not bad, bad
