"""Names autoheal writes into Kubernetes and Slurm, and how we recognise our own writes (origins).

Every write carries its origin so that the other direction never mistakes it for a new signal:
- Slurm drains made because of Kubernetes start with ``autoheal: k8s: `` (``K8S_PREFIX``);
- autoheal's hardware drains start with ``autoheal: `` but not ``autoheal: k8s: ``;
- the Node taint and health condition autoheal writes have their own key/type, which config validation
  forbids in the "external signal" lists;
- a cordon autoheal makes itself (remediation) is marked with ``<prefix>/cordoned-by: autoheal``;
- ``<prefix>/slurm-drain-origin`` on the Node says which Kubernetes signal drained the Slurm node.
"""

from __future__ import annotations

import re

from autoheal.reasons import (
    K8S_PREFIX,
    MAX_REASON_LEN,
    PREFIX,
    Origin,
    Reason,
    is_health_drain,
    make_reason,
    sanitize,
    strip_reason_suffix,
)

__all__ = ["K8S_PREFIX", "ME", "is_health_reason", "is_k8s_reason"]
ME = "autoheal"
#: Kubernetes caps annotation values only by total size; keep ours readable like Slinky (256 chars).
MAX_ANNOTATION_LEN = 256


def drain_origin_key(prefix: str) -> str:
    return f"{prefix}/slurm-drain-origin"


def cordoned_by_key(prefix: str) -> str:
    return f"{prefix}/cordoned-by"


def k8s_reason(what: str, detail: str = "") -> str:
    """``autoheal: k8s: <what>[: <detail>]`` sanitised (the detail is user text from an annotation), in
    the form Slurm stores and gives back (``slurm_reason``)."""
    parts = ["k8s", what]
    if detail and sanitize(detail, MAX_ANNOTATION_LEN):
        parts.append(sanitize(detail, MAX_ANNOTATION_LEN))
    return slurm_reason(make_reason(*parts))


#: Fields ``scontrol show node -o`` prints after ``Reason=`` on one line; the one-line parser cuts a
#: reason at `` <Key>=``, so text containing one reads back shorter than it was written.
_AFTER_REASON = ("Comment", "Extra", "ExtraReason")
_AFTER_REASON_RE = re.compile(r"(?<=\s)(" + "|".join(_AFTER_REASON) + r")=")
_SUFFIX_RE = re.compile(r"\[([^\[\]@]+@[^\[\]]+)\]\s*$")


def slurm_reason(text: str, max_len: int = MAX_REASON_LEN) -> str:
    """``text`` as Slurm stores it and every reader (sinfo/scontrol JSON, ``scontrol show node -o``,
    slurmrestd) gives it back, so a reason compared with the one read next pass is equal and written
    once (issue 16 finding 9: a reason that changed on the way was rewritten every pass).

    Observed with scontrol 22.05 (tests/integration/test_sync_lab.py): control characters are kept
    (we make them spaces, ``sanitize``); one trailing ``"`` is dropped by scontrol (we drop them all);
    `` Comment=``/`` Extra=``/`` ExtraReason=`` end the reason for the one-line parser (we write
    ``Comment:``); a trailing ``[x@y]`` is taken for scontrol's ``[user@time]`` suffix and stripped on
    reading (we write ``(x@y)``); the one-line output drops trailing spaces (``sanitize`` strips them).
    Long reasons are stored whole; ``sanitize`` bounds ours. Idempotent: ``slurm_reason(slurm_reason(x))
    == slurm_reason(x)``.
    """
    out = sanitize(text, max_len)
    out = _AFTER_REASON_RE.sub(lambda m: m.group(1) + ":", out)
    while True:
        before = out
        out = out.rstrip('"').rstrip()
        out = _SUFFIX_RE.sub(lambda m: f"({m.group(1)})", out).rstrip()
        if out == before:
            return out


def same_reason(current: str, desired: str) -> bool:
    """True when the reason read from Slurm is what writing ``desired`` would store (no rewrite)."""
    return slurm_reason(strip_reason_suffix(current)) == slurm_reason(desired)


def is_k8s_reason(reason: str) -> bool:
    """A Slurm reason autoheal wrote because of a Kubernetes signal."""
    parsed = Reason.parse(reason)
    return parsed is not None and parsed.origin is Origin.K8S


def is_health_reason(reason: str) -> bool:
    """A Slurm reason of the node side's drains for a hardware fault: ``autoheal.reasons.is_health_drain``,
    the one test the hooks use too (never a cordon's, a pre-emptive swap's, a spare's, a retirement's or an
    admin's ``autoheal node drain``)."""
    return is_health_drain(reason)


_WORD = re.compile(r"[A-Za-z0-9]+")


def health_reason_code(reason: str) -> str:
    """CamelCase condition reason from an autoheal drain reason: ``XID79`` when an XID is named, else the
    first words (``autoheal: ecc-dbe on gpu 2`` -> ``EccDbeOnGpu``), else ``AutohealDrain``."""
    text = strip_reason_suffix(reason)
    parsed = Reason.parse(text)
    xid = parsed.named_xid if parsed is not None else Reason(detail=text).named_xid
    if xid is not None:
        return f"XID{xid}"
    body = text[len(PREFIX.strip()):] if text.startswith(PREFIX.strip()) else text
    words = _WORD.findall(body.split(":")[0])[:4]
    code = "".join(w[:1].upper() + w[1:].lower() for w in words)
    if not code or not code[0].isalpha():
        return "AutohealDrain"
    return code[:63]


_LABEL_VALUE_BAD = re.compile(r"[^A-Za-z0-9._-]")


def label_value(text: str) -> str:
    """Text squeezed into a valid label/taint value (63 chars, alnum at both ends)."""
    value = _LABEL_VALUE_BAD.sub("-", text)[:63].strip("-_.")
    return value
