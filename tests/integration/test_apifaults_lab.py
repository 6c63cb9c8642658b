"""The fault proxy (autoheal_lab.apifaults) in front of the real kube-apiserver: untouched it answers as the
server does, with the client's own credentials (a ServiceAccount token passed on, a lab client certificate
by impersonation); told a fault, the sync's adapter sees what an overloaded server gives (429 with
Retry-After, 5xx, a slow answer, a dropped connection, a watch cut mid-stream) and nothing that tells it
apart. Its control path answers only the lab's admin."""

from __future__ import annotations

import json

import pytest
from helpers import wait_for

from autoheal.k8s_sync.kube import KubeApi, KubeError
from autoheal_lab import apifaults, controlplane

pytest.importorskip("kubernetes")


@pytest.fixture(scope="module")
def proxy(control_plane):
    p = apifaults.for_control_plane(control_plane).start()
    yield p
    p.stop()


@pytest.fixture(scope="module")
def admin(control_plane):
    from kubernetes import client
    from kubernetes import config as kconfig

    cfg = client.Configuration()
    kconfig.load_kube_config(config_file=str(control_plane.kubeconfig), client_configuration=cfg)
    return client.CoreV1Api(client.ApiClient(cfg))


def _kubeconfig(path, server, ca, user):
    path.write_text(json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": "t",
        "clusters": [{"name": "t", "cluster": {"server": server, "certificate-authority": str(ca)}}],
        "users": [{"name": "t", "user": user}], "contexts": [{"name": "t", "context": {"cluster": "t", "user": "t"}}]}))
    return str(path)


@pytest.fixture(scope="module")
def nobody_token(admin):
    """A token of a ServiceAccount that may do nothing: what the real server answers it names it."""
    from kubernetes.client import ApiException

    try:
        admin.create_namespaced_service_account("default", {"metadata": {"name": "nobody"}})
    except ApiException as exc:
        if exc.status != 409:
            raise
    return admin.create_namespaced_service_account_token("nobody", "default", {"spec": {}}).status.token


def _node(admin, name):
    from kubernetes.client import ApiException

    try:
        admin.create_node({"metadata": {"name": name}})
    except ApiException as exc:
        if exc.status != 409:
            raise


def via_proxy(tmp_path, proxy, control_plane, timeout=5.0, token=None):
    pki = control_plane.root / "pki"
    user = {"token": token} if token else {"client-certificate": str(pki / "admin.crt"),
                                          "client-key": str(pki / "admin.key")}
    return KubeApi.from_settings(_kubeconfig(tmp_path / "kc", proxy.url, control_plane.ca, user), timeout=timeout)


def test_untouched_requests_reach_the_real_server_with_the_clients_own_credentials(
        proxy, control_plane, admin, nobody_token, tmp_path):
    _node(admin, "pf-1")
    k = via_proxy(tmp_path, proxy, control_plane)  # the lab admin's certificate: impersonated
    nodes, rv = k.list_nodes()
    assert "pf-1" in nodes and rv
    k.patch_node("pf-1", {"metadata": {"labels": {"via": "proxy"}}})
    assert admin.read_node("pf-1").metadata.labels["via"] == "proxy"
    # the token is passed on as it came: the real server authenticates it and refuses what RBAC refuses
    nobody = via_proxy(tmp_path, proxy, control_plane, token=nobody_token)
    with pytest.raises(KubeError) as err:
        nobody.list_nodes()
    assert err.value.status == 403 and 'User "system:serviceaccount:default:nobody"' in str(err.value)
    # the writes went to the real server as the admin (the proxy impersonates; the audit log says who)
    from autoheal_lab.realkube import parse_audit

    wait_for(lambda: any(r["method"] == "PATCH" and r["path"] == "/api/v1/nodes/pf-1"
                         and r["user"] == controlplane.ADMIN_USER for r in parse_audit(control_plane.audit_log)),
             10, "the proxied patch in the audit log")


def test_overload_answers_are_the_real_servers_words(proxy, control_plane, tmp_path):
    k = via_proxy(tmp_path, proxy, control_plane)
    rule = proxy.rules.add(method="PATCH", path_regex=r"^/api/v1/nodes/pf-1$", status=429, retry_after=1, times=1)
    with pytest.raises(KubeError) as err:
        k.patch_node("pf-1", {"metadata": {"labels": {"x": "1"}}})
    assert (err.value.status, err.value.retry_after) == (429, 1.0)
    assert "Too many requests, please try again later." in str(err.value)
    assert rule.hits == 1
    k.patch_node("pf-1", {"metadata": {"labels": {"x": "1"}}})  # spent: the next one is the real server's
    # a GET (an idempotent method) with Retry-After is retried inside the client (urllib3 honours
    # Retry-After on 429/503, 3 times by default): the caller sees the answer after the overload
    rule = proxy.rules.add(method="GET", path_regex=r"^/api/v1/nodes$", status=429, retry_after=1, times=1)
    assert "pf-1" in k.list_nodes()[0]
    assert rule.hits == 1
    proxy.rules.add(method="PATCH", status=503, times=1)
    with pytest.raises(KubeError, match="HTTP 503: the server is currently unable"):
        k.patch_node("pf-1", {"metadata": {"labels": {"x": "2"}}})


def test_slow_and_vanished_answers_are_timeouts_and_resets(proxy, control_plane, admin, tmp_path):
    _node(admin, "pf-2")
    k = via_proxy(tmp_path, proxy, control_plane, timeout=0.5)
    proxy.rules.add(method="PATCH", path_regex="/nodes/pf-2$", latency_ms=1500, times=1)
    with pytest.raises(KubeError) as err:
        k.patch_node("pf-2", {"metadata": {"labels": {"slow": "yes"}}})
    assert err.value.status == 0  # no answer in time
    # a slow server still does the work: the write lands after the client gave up
    wait_for(lambda: (admin.read_node("pf-2").metadata.labels or {}).get("slow") == "yes", 10, "the late write")
    proxy.rules.add(method="PATCH", path_regex="/nodes/pf-2$", disconnect=True, times=1)
    with pytest.raises(KubeError) as err:
        k.patch_node("pf-2", {"metadata": {"labels": {"gone": "yes"}}})
    assert err.value.status == 0  # the connection closed with no answer
    # a GET whose connection vanished is sent again by the client itself (urllib3's default retries)
    rule = proxy.rules.add(method="GET", path_regex=r"^/api/v1/nodes$", disconnect=True, times=1)
    assert "pf-2" in k.list_nodes()[0]
    assert rule.hits == 1


def test_a_watch_cut_mid_stream_is_resumed_by_the_informer(proxy, control_plane, admin, tmp_path):
    from autoheal.k8s_sync.informer import Informer

    _node(admin, "pf-3")
    k = via_proxy(tmp_path, proxy, control_plane)
    rule = proxy.rules.add(watch=True, path_regex=r"^/api/v1/nodes$", drop_after_ms=300, times=1)
    inf = Informer("nodes", k.list_nodes, k.watch_nodes, timeout=30)
    inf.start()
    try:
        wait_for(lambda: rule.hits == 1, 10, "the first watch through the proxy")
        wait_for(lambda: k.calls.get("watch_nodes", 0) >= 2, 15, "a second watch after the cut")
        admin.patch_node("pf-3", {"metadata": {"labels": {"after": "cut"}}})
        wait_for(lambda: ((inf.snapshot().get("pf-3") or {}).get("metadata", {}).get("labels") or {}).get("after")
                 == "cut", 15, "the change after the cut")
    finally:
        inf.stop()


def test_the_control_path_is_the_lab_admins_only(proxy, control_plane, nobody_token, tmp_path):
    pki = control_plane.root / "pki"
    ctl = apifaults.Control(proxy.url, pki / "ca.crt", pki / "admin.crt", pki / "admin.key")
    added = ctl.add(method="DELETE", path_regex="^/api/v1/nodes/", status=500, times=1)
    assert [r["id"] for r in ctl.rules()] == [r.id for r in proxy.rules.rules()] and added["status"] == 500
    ctl.remove(added["id"])
    assert all(r.id != added["id"] for r in proxy.rules.rules())
    # anyone else's request for that path is the real server's to answer (it serves no such path)
    import urllib.error
    import urllib.request

    req = urllib.request.Request(proxy.url + apifaults.CONTROL_PATH, method="POST", data=b'{"status": 500}',
                                 headers={"Authorization": f"Bearer {nobody_token}"})
    import ssl

    with pytest.raises(urllib.error.HTTPError) as err:
        urllib.request.urlopen(req, timeout=10, context=ssl.create_default_context(cafile=str(pki / "ca.crt")))
    assert err.value.code in (403, 404)
    assert all(r.status != 500 or r.id == added["id"] for r in proxy.rules.rules())
    ctl.clear()
    assert proxy.rules.rules() == []
