"""A short seeded soak on the real lab (issue 12): 15 faults against the whole loop, zero violations.

The seed is fixed (12, the issue's number) so a failure replays exactly with
``autoheal lab soak --seed 12 --faults 15 --gap 3-6 --settle 90 --exclude ...``; the fault kinds are drawn
every-kind-once in a seeded order, so 15 faults cover 15 different kinds. Kinds left out here, and why:
see ``EXCLUDED`` (each is a known problem the lead was told about; the long soak in bench/bench_soak.py
runs every kind).
"""

from __future__ import annotations

import json

import pytest

from autoheal.lab.cluster import Lab, LabError
from autoheal.lab.soak import Soak, SoakOptions, plot, render
from autoheal.lab.soak_plan import KINDS

SEED = 12
FAULTS = 15
#: kind -> why it is not in the CI soak (empty: every kind is in the pool)
EXCLUDED: dict = {}


@pytest.fixture(scope="module")
def soak_report(tmp_path_factory):
    lab_dir = tmp_path_factory.mktemp("soak") / "lab"
    runner = Soak(Lab(lab_dir), SoakOptions(seed=SEED, faults=FAULTS, gap=(3.0, 6.0), settle=90.0,
                                            exclude=sorted(EXCLUDED)))
    report = runner.run()
    return lab_dir, report


def test_short_soak_has_no_violation(soak_report):
    _lab_dir, report = soak_report
    assert report.ok, render(report)


def test_soak_report_counts_every_fault_and_measures_recovery(soak_report):
    lab_dir, report = soak_report
    assert sum(c["injected"] for c in report.counts.values()) == len(report.injected) == FAULTS, report.notes
    assert set(report.counts) <= set(KINDS) - set(EXCLUDED)
    assert len(report.counts) == FAULTS  # every-kind-once: 15 faults, 15 kinds
    assert report.recovery["fault_to_drain_s"]["n"] >= 1
    trainers = {j: v for j, v in report.jobs.items() if v["role"] == "trainer"}
    assert trainers and all(v["state"] == "COMPLETED" for v in trainers.values()), report.jobs
    assert json.loads((lab_dir / "lab.json").read_text()).get("procs") == {}  # torn down
    data = report.to_dict()
    assert data["seed"] == SEED and data["ok"] is True and len(data["schedule"]["faults"]) == FAULTS


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
