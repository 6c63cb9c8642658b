"""Faults that used to break the node side, on a real lab (issue 16 findings 2, 3, 11; issue 17 item 3):
slurmctld killed or stopped at the fault, the healthcheck draining first, a state dir that is
read-only or full under the prolog, a fault that comes back after a repair; xid-watch's health poll
(a fault without an XID drains within seconds, a thermal blip does not)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest
from helpers import (
    cancel_all_jobs,
    cancel_job,
    node_state,
    wait_epilogs_done,
    wait_for,
    wait_node_idle,
    wait_xid_watch_looked_again,
)

from autoheal.hooks.jobside import Stage
from autoheal_lab import procs, wiring
from autoheal_lab.gpus import inject


def sh(handle, *argv, timeout=15):
    return subprocess.run(list(argv), env=handle.env, capture_output=True, text=True, timeout=timeout)


def node_line(handle, node):
    return sh(handle, "scontrol", "-o", "show", "node", node).stdout


def job_fields(handle, job):
    text = sh(handle, "scontrol", "-o", "show", "job", job).stdout
    return dict(tok.split("=", 1) for tok in text.split() if "=" in tok)


def restarts(handle, job):
    return int(job_fields(handle, job).get("Restarts") or 0)


def journal(handle):
    path = handle.layout.root / "journal" / "journal.jsonl"
    out = []
    for line in (path.read_text().splitlines() if path.exists() else []):
        try:
            out.append(json.loads(line))
        except ValueError:
            pass
    return out


def submit(handle, node, *args, script=None):
    argv = ["sbatch", "--parsable", "-N1", "-w", node, "--gres=gpu:1", "--requeue", "-o", "/dev/null", *args]
    argv += [str(script)] if script else ["--wrap", "sleep 600"]
    out = sh(handle, *argv)
    job = out.stdout.strip().split(";")[0]
    assert job.isdigit(), out.stderr
    wait_for(lambda: job_fields(handle, job).get("JobState") == "RUNNING", 30, f"job {job} to run")
    # the prolog runs while the job already shows RUNNING; it writes the DCGM mapping last
    mapping = handle.layout.root / "dcgm" / node
    try:
        wait_for(lambda: any(job in f.read_text().split() for f in mapping.glob("*")) if mapping.is_dir()
                 else False, 60, f"the prolog of job {job} to finish")
    except AssertionError as exc:  # say why: the job's state, the node's, the node's own log
        log = handle.layout.root / "log" / f"slurmd-{node}.log"
        tail = log.read_text().splitlines()[-15:] if log.exists() else []
        raise AssertionError(f"{exc}\njob: {sh(handle, 'scontrol', '-o', 'show', 'job', job).stdout.strip()}"
                             f"\nnode: {node_line(handle, node).strip()}\njournal: {journal(handle)[-3:]}"
                             f"\nslurmd log:\n" + "\n".join(tail)) from None
    return job


def run_hook(handle, node, module="autoheal.hooks.healthcheck"):
    env = dict(handle.env, **handle.lab.node_env(node), SLURMD_NODENAME=node)
    return subprocess.run([sys.executable, "-m", module], env=env, capture_output=True, text=True, timeout=60)


def slurm_errors(handle, node):
    """How many of xid-watch's looks at Slurm failed on ``node`` (its node state's counter; each failure
    backs off before the next try)."""
    return int((node_state(handle.layout.root, node).get("counters") or {}).get("slurm_errors_total", 0))


def requeues_by_xid_watch(handle, job):
    return [r for r in journal(handle) if r["event"] == "requeue" and r["source"] == "xid-watch"
            and job in r["job_ids"]]


# ---- slurmctld killed / stopped at the moment of the fault -------------------------------------------

def test_controller_killed_or_stopped_at_the_fault_jobs_are_still_moved(lab_factory, tmp_path):
    """Finding 2b: xid-watch used to log an error and give up; the job stayed RUNNING on a node with a
    lost GPU. Now the drain stays pending and the job side follows once slurmctld answers."""
    handle = lab_factory(nodes=2, gpus=2, spares=0, hooks=True, xid_watch=True)
    lab = handle.lab

    # 1. kill -9 at the fault, slurmctld back ~10 s later: a plain job (TERM: requeued at once)
    plain = submit(handle, "gpu1")
    # slurmctld saves job state asynchronously: killed before it saved the allocation, it would recover
    # the job as PENDING and kill the "unknown" running batch step itself (Slurm, not us, would lose it)
    saved = handle.layout.root / "state" / "job_state"
    started = time.time()
    wait_for(lambda: saved.stat().st_mtime > started, 60, "slurmctld to save the running job", step=0.5)
    ctld = lab.records()["slurmctld"]
    errors = slurm_errors(handle, "gpu1")
    procs.kill_pid(ctld.pid)
    inject(lab, "gpu1", 1, "xid", xid=79)
    wait_for(lambda: any(r["source"] == "xid-watch" and r["event"] == "detection" and r["node"] == "gpu1"
                         for r in journal(handle)), 15, "xid-watch to see the XID")
    # slurmctld stays down until xid-watch, keeping the drain pending, has tried again after its backoff
    wait_for(lambda: slurm_errors(handle, "gpu1") >= errors + 2, 30, "xid-watch to retry against the dead slurmctld")
    lab._start_slurmctld(lab.layout())
    # XID 79 starts at the replace rung: the first drain says so (the sync acts on it at once)
    wait_for(lambda: "Reason=autoheal: replace: xid 79 on GPU 1 of gpu1" in node_line(handle, "gpu1"), 60,
             "gpu1 drained once slurmctld is back")
    wait_for(lambda: restarts(handle, plain) >= 1, 60, "the plain job to be requeued")
    assert "Comment=autoheal: requeued after xid 79 on GPU 1 of gpu1" in sh(handle, "scontrol", "show", "job",
                                                                            plain).stdout
    waits = [r for r in journal(handle) if r["source"] == "xid-watch" and r["event"] == "error"
             and r.get("outcome") == "waiting for slurmctld"]
    assert len(waits) == 1, waits
    cancel_job(handle.env, plain)

    # 2. SIGSTOP at the fault, SIGCONT later: an `autoheal sbatch`-like job that traps the runner signal
    # but does not requeue itself gets the signal once, then a requeue after the grace (10 s in the lab)
    marks = tmp_path / "signals.txt"
    script = tmp_path / "runner.sh"
    script.write_text(f"#!/bin/bash\ntrap 'echo USR2 >> {marks}' USR2\nwhile true; do sleep 1; done\n")
    script.chmod(0o755)
    # state=running: what the real runner writes once its signal handlers are set (xid-watch signals
    # only then: a USR2 before them would kill the batch shell)
    runner = submit(handle, "gpu2", "--comment=autoheal-runner restarts=0 state=running", script=script)
    ctld = lab.records()["slurmctld"]
    errors = slurm_errors(handle, "gpu2")
    os.kill(ctld.pid, signal.SIGSTOP)
    try:
        inject(lab, "gpu2", 0, "xid", xid=48)
        wait_for(lambda: any(r["source"] == "xid-watch" and r["event"] == "detection" and r["node"] == "gpu2"
                             for r in journal(handle)), 30, "xid-watch to see the XID")
        # frozen until xid-watch's calls have timed out twice (its retry after the backoff too)
        wait_for(lambda: slurm_errors(handle, "gpu2") >= errors + 2, 60,
                 "xid-watch to retry against the stopped slurmctld")
    finally:
        os.kill(ctld.pid, signal.SIGCONT)
    wait_for(lambda: "Reason=autoheal: xid 48 on GPU 0 of gpu2" in node_line(handle, "gpu2"), 60,
             "gpu2 drained once slurmctld runs again")
    wait_for(lambda: marks.exists() and "USR2" in marks.read_text(), 60, "the runner signal")
    wait_for(lambda: restarts(handle, runner) >= 1, 60, "the requeue after the grace")
    assert marks.read_text().split() == ["USR2"]  # exactly once
    assert len(requeues_by_xid_watch(handle, runner)) == 1
    cancel_job(handle.env, runner)


# ---- the healthcheck drained first --------------------------------------------------------------------

@pytest.fixture
def lab(healing_lab):
    cancel_all_jobs(healing_lab.env)  # the session's healing lab is shared: start from no jobs
    return healing_lab


def heal(handle, node):
    from autoheal_lab.fakenvml import state as gstate

    wait_epilogs_done(handle.env, node)
    for gpu in range(handle.layout.gpus):
        gstate.inject(handle.layout.gpu_state(node), gpu, "clear")
    env = dict(handle.env, **handle.lab.node_env(node))
    subprocess.run([sys.executable, "-m", "autoheal.cli.main", "check", "--clear-faults", "--node", node], env=env,
                   capture_output=True, timeout=30)
    line = node_line(handle, node)
    if "DRAIN" in line or "DOWN" in line:
        sh(handle, "scontrol", "update", f"nodename={node}", "state=resume")
    run_hook(handle, node)
    wait_node_idle(handle.env, node, 60)


def test_healthcheck_drains_first_and_the_job_is_still_requeued(lab):
    """Finding 2a: the healthcheck drained first and marked the XID seen; xid-watch skipped it and the
    job ran on a lost GPU. The job side no longer depends on who saw the fault first."""
    node = "gpu2"
    rec = lab.lab.records()[f"xid-watch-{node}"]
    procs.stop(rec)  # xid-watch is not looking: the healthcheck sees the XID first
    job = submit(lab, node)
    try:
        inject(lab.lab, node, 3, "xid", xid=79)
        res = run_hook(lab, node)
        assert res.returncode == 1, res.stderr
        assert "Reason=autoheal: replace: xid 79 on GPU 3 of gpu2" in node_line(lab, node)
        assert job_fields(lab, job).get("JobState") == "RUNNING"  # the healthcheck does not move jobs
        lab.lab.start_node_daemon(f"xid-watch-{node}", node, wiring.xid_watch_argv(node))
        wait_for(lambda: restarts(lab, job) >= 1, 60, "xid-watch to requeue the job")
        # xid-watch journals its requeue once slurmctld has answered it, a moment after the restart count
        # went up (a CI run under load looked in between)
        first = wait_for(lambda: requeues_by_xid_watch(lab, job), 15, "xid-watch's requeue record")
        # no second requeue: only once xid-watch has looked again (a job-side step after its record), with
        # nothing of this job's left open in its state, is "one record" an answer and not a slow daemon
        wait_xid_watch_looked_again(lab.layout.root, node, float(first[0]["time"]))
        left = {k: a for k, a in (node_state(lab.layout.root, node).get("job_actions") or {}).items()
                if a.get("job") == job and a.get("stage") != Stage.DONE}
        assert not left, left
        assert len(requeues_by_xid_watch(lab, job)) == 1
    finally:
        if not procs.is_alive(lab.lab.records()[f"xid-watch-{node}"]):
            lab.lab.start_node_daemon(f"xid-watch-{node}", node, wiring.xid_watch_argv(node))
        cancel_job(lab.env, job)
        heal(lab, node)


# ---- a state dir that is read-only or full never fails the prolog ---------------------------------------

def _mount(kind, path):
    # a full disk keeps the files it has: carry the node state (the kernel-log cursor above all) over into
    # the small tmpfs, or the prolog re-reads the whole kernel log and judges the XIDs earlier tests injected
    saved = {p.name: p.read_bytes() for p in path.iterdir() if p.is_file()} if kind == "full" else {}
    if kind == "read-only":
        argv = [["mount", "--bind", str(path), str(path)], ["mount", "-o", "remount,bind,ro", str(path)]]
    else:
        argv = [["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(path)]]
    for a in argv:
        res = subprocess.run(a, capture_output=True, text=True, timeout=10)
        if res.returncode != 0:
            subprocess.run(["umount", str(path)], capture_output=True, timeout=10)
            pytest.skip(f"cannot {' '.join(a)} here: {res.stderr.strip()}")
    if kind == "full":
        for name, data in saved.items():
            (path / name).write_bytes(data)
        try:
            with open(path / "filler", "wb") as fh:
                while True:
                    fh.write(b"\0" * 4096)
                    fh.flush()
        except OSError:
            pass  # ENOSPC: full, as wanted


@pytest.mark.parametrize("kind", ["read-only", "full"])
def test_prolog_with_an_unusable_state_dir_lets_the_job_run(lab, kind):
    """Finding 3: with the state dir read-only or full the prolog crashed (exit 1), Slurm drained the node
    "Prolog error" (a reason autoheal never resumes) and requeued the job."""
    node = "gpu1"
    state_dir = lab.layout.root / "nodestate" / node
    state_dir.mkdir(parents=True, exist_ok=True)
    before = len(journal(lab))
    job = None
    try:
        _mount(kind, state_dir)
        job = submit(lab, node)  # waits for RUNNING: the prolog let it start
        line = node_line(lab, node)
        assert "DRAIN" not in line and "Prolog error" not in line, line
        wait_for(lambda: [r for r in journal(lab)[before:] if r["source"] == "prolog"
                          and r.get("action") == "hook-trouble"], 15, "the prolog's journal record")
        ran = len(journal(lab))
        cancel_job(lab.env, job)
        wait_for(lambda: job_fields(lab, job).get("JobState") in ("CANCELLED", ""), 30, "the job to end")
        # the epilog runs as the job ends: its own record of the unusable state dir says it ran (and
        # came this far), and once no job is COMPLETING Slurm has its exit code
        wait_for(lambda: [r for r in journal(lab)[ran:] if r["source"] == "epilog"
                          and r.get("action") == "hook-trouble"], 30, "the epilog's journal record")
        wait_epilogs_done(lab.env, node)
        assert "DRAIN" not in node_line(lab, node), node_line(lab, node)
        assert [p for p in os.listdir(state_dir) if p.endswith(".tmp")] == []
    finally:
        if job:
            cancel_job(lab.env, job)
        subprocess.run(["umount", str(state_dir)], capture_output=True, timeout=10)
        if os.path.ismount(state_dir):
            subprocess.run(["umount", "-l", str(state_dir)], capture_output=True, timeout=10)
    wait_for(lambda: "State=IDLE " in node_line(lab, node), 60, f"{node} idle again")


# ---- a fault that returns after a repair --------------------------------------------------------------

def test_xid_back_after_a_repair_is_caught_by_xid_watch_and_escalates(lab):
    """Finding 11 / issue 17 item 3: the 120 s dedupe survived the repair, the returning XID was ignored
    by xid-watch and the node stayed in service until the next health check."""
    node, gpu = "gpu3", 2
    try:
        inject(lab.lab, node, gpu, "xid", xid=48)
        wait_for(lambda: "Reason=autoheal: xid 48 on GPU 2 of gpu3" in node_line(lab, node), 15,
                 "xid-watch to drain gpu3")
        res = run_hook(lab, node)  # drained and idle: the reset rung
        assert res.returncode == 1, res.stderr

        def resumed():
            run_hook(lab, node)  # 2 passes and the lab's 5 s cooldown
            return "DRAIN" not in node_line(lab, node)

        wait_for(resumed, 40, "the repaired node to be resumed", step=1.0)
        before = len(journal(lab))
        inject(lab.lab, node, gpu, "xid", xid=48)  # well inside the 120 s dedupe window of the first
        wait_for(lambda: "DRAIN" in node_line(lab, node), 15, "the returning fault to drain gpu3 again")

        def detections():
            return [r for r in journal(lab)[before:] if r["source"] == "xid-watch" and r["event"] == "detection"
                    and r["node"] == node]

        # xid-watch drains first and journals after (a slow journal must never delay a drain)
        det = wait_for(detections, 15, "xid-watch's detection record")
        new = journal(lab)[before:]
        assert "back after a repair" in det[0]["message"], new
        assert [r for r in new if r["source"] == "xid-watch" and r["event"] == "drain"], new
        # the fault came back after a reset: the next repair is one rung up, a reboot
        run_hook(lab, node)
        steps = [r for r in journal(lab)[before:] if r["event"] == "remediation-step" and r["node"] == node]
        assert [r["action"] for r in steps] == ["reboot-node"], steps
        wait_for(lambda: "State=IDLE " in node_line(lab, node) and "REBOOT" not in node_line(lab, node)
                 and "DRAIN" not in node_line(lab, node), 60, "the lab's reboot to finish")
        # issue 17 item 3: the fault back right after the reboot is xid-watch's at once, not the next
        # health check's (and the ladder now asks for a replacement)
        before = len(journal(lab))
        inject(lab.lab, node, gpu, "xid", xid=48)
        wait_for(lambda: "DRAIN" in node_line(lab, node), 15, "the fault back after the reboot to drain gpu3")
        new = journal(lab)[before:]
        assert [r for r in new if r["source"] == "xid-watch" and r["event"] == "drain"], new
        run_hook(lab, node)
        wait_for(lambda: "Reason=autoheal: replace: " in node_line(lab, node), 15, "a replacement request")
    finally:
        heal(lab, node)


# ---- xid-watch's health poll: a fault without an XID drains within seconds ------------------------------

def _healthcheck_held(handle, node):
    """Hold the node's health-pass lock: Slurm's periodic HealthCheckProgram (every 30 s in the lab) waits
    for it, so whatever drains meanwhile is xid-watch's, whenever the healthcheck's turn falls."""
    from autoheal.hooks import state as S

    return S.NodeState(str(handle.layout.root / "nodestate" / node)).pass_lock(5.0)


def test_polled_fault_drains_at_once_moves_the_job_and_the_healthcheck_climbs_on(lab):
    """A double-bit ECC count whose XID 48 never came (no NVML event, no kernel-log line: the lab's
    ``ecc-dbe`` logs one, which xid-watch's XID path would drain for): xid-watch's health poll drains the
    node with the healthcheck's own reason while the healthcheck cannot run, the job is requeued as after
    an XID drain, and the next healthcheck finds our drain and runs the reset rung, with one detection
    record for the fault."""
    from autoheal_lab.fakenvml import state as gstate

    node, gpu = "gpu1", 4
    job = submit(lab, node)
    before = len(journal(lab))
    try:
        with _healthcheck_held(lab, node):
            with gstate.update_state(lab.layout.gpu_state(node)) as st:
                st.gpus[gpu].ecc_volatile_uncorrected += 1
                st.gpus[gpu].ecc_aggregate_uncorrected += 1
            wait_for(lambda: f"Reason=autoheal: ecc: GPU {gpu} of {node} " in node_line(lab, node), 20,
                     "xid-watch's health poll to drain the node")
        # the drain is journalled right after Slurm took it (a run read the journal in between)
        drains = wait_for(lambda: [r for r in journal(lab)[before:] if r["node"] == node and r["event"] == "drain"],
                          10, "the drain record")
        assert [r["source"] for r in drains] == ["xid-watch"] and drains[0]["check"] == "ecc", drains
        wait_for(lambda: restarts(lab, job) >= 1, 30, "xid-watch to requeue the job")
        wait_for(lambda: requeues_by_xid_watch(lab, job), 15, "xid-watch's requeue record")
        cancel_job(lab.env, job)  # the requeued job must not hold the node the ladder waits for
        wait_epilogs_done(lab.env, node)
        run_hook(lab, node)  # drained and idle: the reset rung (or Slurm's periodic run just did it)
        new = [r for r in journal(lab)[before:] if r["node"] == node]
        steps = [r for r in new if r["event"] == "remediation-step"]
        assert [r["action"] for r in steps] == ["reset-gpu"], new
        assert gstate.read_state(lab.layout.gpu_state(node)).gpus[gpu].ecc_volatile_uncorrected == 0
        # one detection of the fault by the node daemons (the epilog's record of the job it ended on that
        # GPU, action epilog-fail, is the job's, as after an XID drain)
        assert len([r for r in new if r["event"] == "detection" and r["source"] in ("xid-watch", "healthcheck")
                    and r.get("check") == "ecc"]) == 1, new
        assert len([r for r in new if r["event"] == "drain"]) == 1, new
    finally:
        cancel_job(lab.env, job)
        heal(lab, node)


def _health_polls(handle, node):
    """(health polls done, when the last one began) from xid-watch's textfile: (0, 0.0) before it has one."""
    path = handle.layout.root / "metrics" / node / "autoheal_xid_watch.prom"
    got = {}
    try:
        for line in path.read_text().splitlines():
            if line and not line.startswith("#"):
                key, _, value = line.rpartition(" ")
                got[key.split("{", 1)[0]] = float(value)
    except OSError:
        pass
    return (int(got.get("autoheal_xid_watch_health_polls_total", 0)),
            got.get("autoheal_xid_watch_health_poll_started_timestamp_seconds", 0.0))


def _polls_started_after(handle, node, t):
    """The poll count once the textfile shows a poll that began after ``t`` (None before)."""
    count, started = _health_polls(handle, node)
    return count if started > t else None


def test_thermal_blip_is_left_to_the_healthcheck(lab):
    """Over two polls of 92 C with HW thermal slowdown, cooled down before the next healthcheck: xid-watch
    neither drains nor journals (thermal is not a hard fault for its poll)."""
    node, gpu = "gpu2", 6
    before = len(journal(lab))
    try:
        with _healthcheck_held(lab, node):
            inject(lab.lab, node, gpu, "thermal")
            hot = time.time()
            # two whole polls read the GPU hot (xid-watch's textfile counts them), then it cools down
            first = wait_for(lambda: _polls_started_after(lab, node, hot), 60, "a health poll after the injection")
            wait_for(lambda: _health_polls(lab, node)[0] >= first + 2, 60, "two health polls of the hot GPU")
            inject(lab.lab, node, gpu, "clear")
            cooled = time.time()
            wait_for(lambda: _polls_started_after(lab, node, cooled), 60, "a health poll of the cooled GPU")
            assert "DRAIN" not in node_line(lab, node)
        assert not [r for r in journal(lab)[before:] if r["node"] == node and r["source"] == "xid-watch"]
    finally:
        heal(lab, node)
