"""Finding 7: a FIFO (or socket, device, folder) where the checkpoint code expects a regular file.

A FIFO named ``latest`` made ``find_resume_point`` -- and with it the job runner -- block forever in
``open()``. Every reader must treat such names as invalid (with a logged reason) and go on; nothing may
block. Each call runs in a thread with a bounded wait; if it blocks, the test opens the FIFOs for writing
(which releases a reader stuck in ``open()``) and fails.
"""

from __future__ import annotations

import os
import socket
import stat
import threading
from pathlib import Path

import pytest

from autoheal.sbatch_helpers import checkpoint as ck
from autoheal.sbatch_helpers.checkpoint import CheckpointError, CheckpointManager, find_resume_point

NAMES = ["latest", "ckpt-00000002/COMPLETE", "ckpt-00000002/MANIFEST.json", "ckpt-00000002/payload.bin",
         "ckpt-00000002"]
KINDS = ["fifo", "socket", "directory", "chardev"]


def _make(path: Path, kind: str, keep: list) -> None:
    if path.is_dir() and not path.is_symlink():
        import shutil

        shutil.rmtree(path)
    elif os.path.lexists(path):
        path.unlink()
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "socket":
        s = socket.socket(socket.AF_UNIX)
        s.bind(str(path))
        keep.append(s)
    elif kind == "directory":
        path.mkdir()
    elif kind == "chardev":
        if os.geteuid() != 0:
            pytest.skip("mknod needs root")
        os.mknod(path, 0o600 | stat.S_IFCHR, os.makedev(1, 3))  # like /dev/null


def _bounded(fn, fifos, timeout=15.0):
    box = {}

    def run():
        try:
            box["value"] = fn()
        except BaseException as exc:
            box["error"] = exc

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(timeout)
    if t.is_alive():
        for f in fifos:  # release a reader stuck in open() so the thread can end
            try:
                os.close(os.open(f, os.O_WRONLY | os.O_NONBLOCK))
            except OSError:
                pass
        t.join(5)
        pytest.fail(f"{getattr(fn, '__name__', fn)} blocked on a special file")
    if "error" in box:
        raise box["error"]
    return box.get("value")


@pytest.fixture
def sockets():
    keep: list = []
    yield keep
    for s in keep:
        s.close()


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("name", NAMES)
def test_special_files_never_block_and_are_rejected(tmp_path, name, kind, sockets, caplog):
    if name == "ckpt-00000002" and kind == "directory":
        pytest.skip("a folder is what a checkpoint is (an empty one is the torn case, tested elsewhere)")
    mgr = CheckpointManager(tmp_path, keep=3, rank=0)
    mgr.save(1, b"one")
    mgr.save(2, b"two")
    target = tmp_path / name
    _make(target, kind, sockets)
    fifos = [target] if kind == "fifo" else []

    # what the job runner calls
    found = _bounded(lambda: find_resume_point(tmp_path), fifos)
    found_sha = _bounded(lambda: find_resume_point(tmp_path, verify="sha256"), fifos)
    if name == "latest":  # the pointer is only a hint: the newest checkpoint is still found
        assert found == found_sha == tmp_path / "ckpt-00000002"
    else:
        assert found == found_sha == tmp_path / "ckpt-00000001"

    # what the user's code calls
    got = _bounded(lambda: mgr.latest_valid(), fifos)
    assert got.step == (2 if name == "latest" else 1)
    reasons = " ".join(str(r) for r in mgr.rejections)
    nice = {"fifo": "a FIFO", "socket": "a socket", "directory": "a directory", "chardev": "a character device"}
    assert nice[kind] in reasons, reasons
    assert any(nice[kind] in rec.getMessage() for rec in caplog.records), "rejections are logged as warnings"
    assert _bounded(lambda: ck.read_latest_pointer(tmp_path), fifos) in (None, "ckpt-00000002")
    assert _bounded(lambda: ck.main(["resume-point", str(tmp_path)]), fifos) == 0
    _bounded(lambda: mgr.prune(), fifos)
    # saving goes on: a special `latest` is replaced by the pointer file (a folder cannot be: logged, see
    # test_checkpoint_errors.py); one inside ckpt-2 is left alone
    assert _bounded(lambda: mgr.save(3, b"three"), fifos) == tmp_path / "ckpt-00000003"
    assert _bounded(lambda: mgr.load().read_bytes(), fifos) == b"three"
    if not (name == "latest" and kind == "directory"):
        assert (tmp_path / "latest").read_text() == "ckpt-00000003\n"


def test_fifo_swapped_in_after_verification_does_not_block_reading(tmp_path):
    mgr = CheckpointManager(tmp_path, rank=0)
    got = mgr.save(1, b"one") and mgr.load()
    payload = tmp_path / "ckpt-00000001" / "payload.bin"
    payload.unlink()
    os.mkfifo(payload)
    with pytest.raises(ck.NotRegularFile, match="FIFO"):
        _bounded(lambda: got.read_bytes(), [payload])
    with pytest.raises(ck.NoValidCheckpoint, match="payload.bin is a FIFO"):
        _bounded(lambda: ck.open_checkpoint(tmp_path / "ckpt-00000001"), [payload])


def test_fifo_made_inside_a_save_fails_the_save_instead_of_blocking(tmp_path):
    mgr = CheckpointManager(tmp_path, rank=0)
    mgr.save(1, b"one")

    def save_with_fifo():
        with mgr.saving(2) as tmp:
            (tmp / "model.bin").write_bytes(b"m")
            os.mkfifo(tmp / "pipe")

    with pytest.raises(CheckpointError, match="pipe in the checkpoint is a FIFO"):
        _bounded(save_with_fifo, [])
    assert mgr.latest_valid().step == 1
    assert sorted(os.listdir(tmp_path)) == ["ckpt-00000001", "latest"]


def test_checkpoint_folder_itself_a_fifo(tmp_path):
    d = tmp_path / "ck"
    os.mkfifo(d)
    assert _bounded(lambda: find_resume_point(d), [d]) is None
    assert _bounded(lambda: CheckpointManager(d, rank=0).latest_valid(), [d]) is None
    with pytest.raises(CheckpointError, match="not a directory"):
        _bounded(lambda: CheckpointManager(d, rank=0).save(1, b"x"), [d])


def test_symlinked_folder_on_the_way_to_a_payload_is_rejected(tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    d = tmp_path / "ck"
    mgr = CheckpointManager(d, rank=0)
    mgr.save(1, {"sub/w.bin": b"w"})
    mgr.save(2, {"sub/w.bin": b"v"})
    sub = d / "ckpt-00000002" / "sub"
    (outside / "w.bin").write_bytes(b"v")
    import shutil

    shutil.rmtree(sub)
    sub.symlink_to(outside)
    assert mgr.latest_valid().step == 1
    assert "through the symlink sub" in str(mgr.rejections[0])
    sub.unlink()
    sub.symlink_to(sub)  # a loop: Path.resolve() raised RuntimeError on some Pythons
    assert mgr.latest_valid().step == 1
