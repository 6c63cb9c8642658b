"""Issue 27: a node waiting for a replacement is an explicit state: who acts, since when, what to run
after the repair; `autoheal node list --waiting` shows it."""

from __future__ import annotations

import json

from click.testing import CliRunner

from autoheal import awaiting
from autoheal.cli import node_cmd
from autoheal.config import Config
from autoheal.config.sync_section import SyncSection
from autoheal.slurm.model import Node

REPLACE = "autoheal: replace: xid 79 on GPU 0 of gpu4 (0000:1b:00.0): fallen off the bus"


def test_who_replaces_follows_the_sync_steps():
    slurm_only = Config()
    assert awaiting.awaiting_replacement(Node("gpu4", "IDLE", frozenset({"DRAIN"}), REPLACE))
    assert not awaiting.awaiting_replacement(Node("gpu4", "IDLE", frozenset(), ""))
    assert not awaiting.awaiting_replacement(Node("gpu4", "IDLE", frozenset({"DRAIN"}), "admin: replace: psu"))
    assert not awaiting.awaiting_replacement(Node("gpu4", "IDLE", frozenset({"DRAIN"}), "autoheal: xid 48 on GPU 1"))
    assert "a person" in awaiting.who_replaces(slurm_only) and not awaiting.automatic(slurm_only)
    kube = Config(sync=SyncSection(enabled_steps=["slurm-to-pods", "remediate"]))
    assert awaiting.automatic(kube) and "autoheal sync" in awaiting.who_replaces(kube)
    assert "autoheal node resume gpu4" in awaiting.message("gpu4", REPLACE, slurm_only)


class _Slurm:
    def list_nodes(self):
        return [Node("gpu1", "IDLE"), Node("gpu4", "IDLE", frozenset({"DRAIN"}), REPLACE, reason_time=1000)]


def test_node_list_waiting_lists_who_acts_and_exits_1(monkeypatch):
    monkeypatch.setattr(node_cmd, "_slurm", lambda path: (Config(), _Slurm()))
    res = CliRunner().invoke(node_cmd.node, ["list", "--waiting", "--json"])
    assert res.exit_code == 1, res.output
    rows = json.loads(res.output)
    assert [r["name"] for r in rows] == ["gpu4"] and "a person" in rows[0]["waiting_for"]
    assert rows[0]["waiting_since"] == 1000 and "--clear-faults" in rows[0]["next"]
    res = CliRunner().invoke(node_cmd.node, ["list"])
    assert res.exit_code == 0 and "waiting" in res.output and "gpu1" in res.output


def test_the_sites_replacement_reasons_count_too():
    lemon = Node("gpu4", "IDLE", frozenset({"DRAIN"}), "autoheal: lemon: 3 faults in 7 days")
    assert not awaiting.awaiting_replacement(lemon)
    assert awaiting.awaiting_replacement(lemon, ("autoheal: replace:", "autoheal: lemon:"))
    k8s = Node("gpu4", "IDLE", frozenset({"DRAIN"}), "autoheal: k8s: node cordoned")
    assert not awaiting.awaiting_replacement(k8s, ("autoheal:",))
    assert awaiting.replace_prefixes(Config()) == tuple(SyncSection().remediate_reasons)
