"""A job whose prolog a slurmd restart lost, on a real lab: Slurm leaves it in Prolog, the guard requeues it.

With ``PrologFlags=Alloc`` slurmctld sends the prolog's launch to the job's nodes once, at the allocation,
and starts the batch script when every node has said the prolog ended. Soak seed 12 (CI) allocated trainer
job 4 on gpu1 140 ms before the soak killed gpu1's slurmd: the restarted slurmd never heard of the job, and
it registered within BatchStartTimeout + MessageTimeout of the allocation, too early for slurmctld's "missing
from node" purge (docs/admin-guard.md has the source lines), so the job stayed RUNNING with reason Prolog on
a responding gpu1 for the 3.5 minutes left. Here the same moment is made deterministic:
the node's prolog is slow (it waits while a file exists, as a site's prolog mounting a file system may),
and the node's slurmd is killed while it runs; the orphaned prolog then ends, unreported.

Two plain jobs (no autoheal comment) are caught so at once, as in the soak (CI seed 12 again, stop 34: a plain
`sbatch` job, stranded past the soak's bound while the rule looked at autoheal's jobs only): the requeueable
one is requeued, its comment kept; the one submitted with --no-requeue is reported, and left as it is.

(A slurmd stopped before the launch arrives is not the same: slurmctld sees that launch fail and requeues
the job itself, NODE_FAIL-style: measured on this lab, restart count 1 before the new slurmd answered.)
"""

from __future__ import annotations

import os
import signal
import subprocess
import time

from helpers import cancel_job, wait_for

from autoheal.journal import Journal

#: gpu3: a requeueable plain job (the soak's case); gpu2: one its user said never to requeue
NODE, KEPT = "gpu3", "gpu2"
#: The bound the lab's guard is restarted with once Slurm has shown it leaves the jobs alone (the site default,
#: 60 s, with a look every 15 s, would make this file wait over a minute for nothing): the guard looks every
#: quarter of it (2 s), so it acts within 10 s of its first sighting.
LOST_PROLOG_AFTER = 8
#: That bound after the first sighting, up to one look late, one pass, and slack for a loaded machine.
GUARD_BOUND = 90


def _in_prolog(job) -> bool:
    return job.state in ("RUNNING", "CONFIGURING") and job.state_reason == "Prolog"


def _slow_prolog(lab):
    """The lab's prolog, waiting first while ``prolog-hold-<its node>`` exists in the lab's root (the
    original text, to put back)."""
    path = lab.root / "hooks" / "prolog.sh"
    text = path.read_text()
    head, sep, tail = text.rpartition("\nexec ")
    assert sep, text
    path.write_text(f'{head}\nwhile [ -e "{lab.root}/prolog-hold-$SLURMD_NODENAME" ]; do sleep 0.2; done{sep}{tail}')
    return path, text


def _prolog_running(job_id: str) -> bool:
    from autoheal_lab import procs

    for entry in os.listdir("/proc"):
        if entry.isdigit() and any("prolog.sh" in a for a in (procs.proc_cmdline(int(entry)) or [])):
            try:
                env = open(f"/proc/{entry}/environ", "rb").read().split(b"\0")
            except OSError:
                continue
            if f"SLURM_JOB_ID={job_id}".encode() in env:
                return True
    return False


def _diagnosis(lab, slurm, job: str) -> str:
    log = lab.root / "log" / "guard.log"
    tail = log.read_text().splitlines()[-20:] if log.exists() else ["(no guard.log)"]
    node = slurm.get_node(NODE)
    show = subprocess.run(["scontrol", "-o", "show", "job", job], env=lab.slurm_env(), capture_output=True,
                          text=True, timeout=20).stdout
    return ("guard.log tail:\n" + "\n".join(tail) + f"\n{NODE} slurmd_start_time={node.slurmd_start_time} "
            f"listed={slurm.get_job(job)}\nscontrol -o show job: {show[:1500]}")


def _submit(healing_lab, node: str, *args: str) -> str:
    res = subprocess.run(["sbatch", "--parsable", "-N1", "-w", node, "-o", "/dev/null", *args, "--wrap",
                          "sleep 300"], env=healing_lab.env, capture_output=True, text=True, timeout=20, cwd="/tmp")
    assert res.returncode == 0, res.stderr
    return res.stdout.strip().split(";")[0]


def _crash_slurmd(lab, node: str) -> None:
    from autoheal_lab import procs

    rec = lab.records()[f"slurmd-{node}"]
    os.kill(rec.pid, signal.SIGKILL)  # a crash while the prolog runs
    procs._reap(rec.pid)
    lab.start_slurmd(node)


def test_the_guard_requeues_a_plain_job_whose_prolog_a_slurmd_crash_lost(healing_lab):
    lab = healing_lab.lab
    slurm = healing_lab.adapter()
    guard_argv = list(lab.records()["guard"].argv)
    holds = [lab.root / f"prolog-hold-{n}" for n in (NODE, KEPT)]
    for hold in holds:
        hold.touch()
    path, original = _slow_prolog(lab)
    job = kept = ""
    try:
        job = _submit(healing_lab, NODE, "--requeue", "--comment", "lr sweep 3 of 8")
        kept = _submit(healing_lab, KEPT, "--no-requeue")
        for j in (job, kept):
            wait_for(lambda j=j: _in_prolog(slurm.get_job(j)), 30, f"job {j} allocated, waiting for its prolog")
            wait_for(lambda j=j: _prolog_running(j), 30, f"job {j}'s prolog running")
        # Slurm keeps whole seconds: a slurmd back in the allocation's own second is ambiguous, and the guard
        # waits five bounds for it (test_guard_prolog); this test is about the plain case, a later second
        allocated = max(slurm.job_start_time(j) or 0 for j in (job, kept))
        assert allocated > 0
        time.sleep(max(0.0, allocated + 1.05 - time.time()))
        for node in (NODE, KEPT):
            _crash_slurmd(lab, node)
    finally:
        for hold in holds:
            hold.unlink()  # the orphaned prologs end now: nobody tells slurmctld
        path.write_text(original)
    try:
        for node in (NODE, KEPT):
            wait_for(lambda node=node: slurm.get_node(node).responding, 60, f"{node}'s new slurmd to answer")
        first = slurm.get_job(job)
        assert _in_prolog(first) and first.restart_count == 0, first  # Slurm by itself does not move it
        print(f"lost prolog lab: job {job} listed as {first.state} ({first.state_reason})")
        # the same guard with a short bound (`autoheal guard --lost-prolog-after`); its sightings start now
        lab.start_controller_daemon("guard", [*guard_argv, "--lost-prolog-after", str(LOST_PROLOG_AFTER)])
        log_path = lab.root / "log" / "guard.log"
        try:
            requeued = wait_for(lambda: (lambda j: j if j.restart_count >= 1 else None)(slurm.get_job(job)),
                                GUARD_BOUND, "the guard's requeue of the job its prolog never released")
            wait_for(lambda: f"job {kept}: stranded, its prolog lost" in log_path.read_text(), GUARD_BOUND,
                     "the guard's report of the job it may not requeue")
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n{_diagnosis(lab, slurm, job)}") from None
        assert requeued.comment == "lr sweep 3 of 8"  # a plain job's comment: kept
        log = log_path.read_text()
        assert f"job {job}: requeued, its prolog lost" in log, log[-2000:]
        assert "lost-prolog rule on" in log  # the lab's PrologFlags=Alloc, read from the running slurmctld
        # the --no-requeue job: reported, never touched (a person ends it)
        left = slurm.get_job(kept)
        assert _in_prolog(left) and left.restart_count == 0, left
        stranded = list(Journal(healing_lab.config().journal.path).read(events=["guard-stranded"], job=kept))
        assert len(stranded) == 1 and stranded[0].severity == "error", stranded
        # the requeued job's new prolog comes from the new slurmd: its batch script starts
        wait_for(lambda: (lambda j: j.running and j.state_reason != "Prolog")(slurm.get_job(job)), 90,
                 "the job to run after its requeue")
        # what the guard judged by: the StartTime real `scontrol show job` gives (22.05's listing lacks it)
        started = slurm.job_start_time(job)
        assert started is not None and abs(started - time.time()) < 300, started
    finally:
        lab.start_controller_daemon("guard", guard_argv)  # the session lab's guard as it was, for the next tests
        for j in (job, kept):
            cancel_job(healing_lab.env, j)
