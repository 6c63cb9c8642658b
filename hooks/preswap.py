"""Pre-emptive swap: warning signs on a node that runs the active step of a hot-spare job.

A pending row remap, a thermal slowdown, a degraded PCIe or NVLink link, a high correctable-ECC rate
(XID 92) or a repeated XID 63/64 often precede a GPU failure. On a node that runs the active step of an
``autoheal sbatch --spare-nodes`` job with a spare left, the healthcheck drains the node with the reason
``autoheal: pre-emptive swap: <sign>`` instead of treating the sign as today. DRAIN lets the job go on;
its runner sees the reason on one of its active nodes, waits for the trainer's next checkpoint and swaps
the node for a spare as after a fault. The reason is not a fault reason: xid-watch sends no grace signal
and requeues nothing. The drain is ours like any other: repaired by the ladder once the node is idle,
resumed once the checks pass and no warning sign is left. A real fault found meanwhile replaces the
reason (``engine.drain_for``) and takes today's path.

Every other node (no job, a job without spares, spares used up, the node an idle spare or the batch
host, another job beside it, a drain already there) is handled as without this module.

``signs`` and ``eligible`` are pure; ``maybe_preswap`` talks to Slurm.
"""

from __future__ import annotations

import time

from autoheal.events import Event
from autoheal.hooks import checks as C
from autoheal.hooks import state as S
from autoheal.records import record

TYPE_CHECKING = False  # typing is for mypy only: not imported at run time (the hooks start fast)
if TYPE_CHECKING:
    from typing import Any, Dict, Iterable, List, Optional, Sequence, Tuple

    from autoheal.hooks.actions import Action
    from autoheal.hooks.context import Context
    from autoheal.runner_comment import CommentState

#: Order in which signs name the drain (the most telling first).
_ORDER = ("remap-pending", "nvlink", "pcie", "xid", "ecc-rate", "thermal")
ECC_RATE_XID = 92


@record(frozen=True)
class Sign:
    """One warning sign: its kind (``hooks.preswap_signs``), the words of the drain reason, the check."""

    kind: str
    text: str
    check: str
    gpu: Optional[int] = None


def _where(gpu: Optional[int], node: str) -> str:
    return C.gpu_label(None, gpu, node=node)


def result_kind(r: C.CheckResult) -> str:
    """The warning sign a check result is, or "" (a fault, or nothing)."""
    ev = r.evidence or {}
    if r.status not in (C.WARN, C.FAIL):
        return ""
    if r.check == "remapped-rows" and ev.get("remap_pending") and not ev.get("remap_failure"):
        return "remap-pending"
    if r.check == "retired-pages" and ev.get("retired_pending"):
        return "remap-pending"
    if r.check == "clocks" or (r.check == "temperature" and r.status == C.WARN):
        return "thermal"
    if r.check == "pcie":
        return "pcie"
    if r.check == "nvlink":
        return "nvlink"
    return ""


def is_sign(r: C.CheckResult, hooks_cfg: Any) -> bool:
    """The result is one of the enabled warning signs (not a fault of its own)."""
    kind = result_kind(r)
    return bool(kind) and kind in (getattr(hooks_cfg, "preswap_signs", ()) or ())


def _result_text(kind: str, r: C.CheckResult, node: str) -> str:
    where = _where(r.gpu, node)
    if kind == "remap-pending":
        return f"{'page retirement' if r.check == 'retired-pages' else 'row remap'} pending on {where}"
    if r.check == "temperature":
        return f"temperature {(r.evidence or {}).get('temperature')} C on {where}"
    body = r.reason.detail if r.reason.kind else r.text
    label = {"pcie": "PCIe ", "nvlink": "NVLink "}.get(kind, "")
    return f"{label}{body} on {where}"


def xid_counts(st: S.NodeStateData, now: float, window: float) -> Dict[Tuple[int, Optional[int]], int]:
    """How often each XID was seen per GPU within ``window`` and since the GPU's last repair (repeats
    of one XID from the same source included, the other source's report of it not)."""
    out: Dict[Tuple[int, Optional[int]], int] = {}
    for x in st.get("recent_xids") or []:
        t = float(x.get("time", 0))
        gpu = x.get("gpu")
        if now - t > window or t < S.repaired_at(st, gpu):
            continue
        key = (int(x.get("xid", 0)), gpu)
        out[key] = out.get(key, 0) + 1 + int(x.get("dups", 0))
    return out


def signs(results: Iterable[C.CheckResult], st: S.NodeStateData, hooks_cfg: Any, now: float,
          node: str = "") -> List[Sign]:
    """The enabled warning signs among a pass's results and the XIDs remembered in the node state."""
    enabled = set(getattr(hooks_cfg, "preswap_signs", ()) or ())
    out: List[Sign] = []
    for r in results:
        kind = result_kind(r)
        if kind and kind in enabled:
            out.append(Sign(kind, _result_text(kind, r, node), r.check, r.gpu))
    if enabled & {"xid", "ecc-rate"}:
        watched = set(hooks_cfg.preswap_xids)
        for (xid, gpu), n in sorted(xid_counts(st, now, hooks_cfg.preswap_xid_window).items(),
                                    key=lambda kv: (kv[0][0], -1 if kv[0][1] is None else kv[0][1])):
            if xid == ECC_RATE_XID and "ecc-rate" in enabled:
                out.append(Sign("ecc-rate", f"high correctable ECC rate (xid 92) on {_where(gpu, node)}", "xid",
                                gpu))
            elif xid in watched and "xid" in enabled and n >= hooks_cfg.preswap_xid_repeat:
                out.append(Sign("xid", f"xid {xid} seen {n} times on {_where(gpu, node)}", "xid", gpu))
    return sorted(out, key=lambda s: _ORDER.index(s.kind))


def faults_beside(results: Iterable[C.CheckResult], enabled: Sequence[str]) -> List[C.CheckResult]:
    """Failures that are not enabled warning signs: a real fault, today's path."""
    return [r for r in results if r.status == C.FAIL and result_kind(r) not in enabled]


def runner_state_of(comment: str, marker: str) -> Optional[CommentState]:
    """The runner's state in an ``autoheal sbatch`` job's comment (the core's model); None for others."""
    from autoheal.runner_comment import CommentState

    text = (comment or "").strip()
    if not (marker and text.startswith(marker)):
        return None
    return CommentState.parse(text, marker)


def eligible(jobs: Iterable[Any], node: str, marker: str) -> Tuple[List[str], str]:
    """(the hot-spare jobs whose active step runs on ``node`` and that have a spare left, why not).

    Every job running on the node must be one: a pre-emptive drain sends no grace signal, so any other
    job there keeps today's path (a fault drain, its signal and requeue)."""
    running = [j for j in jobs if j.state == "RUNNING" and node in j.nodes]
    if not running:
        return [], f"no job runs on {node}"
    ids: List[str] = []
    for j in running:
        f = runner_state_of(j.comment, marker)
        if f is None or not f.hot_spare:
            return [], f"job {j.job_id} on {node} has no hot spares"
        if node not in f.nodes.split(","):
            return [], f"{node} is an idle spare of job {j.job_id}"
        if f.spares == "none":
            return [], f"job {j.job_id} has no spare left"
        if j.batch_host == node:
            return [], f"{node} runs the batch shell of job {j.job_id}"
        ids.append(j.job_id)
    return ids, ""


def maybe_preswap(ctx: Context, results: Sequence[C.CheckResult], now: Optional[float] = None,
                  dry_run: bool = False) -> Optional[Action]:
    """Drain for a warning sign when the node runs only hot-spare jobs that can swap it out, or keep such
    a drain while a sign is left. None: no sign, a real fault beside it, or a node not eligible: the
    caller goes on as without this module (also when slurmctld does not answer the looks; the drain
    itself raises SlurmError like ``drain_for``)."""
    h = ctx.hooks
    enabled = list(getattr(h, "preswap_signs", ()) or ())
    if not enabled:
        return None
    now = time.time() if now is None else now
    found = signs(results, ctx.store.read(), h, now, ctx.node)
    if not found or faults_beside(results, enabled):
        return None
    # Slurm's modules only now: a pass without a warning sign (nearly all of them) never pays for them
    from autoheal import nodeops
    from autoheal.errors import SlurmError
    from autoheal.hooks.actions import Action, Kind
    from autoheal.reasons import Origin, Reason, is_preswap, strip_reason_suffix

    try:
        node = ctx.slurm.get_node(ctx.node)
        current = strip_reason_suffix(node.reason)
        if node.drain or node.down:
            if is_preswap(current):  # drained for a sign already: keep it while a sign is left
                return Action(Kind.PRESWAP_DRAIN, "kept", current, signs=[s.text for s in found])
            return None  # someone's drain (or our fault drain) is there: today's path
        ids, _why = eligible(ctx.slurm.list_jobs(node=ctx.node), ctx.node, h.runner_comment)
    except SlurmError:
        # slurmctld not answering (or an answer we cannot use): today's path, which for a failing sign
        # meets the same error in drain_for and says so; a warning alone stays a warning
        return None
    if not ids:
        return None
    sign = found[0]
    reason = Reason(Origin.PRESWAP, detail=sign.text).render()
    out = nodeops.drain(ctx.slurm, ctx.node, reason, dry_run=dry_run)
    act = Action(Kind.PRESWAP_DRAIN, out.action, out.reason, dry_run, jobs=ids, signs=[s.text for s in found])
    if out.action not in (nodeops.DRAINED, nodeops.REASON_UPDATED):
        return None  # not drained after all (someone drained it meanwhile): today's path
    if dry_run:
        return act
    with ctx.store.locked() as st:
        st["drain"] = {"reason": out.reason, "time": time.time(), "source": ctx.source, "check": sign.check,
                       "gpu": sign.gpu, "preswap": sign.kind}
        st["passes"] = 0
    ctx.record(Event.DRAIN, check=sign.check, action="drain", outcome=out.action, severity="action",
               job_ids=ids, message=f"{out.reason} (job(s) {','.join(ids)} keep running and swap {ctx.node} for a "
               f"hot spare at their next checkpoint)",
               evidence={"sign": sign.kind, "gpu": sign.gpu, "signs": [s.text for s in found], "jobs": ids})
    return act
