"""The pyslurm backend against a stand-in ``pyslurm`` module."""

from __future__ import annotations

import types
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, Union

import pytest

from autoheal.errors import SlurmError, SlurmNotFound
from autoheal.slurm.model import JobUpdate
from autoheal.slurm.pyslurm_backend import PyslurmSlurm


class RPCError(Exception):
    pass


@dataclass
class PsNode:
    """A ``pyslurm.Node`` as loaded (the attributes the backend reads; pyslurm leaves some None)."""

    name: str
    state: str = "IDLE"
    reason: Optional[str] = None
    reason_user: Optional[str] = None
    reason_time: Optional[int] = None
    configured_gres: Union[Dict[str, int], str, None] = None
    partitions: Optional[List[str]] = None
    address: Optional[str] = None
    total_cpus: Optional[int] = None


@dataclass
class PsJob:
    """A ``pyslurm.Job`` as loaded (``excluded_nodes`` is a list, or a string on some releases)."""

    id: int
    array_id: Optional[int] = None
    array_task_id: Optional[int] = None
    state: str = "PENDING"
    allocated_nodes: Optional[str] = None
    name: Optional[str] = None
    user_name: Optional[str] = None
    comment: Optional[str] = None
    excluded_nodes: Union[List[str], str, None] = None
    is_requeueable: bool = False
    requeue_count: int = 0
    batch_host: Optional[str] = None
    end_time: Optional[int] = None
    state_reason: Optional[str] = None


Call = Tuple[Any, ...]


def make_fake(nodes: Sequence[PsNode] = (), jobs: Sequence[PsJob] = (), fail: Optional[str] = None,
              version: Any = lambda: "24.11.5", release: Optional[str] = None,
              api_version: Optional[Callable[[], Tuple[int, int, int]]] = None,
              ) -> Tuple[types.ModuleType, List[Call]]:
    """A stand-in ``pyslurm`` module (a module, as the real one is) with the objects API the backend calls;
    every write is appended to the returned list. ``fail``: every call raises ``RPCError(fail)``.
    ``version``, ``release`` (``__version__``) and ``api_version`` (``slurm_api_version``): what pyslurm
    releases say about the Slurm they were built for (None: the attribute is absent or None)."""
    calls: List[Call] = []

    class Node:
        def __init__(self, name: Optional[str] = None, **changes: Any) -> None:
            self.name, self.changes = name, changes

        def modify(self, other: Node) -> None:
            if fail:
                raise RPCError(fail)
            calls.append(("node.modify", self.name, other.changes))

    class JobSubmitDescription:
        def __init__(self, **fields: Any) -> None:
            self.fields = fields

    class Job:
        def __init__(self, job_id: int) -> None:
            self.id = job_id

        def requeue(self, hold: bool = False) -> None:
            calls.append(("job.requeue", self.id, hold))

        def release(self) -> None:
            calls.append(("job.release", self.id))

        def modify(self, desc: JobSubmitDescription) -> None:
            calls.append(("job.modify", self.id, desc.fields))

        def send_signal(self, signal: str, steps: str = "children") -> None:
            calls.append(("job.send_signal", self.id, signal, steps))

    def loaded(items: Dict[Any, Any]) -> Dict[Any, Any]:
        if fail:
            raise RPCError(fail)
        return items

    class Nodes:
        @staticmethod
        def load() -> Dict[str, PsNode]:
            return loaded({n.name: n for n in nodes})

    class Jobs:
        @staticmethod
        def load() -> Dict[int, PsJob]:
            return loaded({j.id: j for j in jobs})

    class Config:
        @staticmethod
        def to_dict() -> Dict[str, Any]:
            return {"KillWait": 30, "ClusterName": "c"}

        @classmethod
        def load(cls) -> type[Config]:
            return cls

    ctld = types.ModuleType("pyslurm.slurmctld")
    vars(ctld).update(Config=Config)
    fake = types.ModuleType("pyslurm")
    vars(fake).update(RPCError=RPCError, Node=Node, Job=Job, JobSubmitDescription=JobSubmitDescription, Nodes=Nodes,
                      Jobs=Jobs, slurmctld=ctld, version=version)
    if release is not None:
        vars(fake).update(__version__=release)
    if api_version is not None:
        vars(fake).update(slurm_api_version=api_version)
    return fake, calls


def _node(**kw: Any) -> PsNode:
    base: Dict[str, Any] = dict(name="gpu1", state="IDLE+DRAIN", reason="autoheal: xid 79", reason_user="root",
                                reason_time=1700000000, configured_gres={"gpu:h100": 8},
                                partitions=["gpu", "debug"], total_cpus=64)
    base.update(kw)
    return PsNode(**base)


def _job(**kw: Any) -> PsJob:
    base: Dict[str, Any] = dict(id=130, array_id=123, array_task_id=4, state="running",
                                allocated_nodes="gpu[1-2]", name="train", user_name="alice",
                                comment="autoheal-runner", excluded_nodes=["gpu7", "gpu9"], is_requeueable=True,
                                requeue_count=2, batch_host="gpu1", end_time=1800000000, state_reason="None")
    base.update(kw)
    return PsJob(**base)


def test_node_mapping():
    fake, _ = make_fake(nodes=[_node(), _node(name="gpu2", state="MIXED", reason="", configured_gres="gpu:4",
                                              partitions=None, total_cpus=None)])
    nodes = {n.name: n for n in PyslurmSlurm(module=fake).list_nodes()}
    n1 = nodes["gpu1"]
    assert n1.state == "IDLE" and n1.flags == frozenset({"DRAIN"})
    assert n1.reason == "autoheal: xid 79" and n1.reason_user == "root" and n1.reason_time == 1700000000
    assert n1.gres == "gpu:h100:8" and n1.gpu_count == 8
    assert n1.partitions == ("gpu", "debug") and n1.cpus == 64
    n2 = nodes["gpu2"]
    assert n2.state == "MIXED" and n2.gpu_count == 4 and n2.partitions == () and n2.cpus == 0


def test_job_mapping_and_filters():
    fake, _ = make_fake(jobs=[_job(), _job(id=5, array_id=None, array_task_id=None, state="PENDING",
                                           allocated_nodes=None, excluded_nodes="gpu3")])
    slurm = PyslurmSlurm(module=fake)
    jobs = {j.raw_id: j for j in slurm.list_jobs()}
    j = jobs["130"]
    assert j.job_id == "123_4" and j.array_job_id == "123" and j.array_task_id == "4"
    assert j.state == "RUNNING" and j.nodes == ("gpu1", "gpu2")
    assert j.excluded_nodes == ("gpu7", "gpu9")
    assert j.requeue is True and j.restart_count == 2 and j.comment == "autoheal-runner"
    assert j.user == "alice" and j.batch_host == "gpu1" and j.end_time == 1800000000
    p = jobs["5"]
    assert p.job_id == "5" and p.nodes == () and p.excluded_nodes == ("gpu3",) and p.array_job_id is None
    assert [x.raw_id for x in slurm.list_jobs(node="gpu2")] == ["130"]
    assert [x.raw_id for x in slurm.list_jobs(states=["pending"])] == ["5"]
    assert slurm.get_job("123_4").raw_id == "130"
    assert slurm.get_job("5").job_id == "5"


def test_version_config_ping():
    fake, _ = make_fake()
    slurm = PyslurmSlurm(module=fake)
    assert str(slurm.version()) == "24.11.5"
    assert slurm.show_config() == {"KillWait": "30", "ClusterName": "c"}
    assert slurm.ping() is True
    old, _ = make_fake(version=None, release="23.11.0")
    assert str(PyslurmSlurm(module=old).version()) == "23.11.0"
    bad, _ = make_fake(fail="Unable to contact slurm controller")
    assert PyslurmSlurm(module=bad).ping() is False


def test_version_is_libslurms_not_pyslurms_own_release():
    # what pyslurm 25.11.2 built against 26.05.5 answered (forky chroot, 2026-12-03): version a module,
    # __version__ its own release, slurm_api_version() the Slurm it was compiled for
    fake, _ = make_fake(version=types.ModuleType("pyslurm.version"), release="25.11.2",
                        api_version=lambda: (26, 5, 5))
    version = PyslurmSlurm(module=fake).version()
    assert str(version) == "26.05.5" and version.at_least(26, 5)


def test_node_writes():
    fake, calls = make_fake()
    slurm = PyslurmSlurm(module=fake)
    slurm.drain("gpu1", "autoheal: xid 79")
    slurm.resume("gpu1")
    slurm.set_reason("gpu1", "autoheal: ecc")
    assert calls == [("node.modify", "gpu1", {"state": "DRAIN", "reason": "autoheal: xid 79"}),
                     ("node.modify", "gpu1", {"state": "RESUME"}),
                     ("node.modify", "gpu1", {"state": "DRAIN", "reason": "autoheal: ecc"})]


def test_job_writes():
    fake, calls = make_fake()
    slurm = PyslurmSlurm(module=fake)
    slurm.requeue("42", hold=True)
    slurm.release("42")
    slurm.update_job("42", JobUpdate(excluded_nodes=("gpu1",), comment="x"))
    slurm.signal_job("42", "USR2", batch=True)
    slurm.signal_job("42", "TERM", full=True)
    slurm.signal_job("42", "INT")
    assert calls == [("job.requeue", 42, True), ("job.release", 42),
                     ("job.modify", 42, {"excluded_nodes": "gpu1", "comment": "x"}),
                     ("job.send_signal", 42, "USR2", "batch"), ("job.send_signal", 42, "TERM", "all"),
                     ("job.send_signal", 42, "INT", "children")]


def test_array_task_requeue_targets_the_task():
    fake, calls = make_fake(jobs=[_job(id=130, array_id=123, array_task_id=4), _job(id=123, array_task_id=0)])
    PyslurmSlurm(module=fake).requeue("123_4")
    assert calls == [("job.requeue", 130, False)]


def test_rpc_errors_mapped():
    bad, _ = make_fake(fail="Invalid node name specified")
    slurm = PyslurmSlurm(module=bad)
    with pytest.raises(SlurmNotFound, match="pyslurm modify node gpu1: Invalid node name"):
        slurm.drain("gpu1", "x")
    other, _ = make_fake(fail="Access/permission denied")
    with pytest.raises(SlurmError, match="pyslurm load nodes: Access/permission denied") as err:
        PyslurmSlurm(module=other).list_nodes()
    assert not isinstance(err.value, SlurmNotFound)
    # "Invalid" alone is not "no such node": the three backends share one list of not-found words
    state, _ = make_fake(fail="Invalid node state specified")
    with pytest.raises(SlurmError) as err:
        PyslurmSlurm(module=state).drain("gpu1", "x")
    assert not isinstance(err.value, SlurmNotFound)


def test_unsupported_reboot():
    fake, calls = make_fake()
    with pytest.raises(SlurmError, match="CLI backend"):
        PyslurmSlurm(module=fake).reboot("gpu1", "x")
    assert calls == []


def test_missing_pyslurm_names_cli_backend(monkeypatch):
    import builtins

    real = builtins.__import__

    def fake_import(name, *a, **kw):
        if name == "pyslurm":
            raise ImportError("No module named 'pyslurm'")
        return real(name, *a, **kw)

    monkeypatch.setattr(builtins, "__import__", fake_import)
    with pytest.raises(SlurmError, match="backend 'cli'"):
        PyslurmSlurm()


def test_capabilities_say_what_pyslurm_cannot_do():
    from autoheal.errors import SlurmNotSupported

    fake, _ = make_fake()
    slurm = PyslurmSlurm(module=fake)
    caps = slurm.capabilities()
    assert caps["reboot"] == caps["batch-script"] == caps["resize-job"] == "" and caps["requeue"] == "pyslurm"
    with pytest.raises(SlurmNotSupported):
        slurm.batch_script("7")  # xid-watch then goes by the submit line and hooks.grace_signal
    assert caps["job-gpus"] == caps["job-history"] == ""
    for call in (lambda: slurm.job_gpus("7", "gpu1"), lambda: slurm.job_state_history("7")):
        with pytest.raises(SlurmNotSupported):
            call()
