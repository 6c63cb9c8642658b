"""A short seeded soak on the real lab (issue 12): 15 faults against the whole loop, zero violations.

The workload is the soak's default: 2 trainers, a hot-spare trainer (``--spare-nodes 1``), a submitit
``Checkpointable`` job (the real submitit: it must be installed, as in CI's test extras), an array, a
plain job and short jobs.

The seed is fixed (12, the issue's number; not picked to pass) so a failure replays exactly with
``autoheal lab soak --seed 12 --faults 15 --gap 2.5-4.5 --settle 75 --include ...`` (the kinds of ``CI_KINDS``).
The schedule draws every kind once before any repeats, so the 15 faults are these 15 kinds, one each, in
a seeded order with seeded targets and overlaps. They are one per repair path (replace, reset,
requeue-only, warn-only, NVML-polled, reboot, transient, flapping, each daemon kill, an API outage,
each kind of person). ``LEFT_OUT`` are left out only for the 3-minute budget, each because a kind in the
list takes the same path; none is left out to hide a failure. bench/bench_soak.py runs every kind.

With 75 s to settle, a node drained (or rebooting) after a fault younger than the loop's recovery bound
(two healthchecks, ``resume_after_passes`` more, the cool-down: 140 s in the lab) may still be on its way
back at the end;
it is reported as recovering, not checked for invariant 8 (the bench's 150 s settle after longer runs
checks more of them). Every other invariant covers all 15 faults.
"""

from __future__ import annotations

import json

import pytest

from autoheal_lab.cluster import Lab, LabError
from autoheal_lab.soak import Soak, SoakOptions, plot, render
from autoheal_lab.soak_plan import KINDS

SEED = 12
FAULTS = 15
CI_KINDS = ["xid79", "xid48", "xid94", "xid63", "ecc-dbe", "gpu-lost", "thermal", "flapping", "kill-slurmd",
            "kill-slurmctld", "kill-xid-watch", "api-5xx", "admin-drain", "kubectl-cordon", "user-hold"]
#: kind -> the kind of CI_KINDS that takes the same path
LEFT_OUT = {"xid64": "xid79 (replace)", "xid74": "xid48 (reset)", "xid95": "xid48 (reset)",
            "remap-failure": "ecc-dbe (NVML-polled, replace)", "nvlink-down": "thermal (transient, cleared by hand)",
            "pcie-degraded": "thermal (transient, cleared by hand)", "kill-sync": "kill-xid-watch (daemon restart)",
            "api-429": "api-5xx (API window)", "api-slow": "api-5xx (API window)",
            "user-cancel": "user-hold (a user's own job state)", "time-limit": "user-hold (a user's own job state)",
            # issue 22's catalog kinds: the same paths, their XIDs drawn from NVIDIA's buckets
            "xid-reset": "xid48 (reset)", "xid-ignore": "xid63 (no drain)",
            "xid-app": "xid63 (no drain; the job's record, tests/unit/test_xid_jobs.py)",
            "job-storm": "xid63 (no drain on any node; a soak of the catalog kinds: docs/xid-policy.md)",
            "bad-repair": "xid48 (reset, then the lemon rung: tests/integration/test_lemon_lab.py; "
                          "judged by the soak's lemon-cycling invariant in longer runs)"}


@pytest.fixture(scope="module")
def soak_report(tmp_path_factory):
    lab_dir = tmp_path_factory.mktemp("soak") / "lab"
    runner = Soak(Lab(lab_dir), SoakOptions(seed=SEED, faults=FAULTS, gap=(2.5, 4.5), settle=75.0,
                                            include=CI_KINDS))
    report = runner.run()
    return lab_dir, report


def test_short_soak_has_no_violation(soak_report):
    _lab_dir, report = soak_report
    assert report.ok, render(report)


def test_soak_report_counts_every_fault_and_measures_recovery(soak_report):
    lab_dir, report = soak_report
    assert sum(c["injected"] for c in report.counts.values()) == len(report.injected) == FAULTS, report.notes
    assert sorted(report.counts) == sorted(CI_KINDS)  # every-kind-once: 15 faults, 15 kinds
    assert sorted(CI_KINDS + list(LEFT_OUT)) == sorted(KINDS)  # a new kind must be placed in one or the other
    assert report.recovery["fault_to_drain_s"]["n"] >= 1
    trainers = {j: v for j, v in report.jobs.items() if v["role"] in ("trainer", "hotspare", "submitit")}
    # the hot-spare trainer and the submitit job ran with the rest of the workload, and finished
    assert sorted(v["role"] for j, v in trainers.items() if "_" not in j) == \
        ["hotspare", "submitit", "trainer", "trainer"], report.jobs  # (the array's tasks are trainers too)
    unfinished = {j: v for j, v in trainers.items() if v["state"] != "COMPLETED"}
    assert not unfinished, _unfinished(unfinished, report)
    hot = next(v for v in trainers.values() if v["role"] == "hotspare")
    assert "spares=" in hot["comment"], hot
    # the schedule's first draining GPU fault went to the node of the hot-spare job a spare could replace
    assert any("on hot-spare job" in i["note"] for i in report.injected), [i["note"] for i in report.injected]
    # every "running again" is a requeue or a swap to the hot spare, and the report says which
    r = report.recovery
    assert (r["fault_to_job_running_again_requeue_s"]["n"] + r["fault_to_job_running_again_swap_s"]["n"]
            == r["fault_to_job_running_again_s"]["n"]), r
    assert json.loads((lab_dir / "lab.json").read_text()).get("procs") == {}  # torn down
    data = report.to_dict()
    assert data["seed"] == SEED and data["ok"] is True and len(data["schedule"]["faults"]) == FAULTS
    # the people on duty are in the report: what the breaker did and what the on-call did about it
    b = data["breaker"]
    assert b["trips"] == len(b["episodes"]) and b["resets"] + b["rearmed_by_itself"] + b["open_at_end"] == b["trips"]


def _unfinished(jobs: dict, report) -> str:
    """Which trainers did not complete, each with its state, reason and comment in full, then the
    soak's notes (what it saw at the end: recovering, queued, not settled): the message a CI failure
    needs, where ``report.jobs`` as a whole is cut short."""
    lines = [f"{len(jobs)} trainer job(s) not COMPLETED:"]
    for jid, v in sorted(jobs.items()):
        lines.append(f"  job {jid} ({v['role']}): {v['state']} reason={v.get('reason', '')!r} "
                     f"restarts={v['restarts']} comment={v['comment']!r}")
    lines += [f"  note: {n}" for n in report.notes]
    return "\n".join(lines)


def test_soak_plot_or_a_clear_error(soak_report, tmp_path):
    _lab_dir, report = soak_report
    png = tmp_path / "soak.png"
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        with pytest.raises(LabError, match="needs matplotlib"):
            plot(report, str(png))
        return
    plot(report, str(png))
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
