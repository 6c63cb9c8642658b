"""The lab's real control plane (etcd + kube-apiserver + kube-controller-manager built from Go modules):
it starts, the real client talks to it over TLS, and what the fake API server only imitated is real here:
RBAC answers 403 to a ServiceAccount without grants, and an eviction of a pod that a PodDisruptionBudget
protects answers 429 until the disruption controller allows it.

The binaries are built once per machine (lab/kube-tools/build.sh); where Go is missing the tests say so
in one line (and fail under CI, which must have Go)."""

from __future__ import annotations

import pytest
from helpers import wait_for

from autoheal_lab import controlplane


def _api(kubeconfig=None, token=None, server=None, ca=None):
    from kubernetes import client
    from kubernetes import config as kconfig

    cfg = client.Configuration()
    if token:
        cfg.host, cfg.ssl_ca_cert = server, ca
        cfg.api_key = {"authorization": f"Bearer {token}"}
    else:
        kconfig.load_kube_config(config_file=str(kubeconfig), client_configuration=cfg)
    return client.ApiClient(cfg)


def test_the_real_api_server_reports_the_pinned_version(control_plane):
    from kubernetes import client

    info = client.VersionApi(_api(control_plane.kubeconfig)).get_code()
    versions = (controlplane.REPO_TOOLS / "versions.env").read_text()
    assert f"KUBERNETES_VERSION={info.git_version}" in versions


def test_rbac_is_real_a_service_account_without_grants_gets_403(control_plane):
    from kubernetes import client
    from kubernetes.client.rest import ApiException

    api = _api(control_plane.kubeconfig)
    core = client.CoreV1Api(api)
    core.create_namespace({"metadata": {"name": "rbac-probe"}})
    core.create_namespaced_service_account("rbac-probe", {"metadata": {"name": "nobody"}})
    tok = core.create_namespaced_service_account_token(
        "nobody", "rbac-probe", {"spec": {"expirationSeconds": 600}}).status.token
    ca = str(control_plane.root / "pki" / "ca.crt")
    as_sa = client.CoreV1Api(_api(token=tok, server=control_plane.server, ca=ca))
    with pytest.raises(ApiException) as exc:
        as_sa.list_node()
    assert exc.value.status == 403
    with pytest.raises(ApiException) as exc:
        as_sa.list_namespaced_secret("rbac-probe")
    assert exc.value.status == 403


def test_an_eviction_a_pdb_forbids_answers_429_and_goes_through_once_allowed(control_plane):
    from kubernetes import client
    from kubernetes.client.rest import ApiException

    api = _api(control_plane.kubeconfig)
    core, policy = client.CoreV1Api(api), client.PolicyV1Api(api)
    core.create_namespace({"metadata": {"name": "pdb-probe"}})
    # the serviceaccount controller makes "default" (the ServiceAccount admission plugin needs it for pods)
    wait_for(lambda: any(sa.metadata.name == "default"
                         for sa in core.list_namespaced_service_account("pdb-probe").items),
             60, "ServiceAccount default")
    core.create_node({"metadata": {"name": "probe-node"}})
    core.create_namespaced_pod("pdb-probe", {
        "metadata": {"name": "w", "labels": {"app": "w"}},
        "spec": {"nodeName": "probe-node", "containers": [{"name": "c", "image": "x"}]}})
    # no kubelet here: the lab posts the pod's status as a kubelet would
    core.patch_namespaced_pod_status("w", "pdb-probe", {"status": {
        "phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}})
    policy.create_namespaced_pod_disruption_budget("pdb-probe", {
        "metadata": {"name": "w"}, "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": "w"}}}})
    # the disruption controller (kube-controller-manager) computes the PDB's status: 0 disruptions allowed
    def observed(generation):
        status = policy.read_namespaced_pod_disruption_budget("w", "pdb-probe").status
        return status if status is not None and status.observed_generation == generation else None

    assert wait_for(lambda: observed(1), 60, "the PDB status").disruptions_allowed == 0
    eviction = {"metadata": {"name": "w", "namespace": "pdb-probe"}}
    with pytest.raises(ApiException) as exc:
        core.create_namespaced_pod_eviction("w", "pdb-probe", eviction)
    assert exc.value.status == 429
    policy.patch_namespaced_pod_disruption_budget("w", "pdb-probe", {"spec": {"minAvailable": 0}})
    assert wait_for(lambda: observed(2), 60, "the PDB status").disruptions_allowed == 1
    core.create_namespaced_pod_eviction("w", "pdb-probe", eviction)
    pod = core.read_namespaced_pod("w", "pdb-probe")
    assert pod.metadata.deletion_timestamp is not None  # graceful: with no kubelet it waits to be finished
