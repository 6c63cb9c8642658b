"""A real control plane for the sync tests that need an API server but no lab's Kubernetes side (no chart,
no sync process): etcd + kube-apiserver + kube-controller-manager from ``autoheal_lab.controlplane``,
with ``requests`` in the shape the fake server's request log had (read from the real audit log, which
keeps writes only: the tests compare writes)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Dict, List, Optional

from autoheal_lab import controlplane


class RealKube:
    """A started control plane; ``stop()`` ends its processes by PID."""

    def __init__(self, cp: controlplane.ControlPlane):
        self.cp = cp
        self.kubeconfig = str(cp.kubeconfig)
        self.url = cp.server

    @classmethod
    def start(cls, root: Path, bindir: Optional[Path] = None) -> RealKube:
        from autoheal_lab.cluster import _free_ports

        bindir = bindir or controlplane.ensure_binaries()
        return cls(controlplane.start(bindir, Path(root), _free_ports(3)))

    def write_kubeconfig(self, path: str) -> str:
        Path(path).write_text(Path(self.kubeconfig).read_text())
        Path(path).chmod(0o600)
        return path

    @property
    def requests(self) -> List[Dict[str, Any]]:
        """Every write the API server answered so far, as the lab's own admin (the tests' client and the
        sync they start), oldest first: method, path, status, user. Writes of the controllers (ServiceAccount
        tokens, PDB status, ...) are left out: they are not the test's."""
        from autoheal_lab.realkube import parse_audit

        return [r for r in parse_audit(self.cp.audit_log) if r["user"] == controlplane.ADMIN_USER]

    def api_client(self) -> Any:
        from kubernetes import client
        from kubernetes import config as kconfig

        cfg = client.Configuration()
        kconfig.load_kube_config(config_file=self.kubeconfig, client_configuration=cfg)
        return client.ApiClient(cfg)

    def stop(self) -> None:
        self.cp.stop()
