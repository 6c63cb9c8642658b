"""The lab's Kubernetes side: an API server, Nodes and Slinky-style slurmd pods for the lab's Slurm nodes,
``autoheal sync`` and the spare pool, all as lab processes recorded by PID in lab.json.

``autoheal lab up --kube`` calls ``start(lab)``; ``Lab.down()`` stops every recorded process. The API
server is the real one (``api="real"``, the default): etcd, kube-apiserver and kube-controller-manager
from ``autoheal_lab.controlplane``, the sync's Helm chart installed with the real ``helm``, the lab's
kubelets (``autoheal_lab.kubelet``) and ``autoheal sync`` running as the chart's ServiceAccount.
(The project's own fake API server, ``autoheal_lab.fakekube``, was retired on 2026-12-02: the fault
proxy ``autoheal_lab.apifaults`` gives its fault windows in front of the real server.)

The lab's own kubeconfig (cluster admin) lives at ``<lab>/kube/kubeconfig`` and is recorded in lab.json
(``autoheal lab env`` exports it as KUBECONFIG); the sync's (the chart's ServiceAccount token) at
``<lab>/kube/sync.kubeconfig``. Kubernetes Node names are the Slurm node names; each slurmd pod is
``slurm/slurmd-<node>`` (label ``app.kubernetes.io/component=slurmd``, ``spec.hostname`` = the Slurm node).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any, Dict, List, Optional

from autoheal_lab import procs

NAMESPACE = "slurm"
SLURMD_LABELS = {"app.kubernetes.io/component": "slurmd", "app.kubernetes.io/name": "slurmd"}
API_PROC, SYNC_PROC, POOL_PROC, KUBELET_PROC = "kube-api", "sync", "spare-pool", "kubelet"
SYNC_KUBECONFIG = "sync.kubeconfig"


def node_obj(name: str) -> Dict[str, Any]:
    """A Node as a kubelet registers it (Ready)."""
    return {"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name, "autoheal.io/lab": "true"}},
            "spec": {},
            "status": {"conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady",
                                       "message": "kubelet is posting ready status"}]}}


def slurmd_pod(node: str) -> Dict[str, Any]:
    """A Slinky-style slurmd pod for ``node`` (owned by a NodeSet, bound to the Node of that name)."""
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": f"slurmd-{node}", "namespace": NAMESPACE, "labels": dict(SLURMD_LABELS),
                         "ownerReferences": [{"apiVersion": "slinky.slurm.net/v1alpha1", "kind": "NodeSet",
                                              "name": "gpu", "uid": "uid-nodeset-gpu", "controller": True}]},
            "spec": {"nodeName": node, "hostname": node, "containers": [{"name": "slurmd", "image": "slurmd:lab"}]},
            "status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}}


def kubeconfig_path(lab) -> Path:
    return lab.root / "kube" / "kubeconfig"


def cannot_start() -> Optional[str]:
    """One line naming what to install when ``start`` cannot bring this Kubernetes side up here, else None.
    The real control plane is built once per machine (minutes, with progress on stderr); here it is
    built or found, so a missing Go or an unreachable module proxy is told before the lab starts."""
    from autoheal_lab import controlplane

    why = controlplane.missing_toolchain()
    if why:
        return why
    try:
        controlplane.ensure_binaries(progress=lambda line: print(line, file=sys.stderr, flush=True))
    except controlplane.ControlPlaneError as exc:
        return f"{exc} (the build needs Go 1.26+ and the Go module proxy, $GOPROXY)"
    return None


def start(lab, spare_delay: float = 1.0, sync: bool = True, pool: bool = True, wait: float = 20.0,
          keep_state: bool = False) -> str:
    """Start the API server with the lab's Nodes and slurmd pods, ``autoheal sync`` and the spare pool.
    Returns the (admin) kubeconfig path."""
    from autoheal_lab import realkube

    kc = realkube.start(lab, keep_state=keep_state)
    if sync:
        start_sync(lab)
    if pool:
        start_pool(lab, spare_delay)
    return kc


def start_sync(lab, name: str = SYNC_PROC, extra: List[str] = (), wait: float = 30.0) -> procs.ProcRecord:
    """``autoheal sync`` as a lab process (the lab's autoheal.toml enables remediation), serving
    /metrics on a free loopback port recorded in lab.json (``autoheal lab status`` shows the URL)."""
    from autoheal_lab.cluster import LabError, _free_ports, _tail

    lay = lab.layout()
    env = lab.slurm_env()
    sync_kc = lab.root / "kube" / SYNC_KUBECONFIG
    if sync_kc.exists():
        env["KUBECONFIG"] = str(sync_kc)  # the chart's ServiceAccount, as a tenant deploys it: never the admin
    old = lab.records().get(name)
    if old and procs.is_alive(old):
        procs.stop(old)
    for _attempt in range(3):
        port = _free_ports(1)[0]
        argv = [sys.executable, "-m", "autoheal.cli.main", "sync", "--metrics-port", str(port), "--log-level",
                "info", *extra]
        rec = procs.spawn(name, argv, lay.path("log", f"{name}.log"), env=env)
        lab._record(rec)
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + wait
        while procs.is_alive(rec) and time.monotonic() < deadline:
            if _healthz(url):
                lab.record_url(name, f"{url}/metrics")
                return rec
            time.sleep(0.1)
        if procs.is_alive(rec):
            procs.stop(rec)
            raise LabError(f"{name} did not serve {url}/healthz within {wait:.0f}s; see {rec.log}: {_tail(rec.log)}")
        if "Address already in use" not in _tail(rec.log, 20):
            raise LabError(f"{name} exited at start; see {rec.log}: {_tail(rec.log)}")
        # another process took the port between our probe and the sync's bind: pick another one
    raise LabError(f"{name}: no free port for its metrics after 3 tries; see {lay.path('log', name + '.log')}")


def _healthz(url: str) -> bool:
    """True once the sync's HTTP server answers (200 or 503: it is listening; the loop may still warm up)."""
    import urllib.error
    import urllib.request

    try:
        with urllib.request.urlopen(f"{url}/healthz", timeout=1) as resp:
            return resp.status in (200, 503)
    except urllib.error.HTTPError as exc:
        return exc.code in (200, 503)
    except OSError:
        return False


def start_pool(lab, delay: float = 1.0) -> procs.ProcRecord:
    """The spare-pool simulator (``python -m autoheal_lab.sparepool``) as a lab process."""
    lay = lab.layout()
    argv = [sys.executable, "-m", "autoheal_lab.sparepool", "--dir", str(lab.root), "--delay", str(delay)]
    rec = procs.spawn(POOL_PROC, argv, lay.path("log", f"{POOL_PROC}.log"), env=lab.slurm_env())
    lab._record(rec)
    return rec


def status(lab) -> Dict[str, Any]:
    """Nodes with cordon, remediation state and GPUHealthy condition; NodeReplacements."""
    from kubernetes import client
    from kubernetes import config as kconfig

    cfg = client.Configuration()
    kconfig.load_kube_config(config_file=str(kubeconfig_path(lab)), client_configuration=cfg)
    api = client.ApiClient(cfg)
    core = client.CoreV1Api(api)
    nodes = []
    for n in api.sanitize_for_serialization(core.list_node()).get("items", []):
        meta = n["metadata"]
        ann = meta.get("annotations") or {}
        conds = {c["type"]: c for c in (n.get("status") or {}).get("conditions") or []}
        nodes.append({"name": meta["name"], "unschedulable": bool((n.get("spec") or {}).get("unschedulable")),
                      "ready": (conds.get("Ready") or {}).get("status"),
                      "gpu_healthy": (conds.get("GPUHealthy") or {}).get("status", ""),
                      "remediation": ann.get("autoheal.io/remediation-state", ""),
                      "remediation_reason": ann.get("autoheal.io/remediation-reason", "")})
    crs = client.CustomObjectsApi(api).list_namespaced_custom_object("autoheal.io", "v1alpha1", NAMESPACE,
                                                                      "nodereplacements").get("items", [])
    return {"kubeconfig": str(kubeconfig_path(lab)), "nodes": nodes,
            "replacements": [{"name": c["metadata"]["name"], "status": c.get("status") or {}} for c in crs]}
