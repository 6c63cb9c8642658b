"""Checkpoint save/load protocol: layout, validation, pruning, shards, and crash safety."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from autoheal.sbatch_helpers import checkpoint as ck
from autoheal.sbatch_helpers.checkpoint import (
    Checkpoint,
    CheckpointError,
    CheckpointManager,
    NoValidCheckpoint,
    ShardTimeout,
    checkpoint_step,
    find_resume_point,
)


def payload_for(step: int) -> bytes:
    return (f"step {step} ".encode() * (step + 1))[: 1000 + step]


def populate(directory: Path, steps, keep=None) -> CheckpointManager:
    mgr = CheckpointManager(directory, keep=keep, rank=0)
    for s in steps:
        mgr.save(s, payload_for(s), {"s": s})
    return mgr


def names(directory: Path) -> list:
    return sorted(os.listdir(directory))


def valid_steps(directory: Path) -> list:
    mgr = CheckpointManager(directory, keep=None, rank=0)
    return [s for s in mgr.checkpoints()
            if isinstance(ck.verify_checkpoint(directory / ck.checkpoint_name(s)), Checkpoint)]


# ---------------------------------------------------------------- layout and round trip


def test_save_layout_and_roundtrip(tmp_path):
    mgr = CheckpointManager(tmp_path, keep=3, rank=0)
    path = mgr.save(42, b"hello", {"loss": 0.5})
    assert path == tmp_path / "ckpt-00000042"
    assert names(tmp_path) == ["ckpt-00000042", "latest"]
    assert sorted(os.listdir(path)) == ["COMPLETE", "MANIFEST.json", "payload.bin"]
    assert (tmp_path / "latest").read_text() == "ckpt-00000042\n"
    manifest = json.loads((path / "MANIFEST.json").read_text())
    assert manifest["step"] == 42 and manifest["metadata"] == {"loss": 0.5}
    assert manifest["files"]["payload.bin"]["size"] == 5
    assert manifest["files"]["payload.bin"]["sha256"] == (
        "2cf24dba5fb0a30e26e83b2ac5b9e29e1b161e5c1fa7425e73043362938b9824"
    )
    got = mgr.load()
    assert (got.step, got.path, got.metadata, got.read_bytes("payload.bin")) == (42, path, {"loss": 0.5}, b"hello")
    assert got.files == ["payload.bin"]
    with pytest.raises(KeyError):
        got.read_bytes("../latest")


def test_callback_and_multi_file_payloads(tmp_path):
    mgr = CheckpointManager(tmp_path, rank=0)
    mgr.save(1, lambda f: f.write(b"via callback"))
    assert mgr.load().read_bytes() == b"via callback"
    mgr.save(2, {"model.bin": b"m", "sub/opt.bin": lambda f: f.write(b"o")})
    got = mgr.load()
    assert got.files == ["model.bin", "sub/opt.bin"]
    assert got.read_bytes("sub/opt.bin") == b"o"


def test_saving_context_manager_publishes_and_cleans_up(tmp_path):
    mgr = CheckpointManager(tmp_path, rank=0)
    with mgr.saving(5, {"a": 1}) as tmp:
        assert tmp.name.startswith(".tmp-ckpt-00000005-")
        (tmp / "model.pt").write_bytes(b"weights")
    assert mgr.load().read_bytes("model.pt") == b"weights"

    with pytest.raises(RuntimeError):
        with mgr.saving(6) as tmp:
            (tmp / "model.pt").write_bytes(b"half")
            raise RuntimeError("boom")
    assert names(tmp_path) == ["ckpt-00000005", "latest"]

    with pytest.raises(CheckpointError, match="nothing was written"):
        with mgr.saving(7):
            pass  # e.g. torch.save(state, "model.pt") into the wrong folder
    assert names(tmp_path) == ["ckpt-00000005", "latest"]
    assert mgr.load().step == 5


@pytest.mark.parametrize("bad", [-1, True, 1.5, "3"])
def test_bad_step_rejected(tmp_path, bad):
    with pytest.raises(CheckpointError):
        CheckpointManager(tmp_path, rank=0).save(bad, b"x")


def test_bad_metadata_and_reserved_names(tmp_path):
    mgr = CheckpointManager(tmp_path, rank=0)
    with pytest.raises(CheckpointError, match="JSON"):
        mgr.save(1, b"x", {"f": object()})
    with pytest.raises(CheckpointError):
        mgr.save(1, {"MANIFEST.json": b"x"})
    with pytest.raises(CheckpointError):
        mgr.save(1, {"../escape": b"x"})
    with pytest.raises(CheckpointError, match="reserved"):
        with mgr.saving(1) as tmp:
            (tmp / "COMPLETE").write_bytes(b"")
    assert not os.path.exists(tmp_path) or names(tmp_path) == []


def test_non_primary_rank_cannot_publish(tmp_path):
    mgr = CheckpointManager(tmp_path, rank=1, world_size=2)
    assert not mgr.is_primary
    with pytest.raises(CheckpointError, match="rank 0"):
        mgr.save(1, b"x")


def test_rank_from_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("SLURM_PROCID", "3")
    monkeypatch.setenv("SLURM_NTASKS", "4")
    mgr = CheckpointManager(tmp_path)
    assert (mgr.rank, mgr.world_size, mgr.is_primary) == (3, 4, False)
    monkeypatch.delenv("SLURM_PROCID")
    monkeypatch.setenv("RANK", "0")
    assert CheckpointManager(tmp_path).is_primary


def test_torchrun_workers_take_their_rank_from_torchrun_not_from_the_srun_task():
    # issue 15, seen on the lab: `srun torchrun --nproc-per-node=2` on 2 nodes; both workers of the first
    # task said rank 0 of world 2 (SLURM_PROCID/SLURM_NTASKS), so two ranks saved checkpoints
    from autoheal.sbatch_helpers.checkpoint import env_rank, env_world_size

    task1 = {"SLURM_PROCID": "1", "SLURM_NTASKS": "2"}
    workers = [dict(task1, RANK=str(r), LOCAL_RANK=str(r - 2), WORLD_SIZE="4") for r in (2, 3)]
    assert [(env_rank(w), env_world_size(w)) for w in workers] == [(2, 4), (3, 4)]
    # plain srun: the task is the rank, whatever RANK a script exported
    assert (env_rank(dict(task1, RANK="0", WORLD_SIZE="1")), env_world_size(dict(task1, WORLD_SIZE="1"))) == (1, 2)


def test_resave_same_step_replaces_torn_copy(tmp_path):
    mgr = populate(tmp_path, [1])
    torn = tmp_path / "ckpt-00000002"
    torn.mkdir()
    (torn / "payload.bin").write_bytes(b"partial")
    mgr.save(2, b"good")
    assert mgr.load().read_bytes() == b"good"
    assert not [n for n in names(tmp_path) if n.startswith(".")]


# ---------------------------------------------------------------- validation and fallback


def test_torn_newest_is_skipped_with_reason(tmp_path):
    mgr = populate(tmp_path, [1, 2])
    (tmp_path / "ckpt-00000002" / "COMPLETE").unlink()
    got = mgr.latest_valid()
    assert got.step == 1
    assert [str(r) for r in mgr.rejections] == ["ckpt-00000002: marker COMPLETE missing (torn or unfinished save)"]


def test_bad_checksum_skipped_but_size_mode_is_fast_and_lenient(tmp_path):
    mgr = populate(tmp_path, [1, 2])
    p = tmp_path / "ckpt-00000002" / "payload.bin"
    data = bytearray(p.read_bytes())
    data[10] ^= 0xFF
    p.write_bytes(bytes(data))
    assert mgr.latest_valid().step == 1
    assert "sha256 mismatch" in str(mgr.rejections[0])
    assert mgr.latest_valid(verify="size").step == 2  # same size: only sha256 catches it
    assert find_resume_point(tmp_path) == tmp_path / "ckpt-00000002"
    assert find_resume_point(tmp_path, verify="sha256") == tmp_path / "ckpt-00000001"


def test_truncated_payload_skipped_in_size_mode(tmp_path):
    mgr = populate(tmp_path, [1, 2])
    p = tmp_path / "ckpt-00000002" / "payload.bin"
    p.write_bytes(p.read_bytes()[:-1])
    assert mgr.latest_valid(verify="size").step == 1
    assert "truncated" in str(mgr.rejections[0])


def test_missing_file_and_missing_manifest(tmp_path):
    mgr = populate(tmp_path, [1, 2, 3])
    (tmp_path / "ckpt-00000003" / "payload.bin").unlink()
    (tmp_path / "ckpt-00000002" / "MANIFEST.json").unlink()
    assert mgr.latest_valid().step == 1
    reasons = [str(r) for r in mgr.rejections]
    assert reasons == ["ckpt-00000003: payload.bin missing", "ckpt-00000002: MANIFEST.json missing"]


def test_manifest_edited_after_marker_is_rejected(tmp_path):
    mgr = populate(tmp_path, [1, 2])
    m = tmp_path / "ckpt-00000002" / "MANIFEST.json"
    doc = json.loads(m.read_text())
    doc["metadata"] = {"edited": True}
    m.write_text(json.dumps(doc))
    assert mgr.latest_valid().step == 1
    assert "does not match" in str(mgr.rejections[0])


def _rewrite_manifest(ckpt: Path, mutate) -> None:
    """Change the manifest and re-sign the marker, as a hostile or buggy writer could."""
    import hashlib

    doc = json.loads((ckpt / "MANIFEST.json").read_text())
    mutate(doc)
    raw = json.dumps(doc).encode()
    (ckpt / "MANIFEST.json").write_bytes(raw)
    (ckpt / "COMPLETE").write_text(json.dumps({"manifest_sha256": hashlib.sha256(raw).hexdigest()}))


@pytest.mark.parametrize(
    "mutate, reason",
    [
        (lambda d: d["files"].update({"../../etc/passwd": {"size": 1, "sha256": "x"}}), "unsafe"),
        (lambda d: d["files"].update({"/etc/passwd": {"size": 1, "sha256": "x"}}), "unsafe"),
        (lambda d: d["files"].update({"payload.bin": "nope"}), "malformed"),
        (lambda d: d.update({"files": []}), "no file list"),
        (lambda d: d.update({"step": 7}), "does not match the directory"),
        (lambda d: d.update({"step": True}), "does not match the directory"),
        (lambda d: d.update({"format": "other"}), "not an"),
    ],
)
def test_hostile_manifest_is_rejected(tmp_path, mutate, reason):
    mgr = populate(tmp_path, [1, 2])
    _rewrite_manifest(tmp_path / "ckpt-00000002", mutate)
    assert mgr.latest_valid().step == 1
    assert reason in str(mgr.rejections[0])


def test_symlink_escaping_checkpoint_is_rejected(tmp_path):
    outside = tmp_path / "outside"
    outside.write_bytes(b"secret")
    d = tmp_path / "ckpts"
    mgr = populate(d, [1, 2])
    p = d / "ckpt-00000002" / "payload.bin"
    size = p.stat().st_size
    p.unlink()
    outside.write_bytes(b"s" * size)
    p.symlink_to(outside)
    assert mgr.latest_valid(verify="size").step == 1
    assert "outside" in str(mgr.rejections[0])
    (d / "ckpt-00000003").symlink_to(d / "ckpt-00000001")
    assert mgr.latest_valid().step == 1
    assert mgr.prune() == [] or (d / "ckpt-00000003").is_symlink()


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    target=st.sampled_from(["MANIFEST.json", "COMPLETE", "payload.bin", "latest"]),
    blob=st.binary(max_size=300),
)
def test_garbage_never_crashes_and_previous_survives(tmp_path_factory, target, blob):
    d = tmp_path_factory.mktemp("garbage")
    mgr = populate(d, [1, 2])
    path = d / "latest" if target == "latest" else d / "ckpt-00000002" / target
    path.write_bytes(blob)
    got = mgr.latest_valid()
    if target in ("latest", "payload.bin") and got.step == 2:
        assert got.read_bytes() == payload_for(2)  # the garbage happened to be harmless
    else:
        assert got.step == 1 and got.read_bytes() == payload_for(1)
    assert find_resume_point(d) is not None


def test_names_that_are_not_ours_are_ignored(tmp_path):
    mgr = populate(tmp_path, [3])
    for n in ["ckpt-42", "ckpt-000000099", "ckpt-abcdefgh", "other", ".hidden"]:
        (tmp_path / n).mkdir()
    (tmp_path / "ckpt-00000099").write_bytes(b"a file, not a folder")
    assert mgr.latest_valid().step == 3
    assert [str(r) for r in mgr.rejections] == ["ckpt-00000099: not a directory"]
    mgr.prune(now=time.time() + 10 * 86400)
    for n in ["ckpt-42", "ckpt-000000099", "ckpt-abcdefgh", "other", ".hidden"]:
        assert (tmp_path / n).exists()


@pytest.mark.parametrize(
    "pointer, note",
    [
        ("ckpt-00000009\n", "names missing ckpt-00000009"),
        ("../elsewhere/ckpt-00000001\n", "not a checkpoint in this directory"),
        ("/etc\n", "not a checkpoint in this directory"),
        ("\x00\xff garbage", "not a checkpoint in this directory"),
    ],
)
def test_pointer_to_missing_or_outside_is_ignored(tmp_path, pointer, note):
    mgr = populate(tmp_path, [1, 2])
    (tmp_path / "latest").write_text(pointer, errors="surrogateescape")
    assert mgr.latest_valid().step == 2
    assert note in str(mgr.rejections[0])
    assert find_resume_point(tmp_path) == tmp_path / "ckpt-00000002"


def test_load_raises_one_line_summary(tmp_path):
    with pytest.raises(NoValidCheckpoint, match="directory does not exist"):
        CheckpointManager(tmp_path / "nope", rank=0).load()
    tmp_path.joinpath("empty").mkdir()
    with pytest.raises(NoValidCheckpoint, match=r"found no ckpt-\* folders"):
        CheckpointManager(tmp_path / "empty", rank=0).load()

    mgr = populate(tmp_path / "d", [1, 2])
    (tmp_path / "d" / "ckpt-00000002" / "COMPLETE").unlink()
    (tmp_path / "d" / "ckpt-00000001" / "payload.bin").write_bytes(b"")
    (tmp_path / "d" / "latest").write_text("ckpt-00000007")
    with pytest.raises(NoValidCheckpoint) as info:
        mgr.load()
    msg = str(info.value)
    assert "\n" not in msg
    assert "rejected 2 candidate(s)" in msg
    assert "latest: names missing ckpt-00000007" in msg
    assert "ckpt-00000002: marker COMPLETE missing" in msg
    assert "ckpt-00000001: payload.bin size 0" in msg


def test_load_specific_step(tmp_path):
    mgr = populate(tmp_path, [1, 2, 3])
    assert mgr.load(2).read_bytes() == payload_for(2)
    with pytest.raises(NoValidCheckpoint, match="for step 5.*ckpt-00000005: missing"):
        mgr.load(5)


def test_open_checkpoint_by_path(tmp_path):
    populate(tmp_path, [4])
    assert ck.open_checkpoint(tmp_path / "ckpt-00000004").step == 4
    with pytest.raises(NoValidCheckpoint, match="not a checkpoint name"):
        ck.open_checkpoint(tmp_path / "latest")


def test_find_resume_point_never_raises(tmp_path):
    assert find_resume_point(None) is None
    assert find_resume_point("") is None
    assert find_resume_point(tmp_path / "missing") is None
    (tmp_path / "file").write_text("x")
    assert find_resume_point(tmp_path / "file") is None
    populate(tmp_path / "d", [1])
    assert find_resume_point(str(tmp_path / "d")) == tmp_path / "d" / "ckpt-00000001"


def test_checkpoint_step():
    assert checkpoint_step("/x/ckpt-00000042") == 42
    assert checkpoint_step(Path("/x/ckpt-00000042/model.pt")) == 42
    assert checkpoint_step("ckpt-123456789") == 123456789
    for bad in ["/x/ckpt-42", "/x/latest", "/x/.tmp-ckpt-00000042-1"]:
        with pytest.raises(ValueError):
            checkpoint_step(bad)


def test_cli(tmp_path, capsys):
    populate(tmp_path, [1, 2])
    assert ck.main(["resume-point", str(tmp_path)]) == 0
    assert capsys.readouterr().out.strip() == str(tmp_path / "ckpt-00000002")
    assert ck.main(["resume-point", str(tmp_path / "none")]) == 1
    assert capsys.readouterr().out == ""
    assert ck.main(["step", str(tmp_path / "ckpt-00000002")]) == 0
    assert capsys.readouterr().out.strip() == "2"
    assert ck.main(["step", "/nope"]) == 2


# ---------------------------------------------------------------- pruning


def test_keep_k_prunes_oldest(tmp_path):
    populate(tmp_path, range(1, 7), keep=3)
    assert names(tmp_path) == ["ckpt-00000004", "ckpt-00000005", "ckpt-00000006", "latest"]


def test_pruning_never_deletes_the_pointer_target(tmp_path):
    mgr = populate(tmp_path, [1, 2, 3], keep=2)
    assert valid_steps(tmp_path) == [2, 3]
    (tmp_path / "latest").write_text("ckpt-00000002\n")  # e.g. an operator pinned an older one
    mgr.save(4, b"x")  # pointer moves to 4; 2 is then surplus
    assert valid_steps(tmp_path) == [3, 4]
    mgr.save(1, b"restarted from scratch")  # the pointer names a lower step than the newest ones
    assert valid_steps(tmp_path) == [1, 3, 4]
    assert (tmp_path / "latest").read_text() == "ckpt-00000001\n"
    (tmp_path / "latest").write_text("ckpt-00000001\n")
    mgr.prune()
    assert 1 in valid_steps(tmp_path)


def test_pruning_counts_only_valid_and_waits_for_stale_age(tmp_path):
    populate(tmp_path, [1, 2, 3])
    mgr = CheckpointManager(tmp_path, keep=2, rank=0)
    (tmp_path / "ckpt-00000003" / "payload.bin").write_bytes(b"")  # corrupt newest
    torn = tmp_path / "ckpt-00000004"
    torn.mkdir()  # renamed but no marker yet: maybe another writer is about to finish it
    leftover = tmp_path / ".tmp-ckpt-00000005-999"
    leftover.mkdir()
    (leftover / "payload.bin").write_bytes(b"partial")
    mgr.prune()
    # keep=2 counts valid ones (2 and 1); young invalid ones and leftovers stay
    assert names(tmp_path) == [".tmp-ckpt-00000005-999", "ckpt-00000001", "ckpt-00000002",
                               "ckpt-00000003", "ckpt-00000004", "latest"]
    mgr.prune(now=time.time() + mgr.stale_age + 60)
    # stale leftovers go; the corrupt ckpt-3 stays only because `latest` names it
    assert names(tmp_path) == ["ckpt-00000001", "ckpt-00000002", "ckpt-00000003", "latest"]
    (tmp_path / "latest").write_text("ckpt-00000002\n")
    mgr.prune(now=time.time() + mgr.stale_age + 60)
    assert names(tmp_path) == ["ckpt-00000001", "ckpt-00000002", "latest"]


def test_pruning_never_deletes_a_save_in_progress(tmp_path):
    mgr = populate(tmp_path, [1, 2], keep=1)
    with mgr.saving(3) as tmp:
        (tmp / "payload.bin").write_bytes(b"three")
        mgr.prune(now=time.time() + 10 * mgr.stale_age)
        assert tmp.is_dir() and (tmp / "payload.bin").exists()
    assert names(tmp_path) == ["ckpt-00000003", "latest"]


def test_keep_none_keeps_everything(tmp_path):
    populate(tmp_path, range(6), keep=None)
    assert valid_steps(tmp_path) == list(range(6))
    with pytest.raises(ValueError):
        CheckpointManager(tmp_path, keep=-1)


# ---------------------------------------------------------------- shards


def _shard_bytes(rank: int) -> bytes:
    return f"rank {rank} weights".encode() * (rank + 1)


def test_shard_protocol_all_ranks(tmp_path):
    world = 4
    results, errors = {}, []

    def run(rank):
        try:
            mgr = CheckpointManager(tmp_path, rank=rank, world_size=world, session="job7")
            if rank == 0:
                time.sleep(0.05)  # rank 0 is not necessarily last or first
            results[rank] = mgr.save_shard(10, _shard_bytes(rank), metadata={"epoch": 1}, timeout=10)
        except Exception as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(r,)) for r in reversed(range(world))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(20)
    assert not errors
    assert results[0] == tmp_path / "ckpt-00000010"
    got = CheckpointManager(tmp_path, rank=0).load()
    assert got.step == 10 and got.metadata == {"epoch": 1}
    assert got.manifest["world_size"] == world
    assert got.shard_names() == [f"shard-{r:05d}-of-00004.bin" for r in range(world)]
    for r in range(world):
        assert got.read_shard(r) == _shard_bytes(r)
    assert names(tmp_path) == ["ckpt-00000010", "latest"]


def test_shard_timeout_publishes_nothing(tmp_path):
    populate(tmp_path, [5])
    CheckpointManager(tmp_path, rank=2, world_size=3, session="s").save_shard(6, b"two")
    mgr = CheckpointManager(tmp_path, rank=0, world_size=3, session="s")
    with pytest.raises(ShardTimeout, match=r"ranks \[1\].*have 2/3"):
        mgr.save_shard(6, b"zero", timeout=0.2)
    assert mgr.latest_valid().step == 5
    # the late rank arrives; rank 0 retries and publishes
    CheckpointManager(tmp_path, rank=1, world_size=3, session="s").save_shard(6, b"one")
    assert mgr.save_shard(6, b"zero", timeout=1) == tmp_path / "ckpt-00000006"
    assert mgr.load().read_shard(1) == b"one"


def test_shards_from_an_earlier_run_are_not_mixed_in(tmp_path, monkeypatch):
    monkeypatch.setenv("SLURM_JOB_ID", "77")
    monkeypatch.setenv("SLURM_RESTART_COUNT", "1")
    CheckpointManager(tmp_path, rank=1, world_size=2).save_shard(3, b"old run")
    monkeypatch.setenv("SLURM_RESTART_COUNT", "2")
    with pytest.raises(ShardTimeout):
        CheckpointManager(tmp_path, rank=0, world_size=2).save_shard(3, b"new", timeout=0.1)
    CheckpointManager(tmp_path, rank=1, world_size=2).save_shard(3, b"new run")
    CheckpointManager(tmp_path, rank=0, world_size=2).save_shard(3, b"new", timeout=1)
    assert CheckpointManager(tmp_path, rank=0).load().read_shard(1) == b"new run"


def test_shard_rank_outside_world(tmp_path):
    with pytest.raises(CheckpointError):
        CheckpointManager(tmp_path, rank=2, world_size=2).save_shard(1, b"x")


# ---------------------------------------------------------------- crash safety (SIGKILL mid-save)

WRITER = textwrap.dedent(
    """
    import os, signal, sys, time
    from autoheal.sbatch_helpers import checkpoint as ck

    directory, mode, arg = sys.argv[1], sys.argv[2], sys.argv[3]

    def payload_for(step):
        return (f"step {step} ".encode() * (step + 1))[: 1000 + step]

    mgr = ck.CheckpointManager(directory, keep=3, rank=0)
    if mode == "point":
        def fault(point):
            if point == arg:
                os.kill(os.getpid(), signal.SIGKILL)
        ck._fault = fault
        mgr.save(4, payload_for(4))
        print("survived", flush=True)
    else:
        step = 4
        while True:
            def slow(f, step=step):
                data = payload_for(step)
                for i in range(0, len(data), 64):
                    f.write(data[i:i + 64]); f.flush(); time.sleep(0.0005)
            mgr.save(step, slow)
            print(f"saved {step}", flush=True)
            step += 1
    """
)

FAULT_POINTS = ["tmp-created", "payload-written", "manifest-written", "marker-written", "renamed", "pointer-written"]


def _run_writer(tmp_path: Path, directory: Path, mode: str, arg: str, kill_after=None):
    script = tmp_path / "writer.py"
    script.write_text(WRITER)
    proc = subprocess.Popen([sys.executable, str(script), str(directory), mode, arg],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if kill_after is not None:
        time.sleep(kill_after)
        proc.kill()
    out, err = proc.communicate(timeout=20)
    return proc.returncode, out, err


def _check_content(directory: Path) -> list:
    steps = valid_steps(directory)
    for s in steps:
        assert ck.open_checkpoint(directory / ck.checkpoint_name(s)).read_bytes() == payload_for(s)
    return steps


@pytest.mark.parametrize("point", FAULT_POINTS)
def test_sigkill_at_each_protocol_step_loses_nothing_valid(tmp_path, point):
    d = tmp_path / "ckpts"
    populate(d, [1, 2, 3], keep=3)
    rc, out, err = _run_writer(tmp_path, d, "point", point)
    assert rc == -9, err
    assert "survived" not in out
    mgr = CheckpointManager(d, keep=3, rank=0)
    got = mgr.latest_valid()
    steps = _check_content(d)
    if point in ("renamed", "pointer-written"):
        assert got.step == 4  # the rename published it complete (marker inside)
        assert steps == [1, 2, 3, 4]  # killed before pruning ran
    else:
        assert got.step == 3 and got.read_bytes() == payload_for(3)
        assert steps == [1, 2, 3]
    # the next run of the job saves again over whatever was left
    mgr.save(4, payload_for(4))
    mgr.save(5, payload_for(5))
    mgr.prune(now=time.time() + 2 * mgr.stale_age)
    assert names(d) == ["ckpt-00000003", "ckpt-00000004", "ckpt-00000005", "latest"]


@settings(max_examples=8, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(delay=st.floats(min_value=0.05, max_value=0.5))
def test_sigkill_at_random_times_keeps_newest_saved(tmp_path_factory, delay):
    base = tmp_path_factory.mktemp("kill")
    d = base / "ckpts"
    populate(d, [1, 2, 3], keep=3)
    rc, out, err = _run_writer(base, d, "loop", "", kill_after=delay)
    assert rc == -9, err
    saved = [int(line.split()[1]) for line in out.splitlines() if line.startswith("saved ")]
    last = saved[-1] if saved else 3
    got = CheckpointManager(d, rank=0).latest_valid()
    assert got.step in (last, last + 1)
    steps = _check_content(d)
    assert {last - 1, last} <= set(steps), (steps, last)
