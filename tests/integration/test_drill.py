"""The XID 79 drill end to end on a real lab: real Slurm, fake GPUs, the fake Kubernetes API."""

from __future__ import annotations

import json

from click.testing import CliRunner

from autoheal.lab.cli import lab as lab_cli


def _drill(tmp_path, *args):
    result = CliRunner().invoke(lab_cli, ["drill", "--dir", str(tmp_path / "lab"), "--json", "--timeout", "120", *args])
    data = json.loads(result.output[result.output.index("{"):])
    return result.exit_code, data


def _phase(data, prefix):
    return next(p for p in data["phases"] if p["phase"].startswith(prefix))


def test_drill_observes_every_phase_and_resumes_from_the_saved_step(tmp_path):
    code, data = _drill(tmp_path)
    missing = [p["phase"] for p in data["phases"] if p["status"] in ("missing", "failed")]
    assert code == 0 and data["ok"], (missing, data["logs"])
    order = [_phase(data, name)["seconds_after_fault"] for name in
             ("detected", "drained", "grace signal", "checkpoint saved", "job requeued", "job running again",
              "trainer restarted", "training progressing")]
    # the loop happened in this order, per the evidence (phases are stamped by polling: allow 1 s of slack)
    assert all(later >= earlier - 1.0 for earlier, later in zip(order, order[1:])), order
    kube = [_phase(data, name) for name in ("Kubernetes: GPUHealthy=False", "opt-out label checked",
                                            "pods evicted", "replacement requested", "spare node in service")]
    assert all(p["status"] == "observed" for p in kube), kube
    assert "retired: replaced by spare1" in kube[-1]["detail"]
    assert data["totals"]["fault_to_replacement_in_service_s"] is not None
    saved = int(_phase(data, "checkpoint saved")["detail"].split("step=")[1].split()[0])
    assert f"resumed from step {saved} " in _phase(data, "trainer restarted")["detail"] + " "
    assert "job runs again on the drained node" not in json.dumps(data)
    assert data["totals"]["fault_to_drain_s"] < 30  # bounded wait, not a timing target
    assert not (tmp_path / "lab" / "lab.json").exists() or json.loads(
        (tmp_path / "lab" / "lab.json").read_text()).get("procs") == {}  # torn down


def test_drill_on_a_job_that_did_not_opt_in_restarts_from_scratch(tmp_path):
    code, data = _drill(tmp_path, "--no-kube", "--plain")
    assert code == 0 and data["ok"], data["logs"]
    assert data["opt_in"] is False
    assert _phase(data, "checkpoint saved")["status"] == "skipped"
    restarted = _phase(data, "trainer restarted")
    assert restarted["status"] == "observed" and "restarted from step 0" in restarted["detail"]
    assert "did not opt in" in restarted["detail"]
