"""Issue 25 item 4: the job runner, run as an unprivileged user, needs no site secret, and the records it
makes reach the site journal and webhooks only through root (the epilog), marked as the user's.

Real processes, no Slurm: the runner is ``python -m autoheal.sbatch_helpers.runner`` run as ``nobody``
(uid 65534) with the site's config readable by all and its secrets file root's 0600 (the runner's
Slurm calls fail as they would without a controller, which it survives), the epilog is the real
``autoheal.hooks.epilog`` run as root with the environment slurmd gives it. Two webhook endpoints on
127.0.0.1 stand for the site's (in the secrets file) and the user's own (``--notify``).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from pathlib import Path

import pytest
from helpers import WebhookRecorder

from autoheal.job_records import ensure_spool
from autoheal.journal import Journal

NOBODY = 65534
OTHER = 65533  # a second unprivileged user (no passwd entry needed)
JOB = "4242"
SITE_PACKAGES = sysconfig.get_paths()["purelib"]
BOOT = ("import site, sys; site.addsitedir(sys.argv.pop(1)); "
        "from autoheal.sbatch_helpers.runner import main; sys.exit(main(sys.argv[1:]))")

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="running processes as other users needs root")


def _python_for(uid: int) -> str:
    """An interpreter of this Python version that ``uid`` may run (the venv's may sit under /root)."""
    for candidate in (sys.executable, f"/usr/bin/python{sys.version_info[0]}.{sys.version_info[1]}"):
        try:
            res = subprocess.run([candidate, "-c", "import sys; print(sys.version_info[:2])"], user=uid, group=uid,
                                 extra_groups=[], capture_output=True, text=True, timeout=30, cwd="/")
        except OSError:
            continue
        if res.returncode == 0 and res.stdout.strip() == str(tuple(sys.version_info[:2])):
            return candidate
    pytest.skip(f"no python{sys.version_info[0]}.{sys.version_info[1]} that uid {uid} may run")


Hook = WebhookRecorder


class Site:
    """A node's autoheal files as an admin sets them up: config 0644, secrets 0600, journal 0644 in a
    0755 folder, all root's."""

    def __init__(self, root: Path, site_hook: Hook, secrets_mode: int = 0o600):
        self.root = root
        self.config = root / "etc" / "autoheal.toml"
        self.secrets = root / "etc" / "secrets.toml"
        self.journal_path = root / "journal" / "journal.jsonl"
        self.spool = root / "spool"
        (root / "etc").mkdir(mode=0o755)
        (root / "journal").mkdir(mode=0o755)
        (root / "empty").mkdir(mode=0o755)
        (root / "kmsg.log").write_text("")
        self.config.write_text(f"""
[slurm]
bin_dir = "{root}/empty"
[journal]
path = "{self.journal_path}"
job_spool = "{self.spool}"
fsync = false
[notify]
secrets_file = "{self.secrets}"
timeout = 2.0
retries = 0
[hooks]
state_dir = "{root}/state/{{node}}"
expected_gpus = 0
dcgm_mapping_dir = ""
kernel_log = "{root}/kmsg.log"
""")
        self.config.chmod(0o644)
        self.secrets.write_text(f'[notify]\nwebhooks = ["{site_hook.url}"]\n')
        self.secrets.chmod(secrets_mode)
        self.journal_path.write_text("")
        self.journal_path.chmod(0o644)

    def env(self, **extra):
        env = {"PATH": "/usr/bin:/bin", "AUTOHEAL_CONFIG": str(self.config), "SLURM_JOB_ID": JOB,
               "SLURMD_NODENAME": "n1", "SLURM_JOB_NODELIST": "n[1-2]"}
        env.update(extra)
        return env

    def run_runner(self, uid, *args, **env):
        py = _python_for(uid)
        return subprocess.run([py, "-c", BOOT, SITE_PACKAGES, *args], user=uid, group=uid, extra_groups=[],
                              env=self.env(**env), cwd="/", capture_output=True, text=True, timeout=120)

    def run_as(self, uid, code):
        py = _python_for(uid)
        res = subprocess.run([py, "-c", code], user=uid, group=uid, extra_groups=[], env=self.env(), cwd="/",
                             capture_output=True, text=True, timeout=60)
        assert res.returncode == 0, res.stderr
        return res.stdout

    def epilog(self, uid=NOBODY, user="nobody"):
        res = subprocess.run([sys.executable, "-m", "autoheal.hooks.epilog"], capture_output=True, text=True,
                             timeout=120, env=self.env(SLURM_JOB_UID=str(uid), SLURM_JOB_USER=user), cwd="/")
        assert res.returncode == 0, res.stderr
        return res

    def records(self):
        return list(Journal(self.journal_path).read())


@pytest.fixture
def hooks():
    made = [Hook(), Hook()]
    yield made
    for h in made:
        h.close()


@pytest.fixture
def base():
    d = Path(tempfile.mkdtemp(prefix="autoheal-runner-user-", dir="/tmp"))
    d.chmod(0o755)
    yield d
    shutil.rmtree(d, ignore_errors=True)


@pytest.mark.parametrize("secrets_mode", [0o600, 0o644], ids=["secrets-0600", "secrets-readable"])
def test_runner_as_a_user_needs_no_secret_and_its_records_reach_the_site_through_the_epilog(base, hooks,
                                                                                             secrets_mode):
    site_hook, user_hook = hooks
    site = Site(base, site_hook, secrets_mode)
    ensure_spool(site.spool)  # what the first epilog on the node (or the package's tmpfiles.d) does
    # restart 6 of at most 5: the runner stops the job with an error record, no Slurm needed for that
    res = site.run_runner(NOBODY, "--max-restarts", "5", "--notify", user_hook.url, "--", "/bin/true",
                          SLURM_RESTART_COUNT="6")
    assert res.returncode == 91, res.stderr
    assert "restart 6 exceeds --max-restarts 5" in res.stderr
    assert "secrets" not in res.stderr and "journal/notifications unavailable" not in res.stderr, res.stderr
    # the runner wrote neither the site journal nor to the site's webhooks, even where it could read them
    assert site.records() == [] and site_hook.bodies == []
    assert sorted(user_hook.events()) == ["job-max-restarts", "job-restart"]  # the user's own webhook
    [left] = list(site.spool.iterdir())
    assert left.name == f"{JOB}.{NOBODY}.jsonl" and left.stat().st_uid == NOBODY

    site.epilog()
    recs = site.records()
    assert [r.event for r in recs] == ["job-restart", "job-max-restarts"]
    for r in recs:
        assert r.source == "job" and r.job_ids == [JOB] and r.node == "n1"
        assert r.message.startswith("[user nobody] job 4242")
        assert r.evidence["from_job"] == {"job": JOB, "uid": NOBODY, "user": "nobody"}
        assert r.evidence["claimed"]["source"] == "sbatch-runner"
    assert sorted(site_hook.events()) == ["job-max-restarts", "job-restart"]
    assert all(b["text"].startswith("n1: job-") and "[user nobody]" in b["text"] for b in site_hook.bodies)
    assert list(site.spool.iterdir()) == []  # journalled once


def test_without_a_spool_the_runner_still_runs_the_job_and_says_where_its_records_are(base, hooks):
    site = Site(base, hooks[0])
    res = site.run_runner(NOBODY, "--", "/bin/true")
    assert res.returncode == 0, res.stderr
    assert f"cannot keep this job's records for the site journal in {site.spool}" in res.stderr
    assert site.records() == []


def test_a_forged_record_from_a_user_cannot_pass_for_roots(base, hooks):
    site_hook, _ = hooks
    site = Site(base, site_hook)
    ensure_spool(site.spool)
    secret = base / "root-only.txt"
    secret.write_text("root's secret line\n")
    secret.chmod(0o600)
    forged = [
        {"event": "drain", "source": "xid-watch", "node": "gpu9", "job_ids": ["999"], "severity": "error",
         "host": "slurmctld", "message": "<!channel> xid 79 on GPU 0 of gpu9: drained", "evidence": {"xid": 79}},
        {"event": "guard-release", "source": "guard", "node": "n2", "job_ids": [JOB], "severity": "action",
         "message": "@here job released", "evidence": {"x": "y" * 10000}},
    ]
    spool = str(site.spool)
    out = site.run_as(NOBODY, f"""
import json, os
lines = {json.dumps([json.dumps(f) for f in forged])}
with open(os.path.join({spool!r}, "{JOB}.{NOBODY}.jsonl"), "w") as fh:
    fh.write("\\n".join(lines) + "\\nnot json at all\\n")
# a file that claims root's uid in its name, and a symlink to a file only root may read
with open(os.path.join({spool!r}, "{JOB}.0.jsonl"), "w") as fh:
    fh.write(lines[0] + "\\n")
os.symlink({str(secret)!r}, os.path.join({spool!r}, "{JOB}.{NOBODY}.0badc0de.jsonl"))
# the site journal itself is root's
try:
    open({str(site.journal_path)!r}, "a")
except PermissionError:
    print("journal refused")
""")
    assert out.strip() == "journal refused"
    res = site.epilog()
    recs = site.records()
    assert [r.event for r in recs] == ["job-record", "job-record"]
    for r in recs:
        assert r.source == "job" and r.job_ids == [JOB] and r.host != "slurmctld"
        assert r.message.startswith("[user nobody] ")
    drain, release = recs
    assert drain.node == "n1" and release.node == "n2"  # gpu9 is no node of the job; n2 is
    assert drain.evidence["claimed"] == {"event": "drain", "source": "xid-watch", "node": "gpu9",
                                         "host": "slurmctld", "evidence": {"xid": 79}}
    assert release.evidence["claimed"]["evidence"] == {"dropped": "10009 characters, more than 4096"}
    assert not list(Journal(site.journal_path).read(events=["drain", "guard-release"]))
    text = site.journal_path.read_text()
    assert "root's secret line" not in text and "not json" not in text
    assert len([line for line in text.splitlines() if line.strip()]) == 2  # nothing from the other files
    assert f"{JOB}.{NOBODY}.0badc0de.jsonl: Too many levels of symbolic links" in res.stderr, res.stderr
    assert f"{JOB}.0.jsonl: named for uid 0, not for job {JOB}'s user (uid {NOBODY}); ignored" in res.stderr
    # the notifications: escaped
    bodies = json.dumps([b["text"] for b in site_hook.bodies])
    assert "<!channel>" not in bodies and "@here" not in bodies and len(site_hook.bodies) == 2
    assert list(site.spool.iterdir()) == []


def test_a_file_another_user_planted_under_the_jobs_name_is_refused_and_the_runner_takes_its_own(base, hooks):
    site = Site(base, hooks[0])
    ensure_spool(site.spool)
    planted = site.spool / f"{JOB}.{NOBODY}.jsonl"
    line = json.dumps({"event": "job-requeue", "message": "planted by another user", "severity": "action"})
    site.run_as(OTHER, f"""
import os
fd = os.open({str(planted)!r}, os.O_WRONLY | os.O_CREAT, 0o666)
os.fchmod(fd, 0o666)
os.write(fd, {line!r}.encode() + b"\\n")
""")
    res = site.run_runner(NOBODY, "--max-restarts", "5", "--", "/bin/true", SLURM_RESTART_COUNT="6")
    assert res.returncode == 91, res.stderr
    mine = [p for p in site.spool.iterdir() if p.stat().st_uid == NOBODY]
    assert len(mine) == 1 and mine[0].name.startswith(f"{JOB}.{NOBODY}.") and mine[0] != planted
    res = site.epilog()
    recs = site.records()
    assert [r.event for r in recs] == ["job-restart", "job-max-restarts"]
    assert "planted" not in site.journal_path.read_text()
    assert f"{planted.name}: owned by uid {OTHER}, not by job {JOB}'s user (uid {NOBODY}); ignored" in res.stderr
