"""The soak's people, without a lab: what they do is carried out through the runner's event queue, so a
fake Slurm and the queue are enough to replay a case the 200-fault bench found."""

from __future__ import annotations

import heapq

from autoheal.slurm.model import Node
from autoheal_lab.soak import Soak, SoakOptions
from autoheal_lab.soak_checks import Injected

REASON = "admin: soak maintenance 192"


class Ctld:
    """Slurm's view of one node; ``resumes`` counts the admin's scontrol resumes."""

    def __init__(self, node: Node):
        self.node = node
        self.resumes = 0

    def get_node(self, name):
        return self.node


def _soak(ctld):
    soak = Soak(None, SoakOptions(seed=1, faults=3, kube=False))
    soak.slurm = ctld

    def run(argv, timeout=30.0, check=True):
        assert argv[:2] == ["scontrol", "update"] and argv[-1] == "state=resume", argv
        ctld.resumes += 1
        ctld.node = Node("spare2", "ALLOCATED", frozenset(), "")

    soak._run = run
    return soak


def _run_events(soak):
    while soak.events:
        _t, _seq, _what, fn = heapq.heappop(soak.events)
        fn()


def test_the_admin_resumes_again_when_a_slurmctld_restart_lost_their_resume():
    """Seed 1, fault 192: the admin's resume at 16:35:30.161, slurmctld killed 2 s later, and the restarted
    slurmctld recovered spare2 drained with the admin's reason; the soak ended with it drained
    (end-state). The admin now looks again and resumes it once more."""
    ctld = Ctld(Node("spare2", "ALLOCATED", frozenset({"DRAIN"}), REASON))
    soak = _soak(ctld)
    inj = Injected(192, "admin-drain", "people", 0.0, node="spare2", reason=REASON)
    soak._admin_resume(inj)
    assert ctld.resumes == 1 and inj.end is not None
    ctld.node = Node("spare2", "ALLOCATED", frozenset({"DRAIN"}), REASON)  # slurmctld lost the resume
    _run_events(soak)
    assert ctld.resumes == 2 and not ctld.node.drain
    assert any("lost it" in n for n in soak.notes)


def test_the_admin_leaves_a_node_alone_that_someone_else_drained_since():
    ctld = Ctld(Node("spare2", "ALLOCATED", frozenset({"DRAIN"}), REASON))
    soak = _soak(ctld)
    inj = Injected(192, "admin-drain", "people", 0.0, node="spare2", reason=REASON)
    soak._admin_resume(inj)
    ctld.node = Node("spare2", "IDLE", frozenset({"DRAIN"}), "autoheal: xid 79 on GPU 1 of spare2")
    _run_events(soak)
    assert ctld.resumes == 1 and ctld.node.reason.startswith("autoheal:")  # not theirs: not touched


def test_the_user_releases_again_a_job_a_slurmctld_restart_left_held():
    from autoheal.slurm.model import Job

    class JobCtld:
        def __init__(self):
            self.job = Job("77", "PENDING", (), state_reason="JobHeldUser", priority=0)
            self.releases = 0

        def get_job(self, jid):
            assert jid == "77"
            return self.job

    ctld = JobCtld()
    soak = Soak(None, SoakOptions(seed=1, faults=3, kube=False))
    soak.slurm = ctld

    def run(argv, timeout=30.0, check=True):
        assert argv == ["scontrol", "release", "77"], argv
        ctld.releases += 1
        ctld.job = Job("77", "PENDING", (), state_reason="Priority", priority=1)

    soak._run = run
    soak._user_looks_again("77")
    ctld.job = Job("77", "PENDING", (), state_reason="JobHeldUser", priority=0)  # the release was lost
    _run_events(soak)
    assert ctld.releases == 1 and not ctld.job.held
    soak._user_looks_again("77")  # released and kept: nothing to do
    _run_events(soak)
    assert ctld.releases == 1


def test_the_admin_drains_again_when_a_slurmctld_restart_lost_their_drain():
    """Seed 60613: a drain 15.5 s before a slurmctld kill -9 was gone after the restart. The admins who had
    just drained a node look again once slurmctld is back, and drain it again if needed."""
    ctld = Ctld(Node("gpu1", "IDLE", frozenset(), ""))  # what the restarted slurmctld shows
    soak = _soak(ctld)
    calls = []
    soak._run = lambda argv, timeout=30.0, check=True: calls.append(argv)
    import time as _time

    inj = Injected(25, "admin-drain", "people", _time.time() - 15.5, node="gpu1", reason="admin: soak maintenance 25")
    old = Injected(3, "admin-drain", "people", _time.time() - 120.0, node="gpu2", reason="admin: soak maintenance 3")
    soak.injected = {25: inj, 3: old}
    lost = soak._drains_it_may_lose(_time.time())
    assert lost == [inj] and inj.lost_until == float("inf") and old.lost_until is None
    soak._admins_look_after_restart(lost)
    _run_events(soak)
    assert calls == [["scontrol", "update", "nodename=gpu1", "state=drain", "reason=admin: soak maintenance 25"]]
    assert inj.lost_until is not None and inj.lost_until < float("inf")
    assert any("without their maintenance drain" in n for n in soak.notes)


def test_the_technician_does_not_repair_a_machine_that_left_the_cluster():
    """Soak seed 46688: gpu2's replacement arrived and the spare pool took the machine away (its slurmd
    stopped), but the name kept `autoheal: replace: ...`; the technician "repaired" it in place and
    `autoheal node resume` put a name with no slurmd back into service: DOWN at the end."""
    from autoheal_lab.soak_checks import Monitor

    ctld = Ctld(Node("gpu2", "IDLE", frozenset({"DRAIN"}), "autoheal: replace: xid 64 on GPU 3 of gpu2"))
    soak = _soak(ctld)
    soak.monitor = Monitor([], seed=1, repair_delays=[60.0])
    soak.lab = type("GoneLab", (), {"records": staticmethod(lambda: {"slurmd-gpu1": object()})})()
    called = []
    soak._autoheal = lambda *args, **kw: called.append(args)
    soak._technician("gpu2")
    assert called == [] and ctld.resumes == 0
    assert soak.monitor.oncall.repairs[-1]["outcome"] == "not possible: the machine left the cluster"


def _settle_calls(soak):
    calls = []
    soak._loop = lambda until_events, deadline=None, done=None: calls.append((deadline, done))
    soak._settled = lambda: True
    soak._jobs_done = lambda: True
    soak._settle()
    return calls


def test_the_end_state_waits_for_what_a_persons_last_action_set_off():
    """Seed 48213: the technician resumed a lemon 14 ms before the final snapshot, which showed it
    IDLE+NOT_RESPONDING (slurmd not answering yet, its defect not back yet): two false violations. The
    soak now goes on PEOPLE_SETTLE s after a person's last command before it judges the end."""
    import time as _time

    soak = Soak(None, SoakOptions(seed=1, faults=3, kube=False))
    soak._person("technician repairs gpu4", lambda: None)
    acted = soak._people_acted
    assert acted > _time.time() - 5
    calls = _settle_calls(soak)
    waits = [d for d, done in calls if done is None]
    assert len(waits) == 1 and waits[0] >= acted + Soak.PEOPLE_SETTLE - 0.01


def test_no_wait_when_nobody_acted_lately_and_a_failed_command_is_no_action():
    soak = Soak(None, SoakOptions(seed=1, faults=3, kube=False))

    def refused():
        raise RuntimeError("slurmctld restarting")

    soak._person("admin drains gpu1", refused, within=0.0)
    assert soak._people_acted == 0.0
    assert [done for _d, done in _settle_calls(soak)] == [soak._settled]
