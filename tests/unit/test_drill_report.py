"""The drill's report: statuses, totals, the timeline text and the plot, without a lab."""

from __future__ import annotations

import pytest

from autoheal.lab.drill import DrillReport, Phase, plot_timeline, render_timeline


def _report(**missing) -> DrillReport:
    rep = DrillReport(fault_time=1000.0, node="gpu2", job_id="7")
    rep.phases = [
        Phase("XID 79 injected on gpu2 gpu 3", "lab inject", at=1000.0),
        Phase("drained in Slurm with an autoheal reason", "slurm", at=1000.4, detail="autoheal: xid 79"),
        Phase("replacement requested", "kubernetes", skipped="--no-kube"),
        Phase("job running again, away from the bad node", "slurm",
              at=None if missing.get("running") else 1013.5),
        Phase("trainer restarted at the right step", "trainer output", at=1014.0,
              failed=missing.get("wrong_step", "")),
    ]
    return rep


def test_all_observed_or_skipped_is_ok_with_totals():
    rep = _report()
    data = rep.to_dict()
    assert data["ok"] is True
    assert data["totals"] == {"fault_to_drain_s": 0.4, "fault_to_job_running_again_s": 13.5,
                              "fault_to_replacement_in_service_s": None}
    assert [p["status"] for p in data["phases"]] == ["observed", "observed", "skipped", "observed", "observed"]
    text = render_timeline(rep)
    assert "drill PASSED" in text and "skipped" in text and "fault -> drain: 0.4 s" in text


def test_missing_phase_fails_the_drill_and_is_named():
    rep = _report(running=True)
    assert rep.ok is False
    text = render_timeline(rep)
    assert "MISSING  job running again" in text and "drill FAILED" in text


def test_contradicted_phase_fails_the_drill_with_why():
    rep = _report(wrong_step="resumed from step 10, but the last checkpoint saved before the fault was step 14")
    data = rep.to_dict()
    assert data["ok"] is False
    failed = [p for p in data["phases"] if p["status"] == "failed"]
    assert failed and "step 14" in failed[0]["why"]
    assert "FAILED: resumed from step 10" in render_timeline(rep)


def test_plot_writes_a_png(tmp_path):
    pytest.importorskip("matplotlib")
    out = tmp_path / "t.png"
    plot_timeline(_report(), str(out))
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and out.stat().st_size > 5000
