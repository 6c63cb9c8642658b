"""The soak's invariants for the hot-spare trainer and the submitit job, on hand-made snapshots, journal
records and outputs: a swap to the spare is a job running again (and counted as a swap, not a requeue),
swaps count against the faults that hit the job's nodes, the frozen comment of a resized job is judged
against the journal's swap record, and a submitit job's runs resume from submitit's own checkpoint."""

from __future__ import annotations

import json

from autoheal.sbatch_helpers.examples.submitit_job import expected_final_state, next_state
from autoheal_lab.soak_checks import Injected, JobMeta, Monitor, Snapshot, check_submitit_output, frozen_comment

HS, SUB = "20", "21"


def _node(state="IDLE", drain=False, reason=""):
    return {"state": state, "drain": drain, "reason": reason, "responding": True}


def _nodes(**over):
    base = {n: _node() for n in ("gpu1", "gpu2", "gpu3", "gpu4")}
    base.update(over)
    return base


def _job(state="RUNNING", nodes=("gpu1", "gpu2", "gpu3"), restarts=0, comment=""):
    return {"state": state, "reason": "None", "nodes": list(nodes), "restarts": restarts, "comment": comment,
            "held": False}


def _hs_comment(nodes="gpu1,gpu2", spares="gpu3", swaps=0, state="running", restarts=0):
    return ("autoheal-runner " + (f"restarts={restarts} " if restarts else "") + f"nodes={nodes} state={state} "
            f"spares={spares}" + (f" swaps={swaps}" if swaps else ""))


def _mon():
    return Monitor([JobMeta(HS, "hotspare", opted_in=True, steps=30, nodes=2),
                    JobMeta(SUB, "submitit", opted_in=True, steps=30, nodes=1)], seed=7)


def _swap_record(t, lost="gpu2", spare="gpu3", active="gpu1,gpu3", spares="", swaps=1):
    return {"event": "job-hot-swap", "job_ids": [HS], "time": t, "node": lost, "message": f"{lost} swapped",
            "evidence": {"lost": lost, "spare": spare, "active": active, "spares": spares, "swaps": swaps}}


def test_a_swap_to_the_spare_is_running_again_and_counted_as_a_swap():
    m = _mon()
    m.observe(Snapshot(99.0, _nodes(), {HS: _job(comment=_hs_comment())}))
    m.add_fault(Injected(1, "xid79", "gpu", 100.0, node="gpu2", gpu=0))
    # the comment is written before the resize: the swap is counted once the lost node left the job
    m.observe(Snapshot(101.0, _nodes(gpu2=_node("MIXED+DRAIN", True, "autoheal: xid 79")),
                       {HS: _job(comment=_hs_comment("gpu1,gpu3", "none", 1))}))
    assert m.recovery()["fault_to_job_running_again_s"]["n"] == 0
    m.observe(Snapshot(103.0, _nodes(gpu2=_node("IDLE+DRAIN", True, "autoheal: xid 79")),
                       {HS: _job(nodes=("gpu1", "gpu3"), comment=_hs_comment("gpu1,gpu3", "none", 1))}))
    # its spare used, the next fault (on the batch host) requeues it, as without spares
    m.add_fault(Injected(2, "xid79", "gpu", 110.0, node="gpu1", gpu=0))
    m.observe(Snapshot(125.0, _nodes(), {HS: _job(nodes=("gpu3", "gpu4"), restarts=1,
                                                   comment=_hs_comment("gpu3,gpu4", "none", 1, restarts=1))}))
    r = m.recovery()
    assert r["fault_to_job_running_again_s"]["n"] == 2
    assert r["fault_to_job_running_again_swap_s"] == {"n": 1, "p50": 3.0, "p95": 3.0, "max": 3.0}
    assert r["fault_to_job_running_again_requeue_s"]["p50"] == 15.0


def test_swaps_and_requeues_together_must_not_exceed_the_faults_on_the_jobs_nodes():
    m = _mon()
    m.observe(Snapshot(99.0, _nodes(), {HS: _job(comment=_hs_comment())}))
    m.add_fault(Injected(1, "xid79", "gpu", 100.0, node="gpu2", gpu=0))
    one = Snapshot(300.0, _nodes(), {HS: _job("COMPLETED", comment=_hs_comment("gpu1,gpu3", "none", 1))})
    journal = [_swap_record(101.0), {"event": "job-completed", "job_ids": [HS], "time": 200.0}]
    assert m.finish(one, journal, 0, {}) == []
    two = Snapshot(300.0, _nodes(), {HS: _job("COMPLETED", restarts=1,
                                              comment=_hs_comment("gpu3,gpu4", "none", 1, "completed", 1))})
    v = m.finish(two, journal + [{"event": "job-restart", "job_ids": [HS], "time": 150.0}], 0, {})
    assert [x.invariant for x in v] == ["acted-twice"] and "swapped 1 time" in v[0].message


def test_a_submitit_job_requeued_by_submitit_and_again_by_autoheal_is_acted_twice():
    m = _mon()
    m.observe(Snapshot(99.0, _nodes(), {SUB: _job(nodes=("gpu4",))}))
    m.add_fault(Injected(1, "xid79", "gpu", 100.0, node="gpu4", gpu=0))
    ok = Snapshot(300.0, _nodes(), {SUB: _job("COMPLETED", nodes=("gpu2",), restarts=1,
                                              comment="autoheal-runner restarts=1 state=completed")})
    journal = [{"event": "job-requeue", "job_ids": [SUB], "time": 101.0}]
    assert m.finish(ok, journal, 0, {}) == []
    # the comment counts one restart, Slurm two: someone requeued it a second time for the same fault
    twice = Snapshot(300.0, _nodes(), {SUB: _job("COMPLETED", nodes=("gpu2",), restarts=2,
                                                 comment="autoheal-runner restarts=1 state=completed")})
    v = m.finish(twice, journal, 0, {})
    assert [x.invariant for x in v] == ["acted-twice"] and v[0].evidence["slurm_restarts"] == 2


def test_a_resized_jobs_comment_is_judged_against_its_swap_record():
    m = _mon()
    m.observe(Snapshot(99.0, _nodes(), {HS: _job(comment=_hs_comment())}))
    m.add_fault(Injected(1, "xid79", "gpu", 100.0, node="gpu2", gpu=0))
    journal = [_swap_record(101.0), {"event": "job-completed", "job_ids": [HS], "time": 200.0}]
    assert frozen_comment(HS, journal)["event"] == "job-hot-swap"
    # Slurm refused updates after the resize: state=running is the swap's comment, not a stale one
    frozen = Snapshot(300.0, _nodes(), {HS: _job("COMPLETED", comment=_hs_comment("gpu1,gpu3", "none", 1))})
    assert m.finish(frozen, journal, 0, {}) == []
    # a comment that does not say what the swap record says (spares, swaps) is a violation
    m = _mon()
    m.observe(Snapshot(99.0, _nodes(), {HS: _job(comment=_hs_comment())}))
    m.add_fault(Injected(1, "xid79", "gpu", 100.0, node="gpu2", gpu=0))
    wrong = Snapshot(300.0, _nodes(), {HS: _job("COMPLETED", comment=_hs_comment("gpu1,gpu3", "gpu3", 1))})
    v = m.finish(wrong, journal, 0, {})
    assert [x.invariant for x in v] == ["journal"] and "spares=gpu3" in v[0].message
    uncounted = Snapshot(300.0, _nodes(), {HS: _job("COMPLETED", comment=_hs_comment("gpu1,gpu3", "none", 0))})
    v = _mon().finish(uncounted, journal, 0, {})
    assert [x.invariant for x in v] == ["journal"] and "0 swap(s), the journal 1" in v[0].message
    # once the job was requeued, the new run writes its comment again: the normal state check applies
    after = journal[:1] + [{"event": "job-restart", "job_ids": [HS], "time": 150.0}] + journal[1:]
    assert frozen_comment(HS, after) is None


def test_a_resized_job_that_ended_by_its_own_choice_is_not_stranded():
    m = _mon()
    journal = [_swap_record(101.0), {"event": "job-max-restarts", "job_ids": [HS], "time": 200.0}]
    final = Snapshot(300.0, _nodes(), {HS: _job("FAILED", comment=_hs_comment("gpu1,gpu3", "none", 1))})
    v = m.finish(final, journal, 0, {})
    assert "stranded" not in [x.invariant for x in v], v


def _submitit_log(steps, stop_at=None, resume=None):
    lines, state, step = ["submitit-trainer: start step=0 node=gpu1 job=21"], 0, 0
    while step < steps:
        if stop_at is not None and step == stop_at:
            lines.append(f"submitit-trainer: checkpoint step={step}")
            lines.append(f"submitit-trainer: start step={resume if resume is not None else step} node=gpu2 job=21")
            stop_at = None
        state = next_state(state, step)
        step += 1
    lines.append(f"submitit-trainer: done step={steps} final_state={state}")
    return "\n".join(lines)


def test_submitit_output_checks():
    want = expected_final_state(30)
    result = "result " + json.dumps({"step": 30, "final_state": want, "runs": []})
    assert check_submitit_output(_submitit_log(30, 12) + "\n" + result, 30, "COMPLETED") == []
    bad = check_submitit_output(_submitit_log(30, 12, resume=5), 30)
    assert len(bad) == 1 and "newest checkpoint was step 12" in bad[0][0]
    lost = check_submitit_output(_submitit_log(30) + "\nresult " + json.dumps({"step": 30, "final_state": 1}), 30)
    assert len(lost) == 1 and "client's result" in lost[0][0]
    assert "got no result" in check_submitit_output(_submitit_log(30), 30, "COMPLETED")[0][0]
    # a requeue without a checkpoint (a node failure) starts again from the submission: step 0
    restart = "submitit-trainer: start step=0 node=gpu1 job=21\nsubmitit-trainer: start step=0 node=gpu2 job=21"
    assert check_submitit_output(restart, 30, "RUNNING") == []


def test_a_swap_lost_to_a_slurmctld_kill_may_be_missing_from_the_comment():
    """Seed 12 (CI): slurmctld killed 4.3 s after a swap restarted with the job on its old nodes and its
    comment from before the swap (no swaps=); the journal keeps the swap record."""
    journal = [_swap_record(101.0), {"event": "job-requeue", "job_ids": [HS], "time": 111.0},
               {"event": "job-restart", "job_ids": [HS], "time": 130.0},
               {"event": "job-completed", "job_ids": [HS], "time": 200.0}]
    final = Snapshot(300.0, _nodes(), {HS: _job("COMPLETED", restarts=1,
                                                 comment=_hs_comment("gpu1,gpu3", "spare1", 0, "completed", 1))})
    m = _mon()
    m.add_fault(Injected(1, "xid48", "gpu", 100.0, node="gpu2", gpu=0))
    m.add_fault(Injected(2, "kill-slurmctld", "process", 105.3))
    assert [v for v in m.finish(final, journal, 0, {}) if v.invariant == "journal"] == []
    # without the kill, a comment that forgot the swap is a violation
    m = _mon()
    m.add_fault(Injected(1, "xid48", "gpu", 100.0, node="gpu2", gpu=0))
    m.add_fault(Injected(2, "kill-slurmctld", "process", 140.0))  # long after: the swap was saved
    v = [v for v in m.finish(final, journal, 0, {}) if v.invariant == "journal"]
    assert len(v) == 1 and "0 swap(s), the journal 1" in v[0].message


def test_a_restart_is_judged_by_the_checkpoint_its_runner_picked():
    """Seed 12 (CI): after a slurmctld kill, Slurm started array task 5_1 a second time while its first
    copy still ran; the first copy saved step 100 after the second's runner had picked step 80, and
    before the second's trainer printed its start. The runner's pick was the newest then."""
    from autoheal.sbatch_helpers.examples.tiny_trainer import advance
    from autoheal_lab.soak_checks import check_trainer_output

    def ck(step):
        return f"autoheal-trainer: checkpoint saved step={step} path=/x/ckpt-{step}"

    def start(step, restart=0):
        return (f"autoheal-trainer: start step={step} resumed_from=/x restart={restart} host=gpu4 rank=0 world=1 "
                "steps=134")

    state = 0
    for step in range(134):
        state = advance(state, step)
    lines = ["autoheal-runner: job 5_1 run 0 on gpu3: checkpoint dir /x, resume from step none", start(0),
             ck(20), ck(80), "autoheal-runner: job 5_1 run 0 on gpu4: checkpoint dir /x, resume from step 80",
             ck(100), start(80), ck(86),
             "autoheal-runner: job 5_1 run 1 on gpu2: checkpoint dir /x, resume from step 100, previous run ended by x",
             start(100, 1), f"autoheal-trainer: done step=134 final_state={state}"]
    assert check_trainer_output("\n".join(lines), 134) == []
    # the runner picking an older checkpoint than the newest is still lost work
    bad = list(lines)
    bad[8] = bad[8].replace("resume from step 100", "resume from step 86")
    bad[9] = start(86, 1)
    v = check_trainer_output("\n".join(bad), 134)
    assert len(v) == 1 and "resumed a run from step 86, the newest checkpoint was 100" in v[0][0]
    # so is a trainer that did not start where its runner said
    other = list(lines)
    other[9] = start(80, 1)
    v = check_trainer_output("\n".join(other), 134)
    assert len(v) == 1 and "its runner resumed it from step 100" in v[0][0]
    # a hot-spare swap's pick counts the same way
    swap = ["autoheal-runner: job 1 run 0 on gpu1,gpu2: checkpoint dir /x, resume from step none", start(0), ck(79),
            "autoheal-runner: job 1: gpu2 swapped for spare gpu3 inside the allocation (signal); resuming from "
            "checkpoint step 60 on gpu1,gpu3; no requeue (0 spare(s) left)", start(60)]
    assert "newest checkpoint was 79" in check_trainer_output("\n".join(swap), 134)[0][0]


def test_a_job_swapped_off_a_node_must_not_be_requeued_for_it_too_unless_slurmctld_lost_the_swap():
    requeue = {"event": "requeue", "job_ids": [HS], "time": 111.0, "node": "gpu2", "source": "xid-watch",
               "message": "autoheal: requeued after xid 48 on GPU 3 of gpu2"}
    journal = [_swap_record(101.0), requeue, {"event": "job-requeue", "job_ids": [HS], "time": 111.3}]
    final = Snapshot(300.0, _nodes(), {HS: _job("RUNNING", comment=_hs_comment("gpu1,gpu3", "none", 1))})
    m = _mon()
    m.observe(Snapshot(99.0, _nodes(), {HS: _job(comment=_hs_comment())}))
    m.add_fault(Injected(1, "xid48", "gpu", 100.0, node="gpu2", gpu=0))
    v = [x for x in m.finish(final, journal, 0, {}) if x.invariant == "acted-twice"]
    assert len(v) == 1 and "swapped off gpu2 and then requeued" in v[0].message
    # seed 12: slurmctld, killed 4.3 s after the swap, restarted with the job on gpu2 again
    m = _mon()
    m.observe(Snapshot(99.0, _nodes(), {HS: _job(comment=_hs_comment())}))
    m.add_fault(Injected(1, "xid48", "gpu", 100.0, node="gpu2", gpu=0))
    m.add_fault(Injected(2, "kill-slurmctld", "process", 105.3))
    assert [x for x in m.finish(final, journal, 0, {}) if x.invariant == "acted-twice"] == []
