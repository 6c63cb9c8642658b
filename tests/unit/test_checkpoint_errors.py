"""Finding 13: a save that fails on the filesystem raises CheckpointIOError (one line naming the path and
the cause), never a raw OSError, and never costs the newest valid checkpoint; concurrent savers into one
folder do not break each other.

Faults are injected three ways: at each protocol step (``ck._fault``), at every single filesystem call
of a save (one failing call per run), and for real (a full tmpfs, a read-only remount, RLIMIT_FSIZE).
"""

from __future__ import annotations

import errno
import logging
import os
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest

from autoheal.sbatch_helpers import checkpoint as ck
from autoheal.sbatch_helpers.checkpoint import (
    CheckpointError,
    CheckpointIOError,
    CheckpointManager,
    find_resume_point,
)


def payload_for(step: int, tag: str = "") -> bytes:
    return (f"step {step} {tag} ".encode() * (step + 1))[: 1000 + step]


def populate(directory: Path, steps, keep=3) -> CheckpointManager:
    mgr = CheckpointManager(directory, keep=keep, rank=0)
    for s in steps:
        mgr.save(s, payload_for(s))
    return mgr


def newest(directory: Path):
    got = CheckpointManager(directory, keep=None, rank=0).latest_valid(verify="sha256")
    return (got.step, got.read_bytes()) if got else None


def leftovers(directory: Path) -> list:
    return sorted(n for n in os.listdir(directory) if n.startswith("."))


def assert_one_line(exc: BaseException, *parts: str) -> None:
    msg = str(exc)
    assert "\n" not in msg, msg
    for p in parts:
        assert p in msg, msg


# ---------------------------------------------------------------- at each protocol step

PRE_PUBLISH = ["tmp-created", "payload-written", "manifest-written", "marker-written"]
POST_PUBLISH = ["renamed", "pointer-written"]


@pytest.mark.parametrize("code", [errno.ENOSPC, errno.EROFS, errno.EFBIG, errno.EIO])
@pytest.mark.parametrize("point", PRE_PUBLISH + POST_PUBLISH)
def test_failure_at_each_step_is_a_checkpoint_io_error_and_keeps_the_newest(tmp_path, monkeypatch, point, code,
                                                                              caplog):
    d = tmp_path / "ck"
    mgr = populate(d, [1, 2, 3])

    def fault(p):
        if p == point:
            raise OSError(code, os.strerror(code))

    monkeypatch.setattr(ck, "_fault", fault)
    if point in PRE_PUBLISH:
        with pytest.raises(CheckpointIOError) as info:
            mgr.save(4, payload_for(4))
        exc = info.value
        assert isinstance(exc, CheckpointError) and isinstance(exc, OSError) and exc.errno == code
        assert_one_line(exc, f"checkpoint step 4 not saved in {d}", os.strerror(code), errno.errorcode[code])
        assert newest(d) == (3, payload_for(3))
        assert leftovers(d) == []  # the temporary folder went with the failure
    else:  # published: the save succeeded; the trouble after it is logged
        with caplog.at_level(logging.WARNING):
            assert mgr.save(4, payload_for(4)) == d / "ckpt-00000004"
        assert newest(d) == (4, payload_for(4))
        assert os.strerror(code) in caplog.text


@pytest.mark.parametrize("point", PRE_PUBLISH)
def test_failed_resave_of_the_newest_step_keeps_the_old_copy(tmp_path, monkeypatch, point):
    d = tmp_path / "ck"
    mgr = populate(d, [1, 2, 3])
    monkeypatch.setattr(ck, "_fault", lambda p: (_ for _ in ()).throw(OSError(errno.ENOSPC, "full"))
                        if p == point else None)
    with pytest.raises(CheckpointIOError):
        mgr.save(3, payload_for(3, "again"))
    assert newest(d) == (3, payload_for(3))


@pytest.mark.parametrize("exchange", [True, False], ids=["renameat2", "no-exchange"])
def test_resave_of_a_step_replaces_it_without_a_gap(tmp_path, monkeypatch, exchange):
    d = tmp_path / "ck"
    mgr = populate(d, [1, 2, 3])
    if not exchange:
        monkeypatch.setattr(ck, "_exchange", lambda a, b: False)
    assert mgr.save(3, payload_for(3, "again")) == d / "ckpt-00000003"
    assert newest(d) == (3, payload_for(3, "again"))
    assert leftovers(d) == []


def test_no_exchange_fallback_puts_the_old_copy_back_when_publishing_fails(tmp_path, monkeypatch):
    d = tmp_path / "ck"
    mgr = populate(d, [1, 2, 3])
    monkeypatch.setattr(ck, "_exchange", lambda a, b: False)
    real_rename = os.rename

    def rename(src, dst, *a, **kw):
        if Path(src).name.startswith(".tmp-ckpt-00000003"):
            raise OSError(errno.EIO, "Input/output error")
        return real_rename(src, dst, *a, **kw)

    monkeypatch.setattr(os, "rename", rename)
    with pytest.raises(CheckpointIOError, match=r"publishing .*ckpt-00000003: Input/output error \(EIO\)"):
        mgr.save(3, payload_for(3, "again"))
    assert newest(d) == (3, payload_for(3))
    assert leftovers(d) == []


# ---------------------------------------------------------------- one failing filesystem call, every call

WRAPPED = ["open", "fsync", "replace", "rename", "mkdir", "listdir", "scandir", "lstat", "fstat", "unlink"]


class FailNth:
    """Make the n-th call (over all wrapped os functions) raise ENOSPC; count calls when n is None."""

    def __init__(self, monkeypatch, n=None):
        self.n, self.calls, self.failed = n, 0, None
        for name in WRAPPED:
            monkeypatch.setattr(os, name, self._wrap(name, getattr(os, name)))

    def _wrap(self, name, real):
        def call(*a, **kw):
            self.calls += 1
            if self.calls == self.n:
                self.failed = name
                raise OSError(errno.ENOSPC, "No space left on device",
                              a[0] if a and isinstance(a[0], (str, Path)) else None)
            return real(*a, **kw)
        return call


@pytest.mark.parametrize("step", [4, 3], ids=["new-step", "resave-newest"])
def test_any_single_failing_call_either_saves_or_raises_checkpoint_io_error(tmp_path, monkeypatch, step):
    base = tmp_path / "base"
    populate(base, [1, 2, 3])
    probe = tmp_path / "probe"
    import shutil

    shutil.copytree(base, probe)
    with monkeypatch.context() as m:
        counter = FailNth(m)
        CheckpointManager(probe, keep=3, rank=0).save(step, payload_for(step, "new"))
        total = counter.calls
    assert total > 10
    outcomes = set()
    for n in range(1, total + 1):
        d = tmp_path / f"run{n}"
        shutil.copytree(base, d)
        mgr = CheckpointManager(d, keep=3, rank=0)
        with monkeypatch.context() as m:
            fail = FailNth(m, n)
            try:
                mgr.save(step, payload_for(step, "new"))
                raised = None
            except CheckpointIOError as exc:
                raised = exc
        # (any other exception type fails the test here)
        if raised is None:
            assert newest(d) == (step, payload_for(step, "new")), (n, fail.failed)
        else:
            assert "\n" not in str(raised) and str(raised).startswith(f"checkpoint step {step} not saved in ")
            assert newest(d) == (3, payload_for(3)), (n, fail.failed, str(raised))
        outcomes.add(raised is None)
    assert outcomes == {True, False}  # both kinds of failure points exist


# ---------------------------------------------------------------- for real: full disk, read-only, RLIMIT_FSIZE


@pytest.fixture
def small_tmpfs(tmp_path):
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    res = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(mnt)], capture_output=True,
                         text=True, timeout=30)
    if res.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {res.stderr.strip()}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], capture_output=True, timeout=30)


def test_full_disk(small_tmpfs):
    d = small_tmpfs / "ck"
    mgr = populate(d, [1, 2, 3])
    with pytest.raises(CheckpointIOError) as info:
        mgr.save(4, os.urandom(512 * 1024))
    assert info.value.errno == errno.ENOSPC
    assert_one_line(info.value, f"checkpoint step 4 not saved in {d}", "No space left on device (ENOSPC)",
                    str(d / ".tmp-ckpt-00000004-"))
    assert newest(d) == (3, payload_for(3))
    assert leftovers(d) == []
    assert mgr.save(4, payload_for(4)) == d / "ckpt-00000004"  # space is back: saving works again


def test_full_disk_while_the_caller_writes_into_saving(small_tmpfs):
    d = small_tmpfs / "ck"
    mgr = populate(d, [1])
    with pytest.raises(CheckpointIOError, match=r"not saved in .*/ck: writing into .*/ck/\.tmp-ckpt-00000002-\S+: "
                                                r"No space left on device \(ENOSPC\)$"):
        with mgr.saving(2) as tmp:
            (tmp / "model.pt").write_bytes(os.urandom(512 * 1024))
    assert newest(d) == (1, payload_for(1)) and leftovers(d) == []


def test_read_only_filesystem(small_tmpfs):
    d = small_tmpfs / "ck"
    populate(d, [1, 2])
    subprocess.run(["mount", "-o", "remount,ro", str(small_tmpfs)], check=True, timeout=30)
    mgr = CheckpointManager(d, keep=3, rank=0)
    with pytest.raises(CheckpointIOError) as info:
        mgr.save(3, payload_for(3))
    assert info.value.errno == errno.EROFS
    assert_one_line(info.value, f"checkpoint step 3 not saved in {d}", "Read-only file system (EROFS)")
    assert newest(d) == (2, payload_for(2))
    assert find_resume_point(d) == d / "ckpt-00000002"
    with pytest.raises(CheckpointIOError, match="EROFS"):
        CheckpointManager(small_tmpfs / "new", rank=0).save(1, b"x")


def test_rlimit_fsize(tmp_path):
    d = tmp_path / "ck"
    populate(d, [1, 2])
    script = textwrap.dedent(f"""
        import resource
        from autoheal.sbatch_helpers import checkpoint as ck
        mgr = ck.CheckpointManager({str(d)!r}, keep=3, rank=0)
        resource.setrlimit(resource.RLIMIT_FSIZE, (64 * 1024, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))
        try:
            mgr.save(3, b"x" * (256 * 1024))
        except ck.CheckpointIOError as exc:
            print("CheckpointIOError", exc.errno, exc)
    """)
    res = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    assert res.stdout.startswith(f"CheckpointIOError {errno.EFBIG} checkpoint step 3 not saved in {d}: "), res.stdout
    assert "File too large (EFBIG)" in res.stdout and res.stdout.count("\n") == 1
    assert newest(d) == (2, payload_for(2)) and leftovers(d) == []


# ---------------------------------------------------------------- what is in the folder's place


def test_checkpoint_folder_is_a_file_or_fifo(tmp_path):
    f = tmp_path / "file"
    f.write_text("x")
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    for path in (f, fifo, tmp_path / "file" / "sub"):
        with pytest.raises(CheckpointIOError) as info:
            CheckpointManager(path, rank=0).save(1, b"x")
        assert_one_line(info.value, f"checkpoint step 1 not saved in {path}")
        assert info.value.errno == errno.ENOTDIR


def test_a_directory_named_latest_does_not_stop_saving(tmp_path, caplog):
    d = tmp_path / "ck"
    mgr = populate(d, [1])
    (d / "latest").unlink()
    (d / "latest").mkdir()
    with caplog.at_level(logging.WARNING):
        assert mgr.save(2, payload_for(2)) == d / "ckpt-00000002"
    assert "pointer" in caplog.text and "not updated" in caplog.text
    assert newest(d) == (2, payload_for(2))
    assert find_resume_point(d) == d / "ckpt-00000002"


def test_unique_temporary_names(tmp_path):
    names = {ck._unique() for _ in range(1000)}
    assert len(names) == 1000 and all(n.startswith(f"{os.getpid()}-") for n in names)


# ---------------------------------------------------------------- concurrent savers


def test_threads_saving_into_one_folder_do_not_break_each_other(tmp_path):
    d = tmp_path / "ck"
    errors = []

    def run(worker):
        try:
            mgr = CheckpointManager(d, keep=3, rank=0)
            for step in range(40):
                if step % 4 == worker or step % 10 == 0:  # some steps saved by every thread at once
                    mgr.save(step, payload_for(step))
        except Exception as exc:
            errors.append(repr(exc))

    threads = [threading.Thread(target=run, args=(w,)) for w in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors, errors
    assert newest(d) == (39, payload_for(39))
    for n in os.listdir(d):
        if ck.parse_name(n) is not None:
            assert isinstance(ck.verify_checkpoint(d / n, "sha256"), ck.Checkpoint), n
    assert leftovers(d) == []


WRITER = textwrap.dedent("""
    import sys
    from autoheal.sbatch_helpers import checkpoint as ck
    directory, worker = sys.argv[1], int(sys.argv[2])
    mgr = ck.CheckpointManager(directory, keep=3, rank=0)
    for step in range(60):
        data = (f"step {step}  ".encode() * (step + 1))[: 1000 + step]
        mgr.save(step, data, {"worker": worker})   # every process saves every step: two runs of one job
    print("done", flush=True)
""")


def test_processes_saving_the_same_steps_into_one_folder(tmp_path):
    """Two runs of one job alive at once (e.g. a requeue while the old run is still being killed)."""
    d = tmp_path / "ck"
    script = tmp_path / "writer.py"
    script.write_text(WRITER)
    procs = [subprocess.Popen([sys.executable, str(script), str(d), str(w)], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for w in range(3)]
    results = [p.communicate(timeout=180) for p in procs]
    for p, (out, err) in zip(procs, results):
        assert p.returncode == 0 and out == "done\n", err[-3000:]
    got = CheckpointManager(d, rank=0).load(verify="sha256")
    assert got.step == 59 and got.read_bytes() == (b"step 59  " * 60)[:1059]
    for n in os.listdir(d):
        if ck.parse_name(n) is not None:
            assert isinstance(ck.verify_checkpoint(d / n, "sha256"), ck.Checkpoint), n
    assert leftovers(d) == []
