"""Judging a live Slurm configuration against the recommendations (pure: dicts in, findings out)."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Dict, List, Optional, Tuple

from autoheal.slurm_conf import values
from autoheal.slurm_conf.recommendations import Recommendation

OK, WARN, FAIL, SKIP = "ok", "warn", "fail", "skip"
STATUSES = (OK, WARN, FAIL, SKIP)


@dataclass
class Finding:
    """One line of the doctor's report."""

    id: str
    status: str  # ok | warn | fail | skip
    what: str  # the setting or installation item checked
    current: str = ""
    recommended: str = ""
    why: str = ""
    effect: str = ""
    kind: str = "setting"  # setting | install

    def to_dict(self) -> Dict[str, Any]:
        return asdict(self)


def lookup(conf: Dict[str, str], key: str) -> Optional[str]:
    """Case-insensitive lookup (Slurm's spelling of keys varies a little between versions)."""
    if key in conf:
        return conf[key]
    low = key.lower()
    for k, v in conf.items():
        if k.lower() == low:
            return v
    return None


def preemption_enabled(conf: Dict[str, str]) -> bool:
    """True when PreemptType names a real preemption plugin."""
    ptype = lookup(conf, "PreemptType")
    return ptype is not None and not values.is_null(ptype) and ptype.strip().lower() != "preempt/none"


def _override(rec: Recommendation, conf: Dict[str, str]) -> Optional[str]:
    """The raw value of ``rec.override_item`` in ``rec.override_key``, when the site set it."""
    if not rec.override_key:
        return None
    other = lookup(conf, rec.override_key)
    if other is None:
        return None
    return values.item_values(other).get(rec.override_item.lower())


def _item_number(rec: Recommendation, shown: str) -> Optional[float]:
    """item_max: the item's number in ``shown`` (absent: ``item_default``); None if unreadable."""
    raw = values.item_values(shown).get(rec.item.lower())
    return values.number(raw) if raw is not None else rec.item_default


def _passes(rec: Recommendation, value: Optional[str]) -> Tuple[bool, str]:
    """(passes, current value as shown). ``value`` None means the key is absent: Slurm's default."""
    shown = value if value is not None else rec.default
    if rec.zero_is_default and values.number(shown) == 0:
        shown = rec.default
    if rec.check == "set":
        return not values.is_null(shown), shown
    if rec.check in ("min", "range"):
        n = values.number(shown)
        if n is None:
            return False, shown
        ok = (rec.min is None or n >= rec.min) and (rec.max is None or n <= rec.max)
        return ok, shown
    if rec.check == "one_of":
        return shown.strip().lower() in {a.lower() for a in rec.accepted}, shown
    if rec.check == "has_item":
        names = set(values.item_names(shown))
        return any(a.lower() in names for a in rec.accepted), shown
    if rec.check == "item_max":
        n = _item_number(rec, shown)
        if n is None:
            return False, shown
        return (rec.max is None or n <= rec.max), shown
    raise ValueError(f"unknown check {rec.check!r}")


def _effect_values(rec: Recommendation, shown: str) -> Dict[str, str]:
    if rec.check == "item_max":
        n = _item_number(rec, shown)
    else:
        n = values.number(shown)
    if n is None:
        return {"current": shown, "current_plus_1": "?"}
    return {"current": f"{n:g}", "current_plus_1": f"{n + 1:g}"}


def evaluate(rec: Recommendation, conf: Dict[str, str], has_gpus: bool = True) -> Finding:
    """Judge one recommendation against ``conf`` (``scontrol show config`` as a dict)."""
    if rec.only_with_gpus and not has_gpus:
        return Finding(rec.id, SKIP, rec.key, recommended=rec.recommended_text, why=rec.why,
                       effect="no GPU nodes: not needed")
    value = lookup(conf, rec.key)
    override = _override(rec, conf)
    if override is not None:
        # the overriding item alone decides (Slurm reads it instead of `item`, whatever `item` says)
        shown = f"{rec.override_item}={override}"
        n = values.number(override)
        ok = n is not None and (rec.max is None or n <= rec.max)
        current = f"{rec.override_key} {shown} (overrides {rec.key} {rec.item})"
        values_for_effect = {"current": shown, "current_plus_1": "?"} if n is None else {
            "current": f"{n:g}", "current_plus_1": f"{n + 1:g}"}
    else:
        ok, shown = _passes(rec, value)
        current = shown if value is not None else f"{shown} (not shown: Slurm default)"
        values_for_effect = _effect_values(rec, shown)
    what = rec.override_key if override is not None else rec.key
    if ok:
        return Finding(rec.id, OK, what, current, rec.recommended_text, rec.why, rec.effect_good)
    severity = rec.severity
    if rec.when_preempting and preemption_enabled(conf):
        severity = rec.when_preempting
    effect = rec.effect_bad.format(**values_for_effect)
    return Finding(rec.id, severity, what, current, rec.recommended_text, rec.why, effect)


def evaluate_all(recs: List[Recommendation], conf: Dict[str, str], has_gpus: bool = True) -> List[Finding]:
    """Every recommendation judged, in data order."""
    return [evaluate(r, conf, has_gpus) for r in recs]


def check_node_gpus(nodes_gpus: Dict[str, int], expected: Optional[int]) -> List[Finding]:
    """Nodes whose Slurm GRES gpu count differs from the config's ``hooks.expected_gpus``.

    A mismatch means gres.conf/NodeName lines and reality disagree: jobs get fewer GPUs than exist, or
    the healthcheck reports GPUs "lost" that Slurm never had.
    """
    if not expected or not nodes_gpus:
        return []
    wrong = {n: c for n, c in sorted(nodes_gpus.items()) if c and c != expected}
    missing = [n for n, c in sorted(nodes_gpus.items()) if not c]
    if not wrong and len(missing) == len(nodes_gpus):
        return [Finding("gres_gpu_count", WARN, "NodeName Gres=gpu:N", "no node has gpu GRES",
                        f"gpu:{expected} per node (hooks.expected_gpus)",
                        "gres.conf and the NodeName lines must declare each node's GPUs.",
                        "jobs cannot request GPUs; autoheal cannot map GPU faults to jobs")]
    if not wrong:
        return [Finding("gres_gpu_count", OK, "NodeName Gres=gpu:N", f"gpu:{expected} on every GPU node",
                        f"gpu:{expected} per node (hooks.expected_gpus)",
                        "gres.conf and the NodeName lines must declare each node's GPUs.",
                        "Slurm schedules every GPU the node has")]
    shown = ", ".join(f"{n}=gpu:{c}" for n, c in wrong.items())
    return [Finding("gres_gpu_count", WARN, "NodeName Gres=gpu:N", shown,
                    f"gpu:{expected} per node (hooks.expected_gpus)",
                    "gres.conf and the NodeName lines must declare each node's GPUs.",
                    "Slurm's GPU count differs from what the node has: idle GPUs, or checks reporting "
                    "GPUs as lost")]


def exit_code(findings: List[Finding], strict: bool = False) -> int:
    """0 when nothing failed (and, with ``strict``, nothing warned); else 1."""
    bad = {FAIL, WARN} if strict else {FAIL}
    return 1 if any(f.status in bad for f in findings) else 0
