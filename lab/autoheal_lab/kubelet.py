"""The lab's kubelets: one process that does, for every Node of the lab's real API server, the parts of a
kubelet's job that the API can see (the lab has no container runtime, so no kubelet runs):

- a Node registered without a Ready condition (a spare brought up by a replacement provider that only
  created the Node) gets one, posted through ``nodes/status`` as a kubelet's status manager does;
- a pod bound to a Ready Node (``spec.nodeName``; nothing schedules here) that is still ``Pending`` is
  "started": ``pods/status`` gets phase Running and the Ready, ContainersReady, Initialized and
  PodScheduled conditions, with a running status per container (the disruption controller counts a pod
  healthy only when Ready=True);
- a pod being deleted (an eviction or a delete set ``deletionTimestamp``) on a Ready Node is finished as
  the kubelet finishes it once its containers stopped: deleted with grace period 0 (UID precondition, so
  a pod re-created under the same name is never touched). Without this, a graceful delete of a bound pod
  stays Terminating forever.

And one part of kube-controller-manager's node-lifecycle controller (not run here: it needs kubelet
heartbeats): the API server's TaintNodesByCondition admission gives every new Node the taint
``node.kubernetes.io/not-ready:NoSchedule``; once the Node is Ready that controller removes it, and so does
this process (a resourceVersion-guarded patch that keeps every other taint).

What it does not do, as a real cluster would not: a pod on a Node that is not Ready (its kubelet gone:
the spare pool marks a retired machine Unknown) stays Terminating; once that Node is deleted, the pod is
an orphan and is force-deleted as kube-controller-manager's pod-GC does (the lab does not run pod-GC:
its other job, deleting pods of Nodes it thinks are gone, needs kubelet heartbeats nobody posts).

``python -m autoheal_lab.kubelet --kubeconfig FILE`` (started by ``autoheal lab up --kube``).
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from datetime import datetime, timezone
from typing import Any, Dict, Optional

Obj = Dict[str, Any]
NOT_READY_TAINT = "node.kubernetes.io/not-ready"


def _now() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def node_ready(node: Obj) -> Optional[str]:
    """The Node's Ready condition status ("True", "False", "Unknown") or None when it has none."""
    for cond in (node.get("status") or {}).get("conditions") or []:
        if cond.get("type") == "Ready":
            return cond.get("status")
    return None


def ready_node_status() -> Obj:
    now = _now()
    return {"status": {"conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady",
                                       "message": "kubelet is posting ready status",
                                       "lastHeartbeatTime": now, "lastTransitionTime": now}]}}


def running_pod_status(pod: Obj) -> Obj:
    """What a kubelet posts once every container of ``pod`` runs."""
    now = _now()
    conds = [{"type": t, "status": "True", "lastTransitionTime": now}
             for t in ("PodScheduled", "Initialized", "ContainersReady", "Ready")]
    containers = [{"name": c.get("name", ""), "image": c.get("image", ""), "imageID": "", "ready": True,
                   "restartCount": 0, "started": True, "state": {"running": {"startedAt": now}}}
                  for c in (pod.get("spec") or {}).get("containers") or []]
    return {"status": {"phase": "Running", "startTime": now, "conditions": conds, "containerStatuses": containers,
                       "hostIP": "127.0.0.1", "podIP": "127.0.0.1"}}


def without_not_ready_taint(node: Obj) -> Obj:
    """A merge patch dropping the not-ready taint, guarded by the Node's resourceVersion (a 409 when
    someone changed the taints meanwhile: the next pass looks again)."""
    taints = [t for t in (node.get("spec") or {}).get("taints") or [] if t.get("key") != NOT_READY_TAINT]
    return {"metadata": {"resourceVersion": (node.get("metadata") or {}).get("resourceVersion")},
            "spec": {"taints": taints or None}}


def plan(nodes: Dict[str, Obj], pods: list) -> Dict[str, list]:
    """What to do this pass (pure, unit-tested): Nodes to mark Ready, pods to start, pods to finish."""
    out: Dict[str, list] = {"register": [], "start": [], "finish": [], "untaint": []}
    for name, node in nodes.items():
        if node_ready(node) is None:
            out["register"].append(name)
        elif node_ready(node) == "True" and any(t.get("key") == NOT_READY_TAINT
                                                for t in (node.get("spec") or {}).get("taints") or []):
            out["untaint"].append(name)
    for pod in pods:
        meta, spec = pod.get("metadata") or {}, pod.get("spec") or {}
        bound = spec.get("nodeName")
        if not bound:
            continue
        node = nodes.get(bound)
        ready = node is not None and node_ready(node) in ("True", None)
        key = (meta.get("namespace", ""), meta.get("name", ""), meta.get("uid", ""))
        if meta.get("deletionTimestamp"):
            if ready or node is None:  # its kubelet finishes it; an orphan goes as pod-GC deletes it
                out["finish"].append(key)
        elif ready and (pod.get("status") or {}).get("phase") in (None, "", "Pending"):
            out["start"].append((key, pod))
    return out


class Kubelets:
    def __init__(self, kubeconfig: str):
        from kubernetes import client
        from kubernetes import config as kconfig

        cfg = client.Configuration()
        kconfig.load_kube_config(config_file=kubeconfig, client_configuration=cfg)
        self.api = client.ApiClient(cfg)
        self.core = client.CoreV1Api(self.api)
        self.client = client
        self.stop = threading.Event()

    def step(self) -> None:
        ser = self.api.sanitize_for_serialization
        nodes = {n["metadata"]["name"]: n for n in ser(self.core.list_node()).get("items", [])}
        pods = ser(self.core.list_pod_for_all_namespaces()).get("items", [])
        todo = plan(nodes, pods)
        for name in todo["register"]:
            print(f"kubelet {name}: registered, posting Ready", flush=True)
            self.core.patch_node_status(name, ready_node_status())
        for name in todo["untaint"]:
            print(f"node-lifecycle: {name} is Ready, removing its {NOT_READY_TAINT} taint", flush=True)
            self._ignore_gone(self.core.patch_node, name, without_not_ready_taint(nodes[name]))
        for (ns, name, _uid), pod in todo["start"]:
            print(f"kubelet {pod['spec']['nodeName']}: started {ns}/{name}", flush=True)
            self._ignore_gone(self.core.patch_namespaced_pod_status, name, ns, running_pod_status(pod))
        for ns, name, uid in todo["finish"]:
            print(f"kubelet: {ns}/{name} stopped, deleting it (grace 0)", flush=True)
            body = self.client.V1DeleteOptions(grace_period_seconds=0,
                                               preconditions=self.client.V1Preconditions(uid=uid))
            self._ignore_gone(self.core.delete_namespaced_pod, name, ns, body=body)

    def _ignore_gone(self, call, *args, **kwargs) -> None:
        try:
            call(*args, **kwargs)
        except self.client.ApiException as exc:
            if exc.status not in (404, 409):  # gone already, or another pod now holds the name
                raise

    def run(self, poll: float = 0.3) -> None:
        while not self.stop.is_set():
            try:
                self.step()
            except Exception as exc:  # the API server restarting: try again
                print(f"kubelet: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
            self.stop.wait(poll)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m autoheal_lab.kubelet", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--kubeconfig", required=True, help="kubeconfig of the lab's API server")
    p.add_argument("--poll", type=float, default=0.3, help="seconds between passes (default 0.3)")
    args = p.parse_args(argv)
    kubelets = Kubelets(args.kubeconfig)
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: kubelets.stop.set())
    kubelets.run(args.poll)
    return 0


if __name__ == "__main__":
    sys.exit(main())
