"""Hot spares inside the allocation (``autoheal sbatch --spare-nodes 1``) on a real lab cluster.

One lab for the module: 4 nodes x 2 fake GPUs, hooks and xid-watch on every node, and
``SlurmdTimeout=10`` so that a node whose slurmd died is declared DOWN in ~10-20 s, not ~60-80 s.
Each test submits the tiny trainer on 2 active nodes + 1 spare and breaks a node that is not the batch
host (that one cannot leave the allocation: a fault there is a requeue, as without spares).
"""

from __future__ import annotations

import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import JobLab, cancel_job, module_lab, node_state, wait_for, wait_text, wait_xid_watch_looked_again

import autoheal.sbatch_helpers as sbh
from autoheal.config import load_config
from autoheal.hooks.jobside import Stage
from autoheal_lab import wiring
from autoheal_lab.gpus import inject

TRAINER = Path(sbh.__file__).parent / "examples" / "tiny_trainer.py"
PY = sys.executable
SWAP_START = r"autoheal-trainer: start step=(\d+) resumed_from=(\S+) restart=0 host=(\S+) .*reason=hot-spare-swap"


class HsLab(JobLab):
    def submit(self, workdir: Path, *extra: str) -> tuple:
        script = workdir / "job.sh"
        script.write_text(f"#!/bin/bash\n#SBATCH -N 2 --ntasks-per-node=1 -o {workdir}/out.txt\n"
                          f"srun {PY} {TRAINER} --steps 100000 --step-seconds 0.1 --checkpoint-every 10\n")
        res = subprocess.run([PY, "-m", "autoheal.cli.main", "sbatch", "--spare-nodes", "1", "--grace", "30",
                              *extra, "--parsable", str(script)], cwd=workdir, env=self.env, capture_output=True,
                             text=True, timeout=60)
        assert res.returncode == 0, res.stderr
        jid = res.stdout.strip().split(";")[0]
        out = workdir / "out.txt"
        active, spares = wait_text(out, r"hot spares: steps run on (\S+); idle spare\(s\) (\S+)", 60)[0]
        wait_text(out, r"checkpoint saved step=(\d+)", 60, count=2)
        job = self.slurm.get_job(jid)
        assert job.running and len(job.nodes) == 3, job
        victim = next(n for n in active.split(",") if n != job.batch_host)
        return jid, out, job.batch_host, victim, spares

    def cleanup(self, jid: str, nodes=()) -> None:
        cancel_job(self.env, jid)
        self.heal(nodes)

    def heal(self, nodes) -> None:
        for node in nodes:
            self.clear_node(node)
        wait_for(lambda: all(not self.slurm.get_node(n).drain for n in nodes), 30, "healed nodes back in service")

    def guard_metrics(self) -> dict:
        """The guard's textfile as {series: value} ({} before its first pass)."""
        path = self.lab.root / "guard-metrics" / "autoheal_guard.prom"
        if not path.exists():
            return {}
        return {k: float(v) for k, _, v in (ln.rpartition(" ") for ln in path.read_text().splitlines())
                if k and not k.startswith("#")}

    def swap_records(self, jid: str):
        return [r for r in self.journal.read(job=jid) if r.event == "job-hot-swap"]




@pytest.fixture(scope="module")
def hslab(tmp_path_factory):
    with module_lab(tmp_path_factory, "hotsparelab", nodes=4, gpus=2, spares=0, hooks=True, xid_watch=True,
                    extra_conf=["SlurmdTimeout=10"]) as lab:
        # the guard writing its textfile (issue 26: hot-spare swaps by result, fault -> running again)
        lab.start_controller_daemon("guard", [*wiring.guard_argv(""), "--textfile-dir",
                                              str(lab.root / "guard-metrics")])
        yield HsLab(lab)


def _resumed_at_checkpoint(text: str, starts: list) -> int:
    saved = re.findall(r"preempted step=(\d+) state=\S+ checkpoint=(\S+)", text)
    assert saved and saved[-1][1] != "none", text[-2000:]
    step = int(saved[-1][0])
    assert {int(s) for s, _, _ in starts} == {step}, (starts, saved)
    return step


def _xid_watch_past_the_grace(hslab, node, jid, fault_at):
    """Wait until xid-watch on ``node`` has decided on ``jid`` after the grace of the fault at ``fault_at``:
    no action of its for the job is open (each one done after its grace: requeued, or "no longer runs
    here"), and it looked again (a job-side step) after the grace ended. Only then does "not requeued"
    mean something."""
    grace = load_config(hslab.layout.autoheal_conf).hooks.grace_seconds

    def open_actions():
        actions = node_state(hslab.layout.root, node).get("job_actions") or {}
        return {k: a for k, a in actions.items() if a.get("job") == jid and a.get("stage") != Stage.DONE}

    wait_for(lambda: not open_actions(), grace + 60, f"xid-watch on {node} to be done with job {jid}")
    wait_xid_watch_looked_again(hslab.layout.root, node, fault_at + grace)


def test_xid_on_active_node_swaps_in_the_spare_without_requeue(hslab, tmp_path):
    swapped, timed = 'autoheal_guard_hot_spare_swaps_total{result="swapped"}', \
        'autoheal_guard_fault_to_running_seconds_count{path="hot-spare"}'
    jid, out, batch, victim, spare = hslab.submit(tmp_path)
    before = wait_for(lambda: (lambda m: m if swapped in m else None)(hslab.guard_metrics()), 30,
                      "the guard's textfile")
    try:
        inject(hslab.lab, victim, 1, "xid", xid=79)
        fault_at = time.time()
        starts = wait_text(out, SWAP_START, 60, count=2)
        # the guard saw the swap in the job's comment and timed it from slurmctld's stamp of the drain
        after = wait_for(lambda: (lambda m: m if m.get(swapped, 0) > before[swapped] else None)(hslab.guard_metrics()),
                         30, "the guard counting the swap")
        assert after[swapped] == before[swapped] + 1 and after[timed] == before[timed] + 1, after
        assert all(after[k] == before[k] for k in after if "hot_spare_swaps_total" in k and k != swapped), after
        text = out.read_text()
        step = _resumed_at_checkpoint(text, starts)
        assert {h for _, _, h in starts} == {batch, spare}, starts
        job = hslab.slurm.get_job(jid)
        assert job.running and job.restart_count == 0, job  # no requeue
        assert set(job.nodes) == {batch, spare}, job.nodes  # the bad node left the allocation
        node = hslab.slurm.get_node(victim)
        assert node.drain and node.reason.startswith("autoheal: replace: xid 79"), node  # its rung at once
        assert "ALLOCATED" not in node.state_text and "MIXED" not in node.state_text, node.state_text
        recs = hslab.swap_records(jid)
        assert recs and recs[0].node == victim and recs[0].evidence["spare"] == spare, recs
        assert recs[0].evidence["checkpoint_step"] == str(step)
        # the comment was written before the resize (Slurm refuses updates of a resized job without
        # accounting): it already names the new active nodes and the swap
        assert re.search(rf"nodes={batch},{spare} .*spares=none swaps=1", job.comment), job.comment
        wait_text(out, rf"step={step + 5}$", 30)
        # past xid-watch's grace for the drained node: the job swapped off it is not requeued for it too
        _xid_watch_past_the_grace(hslab, victim, jid, fault_at)
        job = hslab.slurm.get_job(jid)
        assert job.running and job.restart_count == 0, job
        assert not [r for r in hslab.journal.read(job=jid) if r.event in ("requeue", "job-requeue")], \
            hslab.journal.read(job=jid)
    finally:
        hslab.cleanup(jid, [victim])


def test_slurmctld_killed_right_after_the_swap_restarts_without_it_and_the_runner_swaps_again(hslab, tmp_path):
    """Issue 27: slurmctld killed (-9) within seconds of the swap's resize restarts from its last saved
    state, with the job on its old nodes, the drained one among them; the runner did not notice and
    xid-watch requeued the job at the end of its grace. Here the kill comes right after the swap and the
    restart is given the job state saved before it (what a kill in the seconds before the background save
    leaves, made certain). The runner sees the allocation it really has and releases the node again: the
    job runs on, on the batch host and the spare, with no requeue."""
    import os
    import signal as _signal

    jid, out, batch, victim, spare = hslab.submit(tmp_path)
    state_dir = hslab.layout.root / "state"
    # slurmctld writes job_state in the background, batching changes for up to 5 s: a copy taken before
    # its first write after the job's start holds the job PENDING, and the restart below then knows no
    # allocation at all (CI, on 22.05 and 26.05 alike). A held job submitted now makes slurmctld write the
    # job table again, with this job RUNNING on its 3 nodes; the copy waits for that write.
    nudged = time.time()
    res = subprocess.run(["sbatch", "--parsable", "--hold", "-N", "1", "-J", "state-save-nudge", "-o", "/dev/null",
                          "--wrap", "true"], env=hslab.env, capture_output=True, text=True, timeout=30)
    assert res.returncode == 0, res.stderr
    nudge = res.stdout.strip().split(";")[0]
    wait_for(lambda: (state_dir / "job_state").stat().st_mtime > nudged + 0.1, 30,
             "slurmctld's job_state written after the job started")
    before = {p.name: p.read_bytes() for p in state_dir.glob("job_state*")}  # the job on its 3 nodes
    assert before, list(state_dir.iterdir())
    try:
        inject(hslab.lab, victim, 1, "xid", xid=79)
        fault_at = time.time()
        wait_text(out, SWAP_START, 60, count=2)
        rec = hslab.lab.records()["slurmctld"]
        os.kill(rec.pid, _signal.SIGKILL)
        for name, data in before.items():
            (state_dir / name).write_bytes(data)
        hslab.lab.restart_slurmctld()
        # (the runner may have released it again already; if not, Slurm shows the lost resize)
        job = hslab.slurm.get_job(jid)
        assert set(job.nodes) in ({batch, victim, spare}, {batch, spare}), job

        def released_again():
            j = hslab.slurm.get_job(jid)
            return j.running and j.restart_count == 0 and set(j.nodes) == {batch, spare} and j

        wait_for(released_again, 90, f"job {jid} on {batch},{spare} again, not requeued")
        redone = [r for r in hslab.journal.read(job=jid) if r.event == "job-hot-swap-redone"]
        assert len(redone) == 1 and redone[0].node == victim, redone
        # past xid-watch's grace: no requeue for the node the job was back on
        _xid_watch_past_the_grace(hslab, victim, jid, fault_at)
        job = hslab.slurm.get_job(jid)
        assert job.running and job.restart_count == 0 and set(job.nodes) == {batch, spare}, job
        assert not [r for r in hslab.journal.read(job=jid) if r.event in ("requeue", "job-requeue")], \
            hslab.journal.read(job=jid)
        assert len(hslab.swap_records(jid)) == 1
        assert re.search(rf"nodes={batch},{spare} .*spares=none swaps=1", job.comment), job.comment
        last = max(int(x) for x in re.findall(r"step=(\d+)$", out.read_text(), re.M))
        wait_text(out, rf"step={last + 5}$", 60)  # the trainer goes on
    finally:
        cancel_job(hslab.env, nudge)
        hslab.cleanup(jid, [victim])


def test_slurmd_killed_node_down_swaps_in_the_spare(hslab, tmp_path):
    jid, out, batch, victim, spare = hslab.submit(tmp_path)
    try:
        hslab.lab.stop_slurmd(victim)
        starts = wait_text(out, SWAP_START, 90, count=2)
        assert {h for _, _, h in starts} == {batch, spare}, starts
        saved = {int(s) for s in re.findall(r"checkpoint saved step=(\d+)", out.read_text())}
        assert {int(s) for s, _, _ in starts} <= saved, starts  # the newest checkpoint before the death
        job = hslab.slurm.get_job(jid)
        assert job.running and job.restart_count == 0 and set(job.nodes) == {batch, spare}, job
        node = hslab.slurm.get_node(victim)
        assert node.down or not node.responding, node
        recs = hslab.swap_records(jid)
        assert recs and recs[0].node == victim and recs[0].evidence["trigger"].startswith("exit"), recs
    finally:
        hslab.lab.start_slurmd(victim)
        wait_for(lambda: hslab.slurm.get_node(victim).responding, 60, f"{victim} responding again")
        hslab.cleanup(jid, [victim])


def test_two_faults_first_uses_the_spare_second_requeues(hslab, tmp_path):
    jid, out, batch, victim, spare = hslab.submit(tmp_path)
    try:
        inject(hslab.lab, victim, 1, "xid", xid=79)
        wait_text(out, SWAP_START, 60, count=2)
        hslab.heal([victim])  # repaired meanwhile: the 4-node lab has 3 healthy nodes for the requeued job
        inject(hslab.lab, spare, 1, "xid", xid=79)  # now active, and no spare left
        try:
            again = wait_text(out, r"autoheal-trainer: start step=(\d+) resumed_from=(\S+) restart=1 host=(\S+)",
                              90, count=2)
        except AssertionError:
            raise AssertionError(f"not restarted: {hslab.slurm.get_job(jid)}") from None
        text = out.read_text()
        saved = re.findall(r"preempted step=(\d+) state=\S+ checkpoint=(\S+)", text)
        assert len(saved) == 2 and {int(s) for s, _, _ in again} == {int(saved[-1][0])}, (again, saved)
        assert spare not in {h for _, _, h in again}, again
        job = hslab.slurm.get_job(jid)
        assert job.running and job.restart_count == 1, job
        events = [r.event for r in hslab.journal.read(job=jid)]
        assert "job-hot-swap" in events and "job-requeue" in events, events
        # the requeued run asks for its spare again (NumNodes=2-3) and runs, with or without one
        assert text.count("hot spares: steps run on") == 2, text[-2000:]
    finally:
        hslab.cleanup(jid, [victim, spare])


def test_elastic_job_goes_on_with_fewer_nodes_once_the_spare_is_used(hslab, tmp_path):
    jid, out, batch, victim, spare = hslab.submit(tmp_path, "--min-nodes", "1")
    try:
        inject(hslab.lab, victim, 1, "xid", xid=79)
        wait_text(out, SWAP_START, 60, count=2)
        # no spare left: --min-nodes 1 lets it go on alone. The second node dies (slurmd stopped): Slurm
        # removes it itself; a drained one would need a second resize, which 22.05 without accounting refuses
        hslab.lab.stop_slurmd(spare)
        starts = wait_text(out, SWAP_START, 90, count=3)
        step, resumed, host = starts[-1]
        text = out.read_text()
        start = re.search(rf"start step={step} \S+ restart=0 host={batch} rank=0 world=1 ", text)
        assert host == batch and start
        # the newest checkpoint before this start: a save whose "checkpoint saved" line went with the killed
        # step (SIGKILL between its rename and its print, or the line in flight in the srun killed with it)
        # is still the newest one on disk (seen in CI: resumed from 290, no "checkpoint saved step=290" line)
        before = {int(s) for s in re.findall(r"checkpoint saved step=(\d+)", text[:start.start()])}
        assert resumed.endswith(f"ckpt-{int(step):08d}") and int(step) >= max(before), (starts, sorted(before))
        job = hslab.slurm.get_job(jid)
        assert job.running and job.restart_count == 0 and list(job.nodes) == [batch], job
        recs = hslab.swap_records(jid)
        assert [r.evidence["kind"] for r in recs] == ["swap", "shrink"], recs
        wait_text(out, rf"step={int(step) + 5}$", 30)
    finally:
        hslab.lab.start_slurmd(spare)
        wait_for(lambda: hslab.slurm.get_node(spare).responding, 60, f"{spare} responding again")
        hslab.cleanup(jid, [victim, spare])


def test_warning_sign_swaps_the_node_out_at_the_next_checkpoint(hslab, tmp_path):
    """A pending row remap on an active node: the health check drains it with the pre-emptive reason (no
    grace signal from xid-watch, the job runs on), the runner swaps it for the spare at the trainer's next
    checkpoint and the trainer resumes there; no requeue."""
    jid, out, batch, victim, spare = hslab.submit(tmp_path)
    try:
        inject(hslab.lab, victim, 0, "remap-pending")  # also logs XID 63: a warning, no drain by xid-watch
        # the health check (HealthCheckProgram every 30 s in the lab; run now, as Slurm would)
        res = subprocess.run([PY, "-m", "autoheal.cli.main", "check", "--node", victim, "--json"],
                             env=dict(hslab.env, **hslab.lab.node_env(victim)), capture_output=True, text=True,
                             timeout=60)
        assert '"preswap-drain"' in res.stdout, res.stdout + res.stderr
        reason = f"autoheal: pre-emptive swap: row remap pending on GPU 0 of {victim}"
        node = hslab.slurm.get_node(victim)
        assert node.drain and node.reason.startswith(reason), node
        starts = wait_text(out, SWAP_START, 60, count=2)
        text = out.read_text()
        step = _resumed_at_checkpoint(text, starts)
        assert {h for _, _, h in starts} == {batch, spare}, starts
        notice = re.search(r"drained \(autoheal: pre-emptive swap: [^)]*\); swapping it for a spare at the next "
                           r"checkpoint \(now at step (\d+)\)", text)
        assert notice and int(notice.group(1)) < step, text[-3000:]
        job = hslab.slurm.get_job(jid)
        assert job.running and job.restart_count == 0 and set(job.nodes) == {batch, spare}, job
        node = hslab.slurm.get_node(victim)
        assert node.drain and node.reason.startswith(reason), node  # drained for repair, the reason says why
        recs = hslab.swap_records(jid)
        assert len(recs) == 1 and recs[0].node == victim and recs[0].evidence["preemptive"], recs
        assert recs[0].evidence["trigger"].startswith("pre-emptive swap at checkpoint step"), recs
        assert not [r for r in hslab.journal.read(job=jid) if r.event in ("signal", "requeue", "job-requeue")]
        assert re.search(rf"nodes={batch},{spare} .*spares=none swaps=1", job.comment), job.comment
        wait_text(out, rf"step={step + 5}$", 30)
    finally:
        hslab.cleanup(jid, [victim])


def test_ranks_blocked_after_the_fault_are_ended_by_hang_detection_and_resume_on_the_spare(hslab, tmp_path):
    """Issue 23: the fault reaches the job (``--device lab --collective``): XID 79 fails the next GPU call
    of the rank on the victim's GPU (it cannot save), its peer on the batch host blocks in the next
    allreduce with the grace signal held pending. The runner's hang detection ends the blocked step at
    ``--hang-after-fault``, not at the end of the grace, and the job resumes on the spare inside its
    allocation (no requeue) from the newest durable checkpoint, ending in an uninterrupted run's state.
    Every record names the faulty node, never the spare."""
    from autoheal.sbatch_helpers.examples.tiny_trainer import expected_final_state

    steps, every = 60, 6
    script = tmp_path / "job.sh"
    script.write_text(f"#!/bin/bash\n#SBATCH -N 2 --ntasks-per-node=1 --gres=gpu:1 -o {tmp_path}/out.txt\n"
                      "export MASTER_ADDR=127.0.0.1\n"  # every lab node is this machine
                      f"srun -l {PY} {TRAINER} --steps {steps} --step-seconds 0.1 --checkpoint-every {every} "
                      "--device lab --collective --timestamps\n")
    res = subprocess.run([PY, "-m", "autoheal.cli.main", "sbatch", "--spare-nodes", "1", "--grace", "60",
                          "--hang-after-fault", "3", "--parsable", str(script)], cwd=tmp_path, env=hslab.env,
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    jid = res.stdout.strip().split(";")[0]
    out = tmp_path / "out.txt"
    victim = spare = ""
    try:
        _, spare = wait_text(out, r"hot spares: steps run on (\S+); idle spare\(s\) (\S+)", 60)[0]
        starts = wait_text(out, r"^(\d+): autoheal-trainer: start step=0 \S+ restart=0 host=(\S+) ", 60, count=2)
        job = hslab.slurm.get_job(jid)
        batch = job.batch_host
        rank, victim = next((r, h) for r, h in starts if h != batch)
        gpu = int(wait_text(out, rf"^{rank}: autoheal-trainer: device lab gpus=(\d+)$", 30)[0])
        wait_text(out, rf"checkpoint saved step={every}", 60)
        wait_text(out, rf"^{rank}: autoheal-trainer: step={every + 2} ", 30)  # between two durable saves
        inject(hslab.lab, victim, gpu, "xid", xid=79)
        swapped = wait_text(out, r"^(\d+): " + SWAP_START, 90, count=2)
        wait_text(out, r"done step=\d+ final_state=", 120, count=2)
        text = out.read_text()
        run0 = text.split("reason=hot-spare-swap")[0]
        assert re.search(rf"^{rank}: autoheal-trainer: device error step=\d+ error=\S+fallen_off_the_bus", run0,
                         re.M), run0[-3000:]
        # ended by hang detection (3 s), not by the 60 s grace
        ended = re.search(r"the job's ranks are hung: .*ending the step now \(([\d.]+)s after the signal", text)
        assert ended and float(ended.group(1)) < 60, text[-3000:]
        assert {h for _, _, _, h in swapped} == {batch, spare}, swapped
        saved = [int(s) for s in re.findall(r"checkpoint saved step=(\d+)", run0)]
        assert {int(s) for _, s, _, _ in swapped} == {max(saved)}, (swapped, saved)
        finals = re.findall(r"^(\d+): autoheal-trainer: done step=(\d+) final_state=(\d+)$", text, re.M)
        assert sorted(finals) == [(r, str(steps), str(expected_final_state(steps))) for r in ("0", "1")], finals
        job = hslab.slurm.get_job(jid)
        assert job.restart_count == 0, job  # no requeue
        assert not [r for r in hslab.journal.read(job=jid) if r.event in ("requeue", "job-requeue")], \
            hslab.journal.read(job=jid)
        recs = hslab.swap_records(jid)
        assert len(recs) == 1 and recs[0].node == victim and recs[0].evidence["spare"] == spare, recs
        blamed = [r for r in hslab.journal.read(job=jid) if r.node == spare]
        assert not blamed, blamed
        assert f"@{spare}" not in job.comment, job.comment
        last = re.search(r"last=(\S+)", job.comment)
        assert last is None or last.group(1).endswith(f"@{victim}"), job.comment
    finally:
        hslab.cleanup(jid, [victim] if victim else [])
