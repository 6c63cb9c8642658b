"""The job-hot-swap record says what the runner knows of where the ranks resume (tiers bench: it said
"resuming from checkpoint step 40" while the ranks resumed from the memory tier at step 51)."""

from __future__ import annotations

from autoheal.journal import Journal
from autoheal.sbatch_helpers import hotspare as hs
from autoheal.sbatch_helpers import runner as r
from autoheal.sbatch_helpers.hotspare_runner import resume_words
from autoheal.sbatch_helpers.memtier import AGENTS_ENV
from autoheal.sbatch_helpers.progress import report_progress
from autoheal.slurm.model import Job, Node


class Slurm:
    def __init__(self, job, nodes):
        self.job, self.nodes, self.calls = job, nodes, []

    def get_job(self, job_id):
        return self.job

    def list_nodes(self):
        return list(self.nodes)

    def set_job_comment(self, job_id, comment):
        self.calls.append(("comment", comment))

    def shrink_job(self, job_id, keep):
        self.calls.append(("shrink", list(keep)))


class NoChild:
    group_alive = False


def swap_record(tmp_path, env):
    job = Job("42", "RUNNING", ("g1", "g2", "g3"), comment="autoheal-runner", batch_host="g1", raw_id="42")
    drained = Node("g2", "ALLOCATED", frozenset({"DRAIN"}), "autoheal: replace: xid 79 on GPU 0")
    journal = Journal(tmp_path / "journal.jsonl", fsync=False)
    opts = r.RunnerOptions(checkpoint_dir=str(tmp_path / "ck"), grace=10, spare_nodes=1, active_nodes=2)
    runner = r.Runner(opts, r.JobIdentity("42", "42", 0, submit_dir=str(tmp_path)),
                      slurm=Slurm(job, [Node("g1", "ALLOCATED"), drained, Node("g3", "ALLOCATED")]),
                      journal=journal, env=dict(env, PATH="/usr/bin:/bin"), sacct=lambda _j: None,
                      adopt_orphans=False)
    runner.hot, runner.batch_host = hs.NodeSets(("g1", "g2"), ("g3",)), "g1"
    runner.checkpoint_dir = str(tmp_path / "ck")
    (tmp_path / "ck").mkdir()
    report_progress(40, tmp_path / "ck")  # the newest durable step
    assert runner.hot_fault(NoChild(), "signal") == "restart"
    return [x for x in journal.read() if x.event == "job-hot-swap"][0]


def test_with_the_memory_tier_the_swap_names_the_durable_step_and_the_memory_copy(tmp_path):
    rec = swap_record(tmp_path, {AGENTS_ENV: "g1=127.0.0.1:7001,g2=127.0.0.1:7002,g3=127.0.0.1:7003"})
    assert "durable checkpoint step 40, or from a newer peer-memory copy" in rec.message, rec.message
    assert "resuming from checkpoint step 40" not in rec.message
    assert rec.evidence["checkpoint_step"] == "40" and rec.evidence["memory_tier"] is True


def test_without_the_memory_tier_the_swap_names_the_checkpoint_step(tmp_path):
    rec = swap_record(tmp_path, {})
    assert "resuming from checkpoint step 40 on g1,g3" in rec.message and "memory" not in rec.message
    assert rec.evidence["memory_tier"] is False


def test_resume_words_never_name_a_step_for_the_memory_copy():
    assert resume_words("40", False) == "resuming from checkpoint step 40"
    assert resume_words("none", False) == "starting with no checkpoint autoheal knows of"
    assert "step none" not in resume_words("none", True) and "peer-memory copy" in resume_words("none", True)
    assert resume_words("40", True).count("step") == 1
