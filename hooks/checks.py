"""Pure judges over gathered GPU data: each returns ``CheckResult``s, no I/O.

A result has a status (ok / warn / fail / unknown), one readable line (``reason``, which becomes the
drain reason after ``autoheal: ``), evidence, and the suggested action: none, requeue-job, drain,
reset-gpu, reboot-node or replace-node. Checks can be disabled and re-thresholded in ``[hooks]``.
"""

from __future__ import annotations

from dataclasses import asdict, field

from autoheal.hooks.gather import GpuSample, NodeSample
from autoheal.hooks.xid_catalog import DRAIN_POLICIES
from autoheal.hooks.xids import XidEvent, describe, policy_for
from autoheal.reasons import Reason, gpu_where, parse_body
from autoheal.records import cast, record
from autoheal.strenum import StrEnum

TYPE_CHECKING = False  # typing is for mypy only: not imported at run time (the hooks start fast)
if TYPE_CHECKING:
    from typing import Any, Dict, Iterable, List, Optional, Tuple, TypedDict

    class ResultDict(TypedDict, total=False):
        """``CheckResult.to_dict()``: a result as the node state and ``--json`` keep it (the reason as its
        text). For mypy only: at run time the plain dict ``asdict`` made."""

        check: str
        status: str
        reason: str
        action: str
        gpu: Optional[int]
        evidence: Dict[str, Any]  # the check's own readings: an open JSON object


class Status(StrEnum):
    """A check's verdict."""

    OK = "ok"
    WARN = "warn"
    FAIL = "fail"
    UNKNOWN = "unknown"


class CheckAction(StrEnum):
    """What a check suggests; reset, reboot and replace are the rungs of the recovery ladder."""

    NONE = "none"
    REQUEUE = "requeue-job"
    DRAIN = "drain"
    RESET = "reset-gpu"
    REBOOT = "reboot-node"
    REPLACE = "replace-node"


OK, WARN, FAIL, UNKNOWN = Status.OK, Status.WARN, Status.FAIL, Status.UNKNOWN
NONE, REQUEUE, DRAIN = CheckAction.NONE, CheckAction.REQUEUE, CheckAction.DRAIN
RESET, REBOOT, REPLACE = CheckAction.RESET, CheckAction.REBOOT, CheckAction.REPLACE
_STATUSES = frozenset(s.value for s in Status)
_ACTIONS = frozenset(a.value for a in CheckAction)
_SEVERITY = {OK: 0, WARN: 1, UNKNOWN: 2, FAIL: 3}
POLICY_ACTION = {"ignore": NONE, "warn": NONE, "job": NONE, "requeue": REQUEUE, "recovery": NONE,
                 "human": DRAIN, "drain": RESET, "reset": RESET, "reboot": REBOOT, "replace": REPLACE}
CLOCKS_HW_SLOWDOWN, CLOCKS_SW_THERMAL, CLOCKS_HW_THERMAL, CLOCKS_HW_POWER_BRAKE = 0x8, 0x20, 0x40, 0x80
#: NVML's GPU recovery action (``NVML_FI_DEV_GET_GPU_RECOVERY_ACTION``, ``nvmlDeviceGpuRecoveryAction_t`` in
#: nvml.h; XID 154 says it changed) -> (what it asks, the rung). NVIDIA's A100 memory-error guide: NONE the
#: GPU is usable by a new process; GPU_RESET terminate the processes and reset the GPU; NODE_REBOOT the OS
#: may be inconsistent, reboot; DRAIN_P2P terminate the processes doing peer-to-peer traffic, then read the
#: action again (it becomes one of the others): a drain with no repair, the next check's reading decides;
#: DRAIN_AND_RESET drain P2P, then reset (a reset runs only on our idle drained node: the drain quiesces
#: it). Newer headers: RECOVER_IMEX_DOMAIN (the multi-node NVLink domain: a person), BUS_RESET (the hooks
#: have no PCIe bus reset; a reboot resets the bus), SYSTEM_REBOOT. NONE (0) asks nothing.
RECOVERY_ACTIONS = {1: ("GPU reset required", RESET), 2: ("node reboot required", REBOOT),
                    3: ("drain P2P required", DRAIN), 4: ("drain and reset required", RESET),
                    5: ("IMEX domain recovery required", DRAIN), 6: ("PCIe bus reset required", REBOOT),
                    7: ("system reboot required", REBOOT)}


def recovery_verdict(action: Optional[int]) -> Optional[Tuple[str, CheckAction]]:
    """What NVML's recovery action ``action`` asks of autoheal: (text, rung), or None for NONE (and no
    reading). A value this release does not know (a newer driver) drains for a person, never passes."""
    if action is None or action == 0:
        return None
    return RECOVERY_ACTIONS.get(action, (f"unknown recovery action {action} (a newer driver?)", DRAIN))


@record
class CheckResult:
    """The verdict of one check on one GPU (``gpu`` None: node-wide)."""

    check: str
    status: Status
    reason: Reason = field(default_factory=Reason)
    action: CheckAction = NONE
    gpu: Optional[int] = None
    evidence: Dict[str, Any] = field(default_factory=dict)

    @property
    def text(self) -> str:
        """The result's one readable line (the drain reason's body after ``autoheal: ``)."""
        return self.reason.body()

    def to_dict(self) -> ResultDict:
        """The JSON form (the node state's ``last_result``, ``--json``): the reason as its text."""
        out = asdict(self)
        out["reason"] = self.text
        return cast("ResultDict", out)

    @classmethod
    def from_dict(cls, d: ResultDict) -> CheckResult:
        """A result read back from JSON (``to_dict``'s form; the reason text parsed once, by the core)."""
        fields: Dict[str, Any] = {k: v for k, v in d.items() if k in cls.__dataclass_fields__}
        if fields.get("status") in _STATUSES:
            fields["status"] = Status(fields["status"])
        if fields.get("action") in _ACTIONS:
            fields["action"] = CheckAction(fields["action"])
        fields["reason"] = parse_body(str(fields.get("reason") or ""))
        return cls(**fields)


def gpu_label(g: Optional[GpuSample], index: Optional[int] = None, pci: str = "", node: str = "") -> str:
    """``GPU 3 of gpu2 (0000:3b:00.0)``: a GPU index never reads like a node name (``gpu3``)."""
    idx = g.index if g is not None else index
    bus = (g.pci if g is not None and g.pci else "") or pci
    return gpu_where(idx, node, bus)


def _ok(check: str, gpu: Optional[int] = None) -> CheckResult:
    return CheckResult(check, OK, Reason(), NONE, gpu)


def said(text: str) -> Reason:
    """A node-wide result's line, which names no GPU (``driver: NVIDIA driver not loaded``)."""
    return Reason(detail=text)


def on_gpu(check: str, g: Optional[GpuSample], detail: str, node: str = "", index: Optional[int] = None) -> Reason:
    """A GPU's result: ``<check>: GPU 3 of gpu2 (0000:3b:00.0): <detail>``."""
    idx = g.index if g is not None else index
    return Reason(kind=check, gpu=idx, node=node, pci=(g.pci or "") if g is not None else "", detail=detail)


# ---- node-wide -------------------------------------------------------------------------------------

def check_driver(s: NodeSample, pinned: str = "") -> List[CheckResult]:
    """NVML reachable; driver version as pinned. A hang or a missing library is unknown; a driver that
    is installed but not loaded is a failure (the node needs a reboot)."""
    if s.init_error:
        low = s.init_error.lower()
        if "driver not loaded" in low or "driver_not_loaded" in low:
            return [CheckResult("driver", FAIL, said("driver: NVIDIA driver not loaded"), REBOOT,
                                evidence={"error": s.init_error})]
        return [CheckResult("driver", UNKNOWN, said(f"driver: NVML unavailable: {s.init_error}"), NONE,
                            evidence={"error": s.init_error})]
    if pinned and s.driver_version != pinned:
        return [CheckResult("driver", FAIL, said(f"driver: version {s.driver_version}, expected {pinned}"), REBOOT,
                            evidence={"driver_version": s.driver_version, "expected": pinned})]
    return [CheckResult("driver", OK, evidence={"driver_version": s.driver_version})]


def check_count(s: NodeSample, expected: int) -> List[CheckResult]:
    """Fewer GPUs than expected (a GPU that fell off the bus is no longer enumerated)."""
    if expected <= 0 or s.count is None:
        return []
    if s.count < expected:
        return [CheckResult("gpu-count", FAIL, said(f"gpu-count: {s.count} of {expected} GPUs visible"), REBOOT,
                            evidence={"count": s.count, "expected": expected})]
    return [CheckResult("gpu-count", OK, evidence={"count": s.count})]


# ---- per GPU ---------------------------------------------------------------------------------------

def check_reachable(g: GpuSample, node: str = "") -> List[CheckResult]:
    """GPU lost (NVML_ERROR_GPU_IS_LOST) fails; a read that did not finish is unknown."""
    if g.error == "lost":
        return [CheckResult("gpu-lost", FAIL, on_gpu("gpu-lost", g, "GPU is lost (fallen off the bus)", node),
                            REBOOT, g.index, {"error": g.error})]
    if g.error:
        return [CheckResult("gpu-lost", UNKNOWN, on_gpu("gpu-lost", g, f"not read: {g.error}", node), NONE, g.index,
                            {"error": g.error})]
    return [_ok("gpu-lost", g.index)]


def check_ecc(g: GpuSample, dbe_max: int = 0, node: str = "") -> List[CheckResult]:
    if g.ecc_dbe_volatile is None:
        return []
    if g.ecc_dbe_volatile > dbe_max:
        return [CheckResult("ecc", FAIL, on_gpu("ecc", g, f"{g.ecc_dbe_volatile} uncorrectable ECC errors", node),
                            RESET, g.index, {"ecc_dbe_volatile": g.ecc_dbe_volatile})]
    return [_ok("ecc", g.index)]


def check_remapped_rows(g: GpuSample, node: str = "") -> List[CheckResult]:
    if g.remap_failure:
        return [CheckResult("remapped-rows", FAIL, on_gpu("remapped-rows", g, "row remap failure", node),
                            REPLACE, g.index, {"remap_failure": True})]
    if g.remap_pending:
        return [CheckResult("remapped-rows", FAIL, on_gpu("remapped-rows", g, "row remap pending a reset", node),
                            RESET, g.index, {"remap_pending": True, "uncorrectable": g.remap_uncorrectable})]
    if g.remap_failure is None:
        return []
    return [_ok("remapped-rows", g.index)]


def check_retired_pages(g: GpuSample, pages_max: int = 60, node: str = "") -> List[CheckResult]:
    if g.retired_pages is None and g.retired_pending is None:
        return []
    if (g.retired_pages or 0) > pages_max:
        return [CheckResult("retired-pages", FAIL, on_gpu("retired-pages", g, f"{g.retired_pages} retired pages", node),
                            REPLACE, g.index, {"retired_pages": g.retired_pages})]
    if g.retired_pending:
        return [CheckResult("retired-pages", FAIL, on_gpu("retired-pages", g, "page retirement pending a reset", node),
                            RESET, g.index, {"retired_pending": True})]
    return [_ok("retired-pages", g.index)]


def check_pcie(g: GpuSample, gen: bool = True, width: bool = True, node: str = "") -> List[CheckResult]:
    """Width below max always counts; generation only on a busy GPU (it drops while idle)."""
    ev = {"gen": g.pcie_gen, "gen_max": g.pcie_gen_max, "width": g.pcie_width, "width_max": g.pcie_width_max}
    if width and g.pcie_width and g.pcie_width_max and g.pcie_width < g.pcie_width_max:
        return [CheckResult("pcie", FAIL, on_gpu("pcie", g, f"link x{g.pcie_width} below x{g.pcie_width_max}", node),
                            REBOOT, g.index, ev)]
    if gen and g.idle is False and g.pcie_gen and g.pcie_gen_max and g.pcie_gen < g.pcie_gen_max:
        return [CheckResult("pcie", FAIL, on_gpu("pcie", g, f"link gen{g.pcie_gen} below gen{g.pcie_gen_max}", node),
                            REBOOT, g.index, ev)]
    if g.pcie_width is None and g.pcie_gen is None:
        return []
    return [_ok("pcie", g.index)]


def check_nvlink(g: GpuSample, node: str = "") -> List[CheckResult]:
    if g.nvlinks_down is None:
        return []
    if g.nvlinks_down:
        links = ",".join(str(x) for x in g.nvlinks_down)
        return [CheckResult("nvlink", FAIL, on_gpu("nvlink", g, f"link {links} down", node), RESET, g.index,
                            {"links_down": list(g.nvlinks_down)})]
    return [_ok("nvlink", g.index)]


def check_clocks(g: GpuSample, fail: bool = False, node: str = "") -> List[CheckResult]:
    if g.clock_events is None:
        return []
    names = [n for bit, n in ((CLOCKS_HW_SLOWDOWN, "HW slowdown"), (CLOCKS_HW_THERMAL, "HW thermal slowdown"),
                              (CLOCKS_SW_THERMAL, "SW thermal slowdown"), (CLOCKS_HW_POWER_BRAKE, "power brake"))
             if g.clock_events & bit]
    if names:
        return [CheckResult("clocks", FAIL if fail else WARN, on_gpu("clocks", g, ', '.join(names), node),
                            DRAIN if fail else NONE, g.index, {"clock_events": hex(g.clock_events)})]
    return [_ok("clocks", g.index)]


def check_temperature(g: GpuSample, fail_at: int = 90, warn_at: int = 85, node: str = "") -> List[CheckResult]:
    if g.temperature is None:
        return []
    if g.temperature >= fail_at:
        return [CheckResult("temperature", FAIL, on_gpu("temperature", g, f"{g.temperature} C (limit {fail_at})", node),
                            DRAIN, g.index, {"temperature": g.temperature})]
    if g.temperature >= warn_at:
        return [CheckResult("temperature", WARN, on_gpu("temperature", g, f"{g.temperature} C", node), NONE, g.index,
                            {"temperature": g.temperature})]
    return [_ok("temperature", g.index)]


def check_recovery_action(g: GpuSample, node: str = "") -> List[CheckResult]:
    """NVML's recovery action, read in every pass (the healthcheck, xid-watch's health poll, woken at
    once by an XID 154): any action but NONE fails the GPU with its rung (``recovery_verdict``)."""
    if g.recovery_action is None:
        return []
    verdict = recovery_verdict(g.recovery_action)
    if verdict is None:
        return [_ok("recovery-action", g.index)]
    text, action = verdict
    return [CheckResult("recovery-action", FAIL, on_gpu("recovery-action", g, text, node), action, g.index,
                        {"recovery_action": g.recovery_action})]


def check_persistence(g: GpuSample, required: bool = True, node: str = "") -> List[CheckResult]:
    if g.persistence is None or not required:
        return []
    if not g.persistence:
        return [CheckResult("persistence", WARN, on_gpu("persistence", g, "persistence mode off", node), NONE,
                            g.index)]
    return [_ok("persistence", g.index)]


# ---- XIDs ------------------------------------------------------------------------------------------

def judge_xid(ev: XidEvent, overrides: Optional[Dict[str, str]] = None, gpu: Optional[int] = None,
              pci: str = "", node: str = "") -> CheckResult:
    """One XID through the policy (NVIDIA's catalog by bucket, ``hooks.xid_policy`` over it).

    Application XIDs (``job``, ``requeue``) never fail the node, however often they come: a job's bug
    is the job's (issue 25); the caller attributes them to the job. ``human`` drains with no repair
    rung; ``recovery`` leaves the decision to NVML's recovery action (the recovery-action check)."""
    policy = policy_for(ev.xid, overrides)
    idx = ev.gpu if ev.gpu is not None else gpu
    bus = pci or (ev.pci + ".0" if ev.pci and ev.pci.count(":") == 2 else ev.pci)
    text = Reason(kind="xid", xid=ev.xid, gpu=idx, node=node, pci=bus, detail=describe(ev.xid))
    evidence = {"xid": ev.xid, "pci": ev.pci, "source": ev.source, "policy": policy}
    if ev.seq is not None:
        evidence["seq"] = ev.seq
    if ev.line:
        evidence["line"] = ev.line
    if policy in ("ignore", "job"):
        return CheckResult("xid", OK, text, NONE, idx, evidence)
    if policy in DRAIN_POLICIES:
        return CheckResult("xid", FAIL, text, POLICY_ACTION[policy], idx, evidence)
    if policy == "requeue":
        return CheckResult("xid", WARN, text, REQUEUE, idx, evidence)
    if policy == "recovery":
        evidence["decided_by"] = "recovery-action"
    return CheckResult("xid", WARN, text, NONE, idx, evidence)


# ---- all together ----------------------------------------------------------------------------------

def judge_sample(s: NodeSample, hooks_cfg: Any, expected_gpus: int = 0) -> List[CheckResult]:
    """Every enabled check over one sample (XIDs are judged separately: they need the state)."""
    off = set(getattr(hooks_cfg, "disabled_checks", []) or [])
    out: List[CheckResult] = []
    if "driver" not in off:
        out += check_driver(s, hooks_cfg.driver_version)
    elif s.init_error:
        out.append(CheckResult("driver", UNKNOWN, said(f"driver: NVML unavailable: {s.init_error}")))
    if s.init_error:
        return out
    if "gpu-count" not in off:
        out += check_count(s, expected_gpus)
    for g in s.gpus:
        reach = check_reachable(g, node=s.node)
        if "gpu-lost" not in off or reach[0].status == UNKNOWN:
            out += reach
        if g.error:
            continue
        if "ecc" not in off:
            out += check_ecc(g, hooks_cfg.ecc_dbe_max, node=s.node)
        if "remapped-rows" not in off:
            out += check_remapped_rows(g, node=s.node)
        if "retired-pages" not in off:
            out += check_retired_pages(g, hooks_cfg.retired_pages_max, node=s.node)
        if "pcie" not in off:
            out += check_pcie(g, hooks_cfg.pcie_check_gen, hooks_cfg.pcie_check_width, node=s.node)
        if "nvlink" not in off and hooks_cfg.nvlink_check:
            out += check_nvlink(g, node=s.node)
        if "clocks" not in off:
            out += check_clocks(g, hooks_cfg.clock_events_fail, node=s.node)
        if "temperature" not in off:
            out += check_temperature(g, hooks_cfg.temperature_max, hooks_cfg.temperature_warn, node=s.node)
        if "recovery-action" not in off:
            out += check_recovery_action(g, node=s.node)
        if "persistence" not in off:
            out += check_persistence(g, hooks_cfg.persistence_required, node=s.node)
    return out


def overall(results: Iterable[CheckResult]) -> Status:
    """fail > unknown > warn > ok. No results at all is unknown."""
    worst, seen = OK, False
    for r in results:
        seen = True
        if _SEVERITY[r.status] > _SEVERITY[worst]:
            worst = r.status
    return worst if seen else UNKNOWN


def worst_failure(results: Iterable[CheckResult]) -> Optional[CheckResult]:
    """The failure that names the drain: the one with the heaviest repair."""
    order = {NONE: 0, REQUEUE: 1, DRAIN: 2, RESET: 3, REBOOT: 4, REPLACE: 5}
    fails = [r for r in results if r.status == FAIL]
    if not fails:
        return None
    # xid first (the most specific reason a human sees), then by repair weight
    return max(fails, key=lambda r: (r.check == "xid", order.get(r.action, 0)))
