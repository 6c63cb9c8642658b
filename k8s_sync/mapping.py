"""Which Kubernetes Node (and slurmd pod) belongs to each Slurm node: pure, from listed objects.

Modes (``sync.mapping``):
- ``pod``: Slinky-style; the slurmd pod whose ``pod_key`` field is the Slurm node name, and the Node it
  runs on (``spec.nodeName``);
- ``node-name``: the Node named like the Slurm node (bare metal, slurmd outside Kubernetes);
- ``node-label``: the Node whose label ``node_label`` holds the Slurm node name.
A Slurm node without a match, or with two candidates, is left alone (reported, never guessed).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, Iterable, List, Optional


@dataclass(frozen=True)
class Binding:
    """One Slurm node and its Kubernetes objects (names only; the objects live in the snapshot)."""

    slurm: str
    node: Optional[str]  # Kubernetes Node name
    pod: Optional[str] = None  # slurmd pod name (mapping = pod)
    namespace: str = ""


@dataclass
class MappingResult:
    bindings: Dict[str, Binding] = field(default_factory=dict)  # slurm node name -> binding
    problems: List[str] = field(default_factory=list)


def _meta(obj: Dict[str, Any]) -> Dict[str, Any]:
    return obj.get("metadata") or {}


def pod_slurm_name(pod: Dict[str, Any], pod_key: str) -> str:
    """The Slurm node name a slurmd pod stands for."""
    spec = pod.get("spec") or {}
    if pod_key == "hostname":
        return spec.get("hostname") or ""
    if pod_key == "node-name":
        return spec.get("nodeName") or ""
    return _meta(pod).get("name") or ""


def _live(obj: Dict[str, Any]) -> bool:
    # A pod being deleted no longer speaks for the node; its replacement will.
    return not _meta(obj).get("deletionTimestamp")


def map_nodes(slurm_names: Iterable[str], nodes: Dict[str, Dict[str, Any]], pods: Dict[str, Dict[str, Any]],
              mode: str, pod_key: str = "hostname", node_label: str = "", namespace: str = "") -> MappingResult:
    """Bind every Slurm node name to its Kubernetes Node/pod. ``nodes`` and ``pods`` are keyed by name."""
    out = MappingResult()
    names = list(slurm_names)
    if mode == "pod":
        by_slurm: Dict[str, List[Dict[str, Any]]] = {}
        for pod in pods.values():
            if _live(pod):
                by_slurm.setdefault(pod_slurm_name(pod, pod_key), []).append(pod)
        for name in names:
            cands = by_slurm.get(name, [])
            if len(cands) > 1:
                out.problems.append(f"{name}: {len(cands)} slurmd pods claim this node; skipped")
                continue
            if not cands:
                continue
            pod = cands[0]
            kname = (pod.get("spec") or {}).get("nodeName") or None
            if kname is not None and kname not in nodes:
                out.problems.append(f"{name}: pod {_meta(pod).get('name')} runs on unknown Node {kname}")
                kname = None
            out.bindings[name] = Binding(name, kname, _meta(pod).get("name"), namespace)
        return out
    if mode == "node-label":
        by_label: Dict[str, List[str]] = {}
        for kname, node in nodes.items():
            value = (_meta(node).get("labels") or {}).get(node_label)
            if value:
                by_label.setdefault(value, []).append(kname)
        for name in names:
            knames = by_label.get(name, [])
            if len(knames) > 1:
                out.problems.append(f"{name}: Nodes {', '.join(sorted(knames))} carry {node_label}={name}; skipped")
            elif knames:
                out.bindings[name] = Binding(name, knames[0])
        return out
    for name in names:  # node-name
        if name in nodes:
            out.bindings[name] = Binding(name, name)
    return out
