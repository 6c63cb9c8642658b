"""A lab's clean start (autoheal_lab.cleanup) on plain directories: what goes, what stays, and never
anything outside the lab directory."""

from __future__ import annotations

import json

import pytest

from autoheal_lab import cleanup
from autoheal_lab.cluster import Lab, LabError


def _old_lab(root):
    """A directory as an earlier lab run leaves it."""
    (root / "lab.json").write_text(json.dumps({"procs": {}}))
    files = {
        "state/job_state": "jobs", "state/node_state": "nodes", "spool/gpu1/cred_state": "x",
        "journal/journal.jsonl": "{}", "nodestate/gpu1/state.json": "{}", "gpus/gpu1.state": "gpu.0.lost=1",
        "gpus/gpu1.state.events": "1 3 79", "kmsg/gpu1.log": "NVRM: Xid 79", "kube/spares-used.json": "{}",
        "kube/objects.json": "{}", "drill/20260101-000000/ckpt/ckpt-00000010/COMPLETE": "",
        "metrics/gpu1/autoheal.prom": "", "run/slurmctld.pid": "1",
        # kept: configuration, munge key, logs, the NVML build
        "etc/autoheal.toml": "# edited by hand", "munge/munge.key": "k", "log/slurmctld.log": "old",
        "lib/libnvidia-ml.so.1": "elf",
    }
    for rel, text in files.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
    return files


def test_clean_empties_every_state_dir_and_keeps_config_keys_and_logs(tmp_path):
    files = _old_lab(tmp_path)
    emptied = cleanup.clean(tmp_path)
    assert sorted(emptied) == sorted(str(tmp_path / d) for d in cleanup.STATE_DIRS if (tmp_path / d).exists())
    for rel in files:
        top = rel.split("/")[0]
        assert (tmp_path / rel).exists() == (top not in cleanup.STATE_DIRS), rel
    for d in cleanup.STATE_DIRS:  # the folders themselves stay (emptied)
        assert not (tmp_path / d).exists() or list((tmp_path / d).iterdir()) == []
    assert (tmp_path / "etc" / "autoheal.toml").read_text() == "# edited by hand"


def test_a_directory_without_a_lab_is_left_alone(tmp_path):
    (tmp_path / "journal").mkdir()
    (tmp_path / "journal" / "mine.txt").write_text("not the lab's")
    assert cleanup.clean(tmp_path) == []
    assert (tmp_path / "journal" / "mine.txt").exists()
    # and `lab up` refuses to adopt it (a later clean start would empty the user's folder)
    with pytest.raises(LabError, match="holds no lab"):
        Lab(tmp_path)._check_lab_dir()


def test_a_state_dir_linking_out_of_the_lab_is_refused_and_nothing_is_deleted(tmp_path):
    lab, outside = tmp_path / "lab", tmp_path / "precious"
    lab.mkdir()
    outside.mkdir()
    (outside / "data").write_text("keep me")
    _old_lab(lab)
    (lab / "drill").rename(tmp_path / "old-drill")
    (lab / "drill").symlink_to(outside)
    with pytest.raises(cleanup.UnsafeCleanup, match="outside the lab directory"):
        cleanup.clean(lab)
    assert (outside / "data").read_text() == "keep me"
    assert (lab / "state" / "job_state").exists()  # refused before anything was emptied


def test_symlinks_inside_state_dirs_are_unlinked_not_followed(tmp_path):
    lab, outside = tmp_path / "lab", tmp_path / "precious"
    lab.mkdir()
    outside.mkdir()
    (outside / "data").write_text("keep me")
    _old_lab(lab)
    (lab / "journal" / "to-file").symlink_to(outside / "data")
    (lab / "journal" / "to-dir").symlink_to(outside, target_is_directory=True)
    (lab / "state" / "deep").mkdir()
    (lab / "state" / "deep" / "to-dir").symlink_to(outside, target_is_directory=True)
    cleanup.clean(lab)
    assert (outside / "data").read_text() == "keep me"
    assert list((lab / "journal").iterdir()) == [] and list((lab / "state").iterdir()) == []


def test_a_state_dir_linking_inside_the_lab_is_emptied_through_the_link(tmp_path):
    _old_lab(tmp_path)
    (tmp_path / "real-kmsg").mkdir()
    (tmp_path / "real-kmsg" / "gpu1.log").write_text("Xid 79")
    (tmp_path / "kmsg" / "gpu1.log").unlink()
    (tmp_path / "kmsg").rmdir()
    (tmp_path / "kmsg").symlink_to(tmp_path / "real-kmsg", target_is_directory=True)
    cleanup.clean(tmp_path)
    assert (tmp_path / "kmsg").is_symlink() and list((tmp_path / "real-kmsg").iterdir()) == []


def test_a_planted_marker_symlink_or_the_filesystem_root_is_not_a_lab(tmp_path):
    lab = tmp_path / "lab"
    (lab / "journal").mkdir(parents=True)
    (lab / "journal" / "j").write_text("x")
    (tmp_path / "elsewhere.json").write_text("{}")
    (lab / "lab.json").symlink_to(tmp_path / "elsewhere.json")
    assert cleanup.clean(lab) == [] and (lab / "journal" / "j").exists()
    with pytest.raises(cleanup.UnsafeCleanup):
        cleanup.plan(tmp_path / ".." / ".." / ".." / ".." / ".." / ".." / ".." / ".." / "..")
