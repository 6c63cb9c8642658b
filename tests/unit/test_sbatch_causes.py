"""Why a run ended, from Slurm's data: time limit, preemption, node failure, autoheal drain, requeue."""

from __future__ import annotations

import pytest

from autoheal.sbatch_helpers import causes as c
from autoheal.slurm.model import Node

OK = Node("gpu1", "ALLOCATED")
OURS = Node("gpu2", "MIXED", frozenset({"DRAIN"}), reason="autoheal: xid 79 on gpu 3")
ADMIN = Node("gpu3", "MIXED", frozenset({"DRAIN"}), reason="bad fan")
DOWN = Node("gpu4", "DOWN", frozenset({"NOT_RESPONDING"}), reason="Not responding")


def classify(**kw):
    args = dict(signal_name="SIGUSR2", grace_signal="USR2", now=1000.0, end_time=100000, grace=120, nodes=[OK])
    args.update(kw)
    return c.classify_interrupt(**args)


def test_autoheal_drain_beats_other_node_problems_and_names_the_node():
    assert classify(nodes=[OK, ADMIN, OURS]) == c.Cause(c.AUTOHEAL_DRAIN, "gpu2", classify(nodes=[OURS]).evidence)
    assert classify(nodes=[OK, ADMIN]).kind == c.NODE_FAILURE
    assert classify(nodes=[DOWN]).node == "gpu4"


def test_time_limit_from_end_time_not_elapsed_time():
    assert classify(now=1000, end_time=1000 + 120 + 30).kind == c.TIME_LIMIT  # signal may come 60 s early
    assert classify(now=1000, end_time=1000 + 120 + 61).kind == c.SIGNAL
    assert classify(deadline_hit=True, nodes=[OURS]).kind == c.TIME_LIMIT
    assert classify(end_time=None).kind == c.SIGNAL


def test_sigterm_while_running_is_preemption_requeue_and_cancel_are_recognised():
    assert classify(signal_name="SIGTERM").kind == c.PREEMPTION
    assert classify(signal_name="SIGTERM", job_state="COMPLETING").kind == c.CANCELLED
    assert classify(signal_name="SIGTERM", requeued_elsewhere=True).kind == c.EXTERNAL_REQUEUE
    assert classify(job_state="PREEMPTED").kind == c.PREEMPTION


def test_interrupt_action_never_requeues_a_cancelled_job():
    # observed on 22.05: scancel -> COMPLETING/CANCELLED, restart count unchanged
    assert c.interrupt_action("COMPLETING", 0, 0) == "none-ending"
    assert c.interrupt_action("CANCELLED", 0, 0) == "none-ending"
    # scontrol requeue -> COMPLETING with the restart count already incremented, then PENDING
    assert c.interrupt_action("COMPLETING", 1, 0) == "none-requeued"
    assert c.interrupt_action("PENDING", 1, 1) == "none-requeued"
    assert c.interrupt_action("RUNNING", 2, 2) == "requeue"
    assert c.interrupt_action("RUNNING", None, 0) == "requeue"


def test_start_cause_recorded_then_sacct_then_node_reasons_then_external():
    assert c.classify_start(restart_count=0, recorded="", recorded_restarts=0, sacct_states=None,
                            previous_nodes=[]) is None
    rec = c.classify_start(restart_count=2, recorded="autoheal-drain@gpu2", recorded_restarts=2,
                           sacct_states=None, previous_nodes=[])
    assert (rec.kind, rec.node) == (c.AUTOHEAL_DRAIN, "gpu2")
    # a stale record (for restart 1) is not reused for restart 2
    stale = c.classify_start(restart_count=2, recorded="time-limit", recorded_restarts=1,
                             sacct_states=["REQUEUED", "NODE_FAIL", "RUNNING"], previous_nodes=[DOWN])
    assert (stale.kind, stale.node) == (c.NODE_FAILURE, "gpu4")
    no_acct = c.classify_start(restart_count=1, recorded="", recorded_restarts=0, sacct_states=None,
                               previous_nodes=[OK, OURS])
    assert no_acct.kind == c.AUTOHEAL_DRAIN
    nothing = c.classify_start(restart_count=1, recorded="", recorded_restarts=0, sacct_states=None,
                               previous_nodes=[OK])
    assert nothing.kind == c.EXTERNAL_REQUEUE


def test_sacct_states():
    assert c.from_sacct(["PREEMPTED", "RUNNING"]).kind == c.PREEMPTION
    assert c.from_sacct(["TIMEOUT", "RUNNING"]).kind == c.TIME_LIMIT
    assert c.from_sacct(["RUNNING"]) is None
    assert c.from_sacct(None) is None


def test_label():
    assert c.Cause(c.NODE_FAILURE, "gpu2").label() == "node-failure@gpu2"
    assert c.Cause(c.TIME_LIMIT).label() == "time-limit"


@pytest.mark.parametrize("states, restarts, action", [
    (["CANCELLED", "COMPLETING"], 0, "none-ending"),  # right after scancel (24.11.5, observed)
    (["CANCELLED"], 0, "none-ending"),
    (["PENDING", "COMPLETING"], 1, "none-requeued"),  # right after scontrol requeue (24.11.5, observed)
    (["PENDING"], 1, "none-requeued"),
    (["RUNNING"], 0, "requeue"),
])
def test_interrupt_action_on_2411_job_state_lists(states, restarts, action):
    from autoheal.slurm.parse import job_from_json

    job = job_from_json({"job_id": 7, "job_state": states, "restart_cnt": restarts})
    assert c.interrupt_action(job.state, job.restart_count, 0) == action


def test_a_recorded_cause_this_release_does_not_write_is_not_taken_from_the_comment():
    """``last=`` is text in the job comment (a user can edit it): only a CauseKind word is believed; anything
    else is judged as if nothing was recorded (issue 24: causes are a closed set)."""
    from autoheal.sbatch_helpers.causes import EXTERNAL_REQUEUE, NODE_FAILURE, CauseKind, classify_start

    took = classify_start(restart_count=1, recorded="node-failure@gpu2", recorded_restarts=1, sacct_states=None,
                          previous_nodes=[])
    assert took is not None and took.kind is NODE_FAILURE and took.node == "gpu2"
    forged = classify_start(restart_count=1, recorded="$(reboot)@gpu2", recorded_restarts=1, sacct_states=None,
                            previous_nodes=[])
    assert forged is not None and forged.kind is EXTERNAL_REQUEUE and isinstance(forged.kind, CauseKind)


def test_a_hang_names_and_blames_a_node_only_when_one_was_found_bad():
    up = Node("gpu1", "MIXED")
    gone = Node("gpu2", "DOWN", frozenset({"NOT_RESPONDING"}), reason="Not responding")
    plain = c.classify_hang([up], "no rank progressed for 300s")
    assert (plain.kind, plain.node, plain.node_problem) == (c.HANG, "", False)
    assert plain.label() == "hang"
    blamed = c.classify_hang([up, gone], "no rank progressed for 300s")
    assert (blamed.kind, blamed.node, blamed.node_problem) == (c.HANG, "gpu2", True)
    assert "no rank progressed" in blamed.evidence and "Not responding" in blamed.evidence
    # the next run reads it back from the comment
    again = c.classify_start(restart_count=1, recorded="hang@gpu2", recorded_restarts=1, sacct_states=None,
                             previous_nodes=[])
    assert (again.kind, again.node) == (c.HANG, "gpu2")


def test_unsettled_nodes_are_those_not_responding_and_not_yet_down():
    nodes = [Node("a", "MIXED"), Node("b", "MIXED", frozenset({"NOT_RESPONDING"})),
             Node("c", "DOWN", frozenset({"NOT_RESPONDING"})), Node("d", "IDLE", frozenset({"NOT_RESPONDING", "FAIL"}))]
    assert c.unsettled(nodes) == ["b"]
