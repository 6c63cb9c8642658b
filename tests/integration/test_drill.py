"""The XID 79 drill end to end on a real lab (short mode: no Kubernetes side)."""

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
    code, data = _drill(tmp_path, "--no-kube")
    missing = [p["phase"] for p in data["phases"] if p["status"] in ("missing", "failed")]
    assert code == 0 and data["ok"], (missing, data["logs"])
    order = [_phase(data, name)["seconds_after_fault"] for name in
             ("detected", "drained", "grace signal", "checkpoint saved", "job requeued", "job running again",
              "trainer restarted", "training progressing")]
    assert order == sorted(order)  # the loop happened in this order, per the evidence
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
