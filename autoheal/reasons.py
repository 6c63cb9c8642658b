"""Reasons and comments we write into Slurm: our prefix, sanitising, and ownership.

Every reason we write starts with ``autoheal: `` so that we can tell our drains from an admin's (the
convention NHC and Slinky follow). We only ever resume or rewrite a node whose reason is ours.
"""

from __future__ import annotations

import re
import unicodedata

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

_WS = re.compile(r"\s+")


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
