"""Slurm through pyslurm (optional).

pyslurm on PyPI tracks the newest Slurm (25.11 at the time of writing) and must match the installed
libslurm exactly; no registry reachable from our CI has a build for 22.05, 24.11 or 26.05 (PyPI's
25.11.2 refuses to build against 26.05: docs/slurm-versions.md), so this backend is NOT exercised
against a real Slurm in our tests. What is tested: the mapping from pyslurm's objects to
our models and the calls we make, against a stand-in module (tests/unit/test_slurm_pyslurm.py). Use the
CLI backend unless you have a pyslurm build that matches your Slurm.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Dict, List, Optional, TypeVar

from autoheal.errors import SlurmError, SlurmNotFound, SlurmNotSupported, SlurmUnavailable
from autoheal.slurm.base import SlurmAdapter, filter_jobs, job_outcome, not_found_if, unavailable_if
from autoheal.slurm.hostlist import expand
from autoheal.slurm.model import Job, JobUpdate, Node, SlurmVersion, parse_state

if TYPE_CHECKING:
    from autoheal.config.core_sections import SlurmSection

T = TypeVar("T")


def _import_pyslurm() -> Any:  # pyslurm has no type information
    try:
        import pyslurm
    except ImportError as exc:
        raise SlurmError(f"slurm.backend = 'pyslurm' but pyslurm cannot be imported ({exc}); "
                         f"install a pyslurm build matching your Slurm, or use backend 'cli'") from None
    return pyslurm


def _gres_text(value: Any) -> str:
    if isinstance(value, dict):
        return ",".join(f"{k}:{v}" for k, v in value.items())
    return str(value or "")


class PyslurmSlurm(SlurmAdapter):
    """Slurm through the pyslurm bindings (objects API of pyslurm >= 23)."""

    name = "pyslurm"

    def __init__(self, module: Any = None) -> None:
        self.ps = module or _import_pyslurm()

    @classmethod
    def from_config(cls, section: SlurmSection) -> PyslurmSlurm:
        return cls()

    def _wrap(self, fn: Callable[[], T], what: str) -> T:
        try:
            return fn()
        except self.ps.RPCError as exc:  # pyslurm's error type for failed Slurm calls
            msg = str(exc)
            if unavailable_if(msg):
                raise SlurmUnavailable(f"pyslurm {what}: {msg}") from None
            kind = job_outcome(msg)  # RPCError carries slurm_strerror's text: the same table as the CLI
            if kind is not None:
                raise kind(f"pyslurm {what}: {msg}") from None
            if not_found_if(msg):
                raise SlurmNotFound(f"pyslurm {what}: {msg}") from None
            raise SlurmError(f"pyslurm {what}: {msg}") from None

    def version(self) -> SlurmVersion:
        # The Slurm its libslurm headers say (``slurm_api_version()``: (26, 5, 5)), not pyslurm's own
        # release: a pyslurm 25.11.2 built by hand against 26.05 (docs/slurm-versions.md) has
        # ``__version__`` 25.11.2, and ``pyslurm.version`` is a module there, not a function.
        api = getattr(self.ps, "slurm_api_version", None)
        if callable(api):
            parts = api()
            if isinstance(parts, tuple) and len(parts) == 3:
                major, minor, patch = (int(p) for p in parts)
                return SlurmVersion(major, minor, patch, text=f"{major}.{minor}.{patch}")
        return SlurmVersion.parse(str(getattr(self.ps, "version", lambda: "")() if callable(
            getattr(self.ps, "version", None)) else getattr(self.ps, "__version__", "")))

    def _node(self, n: Any) -> Node:
        base, flags = parse_state(str(getattr(n, "state", "") or ""))
        return Node(name=n.name, state=base, flags=flags, reason=str(getattr(n, "reason", "") or ""),
                    reason_user=str(getattr(n, "reason_user", "") or ""),
                    reason_time=getattr(n, "reason_time", None),
                    gres=_gres_text(getattr(n, "configured_gres", "")),
                    partitions=tuple(getattr(n, "partitions", None) or ()),
                    address=str(getattr(n, "address", "") or ""),
                    cpus=int(getattr(n, "total_cpus", 0) or 0))

    def list_nodes(self) -> List[Node]:
        nodes = self._wrap(lambda: self.ps.Nodes.load(), "load nodes")
        return [self._node(n) for n in nodes.values()]

    def _job(self, j: Any) -> Job:
        array_id = getattr(j, "array_id", None)
        task = getattr(j, "array_task_id", None)
        raw = str(j.id)
        jid = f"{array_id}_{task}" if array_id and task is not None else raw
        excluded = getattr(j, "excluded_nodes", None) or ""
        return Job(job_id=jid, raw_id=raw, state=str(getattr(j, "state", "UNKNOWN")).upper(),
                   nodes=tuple(expand(str(getattr(j, "allocated_nodes", "") or ""))),
                   name=str(getattr(j, "name", "") or ""), user=str(getattr(j, "user_name", "") or ""),
                   comment=str(getattr(j, "comment", "") or ""),
                   excluded_nodes=tuple(expand(excluded if isinstance(excluded, str) else ",".join(excluded))),
                   requeue=bool(getattr(j, "is_requeueable", False)),
                   restart_count=int(getattr(j, "requeue_count", 0) or 0),
                   batch_host=str(getattr(j, "batch_host", "") or ""), end_time=getattr(j, "end_time", None),
                   state_reason=str(getattr(j, "state_reason", "") or ""),
                   array_job_id=str(array_id) if array_id else None,
                   array_task_id=str(task) if array_id and task is not None else None)

    def list_jobs(self, node: Optional[str] = None, states: Optional[List[str]] = None) -> List[Job]:
        # libslurm's job load (slurm_load_jobs) has no state or node filter: pyslurm gets every job as
        # packed records (no JSON, no text), and the filter runs here before any Job is built
        wanted = {s.upper() for s in states} if states else None
        jobs = []
        for j in self._wrap(lambda: self.ps.Jobs.load(), "load jobs").values():
            if wanted is not None and str(getattr(j, "state", "")).upper() not in wanted:
                continue
            if node and node not in expand(str(getattr(j, "allocated_nodes", "") or "")):
                continue
            jobs.append(self._job(j))
        return filter_jobs(jobs, node, states)

    def show_config(self) -> Dict[str, str]:
        conf = self._wrap(lambda: self.ps.slurmctld.Config.load(), "load config")
        return {k: str(v) for k, v in conf.to_dict().items()}

    def ping(self) -> bool:
        try:
            self.ps.Nodes.load()
            return True
        except Exception:  # any failure means "not answering" for a ping
            return False

    def _modify_node(self, node: str, **changes: Any) -> None:
        self._wrap(lambda: self.ps.Node(node).modify(self.ps.Node(**changes)), f"modify node {node}")

    def drain(self, node: str, reason: str) -> None:
        self._modify_node(node, state="DRAIN", reason=reason)

    def resume(self, node: str) -> None:
        self._modify_node(node, state="RESUME")

    def set_reason(self, node: str, reason: str) -> None:
        self._modify_node(node, state="DRAIN", reason=reason)

    def reboot(self, node: str, reason: str, asap: bool = True, nextstate: str = "resume") -> None:
        raise SlurmNotSupported("the pyslurm backend does not reboot nodes; use the CLI backend")

    def capabilities(self) -> Dict[str, str]:
        caps = super().capabilities()
        caps["reboot"] = ""
        caps["resize-job"] = ""  # cannot shrink a running job (the hot-spare swap does): update_job says so
        caps["batch-script"] = ""  # not read through pyslurm (SlurmNotSupported, the base default)
        caps["job-gpus"] = caps["job-history"] = ""  # likewise: no mapping file, no restart cause from sacct
        return caps

    def _numeric_id(self, job_id: str) -> int:
        """Slurm's own id of a job; an array task ``123_4`` has its own id, found by looking it up."""
        text = str(job_id)
        if "_" not in text:
            return int(text)
        for job in self.list_jobs():
            if job.job_id == text:
                return int(job.raw_id)
        raise SlurmNotFound(f"array task {text} not found")

    def requeue(self, job_id: str, hold: bool = False) -> None:
        self._wrap(lambda: self.ps.Job(self._numeric_id(job_id)).requeue(hold=hold), f"requeue {job_id}")

    def release(self, job_id: str) -> None:
        self._wrap(lambda: self.ps.Job(self._numeric_id(job_id)).release(), f"release {job_id}")

    def update_job(self, job_id: str, update: JobUpdate) -> None:
        if update.nodes is not None:
            raise SlurmNotSupported("the pyslurm backend cannot shrink a running job; use slurm.backend = 'cli'")
        mapped: Dict[str, Any] = {}
        if update.excluded_nodes is not None:
            mapped["excluded_nodes"] = ",".join(update.excluded_nodes)
        if update.comment is not None:
            mapped["comment"] = update.comment
        if update.node_count is not None:
            mapped["nodes"] = f"{update.node_count[0]}-{update.node_count[1]}"
        desc = self.ps.JobSubmitDescription(**mapped)
        self._wrap(lambda: self.ps.Job(self._numeric_id(job_id)).modify(desc), f"update job {job_id}")

    def signal_job(self, job_id: str, signal: str, batch: bool = False, full: bool = False) -> None:
        steps = "batch" if batch else ("all" if full else "children")
        self._wrap(lambda: self.ps.Job(self._numeric_id(job_id)).send_signal(signal, steps=steps),
                   f"signal {job_id}")
