"""What every node-side entry point needs: the node name, the config, the node state, a Slurm
adapter with the hooks' short timeouts, the journal, and the expected GPU count.

Kept free of click and of anything slow to import: HealthCheckProgram runs every few minutes on every
node and its start-up time is the budget.
"""

from __future__ import annotations

import os
import socket
import sys
from typing import Optional

from autoheal.hooks.state import NodeState, expand


def node_name(explicit: Optional[str] = None) -> str:
    """``--node``, else $SLURMD_NODENAME (Slurm sets it for hooks), $AUTOHEAL_NODE, the short hostname."""
    return (explicit or os.environ.get("SLURMD_NODENAME") or os.environ.get("AUTOHEAL_NODE")
            or socket.gethostname().split(".")[0])


class Context:
    """Lazily built collaborators for one run on one node."""

    def __init__(self, config, node: str, source: str):
        self.cfg = config
        self.hooks = config.hooks
        self.node = node
        self.source = source
        self.store = NodeState(expand(self.hooks.state_dir, node))
        self._slurm = None
        self._journal = None

    @classmethod
    def load(cls, source: str, node: Optional[str] = None, config_path: Optional[str] = None) -> "Context":
        from autoheal.config import load_config

        return cls(load_config(config_path), node_name(node), source)

    def path(self, template: str) -> str:
        return expand(template, self.node)

    @property
    def slurm(self):
        """CliSlurm with the hooks' timeouts (a hook must never wait long for slurmctld)."""
        if self._slurm is None:
            from autoheal.slurm.cli_backend import CliSlurm

            s = self.cfg.slurm
            self._slurm = CliSlurm(bin_dir=s.bin_dir, slurm_conf=s.slurm_conf, timeout=self.hooks.slurm_timeout,
                                   retries=1)
        return self._slurm

    @slurm.setter
    def slurm(self, adapter) -> None:
        self._slurm = adapter

    @property
    def journal(self):
        if self._journal is None:
            from autoheal.journal import Journal

            self._journal = Journal.from_config(self.cfg)
        return self._journal

    def record(self, event: str, **fields) -> None:
        """Journal (never fails the caller) and notify actions and errors."""
        fields.setdefault("node", self.node)
        fields.setdefault("source", self.source)
        rec = self.journal.record(event, **fields)
        if rec is not None and rec.severity in ("action", "error") and self.cfg.notify.webhooks:
            try:
                from autoheal.notify import Notifier

                notifier = Notifier.from_config(self.cfg, self.journal)
                notifier.send(rec)
                notifier.flush(self.cfg.notify.timeout)
            except Exception as exc:  # notifications are best effort
                print(f"autoheal: warning: notify failed: {exc}", file=sys.stderr)

    def expected_gpus(self) -> int:
        """``hooks.expected_gpus``, or (-1) the GPUs gres.conf gives this node; 0 = do not check."""
        if self.hooks.expected_gpus >= 0:
            return self.hooks.expected_gpus
        path = self.hooks.gres_conf
        if not path:
            conf = self.cfg.slurm.slurm_conf or os.environ.get("SLURM_CONF") or "/etc/slurm/slurm.conf"
            path = os.path.join(os.path.dirname(conf), "gres.conf")
        try:
            with open(path, encoding="utf-8") as fh:
                return gres_gpu_count(fh.read(), self.node)
        except OSError:
            return 0


def gres_gpu_count(text: str, node: str) -> int:
    """GPUs gres.conf declares for ``node`` (``File=/dev/nvidia[0-7]`` or ``Count=8``); 0 when it
    cannot tell (AutoDetect, no gpu lines)."""
    from autoheal.slurm.hostlist import expand as hl_expand

    total = 0
    for raw in text.splitlines():
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        kv = {}
        for tok in line.split():
            if "=" in tok:
                k, v = tok.split("=", 1)
                kv[k.lower()] = v
        if kv.get("name") != "gpu":
            continue
        if "nodename" in kv:
            try:
                if node not in hl_expand(kv["nodename"]):
                    continue
            except Exception:
                continue
        if "count" in kv:
            try:
                total += int(kv["count"])
                continue
            except ValueError:
                return 0
        if "file" in kv:
            try:
                total += len(hl_expand(kv["file"]))
            except Exception:
                return 0
    return total
