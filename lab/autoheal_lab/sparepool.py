"""The lab's spare pool: fulfils replacement requests like a cloud node pool, on one machine.

``python -m autoheal_lab.sparepool --dir LAB [--delay S]`` (started by ``autoheal lab up --kube``) watches
for replacement requests, by whichever action the lab's ``sync.replacement_action`` selects:
``custom-resource`` (``autoheal.io/v1alpha1 NodeReplacement`` in namespace ``slurm``) or ``label`` (Node
label ``sync.replacement_label``). After ``--delay`` seconds (provisioning) it takes a free spare and:

1. brings the spare up like every lab node (``Lab.start_node``: its slurmd and xid-watch; the hooks are
   wired in slurm.conf for every node) and registers its Kubernetes Node and slurmd pod;
2. reports the new Node: ``status.replacementNode`` on the NodeReplacement, or the annotation
   ``autoheal.io/replacement-node`` on the old Node (label mode);
3. retires the failed machine: stops its slurmd and xid-watch (``Lab.stop_node``), marks its Node NotReady, deletes
   its slurmd pod, and deletes the Node once ``autoheal sync`` has marked the remediation ``done``.

The Slurm side of the retirement is ``autoheal sync``'s: the old Slurm node stays DRAIN with reason
``autoheal: retired: replaced by spare1``. That is what a statically configured Slurm cluster does with
a machine that left (the name stays in slurm.conf and must not take jobs; DOWN would be overwritten when a
slurmd with that name registers again, a DRAIN with our reason is kept and says why). The spare's spare
drain is resumed by ``autoheal sync`` once its slurmd has registered, so it never takes jobs early.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any, Dict, Optional

from autoheal_lab.kube import NAMESPACE, kubeconfig_path, node_obj, slurmd_pod

USED_FILE = "spares-used.json"


class SparePool:
    def __init__(self, lab, delay: float, action: str, label: str, prefix: str = "autoheal.io"):
        from kubernetes import client
        from kubernetes import config as kconfig

        self.lab = lab
        self.delay = delay
        self.action = action
        self.label_key, _, self.label_value = label.partition("=")
        self.prefix = prefix
        cfg = client.Configuration()
        kconfig.load_kube_config(config_file=str(kubeconfig_path(lab)), client_configuration=cfg)
        self.api = client.ApiClient(cfg)
        self.core = client.CoreV1Api(self.api)
        self.custom = client.CustomObjectsApi(self.api)
        self.client = client
        self.seen: Dict[str, float] = {}  # old Node -> first seen (monotonic)
        self.stop = threading.Event()
        self.used_path = Path(lab.root) / "kube" / USED_FILE

    # ---- bookkeeping ---------------------------------------------------------------------------
    def used(self) -> Dict[str, str]:
        """old Node -> spare it got (persisted: a restarted pool never hands out a spare twice)."""
        try:
            return json.loads(self.used_path.read_text())
        except (OSError, ValueError):
            return {}

    def _mark_used(self, old: str, spare: str) -> None:
        used = self.used()
        used[old] = spare
        tmp = self.used_path.with_suffix(".tmp")
        tmp.write_text(json.dumps(used))
        tmp.replace(self.used_path)

    def free_spare(self) -> Optional[str]:
        taken = set(self.used().values())
        return next((s for s in self.lab.layout().spares if s not in taken), None)

    # ---- requests ------------------------------------------------------------------------------
    def requests(self) -> Dict[str, Dict[str, Any]]:
        """old Node name -> request object, for requests not fulfilled yet."""
        out = {}
        if self.action == "custom-resource":
            items = self.custom.list_namespaced_custom_object("autoheal.io", "v1alpha1", NAMESPACE,
                                                              "nodereplacements").get("items", [])
            for cr in items:
                if not (cr.get("status") or {}).get("replacementNode"):
                    out[(cr.get("spec") or {}).get("nodeName") or cr["metadata"]["name"]] = cr
        else:
            sel = f"{self.label_key}={self.label_value}"
            nodes = self.api.sanitize_for_serialization(self.core.list_node(label_selector=sel))
            for n in nodes.get("items", []):
                if not ((n["metadata"].get("annotations") or {}).get(f"{self.prefix}/replacement-node")):
                    out[n["metadata"]["name"]] = n
        return out

    def step(self) -> None:
        now = time.monotonic()
        for old, req in self.requests().items():
            first = self.seen.setdefault(old, now)
            if now - first < self.delay:
                continue
            spare = self.used().get(old) or self.free_spare()
            if spare is None:
                print(f"spare-pool: no spare left for {old}", flush=True)
                continue
            self.fulfil(old, spare, req)
        self.collect_done()

    def fulfil(self, old: str, spare: str, req: Dict[str, Any]) -> None:
        print(f"spare-pool: replacing {old} with {spare}", flush=True)
        self._mark_used(old, spare)
        self.lab.start_node(spare)  # slurmd and the node daemons (xid-watch), like every lab node
        for body, create in ((node_obj(spare), self.core.create_node),
                             (slurmd_pod(spare), lambda b: self.core.create_namespaced_pod(NAMESPACE, b))):
            try:
                create(body)
            except self.client.ApiException as exc:
                if exc.status != 409:
                    raise
        # the failed machine goes away: slurmd and xid-watch stopped, kubelet gone (NotReady), pod deleted
        self.lab.stop_node(old)
        self.core.patch_node_status(old, {"status": {"conditions": [
            {"type": "Ready", "status": "Unknown", "reason": "NodeStatusUnknown",
             "message": "Kubelet stopped posting node status (retired by the spare pool)."}]}})
        try:
            self.core.delete_namespaced_pod(f"slurmd-{old}", NAMESPACE)
        except self.client.ApiException as exc:
            if exc.status != 404:
                raise
        if self.action == "custom-resource":
            self.custom.patch_namespaced_custom_object_status(
                "autoheal.io", "v1alpha1", NAMESPACE, "nodereplacements", req["metadata"]["name"],
                {"status": {"phase": "Fulfilled", "replacementNode": spare, "replacementSlurmNode": spare}})
        else:
            self.core.patch_node(old, {"metadata": {"annotations": {f"{self.prefix}/replacement-node": spare}}})

    def collect_done(self) -> None:
        """Delete the old Node once autoheal sync marked its remediation done (as a pool deletes the VM)."""
        for old in self.used():
            try:
                node = self.api.sanitize_for_serialization(self.core.read_node(old))
            except self.client.ApiException as exc:
                if exc.status == 404:
                    continue
                raise
            if (node["metadata"].get("annotations") or {}).get(f"{self.prefix}/remediation-state") == "done":
                print(f"spare-pool: {old} retired, deleting its Node", flush=True)
                self.core.delete_node(old)

    def run(self, poll: float = 0.3) -> None:
        while not self.stop.is_set():
            try:
                self.step()
            except Exception as exc:  # the API server restarting, a race with sync: try again
                print(f"spare-pool: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
            self.stop.wait(poll)


def main(argv=None) -> int:
    from autoheal.config import load_config
    from autoheal_lab.cluster import Lab

    p = argparse.ArgumentParser(prog="python -m autoheal_lab.sparepool", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dir", required=True, help="lab directory")
    p.add_argument("--delay", type=float, default=1.0, help="seconds to 'provision' a spare (default 1)")
    args = p.parse_args(argv)
    lab = Lab(Path(args.dir))
    cfg = load_config(lab.layout().autoheal_conf).sync
    pool = SparePool(lab, args.delay, cfg.replacement_action, cfg.replacement_label, cfg.annotation_prefix)
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: pool.stop.set())
    pool.run()
    return 0


if __name__ == "__main__":
    sys.exit(main())
