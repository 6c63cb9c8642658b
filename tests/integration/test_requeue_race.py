"""The runner's requeue survives the kill it triggers, on a real lab (issue: never strand a job).

Slurm answers requeuehold by SIGTERMing every process of the job, the runner's own ``scontrol`` children
included. These tests make that happen at chosen moments, deterministically: the job's config points
``slurm.bin_dir`` at a directory whose ``scontrol`` is a failpoint wrapper around the real one. It sends
SIGTERM to the runner's whole process group right after the hold, right after the exclusion update or at
the start of the release, or SIGKILLs the runner after the exclusion update (then only ``autoheal guard``,
started here as the site would run it, can release the job). One job goes through all four faults in
turn, each time on the node it runs on, which is drained with an autoheal reason and given the runner's
signal the way xid-watch does it. The node of the previous round is resumed, so each requeue also shows
that exclusions of repaired nodes are pruned.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from autoheal import nodeops
from autoheal.lab.cluster import Lab
from autoheal.sbatch_helpers.comment import CommentState
from test_sbatch_requeue import REQUEUE_WAIT, TRAINER, SbLab, wait_text

PY = sys.executable

WRAPPER = """#!/bin/sh
# failpoint wrapper around the real scontrol (tests/integration/test_requeue_race.py)
REAL='{real}'
DIR='{dir}'
MODE=$(cat "$DIR/mode" 2>/dev/null)
op=none
case "$*" in
  requeuehold*) op=requeuehold ;;
  release*) op=release ;;
  *ExcNodeList=*) op=exclude ;;
esac
PG=$(ps -o pgid= -p $PPID | tr -d ' ')
case "$MODE" in
  "term-during:$op")
    : > "$DIR/mode"; echo "$op" >> "$DIR/fired"
    kill -TERM -"$PG"  # dash: no "--"; sleep 0.3
    exec "$REAL" "$@" ;;
  "term-after:$op")
    "$REAL" "$@"; rc=$?
    : > "$DIR/mode"; echo "$op" >> "$DIR/fired"
    kill -TERM -"$PG"  # dash: no "--"; sleep 0.3
    exit $rc ;;
  "kill-after:$op")
    "$REAL" "$@"; rc=$?
    : > "$DIR/mode"; echo "$op" >> "$DIR/fired"
    kill -KILL "$PPID"
    exit $rc ;;
  "ctld-kill-after:$op")
    "$REAL" "$@"; rc=$?
    : > "$DIR/mode"; echo "$op" >> "$DIR/fired"
    kill -KILL "$(cat "$DIR/ctld.pid")"
    exit $rc ;;
esac
exec "$REAL" "$@"
"""

ROUNDS = ["term-after:requeuehold", "term-after:exclude", "term-during:release", "kill-after:exclude"]


@pytest.fixture(scope="module")
def racelab(tmp_path_factory):
    from conftest import _require_slurm

    _require_slurm()
    lab = Lab(tmp_path_factory.mktemp("racelab"))
    try:
        lab.up(nodes=4, gpus=2, spares=0, hooks=False, xid_watch=False, install=False)
        yield SbLab(lab)
    finally:
        lab.down()


def _failpoint_config(sblab: SbLab, wd: Path) -> Path:
    """A copy of the lab's autoheal config whose scontrol is the failpoint wrapper."""
    fp = wd / "failpoint"
    fp.mkdir()
    real = shutil.which("scontrol", path=sblab.env.get("PATH")) or "/usr/bin/scontrol"
    wrapper = fp / "scontrol"
    wrapper.write_text(WRAPPER.format(real=real, dir=fp))
    wrapper.chmod(0o755)
    text = sblab.layout.autoheal_conf.read_text()
    if re.search(r"(?m)^bin_dir\s*=", text):
        text = re.sub(r"(?m)^bin_dir\s*=.*$", f'bin_dir = "{fp}"', text)
    elif re.search(r"(?m)^\[slurm\]", text):
        text = re.sub(r"(?m)^\[slurm\]\s*$", f'[slurm]\nbin_dir = "{fp}"', text, count=1)
    else:
        text += f'\n[slurm]\nbin_dir = "{fp}"\n'
    conf = wd / "autoheal-failpoint.toml"
    conf.write_text(text)
    return conf


def _start_guard(sblab: SbLab, wd: Path) -> subprocess.Popen:
    log = open(wd / "guard.log", "w")
    return subprocess.Popen([PY, "-m", "autoheal.cli.main", "guard", "--interval", "1", "--release-after", "3",
                             "--config", str(sblab.layout.autoheal_conf)], env=sblab.env, stdout=log,
                            stderr=subprocess.STDOUT)


def _submit_failpoint_job(sblab: SbLab, tmp_path: Path):
    """An `autoheal sbatch` trainer job whose runner uses the failpoint scontrol; (job id, output, dir)."""
    conf = _failpoint_config(sblab, tmp_path)
    script = (f"#!/bin/bash\n#SBATCH -N 1 --exclude=gpu4 -o {tmp_path}/out-%j.txt\n"
              f"{PY} {TRAINER} --steps 6000 --step-seconds 0.05 --checkpoint-every 10\n")
    env = dict(sblab.env, AUTOHEAL_CONFIG=str(conf))
    job_path = tmp_path / "job.sh"
    job_path.write_text(script)
    res = subprocess.run([PY, "-m", "autoheal.cli.main", "sbatch", "--grace", "20", "--parsable", str(job_path)],
                         cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    jid = res.stdout.strip().split(";")[0]
    return jid, tmp_path / f"out-{jid}.txt", tmp_path / "failpoint"


def _cleanup(sblab: SbLab, jid: str, guard: subprocess.Popen) -> None:
    guard.terminate()
    guard.wait(10)
    subprocess.run(["scancel", jid], env=sblab.env, capture_output=True, timeout=20)
    for n in ("gpu1", "gpu2", "gpu3"):
        if sblab.slurm.get_node(n).drain:
            nodeops.resume(sblab.slurm, n)


def test_requeue_survives_term_and_kill_at_every_step(racelab, tmp_path):
    sblab = racelab
    jid, out, fp = _submit_failpoint_job(sblab, tmp_path)
    guard = _start_guard(sblab, tmp_path)
    previous_bad = None
    last_start = 0
    try:
        wait_text(out, r"checkpoint saved step=", 90)
        for restart, mode in enumerate(ROUNDS, start=1):
            job = sblab.wait_job(jid, lambda j: j.running, REQUEUE_WAIT, f"running before round {restart}")
            bad = job.nodes[0]
            wait_text(out, r"checkpoint saved step=", 60,
                      count=len(re.findall("checkpoint saved", out.read_text())) + 1)
            (fp / "mode").write_text(mode)
            nodeops.drain(sblab.slurm, bad, f"autoheal: test: xid 79 GPU 0 of {bad} ({mode})")
            if previous_bad:
                nodeops.resume(sblab.slurm, previous_bad)  # repaired: its exclusion must be pruned
            sblab.slurm.signal_job(jid, "USR2", batch=True)
            starts = wait_text(out, r"autoheal-trainer: start step=(\d+) .*restart=(\d+) host=(\S+)",
                               REQUEUE_WAIT + 30, count=restart + 1)
            step, seen_restart, host = starts[restart]
            assert int(seen_restart) == restart, (mode, starts)
            assert host != bad, (mode, starts)  # away from the bad node
            assert int(step) > last_start, (mode, starts)  # resumed from its newest checkpoint
            last_start = int(step)
            assert mode.split(":")[1] in (fp / "fired").read_text().split(), f"failpoint {mode} never fired"
            job = sblab.wait_job(jid, lambda j: j.running, 30, "running")
            assert not job.held
            st = CommentState.parse(job.comment)
            assert st.restarts == restart and st.last == f"autoheal-drain@{bad}", job.comment
            assert "gpu4" in job.excluded_nodes and bad in job.excluded_nodes, job.excluded_nodes
            if previous_bad:
                assert previous_bad not in job.excluded_nodes, (job.excluded_nodes, previous_bad)
            if mode.startswith("kill-after"):
                assert st.guard == "released", job.comment  # nobody but the guard could have
                recs = list(sblab.journal.read(job=jid, events=["guard-release"]))
                assert recs and recs[-1].node == bad, recs
            else:
                # the runner finished its own requeue despite the SIGTERM (the guard did not have to)
                assert st.guard != "released" and st.state == "running", job.comment
                recs = [x for x in sblab.journal.read(job=jid, events=["job-requeue"])
                        if x.evidence.get("node") == bad]
                assert recs and recs[-1].evidence.get("excluded") == bad, recs
            previous_bad = bad
    finally:
        _cleanup(sblab, jid, guard)


def test_requeue_survives_slurmctld_killed_mid_requeue(racelab, tmp_path):
    # issue 16 finding 1: slurmctld kill -9 during requeuehold -> release, back 20 s later: the job sat
    # held for good (one release, no retry) or ended FAILED. Now the runner retries each step for up to
    # 60 s and checks the requeue took; the guard covers what is left.
    sblab = racelab
    jid, out, fp = _submit_failpoint_job(sblab, tmp_path)
    guard = _start_guard(sblab, tmp_path)
    try:
        wait_text(out, r"checkpoint saved step=", 90)
        job = sblab.wait_job(jid, lambda j: j.running, REQUEUE_WAIT, "running")
        bad = job.nodes[0]
        (fp / "ctld.pid").write_text(str(sblab.lab.records()["slurmctld"].pid))
        (fp / "mode").write_text("ctld-kill-after:requeuehold")
        nodeops.drain(sblab.slurm, bad, f"autoheal: test: xid 79 GPU 0 of {bad} (controller killed)")
        sblab.slurm.signal_job(jid, "USR2", batch=True)
        wait_text(fp / "fired", r"requeuehold", 60)
        time.sleep(20)  # the controller stays away for a while
        sblab.lab._start_slurmctld(sblab.layout)
        starts = wait_text(out, r"autoheal-trainer: start step=(\d+) .*restart=(\d+) host=(\S+)",
                           REQUEUE_WAIT + 60, count=2)
        step, restart, host = starts[1]
        assert int(step) > 0, starts  # resumed from its checkpoint, never from scratch
        job = sblab.wait_job(jid, lambda j: j.running, 30, "running")
        assert not job.held
        # slurmctld restarts from the state it last saved: the drain, and even the requeue, may be lost
        # (seen: the job came back as run 0 on the undrained node). Where the drain survived, the job
        # must be away from the node and excluded from it.
        if sblab.slurm.get_node(bad).drain:
            assert host != bad and int(restart) == 1, starts
            assert bad in job.excluded_nodes, (job.excluded_nodes, bad)
    finally:
        _cleanup(sblab, jid, guard)


def test_guard_leaves_a_users_own_hold_alone(racelab, tmp_path):
    sblab = racelab
    script = f"#!/bin/bash\n#SBATCH -N 1 -o {tmp_path}/out-%j.txt\nsleep 300\n"
    jid = sblab.submit(tmp_path, script, "--grace", "10")
    try:
        job = sblab.wait_job(jid, lambda j: j.running, 60, "running")
        # the user holds it after requeueing it, with a comment that even looks like ours mid-requeue
        st = CommentState.parse(job.comment)
        st.state = "requeueing"
        sblab.slurm.set_job_comment(jid, st.render())
        subprocess.run(["scontrol", "requeue", jid], env=sblab.env, check=True, timeout=20)
        sblab.wait_job(jid, lambda j: j.state == "PENDING", 60, "pending")
        subprocess.run(["scontrol", "hold", jid], env=sblab.env, check=True, timeout=20)
        res = subprocess.run([PY, "-m", "autoheal.cli.main", "guard", "--once", "--release-after", "0", "--json",
                              "--config", str(sblab.layout.autoheal_conf)], env=sblab.env, capture_output=True,
                             text=True, timeout=60)
        assert res.returncode == 0, res.stderr
        assert '"actions": []' in res.stdout, res.stdout
        assert sblab.job(jid).held
    finally:
        subprocess.run(["scancel", jid], env=sblab.env, capture_output=True, timeout=20)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(pytest.main([__file__, "-q", "-s"] + os.environ.get("PYTEST_ARGS", "").split()))
