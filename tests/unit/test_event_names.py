"""Journal event names are a closed set (``autoheal.events.Event``); old journals' names still read.

The hooks pass ``Event`` members (mypy checks them); the other parts' names are found here in the source
(the AST), so a new or misspelt name in any part fails this test, not a dashboard's query."""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Iterator, Tuple

from autoheal.events import Event
from autoheal.journal import Journal
from autoheal.k8s_sync.plan import SLURM_KINDS

ROOT = Path(__file__).resolve().parents[2]
PRODUCT = ("autoheal", "hooks", "slurm_conf", "sbatch_helpers", "k8s_sync")
NAMES = {e.value for e in Event}


def _text(node: ast.AST) -> str:
    return node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else ""


def written_names() -> Iterator[Tuple[str, str]]:
    """(where, name) of every event name written as a literal in the product."""
    for top in PRODUCT:
        for path in sorted((ROOT / top).rglob("*.py")):
            where = str(path.relative_to(ROOT))
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if isinstance(node, ast.Call):
                    name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
                    if name == "record" and node.args and _text(node.args[0]):
                        yield f"{where}:{node.lineno}", _text(node.args[0])
                    if name == "finish" and node.args and _text(node.args[0]):  # the runner: job-<state>
                        yield f"{where}:{node.lineno}", "job-" + _text(node.args[0])
                    if name == "_record_cli" and len(node.args) > 2 and _text(node.args[2]):
                        yield f"{where}:{node.lineno}", _text(node.args[2])
                    for kw in node.keywords:
                        if kw.arg == "journal" and _text(kw.value):
                            yield f"{where}:{node.lineno}", _text(kw.value)
                elif isinstance(node, ast.Assign):
                    for target in node.targets:
                        if isinstance(target, ast.Name) and target.id in ("journal", "event") and _text(node.value):
                            yield f"{where}:{node.lineno}", _text(node.value)
                        if isinstance(target, ast.Tuple) and isinstance(node.value, ast.Tuple):
                            for t, v in zip(target.elts, node.value.elts):
                                if isinstance(t, ast.Name) and t.id == "event" and _text(v):
                                    yield f"{where}:{node.lineno}", _text(v)


def test_the_scan_finds_every_part_s_names():
    found = {name for _, name in written_names()}
    # the hooks (through Event, and the salvage journal), the runner, the guard, the sync, notify
    assert {"job-restart", "job-max-restarts", "guard-release", "remediation-done", "breaker-reset",
            "notify-failed"} <= found


def test_every_event_name_the_product_writes_is_an_event():
    unknown = [f"{where}: {name!r}" for where, name in written_names() if name not in NAMES]
    assert not unknown, "journal event names not in autoheal.events.Event:\n" + "\n".join(unknown)
    # the sync journals its Slurm writes under the kind without its prefix
    assert {k.replace("slurm-", "") for k in SLURM_KINDS} <= NAMES


def test_a_journal_written_by_another_release_keeps_the_names_this_one_does_not_know(tmp_path):
    path = tmp_path / "journal.jsonl"
    j = Journal(str(path))
    j.record(Event.DRAIN, node="n1", message="ours")
    with open(path, "a", encoding="utf-8") as fh:
        fh.write('{"event": "gpu-retirement-planned", "node": "n2", "time": 1.0}\n')
    events = [r.event for r in Journal(str(path)).read_all().records]
    assert events == ["drain", "gpu-retirement-planned"]
    assert Event.of("drain") is Event.DRAIN and Event.of("gpu-retirement-planned") is None
