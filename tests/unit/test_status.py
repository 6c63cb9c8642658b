"""`autoheal status` (issue 26 item 3): the report from what each source said (pure), and the command on
the in-memory Slurm and Kubernetes: reads only, a source that fails is named while the others still show,
exit 1 on a problem, 2 on a usage error. On the real lab: tests/integration/test_prometheus_lab.py."""

from __future__ import annotations

import json
import time

import pytest

from autoheal.cli import status_cmd as SC
from autoheal.cli.status_model import BreakerView, Heartbeat, Inputs, LeaseView, Remediation, Source, build, render
from autoheal.config import parse_config
from autoheal.errors import SlurmUnavailable
from autoheal.journal import Journal, Record
from autoheal.slurm.model import Job, Node
from autoheal_lab.testing.kube import MemoryKube
from autoheal_lab.testing.slurm import MemorySlurm

NOW = 1_800_000_000.0
XID79 = "autoheal: replace: xid 79 on GPU 0 of n2 (0000:1b:00.0): fallen off the bus"


def fleet_nodes():
    return [Node("n1", "IDLE"), Node("n2", "IDLE", frozenset({"DRAIN"}), reason=XID79, reason_time=int(NOW - 90)),
            Node("n3", "IDLE", frozenset({"DRAIN"}), reason="maintenance"), Node("n4", "ALLOCATED")]


def beats(**over):
    out = {n: Heartbeat(NOW - 2) for n in ("n1", "n2", "n3", "n4")}
    out.update(over)
    return out


def test_report_lists_our_drains_with_rung_remediation_and_k8s_node_and_never_an_admins():
    inp = Inputs(now=NOW, sources=[Source("slurm")], nodes=fleet_nodes(), jobs=[],
                 remediations={"n2": Remediation("replacing", "node-n2", NOW - 30, "x")},
                 breaker=BreakerView(False, starts=1), lease=LeaseView("sync_1", expired=False),
                 xid_watch=beats(), xid_watch_source="test", guard=Heartbeat(NOW - 1), guard_source="test")
    rep = build(inp)
    assert [d["node"] for d in rep.drained] == ["n2"]
    d = rep.drained[0]
    assert (d["rung"], d["remediation"], d["kubernetes_node"], d["since"]) == ("replace", "replacing", "node-n2",
                                                                              int(NOW - 90))
    assert rep.fleet == {"in-service": 2, "drained-autoheal": 1, "drained-other": 1, "retired": 0, "spare": 0}
    assert rep.problems == []
    text = render(rep)
    assert "n2" in text and "replacing" in text and "node-n2" in text and "no problem found" in text
    assert "maintenance" not in text


@pytest.mark.parametrize("change, problem", [
    ({"breaker": BreakerView(True, "3 of 4 nodes", NOW - 5)}, "breaker tripped: 3 of 4"),
    ({"lease": LeaseView("", expired=True)}, "sync leader: no Lease holder"),
    ({"lease": LeaseView("sync_1", expired=True)}, "Lease of sync_1 expired"),
    ({"xid_watch": beats(n3=Heartbeat(NOW - 45))}, "xid-watch on n3 (silent 45s)"),
    ({"xid_watch": beats(n4=Heartbeat(NOW - 1, up=False))}, "xid-watch on n4 (stopped)"),
    ({"xid_watch": {n: Heartbeat(NOW) for n in ("n1", "n2", "n3")}}, "xid-watch on n4 (no heartbeat)"),
    ({"guard": Heartbeat(NOW - 300)}, "guard: no heartbeat for 5m00s"),
    ({"remediations": {"n2": Remediation("failed", reason="replacement never arrived")}},
     "remediation of n2 failed: replacement never arrived"),
])
def test_each_problem_is_found_and_named(change, problem):
    base = dict(now=NOW, sources=[Source("slurm")], nodes=fleet_nodes(), jobs=[], breaker=BreakerView(False),
                lease=LeaseView("sync_1", expired=False), xid_watch=beats(), xid_watch_source="t",
                guard=Heartbeat(NOW - 1), guard_source="t")
    base.update(change)
    rep = build(Inputs(**base))
    assert any(problem in p for p in rep.problems), rep.problems
    assert problem.split(":")[0] in render(rep)


def test_jobs_of_the_last_hour_with_their_outcome_now():
    recs = [Record("requeue", node="n2", job_ids=["7"], outcome="requeued", time=NOW - 100),
            Record("job-hot-swap", node="n3", job_ids=["8"], time=NOW - 50),
            Record("requeue", node="n2", job_ids=["9"], outcome="requeued", time=NOW - 7200),  # too old
            Record("detection", node="n2", time=NOW - 10),
            Record("requeue", node="n1", job_ids=["10"], outcome="requeued", time=NOW - 3000)]
    jobs = [Job("7", "RUNNING", nodes=("n4",)), Job("8", "RUNNING", nodes=("n1", "n4")),
            Job("10", "PENDING", restart_count=1, eligible_time=int(NOW - 2900), comment="autoheal: requeued after x")]
    rep = build(Inputs(now=NOW, sources=[Source("slurm"), Source("journal")], nodes=fleet_nodes(), jobs=jobs,
                       records=recs))
    assert [(j["job"], j["what"], j["now"]) for j in rep.jobs] == [
        ("10", "requeued by xid-watch", "PENDING"), ("7", "requeued by xid-watch", "RUNNING on n4"),
        ("8", "swapped to a spare", "RUNNING on n1,n4")]
    assert any("job 10 requeued by autoheal has waited 48m20s" in p for p in rep.problems)


def cfg_for(tmp_path, **sync):
    text = f'[journal]\npath = "{tmp_path / "j.jsonl"}"\n[hooks]\ntextfile_dir = "{tmp_path}/tf/{{node}}"\n'
    return parse_config(text)


def memory_world(tmp_path, n=4):
    slurm = MemorySlurm(fleet_nodes()[:n])
    kube = MemoryKube()
    for node in slurm.list_nodes():
        kube.add_node(node.name)
    kube.nodes["n2"]["metadata"]["annotations"].update({"autoheal.io/remediation-state": "draining",
                                                         "autoheal.io/remediation-since": str(int(NOW - 20)),
                                                         "autoheal.io/remediation-slurm-node": "n2"})
    kube.leases[("slurm", "autoheal-sync")] = {"metadata": {"name": "autoheal-sync"}, "spec": {
        "holderIdentity": "sync_1", "leaseDurationSeconds": 15,
        "renewTime": time.strftime("%Y-%m-%dT%H:%M:%S.000000Z", time.gmtime(NOW - 1))}}
    for node in ("n1", "n2", "n3", "n4"):
        d = tmp_path / "tf" / node
        d.mkdir(parents=True)
        (d / SC.XID_FILE).write_text(f'autoheal_xid_watch_up{{node="{node}"}} 1\n'
                                     f'autoheal_xid_watch_heartbeat_timestamp_seconds{{node="{node}"}} {NOW - 3}\n')
    g = tmp_path / "guard"
    g.mkdir()
    (g / SC.GUARD_FILE).write_text(f"autoheal_guard_up 1\nautoheal_guard_heartbeat_timestamp_seconds {NOW - 1}\n")
    return slurm, kube


def test_gather_reads_every_source_and_changes_nothing(tmp_path):
    cfg = cfg_for(tmp_path)
    slurm, kube = memory_world(tmp_path)
    journal = Journal(tmp_path / "j.jsonl", fsync=False)
    journal.record("requeue", node="n2", job_ids=["5"], outcome="requeued", time=NOW - 60)
    before_kube = kube.writes
    rep = build(SC.gather(cfg, slurm, kube, journal, None, str(tmp_path / "guard"), now=NOW))
    assert rep.problems == [], rep.problems
    assert rep.drained[0]["remediation"] == "draining" and rep.drained[0]["kubernetes_node"] == "n2"
    assert [c["name"] for c in rep.components] == ["sync leader", "guard", "xid-watch"]
    assert all(c["state"] == "ok" for c in rep.components)
    assert [j["job"] for j in rep.jobs] == ["5"] and rep.jobs[0]["now"] == "gone (finished)"
    assert kube.writes == before_kube and slurm.writes() == []


def test_a_source_that_fails_is_named_and_the_others_still_show(tmp_path):
    cfg = cfg_for(tmp_path)
    slurm, kube = memory_world(tmp_path)
    journal = Journal(tmp_path / "j.jsonl", fsync=False)
    kube.fail_reads = True
    rep = build(SC.gather(cfg, slurm, kube, journal, None, None, now=NOW))
    assert any(p.startswith("kubernetes: could not be read: KubeError: list_nodes: HTTP 500") for p in rep.problems)
    assert [d["node"] for d in rep.drained] == ["n2"] and rep.drained[0]["remediation"] == ""
    assert rep.breaker is None

    def down(*_a, **_k):
        raise SlurmUnavailable("slurmctld not answering")

    slurm.list_nodes = down
    kube.fail_reads = False
    rep = build(SC.gather(cfg, slurm, kube, journal, None, None, now=NOW))
    assert any("slurm: could not be read: SlurmUnavailable: slurmctld not answering" in p for p in rep.problems)
    assert rep.breaker is not None and rep.fleet == {}  # Kubernetes still shown
    assert "slurm could not be read" in render(rep)


def test_command_exit_codes_and_json(tmp_path, monkeypatch):
    from click.testing import CliRunner

    from autoheal.cli.main import cli

    cfg_path = tmp_path / "autoheal.toml"
    cfg_path.write_text(f'[journal]\npath = "{tmp_path / "j.jsonl"}"\n[slurm]\nbackend = "cli"\n')
    monkeypatch.delenv("KUBECONFIG", raising=False)
    slurm, _kube = memory_world(tmp_path)
    monkeypatch.setattr("autoheal.slurm.get_adapter", lambda cfg: slurm)
    res = CliRunner().invoke(cli, ["status", "--config", str(cfg_path), "--json"])
    data = json.loads(res.output)
    assert [s["state"] for s in data["sources"]] == ["ok", "ok", "off"]
    # xid-watch textfiles are not where this config says: unknown, not a problem; nothing else wrong
    assert res.exit_code == 0, res.output
    slurm.nodes["n1"] = Node("n1", "IDLE", frozenset({"DRAIN"}), reason=XID79)
    res = CliRunner().invoke(cli, ["status", "--config", str(cfg_path), "--prometheus", "http://127.0.0.1:1"])
    assert res.exit_code == 1 and "prometheus could not be read" in res.output
    res = CliRunner().invoke(cli, ["status", "--config", str(cfg_path), "--prometheus", "ftp://x"])
    assert res.exit_code == 2
