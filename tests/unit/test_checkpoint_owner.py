"""Issue 17 item 4: a job that gets an earlier job's id must never resume that job's checkpoint silently.

In a fresh lab a new job 1 resumed an old job 1's step-600 checkpoint from the shared ``.../%j`` folder.
Checkpoints now record their owner (job id + the ``autoheal sbatch`` submission token) and loading
refuses an owner with this job's id but another token, unless allowed.
"""

from __future__ import annotations

import json
import logging
import os

import pytest

from autoheal.sbatch_helpers import checkpoint as ck
from autoheal.sbatch_helpers.checkpoint import (
    CheckpointManager,
    NoValidCheckpoint,
    Owner,
    find_resume_point,
    foreign_reason,
    open_checkpoint,
)

OLD = {"SLURM_JOB_ID": "1", "AUTOHEAL_SUBMIT_TOKEN": "aaaaaaaaaa"}  # job 1 before the cluster was reset
NEW = {"SLURM_JOB_ID": "1", "AUTOHEAL_SUBMIT_TOKEN": "bbbbbbbbbb"}  # the new job 1
NEW_RESTARTED = {**NEW, "SLURM_RESTART_COUNT": "3"}
OTHER_JOB = {"SLURM_JOB_ID": "7", "AUTOHEAL_SUBMIT_TOKEN": "cccccccccc"}
PLAIN: dict = {}  # outside autoheal sbatch (or an older version): no token


def mgr(d, env, **kw):
    kw.setdefault("keep", None)
    return CheckpointManager(d, rank=0, environ=env, **kw)


# ---------------------------------------------------------------- the rule (pure)


def test_owner_from_env():
    assert Owner.from_env(NEW) == Owner("1", "bbbbbbbbbb")
    assert Owner.from_env({**NEW, "SLURM_ARRAY_JOB_ID": "5", "SLURM_ARRAY_TASK_ID": "2"}) == Owner("5_2", "bbbbbbbbbb")
    assert Owner.from_env({"AUTOHEAL_SUBMIT_TOKEN": "t1"}) == Owner("", "t1")
    assert Owner.from_env(PLAIN) is None
    assert Owner.from_env({"SLURM_JOB_ID": "1"}) is None


def test_bad_token_is_ignored_with_a_warning(caplog):
    with caplog.at_level(logging.WARNING):
        assert Owner.from_env({"AUTOHEAL_SUBMIT_TOKEN": "a b\n"}) is None
    assert "not a submission token" in caplog.text


@pytest.mark.parametrize("recorded, expected, foreign", [
    (Owner("1", "aaa"), Owner("1", "bbb"), True),    # an earlier job with this id
    (Owner("1", "aaa"), Owner("1", "aaa"), False),   # this job, any restart
    (Owner("1", "aaa"), Owner("7", "ccc"), False),   # another job id: a folder shared on purpose
    (None, Owner("1", "bbb"), False),                # written before owners existed
    (Owner("1", "aaa"), None, False),                # reader outside autoheal sbatch
    (Owner("", "aaa"), Owner("", "bbb"), False),     # no job id on either side: nothing says "same id"
])
def test_foreign_rule(recorded, expected, foreign):
    assert bool(foreign_reason(recorded, expected)) is foreign


# ---------------------------------------------------------------- saving and loading


def test_save_records_the_owner(tmp_path):
    path = mgr(tmp_path, NEW).save(5, b"x")
    manifest = json.loads((path / "MANIFEST.json").read_text())
    assert manifest["owner"] == {"job_id": "1", "token": "bbbbbbbbbb"}
    assert manifest["metadata"] == {}  # the user's metadata stays the user's
    assert mgr(tmp_path, NEW).load().owner == Owner("1", "bbbbbbbbbb")
    assert "owner" not in json.loads((mgr(tmp_path / "p", PLAIN).save(5, b"x") / "MANIFEST.json").read_text())


def test_reused_job_id_does_not_resume_the_earlier_jobs_checkpoint(tmp_path, caplog):
    mgr(tmp_path, OLD).save(600, b"old model")
    with caplog.at_level(logging.WARNING):
        m = mgr(tmp_path, NEW)
        assert m.latest_valid() is None
    reason = str(m.rejections[0])
    assert reason.startswith("ckpt-00000600: written by an earlier job 1 (submission aaaaaaaaaa), not by this "
                             "job 1 (submission bbbbbbbbbb)")
    assert "--allow-foreign-checkpoint" in reason and "AUTOHEAL_ALLOW_FOREIGN_CHECKPOINT=1" in reason
    assert "written by an earlier job 1" in caplog.text  # logged: visible in the job's output
    with pytest.raises(NoValidCheckpoint, match="written by an earlier job 1"):
        m.load()
    with pytest.raises(NoValidCheckpoint, match="written by an earlier job 1"):
        m.load(600)
    # what the job runner calls, and what the trainers call with AUTOHEAL_RESUME_FROM
    rejections: list = []
    assert find_resume_point(tmp_path, environ=NEW, rejections=rejections) is None
    assert [r.name for r in rejections] == ["ckpt-00000600"]
    with pytest.raises(NoValidCheckpoint, match="written by an earlier job 1"):
        open_checkpoint(tmp_path / "ckpt-00000600", environ=NEW)


def test_the_runner_default_reads_the_environment(tmp_path, monkeypatch):
    mgr(tmp_path, OLD).save(600, b"old model")
    for k, v in NEW.items():
        monkeypatch.setenv(k, v)
    assert find_resume_point(tmp_path) is None
    assert CheckpointManager(tmp_path, rank=0).latest_valid() is None
    monkeypatch.setenv("AUTOHEAL_ALLOW_FOREIGN_CHECKPOINT", "1")
    assert find_resume_point(tmp_path) == tmp_path / "ckpt-00000600"
    assert open_checkpoint(tmp_path / "ckpt-00000600").step == 600


@pytest.mark.parametrize("how", ["env", "argument"])
def test_resuming_a_foreign_checkpoint_when_asked(tmp_path, how):
    mgr(tmp_path, OLD).save(600, b"old model")
    if how == "env":
        env = {**NEW, "AUTOHEAL_ALLOW_FOREIGN_CHECKPOINT": "yes"}
        kw = {}
    else:
        env, kw = NEW, {"allow_foreign": True}
    assert mgr(tmp_path, env, **kw).load().read_bytes() == b"old model"
    assert find_resume_point(tmp_path, environ=env, **kw) == tmp_path / "ckpt-00000600"
    assert open_checkpoint(tmp_path / "ckpt-00000600", environ=env, **kw).step == 600


def test_own_restarts_other_jobs_and_old_checkpoints_still_resume(tmp_path):
    mgr(tmp_path / "own", NEW).save(40, b"mine")
    assert mgr(tmp_path / "own", NEW_RESTARTED).load().read_bytes() == b"mine"
    mgr(tmp_path / "chain", OTHER_JOB).save(40, b"job 7's")  # e.g. one --checkpoint-dir for a chain of jobs
    assert mgr(tmp_path / "chain", NEW).load().read_bytes() == b"job 7's"
    mgr(tmp_path / "old", PLAIN).save(40, b"from an older version")
    assert mgr(tmp_path / "old", NEW).load().read_bytes() == b"from an older version"
    assert mgr(tmp_path / "own", PLAIN).load().read_bytes() == b"mine"  # a reader without a token checks nothing


def test_older_manifest_without_owner_field_loads(tmp_path):
    """A checkpoint written before this change (no "owner" key at all) keeps loading."""
    path = mgr(tmp_path, PLAIN).save(3, b"v1")
    doc = json.loads((path / "MANIFEST.json").read_text())
    assert "owner" not in doc
    assert mgr(tmp_path, NEW).load().step == 3 and mgr(tmp_path, NEW).load().owner is None


def test_newer_own_checkpoint_wins_and_older_own_one_is_found_behind_a_foreign_one(tmp_path):
    mgr(tmp_path, NEW).save(10, b"mine 10")
    mgr(tmp_path, OLD).save(600, b"old")
    got = mgr(tmp_path, NEW).load()
    assert (got.step, got.read_bytes()) == (10, b"mine 10")


def test_pruning_neither_counts_nor_deletes_another_jobs_checkpoints(tmp_path):
    old = mgr(tmp_path, OLD, keep=3)
    for s in (560, 580, 600):
        old.save(s, b"old %d" % s)
    new = mgr(tmp_path, NEW, keep=2)
    for s in (20, 40, 60, 80):
        new.save(s, b"new %d" % s)
    steps = sorted(ck.parse_name(n) for n in os.listdir(tmp_path) if ck.parse_name(n) is not None)
    assert steps == [60, 80, 560, 580, 600]  # two of ours kept, all three of theirs untouched
    assert new.load().step == 80


def test_saving_over_another_jobs_step_keeps_theirs_under_another_name(tmp_path, caplog):
    mgr(tmp_path, OLD).save(600, b"old model")
    with caplog.at_level(logging.WARNING):
        mgr(tmp_path, NEW).save(600, b"new model")
    assert mgr(tmp_path, NEW).load().read_bytes() == b"new model"
    kept = [n for n in os.listdir(tmp_path) if n.startswith("ckpt-00000600.foreign-aaaaaaaaaa-")]
    assert len(kept) == 1 and "kept as" in caplog.text
    # never loaded or pruned under that name; renamed back it is the old checkpoint again
    assert ck.parse_name(kept[0]) is None
    mgr(tmp_path, NEW, keep=1).prune(now=1e12)
    assert (tmp_path / kept[0]).is_dir()
    assert ck.verify_checkpoint(tmp_path / kept[0]).reason.startswith("not a checkpoint name")
    # with the foreign one allowed, a re-save simply replaces (nothing kept aside)
    mgr(tmp_path, OLD, allow_foreign=True).save(600, b"old again")
    assert len([n for n in os.listdir(tmp_path) if ".foreign-" in n]) == 1


def test_shards_of_an_earlier_job_with_the_same_id_are_not_mixed_in(tmp_path):
    CheckpointManager(tmp_path, rank=1, world_size=2, environ=OLD).save_shard(3, b"old rank 1")
    with pytest.raises(ck.ShardTimeout):
        CheckpointManager(tmp_path, rank=0, world_size=2, environ=NEW).save_shard(3, b"new 0", timeout=0.1)


def test_resume_point_cli_says_what_it_skipped(tmp_path, monkeypatch, capsys):
    mgr(tmp_path, OLD).save(600, b"old")
    for k, v in NEW.items():
        monkeypatch.setenv(k, v)
    assert ck.main(["resume-point", str(tmp_path)]) == 1
    cap = capsys.readouterr()
    assert cap.out == "" and "skipped ckpt-00000600: written by an earlier job 1" in cap.err
    assert ck.main(["resume-point", "--allow-foreign", str(tmp_path)]) == 0
    assert capsys.readouterr().out.strip() == str(tmp_path / "ckpt-00000600")
