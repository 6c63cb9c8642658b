"""The real kubectl against the fake API server: proves the fake matches what the client stack expects."""

import json
import os
import shutil
import subprocess
import threading
import time

import pytest

from autoheal_lab.fakekube import FakeKubeServer
from autoheal_lab.fakekube.testing import make_node, make_pdb, make_pod

KUBECTL = shutil.which("kubectl")
pytestmark = pytest.mark.skipif(KUBECTL is None, reason="kubectl is not installed")


@pytest.fixture
def cluster(tmp_path):
    server = FakeKubeServer().start()
    kubeconfig = server.write_kubeconfig(str(tmp_path / "kubeconfig"))
    server.store.add(make_node("gpu-1", labels={"node-role.kubernetes.io/worker": ""}))
    server.store.add(make_node("gpu-2", ready=False))
    env = dict(os.environ, HOME=str(tmp_path), KUBECONFIG=kubeconfig)
    base = [KUBECTL, "--kubeconfig", kubeconfig, "--cache-dir", str(tmp_path / "cache"), "--request-timeout=10s"]

    def kubectl(*args, timeout=30, check=True):
        proc = subprocess.run(base + list(args), capture_output=True, text=True, timeout=timeout, env=env)
        if check and proc.returncode != 0:
            raise AssertionError(f"kubectl {' '.join(args)} failed ({proc.returncode}): {proc.stderr}")
        return proc

    kubectl.base = base
    kubectl.env = env
    yield server, kubectl
    server.stop()


def test_get_nodes_table_and_json(cluster):
    server, kubectl = cluster
    out = kubectl("get", "nodes").stdout.splitlines()
    assert out[0].split() == ["NAME", "STATUS", "ROLES", "AGE", "VERSION"]
    assert out[1].split()[:3] == ["gpu-1", "Ready", "worker"]
    assert out[2].split()[:3] == ["gpu-2", "NotReady", "<none>"]
    doc = json.loads(kubectl("get", "nodes", "-o", "json").stdout)
    assert [n["metadata"]["name"] for n in doc["items"]] == ["gpu-1", "gpu-2"]
    assert doc["items"][0]["kind"] == "Node"
    assert kubectl("get", "node", "gpu-1", "-o", "jsonpath={.status.nodeInfo.kubeletVersion}").stdout == "v1.32.0"
    assert "Server Version: v1.32.0" in kubectl("version").stdout


def test_cordon_uncordon_label_annotate(cluster):
    server, kubectl = cluster
    assert "cordoned" in kubectl("cordon", "gpu-1").stdout
    assert server.store.get("nodes", "gpu-1")["spec"]["unschedulable"] is True
    assert "Ready,SchedulingDisabled" in kubectl("get", "node", "gpu-1").stdout
    kubectl("uncordon", "gpu-1")
    assert not server.store.get("nodes", "gpu-1")["spec"].get("unschedulable")
    kubectl("label", "node", "gpu-1", "autoheal.io/state=quarantined")
    kubectl("annotate", "node", "gpu-1", "autoheal.io/reason=XID 79")
    meta = server.store.get("nodes", "gpu-1")["metadata"]
    assert meta["labels"]["autoheal.io/state"] == "quarantined"
    assert meta["annotations"]["autoheal.io/reason"] == "XID 79"
    kubectl("label", "node", "gpu-1", "autoheal.io/state-")
    assert "autoheal.io/state" not in server.store.get("nodes", "gpu-1")["metadata"]["labels"]
    assert "gpu-1" in kubectl("get", "nodes", "-l", "node-role.kubernetes.io/worker").stdout


def test_taint_and_remove(cluster):
    server, kubectl = cluster
    kubectl("taint", "nodes", "gpu-1", "autoheal.io/gpu=xid79:NoSchedule")
    kubectl("taint", "nodes", "gpu-1", "other=x:NoExecute")
    taints = server.store.get("nodes", "gpu-1")["spec"]["taints"]
    assert {(t["key"], t["effect"]) for t in taints} == {("autoheal.io/gpu", "NoSchedule"), ("other", "NoExecute")}
    kubectl("taint", "nodes", "gpu-1", "autoheal.io/gpu:NoSchedule-")
    assert server.store.get("nodes", "gpu-1")["spec"]["taints"] == [{"key": "other", "value": "x",
                                                                    "effect": "NoExecute"}]
    kubectl("taint", "nodes", "gpu-1", "other-")
    assert "taints" not in server.store.get("nodes", "gpu-1")["spec"]
    bad = kubectl("taint", "nodes", "gpu-1", "k=v:Sometimes", check=False)
    assert bad.returncode != 0


def test_drain_blocked_by_pdb_then_succeeds(cluster):
    server, kubectl = cluster
    server.store.add(make_pod("job-a", node="gpu-1", labels={"app": "slurmd"}))
    server.store.add(make_pod("other-node", node="gpu-2", labels={"app": "slurmd"}))
    server.store.add({"apiVersion": "apps/v1", "kind": "DaemonSet",
                      "metadata": {"name": "npd", "namespace": "kube-system"},
                      "spec": {"selector": {"matchLabels": {"app": "npd"}},
                               "template": {"metadata": {"labels": {"app": "npd"}},
                                            "spec": {"containers": [{"name": "c", "image": "npd:1"}]}}}})
    server.store.add(make_pod("npd-x", node="gpu-1", namespace="kube-system", owner_kind="DaemonSet",
                              owner_name="npd", labels={"app": "npd"}))
    server.store.add(make_pdb("slurmd", {"app": "slurmd"}, max_unavailable=0))
    blocked = kubectl("drain", "gpu-1", "--ignore-daemonsets", "--delete-emptydir-data", "--timeout=2s",
                      check=False)
    assert blocked.returncode != 0
    assert "Cannot evict pod as it would violate the pod's disruption budget." in blocked.stderr
    assert server.store.find("pods", "job-a", "default") is not None
    assert server.store.get("nodes", "gpu-1")["spec"]["unschedulable"] is True
    kubectl("delete", "pdb", "slurmd")
    done = kubectl("drain", "gpu-1", "--ignore-daemonsets", "--delete-emptydir-data", "--timeout=20s")
    assert "pod/job-a evicted" in done.stdout and "node/gpu-1 drained" in done.stdout
    assert server.store.find("pods", "job-a", "default") is None
    assert server.store.find("pods", "npd-x", "kube-system") is not None  # DaemonSet pods stay
    assert server.store.find("pods", "other-node", "default") is not None
    assert any(r["path"].endswith("/pods/job-a/eviction") and r["status"] == 201 for r in server.requests)


def test_wait_for_ready_after_status_patch(cluster):
    server, kubectl = cluster
    timer = threading.Timer(1.0, lambda: server.store.patch(
        "nodes", "gpu-2", {"status": {"conditions": [{"type": "Ready", "status": "True"}]}}, subresource="status"))
    timer.start()
    out = kubectl("wait", "--for=condition=Ready", "node/gpu-2", "--timeout=5s")
    timer.join()
    assert "condition met" in out.stdout
    slow = kubectl("wait", "--for=condition=Ready=False", "node/gpu-2", "--timeout=1s", check=False)
    assert slow.returncode != 0 and "timed out" in slow.stderr


def test_get_watch_prints_changes(cluster):
    server, kubectl = cluster
    proc = subprocess.Popen(kubectl.base + ["get", "nodes", "-w"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=kubectl.env)
    lines = []
    reader = threading.Thread(target=lambda: lines.extend(iter(proc.stdout.readline, "")), daemon=True)
    reader.start()
    try:
        deadline = time.time() + 10
        while len(lines) < 3 and time.time() < deadline:
            time.sleep(0.05)
        assert lines[0].split()[:2] == ["NAME", "STATUS"]
        server.store.patch("nodes", "gpu-2", {"status": {"conditions": [{"type": "Ready", "status": "True"}]}},
                           subresource="status")
        server.store.patch("nodes", "gpu-1", {"spec": {"unschedulable": True}})
        while len(lines) < 5 and time.time() < deadline:
            time.sleep(0.05)
    finally:
        proc.kill()
        proc.wait()
    assert [line.split()[:2] for line in lines[3:5]] == [["gpu-2", "Ready"], ["gpu-1", "Ready,SchedulingDisabled"]]


def test_custom_resource_create_apply_and_patch_types(cluster, tmp_path):
    server, kubectl = cluster
    manifest = tmp_path / "nr.json"
    manifest.write_text(json.dumps({"apiVersion": "autoheal.io/v1alpha1", "kind": "NodeReplacement",
                                    "metadata": {"name": "replace-gpu-1"}, "spec": {"nodeName": "gpu-1"}}))
    kubectl("create", "-f", str(manifest))
    assert "replace-gpu-1" in kubectl("get", "nodereplacements").stdout
    assert "replace-gpu-1" in kubectl("get", "nrep", "-o", "name").stdout
    manifest.write_text(json.dumps({"apiVersion": "autoheal.io/v1alpha1", "kind": "NodeReplacement",
                                    "metadata": {"name": "replace-gpu-1"}, "spec": {"nodeName": "gpu-3"}}))
    kubectl("apply", "-f", str(manifest))
    assert server.store.get("nodereplacements", "replace-gpu-1", "default")["spec"]["nodeName"] == "gpu-3"
    kubectl("patch", "node", "gpu-1", "--type=json", "-p", '[{"op":"add","path":"/metadata/labels/j","value":"1"}]')
    kubectl("patch", "node", "gpu-1", "--type=merge", "-p", '{"metadata":{"labels":{"m":"1"}}}')
    kubectl("patch", "node", "gpu-1", "--subresource=status", "-p",
            '{"status":{"conditions":[{"type":"GpuHealthy","status":"False"}]}}')
    node = server.store.get("nodes", "gpu-1")
    assert node["metadata"]["labels"]["j"] == "1" and node["metadata"]["labels"]["m"] == "1"
    assert [c["type"] for c in node["status"]["conditions"]] == ["Ready", "GpuHealthy"]
    kubectl("delete", "node", "gpu-2")
    assert server.store.find("nodes", "gpu-2") is None


def test_legacy_discovery_is_enough_for_kubectl(tmp_path):
    """kubectl asks for aggregated discovery; served the plain documents, it falls back and works."""
    with FakeKubeServer(aggregated_discovery=False) as server:
        server.store.add(make_node("gpu-1"))
        kubeconfig = server.write_kubeconfig(str(tmp_path / "kubeconfig"))
        base = [KUBECTL, "--kubeconfig", kubeconfig, "--cache-dir", str(tmp_path / "cache")]
        env = dict(os.environ, HOME=str(tmp_path))
        out = subprocess.run(base + ["get", "nodes,nodereplacements", "-A"], capture_output=True, text=True,
                             timeout=30, env=env)
        assert out.returncode == 0, out.stderr
        assert "node/gpu-1" in out.stdout
        assert any(r["path"] == "/apis/autoheal.io/v1alpha1" for r in server.requests)


def test_imperative_create_sends_protobuf_and_is_decoded(cluster):
    server, kubectl = cluster
    kubectl("create", "namespace", "slurm")
    kubectl("create", "configmap", "cfg", "--from-literal=mode=drain", "-n", "slurm")
    kubectl("create", "secret", "generic", "tok", "--from-literal=t=x", "-n", "slurm")
    assert server.store.get("configmaps", "cfg", "slurm")["data"] == {"mode": "drain"}
    assert server.store.get("secrets", "tok", "slurm")["data"] == {"t": "eA=="}
    assert any(r["content_type"] == "application/vnd.kubernetes.protobuf" for r in server.requests)
    refused = kubectl("create", "deployment", "x", "--image=nginx", "-n", "slurm", check=False)
    assert refused.returncode != 0 and "unknown format" in refused.stderr  # Deployment protobuf: not decoded
