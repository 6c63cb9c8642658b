"""autoheal_lab.procs.ancestors: the process's own chain up to init, init included.

The soak's leak check and `lab down` leave out these PIDs. Run under a launcher that is PID 1 of its
PID namespace (a container's init, `unshare --pid --fork`, `./dev test --slurm trixie`), that launcher's
command line names the lab directory: it was reported as a lab process left after `down` (24.11 soak in
the chroot: "process left after the lab went down: pid 1: bash .ci/slurm-chroot ... --dir ...")."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

from autoheal_lab import procs


def test_chain_ends_at_init_and_includes_it():
    chain = procs.ancestors(os.getpid())
    assert chain[0] == os.getpid()
    assert chain[-1] == 1
    assert procs.ancestors(1) == [1]


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("unshare"), reason="needs root and unshare")
def test_pid_namespace_launcher_is_an_ancestor():
    # sh is PID 1 of the new namespace and python its child: python's chain is [its pid, 1]
    code = "import json, os; from autoheal_lab import procs; print(json.dumps(procs.ancestors(os.getpid())))"
    res = subprocess.run(["unshare", "--pid", "--fork", "--mount-proc", "sh", "-c",
                          f'"{sys.executable}" -c "{code}"; exit $?'],
                         capture_output=True, text=True, timeout=30)
    assert res.returncode == 0, res.stderr
    chain = json.loads(res.stdout)
    assert chain[-1] == 1 and len(chain) == 2, chain


def test_lab_down_stops_the_sync_before_the_fault_proxy_it_talks_through():
    """Seen in a soak on the real control plane: the proxy (``kube-api-faults``) sorted before ``sync`` and
    was stopped first, so the sync's last moments were connection-refused warnings."""
    from autoheal_lab.cluster import stop_order

    order = stop_order(["sync", "kube-api-faults", "kube-apiserver", "etcd", "kubelet", "spare-pool",
                        "kube-controller-manager", "slurmctld", "munged", "slurmd-gpu1"])
    for client in ("sync", "kubelet", "spare-pool"):
        assert order.index(client) < order.index("kube-api-faults") < order.index("kube-apiserver")
    assert order.index("kube-apiserver") < order.index("etcd") < order.index("slurmctld") < order.index("munged")
