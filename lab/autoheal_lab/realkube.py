"""The lab's real Kubernetes side (``autoheal lab up --kube``): the control plane, the sync's Helm chart, the
lab's Nodes and slurmd pods, the lab's kubelets, and the sync's own credentials.

In order:

1. ``autoheal_lab.controlplane`` starts etcd, kube-apiserver and kube-controller-manager (built once per
   machine from Go modules); each is a lab process recorded by PID in lab.json with its port, so ``lab
   status`` shows them and ``lab down`` stops them. etcd starts empty unless ``keep_state``.
2. The sync's Helm chart (``k8s_sync/deploy/chart/autoheal-sync``) is installed with the real ``helm``
   into namespace ``slurm``, its Deployment at 0 replicas: no kubelet here runs containers, the lab runs
   ``autoheal sync`` itself. Helm installs the chart's CRDs (NodeReplacement) first; the lab waits until
   the API server serves them (Established).
3. The lab plays the kubelets: each lab node's Node is registered (status through ``nodes/status``) and
   its slurmd pod created bound (``spec.nodeName``) and started (``pods/status`` Running, Ready). Pods
   need the namespace's ``default`` ServiceAccount: ServiceAccount admission stays on (a real cluster has
   it; envtest turns it off), so the lab waits for the serviceaccount controller to make it. From then on
   ``autoheal_lab.kubelet`` (a lab process) starts and finishes pods as kubelets would.
4. A token for the chart's ServiceAccount (TokenRequest) goes into ``<lab>/kube/sync.kubeconfig``; the
   lab's ``autoheal sync`` processes use it, so every call they make is one the chart's RBAC allows.
   Its server is ``autoheal_lab.apifaults`` (a lab process), a fault-injecting HTTPS proxy in front of the
   real API server that passes the token on: it answers as the real server does until it is told a window
   of 5xx / 429 / slow answers / dropped watches (the soak's API faults; ``fault_control``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional

from autoheal_lab import controlplane, procs
from autoheal_lab.kube import KUBELET_PROC, NAMESPACE, SYNC_KUBECONFIG, kubeconfig_path, node_obj, slurmd_pod

CHART = Path(__file__).resolve().parents[2] / "k8s_sync" / "deploy" / "chart" / "autoheal-sync"
RELEASE = "autoheal-sync"
#: The chart's CRDs (``crds/``), as "<plural>.<group>"; the lab waits for each to be served.
CHART_CRDS = ("nodereplacements.autoheal.io",)
#: The sync's token lifetime: longer than any lab run (a real deployment's projected token is rotated).
TOKEN_SECONDS = 7 * 86400
_HELM_TIMEOUT = 180.0


class KubeLabError(RuntimeError):
    """The real Kubernetes side could not start; the message says what and where to look."""


def _say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def start(lab, keep_state: bool = False, progress: Optional[Callable[[str], None]] = _say,
          wait: float = 120.0) -> str:
    """Steps 1-4 above. Returns the path of the lab's (admin) kubeconfig."""
    from autoheal_lab.cluster import LabError, _free_ports

    why = controlplane.missing_toolchain()
    if why:
        raise LabError(why)
    try:
        bindir = controlplane.ensure_binaries(progress=progress)
    except controlplane.ControlPlaneError as exc:
        raise LabError(str(exc)) from None
    lay = lab.layout()
    kdir = lab.root / "kube"
    kdir.mkdir(parents=True, exist_ok=True)
    try:
        cp = controlplane.start(bindir, kdir / "controlplane", _free_ports(3), keep_state=keep_state,
                                log_dir=lay.path("log"), timeout=wait)
    except controlplane.ControlPlaneError as exc:
        raise LabError(str(exc)) from None
    for rec in cp.records:
        lab._record(rec)
    kc = kubeconfig_path(lab)
    kc.write_text(cp.kubeconfig.read_text())
    os.chmod(kc, 0o600)
    with lab.edit_state() as st:
        st["kubeconfig"] = str(kc)
        st["kube_api"] = "real"
        st.setdefault("ports", {}).update(cp.ports)
        st["kube"] = {"server": cp.server, "ca": str(cp.ca), "audit_log": str(cp.audit_log),
                      "bindir": str(bindir)}
    try:
        install_chart(lab, bindir, kc)
        api = _client(kc)
        wait_crds(api, CHART_CRDS, wait)
        wait_default_service_account(api, NAMESPACE, wait)
        register_nodes(api, lay.nodes + lab._spares_in_service(lay))
        faults_url = start_fault_proxy(lab, cp, wait)
        write_sync_kubeconfig(lab, api, faults_url, cp.ca)
    except Exception as exc:
        if isinstance(exc, LabError):
            raise
        raise LabError(f"the lab's Kubernetes side did not start: {type(exc).__name__}: {exc}") from None
    rec = procs.spawn(KUBELET_PROC, [sys.executable, "-m", "autoheal_lab.kubelet", "--kubeconfig", str(kc)],
                      lay.path("log", f"{KUBELET_PROC}.log"), env=lab.slurm_env())
    lab._record(rec)
    return str(kc)


def start_fault_proxy(lab, cp: controlplane.ControlPlane, timeout: float) -> str:
    """``autoheal_lab.apifaults`` in front of the API server as a lab process (the soak's API fault windows);
    the sync's kubeconfig points at it, so the sync meets an overloaded server only where one is told.
    Returns its URL (also in lab.json: ``kube.faults_url``, and its port under ``ports``)."""
    from autoheal_lab.apifaults import PROXY_PROC

    lay = lab.layout()
    port_file = lab.root / "kube" / "api-faults.port"
    port_file.unlink(missing_ok=True)
    rec = procs.spawn(PROXY_PROC, [sys.executable, "-m", "autoheal_lab.apifaults", "--upstream", cp.server,
                                   "--pki", str(cp.root / "pki"), "--port-file", str(port_file)],
                      lay.path("log", f"{PROXY_PROC}.log"), env=dict(os.environ))
    lab._record(rec)
    _wait(f"{PROXY_PROC} to listen", lambda: port_file.exists() or not procs.is_alive(rec), timeout)
    if not port_file.exists():
        raise KubeLabError(f"{PROXY_PROC} exited at start; see {rec.log}")
    port = int(port_file.read_text().strip())
    url = f"https://127.0.0.1:{port}"
    with lab.edit_state() as st:
        st.setdefault("ports", {})[PROXY_PROC] = port
        st.setdefault("kube", {})["faults_url"] = url
    return url


def fault_control(lab) -> Any:
    """An ``apifaults.Control`` for this lab's proxy (the lab admin's certificate)."""
    from autoheal_lab.apifaults import Control

    st = lab.load_state() or {}
    pki = Path(st["kube"]["ca"]).parent
    return Control(st["kube"]["faults_url"], pki / "ca.crt", pki / "admin.crt", pki / "admin.key")


def helm_env(lab) -> Dict[str, str]:
    """helm's caches and config under the lab (never the user's ~/.cache/helm or ~/.config/helm)."""
    base = lab.root / "kube" / "helm"
    return dict(os.environ, HELM_CACHE_HOME=str(base / "cache"), HELM_CONFIG_HOME=str(base / "config"),
                HELM_DATA_HOME=str(base / "data"))


def helm(lab, bindir: Path, *args: str, timeout: float = _HELM_TIMEOUT) -> subprocess.CompletedProcess:
    return subprocess.run([str(bindir / "helm"), *args], env=helm_env(lab), capture_output=True, text=True,
                          timeout=timeout)


def chart_values(lab) -> List[str]:
    """``--set`` values that give the chart's ServiceAccount the features the lab's sync runs with (its
    RBAC is rendered per feature: remediation's rules only when remediation is on)."""
    from autoheal.config import load_config

    sync = load_config(lab.layout().autoheal_conf).sync
    remediating = "remediate" in sync.enabled_steps
    sets = ["replicas=0", f"remediation.enabled={str(remediating).lower()}",
            f"nodesToSlurm={str('nodes-to-slurm' in sync.enabled_steps).lower()}"]
    if remediating:
        sets.append(f"remediation.replacementAction={sync.replacement_action}")
    return sets


def install_chart(lab, bindir: Path, kubeconfig: Path) -> None:
    """``helm upgrade --install`` of the sync's chart into namespace slurm, its Deployment at 0 replicas
    (upgrade: a --keep-state lab already has the release), with the lab's sync features."""
    sets = [arg for value in chart_values(lab) for arg in ("--set", value)]
    res = helm(lab, bindir, "upgrade", "--install", RELEASE, str(CHART), "--namespace", NAMESPACE,
               "--create-namespace", "--kubeconfig", str(kubeconfig), *sets)
    if res.returncode != 0:
        raise KubeLabError(f"helm install of {CHART} failed: {res.stderr.strip()[-500:]}")


def _client(kubeconfig: Path) -> Any:
    from kubernetes import client
    from kubernetes import config as kconfig

    cfg = client.Configuration()
    kconfig.load_kube_config(config_file=str(kubeconfig), client_configuration=cfg)
    return client.ApiClient(cfg)


def _wait(what: str, pred: Callable[[], Any], timeout: float) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = pred()
        if value:
            return value
        if time.monotonic() > deadline:
            raise KubeLabError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(0.2)


def wait_crds(api: Any, names, timeout: float) -> None:
    from kubernetes import client

    ext = client.ApiextensionsV1Api(api)

    for name in names:
        _wait(f"CRD {name} to be established", lambda n=name: any(
            c.type == "Established" and c.status == "True"
            for c in (ext.read_custom_resource_definition(n).status.conditions or [])), timeout)


def wait_default_service_account(api: Any, namespace: str, timeout: float) -> None:
    """ServiceAccount admission refuses pods until the serviceaccount controller made ``default``."""
    from kubernetes import client

    core = client.CoreV1Api(api)
    _wait(f"ServiceAccount {namespace}/default", lambda: any(
        sa.metadata.name == "default" for sa in core.list_namespaced_service_account(namespace).items), timeout)


def register_nodes(api: Any, nodes: List[str]) -> None:
    """What each node's kubelet does at start: register the Node and post its status, then run the
    slurmd pod bound to it (created by the NodeSet controller in a Slinky cluster) and post that pod's
    status. Objects a --keep-state lab already has are left as they are."""
    from kubernetes import client

    from autoheal_lab.kubelet import ready_node_status, running_pod_status, without_not_ready_taint

    core = client.CoreV1Api(api)
    for name in nodes:
        if _create(core.create_node, node_obj(name)):
            core.patch_node_status(name, ready_node_status())
            # the node-lifecycle controller's part: a Ready Node loses its admission-given not-ready taint
            core.patch_node(name, without_not_ready_taint(api.sanitize_for_serialization(core.read_node(name))))
        pod = slurmd_pod(name)
        pod.pop("status", None)  # a create ignores status: the kubelet posts it
        if _create(core.create_namespaced_pod, NAMESPACE, pod):
            core.patch_namespaced_pod_status(pod["metadata"]["name"], NAMESPACE, running_pod_status(pod))


def _create(call: Callable[..., Any], *args: Any) -> bool:
    """True when created, False when it exists already."""
    from kubernetes.client import ApiException

    try:
        call(*args)
    except ApiException as exc:
        if exc.status == 409:
            return False
        raise
    return True


def write_sync_kubeconfig(lab, api: Any, server: str, ca: Path) -> Path:
    """A kubeconfig holding a token of the chart's ServiceAccount (TokenRequest), for the lab's sync."""
    from kubernetes import client

    core = client.CoreV1Api(api)
    token = core.create_namespaced_service_account_token(
        RELEASE, NAMESPACE, {"spec": {"expirationSeconds": TOKEN_SECONDS}}).status.token
    user = f"system:serviceaccount:{NAMESPACE}:{RELEASE}"
    text = json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": "lab",
        "clusters": [{"name": "lab", "cluster": {"server": server, "certificate-authority": str(ca)}}],
        "users": [{"name": user, "user": {"token": token}}],
        "contexts": [{"name": "lab", "context": {"cluster": "lab", "user": user, "namespace": NAMESPACE}}],
    }, indent=1)
    path = lab.root / "kube" / SYNC_KUBECONFIG
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(text)
    return path


def audit_requests(lab) -> List[Dict[str, Any]]:
    """The real API server's requests so far, from its audit log (every write; reads of clients other than
    the control plane and the lab's admin): method, path, status, user (what the fake server's request log
    gave the tests)."""
    return parse_audit(Path(((lab.load_state() or {}).get("kube") or {}).get("audit_log", "")))


def parse_audit(path: Path) -> List[Dict[str, Any]]:
    """The audit log's events as {method, path, status, user}, oldest first."""
    out = []
    verbs = {"create": "POST", "update": "PUT", "patch": "PATCH", "delete": "DELETE", "deletecollection": "DELETE",
             "get": "GET", "list": "GET", "watch": "GET"}
    try:
        lines = path.read_text(errors="replace").splitlines()
    except OSError:
        return []
    for line in lines:
        try:
            ev = json.loads(line)
        except ValueError:
            continue  # a line being written
        out.append({"method": verbs.get(ev.get("verb", ""), ev.get("verb", "").upper()),
                    "path": (ev.get("requestURI") or "").split("?", 1)[0],
                    "status": (ev.get("responseStatus") or {}).get("code"),
                    "user": (ev.get("user") or {}).get("username", "")})
    return out
