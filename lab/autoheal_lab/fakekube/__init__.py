"""A fake Kubernetes API server (stdlib only) that behaves like kube-apiserver on the wire.

    from autoheal_lab.fakekube import FakeKubeServer
    with FakeKubeServer() as server:
        server.write_kubeconfig("/tmp/kubeconfig")
        server.store.add({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "gpu-1"}})

See ``python -m autoheal_lab.fakekube --help`` for the command-line server.
"""

from .errors import ApiError
from .faults import Fault, FaultInjector
from .registry import Registry
from .resources import NODE_REPLACEMENT, ResourceType, custom_resource
from .server import FakeKubeServer

__all__ = [
           "NODE_REPLACEMENT",
           "ApiError",
           "FakeKubeServer",
           "Fault",
           "FaultInjector",
           "Registry",
           "ResourceType",
           "custom_resource",
]
