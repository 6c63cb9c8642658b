"""`autoheal status` reads Kubernetes with the kubeconfig alone (autoheal.cli.status_kube: plain GETs, no
generated API classes): against the lab's real kube-apiserver over TLS with the kubeconfig's client
certificate, the Nodes in remediation (label selector), the Lease and the breaker ConfigMap come back as
the sync's client would see them, a missing object is None, and a refused read is a KubeError naming it."""

from __future__ import annotations

import pytest

pytest.importorskip("kubernetes")


def test_status_reads_the_real_api_server_with_the_kubeconfig(control_plane, monkeypatch):
    import certifi
    from kubernetes import client
    from kubernetes import config as kconfig

    from autoheal.cli.status_cmd import read_kube
    from autoheal.cli.status_kube import StatusKube
    from autoheal.cli.status_model import Remediation
    from autoheal.config import parse_config

    cfg = client.Configuration()
    kconfig.load_kube_config(config_file=str(control_plane.kubeconfig), client_configuration=cfg)
    api = client.ApiClient(cfg)
    core = client.CoreV1Api(api)
    core.create_namespace({"metadata": {"name": "slurm"}})
    for name, ann in (("gpu1", {"autoheal.io/remediation-state": "replacing",
                                "autoheal.io/remediation-since": "1800000000",
                                "autoheal.io/remediation-slurm-node": "gpu1"}), ("gpu2", {})):
        labels = {"autoheal.io/remediation": "replacing"} if ann else {}
        core.create_node({"metadata": {"name": name, "labels": labels, "annotations": ann}})
    # a public CA bundle in the environment (as many hosts set it) must not replace the cluster's CA:
    # requests lets $REQUESTS_CA_BUNDLE override a session's verify (seen here: CERTIFICATE_VERIFY_FAILED)
    monkeypatch.setenv("REQUESTS_CA_BUNDLE", certifi.where())
    kube = StatusKube.from_settings(str(control_plane.kubeconfig), False, 10.0, node_label="autoheal.io/remediation")
    # the Lease as the sync writes it (MicroTime with microseconds and Z), posted as JSON: the kubernetes
    # client 37 re-serialises a renewTime string as "+00:00", which the real API server refuses (400)
    resp = kube.session.post(f"{kube.host}/apis/coordination.k8s.io/v1/namespaces/slurm/leases", timeout=10,
                             verify=kube.verify, json={
        "apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": {"name": "autoheal-sync"},
        "spec": {"holderIdentity": "sync_1", "leaseDurationSeconds": 15, "renewTime": "2026-12-01T22:00:00.000000Z"}})
    assert resp.status_code == 201, resp.text
    assert kube.host.startswith("https://")
    nodes, rv = kube.list_nodes()
    assert list(nodes) == ["gpu1"] and rv
    assert kube.get_configmap("slurm", "autoheal-sync-breaker") is None
    assert kube.get_lease("slurm", "autoheal-sync")["spec"]["holderIdentity"] == "sync_1"
    sync = parse_config("").sync
    rem, breaker, lease = read_kube(kube, sync, now=1_800_000_100.0)
    assert rem == {"gpu1": Remediation("replacing", "gpu1", 1_800_000_000.0, "")}
    assert breaker.tripped is False and lease.holder == "sync_1" and lease.expired is True

    from autoheal.k8s_sync.kube import KubeError

    anon = StatusKube(cfg, 10.0)
    anon.session.cert = None  # no client certificate: the real API server refuses the anonymous read
    with pytest.raises(KubeError, match=r"list nodes: HTTP 40[13]"):
        anon.list_nodes()
