"""The XID 79 drill end to end on a real lab: real Slurm, fake GPUs, the real Kubernetes control plane.

Both drills run in one lab directory: the second starts where the first left a retired node, a used
spare, a journal, Slurm's saved jobs and Kubernetes objects, and must pass all the same (issue 11). The
drill's variants, each in a directory of its own, are in test_drill_variants.py (a worker can take them
while another runs these two)."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from autoheal_lab.cli import lab as lab_cli


def _drill(lab_dir, *args):
    result = CliRunner().invoke(lab_cli, ["drill", "--dir", str(lab_dir), "--json", "--timeout", "120", *args])
    data = json.loads(result.output[result.output.index("{"):])
    return result.exit_code, data


def _phase(data, prefix):
    return next(p for p in data["phases"] if p["phase"].startswith(prefix))


@pytest.fixture(scope="module")
def kube_drill(tmp_path_factory):
    """The full drill (Kubernetes side included), run once; its lab directory is reused below."""
    lab_dir = tmp_path_factory.mktemp("drill") / "lab"
    code, data = _drill(lab_dir)
    return lab_dir, code, data


def test_drill_observes_every_phase_and_resumes_from_the_saved_step(kube_drill):
    """The default drill: the fault reaches the job (issue 23): the broken rank's GPU call fails, nothing is
    saved after the fault, the job resumes from the last save before it and the steps since are lost."""
    lab_dir, code, data = kube_drill
    missing = [p["phase"] for p in data["phases"] if p["status"] in ("missing", "failed", "error")]
    assert code == 0 and data["ok"], (missing, data["logs"])
    assert data["fault_reaches_job"] is True
    assert _phase(data, "the broken rank's GPU call failed")["status"] == "observed"
    assert _phase(data, "checkpoint saved after the signal")["status"] == "skipped"
    order = [_phase(data, name)["seconds_after_fault"] for name in
             ("detected", "drained", "grace signal sent", "job requeued", "job running again",
              "trainer restarted", "training progressing")]
    # the loop happened in this order: each phase is stamped from its evidence's own clock, never before
    # the phase it follows
    assert order == sorted(order), order
    clocks = {p["phase"]: p["clock"] for p in data["phases"] if p["status"] == "observed"}
    # xid-watch's record (or, were it late, Slurm's own reason time), never the poll
    assert clocks["drained in Slurm with an autoheal reason"] in ("journal", "slurm event time")
    assert clocks["trainer restarted at the right step"] == "trainer clock"
    assert clocks["job running again, away from the bad node"] in ("slurm event time", "polled")
    assert set(clocks.values()) <= {"lab inject", "journal", "trainer clock", "slurm event time",
                                    "kubernetes object time", "polled"}
    drained = _phase(data, "drained")
    assert drained["seconds_after_fault"] <= drained["polled_s"]
    kube = [_phase(data, name) for name in ("Kubernetes: GPUHealthy=False", "opt-out label checked",
                                            "pods evicted", "replacement requested", "spare node in service")]
    assert all(p["status"] == "observed" for p in kube), kube
    # the spare in service is the one this node's request named, seen after that request
    assert kube[-1]["detail"].startswith("spare1 ") and f"named by NodeReplacement {data['node']}" in kube[-1]["detail"]
    # (the failed node's "retired: replaced by spare1" reason comes when the remediation is done, which
    # waits for the spare to respond: it may follow this phase by a moment)
    assert kube[-1]["seconds_after_fault"] >= kube[-2]["seconds_after_fault"]
    assert data["totals"]["fault_to_replacement_in_service_s"] is not None
    saved = int(next(n for n in data["notes"] if n.startswith("last checkpoint before the fault: step ")).split()[-1])
    assert f"resumed from step {saved} " in _phase(data, "trainer restarted")["detail"] + " "
    # the fault came 5 steps after that save (drill.MID_INTERVAL): those steps, at least, are lost
    assert data["lost_steps"] is not None and data["lost_steps"] >= 5
    assert "(restart 1)" in _phase(data, "job running again")["detail"]
    assert "job runs again on the drained node" not in json.dumps(data)
    assert data["totals"]["fault_to_drain_s"] < 30  # bounded wait, not a timing target
    assert json.loads((lab_dir / "lab.json").read_text()).get("procs") == {}  # torn down


def test_a_second_drill_in_the_same_directory_passes_plain_too(kube_drill, monkeypatch):
    """--no-kube --plain in the directory the full drill used: a job that did not opt in restarts from
    scratch, and the drill passes although the last run retired a node and used up the spare. The fault
    reaches this job too: its blocked rank holds Slurm's SIGTERM, so the requeue waits out KillWait
    (10 s here: the recommended 120 s made this the longest test of the run, and nothing here depends on
    its length, only on the SIGKILL that ends the wait)."""
    from autoheal_lab.slurmconf import ENV_EXTRA_CONF

    lab_dir, _code, first = kube_drill
    left = lab_dir / "kube" / "spares-used.json"
    assert json.loads(left.read_text()) == {first["node"]: "spare1"}  # the state a reused lab used to inherit
    monkeypatch.setenv(ENV_EXTRA_CONF, "KillWait=10")
    code, data = _drill(lab_dir, "--no-kube", "--plain", "--timeout", "400")
    assert "KillWait=10" in (lab_dir / "etc" / "slurm.conf").read_text().splitlines()
    assert code == 0 and data["ok"], (data["phases"], data["logs"])
    assert data["opt_in"] is False and data["job_id"] == "1"  # Slurm's saved jobs were forgotten
    assert _phase(data, "checkpoint saved")["status"] == "skipped"
    restarted = _phase(data, "trainer restarted")
    assert restarted["status"] == "observed" and "restarted from step 0" in restarted["detail"]
    assert "did not opt in" in restarted["detail"]
    assert not left.exists()
