"""Reasons and comments we write into Slurm: our prefix, sanitising, and ownership.

Every reason we write starts with ``autoheal: `` so that we can tell our drains from an admin's (the
convention NHC and Slinky follow). We only ever resume or rewrite a node whose reason is ours.
"""

from __future__ import annotations

import re
import unicodedata
from dataclasses import dataclass, replace
from enum import Enum

from autoheal.lazyre import LazyPattern

TYPE_CHECKING = False  # typing is for mypy only: not imported at run time (the hooks start fast)
if TYPE_CHECKING:
    from typing import Optional

PREFIX = "autoheal: "
#: Drains that mirror a Kubernetes cordon/taint/condition (written by ``autoheal sync``). The node side
#: must not adopt these as its own health drains: a GPU fault found on such a node replaces the reason.
K8S_PREFIX = "autoheal: k8s: "
#: Drains the health check makes on warning signs (pending row remap, thermal slowdown, ...) of a node
#: that runs the active step of a hot-spare job (``autoheal sbatch --spare-nodes``): the job keeps running
#: (DRAIN lets it) and its runner swaps the node for a spare at the next checkpoint. Not a fault: xid-watch
#: sends no grace signal and requeues nothing for it.
PRESWAP = "pre-emptive swap"
PRESWAP_PREFIX = PREFIX + PRESWAP + ": "
#: Slurm stores reasons of any length, but sinfo -R truncates and reasons travel into Kubernetes
#: annotations and webhook messages: keep them short enough to read in one line.
MAX_REASON_LEN = 200
MAX_COMMENT_LEN = 1000
#: Job comments of jobs run by ``autoheal sbatch`` start with this marker (``autoheal-runner key=value ...
#: | user comment``): the hooks signal such jobs' batch shell (``hooks.runner_comment`` defaults to it) and
#: the sbatch wrapper, runner and guard write and read it.
RUNNER_MARKER = "autoheal-runner"
#: Between the runner's ``key=value`` state and the user's own ``--comment`` in a runner job comment.
COMMENT_SEPARATOR = " | "

_WS = LazyPattern(r"\s+")


def sanitize(text: str, max_len: int = MAX_REASON_LEN) -> str:
    """Return ``text`` as one printable line of at most ``max_len`` characters.

    Control characters (newlines, escapes, NUL) become spaces, runs of white space collapse, and
    over-long text is cut with a trailing ellipsis. Quotes and shell metacharacters are kept: we pass
    argv lists, never a shell, so they are harmless and may carry meaning.
    """
    text = "" if text is None else str(text)
    cleaned = "".join(" " if unicodedata.category(ch)[0] == "C" else ch for ch in text)
    cleaned = _WS.sub(" ", cleaned).strip()
    if len(cleaned) > max_len:
        cleaned = cleaned[:max_len] if max_len < 3 else cleaned[: max_len - 3].rstrip() + "..."
    return cleaned


def make_reason(*parts: str, max_len: int = MAX_REASON_LEN) -> str:
    """Build an ``autoheal: a: b`` reason from parts, sanitised and bounded (prefix included)."""
    body = ": ".join(sanitize(p, max_len) for p in parts if p is not None and str(p).strip())
    return sanitize(PREFIX + body, max_len)


def is_ours(reason: str | None) -> bool:
    """True when a Slurm reason was written by autoheal (starts with our prefix).

    Slurm may append ``[user@time]`` when it prints a reason; the prefix test is unaffected.
    """
    return reason is not None and reason.strip().startswith(PREFIX.strip())


def is_k8s_origin(reason: str | None) -> bool:
    """True for drains ``autoheal sync`` made because of Kubernetes (cordon, taint, condition)."""
    return reason is not None and reason.strip().startswith(K8S_PREFIX.strip())


def is_preswap(reason: str | None) -> bool:
    """True for the drain reason of a pre-emptive swap (``autoheal: pre-emptive swap: ...``)."""
    return bool(reason) and strip_reason_suffix(reason).startswith(PRESWAP_PREFIX.strip())


def strip_reason_suffix(reason: str | None) -> str:
    """Remove the ``[user@2026-01-01T00:00:00]`` suffix scontrol appends when it prints a reason."""
    if not reason:
        return ""
    return re.sub(r"\s*\[[^\[\]@]+@[^\[\]]+\]\s*$", "", reason).strip()


# ---- the reason model --------------------------------------------------------------------------------
# What autoheal writes into a drain reason or a job comment, as one typed value both sides share: the
# hooks render it, ``autoheal sync`` parses it back (the XID, the rung). ``render()`` gives exactly the
# strings earlier releases wrote, and ``parse()`` reads every one of them (sites upgrade with nodes
# drained): a body that does not follow the fault grammar below is kept verbatim as free text.
#
#   autoheal: [<origin>: ]<body>             origin: k8s, pre-emptive swap, reboot, replace, retired,
#   autoheal: requeued after <body>          spare, spare pool (none = a health drain)
#   body:  xid <N> on <where>[: <detail>]    <kind>: <where>[: <detail>]    <free text>
#   where: GPU <i>|a GPU[ of <node>][ (<pci bus>)]

class Origin(str, Enum):
    """Who wrote a reason and why; the value is the tag written after ``autoheal: ``."""

    HEALTH = ""  # the node's health check or xid-watch: no tag, the fault comes first
    K8S = "k8s"
    PRESWAP = PRESWAP
    REBOOT = "reboot"
    REPLACE = "replace"
    RETIRED = "retired"
    SPARE = "spare"
    SPARE_POOL = "spare pool"
    REQUEUED = "requeued after"  # a job comment, not a drain: ``autoheal: requeued after <fault>``
    ADMIN = "admin"  # ``autoheal node drain --reason``: a person's drain through our CLI, never a fault
    LEMON = "lemon"  # the node side retired a repeat offender: no automatic return (a health drain)


#: The recovery rungs a health drain reason can name (the rest of the ladder leaves the reason alone).
RUNGS = (Origin.REBOOT, Origin.REPLACE)
#: Origins of the node side's drains for a hardware fault (besides a plain fault body: Origin.HEALTH).
HEALTH_ORIGINS = (Origin.HEALTH, Origin.REBOOT, Origin.REPLACE, Origin.LEMON)
_TAGGED = sorted((o for o in Origin if o.value and o is not Origin.REQUEUED), key=lambda o: -len(o.value))
_NODE = r"[A-Za-z0-9][A-Za-z0-9._-]*"
_WHERE = rf"(?:GPU (?P<gpu>\d+)|a GPU)(?: of (?P<node>{_NODE}))?(?: \((?P<pci>[^()]+)\))?"
_XID_BODY = LazyPattern(rf"xid (?P<xid>\d+) on {_WHERE}(?:: (?P<detail>.+))?\Z", re.S)
_KIND_BODY = LazyPattern(rf"(?P<kind>[a-z][a-z0-9-]*): {_WHERE}(?:: (?P<detail>.+))?\Z", re.S)
#: How older releases, admins and other tools name an XID in free text (``xid=79``, ``XID 79``, ``xid:79``).
_LOOSE_XID = LazyPattern(r"\bxid[\s:=#-]*(\d+)", re.IGNORECASE)


def gpu_where(gpu: Optional[int], node: str = "", pci: str = "") -> str:
    """``GPU 3 of gpu2 (0000:3b:00.0)``: a GPU index never reads like a node name (``gpu3``)."""
    label = f"GPU {gpu}" if gpu is not None else "a GPU"
    if node:
        label += f" of {node}"
    return f"{label} ({pci})" if pci else label


@dataclass(frozen=True)
class Reason:
    """One reason or job comment autoheal writes. A fault (``kind`` set) renders as ``xid 79 on GPU 3 of
    gpu2 (0000:3b:00.0): fallen off the bus`` or ``nvlink: GPU 1 of n1: link 2 down``; without ``kind``
    the body is ``detail`` as written (Kubernetes, spare pool, retired and preswap reasons, admin text,
    and older free-form reasons)."""

    origin: Origin = Origin.HEALTH
    kind: str = ""
    xid: Optional[int] = None
    gpu: Optional[int] = None
    node: str = ""
    pci: str = ""
    detail: str = ""

    def body(self) -> str:
        """The text after the origin tag, unbounded and unsanitised."""
        if self.kind == "xid" and self.xid is not None:
            text = f"xid {self.xid} on {gpu_where(self.gpu, self.node, self.pci)}"
        elif self.kind:
            text = f"{self.kind}: {gpu_where(self.gpu, self.node, self.pci)}"
        else:
            return self.detail
        return f"{text}: {self.detail}" if self.detail else text

    def render(self, max_len: int = MAX_REASON_LEN) -> str:
        """The string written into Slurm: ``autoheal: [<origin>: ]<body>``, sanitised and bounded."""
        if self.origin is Origin.REQUEUED:
            return make_reason(f"{Origin.REQUEUED.value} {self.body()}", max_len=max_len)
        return make_reason(self.origin.value, self.body(), max_len=max_len)

    def with_origin(self, origin: Origin) -> Reason:
        return replace(self, origin=origin)

    @property
    def rung(self) -> Optional[Origin]:
        """The recovery rung the reason asks for (reboot, replace), or None."""
        return self.origin if self.origin in RUNGS else None

    @property
    def named_xid(self) -> Optional[int]:
        """The XID this reason is about: the fault's, else one named in free text (``autoheal: xid=79
        gpu=3`` from an older release or an admin)."""
        if self.xid is not None:
            return self.xid
        m = _LOOSE_XID.search(self.detail)
        return int(m.group(1)) if m else None

    def requeued_fault(self) -> Optional[Reason]:
        """The fault of a job comment ``autoheal: requeued after <drain reason body>`` as a Reason (its node,
        XID, GPU), or None when this is not such a comment."""
        if self.origin is not Origin.REQUEUED:
            return None
        if self.kind:
            return self.with_origin(Origin.HEALTH)
        return Reason.parse(PREFIX + self.detail)

    @classmethod
    def parse(cls, reason: Optional[str]) -> Optional[Reason]:
        """The value of a reason read back from Slurm (``[user@time]`` suffix allowed), or None when it is
        not ours. Never fails on text we did not write in the canonical form: it becomes free text."""
        text = strip_reason_suffix(reason)
        if not is_ours(text):
            return None
        body = text[len(PREFIX.strip()):].strip()
        origin = Origin.HEALTH
        if body.startswith(Origin.REQUEUED.value + " "):
            origin, body = Origin.REQUEUED, body[len(Origin.REQUEUED.value) + 1:]
        else:
            for o in _TAGGED:
                if body == o.value or body.startswith(o.value + ":"):
                    origin, body = o, body[len(o.value) + 1:].lstrip(" ")
                    break
        return parse_body(body, origin)


def parse_body(body: str, origin: Origin = Origin.HEALTH) -> Reason:
    """A fault text (``xid 79 on GPU 3 of gpu2: ...``, a check result's text) as a Reason. Structure is
    taken only when rendering it back gives the same text; anything else is free text in ``detail``."""
    for pattern in (_XID_BODY, _KIND_BODY):
        m = pattern.match(body)
        if m is None:
            continue
        g = m.groupdict()
        found = Reason(origin=origin, kind=g.get("kind") or "xid", xid=int(g["xid"]) if g.get("xid") else None,
                       gpu=int(g["gpu"]) if g["gpu"] is not None else None, node=g["node"] or "",
                       pci=g["pci"] or "", detail=g["detail"] or "")
        if found.body() == body:
            return found
    return Reason(origin=origin, detail=body)


def admin_reason(text: str) -> str:
    """``autoheal: admin: <text>``: the reason of ``autoheal node drain --reason TEXT`` (our prefix, if the
    admin typed it, is not doubled)."""
    body = sanitize(text)
    if is_ours(body):
        body = body[len(PREFIX.strip()):].strip()
    return Reason(Origin.ADMIN, detail=body or "drained by an admin").render()


# ---- the one test of "is this a health drain?" -------------------------------------------------------

def _health_words() -> frozenset[str]:
    from autoheal.config.hooks_section import CHECK_NAMES  # lazily: config imports this module

    return frozenset(CHECK_NAMES)


def is_health_drain(reason: Optional[str]) -> bool:
    """True for a drain the node side made for a hardware fault: a fault body (``autoheal: xid 79 on GPU
    3 of gpu2 ...``, ``autoheal: ecc: GPU 1 of n1: ...``), a recovery rung (``autoheal: reboot: ...``,
    ``autoheal: replace: ...``), a lemon retirement, or an older release's free-form fault text
    (``autoheal: xid=79 gpu=3``, ``autoheal: ecc on gpu 2``). False for everything else: someone else's
    reason, and autoheal's own drains that are not a fault: Kubernetes (``k8s``), a pre-emptive swap, the
    spare pool, a spare, a retired node, and an admin's ``autoheal node drain --reason`` (``admin``, or
    any free text that names no fault, e.g. ``autoheal: maintenance by bob``).

    The one implementation: the hooks' job side (which jobs to move) and the sync (GPUHealthy condition,
    taint, remediation) both ask it (issue 22)."""
    parsed = Reason.parse(reason)
    if parsed is None or parsed.origin not in HEALTH_ORIGINS:
        return False
    if parsed.origin is not Origin.HEALTH or parsed.kind:
        return True
    text = parsed.detail.strip()
    word = re.split(r"[\s:=]", text, maxsplit=1)[0].lower() if text else ""
    words = _health_words()
    # ``ecc-dbe``: older releases wrote the check with a detail (``autoheal: ecc-dbe on gpu 2``)
    return word in words or word.split("-")[0] in words or (word.startswith("xid") and parsed.named_xid is not None)
