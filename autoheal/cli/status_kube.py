"""The three Kubernetes reads of ``autoheal status`` (Nodes in remediation, the breaker ConfigMap, the
leader Lease), made with the kubeconfig the kubernetes client loads but without its API classes: the
generated API modules of the client (37.x) take seconds to import, longer than status may take in all.
Credentials, TLS and the server come from ``kubernetes.config`` (kubeconfig, exec plugins, in-cluster),
so this works against any API server the sync works against. Read-only GETs, each with a timeout."""

from __future__ import annotations

from typing import Any, Dict, Optional, Tuple


class StatusKube:
    """``list_nodes``, ``get_configmap``, ``get_lease`` of the ``KubeClient`` protocol, read-only."""

    def __init__(self, client_config: Any, timeout: float, node_label: str = "") -> None:
        import requests

        c = client_config
        self.host = str(c.host).rstrip("/")
        self.timeout = timeout
        #: the sync labels every Node it remediates (``<prefix>/remediation``): list only those
        self.node_label = node_label
        self.session = requests.Session()
        # passed with every request, not only set on the session: requests lets $REQUESTS_CA_BUNDLE override
        # a session's verify (and the cluster's CA is not in that bundle)
        self.verify = (c.ssl_ca_cert or True) if c.verify_ssl else False
        self.session.verify = self.verify
        if c.cert_file:
            self.session.cert = (c.cert_file, c.key_file) if c.key_file else c.cert_file
        for setting in (c.auth_settings() or {}).values():
            if setting.get("in") == "header" and setting.get("value"):
                self.session.headers[setting["key"]] = setting["value"]
        self.session.headers["Accept"] = "application/json"

    @classmethod
    def from_settings(cls, kubeconfig: Optional[str], in_cluster: bool, timeout: float,
                      node_label: str = "") -> StatusKube:
        from autoheal.k8s_sync.kube import load_client_config

        return cls(load_client_config(kubeconfig, in_cluster), timeout, node_label)

    def _get(self, what: str, path: str, params: Optional[Dict[str, str]] = None) -> Optional[Dict[str, Any]]:
        from autoheal.k8s_sync.kube import KubeError

        try:
            resp = self.session.get(self.host + path, params=params, timeout=self.timeout, verify=self.verify)
        except Exception as exc:  # connection refused, TLS, timeout: one line naming the read
            raise KubeError(f"{what}: {type(exc).__name__}: {str(exc)[:200]}") from None
        if resp.status_code == 404:
            return None
        if resp.status_code != 200:
            raise KubeError(f"{what}: HTTP {resp.status_code}: {resp.text[:200]}", resp.status_code)
        try:
            body: Dict[str, Any] = resp.json()
        except ValueError:
            raise KubeError(f"{what}: not JSON") from None
        return body

    def list_nodes(self) -> Tuple[Dict[str, Dict[str, Any]], str]:
        params = {"labelSelector": self.node_label} if self.node_label else None
        data = self._get("list nodes", "/api/v1/nodes", params) or {}
        items = data.get("items") or []
        return ({(i.get("metadata") or {}).get("name", ""): i for i in items},
                str((data.get("metadata") or {}).get("resourceVersion", "")))

    def get_configmap(self, namespace: str, name: str) -> Optional[Dict[str, Any]]:
        return self._get("get configmap", f"/api/v1/namespaces/{namespace}/configmaps/{name}")

    def get_lease(self, namespace: str, name: str) -> Optional[Dict[str, Any]]:
        return self._get("get lease", f"/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases/{name}")



