"""The drill stamps each phase from its evidence's own clock (autoheal_lab.stamping), not from its poll."""

from __future__ import annotations

import json

import pytest

from autoheal.slurm.model import Job, Node
from autoheal_lab.drill import Drill, DrillReport, OutputTail, Phase, render_timeline, restamp, watch
from autoheal_lab.stamping import Clock, Evidence, Observation, Stamp, pick, stamp, stamp_all

FAULT = 1_800_000_000.0


def test_a_sub_second_record_is_the_phase_time_however_late_the_poll_saw_it():
    # issue 23: the drill printed "fault -> drain 1.7 s" (its poll) while the journal said 45 ms
    got = stamp(Evidence("drain", FAULT + 0.045, Clock.JOURNAL), polled_at=FAULT + 1.7, floor=FAULT)
    assert got == Stamp(FAULT + 0.045, Clock.JOURNAL, "", 0.0)


def test_evidence_without_a_time_falls_back_to_the_poll_and_says_polled():
    got = stamp(Evidence("job comment"), polled_at=FAULT + 3.2, floor=FAULT + 1.0)
    assert got.at == FAULT + 3.2 and got.clock is Clock.POLLED and got.note.startswith("polled")
    # a clock-less Evidence marked with a real clock but no time is still only polled
    assert stamp(Evidence("x", None, Clock.JOURNAL), FAULT + 2, FAULT).clock is Clock.POLLED


def test_evidence_before_the_fault_is_clock_skew_clamped_to_the_fault_and_said():
    got = stamp(Evidence("signal", FAULT - 2.5, Clock.TRAINER), polled_at=FAULT + 1, floor=FAULT)
    assert got.at == FAULT and got.clock is Clock.TRAINER
    assert "clock skew" in got.note and "2.500 s before the fault" in got.note


def test_evidence_after_the_poll_that_saw_it_is_skew_the_other_way_clamped_to_the_poll():
    got = stamp(Evidence("start", FAULT + 9.0, Clock.TRAINER), polled_at=FAULT + 6.0, floor=FAULT)
    assert got.at == FAULT + 6.0 and "after the poll" in got.note


def test_a_whole_second_clock_keeps_what_is_left_of_its_second_and_prints_the_middle():
    # Slurm's StartTime 1005 means [1005, 1006); the poll at 1005.4 saw it: it was in [1005, 1005.4]
    got = stamp(Evidence("running", FAULT + 5, Clock.SLURM), polled_at=FAULT + 5.4, floor=FAULT + 2.0)
    assert got.at == pytest.approx(FAULT + 5.2) and got.uncertainty == pytest.approx(0.2)
    assert got.clock is Clock.SLURM and got.note == ""
    # the fault came at .4 of the second Slurm wrote: truncation, not skew; the phase is in [fault, +0.6]
    got = stamp(Evidence("drain", FAULT, Clock.SLURM), polled_at=FAULT + 3.0, floor=FAULT + 0.4,
                floor_name="the fault")
    assert got.at == pytest.approx(FAULT + 0.7) and got.uncertainty == pytest.approx(0.3)
    assert got.note.startswith("whole-second clock") and "clock skew" not in got.note
    # more than a second before the floor: a whole-second clock cannot excuse that
    got = stamp(Evidence("drain", FAULT - 2, Clock.KUBE), polled_at=FAULT + 3.0, floor=FAULT + 0.4)
    assert got.at == FAULT + 0.4 and "clock skew" in got.note


def test_the_most_precise_timed_evidence_is_picked():
    slurm = Evidence("", FAULT + 1, Clock.SLURM)
    journal = Evidence("", FAULT + 0.05, Clock.JOURNAL)
    assert pick([slurm, journal]) is journal  # sub-second beats whole seconds, whatever the order
    assert pick([None, slurm]) is slurm
    assert pick([Evidence("p"), slurm]) is slurm  # a polled candidate has no time to offer
    assert pick([None, None]) is None
    polled = Evidence("p")
    assert pick([polled]) is polled


def test_phases_stay_ordered_a_phase_before_its_cause_is_clamped_to_it_and_named():
    obs = [Observation("drained", Evidence("", FAULT + 0.05, Clock.JOURNAL), FAULT + 1.7),
           Observation("job requeued", Evidence("", FAULT + 0.02, Clock.JOURNAL), FAULT + 5.0, follows=0),
           Observation("never seen", None, None, follows=1),
           Observation("after the unseen one", Evidence("", FAULT + 0.01, Clock.TRAINER), FAULT + 8.0, follows=2)]
    got = stamp_all(FAULT, obs)
    assert got[0].at == FAULT + 0.05 and got[0].note == ""
    assert got[1].at == FAULT + 0.05 and "before 'drained'" in got[1].note
    assert got[2] is None
    # its cause was never seen: the bound is that cause's own cause
    assert got[3].at == FAULT + 0.05 and "before 'job requeued'" in got[3].note
    assert [s.at for s in got if s] == sorted(s.at for s in got if s)


def test_restamp_replaces_the_poll_time_and_the_report_says_which_clock(tmp_path):
    rep = DrillReport(fault_time=FAULT, node="gpu2", job_id="7")
    inject = Phase("XID 79 injected", "lab inject", at=FAULT, evidence=Evidence("", FAULT, Clock.INJECT),
                   polled_at=FAULT)
    drained = Phase("drained in Slurm with an autoheal reason", "slurm + journal",
                    lambda: Evidence("gpu2 MIXED+DRAIN: autoheal: xid 79", FAULT + 0.045, Clock.JOURNAL))
    record = Phase("user-visible record", "slurm + journal", lambda: Evidence("job comment"), after=drained)
    rep.phases = [inject, drained, record]
    watch(rep.phases[1:], 5.0, poll=0)
    drained.polled_at = FAULT + 1.7  # as when the sequential poll got round to scontrol 1.7 s late
    record.polled_at = FAULT + 2.0
    restamp(rep.phases, FAULT)
    data = rep.to_dict()
    assert data["totals"]["fault_to_drain_s"] == 0.045
    by = {p["phase"]: p for p in data["phases"]}
    assert by["drained in Slurm with an autoheal reason"]["clock"] == "journal"
    assert by["drained in Slurm with an autoheal reason"]["polled_s"] == 1.7
    assert by["user-visible record"]["clock"] == "polled" and by["user-visible record"]["seconds_after_fault"] == 2.0
    text = render_timeline(rep)
    assert "0.04  drained in Slurm" in text or "0.05  drained in Slurm" in text
    assert " journal " in text and " polled " in text and "fault -> drain: 0.0 s" in text
    json.dumps(data)


class _Lab:
    def __init__(self, root):
        from autoheal_lab.slurmconf import LabLayout

        self.lay = LabLayout(root=root, nodes=["gpu1", "gpu2", "gpu3"], spares=["spare1"], gpus=8,
                             ctld_port=1, node_ports={}, rest_port=2)

    def layout(self):
        return self.lay

    def slurm_env(self):
        return {}

    def load_state(self):
        return {}


class _Slurm:
    def __init__(self):
        self.node = Node("gpu2", "MIXED", frozenset({"DRAIN"}), "autoheal: replace: xid 79", "root",
                         int(FAULT))
        self.job = Job("7", "RUNNING", ("gpu1", "gpu3"), restart_count=1, start_time=int(FAULT) + 14)

    def get_node(self, name):
        return self.node

    def get_job(self, job_id):
        return self.job


def _journal(drill, *records):
    path = drill.lay.path("journal", "journal.jsonl")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in records))


def test_the_probes_hand_over_their_sources_own_times(tmp_path):
    drill = Drill(_Lab(tmp_path), kube=False)
    drill.slurm = _Slurm()
    drill.report.job_id, drill.report.fault_time = "7", FAULT + 0.4
    # no journal record yet: waits a moment for xid-watch's record, then takes Slurm's whole-second reason time
    waiting = drill._drained_probe("gpu2")
    assert "waiting for xid-watch's journal record" in waiting().note
    got = drill._drained_probe("gpu2", record_wait=0)()
    assert got.clock is Clock.SLURM and got.time == FAULT and "MIXED+DRAIN" in got.detail
    _journal(drill, {"event": "drain", "node": "gpu2", "time": FAULT + 0.445, "message": "m"},
             {"event": "job-requeue", "node": "gpu2", "job_ids": ["7"], "time": FAULT + 5.4, "message": "rq"})
    got = drill._drained_probe("gpu2")()
    assert got.clock is Clock.JOURNAL and got.time == FAULT + 0.445  # sub-second beats Slurm's second
    got = drill._requeued_probe()()
    assert got.clock is Clock.JOURNAL and got.time == FAULT + 5.4
    _journal(drill)  # no requeue record: a moment's wait for it, then the poll's time
    assert "waiting for the requeue's journal record" in drill._requeued_probe()().note
    assert drill._requeued_probe(record_wait=0)().clock is Clock.POLLED
    got = drill._running_again_probe("gpu2")()
    assert got.clock is Clock.SLURM and got.time == FAULT + 14  # the job's StartTime
    drill.tail = OutputTail(tmp_path / "job.out")
    drill.tail.lines = [(FAULT + 3.0, f"1: autoheal-trainer: device error step=16 error=GPU_lost exit=1 "
                                      f"time={FAULT + 0.52:.3f}")]
    got = drill._trainer_probe(r"device error step=(\d+) error=(\S+)")()
    assert got.clock is Clock.TRAINER and got.time == pytest.approx(FAULT + 0.52)
    assert got.detail == "device error step=16 error=GPU_lost exit=1"  # the time is not part of the detail


def test_a_precise_effect_pulls_its_polled_cause_back_so_the_phases_stay_ordered():
    # lab run 2026-12-03: "pods evicted" (an annotation, polled 8.78 s) is the cause of "replacement
    # requested" (the sync's journal record, 8.74 s): the cause must not print after its effect
    obs = [Observation("drained", Evidence("", FAULT + 0.13, Clock.JOURNAL), FAULT + 0.2),
           Observation("pods evicted", Evidence("annotation"), FAULT + 8.78, follows=0),
           Observation("replacement requested", Evidence("", FAULT + 8.74, Clock.JOURNAL), FAULT + 8.80, follows=1),
           Observation("running again", Evidence("", FAULT + 21, Clock.SLURM), FAULT + 21.56, follows=0),
           Observation("restarted", Evidence("", FAULT + 21.2, Clock.TRAINER), FAULT + 24.6, follows=3)]
    got = stamp_all(FAULT, obs)
    assert got[1].at == FAULT + 8.74 and got[1].clock is Clock.POLLED and "no later than 'replacement" in got[1].note
    assert got[2].at == FAULT + 8.74 and got[2].note == ""  # a polled cause never pushes its effect forward
    # Slurm's second [21, 21.56] is cut by the trainer's start at 21.2: [21, 21.2]
    assert got[3].at == pytest.approx(FAULT + 21.1) and got[3].uncertainty == pytest.approx(0.1)
    assert got[4].at == FAULT + 21.2
    chain = [got[0], got[1], got[2]]
    assert [s.at for s in chain] == sorted(s.at for s in chain) and got[3].at <= got[4].at


class _Kube:
    prefix = "autoheal.io"

    def __init__(self):
        self.nodes = {"gpu2": {"metadata": {"name": "gpu2"}, "spec": {"unschedulable": True},
                               "status": {"conditions": [{"type": "GPUHealthy", "status": "False", "reason": "XID79",
                                                          "lastTransitionTime": "2027-01-15T08:00:00Z"}]}}}

    def node(self, name):
        return self.nodes.get(name)

    def replacements(self):
        return []


def test_the_cordon_phase_is_not_stamped_by_the_conditions_earlier_time(tmp_path):
    """Lab run 2026-12-03: with the sync's cordon record not yet written, the phase "GPUHealthy=False and
    cordon" took the condition's lastTransitionTime (0.9 s) although the cordon came at 8.8 s."""
    drill = Drill(_Lab(tmp_path), kube=False)
    drill.kube_view = _Kube()
    drill.report.fault_time = FAULT
    probe = next(p for p in drill._kube_probes("gpu2") if p.name.startswith("Kubernetes: GPUHealthy")).probe
    got = probe()
    assert got.time is None and got.clock is Clock.POLLED  # the cordon has no time of its own here
    _journal(drill, {"event": "remediation", "node": "gpu2", "time": FAULT + 8.25,
                     "message": "Node gpu2 cordoned for replacement (Slurm gpu2)"})
    got = probe()
    assert got.clock is Clock.JOURNAL and got.time == FAULT + 8.25
