"""One health pass over a node: gather, judge, remember, then drain / repair / resume through Slurm.

Used by the healthcheck (full pass), ``autoheal check`` (full pass, optionally without Slurm changes)
and the prolog/epilog (cheap pass). Decisions follow the ownership rules of ``autoheal.nodeops``; a
Slurm that does not answer or an NVML that only says "unknown" never leads to a drain (exit 2).
"""

from __future__ import annotations

import time
from dataclasses import field

from autoheal.events import Event
from autoheal.hooks import checks as C
from autoheal.hooks import lemon, preswap
from autoheal.hooks import state as S
from autoheal.hooks.gather import NodeSample, gather, index_by_pci
from autoheal.hooks.ladder import Rung, next_rung
from autoheal.hooks.xid_catalog import JOB_POLICIES
from autoheal.hooks.xids import LogCursor, XidEvent, boot_id, normalize_pci, read_kernel_log
from autoheal.reasons import parse_body
from autoheal.records import cast, record

TYPE_CHECKING = False  # typing is for mypy only: not imported at run time (the hooks start fast)
if TYPE_CHECKING:
    from typing import Any, Dict, List, Optional, TypedDict

    from autoheal.hooks.actions import Action
    from autoheal.hooks.context import Context
    from autoheal.nodeops import Outcome
    from autoheal.slurm.model import Node

    class Note(TypedDict):
        """A journal record an XID judge leaves for its caller (``ctx.record(Event.DETECTION, **note)``):
        a repeat of a fault already handled, said at most once a minute. Typed for mypy only: at run time
        a plain dict, as ``record`` takes its fields (the hooks start fast: issue 24 section 6)."""

        check: str
        severity: str
        outcome: str
        message: str
        evidence: Dict[str, Any]


EXIT_OK, EXIT_FAIL, EXIT_UNKNOWN = 0, 1, 2
RUNG_WEIGHT = {C.RESET: 1, C.REBOOT: 2, C.REPLACE: 3}


@record
class Pass:
    """The outcome of one pass: what was seen, what was done, and the exit code."""

    node: str
    status: C.Status = C.UNKNOWN
    results: List[C.CheckResult] = field(default_factory=list)
    actions: List[Action] = field(default_factory=list)
    errors: List[str] = field(default_factory=list)
    exit_code: int = EXIT_UNKNOWN
    sample: Optional[NodeSample] = None
    # CLOCK_MONOTONIC (kmsg's clock) when the pass began: XIDs logged before it were read by this pass or
    # an earlier one; one logged while this pass ran must still be judged by the next.
    started_usec: int = 0

    def to_dict(self, verbose: bool = False) -> Dict[str, Any]:
        res = [r.to_dict() for r in self.results if verbose or r.status != C.OK]
        return {"node": self.node, "status": self.status, "exit_code": self.exit_code, "results": res,
                "actions": [a.to_dict() for a in self.actions], "errors": self.errors,
                "gpus": None if self.sample is None else self.sample.count}

    def summary(self) -> str:
        bad = [r.text for r in self.results if r.status in (C.FAIL, C.UNKNOWN, C.WARN)]
        head = f"{self.node}: {self.status}"
        return head + ("" if not bad else ": " + "; ".join(bad[:5]) + (" ..." if len(bad) > 5 else ""))


#: At most one "seen again" journal record per XID and GPU per this many seconds.
REPEAT_NOTE_SECONDS = 60.0


def xid_results(ctx: Context, st: S.NodeStateData, events: List[XidEvent], pci_map: Dict[str, int],
                now: float, notes: Optional[List[Note]] = None) -> List[C.CheckResult]:
    """Judge new XIDs once each: dedupe against recent ones (other sources, companion events), count
    application XIDs per GPU, open a fault for every drain-class XID.

    A repair of the GPU (reset, reboot, resume, admin clear) ends the dedupe window: the same XID back
    after it is a new fault, judged and acted on at once (the ladder then escalates). The other source's
    report of the same XID is silent; a repeat from the same source goes to ``notes`` (journal records
    for the caller, at most one per XID and GPU a minute), so a storm is never silent."""
    h = ctx.hooks
    out: List[C.CheckResult] = []
    last_pass = st.get("last_pass") or {}
    for ev in events:
        # an XID logged before the last passing check was already judged (or predates this install)
        if (ev.usec is not None and last_pass.get("boot_id") == boot_id()
                and ev.usec < int(last_pass.get("usec", 0))):
            continue
        gpu = ev.gpu if ev.gpu is not None else pci_map.get(ev.pci)
        pci_full = next((k + ".0" for k, v in pci_map.items() if v == gpu), "") if gpu is not None else ""
        dup = S.recent_xid(st, ev.xid, gpu, ev.pci, now, h.xid_dedupe_seconds, source=ev.source)
        if dup is not None:
            companion = _seen_again(ctx, dup, ev, gpu, pci_full, now, notes)
            if companion is not None:
                out.append(companion)
            continue
        same = _open_same_fault(st, ev.xid, gpu)
        if same is not None:
            _count_open_fault(same, ev, gpu, now, notes)
            S.remember_xid(st, ev.xid, gpu, ev.pci, now, source=ev.source)
            continue
        repaired = S.repaired_at(st, gpu)
        before = [x for x in st.get("recent_xids", []) if x.get("xid") == ev.xid and x.get("gpu") == gpu
                  and float(x.get("time", 0)) < repaired]
        S.remember_xid(st, ev.xid, gpu, ev.pci, now, source=ev.source)
        r = C.judge_xid(ev, h.xid_policy, gpu, pci_full, node=ctx.node)
        if ev.source == "nvml" and r.evidence.get("policy") in JOB_POLICIES:
            st["recent_xids"][-1]["app_pending"] = True  # the kernel log's copy will name the process
        if before and repaired:
            r.evidence["after_repair"] = repaired  # the fault came back: the ladder climbs
        out.append(r)
        if r.status == C.FAIL:
            S.open_fault(st, {"check": "xid", "gpu": gpu, "action": r.action, "reason": r.text, "since": now,
                              "evidence": r.evidence})
    return out


def _seen_again(ctx: Context, dup: S.RecentXid, ev: XidEvent, gpu: Optional[int], pci_full: str, now: float,
                notes: Optional[List[Note]]) -> Optional[C.CheckResult]:
    """An XID judged within the dedupe window: the other source's copy (silent; judged once more only for
    an application XID whose process the kernel log names), or a repeat (a note at most once a minute)."""
    sources = dup.setdefault("sources", [])
    if ev.source not in sources:
        sources.append(ev.source)  # the same XID told by the other source (NVML / kernel log)
        if dup.pop("app_pending", False) and ev.line:
            # an application XID NVML told first, with no process: the kernel log's copy names the
            # process, so its job can be told (xid_jobs); judged once more, for that only
            r = C.judge_xid(ev, ctx.hooks.xid_policy, gpu, pci_full, node=ctx.node)
            r.evidence["companion"] = True
            return r
        return None
    dup["dups"] = int(dup.get("dups", 0)) + 1  # the GPU raised it again: a repeat of the fault
    if notes is not None and now - float(dup.get("noted", 0)) >= REPEAT_NOTE_SECONDS:
        dup["noted"] = now
        r = C.judge_xid(ev, ctx.hooks.xid_policy, gpu, pci_full, node=ctx.node)
        notes.append({"check": "xid", "severity": "info", "outcome": "repeat",
                      "message": f"{r.text}: seen again ({dup['dups']} time(s) since "
                      f"{time.strftime('%H:%M:%S', time.localtime(float(dup['time'])))}), "
                      f"same fault", "evidence": {**r.evidence, "repeats": dup["dups"]}})
    return None


def _count_open_fault(same: S.Fault, ev: XidEvent, gpu: Optional[int], now: float,
                      notes: Optional[List[Note]]) -> None:
    """The fault this XID opened is still open (no repair since): the same XID again is that fault with a
    count, not a second drain, ladder step or notification (issue 22: 672 XID 45s on 3 nodes in 3 hours
    were 672 fatal events)."""
    same["count"] = int(same.get("count", 1)) + 1
    if notes is not None and now - float(same.get("noted", 0)) >= REPEAT_NOTE_SECONDS:
        same["noted"] = now
        notes.append({"check": "xid", "severity": "info", "outcome": "repeat",
                      "message": f"{same.get('reason', '')}: seen again, {same['count']} times while "
                      f"the fault is open, same fault", "evidence": {"xid": ev.xid, "gpu": gpu,
                                                                     "count": same["count"]}})


def _open_same_fault(st: S.NodeStateData, xid: int, gpu: Optional[int]) -> Optional[S.Fault]:
    """The open XID fault of ``gpu`` that this same XID opened after the GPU's last repair, if any."""
    for f in st.get("faults", []):
        if f.get("check", "xid") == "xid" and f.get("gpu") == gpu \
                and (f.get("evidence") or {}).get("xid") == xid \
                and float(f.get("since", 0) or 0) >= S.repaired_at(st, gpu):
            return f
    return None


def observe(ctx: Context, budget: float, cheap: bool = False, read_log: bool = True,
            now: Optional[float] = None) -> Pass:
    """Gather and judge; update the node state (kernel-log cursor, XIDs, unknown streaks, faults)."""
    now = time.time() if now is None else now
    p = Pass(node=ctx.node, started_usec=int(time.monotonic() * 1e6))
    sample = gather(ctx.node, budget=budget, cheap=cheap)
    p.sample = sample
    expected = 0 if cheap else ctx.expected_gpus()
    off = set(ctx.hooks.disabled_checks)
    with ctx.store.locked() as st:
        pci_map = dict(st.get("gpu_pci", {}))
        pci_map.update(index_by_pci(sample))
        st["gpu_pci"] = pci_map
        by_index = {v: k for k, v in pci_map.items()}
        for g in sample.gpus:  # a lost GPU no longer tells its PCI address: use the one remembered
            if not g.pci and g.index in by_index:
                g.pci = by_index[g.index] + ".0"
        results = C.judge_sample(sample, ctx.hooks, expected)
        notes: List[Note] = []
        events: List[XidEvent] = []
        xres: List[C.CheckResult] = []
        if read_log and ctx.hooks.kernel_log and "xid" not in off:
            events, cursor = read_kernel_log(ctx.path(ctx.hooks.kernel_log), LogCursor.from_dict(st.get("kmsg")))
            st["kmsg"] = cursor.to_dict()
            xres = xid_results(ctx, st, events, pci_map, now, notes)
            results += xres
        if not cheap:
            results = _escalate_unknown(ctx, st, results)
        # open faults keep failing until a repair rung closes them
        failing = {(r.check, r.gpu) for r in results if r.status == C.FAIL}
        for f in st.get("faults", []):
            if (f.get("check", "xid"), f.get("gpu")) in failing:
                continue
            results.append(C.CheckResult(f.get("check", "xid"), C.FAIL, parse_body(f.get("reason", "")),
                                         cast("C.CheckAction", f.get("action", C.RESET)), f.get("gpu"),
                                         {"open_fault_since": f.get("since")}))
        p.results = results
        p.status = C.overall(results)
        if not cheap:
            st["last_result"] = {"time": now, "status": p.status, "source": ctx.source,
                                 "results": [r.to_dict() for r in results if r.status != C.OK]}
    trouble = getattr(ctx.store, "trouble", "")
    if trouble:  # the node state could not be saved: the checks still ran, on an in-memory copy
        p.errors.append(trouble)
    for n in notes:
        ctx.record(Event.DETECTION, **n)
    if xres:  # application XIDs the healthcheck read first: the job's record (xid_jobs), never a drain
        from autoheal.hooks import xid_jobs

        xid_jobs.attribute(ctx, xres, events, None, now)
    return p


def _escalate_unknown(ctx: Context, st: S.NodeStateData, results: List[C.CheckResult]) -> List[C.CheckResult]:
    """A GPU unreadable in N consecutive full passes is failed as unresponsive."""
    streaks: Dict[str, int] = {}
    old = st.get("unknown_runs", {})
    out = []
    for r in results:
        if r.status == C.UNKNOWN and r.gpu is not None:
            key = str(r.gpu)
            streaks[key] = int(old.get(key, 0)) + 1
            if streaks[key] >= ctx.hooks.unknown_runs_to_fail:
                why = C.on_gpu("gpu-lost", None, f"unresponsive in {streaks[key]} checks", ctx.node, index=r.gpu)
                r = C.CheckResult("gpu-lost", C.FAIL, why, C.REBOOT, r.gpu, r.evidence)
        out.append(r)
    st["unknown_runs"] = streaks
    return out


# ---- Slurm side --------------------------------------------------------------------------------------

def drain_for(ctx: Context, failure: C.CheckResult, dry_run: bool = False) -> Action:
    """Drain with ``autoheal: <failure>``; keep an existing drain of ours (no reason churn) and never
    touch someone else's. Raises SlurmUnavailable when slurmctld does not answer."""
    from autoheal import nodeops
    from autoheal.hooks.actions import Action, Kind
    from autoheal.reasons import (
        Origin,
        Reason,
        is_health_drain,
        is_k8s_origin,
        is_ours,
        is_preswap,
        strip_reason_suffix,
    )

    # the rung the ladder decides for this fault now is in the first drain's reason (``autoheal: replace:``
    # for XID 79), so the sync acts at once instead of after the next healthcheck's repair pass
    rung = first_rung(ctx, ctx.store.read(), failure, time.time())
    asks_replace = rung == C.REPLACE
    reason = (failure.reason.with_origin(Origin.REPLACE) if asks_replace else failure.reason).render()
    node = ctx.slurm.get_node(ctx.node)
    current = strip_reason_suffix(node.reason)
    lemon_body = None
    new_episode = not ((node.drain or node.down) and is_health_drain(current))
    if new_episode:
        # a new fault on a node in service (or one drained for something else than a fault: a cordon, a
        # pre-emptive swap, an admin): one more in its history, maybe the one that makes it a lemon
        lemon_body = lemon.verdict(ctx.store.read(), time.time(), failure.check, failure.evidence.get("xid"),
                                   ctx.hooks.lemon_faults, ctx.hooks.lemon_window)
        if lemon_body is not None:
            reason = lemon.reason(lemon_body)
    # A drain that mirrors a Kubernetes cordon is not a health drain: replace its reason with the fault,
    # or sync would never see the fault and the hooks would later "resume" a cordoned node. Nor is a
    # pre-emptive swap's (hooks/preswap.py): a real fault (not one of the warning signs) replaces it, so
    # xid-watch signals the jobs.
    replace = is_k8s_origin(current) or (is_preswap(current) and not preswap.is_sign(failure, ctx.hooks))
    # a fault whose rung is replace, on a node of ours drained for a lower rung: the reason says so now
    parsed = Reason.parse(current)
    upgrade = (asks_replace and lemon_body is None and is_health_drain(current) and parsed is not None
               and parsed.origin not in (Origin.REPLACE, Origin.LEMON))
    if (node.drain or node.down) and current and is_ours(current) and not (replace or upgrade):
        out = nodeops.Outcome(ctx.node, nodeops.SKIPPED_SAME, current, current, dry_run)
    else:
        out = nodeops.drain(ctx.slurm, ctx.node, reason, dry_run=dry_run)
    act = Action(Kind.DRAIN, out.action, out.reason, dry_run, previous_reason=out.previous_reason)
    if not dry_run and out.action in (nodeops.DRAINED, nodeops.REASON_UPDATED, nodeops.SKIPPED_SAME) \
            and is_ours(out.reason or current):
        _remember_drain(ctx, failure, out, current, new_episode)
    if out.changed:
        ctx.record(Event.DRAIN, check=failure.check, action="drain", outcome=out.action, message=out.reason,
                   severity="action", evidence=failure.evidence)
        if asks_replace and lemon_body is None and is_ours(out.reason):
            _replacement_asked(ctx, failure, out.reason, time.time(), out.action, announce=True)
        if lemon_body is not None:
            ctx.record(Event.LEMON, check=failure.check, action="retire", outcome="drained", severity="action",
                       message=f"{ctx.node} is a lemon: {lemon_body}; no automatic return (last fault: "
                       f"{failure.text})", evidence={"history": lemon.history(ctx.store.read())[-20:]})
    elif out.action == nodeops.SKIPPED_FOREIGN and not dry_run:
        _note_foreign(ctx, failure, out)
    return act


def _remember_drain(ctx: Context, failure: C.CheckResult, out: Outcome, current: str, new_episode: bool) -> None:
    """Our drain (made, reworded, or already there) in the node state: the record maybe_resume reads."""
    from autoheal import nodeops
    from autoheal.reasons import is_preswap

    with ctx.store.locked() as st:
        if new_episode and out.action in (nodeops.DRAINED, nodeops.REASON_UPDATED):
            lemon.note_fault(st, time.time(), failure.check, failure.evidence.get("xid"), failure.gpu,
                             failure.text)
        rec = st.get("drain") or {}
        # A record naming another reason than the node now carries, or one left from before a fresh drain,
        # is stale: its drain ended without the hooks seeing it (a technician's `autoheal node resume`
        # between two healthchecks). Kept, maybe_resume read the mismatch as "re-drained by someone else"
        # and forgot the drain, and the node stayed drained for good (soak seed 2, gpu4).
        if not rec or is_preswap(rec.get("reason")) or out.action == nodeops.DRAINED \
                or rec.get("reason") != (out.reason or current):
            now = time.time()
            # ``opened``: when this drain began, kept while the node stays drained for faults (a reworded
            # reason, a climb to replace). xid-watch ties its fault episode to it: a drain opened since is
            # a new fault whose jobs are told that fault, not the one of an episode it missed the end of
            opened = float(rec.get("opened") or now) if rec and not new_episode else now
            st["drain"] = {"reason": out.reason or current, "time": now, "source": ctx.source,
                           "check": failure.check, "gpu": failure.gpu, "opened": opened}
        st["passes"] = 0


def _note_foreign(ctx: Context, failure: C.CheckResult, out: Outcome) -> None:
    """A fault on a node someone else drained: journalled once per fault and foreign reason, not on every
    health check while the admin's drain lasts."""
    key = f"{failure.check}:{failure.gpu}"
    with ctx.store.locked() as st:
        noted = st.setdefault("foreign_noted", {})
        first = noted.get(key) != out.previous_reason
        noted[key] = out.previous_reason
    if first:
        ctx.record(Event.DETECTION, check=failure.check, action="drain", outcome=out.action,
                   message=f"{failure.text} (node already drained by someone else: {out.previous_reason})",
                   severity="info", evidence=failure.evidence)


def maybe_resume(ctx: Context, now: float, dry_run: bool = False) -> Optional[Action]:
    """Resume a drain we made after N consecutive passes and the cooldown; forget it if someone else
    changed the node meanwhile."""
    st = ctx.store.read()
    ours = st.get("drain")
    if not ours:
        return None
    from autoheal import nodeops
    from autoheal.hooks.actions import Action, Kind
    from autoheal.reasons import strip_reason_suffix

    node = ctx.slurm.get_node(ctx.node)
    current = strip_reason_suffix(node.reason)
    if not (node.drain or node.down) or current != ours.get("reason"):
        # resumed by an admin (or by Slurm after our reboot), or re-drained with another reason: not ours
        # to resume any more. Back in service ends the XID dedupe window: a fault that returns is new.
        with ctx.store.locked() as st2:
            st2["drain"] = None
            if not (node.drain or node.down):
                S.mark_repaired(st2, None, now)
                lemon.note_return(st2, now, "back in service (an admin's resume or a reboot)")
        return Action(Kind.FORGET_DRAIN, "node no longer carries our drain", current)
    if lemon.is_lemon(current):
        return Action(Kind.RESUME, "never: a lemon is not returned automatically", current)
    if st.get("passes", 0) < ctx.hooks.resume_after_passes:
        return Action(Kind.RESUME, f"waiting: {st.get('passes', 0)} of {ctx.hooks.resume_after_passes} passes",
                      current)
    if now - float(ours.get("time", 0)) < ctx.hooks.resume_cooldown:
        return Action(Kind.RESUME, "waiting: cooldown", current)
    out = nodeops.resume(ctx.slurm, ctx.node, dry_run=dry_run)
    if out.changed:
        with ctx.store.locked() as st2:
            st2["drain"] = None
            S.mark_repaired(st2, None, now)
            lemon.note_return(st2, now, "resumed by autoheal")
        ctx.record(Event.RESUME, action="resume", outcome=out.action, message=f"healthy again after: {current}",
                   severity="action")
    return Action(Kind.RESUME, out.action, current, dry_run)


def accept_resume(ctx: Context, now: Optional[float] = None) -> Optional[Action]:
    """The node we drained is back in service, and we did not resume it: an admin did (``scontrol
    update state=resume``, ``autoheal node resume``), perhaps after putting their own reason over ours.
    Their resume is authoritative for what we remembered: the open faults our drain stood for (opened
    before it) and a failing check result older than now are forgotten, so that neither the prolog nor
    the healthcheck fails the node again on a record the admin has dealt with (Slurm would drain it and
    requeue the job, held without ``nohold_on_prolog_fail``). The GPUs are not trusted blindly: the
    caller checks them live right after, so a GPU that is really bad fails again and is drained again.
    Faults opened after our drain (never shown to the admin) stay open, and the recovery-ladder counts
    are kept: the same fault back after this resume is a new one, a rung higher.

    Slurm is asked only when there is something to forget. Returns what was forgotten, or None.
    Raises SlurmError (SlurmUnavailable: could not tell): the record then stands."""
    st = ctx.store.read()
    ours = st.get("drain")
    last = st.get("last_result") or {}
    if not ours or not (st.get("faults") or last.get("status") == C.FAIL):
        return None
    node = ctx.slurm.get_node(ctx.node)
    if node.drain or node.down:  # still drained (ours, or an admin's over it): the faults stand
        return None
    return forget_behind_drain(ctx, time.time() if now is None else now)


def forget_behind_drain(ctx: Context, now: float, expect: Optional[S.Drain] = None) -> Optional[Action]:
    """``accept_resume``'s work once the caller knows the node we drained is back in service and we did
    not resume it: forget our drain record, the faults opened before it and a failing result; the
    node counts as repaired now. Also used by xid-watch's health poll, which sees a new fault on such a
    node before any hook has run. ``expect``: only that record (one written since is a new drain). Returns
    what was forgotten, or None when no such record of ours is left."""
    from autoheal.hooks.actions import Action, Kind

    with ctx.store.locked() as st2:
        ours = st2.get("drain")
        if not ours or (expect is not None and ours != expect):  # another hook took care of it meanwhile
            return None
        drained_at = float(ours.get("time", 0) or 0)
        faults = st2.get("faults") or []
        forgotten = [f for f in faults if float(f.get("since", 0) or 0) <= drained_at]
        st2["faults"] = [f for f in faults if f not in forgotten]
        stale = (st2.get("last_result") or {}).get("status") == C.FAIL
        st2["last_result"] = None
        st2["drain"] = None
        st2["passes"] = 0
        S.mark_repaired(st2, None, now)  # back in service: the same XID again is a new fault
        lemon.note_return(st2, now, "resumed by someone else")
    out = Action(Kind.ACCEPT_RESUME, "node resumed by someone else", ours.get("reason", ""),
                 faults=[f.get("reason", "") for f in forgotten], stale_result=stale)
    if forgotten or stale:
        ctx.record(Event.RESUME, check=ours.get("check") or "", action="accept-resume", outcome="record forgotten",
                   severity="info", evidence={"faults": out.faults, "drain": ours.get("reason", "")},
                   message=f"{ctx.node} was resumed (not by autoheal) while drained for: {ours.get('reason', '')}; "
                   f"forgot {len(forgotten)} open fault(s) behind that drain, the GPUs are checked live again")
    return out


def maybe_repair(ctx: Context, results: List[C.CheckResult], now: float, dry_run: bool = False) -> List[Action]:
    """Climb the recovery ladder for failures, only once the node is drained by us and idle."""
    st = ctx.store.read()
    if not st.get("drain"):
        return []
    node = ctx.slurm.get_node(ctx.node)
    if not node.drained:  # jobs still running (or not drained): repairs wait
        return []
    if lemon.is_lemon(node.reason):  # retired: a replacement or a human, never another repair cycle
        return []
    done: List[Action] = []
    # one repair per GPU per pass: an ECC fault fails ecc, remapped-rows, recovery-action and xid at once,
    # and one reset covers them all (four resets would also read as four recurrences)
    per_gpu: Dict[Optional[int], C.CheckResult] = {}
    for r in results:
        if r.status == C.FAIL and r.action in RUNG_WEIGHT:
            cur = per_gpu.get(r.gpu)
            if cur is None or RUNG_WEIGHT[r.action] > RUNG_WEIGHT[cur.action]:
                per_gpu[r.gpu] = r
    for r in sorted(per_gpu.values(), key=lambda x: -RUNG_WEIGHT[x.action]):
        rung = first_rung(ctx, st, r, now)
        if not rung:
            continue
        done.append(_run_rung(ctx, rung, r, now, dry_run))
        if rung != C.RESET:
            break  # a reboot or replacement covers the whole node
    return done


def first_rung(ctx: Context, st: S.NodeStateData, r: C.CheckResult, now: float) -> Optional[C.CheckAction]:
    """The ladder's rung for failure ``r`` now (its check's first rung, climbed by the repairs already made
    for its GPU within ``hooks.ladder_window``): the one decision ``drain_for`` names in the reason and
    ``maybe_repair`` carries out."""
    window = ctx.hooks.ladder_window
    return next_rung(r.action, S.ladder_count(st, r.gpu, Rung.RESET, now, window),
                     S.ladder_count(st, r.gpu, Rung.REBOOT, now, window),
                     can_reset=bool(ctx.hooks.reset_command) and r.gpu is not None,
                     can_reboot=ctx.hooks.reboot_enabled)


def _run_rung(ctx: Context, rung: C.CheckAction, r: C.CheckResult, now: float, dry_run: bool) -> Action:
    """Run one rung of the ladder for ``r``; what was done, for the pass's actions."""
    from autoheal.hooks.actions import Action, Kind

    if dry_run:
        outcome = "dry-run"
    elif rung == C.RESET:
        outcome = _reset_gpu(ctx, r, now)
    elif rung == C.REBOOT:
        outcome = _request_reboot(ctx, r, now)
    else:
        outcome = _ask_replacement(ctx, r, now)
    return Action(Kind(rung.value), outcome, dry_run=dry_run, gpu=r.gpu, check=r.check)


def _reset_gpu(ctx: Context, r: C.CheckResult, now: float) -> str:
    """Run hooks.reset_command for the GPU; a successful reset clears its faults."""
    import subprocess  # only a reset runs a command: a healthy pass does not pay for the import

    argv = [a.replace("{node}", ctx.node).replace("{gpu}", str(r.gpu)) for a in ctx.hooks.reset_command]
    try:
        res = subprocess.run(argv, capture_output=True, text=True, timeout=ctx.hooks.reset_timeout,
                             stdin=subprocess.DEVNULL)
        ok = res.returncode == 0
        outcome = "ok" if ok else f"exit {res.returncode}: {(res.stderr or res.stdout).strip()[:200]}"
    except (OSError, subprocess.TimeoutExpired) as exc:
        ok, outcome = False, f"failed: {exc}"
    with ctx.store.locked() as st:
        S.record_rung(st, r.gpu, Rung.RESET, now)
        if ok:
            st["faults"] = [f for f in st.get("faults", []) if f.get("gpu") != r.gpu]
            st["passes"] = 0
            S.mark_repaired(st, r.gpu, time.time())  # the same XID back after this is a new fault
    ctx.record(Event.REMEDIATION_STEP, check=r.check, action="reset-gpu", outcome=outcome,
               message=f"reset {C.gpu_label(None, r.gpu, node=ctx.node)} for: {r.text}",
               severity="action" if ok else "error",
               evidence={"argv": argv})
    return outcome


def _request_reboot(ctx: Context, r: C.CheckResult, now: float) -> str:
    """``scontrol reboot ASAP nextstate=resume`` with a reboot reason, once per boot."""
    from autoheal.reasons import Origin

    st = ctx.store.read()
    pending = st.get("reboot_requested") or {}
    if pending.get("boot_id") == boot_id() and reboot_still_pending(ctx.slurm.get_node(ctx.node), pending, now):
        return "waiting: reboot already requested"
    reason = r.reason.with_origin(Origin.REBOOT).render()
    ctx.slurm.reboot(ctx.node, reason, asap=True, nextstate="resume")
    with ctx.store.locked() as st:
        S.record_rung(st, r.gpu, Rung.REBOOT, now)
        st["reboot_requested"] = {"boot_id": boot_id(), "time": now}
        st["faults"] = []
        drain = st.get("drain")
        if drain:
            drain["reason"] = reason
    ctx.record(Event.REMEDIATION_STEP, check=r.check, action="reboot-node", outcome="requested", message=reason,
               severity="action")
    return "requested"


def _ask_replacement(ctx: Context, r: C.CheckResult, now: float) -> str:
    """Say so in the drain reason; the k8s_sync remediation acts on ``autoheal: replace: ...``."""
    from autoheal import nodeops
    from autoheal.reasons import Origin, Reason

    reason = r.reason.with_origin(Origin.REPLACE).render()
    current = Reason.parse(ctx.slurm.get_node(ctx.node).reason)
    if current is not None and current.rung is Origin.REPLACE:
        return "already asked"  # by the first drain (drain_for) or an earlier pass
    out = nodeops.drain(ctx.slurm, ctx.node, reason)
    _replacement_asked(ctx, r, reason, now, out.action, announce=out.changed)
    return out.action


def _replacement_asked(ctx: Context, r: C.CheckResult, reason: str, now: float, outcome: str,
                       announce: bool) -> None:
    """The node carries ``autoheal: replace: ...`` (``reason``), written by the first drain (``drain_for``)
    or by the ladder's last rung: the rung recorded, the drain record's reason, and, when the reason was
    just written (``announce``), the wait said once (issue 27: who acts next)."""
    from autoheal import awaiting

    with ctx.store.locked() as st:
        S.record_rung(st, r.gpu, Rung.REPLACE, now)
        drain = st.get("drain")
        if drain:
            drain["reason"] = reason
    ctx.record(Event.REMEDIATION_STEP, check=r.check, action="replace-node", outcome=outcome, message=reason,
               severity="action")
    if not announce:
        return
    ctx.record(awaiting.EVENT, check=r.check, action="wait-for-replacement", outcome="waiting",
               message=awaiting.message(ctx.node, reason, getattr(ctx, "cfg", None)), severity="action",
               evidence={"automatic": awaiting.automatic(getattr(ctx, "cfg", None))})


#: Seconds a reboot request may take to show in Slurm's node flags (REBOOT_REQUESTED) after we made it.
REBOOT_VISIBLE_SECONDS = 15.0


def reboot_still_pending(node: Node, pending: S.RebootRequest, now: float) -> bool:
    """Our earlier reboot request (same boot id) is still under way: Slurm shows it on the node
    (REBOOT_REQUESTED / REBOOT_ISSUED), or it was made too recently to show yet. Without that, the
    request is over although the boot id did not change (an admin cancelled it, or a machine whose
    "reboot" keeps its boot id, like the lab's): a new fault must get a new reboot, not wait forever."""
    flags = {str(f).upper() for f in (getattr(node, "flags", None) or ())}
    if flags & {"REBOOT_REQUESTED", "REBOOT_ISSUED", "REBOOT"}:
        return True
    return now - float(pending.get("time") or 0.0) < REBOOT_VISIBLE_SECONDS


def pass_lock_timeout(ctx: Context) -> float:
    """How long a pass waits for another one on the same node: the other's NVML budget plus a few
    Slurm calls, and always well inside Slurm's 60 s kill of HealthCheckProgram."""
    return min(40.0, ctx.hooks.nvml_timeout + 4 * ctx.hooks.slurm_timeout + ctx.hooks.reset_timeout / 2)


def health_pass(ctx: Context, drain: bool = True, budget: Optional[float] = None, dry_run: bool = False,
                now: Optional[float] = None) -> Pass:
    """The healthcheck: observe, then act. Exit 0 healthy (or warn), 1 failed, 2 could not tell.

    Whole passes on one node are serialised (HealthCheckProgram and ``autoheal check`` may overlap), so
    a pass never acts on what it saw before another pass repaired it."""
    try:
        with ctx.store.pass_lock(pass_lock_timeout(ctx)):
            return _health_pass(ctx, drain, budget, dry_run, now)
    except TimeoutError as exc:
        p = Pass(node=ctx.node, errors=[str(exc)])
        return p
    except (OSError, ValueError):
        # the state dir cannot even hold the lock file (read-only, full, a NUL in the path): the checks
        # still run and a real fault still drains; the state trouble is reported and the exit is not 0
        pass
    return _health_pass(ctx, drain, budget, dry_run, now)


def _health_pass(ctx: Context, drain: bool, budget: Optional[float], dry_run: bool, now: Optional[float]) -> Pass:
    from autoheal.errors import SlurmError, SlurmUnavailable

    now = time.time() if now is None else now
    accepted = None
    if not dry_run:
        try:
            accepted = accept_resume(ctx, now)
        except SlurmError:
            pass  # could not tell: the record stands (and the pass will say slurmctld did not answer)
    p = observe(ctx, ctx.hooks.nvml_timeout if budget is None else budget, now=now)
    if accepted is not None:
        p.actions.append(accepted)
    try:
        # warning signs on a node that runs a hot-spare job's active step: drained for a pre-emptive swap
        pre = preswap.maybe_preswap(ctx, p.results, now, dry_run) if drain else None
        if pre is not None:
            p.actions.append(pre)
        if p.status == C.FAIL:
            with ctx.store.locked() as st:
                st["passes"] = 0
            failure = C.worst_failure(p.results)
            if drain and failure is not None:
                if pre is None:
                    p.actions.append(drain_for(ctx, failure, dry_run))
                p.actions += maybe_repair(ctx, p.results, now, dry_run)
            p.exit_code = EXIT_FAIL
        elif p.status == C.UNKNOWN:
            with ctx.store.locked() as st:
                st["passes"] = 0
            p.exit_code = EXIT_UNKNOWN
        elif pre is not None:  # only warnings, but the node is drained for one of them: not healthy yet
            with ctx.store.locked() as st:
                st["passes"] = 0
            p.exit_code = EXIT_OK
        else:
            with ctx.store.locked() as st:
                st["passes"] = int(st.get("passes", 0)) + 1
                st["last_pass"] = {"time": now, "boot_id": boot_id(), "usec": p.started_usec}
                st["foreign_noted"] = {}  # a fault after a passing check is a new one
            if drain:
                act = maybe_resume(ctx, now, dry_run)
                if act:
                    p.actions.append(act)
            p.exit_code = EXIT_OK
    except SlurmUnavailable as exc:
        p.errors.append(f"slurmctld unreachable, nothing changed: {exc}")
        ctx.record(Event.ERROR, message=f"health pass: slurmctld unreachable: {exc}", severity="error")
        p.exit_code = EXIT_UNKNOWN
    except SlurmError as exc:
        p.errors.append(f"slurm: {exc}")
        ctx.record(Event.ERROR, message=f"health pass: {exc}", severity="error")
        p.exit_code = EXIT_UNKNOWN
    if p.exit_code == EXIT_OK and bool(getattr(ctx.store, "trouble", "")):
        # healthy, but the pass could not be remembered (passes, cursor): the node cannot be resumed by
        # us and the next pass re-reads the log. Say "could not tell", never "failed".
        p.exit_code = EXIT_UNKNOWN
    return p


__all__ = [
    "EXIT_FAIL",
    "EXIT_OK",
    "EXIT_UNKNOWN",
    "Pass",
    "accept_resume",
    "drain_for",
    "health_pass",
    "maybe_repair",
    "maybe_resume",
    "normalize_pci",
    "observe",
    "xid_results",
]
