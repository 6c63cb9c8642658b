"""Heartbeats (issue 23 §2): the per-rank liveness records the runner's hang detection reads.

Writing: cheap, atomic, throttled, a no-op outside ``autoheal sbatch``, never fatal to training. The
``saving`` mark is cleared however the block ends. Reading: bounded, regular files only (a user may
write anything into the checkpoint folder)."""

from __future__ import annotations

import json
import os

import pytest

from autoheal.sbatch_helpers import heartbeat, progress, saving
from autoheal.sbatch_helpers.checkpoint import CheckpointError, CheckpointManager
from autoheal.sbatch_helpers.progress import HEARTBEAT_DIR, Heartbeat, read_heartbeats, report_progress


@pytest.fixture(autouse=True)
def no_throttle(monkeypatch):
    monkeypatch.setattr(progress, "HEARTBEAT_MIN_INTERVAL", 0.0)


def env(ckdir, rank=0):
    return {"AUTOHEAL_CHECKPOINT_DIR": str(ckdir), "SLURM_PROCID": str(rank)}


def test_heartbeat_is_a_noop_outside_autoheal_sbatch(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert heartbeat(3, environ={}) is None
    with saving(3, environ={}) as path:
        assert path is None
    assert list(tmp_path.iterdir()) == []


def test_heartbeat_writes_one_record_per_rank(tmp_path):
    heartbeat(7, environ=env(tmp_path, 0))
    heartbeat(9, environ=env(tmp_path, 3))
    beats = read_heartbeats(tmp_path)
    assert sorted(beats) == [0, 3]
    assert (beats[0].step, beats[0].phase) == (7, "step")
    assert (beats[3].rank, beats[3].step) == (3, 9)
    assert beats[3].time > 0
    heartbeat(8, environ=env(tmp_path, 0))
    assert read_heartbeats(tmp_path)[0].step == 8
    # atomic replace: no temp file is left behind
    assert sorted(p.name for p in (tmp_path / HEARTBEAT_DIR).iterdir()) == ["rank-0", "rank-3"]


def test_heartbeat_rejects_a_step_that_is_no_whole_number(tmp_path):
    for bad in (-1, 1.5, True, "3"):
        with pytest.raises(CheckpointError):
            heartbeat(bad, environ=env(tmp_path))  # type: ignore[arg-type]


def test_heartbeats_of_one_phase_are_throttled_but_a_phase_change_is_not(tmp_path, monkeypatch):
    monkeypatch.setattr(progress, "HEARTBEAT_MIN_INTERVAL", 3600.0)
    e = env(tmp_path, 1)
    heartbeat(1, environ=e)
    heartbeat(2, environ=e)
    assert read_heartbeats(tmp_path)[1].step == 1
    with saving(2, environ=e):
        assert read_heartbeats(tmp_path)[1].phase == "saving"
    assert read_heartbeats(tmp_path)[1] == Heartbeat(1, 2, read_heartbeats(tmp_path)[1].time, "saved")


def test_saving_mark_is_cleared_when_the_save_raises(tmp_path):
    e = env(tmp_path)
    with pytest.raises(RuntimeError):
        with saving(5, environ=e):
            assert read_heartbeats(tmp_path)[0].phase == "saving"
            raise RuntimeError("disk on fire")
    assert read_heartbeats(tmp_path)[0].phase == "saved"
    with pytest.raises(SystemExit):  # the grace signal's handler ends the job with SystemExit
        with saving(6, environ=e):
            raise SystemExit(0)
    assert (read_heartbeats(tmp_path)[0].phase, read_heartbeats(tmp_path)[0].step) == ("saved", 6)
    heartbeat(7, environ=e)
    assert read_heartbeats(tmp_path)[0].phase == "step"


def test_nested_saving_blocks_clear_the_mark_once_the_outermost_ends(tmp_path):
    e = env(tmp_path)
    with saving(5, environ=e):
        with saving(5, environ=e):
            pass
        assert read_heartbeats(tmp_path)[0].phase == "saving"
        heartbeat(5, environ=e)  # a heartbeat inside a save keeps saying "saving"
        assert read_heartbeats(tmp_path)[0].phase == "saving"
    assert read_heartbeats(tmp_path)[0].phase == "saved"


def test_a_write_failure_never_stops_training(tmp_path):
    blocker = tmp_path / "ck"
    blocker.write_text("a file where the folder should be")
    assert heartbeat(1, environ=env(blocker)) is not None
    with saving(2, environ=env(blocker)):
        pass
    assert read_heartbeats(blocker) == {}


def test_the_checkpoint_manager_marks_its_saves(tmp_path, monkeypatch):
    ck = tmp_path / "ck"
    seen = []

    def payload(f):
        seen.append(read_heartbeats(ck)[0].phase)
        f.write(b"state")

    mgr = CheckpointManager(ck, environ=env(ck), owner=None)
    mgr.save(4, payload)
    assert seen == ["saving"]
    assert (read_heartbeats(ck)[0].phase, read_heartbeats(ck)[0].step) == ("saved", 4)
    assert mgr.checkpoints() == [4]  # the heartbeat folder is no checkpoint candidate


def test_a_shard_save_marks_the_rank_it_saves_for(tmp_path):
    ck = tmp_path / "ck"
    mgr = CheckpointManager(ck, rank=1, world_size=2, environ=env(ck, 0), owner=None)
    mgr.save_shard(3, b"half")
    assert read_heartbeats(ck)[1].phase == "saved"
    assert 0 not in read_heartbeats(ck)


def test_report_progress_is_a_heartbeat_of_every_rank(tmp_path):
    report_progress(12, environ=env(tmp_path, 2))
    assert (read_heartbeats(tmp_path)[2].step, read_heartbeats(tmp_path)[2].phase) == (12, "saved")
    assert not (tmp_path / progress.PROGRESS_FILE).exists()  # the marker stays rank 0's


# ---- hostile contents: the reader is the job runner; anything a user writes there is skipped


def _hb_dir(tmp_path):
    d = tmp_path / HEARTBEAT_DIR
    d.mkdir(exist_ok=True)
    return d


def test_reading_skips_symlinks_fifos_folders_and_huge_files(tmp_path):
    d = _hb_dir(tmp_path)
    secret = tmp_path / "secret"
    secret.write_text(json.dumps({"rank": 1, "step": 1, "time": 1.0, "phase": "step"}))
    os.symlink(secret, d / "rank-1")
    os.mkfifo(d / "rank-2")             # opening it for reading would block
    (d / "rank-3").mkdir()
    (d / "rank-4").write_text(json.dumps({"rank": 4, "step": 1, "time": 1.0, "phase": "step",
                                          "pad": "x" * 10_000}))
    heartbeat(5, environ=env(tmp_path, 0))
    assert list(read_heartbeats(tmp_path)) == [0]


@pytest.mark.parametrize("content", [
    b"", b"\xff\xfe garbage", b"[1, 2]", b"null", b"[" * 900 + b"]" * 900,
    json.dumps({"step": -1, "time": 1.0, "phase": "step"}).encode(),
    json.dumps({"step": True, "time": 1.0, "phase": "step"}).encode(),
    json.dumps({"step": 1, "time": "now", "phase": "step"}).encode(),
    json.dumps({"step": 1, "time": 1.0, "phase": "sleeping"}).encode(),
    json.dumps({"step": 1, "time": 1.0, "phase": "step", "rank": 9}).encode(),  # another rank's name
    b'{"step": 1, "time": NaN, "phase": "step"}',
])
def test_reading_skips_garbage(tmp_path, content):
    (_hb_dir(tmp_path) / "rank-6").write_bytes(content)
    assert read_heartbeats(tmp_path) == {}


def test_a_symlinked_heartbeat_folder_is_not_listed(tmp_path):
    elsewhere = tmp_path / "elsewhere"
    heartbeat(1, environ=env(elsewhere))
    ck = tmp_path / "ck"
    ck.mkdir()
    os.symlink(elsewhere / HEARTBEAT_DIR, ck / HEARTBEAT_DIR)
    assert read_heartbeats(ck) == {}
    assert read_heartbeats(elsewhere)[0].step == 1


def test_reading_looks_at_a_bounded_number_of_entries(tmp_path, monkeypatch):
    d = _hb_dir(tmp_path)
    for i in range(20):
        (d / f"junk-{i}").write_bytes(b"")
    heartbeat(1, environ=env(tmp_path, 0))
    monkeypatch.setattr(progress, "MAX_HEARTBEAT_ENTRIES", 5)
    assert len(read_heartbeats(tmp_path)) <= 1
    monkeypatch.setattr(progress, "MAX_HEARTBEAT_ENTRIES", 100)
    assert list(read_heartbeats(tmp_path)) == [0]


def test_reading_a_missing_or_unset_folder_is_empty(tmp_path):
    assert read_heartbeats(None) == {}
    assert read_heartbeats(tmp_path / "nowhere") == {}
