"""The drill's report: statuses, totals, the timeline text and the plot, without a lab."""

from __future__ import annotations

import pytest

from autoheal_lab.drill import DrillReport, Phase, plot_timeline, render_timeline


def _report(**missing) -> DrillReport:
    rep = DrillReport(fault_time=1000.0, node="gpu2", job_id="7")
    rep.phases = [
        Phase("XID 79 injected on GPU 3 of gpu2", "lab inject", at=1000.0),
        Phase("drained in Slurm with an autoheal reason", "slurm", at=1000.4, detail="autoheal: xid 79"),
        Phase("replacement requested", "kubernetes", skipped="--no-kube"),
        Phase("job running again, away from the bad node", "slurm",
              at=None if missing.get("running") else 1013.5),
        Phase("trainer restarted at the right step", "trainer output", at=1014.0,
              failed=missing.get("wrong_step", "")),
    ]
    return rep


def test_all_observed_or_skipped_is_ok_with_totals():
    rep = _report()
    data = rep.to_dict()
    assert data["ok"] is True
    assert data["totals"] == {"fault_to_drain_s": 0.4, "fault_to_grace_signal_s": None, "fault_to_requeued_s": None,
                              "fault_to_job_running_again_s": 13.5,
                              "fault_to_replacement_in_service_s": None, "fault_to_trainer_resumed_s": 14.0}
    assert [p["status"] for p in data["phases"]] == ["observed", "observed", "skipped", "observed", "observed"]
    text = render_timeline(rep)
    assert "drill PASSED" in text and "skipped" in text and "fault -> drain: 0.4 s" in text


def test_missing_phase_fails_the_drill_and_is_named():
    rep = _report(running=True)
    assert rep.ok is False
    text = render_timeline(rep)
    assert "MISSING  job running again" in text and "drill FAILED" in text


def test_contradicted_phase_fails_the_drill_with_why():
    rep = _report(wrong_step="resumed from step 10, but the last checkpoint saved before the fault was step 14")
    data = rep.to_dict()
    assert data["ok"] is False
    failed = [p for p in data["phases"] if p["status"] == "failed"]
    assert failed and "step 14" in failed[0]["why"]
    assert "FAILED: resumed from step 10" in render_timeline(rep)


def test_plot_writes_a_png(tmp_path):
    pytest.importorskip("matplotlib")
    out = tmp_path / "t.png"
    plot_timeline(_report(), str(out))
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and out.stat().st_size > 5000


# ---- causal phases: the judges on recorded evidence -------------------------------------------------
from datetime import datetime, timezone  # noqa: E402

from autoheal.errors import SlurmUnavailable  # noqa: E402
from autoheal.slurm.model import Job, Node  # noqa: E402
from autoheal_lab.drill import (  # noqa: E402
    EXIT_DRILL_ERROR,
    Contradiction,
    Drill,
    Waiting,
    find_request,
    judge_requeued,
    judge_running_again,
    judge_spare,
    restamp,
    watch,
)
from autoheal_lab.slurmconf import LabLayout  # noqa: E402
from autoheal_lab.stamping import Clock, Evidence  # noqa: E402

FAULT = 1_800_000_000.0


def _iso(t: float) -> str:
    return datetime.fromtimestamp(t, timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def _cr(node, created, spare=""):
    return {"metadata": {"name": node, "creationTimestamp": _iso(created)}, "spec": {"nodeName": node},
            "status": {"replacementNode": spare} if spare else {}}


def test_requeued_and_running_again_count_only_a_restart_after_the_fault():
    # the job had already been requeued once before this fault: restart 1 is not this requeue
    assert isinstance(judge_requeued(Job("7", "RUNNING", ("gpu1", "gpu2"), restart_count=1), 1), Waiting)
    assert "restart 2" in judge_requeued(Job("7", "PENDING", restart_count=2), 1)
    before = Job("7", "RUNNING", ("gpu1", "gpu2"), restart_count=1)
    assert isinstance(judge_running_again(before, 1, "gpu2"), Waiting)  # still the run from before the fault
    again = Job("7", "RUNNING", ("gpu1", "gpu3"), restart_count=2)
    assert judge_running_again(again, 1, "gpu2") == "job 7 RUNNING on gpu1,gpu3 (restart 2)"
    with pytest.raises(Contradiction, match="drained node gpu2"):
        judge_running_again(Job("7", "RUNNING", ("gpu2", "gpu3"), restart_count=2), 1, "gpu2")


def test_running_again_says_why_it_waits_and_fails_fast_on_an_ended_job():
    held = Job("7", "PENDING", restart_count=1, state_reason="JobHeldUser")
    waiting = judge_running_again(held, 0, "gpu2")
    assert isinstance(waiting, Waiting) and "PENDING (JobHeldUser), restart 1" in waiting.note
    with pytest.raises(Contradiction, match="ended FAILED"):
        judge_running_again(Job("7", "FAILED", restart_count=0), 0, "gpu2")


def test_the_replacement_request_is_this_nodes_and_from_this_fault():
    crs = [_cr("gpu10", FAULT + 2, "spare2"),  # another node whose name contains "gpu1"
           _cr("gpu1", FAULT - 600, "spare1")]  # an earlier fault's request
    assert find_request(crs, None, "gpu1", FAULT) is None
    crs.append(_cr("gpu1", FAULT + 3))
    assert find_request(crs, None, "gpu1", FAULT) == {"kind": "NodeReplacement", "name": "gpu1", "spare": ""}
    crs[-1]["status"] = {"replacementNode": "spare1"}
    assert find_request(crs, None, "gpu1", FAULT)["spare"] == "spare1"
    # label and webhook actions: the provider names the new Node on the old one
    old = {"metadata": {"name": "gpu1", "annotations": {"autoheal.io/replacement-node": "spare3"}}}
    assert find_request([], old, "gpu1", FAULT) == {"kind": "Node annotation",
                                                    "name": "gpu1 autoheal.io/replacement-node", "spare": "spare3"}


def test_the_spare_counts_only_in_service_with_a_kubernetes_node():
    assert isinstance(judge_spare("spare1", Node("spare1", "IDLE", frozenset({"DRAIN"}), "autoheal: spare: held"),
                                  True), Waiting)
    assert isinstance(judge_spare("spare1", Node("spare1", "IDLE", frozenset({"NOT_RESPONDING"})), True), Waiting)
    assert isinstance(judge_spare("spare1", Node("spare1", "IDLE"), False), Waiting)
    assert judge_spare("spare1", Node("spare1", "IDLE"), True).startswith("spare1 IDLE in Slurm")


class _FakeLab:
    def __init__(self, root):
        self.lay = LabLayout(root=root, nodes=["gpu1", "gpu2", "gpu3"], spares=["spare1", "spare2"], gpus=8,
                             ctld_port=1, node_ports={}, rest_port=2)

    def layout(self):
        return self.lay

    def slurm_env(self):
        return {}

    def load_state(self):
        return {"kubeconfig": "unused"}


class _Recorded:
    """Slurm and Kubernetes answering from a script of recorded evidence, changed by the test."""

    prefix = "autoheal.io"

    def __init__(self):
        self.nodes = {}
        self.kube_nodes = {}
        self.crs = []

    # slurm
    def get_node(self, name):
        return self.nodes.get(name) or Node(name, "IDLE")

    # kubernetes
    def node(self, name):
        return self.kube_nodes.get(name)

    def replacements(self):
        return list(self.crs)


def _spare_phases(tmp_path):
    drill = Drill(_FakeLab(tmp_path))
    ev = _Recorded()
    drill.slurm = drill.kube_view = ev
    drill.report.fault_time = FAULT
    phases = {p.name: p for p in drill._kube_probes("gpu2")}
    return drill, ev, phases["replacement requested"], phases["spare node in service"]


def test_an_idle_spare_from_before_is_not_in_service_until_this_nodes_request_names_it(tmp_path):
    """Issue 11 finding 3: an idle spare with a Node (left by an earlier run) was stamped in service 30 s
    before the failed node's cordon. The spare counts only once this node's request names it."""
    drill, ev, requested, spare = _spare_phases(tmp_path)
    ev.kube_nodes = {"spare1": {"metadata": {"name": "spare1"}}, "spare2": {"metadata": {"name": "spare2"}}}
    assert isinstance(spare.probe(), Waiting)  # no request yet: nothing counts
    assert isinstance(requested.probe(), Waiting)
    ev.crs = [_cr("gpu2", FAULT + 5)]
    req = requested.probe()
    # stamped by the request's own creationTimestamp (Kubernetes, whole seconds), not by the poll
    assert req.detail == "NodeReplacement gpu2 for gpu2" and req.time == FAULT + 5 and req.clock.value.startswith("kub")
    assert "names no replacement yet" in spare.probe().note
    ev.crs = [_cr("gpu2", FAULT + 5, "spare2")]
    ev.nodes["spare2"] = Node("spare2", "IDLE", frozenset({"DRAIN"}), "autoheal: spare: held")
    assert "spare2 IDLE+DRAIN" in spare.probe().note  # spare1 is idle, but it is not the one named
    ev.nodes["spare2"] = Node("spare2", "IDLE")
    ev.nodes["gpu2"] = Node("gpu2", "IDLE", frozenset({"DRAIN"}), "autoheal: retired: replaced by spare2")
    got = spare.probe()
    assert got.time is None  # "in service" has no time of its own: the poll's
    detail = got.detail
    assert detail.startswith("spare2 IDLE in Slurm with a Kubernetes Node; named by NodeReplacement gpu2")
    assert "retired: replaced by spare2" in detail
    ev.crs = [_cr("gpu2", FAULT + 5, "gpu9")]
    drill.request = None
    requested.probe()
    with pytest.raises(Contradiction, match="names gpu9, not a lab node"):
        spare.probe()


# ---- watch(): missing, contradicted and errored phases are told apart ----------------------------------
class _Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now

    def sleep(self, s):
        self.now += s


def _watched(*probes, timeout=5.0):
    rep = DrillReport(fault_time=1000.0, node="gpu2", job_id="7")
    rep.phases = [Phase(f"p{i}", "test", probe) for i, probe in enumerate(probes)]
    clock = _Clock()
    watch(rep.phases, timeout, clock=clock, sleep=clock.sleep)
    return rep


def test_a_probe_that_raises_is_a_drill_error_not_a_missing_phase():
    def broken():
        raise KeyError("replacementNode")

    rep = _watched(lambda: Evidence("seen", 1001.0, Clock.JOURNAL), broken)
    data = rep.to_dict()
    assert [p["status"] for p in data["phases"]] == ["observed", "error"]
    assert "KeyError" in data["phases"][1]["why"] and data["errors"]
    assert rep.exit_code == EXIT_DRILL_ERROR and data["exit_code"] == EXIT_DRILL_ERROR
    text = render_timeline(rep)
    assert "ERROR  p1" in text and "drill ERROR" in text and "MISSING" not in text


def test_a_missing_phase_keeps_its_last_evidence_and_exits_1():
    rep = _watched(lambda: Waiting("job 7 PENDING (JobHeldAdmin), restart 1"))
    assert rep.phases[0].status == "missing" and rep.exit_code == 1
    assert "last seen: job 7 PENDING (JobHeldAdmin)" in render_timeline(rep)


def test_transient_read_failures_are_retried_and_an_error_only_if_they_last():
    calls = []

    def flaky():
        calls.append(1)
        if len(calls) < 3:
            raise SlurmUnavailable("slurmctld did not answer")
        return Evidence("seen after two failed reads")

    def down():
        raise SlurmUnavailable("slurmctld did not answer")

    rep = _watched(flaky, down)
    assert rep.phases[0].status == "observed" and rep.phases[0].detail == "seen after two failed reads"
    assert rep.phases[1].status == "error" and "kept failing until the deadline" in rep.phases[1].error
    assert rep.exit_code == EXIT_DRILL_ERROR


def test_a_contradiction_fails_the_phase_at_once():
    def wrong():
        raise Contradiction("job runs again on the drained node gpu2")

    rep = _watched(wrong, lambda: None)
    assert [p.status for p in rep.phases] == ["failed", "missing"] and rep.exit_code == 1


def test_a_phase_is_polled_only_after_the_phase_it_follows():
    # every probe is a Slurm or API call: polling all of them each tick made ticks 1-2 s long
    from autoheal_lab.drill import Phase, Waiting, watch

    calls = {"first": 0, "second": 0}

    def first():
        calls["first"] += 1
        return Evidence("seen", 100.0, Clock.JOURNAL) if calls["first"] >= 3 else Waiting("not yet")

    def second():
        calls["second"] += 1
        return Evidence("seen", 101.0, Clock.TRAINER)

    a = Phase("first", "slurm", first)
    b = Phase("second", "slurm", second, after=a)
    ticks = iter(range(100))
    watch([a, b], timeout=50, poll=0, clock=lambda: float(next(ticks)), sleep=lambda s: None)
    restamp([a, b], 0.0)
    assert a.at == 100.0 and b.at == 101.0 and (a.clock, b.clock) == ("journal", "trainer clock")
    assert calls == {"first": 3, "second": 1}


def test_drill_submitit_without_submitit_is_a_usage_error_before_any_lab_starts(tmp_path, monkeypatch):
    from click.testing import CliRunner

    from autoheal_lab import drill_submitit
    from autoheal_lab.cli import lab as lab_cli

    monkeypatch.setattr(drill_submitit, "submitit_available", lambda: False)
    res = CliRunner().invoke(lab_cli, ["drill", "--submitit", "--dir", str(tmp_path / "lab")])
    assert res.exit_code == 2 and "pip install submitit" in res.output
    assert not (tmp_path / "lab").exists()


def test_hot_spare_phases_release_without_requeue_and_resume_on_the_spare(tmp_path):
    from autoheal_lab.drill import OutputTail

    drill = Drill(_FakeLab(tmp_path), hot_spare=True)
    ev = _Recorded()
    jobs = {"7": Job("7", "RUNNING", ("gpu1", "gpu2", "gpu3"))}
    ev.get_job = lambda job_id: jobs[job_id]
    drill.slurm = ev
    drill.report.job_id, drill.report.fault_time, drill.spare = "7", FAULT, "gpu3"
    released = drill._released_probe("gpu2")
    assert isinstance(released(), Waiting)  # the bad node is still in the allocation
    jobs["7"] = Job("7", "RUNNING", ("gpu1", "gpu3"))
    assert released().detail.startswith("job 7 RUNNING on gpu1,gpu3 (restart 0); gpu2 IDLE")
    jobs["7"] = Job("7", "PENDING", (), restart_count=1)
    with pytest.raises(Contradiction, match="requeued"):
        released()
    drill.tail = OutputTail(tmp_path / "job.out")
    line = ("autoheal-trainer: start step=14 resumed_from=/c/ckpt-14 restart=0 host={} rank={} world=2 steps=9 "
            "reason=hot-spare-swap")
    drill.tail.lines = [(FAULT - 5, line.format("gpu2", 1).replace("hot-spare-swap", "none")),
                        (FAULT + 1, line.format("gpu1", 0) + f" time={FAULT + 0.8:.3f}"),
                        (FAULT + 1.1, line.format("gpu3", 1))]
    drill.saved_step = 14
    # the spare's line has no time of its own (poll); rank 0's carries the trainer's clock
    assert drill._swap_start_probe(on_spare=True)() == Evidence("rank 1 started on the spare gpu3 at step 14")
    assert drill._swap_start_probe()() == Evidence("resumed from step 14 (/c/ckpt-14)", FAULT + 0.8, Clock.TRAINER)
    drill.saved_step = 15
    with pytest.raises(Contradiction, match="resumed from step 14"):
        drill._swap_start_probe()()


def test_fault_reaches_job_aims_at_the_gpu_the_rank_on_the_node_holds_and_measures_lost_steps(tmp_path):
    from autoheal_lab.drill import OutputTail, render_timeline

    drill = Drill(_FakeLab(tmp_path))  # the default: the fault reaches the job
    assert drill.fault_reaches_job and drill.report.fault_reaches_job
    drill.workdir.mkdir(parents=True)
    script = drill._script().read_text()
    assert "#SBATCH --gres=gpu:1" in script and "srun -l " in script
    assert "--device lab --collective --timestamps --event-times" in script
    plain = Drill(_FakeLab(tmp_path), opt_in=False)  # plain sbatch too: the world is not kinder to it
    plain.workdir.mkdir(parents=True, exist_ok=True)
    assert "--device lab --collective" in plain._script().read_text()
    drill.tail = OutputTail(tmp_path / "job.out")
    t = "autoheal-trainer: "
    drill.tail.lines = [(1.0, f"1: {t}device lab gpus=1")]
    assert not drill._aim_at_rank_on("gpu2")  # the rank has not said where it runs yet
    drill.tail.lines += [(1.1, f"0: {t}device lab gpus=0"),
                         (1.2, f"1: {t}start step=0 resumed_from=none restart=0 host=gpu2 rank=1 world=2 steps=9 "
                               "reason=none"),
                         (1.3, f"0: {t}start step=0 resumed_from=none restart=0 host=gpu1 rank=0 world=2 steps=9 "
                               "reason=none")]
    assert drill._aim_at_rank_on("gpu2") and drill.gpu == 1
    assert drill._aim_at_rank_on("gpu1") and drill.gpu == 0
    (tmp_path / "job.out").write_text("")  # poll() reads from here; the lines below are what it saw before
    drill.tail.offset = 0
    drill.tail.lines += [(2.0, f"0: {t}step=12 time=2.0"), (2.0, f"1: {t}step=11 time=2.0"),
                         (9.0, f"0: {t}start step=10 resumed_from=/c/ckpt-10 restart=1 host=gpu1 rank=0"),
                         (9.0, f"1: {t}start step=10 resumed_from=/c/ckpt-10 restart=1 host=gpu3 rank=1")]
    drill._measure_lost_steps()
    assert drill.report.lost_steps == 2 and drill.report.to_dict()["lost_steps"] == 2
    assert "lost steps: 2" in render_timeline(drill.report)
    assert Drill.PROGRESS_RX.search("step=15 time=1796276514.618").group(1) == "15"
