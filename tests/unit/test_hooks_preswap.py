"""Pre-emptive swap of hot-spare jobs: the warning signs, which nodes qualify, the health pass's drain and
its reason, the resume rules, and the runner's pure side (lab behaviour: test_hotspare_lab.py)."""

from __future__ import annotations

import sys

import pytest

from autoheal.config import parse_config
from autoheal.config.hooks_section import PRESWAP_SIGNS, HooksSection
from autoheal.errors import ConfigError
from autoheal.hooks import checks as C
from autoheal.hooks import engine
from autoheal.hooks import preswap as P
from autoheal.hooks import state as S
from autoheal.hooks.gather import GpuSample, NodeSample
from autoheal.reasons import is_preswap, parse_body
from autoheal.sbatch_helpers import hotspare as hs
from autoheal.slurm.model import Job, Node
from autoheal_lab.testing.hooks import hook_context

H = HooksSection()
HOT = "autoheal-runner resumed=none nodes=n0,n1 state=running spares=n2"


def pending_remap(gpu=0):
    return C.check_remapped_rows(GpuSample(gpu, ok=True, remap_pending=True, remap_failure=False), node="n1")[0]


def job(comment=HOT, nodes=("n0", "n1", "n2"), batch="n0", jid="7", state="RUNNING"):
    return Job(jid, state, tuple(nodes), comment=comment, batch_host=batch)


# ---- signs (pure) ------------------------------------------------------------------------------------

def test_signs_from_check_results_name_the_gpu_and_node():
    thermal = C.check_clocks(GpuSample(1, ok=True, clock_events=C.CLOCKS_HW_THERMAL), node="n1")[0]
    pcie = C.check_pcie(GpuSample(2, ok=True, pcie_width=8, pcie_width_max=16), node="n1")[0]
    hot = C.check_temperature(GpuSample(3, ok=True, temperature=86), node="n1")[0]
    found = P.signs([thermal, pcie, pending_remap(), hot], {}, H, 1000.0, "n1")
    assert [s.kind for s in found] == ["remap-pending", "pcie", "thermal", "thermal"]
    assert found[0].text == "row remap pending on GPU 0 of n1"
    assert found[1].text == "PCIe link x8 below x16 on GPU 2 of n1"
    assert found[2].text == "HW thermal slowdown on GPU 1 of n1"
    assert found[3].text == "temperature 86 C on GPU 3 of n1"


def test_faults_are_not_signs():
    failure = C.check_remapped_rows(GpuSample(0, ok=True, remap_pending=True, remap_failure=True), node="n1")[0]
    too_hot = C.check_temperature(GpuSample(0, ok=True, temperature=95), node="n1")[0]
    ecc = C.CheckResult("ecc", C.FAIL, parse_body("ecc: 1 uncorrectable"), C.RESET, 0)
    assert P.signs([failure, too_hot, ecc], {}, H, 1000.0, "n1") == []
    assert P.faults_beside([failure, too_hot, ecc, pending_remap()], list(PRESWAP_SIGNS)) == [failure, too_hot, ecc]


def test_disabled_signs_are_ignored_and_an_empty_list_turns_it_off():
    h = HooksSection(preswap_signs=["thermal"])
    assert P.signs([pending_remap()], {}, h, 1000.0, "n1") == []
    # remap-pending disabled: the pending remap is a fault again (today's path)
    assert P.faults_beside([pending_remap()], h.preswap_signs) == [pending_remap()]
    assert P.signs([pending_remap()], {}, HooksSection(preswap_signs=[]), 1000.0, "n1") == []


def test_repeated_xids_and_xid_92_from_the_node_state():
    st = S.empty()
    S.remember_xid(st, 63, 0, "", 100.0)
    assert P.signs([], st, H, 200.0, "n1") == []  # once is what a single remapped row does
    S.remember_xid(st, 63, 0, "", 150.0)
    S.remember_xid(st, 92, 1, "", 150.0)
    found = P.signs([], st, H, 200.0, "n1")
    assert [(s.kind, s.text) for s in found] == [("xid", "xid 63 seen 2 times on GPU 0 of n1"),
                                                 ("ecc-rate", "high correctable ECC rate (xid 92) on GPU 1 of n1")]
    assert P.signs([], st, H, 150.0 + H.preswap_xid_window + 100, "n1") == []  # out of the window
    S.mark_repaired(st, 0, 160.0)  # a repair closes the count for that GPU
    assert [s.kind for s in P.signs([], st, H, 200.0, "n1")] == ["ecc-rate"]


def test_eligible_only_hot_spare_jobs_with_a_spare_whose_active_step_runs_here():
    assert P.eligible([job()], "n1", "autoheal-runner") == (["7"], "")
    assert P.eligible([], "n1", "autoheal-runner")[0] == []
    assert "no hot spares" in P.eligible([job("autoheal-runner nodes=n0,n1 state=running")], "n1",
                                         "autoheal-runner")[1]
    assert "no hot spares" in P.eligible([job("someone's own comment spares=n2")], "n1", "autoheal-runner")[1]
    assert "no spare left" in P.eligible([job(HOT.replace("spares=n2", "spares=none"))], "n1", "autoheal-runner")[1]
    assert "idle spare" in P.eligible([job()], "n2", "autoheal-runner")[1]
    assert "batch shell" in P.eligible([job()], "n0", "autoheal-runner")[1]
    # another job beside it on the node keeps today's path (the pre-emptive drain signals nobody)
    assert P.eligible([job(), job("", nodes=("n1",), jid="8")], "n1", "autoheal-runner")[0] == []
    assert P.eligible([job(state="PENDING")], "n1", "autoheal-runner")[0] == []


def test_config_keys_are_validated():
    cfg = parse_config('[hooks]\npreswap_signs = ["thermal", "xid"]\npreswap_xids = [63]\npreswap_xid_repeat = 3\n')
    assert cfg.hooks.preswap_signs == ["thermal", "xid"] and cfg.hooks.preswap_xids == [63]
    with pytest.raises(ConfigError, match="preswap_signs"):
        parse_config('[hooks]\npreswap_signs = ["smoke"]\n')
    with pytest.raises(ConfigError, match="preswap_xid_repeat"):
        parse_config('[hooks]\npreswap_xid_repeat = 0\n')
    with pytest.raises(ConfigError, match="preswap_xids"):
        parse_config('[hooks]\npreswap_xids = [-1]\n')


# ---- the health pass ---------------------------------------------------------------------------------

class Slurm:
    def __init__(self, jobs, reason="", flags=frozenset()):
        self.node = Node("n1", "ALLOCATED", frozenset(flags), reason)
        self.jobs = jobs
        self.calls = []

    def get_node(self, name):
        return self.node

    def list_jobs(self, node=None):
        return list(self.jobs)

    def drain(self, node, reason):
        self.calls.append(("drain", reason))
        self.node = Node("n1", self.node.state, frozenset({"DRAIN"}), reason)

    def set_reason(self, node, reason):
        self.calls.append(("set_reason", reason))
        self.node = Node("n1", self.node.state, frozenset({"DRAIN"}), reason)

    def resume(self, node):
        self.calls.append(("resume", ""))
        self.node = Node("n1", "IDLE", frozenset(), "")


def ctx_for(tmp_path, slurm, results, **hooks):
    h = HooksSection(reset_command=[sys.executable, "-c", "pass"], resume_cooldown=0, resume_after_passes=1,
                     **{"expected_gpus": 0, **hooks})
    return hook_context(h, state_dir=str(tmp_path / "state"), slurm=slurm), Observe(results)


class Observe:
    """Stands in for ``engine.observe``: every pass sees ``results`` (a test changes them between passes)."""

    def __init__(self, results):
        self.results = results
        self.sample = NodeSample(node="n1", count=1, gpus=[GpuSample(0, ok=True)])

    def __call__(self, ctx, budget, cheap=False, read_log=True, now=None):
        p = engine.Pass(node="n1", sample=self.sample, results=list(self.results))
        p.status = C.overall(p.results)
        return p


def test_health_pass_drains_with_the_preemptive_reason_and_sends_nothing_else(tmp_path, monkeypatch):
    slurm = Slurm([job()])
    ctx, observe = ctx_for(tmp_path, slurm, [pending_remap()])
    monkeypatch.setattr(engine, "observe", observe)
    p = engine.health_pass(ctx)
    assert slurm.calls == [("drain", "autoheal: pre-emptive swap: row remap pending on GPU 0 of n1")]
    assert p.actions[0].kind == "preswap-drain" and p.actions[0].jobs == ["7"]
    assert is_preswap(slurm.node.reason) and ctx.store.read()["drain"]["reason"] == slurm.node.reason
    assert [e for e, _ in ctx.records] == ["drain"] and "next checkpoint" in ctx.records[0][1]["message"]
    # the next pass keeps it (no reason churn, no fault drain over it); the ladder waits for an idle node
    engine.health_pass(ctx)
    assert len(slurm.calls) == 1
    # healthy again (the swap is done, the GPU was reset): resumed like any drain of ours
    observe.results = [C.CheckResult("remapped-rows", C.OK, gpu=0)]
    engine.health_pass(ctx)
    assert slurm.calls[-1][0] == "resume"


def test_a_warning_only_sign_blocks_the_resume_while_it_lasts(tmp_path, monkeypatch):
    thermal = C.check_clocks(GpuSample(0, ok=True, clock_events=C.CLOCKS_SW_THERMAL), node="n1")[0]
    slurm = Slurm([job()])
    ctx, observe = ctx_for(tmp_path, slurm, [thermal])
    monkeypatch.setattr(engine, "observe", observe)
    p = engine.health_pass(ctx)
    assert p.exit_code == engine.EXIT_OK and is_preswap(slurm.node.reason)
    slurm.jobs = []
    for _ in range(3):
        engine.health_pass(ctx)
    assert [c[0] for c in slurm.calls] == ["drain"]  # still throttling: stays drained
    observe.results = [C.CheckResult("clocks", C.OK, gpu=0)]
    engine.health_pass(ctx)
    assert [c[0] for c in slurm.calls] == ["drain", "resume"]


@pytest.mark.parametrize("jobs, expect", [
    ([], "autoheal: remapped-rows"),  # no job: today's fault drain
    ([job("autoheal-runner nodes=n0,n1 state=running")], "autoheal: remapped-rows"),  # no spares
    ([job(HOT.replace("spares=n2", "spares=none"))], "autoheal: remapped-rows"),  # spares used up
])
def test_other_nodes_are_left_as_today(tmp_path, monkeypatch, jobs, expect):
    slurm = Slurm(jobs)
    ctx, observe = ctx_for(tmp_path, slurm, [pending_remap()])
    monkeypatch.setattr(engine, "observe", observe)
    engine.health_pass(ctx)
    assert slurm.calls and slurm.calls[0][1].startswith(expect), slurm.calls


def test_warning_without_a_hot_spare_job_changes_nothing(tmp_path, monkeypatch):
    thermal = C.check_clocks(GpuSample(0, ok=True, clock_events=C.CLOCKS_HW_SLOWDOWN), node="n1")[0]
    slurm = Slurm([job("autoheal-runner nodes=n0,n1 state=running")])
    ctx, observe = ctx_for(tmp_path, slurm, [thermal])
    monkeypatch.setattr(engine, "observe", observe)
    assert engine.health_pass(ctx).actions == [] and slurm.calls == []


def test_a_real_fault_replaces_the_preemptive_reason(tmp_path, monkeypatch):
    slurm = Slurm([job()])
    ctx, observe = ctx_for(tmp_path, slurm, [pending_remap()])
    monkeypatch.setattr(engine, "observe", observe)
    engine.health_pass(ctx)
    xid79 = parse_body("xid 79 on GPU 0 of n1: fallen off the bus")
    observe.results = [pending_remap(), C.CheckResult("xid", C.FAIL, xid79, C.REPLACE, 0)]
    engine.health_pass(ctx)
    # XID 79 starts at the replace rung: the reason that replaces the pre-emptive one says so
    assert slurm.calls[-1] == ("set_reason", "autoheal: replace: xid 79 on GPU 0 of n1: fallen off the bus")
    assert ctx.store.read()["drain"]["reason"] == slurm.node.reason  # resumable as our fault drain


def test_someone_elses_drain_is_kept(tmp_path, monkeypatch):
    slurm = Slurm([job()], reason="admin: swap the fans", flags={"DRAIN"})
    ctx, observe = ctx_for(tmp_path, slurm, [pending_remap()])
    monkeypatch.setattr(engine, "observe", observe)
    engine.health_pass(ctx)
    assert slurm.calls == []


# ---- the runner's pure side --------------------------------------------------------------------------

def test_runner_sees_preemptive_drains_on_active_nodes_only():
    sets = hs.NodeSets(("n0", "n1"), ("n2",))
    reason = "autoheal: pre-emptive swap: row remap pending on GPU 0 of n1"
    nodes = [Node("n1", "ALLOCATED", frozenset({"DRAIN"}), reason + " [root@2026-12-01T11:00:00]"),
             Node("n2", "IDLE", frozenset({"DRAIN"}), "autoheal: pre-emptive swap: x"),
             Node("n0", "ALLOCATED", frozenset({"DRAIN"}), "autoheal: pre-emptive swap: y")]
    assert hs.preswap_targets(sets, nodes, "n0") == [("n1", reason)]
    assert hs.preswap_targets(sets, [Node("n1", "ALLOCATED", frozenset({"DRAIN"}), "autoheal: xid 79")], "n0") == []
    assert hs.preswap_only(nodes[0])
    assert not hs.preswap_only(Node("n1", "DOWN", frozenset({"DRAIN"}), reason))  # died meanwhile: a fault
    assert not hs.preswap_only(Node("n1", "ALLOCATED", frozenset({"DRAIN"}), "autoheal: xid 79"))


def test_checkpoint_taken_after_the_notice():
    assert not hs.checkpoint_taken("120", "120")
    assert hs.checkpoint_taken("120", "130")
    assert hs.checkpoint_taken("none", "10")
    assert not hs.checkpoint_taken("none", "none")


def test_the_prolog_or_epilog_drain_of_a_sign_keeps_the_preemptive_reason(tmp_path):
    reason = "autoheal: pre-emptive swap: row remap pending on GPU 0 of n1"
    slurm = Slurm([], reason=reason, flags={"DRAIN"})
    ctx, _ = ctx_for(tmp_path, slurm, [])
    assert engine.drain_for(ctx, pending_remap()).outcome.startswith("skipped")
    assert slurm.calls == []


def test_maybe_preswap_leaves_a_warning_alone_when_slurmctld_does_not_answer(tmp_path):
    from autoheal.errors import SlurmUnavailable

    class Down(Slurm):
        def get_node(self, name):
            raise SlurmUnavailable("no answer")

    thermal = C.check_clocks(GpuSample(0, ok=True, clock_events=C.CLOCKS_HW_SLOWDOWN), node="n1")[0]
    ctx, _ = ctx_for(tmp_path, Down([job()]), [thermal])
    assert P.maybe_preswap(ctx, [thermal]) is None


# ---- the runner: notice, wait for the next checkpoint, swap ----------------------------------------------

class RunnerSlurm:
    def __init__(self, job_, nodes):
        self.job, self.nodes, self.calls = job_, list(nodes), []

    def get_job(self, job_id):
        return self.job

    def list_nodes(self):
        return self.nodes

    def set_job_comment(self, job_id, comment):
        self.calls.append(("comment", comment))

    def shrink_job(self, job_id, keep):
        self.calls.append(("shrink", list(keep)))


class NoChild:
    group_alive = False


def preswap_runner(tmp_path, reason):
    from autoheal.journal import Journal
    from autoheal.sbatch_helpers import hotspare_runner as hsr
    from autoheal.sbatch_helpers import runner as r

    j = Job("42", "RUNNING", ("g1", "g2", "g3"), comment="autoheal-runner", batch_host="g1", raw_id="42")
    nodes = [Node("g1", "ALLOCATED"), Node("g2", "ALLOCATED", frozenset({"DRAIN"}), reason), Node("g3", "ALLOCATED")]
    slurm = RunnerSlurm(j, nodes)
    journal = Journal(tmp_path / "journal.jsonl", fsync=False)
    opts = r.RunnerOptions(checkpoint_dir=str(tmp_path / "ck"), grace=10, spare_nodes=1, active_nodes=2)
    runner = r.Runner(opts, r.JobIdentity("42", "42", 0, submit_dir=str(tmp_path)), slurm=slurm, journal=journal,
                      env={"PATH": "/usr/bin:/bin"}, sacct=lambda _j: None, adopt_orphans=False)
    runner.hot, runner.batch_host = hs.NodeSets(("g1", "g2"), ("g3",)), "g1"
    runner.checkpoint_dir = str(tmp_path / "ck")
    (tmp_path / "ck").mkdir()

    def poll():
        runner._preswap_next = 0.0
        return runner.hot_preswap(NoChild())

    return runner, slurm, journal, poll, hsr


def test_runner_swaps_a_preemptively_drained_node_at_the_next_checkpoint(tmp_path):
    from autoheal.sbatch_helpers.progress import report_progress

    reason = "autoheal: pre-emptive swap: row remap pending on GPU 0 of g2"
    runner, slurm, journal, poll, _ = preswap_runner(tmp_path, reason)
    report_progress(10, tmp_path / "ck")
    assert poll() is None  # noticed at step 10
    assert [rec.event for rec in journal.read()] == ["job-preswap-pending"]
    assert poll() is None and slurm.calls == []  # no new checkpoint yet: the step goes on
    report_progress(20, tmp_path / "ck")
    assert poll() == "restart"
    assert ("shrink", ["g1", "g3"]) in slurm.calls
    assert runner.hot == hs.NodeSets(("g1", "g3"), ()) and runner.swaps == 1 and runner.resized
    rec = [x for x in journal.read() if x.event == "job-hot-swap"][0]
    assert rec.node == "g2" and rec.evidence["preemptive"] and rec.evidence["checkpoint_step"] == "20"
    assert rec.evidence["trigger"] == "pre-emptive swap at checkpoint step 20: row remap pending on GPU 0 of g2"
    assert rec.severity == "action"  # notified like any swap
    assert any(c[0] == "comment" and "swaps=1" in c[1] for c in slurm.calls)
    assert poll() is None  # no spare left (and resized): nothing more


def test_runner_does_not_swap_a_node_no_longer_drained_for_it(tmp_path):
    from autoheal.sbatch_helpers.progress import report_progress

    runner, slurm, journal, poll, _ = preswap_runner(tmp_path, "autoheal: pre-emptive swap: x on GPU 0 of g2")
    report_progress(10, tmp_path / "ck")
    assert poll() is None
    slurm.nodes[1] = Node("g2", "ALLOCATED")  # an admin resumed it meanwhile
    report_progress(20, tmp_path / "ck")
    assert poll() is None and not [c for c in slurm.calls if c[0] == "shrink"] and runner.swaps == 0


def test_runner_ignores_fault_drains_there_the_fault_path_decides(tmp_path):
    from autoheal.sbatch_helpers.progress import report_progress

    runner, slurm, journal, poll, _ = preswap_runner(tmp_path, "autoheal: xid 79 on GPU 0 of g2: fallen off the bus")
    report_progress(10, tmp_path / "ck")
    assert poll() is None and list(journal.read()) == []


# ---- issue 27: slurmctld killed within seconds of the resize restarts with the job on its old nodes ------
class RunningChild:
    group_alive = True
    leader_done = False


def test_runner_releases_the_node_again_when_slurmctld_lost_the_resize(tmp_path):
    """The swap's `scontrol update NodeList=` was acknowledged, then slurmctld was killed and restarted from
    its last saved state: the job is on g1,g2,g3 again, g2 (drained) among them, and xid-watch would
    requeue it at the end of its grace. The runner sees the allocation it really has and releases g2
    again; the step goes on, nothing is requeued, the swap is not counted twice."""
    from autoheal.sbatch_helpers.progress import report_progress

    reason = "autoheal: pre-emptive swap: row remap pending on GPU 0 of g2"
    runner, slurm, journal, poll, _ = preswap_runner(tmp_path, reason)
    report_progress(10, tmp_path / "ck")
    assert poll() is None
    report_progress(20, tmp_path / "ck")
    assert poll() == "restart" and slurm.calls.count(("shrink", ["g1", "g3"])) == 1
    slurm.job = Job("42", "RUNNING", ("g1", "g3"), comment="autoheal-runner", batch_host="g1", raw_id="42")
    runner._verify_next = 0.0
    assert runner.hot_verify(RunningChild()) is None  # Slurm kept the resize: nothing to do
    # slurmctld restarted without it
    slurm.job = Job("42", "RUNNING", ("g1", "g2", "g3"), comment="autoheal-runner", batch_host="g1", raw_id="42")
    runner._verify_next = 0.0
    runner.hot_preswap(RunningChild())  # the runner's poll while the step runs
    assert slurm.calls.count(("shrink", ["g1", "g3"])) == 2
    comments = [c for c in slurm.calls if c[0] == "comment"]
    assert "swaps=1" in comments[-1][1] and "nodes=g1,g3" in comments[-1][1]  # written again, before the resize
    redone = [x for x in journal.read() if x.event == "job-hot-swap-redone"]
    assert len(redone) == 1 and redone[0].node == "g2" and "goes on" in redone[0].message
    assert runner.swaps == 1 and runner.resized
    assert [x.event for x in journal.read()].count("job-hot-swap") == 1


def test_a_fault_signal_for_the_node_back_in_a_lost_resize_is_not_a_requeue(tmp_path):
    """xid-watch's grace signal for g2 (the job is on it again in Slurm's restored view): release it again
    and go on, not the requeue path; once the step ended, start it again on the active nodes."""
    import signal as _signal

    from autoheal.sbatch_helpers.progress import report_progress

    runner, slurm, journal, poll, _ = preswap_runner(tmp_path, "autoheal: pre-emptive swap: x on GPU 0 of g2")
    report_progress(10, tmp_path / "ck")
    poll()
    report_progress(20, tmp_path / "ck")
    assert poll() == "restart"
    slurm.job = Job("42", "RUNNING", ("g1", "g2", "g3"), comment="autoheal-runner", batch_host="g1", raw_id="42")
    slurm.nodes[1] = Node("g2", "ALLOCATED", frozenset({"DRAIN"}), "autoheal: xid 79 on GPU 0 of g2")
    runner.received = int(_signal.SIGUSR1)
    assert runner.hot_fault(RunningChild(), "signal") == "continue" and runner.received is None
    assert slurm.calls.count(("shrink", ["g1", "g3"])) == 2
    slurm.job = Job("42", "RUNNING", ("g1", "g2", "g3"), comment="autoheal-runner", batch_host="g1", raw_id="42")
    assert runner.hot_fault(NoChild(), "exit 1") == "restart"  # the step died meanwhile: again, no requeue
    assert not [x for x in journal.read() if x.event in ("job-requeue", "requeue")]
