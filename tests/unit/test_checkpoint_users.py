"""Issue 25 item 8: a checkpoint another user planted or swapped in is never resumed (a pickle is code).

Each attack is made by a real unprivileged process (a forked child that drops to another uid), against
a victim that is a second unprivileged uid; the folders live in a fresh root-owned 0755 folder under
/tmp, as a job submitted from /tmp would have them. Root is needed to switch uids: skipped otherwise.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import stat
import tempfile
import traceback
from pathlib import Path

import pytest

from autoheal.sbatch_helpers.checkpoint import (
    CheckpointManager,
    NoValidCheckpoint,
    Owner,
    find_resume_point,
    open_checkpoint,
)
from autoheal.sbatch_helpers.ckpt_trust import TRUSTED_UIDS_ENV, path_problem, trusted_uids

ATTACKER = 65534  # nobody
VICTIM = 23456
VICTIM_ENV = {"SLURM_JOB_ID": "7", "AUTOHEAL_SUBMIT_TOKEN": "victimtok1"}

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="switching to unprivileged uids needs root")


def as_user(uid, fn, *args):
    """Run ``fn(*args)`` in a forked child running as ``uid`` (gid the same, no groups); its JSON result."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never return into pytest
        os.close(r)
        code = 0
        try:
            os.setgroups([])
            os.setgid(uid)
            os.setuid(uid)
            out = {"ok": fn(*args)}
        except BaseException:
            out = {"error": traceback.format_exc()}
            code = 1
        with os.fdopen(w, "w") as fh:
            json.dump(out, fh, default=str)
        os._exit(code)
    os.close(w)
    with os.fdopen(r) as fh:
        data = fh.read()
    os.waitpid(pid, 0)
    out = json.loads(data)
    assert "error" not in out, out["error"]
    return out["ok"]


@pytest.fixture
def base():
    d = Path(tempfile.mkdtemp(prefix="autoheal-ckusers-", dir="/tmp"))
    d.chmod(0o755)
    yield d
    shutil.rmtree(d, ignore_errors=True)


def shared_tmp(base: Path, mode=0o1777) -> Path:
    """A folder like /tmp (root's, everyone may write; sticky unless ``mode`` says otherwise)."""
    d = base / "tmp"
    d.mkdir()
    d.chmod(mode)
    return d


def save(directory, step, payload, env=None, owner=None):
    mgr = CheckpointManager(directory, rank=0, keep=None, environ=env or {},
                            **({"owner": owner} if owner is not None else {}))
    return str(mgr.save(step, payload.encode()))


def resume(directory, env=VICTIM_ENV):
    rejections = []
    found = find_resume_point(directory, environ=env, rejections=rejections)
    return [str(found) if found else None, [str(r) for r in rejections]]


def rewrite_manifest(ckpt, change):
    """Edit MANIFEST.json with ``change(doc)`` and re-seal COMPLETE, as anyone who can write there can."""
    ckpt = Path(ckpt)
    doc = json.loads((ckpt / "MANIFEST.json").read_text())
    change(doc)
    raw = (json.dumps(doc, indent=1, sort_keys=True) + "\n").encode()
    (ckpt / "MANIFEST.json").write_bytes(raw)
    (ckpt / "COMPLETE").write_bytes(json.dumps({"step": doc["step"],
                                                "manifest_sha256": hashlib.sha256(raw).hexdigest()}).encode())


def swap_in_own(parent, name, step):
    """The attacker moves the victim's folder away and puts a folder of theirs in its place, holding a
    checkpoint that copies the victim's owner (token and job id are readable) and claims the victim's uid."""
    parent = Path(parent)
    victim_ck = json.loads(next((parent / name).glob("ckpt-*/MANIFEST.json")).read_text())
    os.rename(parent / name, parent / f"{name}.moved")
    path = save(parent / name, step, "attacker's pickle", owner=Owner.from_json(victim_ck["owner"]))
    rewrite_manifest(path, lambda d: d.update(uid=VICTIM))
    return path


def test_swapped_folder_under_a_parent_another_user_made_is_refused(base):
    """A job submitted from /tmp: its default folder is /tmp/autoheal-checkpoints/<id>-<token>. Another
    user made /tmp/autoheal-checkpoints first; they swap the job's folder for theirs."""
    tmp = shared_tmp(base)
    parent = tmp / "autoheal-checkpoints"
    as_user(ATTACKER, lambda: os.mkdir(parent, 0o777) or os.chmod(parent, 0o777))
    ckdir = parent / "7-victimtok1"
    as_user(VICTIM, save, str(ckdir), 10, "victim's model", VICTIM_ENV)
    # refused already: the folder is in the other user's hands (what they can do with it comes next)
    assert as_user(VICTIM, resume, str(ckdir))[0] is None
    planted = as_user(ATTACKER, swap_in_own, str(parent), "7-victimtok1", 99)
    assert Path(planted) == ckdir / "ckpt-00000099"
    found, why = as_user(VICTIM, resume, str(ckdir))
    assert found is None, "the victim would resume the attacker's pickle"
    assert f"folder {parent} is owned by uid {ATTACKER}, not by this job's user or root" in why[0], why


def test_world_writable_parent_without_sticky_bit_is_refused(base):
    """A root-owned scratch folder that is 0777 without the sticky bit: anyone can rename the job's folder."""
    scratch = shared_tmp(base, mode=0o777)
    ckdir = scratch / "victim"
    as_user(VICTIM, save, str(ckdir), 5, "mine", VICTIM_ENV)
    found, why = as_user(VICTIM, resume, str(ckdir))
    assert found is None
    assert f"folder {scratch} is writable by every user and has no sticky bit" in why[0], why
    # the attack it prevents: the attacker renames the victim's folder away and plants theirs
    as_user(ATTACKER, swap_in_own, str(scratch), "victim", 99)
    assert as_user(VICTIM, resume, str(ckdir))[0] is None
    # with the sticky bit (like /tmp) the victim's own folder is theirs alone: resumed
    other = base / "sticky"
    other.mkdir()
    other.chmod(0o1777)
    as_user(VICTIM, save, str(other / "victim" / "ck"), 5, "mine", VICTIM_ENV)
    assert as_user(VICTIM, resume, str(other / "victim" / "ck"))[0] == str(other / "victim" / "ck" / "ckpt-00000005")


def test_checkpoint_planted_without_owner_in_a_sticky_folder_is_refused(base):
    """--checkpoint-dir /tmp (sticky): another user plants a newer checkpoint with no owner and no uid,
    as an older release would have written it."""
    tmp = shared_tmp(base)
    as_user(VICTIM, save, str(tmp), 10, "mine", VICTIM_ENV)
    planted = as_user(ATTACKER, save, str(tmp), 500, "attacker's pickle", {})
    as_user(ATTACKER, rewrite_manifest, planted, lambda d: d.pop("uid"))
    assert "owner" not in json.loads((Path(planted) / "MANIFEST.json").read_text())
    found, why = as_user(VICTIM, resume, str(tmp))
    assert found == str(tmp / "ckpt-00000010"), why
    assert why and why[0].startswith(f"ckpt-00000500: ckpt-00000500 is owned by uid {ATTACKER}"), why


def test_a_recorded_uid_of_another_user_is_refused_even_in_files_the_victim_owns(base):
    """Root copied another user's checkpoint into the victim's folder (chown'ed): the manifest says whose
    it is, and that is not the victim."""
    home = base / "home"
    home.mkdir()
    home.chmod(0o755)
    mine = home / "victim"
    mine.mkdir()
    os.chown(mine, VICTIM, VICTIM)
    # the attacker's checkpoint, saved as the attacker, then moved and chown'ed by root
    stage = base / "stage"
    stage.mkdir()
    stage.chmod(0o777)
    path = Path(as_user(ATTACKER, save, str(stage / "ck"), 40, "their state", {}))
    shutil.move(str(path.parent), str(mine / "ck"))
    for root, dirs, files in os.walk(mine / "ck"):
        for n in [root, *(os.path.join(root, f) for f in dirs + files)]:
            os.chown(n, VICTIM, VICTIM)
    found, why = as_user(VICTIM, resume, str(mine / "ck"))
    assert found is None
    assert f"saved by uid {ATTACKER}, not by this job's user or root" in why[0], why
    # unless the victim says they trust that user's checkpoints
    found, _ = as_user(VICTIM, resume, str(mine / "ck"), {**VICTIM_ENV, TRUSTED_UIDS_ENV: str(ATTACKER)})
    assert found == str(mine / "ck" / "ckpt-00000040")


def test_old_checkpoint_without_uid_in_the_users_own_folder_still_resumes(base):
    """Decision: a manifest from before this release (no uid) loads when its files are the user's own."""
    home = base / "home"
    home.mkdir()
    os.chown(home, VICTIM, VICTIM)
    path = as_user(VICTIM, save, str(home / "ck"), 12, "from the old release", VICTIM_ENV)
    as_user(VICTIM, rewrite_manifest, path, lambda d: d.pop("uid"))
    assert as_user(VICTIM, resume, str(home / "ck"))[0] == path

    def load_uid(d):
        ck = CheckpointManager(d, rank=0, environ=VICTIM_ENV).load()
        return [ck.uid, ck.read_bytes().decode()]

    assert as_user(VICTIM, load_uid, str(home / "ck")) == [None, "from the old release"]
    fresh = as_user(VICTIM, save, str(home / "ck2"), 1, "new", VICTIM_ENV)
    assert json.loads((Path(fresh) / "MANIFEST.json").read_text())["uid"] == VICTIM


def test_a_symlink_another_user_owns_on_the_path_is_refused(base):
    tmp = shared_tmp(base)
    home = base / "home"
    home.mkdir()
    os.chown(home, VICTIM, VICTIM)
    as_user(VICTIM, save, str(home / "ck"), 3, "mine", VICTIM_ENV)
    link = tmp / "ck-link"
    as_user(ATTACKER, os.symlink, str(home / "ck"), str(link))
    found, why = as_user(VICTIM, resume, str(link))
    assert found is None and f"symlink {link} is owned by uid {ATTACKER}" in why[0], why
    own_link = tmp / "my-link"
    as_user(VICTIM, os.symlink, str(home / "ck"), str(own_link))
    assert as_user(VICTIM, resume, str(own_link))[0] == str(own_link / "ckpt-00000003")


def test_open_checkpoint_refuses_a_resume_path_under_a_folder_another_user_owns(base):
    """AUTOHEAL_RESUME_FROM handed to the trainer: the same checks."""
    tmp = shared_tmp(base)
    parent = tmp / "shared"
    as_user(ATTACKER, lambda: os.mkdir(parent, 0o777) or os.chmod(parent, 0o777))
    path = as_user(VICTIM, save, str(parent / "ck"), 8, "mine", VICTIM_ENV)

    def open_it(p):
        try:
            return open_checkpoint(p, environ=VICTIM_ENV).step
        except NoValidCheckpoint as exc:
            return str(exc)

    assert f"folder {parent} is owned by uid {ATTACKER}" in as_user(VICTIM, open_it, path)
    safe = base / "home"
    safe.mkdir()
    os.chown(safe, VICTIM, VICTIM)
    assert as_user(VICTIM, open_it, as_user(VICTIM, save, str(safe / "ck"), 8, "mine", VICTIM_ENV)) == 8


def test_trusted_uids_and_missing_parts_of_a_path():
    assert trusted_uids({}, euid=1000) == {0, 1000}
    assert trusted_uids({TRUSTED_UIDS_ENV: " 7, x,8 ,"}, euid=1000) == {0, 1000, 7, 8}
    assert path_problem("/nonexistent-autoheal/x/y", frozenset({0})) is None  # nothing there to resume
    assert stat.S_ISVTX & os.stat("/tmp").st_mode  # the premise of the sticky tests


def test_pruning_and_saving_never_delete_another_users_checkpoint(base):
    """A folder both users may write (no sticky bit): the victim's pruning and a save of the same step
    leave the other user's checkpoints in place (a checkpoint is never lost, even one we do not trust)."""
    shared = base / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    theirs = as_user(ATTACKER, save, str(shared), 5, "teammate's step 5", {})
    as_user(ATTACKER, save, str(shared), 1, "teammate's step 1", {})

    def save_many(d):
        mgr = CheckpointManager(d, rank=0, keep=1, environ=VICTIM_ENV)
        for step in (2, 3, 5, 6):
            mgr.save(step, f"mine {step}".encode())
        return sorted(os.listdir(d))

    names = as_user(VICTIM, save_many, str(shared))
    assert "ckpt-00000001" in names, names  # not pruned
    kept = [n for n in names if n.startswith(f"ckpt-00000005.foreign-uid{ATTACKER}-")]
    assert len(kept) == 1, names
    assert (shared / kept[0] / "payload.bin").read_bytes() == b"teammate's step 5"
    assert Path(theirs).name == "ckpt-00000005" and (shared / "ckpt-00000006").stat().st_uid == VICTIM
