"""Render the autoheal-sync Helm chart without helm, for the subset of Go templates the chart uses:
``{{ .Values.a.b }}``, ``{{ .Release.Name }}``, ``{{ .Release.Namespace }}``, ``{{ if .Values.x }}``,
``{{ if eq .Values.x "word" }}``, ``{{ else }}``, ``{{ end }}``, with ``{{-`` / ``-}}`` trimming the
whitespace before / after as Go templates do. Anything else fails the test that renders it (the chart
must stay within what this renderer and helm agree on; tests compare the two where helm is installed).
"""

from __future__ import annotations

import copy
import re
from pathlib import Path
from typing import Any, Dict, List, Optional

import yaml

CHART = Path(__file__).resolve().parents[1] / "k8s_sync" / "deploy" / "chart" / "autoheal-sync"
#: Templates that need helm itself (.Files, .Capabilities, pipelines): the on-call's alert rules and dashboard,
#: which tests/unit/test_prometheus_rules.py and test_grafana_dashboard.py render with the real helm. The
#: renderer here covers the sync's own objects (its Deployment, RBAC, ConfigMap, NetworkPolicy).
HELM_ONLY = ("dashboard-configmap.yaml", "prometheusrule.yaml")
#: What the helm-only templates make, as (kind, name suffix): left out where helm's and our render are compared.
HELM_ONLY_DOCS = (("ConfigMap", "-dashboard"), ("PrometheusRule", ""))
_TAG = re.compile(r"\{\{(-?)\s*(.*?)\s*(-?)\}\}", re.S)


def merged_values(overrides: Optional[Dict[str, Any]] = None) -> Dict[str, Any]:
    """values.yaml with ``overrides`` merged in (nested dicts merged, as helm --set / -f do)."""
    values = yaml.safe_load((CHART / "values.yaml").read_text())

    def merge(dst: Dict[str, Any], src: Dict[str, Any]) -> None:
        for k, v in src.items():
            if isinstance(v, dict) and isinstance(dst.get(k), dict):
                merge(dst[k], v)
            else:
                dst[k] = copy.deepcopy(v)

    merge(values, overrides or {})
    return values


def _lookup(expr: str, values: Dict[str, Any], release: str, namespace: str) -> Any:
    if expr == ".Release.Name":
        return release
    if expr == ".Release.Namespace":
        return namespace
    if not expr.startswith(".Values."):
        raise AssertionError(f"template uses more than value lookups: {expr!r}")
    cur: Any = values
    for part in expr[len(".Values."):].split("."):
        if not isinstance(cur, dict) or part not in cur:
            raise AssertionError(f"template reads a value values.yaml does not have: {expr}")
        cur = cur[part]
    return cur


def _truthy(expr: str, values: Dict[str, Any], release: str, namespace: str) -> bool:
    m = re.fullmatch(r'eq\s+(\S+)\s+"([^"]*)"', expr)
    if m:
        return str(_lookup(m.group(1), values, release, namespace)) == m.group(2)
    value = _lookup(expr, values, release, namespace)
    return bool(value) and value not in ("", 0, [], {})


def _text(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def render_text(template: str, values: Dict[str, Any], release: str = "autoheal-sync",
                namespace: str = "slurm") -> str:
    tags = list(_TAG.finditer(template))
    out: List[str] = []
    stack: List[List[bool]] = []  # per open if: [this branch active, some branch taken]

    def active() -> bool:
        return all(frame[0] for frame in stack)

    pos = 0
    for i, m in enumerate(tags + [None]):
        text = template[pos:m.start()] if m is not None else template[pos:]
        if i > 0 and tags[i - 1].group(3):  # "-}}" before this text
            text = text.lstrip()
        if m is not None and m.group(1):  # "{{-" after this text
            text = text.rstrip()
        if active():
            out.append(text)
        if m is None:
            break
        expr, pos = m.group(2), m.end()
        if expr.startswith("if "):
            cond = active() and _truthy(expr[3:].strip(), values, release, namespace)
            stack.append([cond, cond])
        elif expr == "else":
            stack[-1][0] = not stack[-1][1]
            stack[-1][1] = True
        elif expr == "end":
            stack.pop()
        elif active():
            out.append(_text(_lookup(expr, values, release, namespace)))
    if stack:
        raise AssertionError("template has an unclosed if")
    return "".join(out)


def render(release: str = "autoheal-sync", namespace: str = "slurm",
           overrides: Optional[Dict[str, Any]] = None) -> List[Dict[str, Any]]:
    """The chart's documents for these values (but those of the ``HELM_ONLY`` templates)."""
    values = merged_values(overrides)
    docs: List[Dict[str, Any]] = []
    for tpl in sorted((CHART / "templates").glob("*.yaml")):
        if tpl.name in HELM_ONLY:
            continue
        text = render_text(tpl.read_text(), values, release, namespace)
        docs.extend(d for d in yaml.safe_load_all(text) if d)
    return docs


def helm_only(doc: Dict[str, Any]) -> bool:
    """True for a document a ``HELM_ONLY`` template made."""
    name = doc.get("metadata", {}).get("name", "")
    return any(doc.get("kind") == kind and name.endswith(suffix) for kind, suffix in HELM_ONLY_DOCS)
