"""Issue 25 items 2 and 8 (node side), performed as an unprivileged user would: no other user can take the
hooks' locks (node state, health pass, DCGM mapping, journal), a lock held by a stuck root process costs a
bounded wait with a clear outcome, and a symlink planted in a directory another user owns never makes
root write through it (xid-watch's textfile, the state file, the DCGM mapping files).

Real processes as ``nobody`` (``subprocess`` with ``user=``), real ``flock``; needs root."""

from __future__ import annotations

import json
import os
import pwd
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from autoheal.config.hooks_section import HooksSection
from autoheal.hooks import mapping
from autoheal.hooks import state as S
from autoheal.journal import Journal, Record
from autoheal.lockfile import LockDirError, lock_path
from autoheal_lab.testing.hooks import hook_context

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root: the attacker runs as nobody")

#: What the attacker runs: open the file read-only (all flock needs) and take the lock without waiting.
ATTACK = """
import fcntl, os, sys
try:
    fd = os.open(sys.argv[1], os.O_RDONLY)
except OSError as exc:
    print("open:", exc.strerror); sys.exit(3)
try:
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
except OSError as exc:
    print("flock:", exc.strerror); sys.exit(4)
print("locked"); sys.exit(0)
"""


def as_nobody(code: str, *args: str) -> subprocess.CompletedProcess:
    # the system python: the worktree's venv need not be readable by nobody
    return subprocess.run(["/usr/bin/python3", "-c", code, *args], user="nobody", group="nogroup",
                          capture_output=True, text=True, timeout=20, cwd="/")


@pytest.fixture
def world(tmp_path_factory):
    """A directory tree like /var/lib/autoheal: root's, 0755 (pytest's own tmp dirs are 0700 to others,
    which would make every attack fail for the wrong reason)."""
    root = Path(tempfile.mkdtemp(prefix="autoheal-sec-", dir="/tmp"))
    os.chmod(root, 0o755)
    yield root
    shutil.rmtree(root, ignore_errors=True)


def hold(path: Path) -> subprocess.Popen:
    """A root process that holds the lock ``path`` (a hook stopped mid-update) until killed."""
    code = ("import fcntl, os, sys, time\nfd = os.open(sys.argv[1], os.O_RDWR)\nfcntl.flock(fd, fcntl.LOCK_EX)\n"
            "print('held', flush=True)\ntime.sleep(120)\n")
    proc = subprocess.Popen([sys.executable, "-c", code, str(path)], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "held"
    return proc


def stop(proc: subprocess.Popen) -> None:
    proc.kill()
    proc.wait(timeout=10)
    proc.stdout.close()


def make_locks(world: Path) -> dict:
    """Every lock the node side takes, taken once by root as the hooks do; name -> lock file."""
    state_dir = world / "node"
    store = S.NodeState(str(state_dir))
    with store.locked() as st:
        st["passes"] = 1
    with store.pass_lock(1.0):
        pass
    maps = world / "dcgm"
    mapping.add_job(str(maps), "42", [0], str(state_dir))
    j = Journal(world / "journal.jsonl", fsync=False)
    j.append(Record(event="x"))
    return {"state": state_dir / "locks" / "state.lock", "pass": state_dir / "locks" / "pass.lock",
            "dcgm-mapping": state_dir / "locks" / mapping.LOCK_NAME, "journal": j.lock_path()}


def test_no_other_user_can_take_any_lock_of_the_hooks(world):
    locks = make_locks(world)
    # the harness reaches the tree: nobody CAN flock the world-readable data files, which is what the old
    # lock files were (0644 under 0755) and what the journal itself still is
    for readable in (world / "node" / "state.json", world / "journal.jsonl", world / "dcgm" / "0"):
        got = as_nobody(ATTACK, str(readable))
        assert got.returncode == 0 and got.stdout.strip() == "locked", (readable, got)
    for name, path in locks.items():
        assert path.exists(), name
        assert oct(path.stat().st_mode & 0o777) == "0o600" and oct(path.parent.stat().st_mode & 0o777) == "0o700"
        got = as_nobody(ATTACK, str(path))
        assert got.returncode == 3 and "Permission denied" in got.stdout, (name, got)


def test_a_lock_dir_planted_by_another_user_is_refused(world):
    state_dir = world / "node"
    state_dir.mkdir()
    os.chmod(state_dir, 0o777)  # a state dir an admin made writable by mistake
    nobody = pwd.getpwnam("nobody").pw_uid
    got = as_nobody("import os, sys; os.mkdir(sys.argv[1], 0o777); os.chmod(sys.argv[1], 0o777)",
                    str(state_dir / "locks"))
    assert got.returncode == 0, got
    assert (state_dir / "locks").stat().st_uid == nobody
    with pytest.raises(LockDirError, match="owned by uid"):
        with S.NodeState(str(state_dir)).pass_lock(1.0):
            pass
    store = S.NodeState(str(state_dir), fallback=True)  # the hooks: their own trouble, in memory
    with store.locked() as st:
        st["passes"] = 5
    assert "owned by uid" in store.trouble and store.read()["passes"] == 5
    assert not (state_dir / "state.json").exists()  # nothing written under a lock nobody could fake


def test_held_locks_give_bounded_waits_with_clear_outcomes(world, capsys):
    locks = make_locks(world)
    state_dir = world / "node"
    holders = {name: hold(path) for name, path in locks.items()}
    try:
        # node state: the hook goes on with an in-memory copy and says why
        store = S.NodeState(str(state_dir), lock_timeout=0.3, fallback=True)
        with store.locked() as st:
            st["passes"] = 7
        assert "state.lock" in store.trouble and store.read()["passes"] == 7
        # health pass: TimeoutError, which the healthcheck turns into exit 2 ("could not tell")
        with pytest.raises(TimeoutError, match="another health pass has run for over 0.3s"):
            with store.pass_lock(0.3):
                pass
        # DCGM mapping: updated without the lock, the trouble returned for the prolog to report (jobhook)
        trouble = mapping.add_job(str(world / "dcgm"), "43", [0], str(state_dir), timeout=0.3)
        assert "held by another prolog or epilog for 0.3s; updated without it" in trouble
        assert (world / "dcgm" / "0").read_text().split() == ["42", "43"]
        # journal: the record is written without the lock, never dropped
        j = Journal(world / "journal.jsonl", fsync=False, lock_timeout=0.3)
        assert j.record("drain", node="gpu1") is not None
        assert "record written without the lock" in capsys.readouterr().err
        assert [r.event for r in j.read()] == ["x", "drain"]
    finally:
        for proc in holders.values():
            stop(proc)
    with store.locked() as st:  # released: the in-memory copy is written back
        pass
    assert store.trouble == "" and json.loads((state_dir / "state.json").read_text())["passes"] == 7


def test_prolog_mapping_lock_timeout_is_reported_and_the_mapping_still_written(world, monkeypatch, capsys):
    from autoheal.hooks import jobhook

    locks = make_locks(world)
    holder = hold(locks["dcgm-mapping"])
    try:
        monkeypatch.setattr(mapping, "LOCK_TIMEOUT", 0.3)
        ctx = hook_context(HooksSection(prolog_slurm_timeout=0.5), node="gpu1", state_dir=str(world / "node"))
        monkeypatch.setenv("SLURM_JOB_GPUS", "0")
        jobhook._write_mapping(ctx, "44", str(world / "dcgm"))  # returns: the prolog does not hang
    finally:
        stop(holder)
    assert "dcgm mapping" in capsys.readouterr().err
    recs = ctx.records
    assert recs and recs[0][1]["action"] == "hook-trouble" and "0.3s" in recs[0][1]["message"]
    assert (world / "dcgm" / "0").read_text().split() == ["42", "44"]  # the job is in the mapping all the same


# ---- planted symlinks: xid-watch's textfile, the state file, the mapping ---------------------------

def plant(directory: Path, names, target: Path) -> None:
    """As ``nobody`` (who owns ``directory``): symlinks at ``names`` pointing at ``target``."""
    code = "import os, sys\nfor n in sys.argv[2:]:\n    os.symlink(sys.argv[1], n)\n"
    got = as_nobody(code, str(target), *[str(directory / n) for n in names])
    assert got.returncode == 0, got


def test_planted_symlinks_in_the_textfile_dir_never_make_root_write_through_them(world):
    from autoheal.hooks.xid_watch import METRICS_FILE, XidWatch

    target = world / "precious"
    target.write_text("root's file\n")
    textfile = world / "textfile"
    textfile.mkdir()
    os.chown(textfile, pwd.getpwnam("nobody").pw_uid, -1)  # node-exporter's directory, not root's
    # the fixed temporary name older releases used, and the final name
    plant(textfile, [f".{METRICS_FILE}.tmp", METRICS_FILE], target)
    h = HooksSection(state_dir=str(world / "node"), kernel_log="", textfile_dir=str(textfile), dcgm_mapping_dir="")
    ctx = hook_context(h, node="gpu1", source="xid-watch")
    XidWatch(ctx).write_metrics()
    assert target.read_text() == "root's file\n"
    out = textfile / METRICS_FILE
    assert not out.is_symlink() and "autoheal_xid_watch_up" in out.read_text()
    assert oct(out.stat().st_mode & 0o777) == "0o644"  # node-exporter reads it
    assert [p.name for p in textfile.iterdir() if p.name.endswith(".tmp") and not p.is_symlink()] == []


def test_planted_symlinks_for_the_state_and_mapping_files_are_replaced_not_followed(world):
    target = world / "precious"
    target.write_text("root's file\n")
    state_dir, maps = world / "node", world / "dcgm"
    for d in (state_dir, maps):
        d.mkdir()
        os.chown(d, pwd.getpwnam("nobody").pw_uid, -1)  # a directory another user controls
    # the final names, and the fixed temporary name older releases wrote the state through
    plant(state_dir, [S.STATE_FILE, f".{S.STATE_FILE}.{os.getpid()}.tmp"], target)
    plant(maps, ["0", "1"], target)
    store = S.NodeState(str(state_dir))
    with store.locked() as st:
        st["passes"] = 3
    mapping.add_job(str(maps), "45", [0, 1], str(world / "node-root"))
    mapping.remove_job(str(maps), "45", str(world / "node-root"))
    assert target.read_text() == "root's file\n"
    assert json.loads((state_dir / S.STATE_FILE).read_text())["passes"] == 3
    assert not (maps / "0").is_symlink() and (maps / "0").read_text() == "" and not (maps / "1").is_symlink()


def test_the_journal_is_not_written_through_a_symlink(world):
    target = world / "precious"
    target.write_text("root's file\n")
    (world / "journal.jsonl").symlink_to(target)
    from autoheal.errors import JournalError

    with pytest.raises(JournalError, match="cannot open for writing"):
        Journal(world / "journal.jsonl", fsync=False).append(Record(event="x"))
    assert target.read_text() == "root's file\n"


def test_lock_path_is_beside_the_data():
    assert lock_path("/var/lib/autoheal/node", "state.lock") == Path("/var/lib/autoheal/node/locks/state.lock")
