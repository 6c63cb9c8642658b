"""Run the fake API server: ``python -m autoheal_lab.fakekube --port 0 --kubeconfig OUT``.

Prints the server URL on the first line of stdout, writes a kubeconfig for
kubectl and the python client, serves until SIGTERM or SIGINT, then (with
``--state-file``) saves every object so the next run starts from them.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading
from typing import List, Optional

from .resources import NODE_REPLACEMENT, ResourceType, custom_resource
from .server import FakeKubeServer


def parse_crd(spec: str) -> ResourceType:
    """``group/version/Kind/plural[/cluster]``."""
    parts = spec.split("/")
    if len(parts) not in (4, 5) or (len(parts) == 5 and parts[4] not in ("cluster", "namespaced")):
        raise argparse.ArgumentTypeError(f"expected group/version/Kind/plural[/cluster], got {spec!r}")
    group, version, kind, plural = parts[:4]
    return custom_resource(group, version, kind, plural, namespaced=len(parts) == 4 or parts[4] == "namespaced")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m autoheal_lab.fakekube", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--host", default="127.0.0.1", help="loopback address to bind (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=0, help="TCP port, 0 picks a free one (default 0)")
    p.add_argument("--kubeconfig", help="write a kubeconfig pointing at the server to this path")
    p.add_argument("--state-file", help="load objects from this JSON file at start, save them at exit")
    p.add_argument("--seed", action="append", default=[], help="JSON file of objects (a list or {items: []}) "
                                                               "to create at start; repeatable")
    p.add_argument("--crd", action="append", type=parse_crd, default=[],
                   help="serve a custom resource group/version/Kind/plural[/cluster]; repeatable "
                        "(autoheal.io/v1alpha1 NodeReplacement is always served)")
    p.add_argument("--bookmark-interval", type=float, default=60.0, help="seconds between watch bookmarks")
    p.add_argument("--history-window", type=int, default=1000,
                   help="watch events kept per resource; older resourceVersions get 410 Gone")
    p.add_argument("--pod-deletion-delay", type=float, default=0.0,
                   help="seconds a deleted pod bound to a node stays Terminating (0: gone at once)")
    p.add_argument("--legacy-discovery", action="store_true", help="never serve aggregated discovery")
    return p


def _load(server: FakeKubeServer, path: str) -> None:
    """Create the objects of a state or seed file: a list, or ``{"items": [...]}`` with an optional
    ``resourceVersion`` the new revisions continue after."""
    with open(path) as fh:
        data = json.load(fh)
    if isinstance(data, dict) and str(data.get("resourceVersion", "")).isdigit():
        server.store.store.advance_to(int(data["resourceVersion"]))
    server.store.load(data.get("items", []) if isinstance(data, dict) else list(data))


def _save(server: FakeKubeServer, path: str) -> None:
    state = {"resourceVersion": str(server.store.store.current_rv), "items": server.store.dump()}
    tmp = path + ".tmp"
    with open(tmp, "w") as fh:
        json.dump(state, fh, indent=1)
    os.replace(tmp, path)


def main(argv: Optional[List[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    crds = [NODE_REPLACEMENT] + [c for c in args.crd if c.key != NODE_REPLACEMENT.key]
    server = FakeKubeServer(host=args.host, port=args.port, custom_resources=crds,
                            bookmark_interval=args.bookmark_interval, history_window=args.history_window,
                            pod_deletion_delay=args.pod_deletion_delay,
                            aggregated_discovery=not args.legacy_discovery)
    if args.state_file and os.path.exists(args.state_file):
        _load(server, args.state_file)
    for path in args.seed:
        _load(server, path)
    done = threading.Event()

    def on_signal(signum: int, frame: object) -> None:
        done.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    server.start()
    if args.kubeconfig:
        server.write_kubeconfig(args.kubeconfig)
    print(server.url, flush=True)
    try:
        while not done.wait(0.5):
            pass
    finally:
        server.stop()
        if args.state_file:
            _save(server, args.state_file)
    return 0


if __name__ == "__main__":
    sys.exit(main())
