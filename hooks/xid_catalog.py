"""NVIDIA's Xid catalog as the source of autoheal's default XID policy.

The facts (XID, mnemonic, description, the GPU generations it applies to, NVIDIA's immediate and
investigatory resolution bucket) are data, ``xid_catalog.csv`` beside this module, regenerated from
NVIDIA's ``Xid-Catalog.xlsx`` by ``tools/xid_catalog.py``. The default policy of an XID is its
immediate bucket through one rule per bucket (``BUCKET_POLICY``), except where autoheal deliberately
differs (``DIFFERENCES``: each with its reason, listed in docs/admin-hooks.md). An XID the catalog does
not know (a newer driver) gets ``FALLBACK``.

The file is read on first use, not at import: the hooks import this module on every healthcheck, and
most passes see no XID at all (``python -X importtime``: docs/admin-hooks.md).
"""

from __future__ import annotations

import os

from autoheal.config.hooks_section import XID_POLICIES as POLICIES  # noqa: F401  (re-exported: one list, in the core)
from autoheal.records import record

TYPE_CHECKING = False  # typing is for mypy only: not imported at run time (the hooks start fast)
if TYPE_CHECKING:
    from typing import Dict, List, Optional, Tuple

DATA_FILE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "xid_catalog.csv")
GENERATIONS = ("A100", "H100", "B100", "GB200")

# Policies, from the mildest: ignore (nothing), warn (journal), job (the job's problem: recorded against
# the job that owns the process the driver named, its user told; never a node action), requeue (that
# job is requeued), recovery (NVML's GPU recovery action decides: the recovery-action check drains when
# it asks for a reset/reboot), human (drain, no automatic repair, no automatic resume), and the drains
# with the first rung of the recovery ladder: drain/reset (GPU reset), reboot, replace.
#: Policies that take the node out of service.
DRAIN_POLICIES = ("human", "drain", "reset", "reboot", "replace")
#: Policies whose XIDs are the application's: attributed to the job, never a drain, never escalated.
JOB_POLICIES = ("job", "requeue")

#: NVIDIA's immediate-action bucket -> autoheal's policy, and why.
BUCKET_POLICY: Dict[str, Tuple[str, str]] = {
    "RESTART_APP": ("job", "the application must restart: the job's problem, never a drain (the job is told)"),
    "IGNORE": ("ignore", "NVIDIA: no action needed"),
    "RESET_GPU": ("reset", "drain; the ladder starts at a GPU reset"),
    "RESTART_BM": ("reboot", "drain; the ladder starts at a node reboot"),
    "RESTART_VM": ("reboot", "drain; the ladder starts at a node reboot"),
    "CHECK_MECHANICALS": ("human", "drain for a human: cabling, power, seating (no automatic repair)"),
    "CONTACT_SUPPORT": ("human", "drain for a human: NVIDIA support (no automatic repair)"),
    # not in the list: a software/firmware update is planned work, and CHECK_UVM is a sympathetic
    # report of a host-side (UVM) problem; neither says the GPU must leave service
    "UPDATE_SWFW": ("warn", "a driver or firmware update is needed: journalled for the admin, no drain"),
    "CHECK_UVM": ("warn", "a sympathetic report of a host-side (UVM) problem: journalled, no drain"),
    "WORKFLOW_XID_45": ("job", "follows the XID it accompanies (judged on its own); 45 itself is the driver "
                        "cleaning up the job's channels: recorded against the job, never a drain"),
    "WORKFLOW_XID_48": ("reset", "NVIDIA's DBE workflow: drain, reset the GPU (remaps the row), escalate if it "
                        "comes back"),
    "WORKFLOW_NVLINK_ERR": ("reset", "NVIDIA's NVLink workflow: drain, reset the GPU, escalate if it comes back"),
    "WORKFLOW_NVLINK5_ERR": ("reset", "NVIDIA's NVLink5 workflow: drain, reset the GPU, escalate if it comes back"),
    "XID_154": ("recovery", "NVML's GPU recovery action says what is needed (the recovery-action check acts)"),
}

#: Where autoheal's default deliberately differs from the bucket rule: XID -> (policy, reason).
DIFFERENCES: Dict[int, Tuple[str, str]] = {
    79: ("replace", "catalog: RESTART_BM, then CONTACT_SUPPORT. A GPU that fell off the bus rarely stays on it "
         "after a reboot; with a spare pool, replacing at once costs less than a reboot that fails again. "
         "Set hooks.xid_policy 79 = \"reboot\" for NVIDIA's flow"),
    64: ("replace", "catalog: RESET_GPU, then CONTACT_SUPPORT. A row-remapping failure means the GPU has no "
         "spare rows left: a reset does not give them back, the GPU needs an RMA"),
    94: ("requeue", "catalog: RESTART_APP. A contained ECC error killed the job through no fault of its own: "
         "autoheal requeues that job (and only it) instead of only telling its user"),
}

#: The policy of an XID the catalog does not know, or one it lists without a bucket.
FALLBACK = ("recovery", "not in NVIDIA's catalog (a newer driver?) or listed without an action: journalled "
            "as a warning; NVML's GPU recovery action (checked every pass) decides a drain")


@record(frozen=True)
class Entry:
    """One XID of NVIDIA's catalog."""

    xid: int
    mnemonic: str
    description: str
    applies: Tuple[Tuple[str, Optional[bool]], ...]  # (generation, yes/no/None: the source does not say)
    immediate: str
    investigatory: str

    def applies_to(self, generation: str) -> Optional[bool]:
        return dict(self.applies).get(generation.upper())


@record(frozen=True)
class Verdict:
    """What autoheal does with one XID by default, and why."""

    xid: int
    policy: str
    why: str
    bucket: str  # NVIDIA's immediate bucket, "" when the catalog has none
    deliberate: bool  # autoheal differs from the bucket rule on purpose (DIFFERENCES)
    entry: Optional[Entry]


_CACHE: Optional[Tuple[Dict[int, Entry], str]] = None


def _yes(text: str) -> Optional[bool]:
    t = text.strip().lower()
    return True if t == "yes" else False if t == "no" else None


def load(path: str = DATA_FILE) -> Tuple[Dict[int, Entry], str]:
    """The entries by XID and the source line of the data file (read once per process)."""
    import csv

    global _CACHE
    if _CACHE is not None and path == DATA_FILE:
        return _CACHE
    source = ""
    with open(path, newline="", encoding="utf-8") as fh:
        lines: List[str] = []
        for line in fh:
            if line.startswith("#"):
                source = source or line.lstrip("# ").strip()
            else:
                lines.append(line)
    entries: Dict[int, Entry] = {}
    for row in csv.DictReader(lines):
        xid = int(row["xid"])
        entries[xid] = Entry(xid, row["mnemonic"], row["description"],
                             tuple((g, _yes(row.get(g.lower(), "") or "")) for g in GENERATIONS),
                             row["immediate"].strip(), row["investigatory"].strip())
    if path == DATA_FILE:
        _CACHE = (entries, source)
    return entries, source


def entry(xid: int) -> Optional[Entry]:
    return load()[0].get(xid)


def verdict(xid: int) -> Verdict:
    """The default policy of ``xid``: a deliberate difference, else the bucket rule, else the fallback."""
    e = entry(xid)
    bucket = e.immediate if e is not None else ""
    if xid in DIFFERENCES:
        policy, why = DIFFERENCES[xid]
        return Verdict(xid, policy, why, bucket, True, e)
    if bucket in BUCKET_POLICY:
        policy, why = BUCKET_POLICY[bucket]
        return Verdict(xid, policy, why, bucket, False, e)
    policy, why = FALLBACK
    return Verdict(xid, policy, why, bucket, False, e)


def default_policy(xid: int) -> str:
    return verdict(xid).policy


def xids_in_bucket(bucket: str, generation: str = "") -> List[int]:
    """Catalog XIDs whose immediate bucket is ``bucket`` (optionally only those that apply to ``generation``)."""
    return [e.xid for e in sorted(load()[0].values(), key=lambda e: e.xid)
            if e.immediate == bucket and (not generation or e.applies_to(generation))]


#: What each policy makes autoheal do, in words (``autoheal xid explain``).
POLICY_TEXT: Dict[str, str] = {
    "ignore": "nothing (counted in the xid-watch metrics)",
    "warn": "a warning in the journal; the node stays in service",
    "job": "recorded against the job that owns the process the driver named (journal, job comment, a "
           "notification to its user); the node stays in service, however often it comes",
    "requeue": "the job on that GPU is requeued (its process named by the driver, else the GPU's job); "
               "the node stays in service",
    "recovery": "a warning in the journal; NVML's GPU recovery action, read at once, decides (NONE: "
                "nothing; reset, reboot: drained with that rung; drain P2P: drained until it changes; "
                "docs/xid-policy.md)",
    "human": "the node is drained for a human: no automatic repair and no automatic resume "
             "(`autoheal node resume` once fixed)",
    "drain": "the node is drained; the ladder starts at a GPU reset",
    "reset": "the node is drained; the ladder starts at a GPU reset, then reboot, then replacement if the "
             "fault comes back",
    "reboot": "the node is drained; the ladder starts at a node reboot, then replacement if it comes back",
    "replace": "the node is drained and a replacement is asked for (`autoheal: replace: ...`)",
}


def explain(xid: int, overrides: Optional[Dict[str, str]] = None) -> Dict[str, object]:
    """What NVIDIA says about ``xid``, what autoheal will do (site override included), and why."""
    v = verdict(xid)
    _, source = load()
    override = (overrides or {}).get(str(xid))
    policy = override or v.policy
    e = v.entry
    return {
        "xid": xid,
        "known": e is not None,
        "mnemonic": e.mnemonic if e else "",
        "description": e.description if e else "",
        "applies": {g: (e.applies_to(g) if e else None) for g in GENERATIONS},
        "immediate": e.immediate if e else "",
        "investigatory": e.investigatory if e else "",
        "default_policy": v.policy,
        "policy": policy,
        "site_override": override is not None,
        "drains": policy in DRAIN_POLICIES,
        "does": POLICY_TEXT.get(policy, policy),
        "why": ("set in hooks.xid_policy" if override is not None else v.why),
        "deliberate_difference": v.deliberate and override is None,
        "source": source,
    }
