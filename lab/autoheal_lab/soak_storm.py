"""The soak's job storms and bad repairs (issue 22 sections 3 and 4), kept apart from the soak's loop.

**Job storm** (kind ``job-storm``): one running job's processes raise an application XID of NVIDIA's
catalog (the fault's ``xid``, drawn from RESTART_APP) on every node the job runs on, each line naming
the job's own process (``pid=``), as the driver does when a job's kernel faults everywhere at once.
Invariant ``app-xid-drain``: no node is drained for it (nor for any other application XID).

**Bad repair** (kind ``bad-repair``): a node's GPU keeps its defect: a reset-class XID comes back each
time the node is returned to service (autoheal's reset and resume, the technician's repair in place)
for as long as the soak runs. Invariant ``lemon-cycling`` (with the soak's ``lemon_faults``, the
product's default 3): once the defect came back that often the node was drained a lemon, autoheal never
returned it to service after that, and at the end it is out of service as a lemon with a replacement
asked, retired, or gone (replaced), not back in service for another round.
"""

from __future__ import annotations

import os
import re
import time
from typing import TYPE_CHECKING, Dict, List, Optional, Sequence, Tuple

from autoheal_lab.soak_checks import Injected, Snapshot, Violation

if TYPE_CHECKING:
    from autoheal_lab.soak import Soak

#: The lemon threshold the soak's lab runs with (SoakOptions.lemon_faults: hooks.lemon_faults' default).
BAD_REPAIR_FAULTS = 3
#: The XID a bad repair raises (RESET_GPU in the catalog: drained, reset, returned, and again).
BAD_REPAIR_XID = 95
_ENV = re.compile(rb"(?:^|\x00)(SLURM_JOB_ID|SLURMD_NODENAME)=([^\x00]*)")


def job_processes(job: str, marker: str, proc: str = "/proc") -> Dict[str, Tuple[int, str]]:
    """node -> (pid, name) of one process of ``job`` on it (the lab's nodes share this machine: the
    process's SLURMD_NODENAME says which node runs it). ``marker``: text the environment of this lab's
    jobs holds (its directory): other labs on the machine have jobs with the same ids and node names."""
    out: Dict[str, Tuple[int, str]] = {}
    for entry in os.listdir(proc):
        if not entry.isdigit():
            continue
        try:
            with open(os.path.join(proc, entry, "environ"), "rb") as fh:
                raw = fh.read()
            if marker.encode() not in raw:
                continue
            env = {k.decode(): v.decode("utf-8", "replace") for k, v in _ENV.findall(raw)}
            with open(os.path.join(proc, entry, "comm"), encoding="utf-8", errors="replace") as fh:
                name = fh.read().strip()
        except OSError:
            continue
        if env.get("SLURM_JOB_ID") == job and env.get("SLURMD_NODENAME") and env["SLURMD_NODENAME"] not in out:
            out[env["SLURMD_NODENAME"]] = (int(entry), name)
    return out


def storm_target(snap: Optional[Snapshot]) -> Tuple[str, List[str]]:
    """The running job on the most nodes (ties: the lowest id), and its nodes."""
    running = [(jid, list(v.get("nodes") or [])) for jid, v in (snap.jobs if snap else {}).items()
               if v.get("state") == "RUNNING" and v.get("nodes")]
    if not running:
        return "", []
    return min(running, key=lambda jv: (-len(jv[1]), jv[0]))


def job_storm(soak: Soak, inj: Injected, xid: int, snap: Optional[Snapshot]) -> None:
    """Carry out one job storm (see the module doc); notes what it did on ``inj``."""
    from autoheal_lab import gpus as labgpus

    job, nodes = storm_target(snap)
    inj.job = job
    if not job:
        inj.note = (inj.note + " no job running: no storm").strip()
        return
    procs = job_processes(job, str(soak.lab.root))
    hit = []
    for node in nodes:
        pid, name = procs.get(node, (None, ""))
        for gpu in range(min(2, soak.lay.gpus)):
            labgpus.inject(soak.lab, node, gpu, "xid", xid=xid, pid=pid, name=name or None)
        hit.append(f"{node}" + (f" (pid {pid})" if pid else " (no process found: pid unknown)"))
    inj.note = (inj.note + f" job {job}: xid {xid} on {', '.join(hit)}").strip()
    inj.end = time.time()


class BadRepair:
    """One bad repair (see the module doc), watched on every snapshot of the soak, not through the event
    queue (it lasts as long as the soak): ``BAD_REPAIR_XID`` on ``node``'s ``gpu`` now, and again each time
    a snapshot shows the node back in service after it was out, whoever returned it (autoheal's resume
    after a reset, the technician's repair in place): the defect is never fixed.

    ``returns`` lists each return to service (time, and who: ``technician`` when the soak's technician
    resumed it just before, else ``autoheal``) seen after the node was drained as a lemon; a lemon that
    autoheal put back into service is the cycling the lemon rule exists to stop."""

    def __init__(self, inj: Injected, node: str, gpu: int) -> None:
        self.inj, self.node, self.gpu = inj, node, gpu
        self.was_out = False
        self.lemon_since: Optional[float] = None
        self.lemon_returns: List[Tuple[float, str]] = []

    def start(self, soak: Soak) -> None:
        from autoheal_lab import gpus as labgpus

        labgpus.inject(soak.lab, self.node, self.gpu, "xid", xid=BAD_REPAIR_XID)
        self.inj.count = 1

    def observe(self, soak: Soak, snap: Snapshot, repaired_at: Sequence[float] = ()) -> None:
        """``repaired_at``: when the technician resumed this node (their ``repaired`` times)."""
        from autoheal.hooks import lemon
        from autoheal_lab import gpus as labgpus
        from autoheal_lab.soak_checks import node_in_service

        n = snap.nodes.get(self.node)
        if n is None:
            return  # replaced and deleted from Slurm (or a failed snapshot of it): nothing comes back
        if not node_in_service(n):
            self.was_out = True
            if n.get("drain") and lemon.is_lemon(n.get("reason")) and self.lemon_since is None:
                self.lemon_since = snap.time
            return
        if not self.was_out:
            return
        if self.lemon_since is not None:
            by = "technician" if any(self.lemon_since <= t <= snap.time + 1.0 for t in repaired_at) else "autoheal"
            self.lemon_returns.append((snap.time, by))
            self.lemon_since = None
        labgpus.inject(soak.lab, self.node, self.gpu, "xid", xid=BAD_REPAIR_XID)  # the defect is still there
        self.was_out = False
        self.inj.count += 1


def _named_xid(text: str) -> Optional[int]:
    from autoheal.reasons import Reason

    parsed = Reason.parse(text)
    return parsed.named_xid if parsed is not None else None


def check(injected: Sequence[Injected], journal: Sequence[dict], final: Snapshot,
          lemon_faults: int = BAD_REPAIR_FAULTS, watches: Sequence[BadRepair] = ()) -> List[Violation]:
    """The invariants of job storms and bad repairs, at the end of the soak. ``lemon_faults``: the lab's
    hooks.lemon_faults (0: lemons off, the bad repairs are not judged); ``watches``: the soak's
    ``BadRepair`` of each bad-repair fault (its returns to service as a lemon)."""
    from autoheal.hooks.xid_catalog import DRAIN_POLICIES, default_policy

    out: List[Violation] = []
    for r in journal:
        if r.get("event") != "drain":
            continue
        xid = _named_xid(r.get("message") or "")
        if xid is not None and default_policy(xid) not in DRAIN_POLICIES:
            out.append(Violation("app-xid-drain", f"{r.get('node')} drained for xid {xid}, an application "
                                 f"(or ignore) XID of NVIDIA's catalog: {r.get('message')}", float(r.get("time", 0)),
                                 {"record": r}))
    if lemon_faults <= 0:
        return out
    watched = {w.inj.id: w for w in watches}
    for inj in injected:
        if inj.kind == "bad-repair" and inj.node:
            out += _lemon_violations(inj, watched.get(inj.id), journal, final, lemon_faults)
    return out


#: Seconds after the technician returned a lemon within which the end state may still show it in service
#: (its defect raised again, the drain a moment away): their repair, not autoheal's cycling.
TECHNICIAN_JUST_RETURNED = 30.0


def _lemon_violations(inj: Injected, watch: Optional[BadRepair], journal: Sequence[dict], final: Snapshot,
                      lemon_faults: int) -> List[Violation]:
    """``lemon-cycling``: a node whose defect came back ``lemon_faults`` times is drained a lemon (a
    ``lemon`` record); once it is one (that, or sooner with its earlier faults), autoheal never put it back
    into service, and at the end it is out of
    service as a lemon with a replacement asked (the sync's remediation or NodeReplacement for it; without
    Kubernetes the ``lemon`` record told a person), retired, or gone."""
    from autoheal.hooks import lemon

    out: List[Violation] = []
    node = inj.node
    for t, by in (watch.lemon_returns if watch else []):
        if by != "technician":
            out.append(Violation("lemon-cycling", f"{node}: drained a lemon, then back in service at {t:.1f} "
                                 f"without a technician's repair", t,
                                 {"fault": inj.id, "returns": watch.lemon_returns}))
    records = [r for r in journal if r.get("event") == "lemon" and r.get("node") == node
               and float(r.get("time") or 0) >= inj.start - 1.0]
    # judged once the defect alone came back lemon_faults times, or once the node was judged a lemon
    # sooner (its history holds the node's earlier faults too): a lemon stays one
    if inj.count < lemon_faults and not records:
        return out
    n = final.nodes.get(node) or {}
    reason = n.get("reason") or ""
    if not records:
        out.append(Violation("lemon-cycling", f"{node}: its defect came back {inj.count} times and it was never "
                             f"drained a lemon (no 'lemon' journal record)", final.time, {"fault": inj.id, "node": n}))
    if not n or (n.get("drain") and reason.startswith("autoheal: retired")):
        return out  # replaced: deleted from Slurm, or retired
    last = watch.lemon_returns[-1] if watch and watch.lemon_returns else None
    if not n.get("drain") and last and last[1] == "technician" and final.time - last[0] <= TECHNICIAN_JUST_RETURNED:
        return out
    if not (n.get("drain") and lemon.is_lemon(reason)):
        out.append(Violation("lemon-cycling", f"{node}: its defect came back {inj.count} times and it is not "
                             f"retired as a lemon at the end ({n.get('state')}: {reason!r})", final.time,
                             {"fault": inj.id, "node": n}))
    elif final.kube is not None and not _replacement_asked(final, node):
        out.append(Violation("lemon-cycling", f"{node}: drained a lemon at the end with no replacement asked "
                             f"(no remediation state, no NodeReplacement)", final.time,
                             {"fault": inj.id, "kube": final.kube.get(node)}))
    return out


def _replacement_asked(final: Snapshot, node: str) -> bool:
    k = (final.kube or {}).get(node) or {}
    return bool(k.get("remediation")) or any(r.get("node") == node for r in final.replacements or [])
