"""``autoheal guard`` on a real lab: a job autoheal requeued is scheduled as soon as it is eligible again.

After a requeue Slurm makes the job wait ``cred_expire`` + 1 s (EligibleTime), and then only looks at it
at its next scheduling pass: on a quiet cluster the next backfill cycle, up to ``bf_interval`` later
(measured on the lab: requeue -> running 26 s). The lab's guard rewrites the job's ExcNodeList with the
same list once EligibleTime has passed, which makes slurmctld schedule at once (11 s). These tests check
the wiring against real Slurm: EligibleTime read from squeue, the nudge done once, only for jobs autoheal
requeued, nothing about the job changed."""

from __future__ import annotations

import datetime
import subprocess

from helpers import cancel_job, wait_for

# How soon after EligibleTime a job Slurm starts on its own counts as "before the guard could have acted":
# the lab's guard polls every second, and one pass (squeue + sinfo + scontrol update) takes about a second
# on an idle lab machine; under CI load, several.
GUARD_REACH = 8


def _sbatch(lab, *args):
    res = subprocess.run(["sbatch", "--parsable", "-N1", "--requeue", "-o", "/dev/null", *args, "--wrap",
                          "sleep 300"], env=lab.env, capture_output=True, text=True, timeout=20, cwd="/tmp")
    assert res.returncode == 0, res.stderr
    return res.stdout.strip().split(";")[0]


def _guard_lines(lab, job):
    log = lab.layout.root / "log" / "guard.log"
    text = log.read_text() if log.exists() else ""
    return [line for line in text.splitlines() if f"job {job}: eligible again" in line]


def _start_time(lab, job) -> float:
    res = subprocess.run(["squeue", "-h", "-j", job, "-o", "%S"], env=lab.env, capture_output=True, text=True,
                         timeout=20)
    return datetime.datetime.fromisoformat(res.stdout.strip()).timestamp()  # local time, as squeue prints


def _diagnosis(lab, job) -> str:
    log = lab.layout.root / "log" / "guard.log"
    tail = log.read_text().splitlines()[-15:] if log.exists() else ["(no guard.log)"]
    show = subprocess.run(["scontrol", "show", "job", job], env=lab.env, capture_output=True, text=True,
                          timeout=20).stdout
    return "guard.log tail:\n" + "\n".join(tail) + "\nscontrol show job:\n" + show


def test_guard_schedules_a_requeued_autoheal_job_once_it_is_eligible(plain_lab):
    slurm = plain_lab.adapter()
    ours = _sbatch(plain_lab, "--comment", "autoheal: requeued after xid 79 on GPU 3 of gpu2",
                   "--exclude", "spare1")
    theirs = _sbatch(plain_lab, "--comment", "my own experiment")
    try:
        for job in (ours, theirs):
            wait_for(lambda job=job: slurm.get_job(job).running, 30, f"job {job} to run")
        for job in (ours, theirs):
            slurm.requeue(job)
        pending = wait_for(lambda: (lambda j: j if j.state == "PENDING" else None)(slurm.get_job(ours)), 30,
                           "the requeue")
        assert pending.restart_count == 1 and pending.eligible_time  # read from real squeue JSON
        # Either the guard nudges the job, or something else made slurmctld schedule right at EligibleTime
        # (a node's epilog finishing late under load, another update) and the job started before the guard
        # could act: then its update finds the job running and rightly says nothing.
        try:
            outcome = wait_for(lambda: "nudged" if _guard_lines(plain_lab, ours) else
                               "started" if slurm.get_job(ours).running else None, 60,
                               "the guard's nudge once the job is eligible")
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n{_diagnosis(plain_lab, ours)}") from None
        print(f"guard lab: job {ours} {outcome}")
        if outcome == "started":
            late = _start_time(plain_lab, ours) - pending.eligible_time
            assert late <= GUARD_REACH, (f"job started {late:.0f}s after EligibleTime and the guard never nudged "
                                         f"it\n{_diagnosis(plain_lab, ours)}")
        wait_for(lambda: slurm.get_job(ours).running, 60, "the job to run again")
        job = slurm.get_job(ours)
        assert job.excluded_nodes == ("spare1",) and job.comment.startswith("autoheal: requeued after xid 79")
        wait_for(lambda: slurm.get_job(theirs).running, 90, "the other job to run again (Slurm's own pace)")
        assert len(_guard_lines(plain_lab, ours)) in ((1,) if outcome == "nudged" else (0, 1))  # once per requeue
        assert _guard_lines(plain_lab, theirs) == []  # not a job autoheal requeued: not ours to touch
    finally:
        cancel_job(plain_lab.env, ours)
        cancel_job(plain_lab.env, theirs)
