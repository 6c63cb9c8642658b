"""The drill's variants on a real lab, each in a lab directory of its own: --hot-spare, --submitit, and a
machine without Go. A file of their own so that the run's workers can take them apart from the full drill
and its second run (test_drill.py), which share one directory."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner
from test_drill import _drill, _phase

from autoheal_lab.cli import lab as lab_cli


def test_hot_spare_drill_with_the_fault_reaching_the_job_resumes_on_the_spare_without_requeue(tmp_path):
    """--hot-spare with the default fault: the broken rank's GPU call fails, its peer blocks, the runner
    ends the step and restarts it on the spare from the last save, in the same allocation."""
    code, data = _drill(tmp_path / "lab", "--no-kube", "--hot-spare")
    assert code == 0 and data["ok"], (data["phases"], data["logs"])
    assert data["hot_spare"] is True and data["fault_reaches_job"] is True
    assert _phase(data, "the broken rank's GPU call failed")["clock"] == "trainer clock"
    saved = int(next(n for n in data["notes"] if n.startswith("last checkpoint before the fault: step ")).split()[-1])
    assert _phase(data, "trainer restarted")["detail"].startswith(f"resumed from step {saved} ")
    assert data["lost_steps"] is not None and data["lost_steps"] >= 5
    order = [_phase(data, name)["seconds_after_fault"] for name in
             ("detected", "drained", "bad node released", "trainer restarted", "training progressing")]
    assert order == sorted(order), order
    assert data["totals"]["fault_to_requeued_s"] is None  # no requeue: the allocation kept, the node swapped


def test_submitit_drill_the_fault_reaches_the_job_and_it_resumes_from_its_last_durable_checkpoint(tmp_path):
    """Issue 15/23: `lab drill --submitit --plain`: a real submitit Checkpointable job on its step's fake
    GPU; XID 79 on that GPU: its GPU call fails, submitit's on-signal checkpoint cannot copy the state off
    the lost GPU, and the job (plain submitit, requeued by its own handler) resumes from its last durable
    save before the fault, on another node."""
    import os

    from autoheal_lab.drill_submitit import submitit_available

    if not submitit_available():
        if os.environ.get("CI"):
            pytest.fail("CI must install the test extras (submitit)")
        pytest.skip("submitit not installed (pip install -e .[test])")
    code, data = _drill(tmp_path / "lab", "--submitit", "--plain", "--no-kube")
    assert code == 0 and data["ok"] and data["fault_reaches_job"], (data["phases"], data["logs"])
    failed = _phase(data, "the broken rank's GPU call failed")
    assert "error=DeviceLost" in failed["detail"] and failed["clock"] == "trainer clock", failed
    ckpt = _phase(data, "submitit checkpoint on the signal")["detail"]
    saved = int(ckpt.split("durable step=")[1].split()[0])
    assert ckpt.startswith("checkpoint failed ") and saved > 0, ckpt
    restarted = _phase(data, "trainer restarted")["detail"]
    assert restarted.startswith(f"resumed from step {saved} on ") and data["node"] not in restarted.split(" on ")[1]
    assert 0 < data["lost_steps"] <= 10, data["lost_steps"]  # the recipe saves every 10 steps in the drill
    signal = _phase(data, "grace signal sent to the job")  # xid-watch's record, or skipped: it requeued itself
    assert (signal["status"] == "skipped" and signal["why"].startswith("not sent: the job requeued itself")) \
        or "--signal=USR2@" in signal["detail"], signal


def test_without_go_the_drill_runs_its_slurm_phases_and_marks_the_kubernetes_ones_not_run(tmp_path, monkeypatch):
    """Issue 21: on a machine without Go (the control plane cannot be built) the drill says so in one line,
    runs, passes its Slurm phases and marks the Kubernetes phases "not run" (never a traceback)."""
    import os
    import shutil

    path = [d for d in os.environ.get("PATH", "").split(":") if d and not os.path.exists(os.path.join(d, "go"))]
    monkeypatch.setenv("PATH", ":".join(path))
    monkeypatch.setenv("AUTOHEAL_KUBE_TOOLS_CACHE", str(tmp_path / "empty-cache"))  # and nothing built
    assert shutil.which("go") is None
    result = CliRunner().invoke(lab_cli, ["drill", "--dir", str(tmp_path / "lab"), "--json", "--timeout", "120"])
    assert "Traceback" not in result.output
    assert "Kubernetes phases not run: Go is not installed: install Go 1.26" in result.output
    data = json.loads(result.output[result.output.index("{"):])
    assert result.exit_code == 0 and data["ok"], (data["phases"], data["logs"])
    kube = [p for p in data["phases"] if p["source"] == "kubernetes"]
    assert kube and all(p["status"] == "skipped" and p["why"].startswith("not run: Go is not installed")
                        for p in kube), kube
    assert _phase(data, "job running again")["status"] == "observed"
    assert any("Kubernetes phases not run" in n for n in data["notes"])
