"""Shared fixtures: real lab clusters (munged + slurmctld + slurmd per node) started once per session.

``plain_lab``: Slurm only (no hooks, no xid-watch), for adapter and core tests.
``healing_lab``: hooks and xid-watch wired as `autoheal lab up` does by default.
``lab_factory``: a fresh lab per test (for tests that kill or restart daemons).
Every lab is torn down by PID at the end, even after failures.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from autoheal_lab.cluster import Lab

#: The test files that take longest, longest first: per-file totals (setup + call + teardown, from the
#: junit XML) of a full `./dev test` on a shared 2-core machine, 2026-12-03: test_job_flood_lab 394 s (its
#: 10,000-job flood: 234 s), test_remediation_lab 291 s, test_faults_reach_job_lab 256 s, test_soak 232 s,
#: test_hotspare_lab 218 s, ... test_sync_lab 73 s. `./dev test` gives each file whole to one worker (``--dist
#: loadfile``) in collection order (``--no-loadscope-reorder``: xdist's own reorder, most tests first, sends
#: these lab files, with few tests each, last, so the run ended with one worker still on a long one). Longest
#: first, then the other integration files, then the unit tests, which fill the gaps at the end. A file
#: missing here only runs later; none is left out.
LONGEST_FIRST = (
    "test_job_flood_lab.py",
    "test_remediation_lab.py",
    "test_faults_reach_job_lab.py",
    "test_soak.py",
    "test_hotspare_lab.py",
    "test_grace_signal_lab.py",
    "test_realkube_lab.py",
    "test_requeue_race.py",
    "test_memtier_lab.py",
    "test_drill_variants.py",
    "test_hooks_faults_lab.py",
    "test_sync_http_bench.py",
    "test_hooks_lab.py",
    "test_hang_lab.py",
    "test_lab_kube.py",
    "test_sbatch_requeue.py",
    "test_drill.py",
    "test_prometheus_lab.py",
    "test_sync_cli.py",
    "test_frameworks_submitit.py",
    "test_config_fuzz.py",
    "test_sync_lab.py",
)


def run_order(nodeid: str) -> tuple:
    """Where a test's file goes in the run (``LONGEST_FIRST``, then integration, then the rest); the tests of
    one file keep their order, and stay together."""
    path = nodeid.split("::", 1)[0]
    name = path.rsplit("/", 1)[-1]
    if name in LONGEST_FIRST:
        return (0, LONGEST_FIRST.index(name))
    return (1 if "integration/" in path else 2, 0)


def pytest_collection_modifyitems(session, config, items) -> None:
    items.sort(key=lambda item: run_order(item.nodeid))  # stable: within a file, pytest's order


def _require_slurm() -> None:
    missing = [b for b in ("slurmctld", "slurmd", "munged", "scontrol", "sbatch")
               if not (shutil.which(b) or Path("/usr/sbin", b).exists())]
    if missing:
        if os.environ.get("CI"):
            pytest.fail(f"CI must install Slurm: missing {', '.join(missing)}")
        pytest.skip(f"Slurm not installed here ({', '.join(missing)} missing)")
    if os.geteuid() != 0:
        pytest.skip("the lab runs Slurm daemons as root")


class LabHandle:
    """A running lab plus conveniences for tests."""

    def __init__(self, lab: Lab):
        self.lab = lab
        self.root = lab.root
        self.layout = lab.layout()
        self.env = lab.slurm_env()

    def adapter(self, **kwargs):
        from autoheal.slurm.cli_backend import CliSlurm

        return CliSlurm(slurm_conf=str(self.layout.slurm_conf), env=self.env, **kwargs)

    def config(self):
        from autoheal.config import load_config

        return load_config(self.layout.autoheal_conf)


def _start(root: Path, **kwargs) -> LabHandle:
    _require_slurm()
    lab = Lab(root)
    lab.up(install=False, **kwargs)
    return LabHandle(lab)


@pytest.fixture(scope="session")
def lib_dir(tmp_path_factory) -> Path:
    """The fake libnvidia-ml.so.1, built once per session (skips only where gcc or nvml.h is missing)."""
    from autoheal_lab import fakenvml

    if shutil.which(os.environ.get("CC", "gcc")) is None and shutil.which("gcc") is None:
        pytest.skip("gcc not installed: cannot build the fake libnvidia-ml.so.1")
    try:
        fakenvml.find_nvml_header()
    except fakenvml.FakeNvmlBuildError as exc:
        pytest.skip(str(exc))
    out = tmp_path_factory.mktemp("fakenvml-lib")
    fakenvml.build_library(out)
    return out


@pytest.fixture(scope="session")
def plain_lab(tmp_path_factory):
    handle = _start(tmp_path_factory.mktemp("plainlab"), nodes=3, gpus=8, spares=1, hooks=False, xid_watch=False)
    yield handle
    handle.lab.down()


@pytest.fixture(scope="session")
def healing_lab(tmp_path_factory):
    handle = _start(tmp_path_factory.mktemp("heallab"), nodes=3, gpus=8, spares=1)
    yield handle
    handle.lab.down()


@pytest.fixture
def lab_factory(tmp_path_factory):
    started = []

    def make(**kwargs) -> LabHandle:
        kwargs.setdefault("hooks", False)
        kwargs.setdefault("xid_watch", False)
        handle = _start(tmp_path_factory.mktemp("lab"), **kwargs)
        started.append(handle)
        return handle

    yield make
    for handle in started:
        handle.lab.down()


@pytest.fixture(scope="module")
def control_plane(tmp_path_factory):
    """A real etcd + kube-apiserver + kube-controller-manager (``autoheal_lab.controlplane``), built once
    per machine; where Go is missing the tests say what to install (and fail under CI, which must have it)."""
    from autoheal_lab import controlplane
    from autoheal_lab.cluster import _free_ports

    why = controlplane.missing_toolchain()
    if why:
        if os.environ.get("CI"):
            pytest.fail(f"CI must be able to build the control plane: {why}")
        pytest.skip(why)
    plane = controlplane.start(controlplane.ensure_binaries(), tmp_path_factory.mktemp("controlplane"),
                               _free_ports(3))
    yield plane
    plane.stop()
