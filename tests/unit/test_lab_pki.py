"""The lab control plane's PKI passes the TLS verification Python 3.13+ does by default (issue 28: on
Debian forky's Python 3.14 the kube-apiserver's readiness probe never passed)."""

from __future__ import annotations

import shutil
import socket
import ssl
import threading

import pytest

from autoheal_lab import controlplane


def test_the_lab_ca_and_server_certificate_pass_strict_verification(tmp_path):
    if shutil.which("openssl") is None:
        pytest.skip("openssl is not installed")
    pki = tmp_path / "pki"
    controlplane.make_pki(pki)
    server_ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server_ctx.load_cert_chain(str(pki / "server.crt"), str(pki / "server.key"))
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]

    def serve():
        conn, _ = listener.accept()
        with conn:
            try:
                with server_ctx.wrap_socket(conn, server_side=True) as tls:
                    tls.recv(1)
            except (ssl.SSLError, OSError):
                pass  # the client's refusal is what the test reads

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    client = ssl.create_default_context(cafile=str(pki / "ca.crt"))
    client.verify_flags |= ssl.VERIFY_X509_STRICT  # Python 3.13+'s default; set here for older Pythons
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=10) as raw:
            with client.wrap_socket(raw, server_hostname="localhost") as tls:
                assert tls.version()
                tls.sendall(b"x")
    finally:
        t.join(10)
        listener.close()
