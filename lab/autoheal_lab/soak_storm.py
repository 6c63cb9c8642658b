"""The soak's job storms and bad repairs (issue 22 sections 3 and 4), kept apart from the soak's loop.

**Job storm** (kind ``job-storm``): one running job's processes raise an application XID of NVIDIA's
catalog (the fault's ``xid``, drawn from RESTART_APP) on every node the job runs on, each line naming
the job's own process (``pid=``), as the driver does when a job's kernel faults everywhere at once.
Invariant ``app-xid-drain``: no node is drained for it (nor for any other application XID).

**Bad repair** (kind ``bad-repair``): a node's GPU keeps its defect: a reset-class XID comes back each
time the node is returned to service, ``BAD_REPAIR_FAULTS`` times. Invariant ``lemon-cycling``: by the
end the node is out of service as a lemon (drained ``autoheal: lemon: ...``, or retired and replaced
after it), not back in service for another round.
"""

from __future__ import annotations

import os
import re
import time
from typing import TYPE_CHECKING, Dict, List, Optional, Sequence, Tuple

from autoheal_lab.soak_checks import Injected, Snapshot, Violation

if TYPE_CHECKING:
    from autoheal_lab.soak import Soak

#: Injections of a bad repair: the lemon threshold of the lab's hooks (hooks.lemon_faults, 3).
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


def bad_repair(soak: Soak, inj: Injected, node: str, gpu: int, deadline: float, times: int = BAD_REPAIR_FAULTS) -> None:
    """Raise ``BAD_REPAIR_XID`` on ``node``, and again each time it is back in service, up to ``times``
    times or ``deadline``."""
    from autoheal_lab import gpus as labgpus

    state = {"count": 1, "was_out": False}
    labgpus.inject(soak.lab, node, gpu, "xid", xid=BAD_REPAIR_XID)
    inj.count = 1

    def look() -> None:
        if state["count"] >= times or time.time() > deadline:
            inj.end = time.time()
            return
        n = soak.slurm.get_node(node)
        in_service = not (n.drain or n.down)
        if not in_service:
            state["was_out"] = True
        elif state["was_out"]:  # repaired and returned: the defect is still there
            labgpus.inject(soak.lab, node, gpu, "xid", xid=BAD_REPAIR_XID)
            state["count"] += 1
            state["was_out"] = False
            inj.count = state["count"]
        soak._at(time.time() + 2.0, f"bad repair of {node}: look again", look)

    soak._at(time.time() + 2.0, f"bad repair of {node}: look again", look)


def _named_xid(text: str) -> Optional[int]:
    from autoheal.reasons import Reason

    parsed = Reason.parse(text)
    return parsed.named_xid if parsed is not None else None


def check(injected: Sequence[Injected], journal: Sequence[dict], final: Snapshot,
          lemon_faults: int = BAD_REPAIR_FAULTS) -> List[Violation]:
    """The invariants of job storms and bad repairs, at the end of the soak. ``lemon_faults``: the lab's
    hooks.lemon_faults (0: lemons off, the bad repairs are not judged)."""
    from autoheal.hooks import lemon
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
    for inj in injected:
        if inj.kind != "bad-repair" or not inj.node or lemon_faults <= 0:
            continue
        n = final.nodes.get(inj.node) or {}
        reason = n.get("reason") or ""
        retired = bool(n.get("drain")) and (lemon.is_lemon(reason) or reason.startswith("autoheal: retired"))
        gone = not n  # replaced and deleted from Slurm
        if inj.count >= lemon_faults and not (retired or gone):
            out.append(Violation("lemon-cycling", f"{inj.node}: its defect came back {inj.count} times and it is "
                                 f"not retired as a lemon at the end ({n.get('state')}: {reason!r})", final.time,
                                 {"fault": inj.id, "node": n}))
    return out
