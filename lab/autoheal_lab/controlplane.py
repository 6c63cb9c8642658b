"""A real Kubernetes control plane for the lab: etcd, kube-apiserver and kube-controller-manager, built from
Go modules by ``lab/kube-tools/build.sh`` (once per machine) and started on loopback as lab processes.

What runs (issue 21; flags as controller-runtime's envtest passes them, ``docs/platform-guide.md``):

- etcd on two free loopback ports, its data under ``<dir>/etcd`` (``--unsafe-no-fsync``: a lab, not a store);
- kube-apiserver with TLS (a lab CA made here with ``openssl``), RBAC authorization, service-account signing
  keys, and client-certificate authentication: the lab itself is ``autoheal-lab-admin`` in
  ``system:masters``, the controller manager ``system:kube-controller-manager``;
- kube-controller-manager with only the controllers the lab's flows need: ``disruption`` (PDB status, which
  eviction reads), ``serviceaccount`` and its tokens, ``namespace``, the garbage collector and the root-CA
  publisher.
  Each controller runs under its own ServiceAccount (``--use-service-account-credentials``, as in a real
  cluster: the bootstrap ``system:controller:*`` roles grant them what they need). Not node-lifecycle nor
  pod-GC: nothing posts kubelet heartbeats here, and pod-GC deletes pods bound to Nodes it thinks are gone.

Nothing here imports the ``kubernetes`` client: the caller talks to the API server through the kubeconfig.
"""

from __future__ import annotations

import os
import shutil
import ssl
import subprocess
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional, Sequence

from autoheal_lab import procs

ETCD, APISERVER, KCM = "etcd", "kube-apiserver", "kube-controller-manager"
BINARIES = (ETCD, APISERVER, KCM, "helm")
ADMIN_USER = "autoheal-lab-admin"
#: Controllers the lab needs (names as kube-controller-manager 1.37's --controllers takes them).
CONTROLLERS = ("disruption-controller,serviceaccount-controller,serviceaccount-token-controller,namespace-controller,"
               "garbage-collector-controller,root-ca-certificate-publisher-controller")
SERVICE_CIDR = "10.0.0.0/24"
_OPENSSL_TIMEOUT = 30.0
_BUILD_TIMEOUT = 3600.0
REPO_TOOLS = Path(__file__).resolve().parents[2] / "lab" / "kube-tools"


class ControlPlaneError(RuntimeError):
    """The control plane could not be built or started; the message names what and where to look."""


def build_script() -> Path:
    """``lab/kube-tools/build.sh`` of the source checkout (the lab runs from one: it is never installed)."""
    env = os.environ.get("AUTOHEAL_KUBE_TOOLS")
    return Path(env) / "build.sh" if env else REPO_TOOLS / "build.sh"


def _cached() -> bool:
    """Whether every binary of the pinned versions is already in the cache (then Go is not needed: e.g. a
    chroot of .ci/slurm-chroot, which mounts the host's cache)."""
    try:
        return all(os.access(cached_bindir() / name, os.X_OK) for name in BINARIES)
    except (OSError, KeyError):
        return False


def missing_toolchain() -> Optional[str]:
    """One line naming what to install when the control plane cannot be built (or found built) here, else
    None."""
    if shutil.which("go") is None and not _cached():
        return "Go is not installed: install Go 1.26 or newer (and reach the Go module proxy) for the control plane"
    if shutil.which("openssl") is None:
        return "openssl is not installed: apt-get install openssl"
    if not build_script().is_file():
        return f"{build_script()} is missing: run the lab from a source checkout"
    return None


def cached_bindir() -> Path:
    """Where ``build.sh`` puts (or has put) the binaries of the pinned versions; nothing is built here."""
    pins = {}
    for line in (build_script().parent / "versions.env").read_text().splitlines():
        key, sep, value = line.partition("=")
        if sep and not key.lstrip().startswith("#"):
            pins[key.strip()] = value.strip()
    root = Path(os.environ.get("AUTOHEAL_KUBE_TOOLS_CACHE") or Path.home() / ".cache" / "autoheal" / "kube-tools")
    key = f"k8s-{pins['KUBERNETES_VERSION']}_etcd-{pins['ETCD_VERSION']}_helm-{pins['HELM_VERSION']}"
    return root / key / "bin"


def ensure_binaries(progress=None) -> Path:
    """Build (first time on this machine) or find the binaries; returns their directory.

    The build's own progress lines (which binary, seconds) go to ``progress`` (a callable taking a line) as
    they come, so a first build of many minutes is never silent."""
    why = missing_toolchain()
    if why:
        raise ControlPlaneError(why)
    if _cached():
        return cached_bindir()
    proc = subprocess.Popen(["bash", str(build_script())], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    assert proc.stderr is not None and proc.stdout is not None
    deadline = time.monotonic() + _BUILD_TIMEOUT
    err_tail: List[str] = []
    for line in proc.stderr:
        err_tail = (err_tail + [line.rstrip()])[-20:]
        if progress is not None:
            progress(line.rstrip())
        if time.monotonic() > deadline:
            proc.kill()
            break
    out = proc.stdout.read()
    if proc.wait(timeout=60) != 0:
        raise ControlPlaneError("building the control plane failed: " + " | ".join(err_tail[-5:]))
    bindir = Path(out.strip().splitlines()[-1])
    for name in BINARIES:
        if not os.access(bindir / name, os.X_OK):
            raise ControlPlaneError(f"the build left no {name} in {bindir}")
    return bindir


# --- the lab's PKI --------------------------------------------------------------------------------------------

def _openssl(*args: str, cwd: Path) -> None:
    res = subprocess.run(["openssl", *args], cwd=cwd, capture_output=True, text=True, timeout=_OPENSSL_TIMEOUT)
    if res.returncode != 0:
        raise ControlPlaneError(f"openssl {args[0]} failed: {res.stderr.strip()[-300:]}")


def make_pki(pki: Path) -> None:
    """A CA, the API server's serving certificate, client certificates for the lab admin and the
    controller manager, and the service-account key pair. Made once per control-plane directory."""
    pki.mkdir(parents=True, exist_ok=True)
    os.chmod(pki, 0o700)
    if (pki / "sa.pub").exists():
        return
    # keyUsage on the CA: Python 3.13+ verifies with VERIFY_X509_STRICT by default, which refuses a CA
    # without it ("CA cert does not include key usage extension"; the readiness probe never passed there)
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.crt",
             "-days", "30", "-subj", "/CN=autoheal-lab-ca", "-addext", "keyUsage=critical,keyCertSign,cRLSign",
             cwd=pki)
    (pki / "server.ext").write_text(
        "subjectAltName=IP:127.0.0.1,IP:10.0.0.1,DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,"
        "DNS:kubernetes.default.svc\nextendedKeyUsage=serverAuth\n")
    (pki / "client.ext").write_text("extendedKeyUsage=clientAuth\n")
    for name, subj, ext in (("server", "/CN=kube-apiserver", "server.ext"),
                            ("admin", f"/O=system:masters/CN={ADMIN_USER}", "client.ext"),
                            ("kcm", "/CN=system:kube-controller-manager", "client.ext")):
        _openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{name}.key", "-out", f"{name}.csr",
                 "-subj", subj, cwd=pki)
        _openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial",
                 "-out", f"{name}.crt", "-days", "30", "-extfile", ext, cwd=pki)
    _openssl("genrsa", "-out", "sa.key", "2048", cwd=pki)
    _openssl("rsa", "-in", "sa.key", "-pubout", "-out", "sa.pub", cwd=pki)
    for f in pki.iterdir():
        os.chmod(f, 0o600)


def kubeconfig_text(server: str, ca: Path, cert: Path, key: Path, user: str) -> str:
    """A kubeconfig (YAML is a superset of this JSON) for one client-certificate user."""
    import json

    return json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": "lab",
        "clusters": [{"name": "lab", "cluster": {"server": server, "certificate-authority": str(ca)}}],
        "users": [{"name": user, "user": {"client-certificate": str(cert), "client-key": str(key)}}],
        "contexts": [{"name": "lab", "context": {"cluster": "lab", "user": user}}],
    }, indent=1)


# --- the processes ---------------------------------------------------------------------------------------------

@dataclass
class ControlPlane:
    """Where a started control plane lives and how to reach it."""

    root: Path
    server: str
    kubeconfig: Path
    records: List[procs.ProcRecord] = field(default_factory=list)
    #: process name -> the loopback port it listens on (etcd: its client port)
    ports: Dict[str, int] = field(default_factory=dict)

    @property
    def ca(self) -> Path:
        return self.root / "pki" / "ca.crt"

    @property
    def audit_log(self) -> Path:
        return self.root / AUDIT_LOG

    def restart(self, name: str = "kube-apiserver", timeout: float = 120.0) -> None:
        """Stop one of the processes by PID and start it again as it was (etcd keeps its data): what a rolling
        restart or a crash of a control-plane member does to its clients (the API server's watch cache
        starts afresh, so a watch from before answers 410 Gone)."""
        i = next(i for i, rec in enumerate(self.records) if rec.name == name)
        old = self.records[i]
        procs.stop(old)
        rec = procs.spawn(name, list(old.argv), Path(old.log), env=dict(os.environ))
        self.records[i] = rec
        if name == APISERVER:
            _wait(name, rec, lambda: _ready(self.server, self.root / "pki"), timeout)

    def stop(self) -> None:
        """Stop every process by PID, newest first (the controller manager, then the API server, then etcd)."""
        for rec in reversed(self.records):
            procs.stop(rec)


def _argv_etcd(bindir: Path, root: Path, client: int, peer: int) -> List[str]:
    return [str(bindir / ETCD), "--name", "lab", "--data-dir", str(root / "etcd"),
            "--listen-client-urls", f"http://127.0.0.1:{client}",
            "--advertise-client-urls", f"http://127.0.0.1:{client}",
            "--listen-peer-urls", f"http://127.0.0.1:{peer}",
            "--initial-advertise-peer-urls", f"http://127.0.0.1:{peer}",
            "--initial-cluster", f"lab=http://127.0.0.1:{peer}", "--unsafe-no-fsync",
            "--log-level", "warn"]


#: What the API server's audit log keeps (with each answer's code): every write, and the reads of every
#: client but the control plane's own and the lab's admin (so a tenant's refused read shows too). The lab's
#: tests count answers from it (an eviction's 429s, a 403) as they counted the fake server's request log.
AUDIT_POLICY = f"""apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: ["RequestReceived"]
rules:
  - level: None
    verbs: ["get", "list", "watch"]
    userGroups: ["system:serviceaccounts:kube-system", "system:nodes"]
  - level: None
    verbs: ["get", "list", "watch"]
    users: ["system:kube-controller-manager", "system:apiserver", "{ADMIN_USER}"]
  - level: Metadata
"""
AUDIT_LOG = "audit.log"


def _argv_apiserver(bindir: Path, pki: Path, etcd_port: int, port: int, root: Path) -> List[str]:
    return [str(bindir / APISERVER), f"--etcd-servers=http://127.0.0.1:{etcd_port}",
            "--bind-address=127.0.0.1", f"--secure-port={port}", f"--cert-dir={pki}",
            f"--tls-cert-file={pki / 'server.crt'}", f"--tls-private-key-file={pki / 'server.key'}",
            f"--client-ca-file={pki / 'ca.crt'}", "--authorization-mode=RBAC",
            f"--service-cluster-ip-range={SERVICE_CIDR}", "--allow-privileged=true",
            "--service-account-issuer=https://kubernetes.default.svc",
            f"--service-account-key-file={pki / 'sa.pub'}",
            f"--service-account-signing-key-file={pki / 'sa.key'}",
            "--enable-priority-and-fairness=false", f"--audit-policy-file={root / 'audit-policy.yaml'}",
            f"--audit-log-path={root / AUDIT_LOG}", "--audit-log-maxsize=200", "--audit-log-maxbackup=1",
            "--v=1"]


def _argv_kcm(bindir: Path, root: Path, pki: Path) -> List[str]:
    return [str(bindir / KCM), f"--kubeconfig={root / 'kcm.kubeconfig'}", f"--controllers={CONTROLLERS}",
            "--leader-elect=false", "--secure-port=0", f"--service-account-private-key-file={pki / 'sa.key'}",
            f"--root-ca-file={pki / 'ca.crt'}", "--use-service-account-credentials=true", "--v=1"]


def _ready(server: str, pki: Path) -> bool:
    ctx = ssl.create_default_context(cafile=str(pki / "ca.crt"))
    ctx.load_cert_chain(str(pki / "admin.crt"), str(pki / "admin.key"))
    try:
        with urllib.request.urlopen(f"{server}/readyz", timeout=2, context=ctx) as resp:
            return resp.status == 200
    except OSError:
        return False


def _wait(what: str, rec: procs.ProcRecord, probe, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not procs.is_alive(rec):
            raise ControlPlaneError(f"{what} exited at start; see {rec.log}: {_tail(Path(rec.log))}")
        if probe():
            return
        time.sleep(0.2)
    raise ControlPlaneError(f"{what} not ready within {timeout:.0f}s; see {rec.log}: {_tail(Path(rec.log))}")


def _tail(path: Path, n: int = 3) -> str:
    try:
        return " | ".join(path.read_text(errors="replace").splitlines()[-n:])
    except OSError:
        return "(no log)"


def start(bindir: Path, root: Path, ports: Sequence[int], keep_state: bool = False,
          log_dir: Optional[Path] = None, env: Optional[Dict[str, str]] = None,
          timeout: float = 120.0) -> ControlPlane:
    """Start etcd, kube-apiserver and kube-controller-manager under ``root`` on ``ports`` (three free
    loopback ports: etcd client, etcd peer, API server). A clean start (the default) empties etcd first."""
    etcd_client, etcd_peer, api_port = ports
    root.mkdir(parents=True, exist_ok=True)
    logs = log_dir or root
    pki = root / "pki"
    make_pki(pki)
    if not keep_state:
        shutil.rmtree(root / "etcd", ignore_errors=True)
    server = f"https://127.0.0.1:{api_port}"
    admin_kc = root / "admin.kubeconfig"
    admin_kc.write_text(kubeconfig_text(server, pki / "ca.crt", pki / "admin.crt", pki / "admin.key", ADMIN_USER))
    (root / "kcm.kubeconfig").write_text(kubeconfig_text(server, pki / "ca.crt", pki / "kcm.crt", pki / "kcm.key",
                                                         "system:kube-controller-manager"))
    os.chmod(admin_kc, 0o600)
    (root / "audit-policy.yaml").write_text(AUDIT_POLICY)
    if not keep_state:
        (root / AUDIT_LOG).unlink(missing_ok=True)
    cp = ControlPlane(root=root, server=server, kubeconfig=admin_kc,
                      ports={ETCD: etcd_client, APISERVER: api_port})
    run_env = dict(env if env is not None else os.environ)
    try:
        etcd = procs.spawn(ETCD, _argv_etcd(bindir, root, etcd_client, etcd_peer), logs / f"{ETCD}.log", env=run_env)
        cp.records.append(etcd)
        _wait(ETCD, etcd, lambda: _http_ok(f"http://127.0.0.1:{etcd_client}/health"), timeout)
        api = procs.spawn(APISERVER, _argv_apiserver(bindir, pki, etcd_client, api_port, root),
                          logs / f"{APISERVER}.log", env=run_env)
        cp.records.append(api)
        _wait(APISERVER, api, lambda: _ready(server, pki), timeout)
        kcm = procs.spawn(KCM, _argv_kcm(bindir, root, pki), logs / f"{KCM}.log", env=run_env)
        cp.records.append(kcm)
        _wait(KCM, kcm, lambda: True, 1.0)
    except BaseException:
        cp.stop()
        raise
    return cp


def _http_ok(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as resp:
            return resp.status == 200
    except OSError:
        return False
