"""Where Go is missing (a user's machine), `lab up --kube` says so in one line naming what to install and
starts nothing; the drill's Kubernetes phases are marked "not run" (issue 21)."""

from __future__ import annotations

import json

from click.testing import CliRunner

from autoheal_lab import kube as labkube
from autoheal_lab.cli import lab as lab_cli
from autoheal_lab.drill import DrillReport, Phase, render_timeline


def _no_go(monkeypatch, tmp_path):
    # a PATH with python's tools and openssl but no Go (Go lives in /usr/local/go/bin on these machines)
    bindir = tmp_path / "bin"
    bindir.mkdir()
    monkeypatch.setenv("PATH", f"{bindir}:/usr/bin:/bin")
    monkeypatch.setenv("AUTOHEAL_KUBE_TOOLS_CACHE", str(tmp_path / "empty-cache"))  # nothing built either
    import shutil

    assert shutil.which("go") is None


def test_lab_up_kube_without_go_is_one_line_naming_go_and_starts_nothing(monkeypatch, tmp_path):
    _no_go(monkeypatch, tmp_path)
    lab_dir = tmp_path / "lab"
    res = CliRunner().invoke(lab_cli, ["up", "--dir", str(lab_dir), "--kube", "--no-install"])
    assert res.exit_code == 2, res.output
    lines = [ln for ln in res.output.splitlines() if ln.strip()]
    assert len(lines) == 1 and "Go is not installed: install Go 1.26" in lines[0], res.output
    assert "Traceback" not in res.output
    state = json.loads((lab_dir / "lab.json").read_text()) if (lab_dir / "lab.json").exists() else {}
    assert not state.get("procs")


def test_cannot_start_names_go_when_go_is_missing(monkeypatch, tmp_path):
    _no_go(monkeypatch, tmp_path)
    assert "install Go" in labkube.cannot_start()


def test_kubernetes_phases_not_run_are_shown_as_such_and_do_not_fail_the_drill():
    rep = DrillReport(fault_time=1000.0, node="gpu2", job_id="7")
    why = "not run: Go is not installed: install Go 1.26 or newer"
    rep.phases = [Phase("drained in Slurm with an autoheal reason", "slurm", at=1000.4, detail="autoheal: xid 79"),
                  Phase("replacement requested", "kubernetes", skipped=why)]
    text = render_timeline(rep)
    row = next(ln for ln in text.splitlines() if "replacement requested" in ln)
    assert row.lstrip().startswith("not run") and "install Go 1.26" in row
    assert rep.to_dict()["ok"] is True


def test_binaries_already_in_the_cache_need_no_go(monkeypatch, tmp_path):
    """A chroot of .ci/slurm-chroot has no Go but mounts the host's cache: the built binaries are used as
    they are (build.sh, which needs Go, is not run)."""
    from autoheal_lab import controlplane

    _no_go(monkeypatch, tmp_path)
    monkeypatch.setenv("AUTOHEAL_KUBE_TOOLS_CACHE", str(tmp_path / "cache"))
    bindir = controlplane.cached_bindir()
    bindir.mkdir(parents=True)
    for name in controlplane.BINARIES[:-1]:
        (bindir / name).write_text("#!/bin/sh\n")
        (bindir / name).chmod(0o755)
    assert "install Go" in controlplane.missing_toolchain()  # helm missing: not all built
    (bindir / "helm").write_text("#!/bin/sh\n")
    (bindir / "helm").chmod(0o755)
    assert controlplane.missing_toolchain() is None
    def no_build(*args, **kwargs):
        raise AssertionError(f"build.sh run although everything is built: {args}")

    monkeypatch.setattr(controlplane.subprocess, "Popen", no_build)
    assert controlplane.ensure_binaries() == bindir
