"""``autoheal status``: what the sources said, turned into one report and one screen. Pure (no I/O): the
command (``status_cmd``) reads Slurm, the journal, Kubernetes and the heartbeats, and hands the answers
here as plain values; a source that could not be read is a ``Source`` with an error, and the report says
so instead of guessing.

Problems (exit 1): a source that is configured but did not answer, the breaker tripped, a remediation
failed, no sync leader, xid-watch stopped or silent on a node in service, the guard silent, a job autoheal
requeued waiting longer than ``REQUEUE_WAIT_BOUND``. Nodes drained by autoheal are autoheal at work, not
a problem by themselves (the alert on the drained share is the page for too many)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence

from autoheal import fleet
from autoheal.reasons import Origin, Reason

#: Heartbeats older than this are a dead or hung daemon (as the alerts: xid-watch beats every 5 s).
XID_WATCH_STALE_SECONDS = 30.0
GUARD_STALE_SECONDS = 60.0
#: A job autoheal requeued that has waited this long is worth a look (as AutohealRequeuedJobNotRunning).
REQUEUE_WAIT_BOUND = 1800.0
#: Journal events that are a job requeued or swapped (the node side, the runner, the hot-spare runner, the
#: guard), and what each means for a person.
JOB_EVENTS = {"requeue": "requeued by xid-watch", "job-requeue": "requeued by its runner",
              "job-requeue-failed": "requeue FAILED", "job-hot-swap": "swapped to a spare",
              "guard-release": "released by the guard", "guard-requeue": "requeued by the guard (prolog lost)"}
#: Names listed on the screen per kind before "and N more" (the JSON has them all).
SCREEN_LIMIT = 20


@dataclass
class Source:
    """One thing status reads: ``state`` ok | error | off (not configured); ``detail`` says which/why."""

    name: str
    state: str = "ok"
    detail: str = ""

    def to_dict(self) -> Dict[str, str]:
        return {"name": self.name, "state": self.state, "detail": self.detail}


@dataclass
class Heartbeat:
    """A daemon's last heartbeat (epoch seconds), and whether it said it stopped (up 0)."""

    at: float
    up: bool = True


@dataclass(frozen=True)
class Remediation:
    """A node's remediation as the sync annotates its Kubernetes Node (``k8s_sync.remediation``)."""

    state: str
    k8s_node: str = ""
    since: Optional[float] = None
    reason: str = ""


@dataclass(frozen=True)
class BreakerView:
    """The sync's remediation breaker (its ConfigMap, read through ``k8s_sync.remediation.Breaker``)."""

    tripped: bool
    why: str = ""
    tripped_at: Optional[float] = None
    starts: int = 0  # remediation starts in its window

    def to_dict(self) -> Dict[str, Any]:
        return {"tripped": self.tripped, "tripped_at": self.tripped_at, "why": self.why, "starts": self.starts}


@dataclass(frozen=True)
class LeaseView:
    """The sync's leader Lease: who holds it, when it was renewed, whether it has expired."""

    holder: str
    expired: bool
    renew_time: str = ""


@dataclass
class Inputs:
    """Everything the command read. ``None`` for a part whose source failed or is off."""

    now: float
    sources: List[Source]
    nodes: Optional[Sequence[Any]] = None  # autoheal.slurm.model.Node
    jobs: Optional[Sequence[Any]] = None  # autoheal.slurm.model.Job, every state
    records: Optional[Sequence[Any]] = None  # autoheal.journal.Record of the last hour
    remediations: Optional[Dict[str, Remediation]] = None  # Slurm node -> its remediation
    breaker: Optional[BreakerView] = None
    lease: Optional[LeaseView] = None
    xid_watch: Optional[Dict[str, Heartbeat]] = None  # node -> heartbeat
    xid_watch_source: str = ""
    guard: Optional[Heartbeat] = None
    guard_source: str = ""
    spare_prefix: str = "autoheal: spare:"
    window: float = 3600.0


@dataclass
class Report:
    time: float
    sources: List[Dict[str, str]]
    fleet: Dict[str, int] = field(default_factory=dict)
    drained: List[Dict[str, Any]] = field(default_factory=list)
    breaker: Optional[Dict[str, Any]] = None
    jobs: List[Dict[str, Any]] = field(default_factory=list)
    components: List[Dict[str, str]] = field(default_factory=list)
    problems: List[str] = field(default_factory=list)

    def to_dict(self) -> Dict[str, Any]:
        return {"time": self.time, "ok": not self.problems, "sources": self.sources, "fleet": self.fleet,
                "drained": self.drained, "breaker": self.breaker, "jobs": self.jobs,
                "components": self.components, "problems": self.problems}


def rung(reason: str) -> str:
    """The recovery-ladder rung a drain reason says: drain (a health fault), reboot, replace, k8s, ..."""
    parsed = Reason.parse(reason)
    if parsed is None:
        return ""
    return "drain" if parsed.origin == Origin.HEALTH else str(parsed.origin.value)


def build(inp: Inputs) -> Report:
    rep = Report(time=inp.now, sources=[s.to_dict() for s in inp.sources])
    for s in inp.sources:
        if s.state == "error":
            rep.problems.append(f"{s.name}: could not be read: {s.detail}")
    _nodes(inp, rep)
    _breaker(inp, rep)
    _jobs(inp, rep)
    _components(inp, rep)
    return rep


def _nodes(inp: Inputs, rep: Report) -> None:
    if inp.nodes is None:
        return
    rep.fleet = fleet.counts(inp.nodes, inp.spare_prefix)
    rem = inp.remediations or {}
    for n in sorted(inp.nodes, key=lambda n: n.name):
        if fleet.bucket(n, inp.spare_prefix) != fleet.DRAINED_AUTOHEAL:
            continue
        r = rem.get(n.name) or Remediation("")
        rep.drained.append({"node": n.name, "state": n.state_text, "reason": n.reason, "since": n.reason_time,
                            "rung": rung(n.reason), "remediation": r.state,
                            "remediation_since": r.since, "kubernetes_node": r.k8s_node})
    for name, r in sorted(rem.items()):
        if r.state == "failed":
            rep.problems.append(f"remediation of {name} failed: {r.reason or 'see autoheal sync remediation'}")


def _breaker(inp: Inputs, rep: Report) -> None:
    if inp.breaker is None:
        return
    rep.breaker = inp.breaker.to_dict()
    if inp.breaker.tripped:
        rep.problems.append(f"remediation breaker tripped: {inp.breaker.why}".rstrip(": "))


def _jobs(inp: Inputs, rep: Report) -> None:
    if inp.records is None:
        return
    now_state = {j.job_id: j for j in (inp.jobs or ())}
    latest: Dict[str, Any] = {}
    for rec in inp.records:
        if rec.event not in JOB_EVENTS or rec.time < inp.now - inp.window:
            continue
        for jid in rec.job_ids or [""]:
            if jid:
                latest[jid] = rec  # file order: the last record of a job wins
    for jid, rec in sorted(latest.items(), key=lambda kv: kv[1].time):
        job = now_state.get(jid)
        now = "unknown (Slurm not read)" if inp.jobs is None else \
            ("gone (finished)" if job is None else
             job.state + (f" on {','.join(job.nodes)}" if job.state == "RUNNING" and job.nodes else ""))
        entry = {"job": jid, "event": rec.event, "what": JOB_EVENTS[rec.event], "time": rec.time, "node": rec.node,
                 "outcome": rec.outcome or "", "now": now}
        rep.jobs.append(entry)
        if job is not None and job.state == "PENDING" and job.eligible_time and \
                inp.now - job.eligible_time > REQUEUE_WAIT_BOUND and not (job.held and not job.requeue_held):
            rep.problems.append(f"job {jid} requeued by autoheal has waited {_ago(inp.now - job.eligible_time)} "
                                f"to run again")
        if rec.event == "job-requeue-failed" and (job is None or job.state != "RUNNING"):
            rep.problems.append(f"job {jid}: its runner's requeue failed ({rec.message[:120]})")


def _components(inp: Inputs, rep: Report) -> None:
    lease = inp.lease
    if lease is not None:
        if lease.holder and not lease.expired:
            rep.components.append({"name": "sync leader", "state": "ok",
                                   "detail": lease.holder + (f", renewed {lease.renew_time}" if lease.renew_time
                                                             else "")})
        else:
            detail = "no Lease holder" if not lease.holder else f"Lease of {lease.holder} expired"
            rep.components.append({"name": "sync leader", "state": "problem", "detail": detail})
            rep.problems.append(f"sync leader: {detail}")
    if inp.guard is not None:
        age = inp.now - inp.guard.at
        if not inp.guard.up:
            st, detail = "problem", f"stopped ({_ago(age)} ago)"
        elif age > GUARD_STALE_SECONDS:
            st, detail = "problem", f"no heartbeat for {_ago(age)}"
        else:
            st, detail = "ok", f"heartbeat {_ago(age)} ago"
        rep.components.append({"name": "guard", "state": st, "detail": f"{detail} [{inp.guard_source}]"})
        if st != "ok":
            rep.problems.append(f"guard: {detail}")
    elif inp.guard_source:
        rep.components.append({"name": "guard", "state": "unknown", "detail": inp.guard_source})
    if inp.xid_watch is not None:
        _xid_watch(inp, rep)
    elif inp.xid_watch_source:
        rep.components.append({"name": "xid-watch", "state": "unknown", "detail": inp.xid_watch_source})


def _xid_watch(inp: Inputs, rep: Report) -> None:
    beats = inp.xid_watch or {}
    # the nodes that should run one: every node Slurm knows but retired ones and spares held out
    gone = (fleet.RETIRED, fleet.SPARE)
    expect = sorted(n.name for n in inp.nodes if fleet.bucket(n, inp.spare_prefix) not in gone) \
        if inp.nodes is not None else sorted(beats)
    bad: List[str] = []
    for node in expect:
        hb = beats.get(node)
        if hb is None:
            bad.append(f"{node} (no heartbeat)")
        elif not hb.up:
            bad.append(f"{node} (stopped)")
        elif inp.now - hb.at > XID_WATCH_STALE_SECONDS:
            bad.append(f"{node} (silent {_ago(inp.now - hb.at)})")
    if bad:
        rep.components.append({"name": "xid-watch", "state": "problem",
                               "detail": f"{len(bad)} of {len(expect)} nodes: {_names(bad)} [{inp.xid_watch_source}]"})
        rep.problems += [f"xid-watch on {b}" for b in bad]
    else:
        rep.components.append({"name": "xid-watch", "state": "ok",
                               "detail": f"{len(expect)} nodes beating [{inp.xid_watch_source}]"})


def _names(items: Sequence[str]) -> str:
    shown = ", ".join(items[:SCREEN_LIMIT])
    return shown + (f" and {len(items) - SCREEN_LIMIT} more" if len(items) > SCREEN_LIMIT else "")


def _ago(seconds: float) -> str:
    s = max(0, int(seconds))
    if s < 120:
        return f"{s}s"
    if s < 7200:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{(s % 3600) // 60:02d}m"


def _clock(t: Optional[float], now: float) -> str:
    if not t:
        return "-"
    return time.strftime("%H:%M:%S", time.localtime(t)) + f" ({_ago(now - t)} ago)"


def render(rep: Report) -> str:
    """The screen for a person."""
    now = rep.time
    out = [f"autoheal status at {time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(now))}   sources: "
           + ", ".join(f"{s['name']} {s['state']}" for s in rep.sources)]
    for s in rep.sources:
        if s["state"] == "error":
            out.append(f"  ! {s['name']} could not be read: {s['detail']} (what it shows is missing below)")
    if rep.fleet:
        f = rep.fleet
        out += ["", f"fleet: {sum(f.values())} Slurm nodes: {f['in-service']} in service, {f['drained-autoheal']} "
                f"drained by autoheal, {f['drained-other']} drained by others, {f['retired']} retired, "
                f"{f['spare']} spare"]
    if rep.breaker is not None:
        b = rep.breaker
        out.append("breaker: " + (f"TRIPPED {_clock(b.get('tripped_at'), now)}: {b.get('why', '')}" if b.get("tripped")
                                  else f"armed ({b.get('starts', 0)} remediation starts in its window)"))
    if rep.drained:
        out += ["", "drained by autoheal:"]
        rows = [("NODE", "SINCE", "RUNG", "REMEDIATION", "K8S NODE", "REASON")]
        for d in rep.drained[:SCREEN_LIMIT * 5]:
            rows.append((d["node"], _clock(d["since"], now), d["rung"] or "-", d["remediation"] or "-",
                         d["kubernetes_node"] or "-", d["reason"]))
        out += _table(rows)
        if len(rep.drained) > SCREEN_LIMIT * 5:
            out.append(f"  ... and {len(rep.drained) - SCREEN_LIMIT * 5} more (--json lists all)")
    elif rep.fleet:
        out += ["", "drained by autoheal: none"]
    if rep.jobs or any(s["name"] == "journal" and s["state"] == "ok" for s in rep.sources):
        out += ["", "jobs requeued or swapped in the last hour:" + ("" if rep.jobs else " none")]
        if rep.jobs:
            rows = [("JOB", "WHEN", "WHAT", "NODE", "OUTCOME", "NOW")]
            for j in rep.jobs[-SCREEN_LIMIT * 5:]:
                rows.append((j["job"], _clock(j["time"], now), j["what"], j["node"] or "-", j["outcome"] or "-",
                             j["now"]))
            out += _table(rows)
    if rep.components:
        out += ["", "components:"]
        out += _table([(c["name"], c["state"].upper() if c["state"] == "problem" else c["state"], c["detail"])
                       for c in rep.components])
    out += ["", f"problems: {len(rep.problems)}" if rep.problems else "no problem found"]
    out += [f"  - {p}" for p in rep.problems[:SCREEN_LIMIT * 2]]
    if len(rep.problems) > SCREEN_LIMIT * 2:
        out.append(f"  ... and {len(rep.problems) - SCREEN_LIMIT * 2} more (--json lists all)")
    return "\n".join(out)


def _table(rows: Sequence[Sequence[str]]) -> List[str]:
    widths = [max(len(str(r[i])) for r in rows) for i in range(len(rows[0]) - 1)]
    return ["  " + "  ".join(str(c).ljust(w) for c, w in zip(r, widths)) + "  " + str(r[-1]) for r in rows]
