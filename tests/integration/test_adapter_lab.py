"""The Slurm adapter against a real lab cluster (CLI and slurmrestd backends)."""

from __future__ import annotations

import subprocess

import pytest
from helpers import cancel_job, wait_for

from autoheal import nodeops
from autoheal.errors import SlurmError, SlurmNotFound
from autoheal.reasons import is_ours
from autoheal.slurm.model import JobUpdate


def _sbatch(lab, *args, script="sleep 300"):
    res = subprocess.run(["sbatch", "--parsable", "-o", "/dev/null", *args, "--wrap", script], env=lab.env,
                         capture_output=True, text=True, timeout=20, cwd="/tmp")
    assert res.returncode == 0, res.stderr
    return res.stdout.strip().split(";")[0]


def _scancel(lab, job_id):
    cancel_job(lab.env, job_id)


def test_list_nodes_reports_lab_nodes_and_spare(plain_lab):
    slurm = plain_lab.adapter()
    nodes = {n.name: n for n in slurm.list_nodes()}
    assert set(nodes) == {"gpu1", "gpu2", "gpu3", "spare1"}
    assert nodes["spare1"].drain and is_ours(nodes["spare1"].reason)
    assert all(nodes[n].gpu_count == 8 for n in ("gpu1", "gpu2", "gpu3"))
    assert slurm.version().major >= 22


def test_drain_and_resume_through_adapter_and_nodeops(plain_lab):
    slurm = plain_lab.adapter()
    out = nodeops.drain(slurm, "gpu3", "test: drain via adapter \n with newline")
    assert out.action == nodeops.DRAINED
    node = slurm.get_node("gpu3")
    assert node.drain and node.reason == "autoheal: test: drain via adapter with newline"
    # the same drain again is a no-op
    assert nodeops.drain(slurm, "gpu3", "test: drain via adapter \n with newline").action == nodeops.SKIPPED_SAME
    assert nodeops.resume(slurm, "gpu3").action == nodeops.RESUMED
    assert not slurm.get_node("gpu3").drain


def test_admin_drain_is_never_overwritten_or_resumed(plain_lab):
    slurm = plain_lab.adapter()
    slurm.drain("gpu2", "admin: bad DIMM, ticket 42")
    try:
        assert nodeops.drain(slurm, "gpu2", "xid 79").action == nodeops.SKIPPED_FOREIGN
        for _ in range(3):
            assert nodeops.resume(slurm, "gpu2").action == nodeops.SKIPPED_NOT_OURS
        node = slurm.get_node("gpu2")
        assert node.drain and node.reason == "admin: bad DIMM, ticket 42"
    finally:
        slurm.resume("gpu2")


def test_hostile_reason_reaches_slurm_sanitised(plain_lab):
    slurm = plain_lab.adapter()
    hostile = "x\"; rm -rf / $(reboot) `id` \x1b[31m" + "A" * 10_000
    nodeops.drain(slurm, "gpu3", hostile)
    try:
        reason = slurm.get_node("gpu3").reason
        assert reason.startswith("autoheal: x\"; rm -rf / $(reboot) `id`")
        assert len(reason) <= 200 and "\x1b" not in reason
    finally:
        nodeops.resume(slurm, "gpu3")


def test_compound_state_of_busy_drained_node(plain_lab):
    slurm = plain_lab.adapter()
    job = _sbatch(plain_lab, "-w", "gpu1", "--requeue")
    try:
        wait_for(lambda: slurm.get_job(job).running, 60, "job running")
        nodeops.drain(slurm, "gpu1", "test: busy drain")
        node = next(n for n in slurm.list_nodes() if n.name == "gpu1")
        assert node.state in ("MIXED", "ALLOCATED") and node.drain and not node.drained
        jobs = slurm.list_jobs(node="gpu1")
        assert [j.job_id for j in jobs] == [job]
    finally:
        _scancel(plain_lab, job)
        nodeops.resume(slurm, "gpu1")


def test_requeue_hold_exclude_release_comment_signal(plain_lab):
    slurm = plain_lab.adapter()
    job = _sbatch(plain_lab, "-N", "1", "--requeue", "--exclude", "spare1", "--comment", "start")
    try:
        running = wait_for(lambda: (lambda j: j if j.running else None)(slurm.get_job(job)), 60, "job running")
        node = running.nodes[0]
        slurm.set_job_comment(job, "autoheal: requeued after test on " + node)
        slurm.requeue(job, hold=True)
        # requeue goes through COMPLETING until the batch shell is gone; a process that outlives SIGTERM
        # (seen once on a fresh CI machine) keeps it there until Slurm's SIGKILL at KillWait (120 s in the
        # lab's fragment): wait past that bound
        states = []
        held = wait_for(lambda: (lambda j: states.append(j.state) or (j if j.state == "PENDING" else None))(
            slurm.get_job(job)), 150, "job held after requeuehold")
        assert held.state == "PENDING", states[-5:]
        merged = sorted(set(held.excluded_nodes) | {node})
        slurm.update_job(job, JobUpdate(excluded_nodes=tuple(merged)))
        assert set(slurm.get_job(job).excluded_nodes) == set(merged)
        slurm.release(job)
        assert "spare1" in slurm.get_job(job).excluded_nodes  # the user's own exclusion is kept
        assert slurm.get_job(job).comment == "autoheal: requeued after test on " + node
    finally:
        _scancel(plain_lab, job)


def test_job_write_outcomes_are_typed(plain_lab):
    # What the runner and the guard decide on, from real scontrol answers (never from message words)
    from autoheal.errors import SlurmJobAlreadyPending, SlurmJobNotPending, SlurmRequeueDisabled

    slurm = plain_lab.adapter(retries=0)
    job = _sbatch(plain_lab, "-N", "1", "--requeue", "--exclude", "spare1")
    fixed = _sbatch(plain_lab, "-N", "1", "--no-requeue", "--exclude", "spare1")
    try:
        wait_for(lambda: slurm.get_job(job).running and slurm.get_job(fixed).running, 60, "jobs running")
        with pytest.raises(SlurmJobNotPending):
            slurm.set_excluded_nodes(job, ["gpu3"])  # only while pending
        with pytest.raises(SlurmRequeueDisabled):
            slurm.requeue(fixed)
        slurm.requeue(job, hold=True)
        with pytest.raises(SlurmJobAlreadyPending):
            slurm.requeue(job)  # a second requeue: already done by someone
        held = wait_for(lambda: (lambda j: j if j.state == "PENDING" else None)(slurm.get_job(job)), 150,
                        "job pending after requeuehold")  # past KillWait (120 s), see above
        assert held.held and held.requeue_held and held.priority == 0
        slurm.release(job)
        slurm.release(job)  # idempotent
        released = slurm.get_job(job)
        assert not released.held and not released.requeue_held
        subprocess.run(["scontrol", "hold", job], env=plain_lab.env, check=True, timeout=20)
        by_admin = slurm.get_job(job)
        assert by_admin.held and not by_admin.requeue_held  # someone else's hold is not ours to release
    finally:
        _scancel(plain_lab, job)
        _scancel(plain_lab, fixed)


def test_signal_job_batch_shell(plain_lab, tmp_path):
    slurm = plain_lab.adapter()
    marker, trapped = tmp_path / "got-usr2", tmp_path / "trapped"
    script = f"trap 'touch {marker}; exit 0' USR2; touch {trapped}; while true; do sleep 0.2; done"
    job = _sbatch(plain_lab, "-N", "1", script=script)
    try:
        wait_for(lambda: slurm.get_job(job).running, 60, "job running")
        wait_for(trapped.exists, 30, "the batch shell to install its trap")
        slurm.signal_job(job, "USR2", batch=True)
        wait_for(lambda: marker.exists(), timeout=15)
    finally:
        _scancel(plain_lab, job)


def test_finished_job_is_still_found_with_its_final_state(plain_lab):
    # 24.11's `squeue --json -j ID` hides a finished job unless asked for every state; the runner and
    # the tests read a job's final state (COMPLETED, FAILED, CANCELLED) while slurmctld still holds it
    slurm = plain_lab.adapter()
    ok = _sbatch(plain_lab, "-N", "1", "--exclude", "spare1", script="true")
    bad = _sbatch(plain_lab, "-N", "1", "--exclude", "spare1", script="exit 3")
    assert wait_for(lambda: slurm.get_job(ok).state == "COMPLETED", 60, "job completed")
    assert wait_for(lambda: slurm.get_job(bad).state == "FAILED", 60, "job failed")
    assert slurm.get_job(ok).job_id == ok


def test_job_gpus_and_history_through_the_adapter(plain_lab):
    """The prolog's DCGM mapping (``scontrol -d show job``) and the runner's restart cause (sacct) are
    adapter calls; the lab runs without accounting, which the history reports as None (no guess)."""
    slurm = plain_lab.adapter()
    job = _sbatch(plain_lab, "-w", "gpu1", "--gres=gpu:2")
    try:
        wait_for(lambda: slurm.get_job(job).running, 60, "job running")
        gpus = slurm.job_gpus(job, "gpu1", timeout=5)
        assert len(gpus) == 2 and all(0 <= g < 8 for g in gpus)
        assert slurm.job_gpus(job, "gpu2") == []
        assert slurm.job_state_history(job) is None
        assert slurm.capabilities()["job-gpus"] == slurm.capabilities()["job-history"] == "cli"
    finally:
        _scancel(plain_lab, job)
    with pytest.raises(SlurmNotFound):
        slurm.job_gpus("999999", "gpu1")


def test_unknown_node_and_job_are_typed_errors(plain_lab):
    slurm = plain_lab.adapter()
    with pytest.raises(SlurmNotFound):
        slurm.get_node("nosuchnode")
    with pytest.raises(SlurmNotFound):
        slurm.get_job("999999")


def test_show_config_reads_running_values(plain_lab):
    conf = plain_lab.adapter().show_config()
    assert conf["ClusterName"] == "autoheal-lab"
    assert conf["SlurmctldPort"] == str(plain_lab.layout.ctld_port)


def _start_rest(plain_lab, auth):
    """slurmrestd's answer for the REST backend; on 25.11+ local auth is refused by the lab with the reason
    (slurmrestd runs unprivileged there, and its local auth accepts only its own account, no admin)."""
    from autoheal_lab.cluster import RESTD_UNPRIVILEGED_SINCE, LabError

    if auth == "local" and plain_lab.adapter().version().at_least(*RESTD_UNPRIVILEGED_SINCE):
        with pytest.raises(LabError, match="use --auth jwt"):
            plain_lab.lab.start_slurmrestd(auth)
        pytest.skip("Slurm 25.11+: slurmrestd's local auth cannot reach Slurm as an admin (lab refuses it)")
    return plain_lab.lab.start_slurmrestd(auth)


@pytest.mark.parametrize("auth", ["local", "jwt"])
def test_rest_backend_reads_match_cli(plain_lab, auth):
    from autoheal.slurm.rest_backend import RestSlurm

    info = _start_rest(plain_lab, auth)
    rest = RestSlurm(info["url"], user=info["user"], token=info["token"], timeout=5)
    assert info["token"] not in repr(rest) or not info["token"]
    cli_nodes = {n.name: (n.state, n.flags, n.reason) for n in plain_lab.adapter().list_nodes()}
    rest_nodes = {n.name: (n.state, n.flags, n.reason) for n in rest.list_nodes()}
    assert rest_nodes == cli_nodes
    assert rest.ping()
    assert rest.get_node("gpu1").name == "gpu1"
    if not rest.can_write:  # Slurm 22.05 / 23.02: no write endpoints; say so instead of failing silently
        with pytest.raises(SlurmError, match="cli"):
            rest.drain("gpu1", "autoheal: rest")
    else:
        rest.drain("gpu1", "autoheal: rest drain")
        assert plain_lab.adapter().get_node("gpu1").reason == "autoheal: rest drain"
        rest.resume("gpu1")
        # (24.11 keeps the old reason on the resumed node and marks it NOT_RESPONDING until the next ping)
        assert not plain_lab.adapter().get_node("gpu1").drain


@pytest.mark.parametrize("auth", ["local", "jwt"])
def test_rest_backend_job_writes(plain_lab, auth, tmp_path):
    from autoheal.slurm.rest_backend import RestSlurm

    info = _start_rest(plain_lab, auth)
    rest = RestSlurm(info["url"], user=info["user"], token=info["token"], timeout=5)
    if not rest.can_write:
        pytest.skip(f"slurmrestd {rest.api} has no job update endpoints (Slurm < 23.11): covered by the read test")
    cli = plain_lab.adapter()
    marker, trapped = tmp_path / "got-usr2", tmp_path / "trapped"
    script = f"trap 'touch {marker}; exit 0' USR2; touch {trapped}; while true; do sleep 0.2; done"
    job = _sbatch(plain_lab, "-N", "1", "-H", "--exclude", "spare1", script=script)
    try:
        rest.update_job(job, JobUpdate(excluded_nodes=("spare1", "gpu3")))
        assert set(cli.get_job(job).excluded_nodes) == {"spare1", "gpu3"}
        rest.update_job(job, JobUpdate(comment="autoheal: rest comment"))
        assert cli.get_job(job).comment == "autoheal: rest comment"
        rest.release(job)
        running = wait_for(lambda: (lambda j: j if j.running else None)(cli.get_job(job)), 60, "job running")
        assert "gpu3" not in running.nodes
        wait_for(trapped.exists, 30, "the batch shell to install its trap")
        rest.signal_job(job, "USR2", batch=True)
        wait_for(lambda: marker.exists(), timeout=15, what="USR2 delivered to the batch shell")
    finally:
        _scancel(plain_lab, job)


def test_rest_backend_requeue_where_slurmrestd_has_it(plain_lab):
    """Slurm 26.05 (v0.0.45) requeues through slurmrestd: held, then released; a --no-requeue job's refusal
    is typed as with scontrol. Older versions hand requeue to scontrol (unit tests)."""
    from autoheal.errors import SlurmRequeueDisabled
    from autoheal.slurm.rest_backend import RestSlurm

    info = plain_lab.lab.start_slurmrestd("jwt")
    rest = RestSlurm(info["url"], user=info["user"], token=info["token"], timeout=5, retries=0)
    if rest.capabilities()["requeue"] != "rest":
        pytest.skip(f"slurmrestd {rest.api} has no requeue call (Slurm < 26.05): scontrol requeues")
    cli = plain_lab.adapter()
    job = _sbatch(plain_lab, "-N", "1", "--requeue", "--exclude", "spare1")
    fixed = _sbatch(plain_lab, "-N", "1", "--no-requeue", "--exclude", "spare1")
    try:
        wait_for(lambda: cli.get_job(job).running and cli.get_job(fixed).running, 60, "jobs running")
        with pytest.raises(SlurmRequeueDisabled):
            rest.requeue(fixed)
        rest.requeue(job, hold=True)
        held = wait_for(lambda: (lambda j: j if j.state == "PENDING" else None)(cli.get_job(job)), 150,
                        "job pending after the REST requeue (past KillWait)")
        assert held.held and held.requeue_held and held.restart_count == 1
        rest.release(job)
        assert not cli.get_job(job).held
    finally:
        _scancel(plain_lab, job)
        _scancel(plain_lab, fixed)
