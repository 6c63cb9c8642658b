"""The Grafana dashboard (k8s_sync/deploy/chart/autoheal-sync/files/autoheal-dashboard.json): well-formed
for the schemaVersion it declares (what can be checked without Grafana: ids, gridPos on the 24-column
grid without overlaps, a datasource and targets with refIds and PromQL on every panel, the datasource
variable they name), every query parsed by Prometheus's own parser (promtool), and the chart's ConfigMap
with the sidecar label. That every query returns data is tested on the lab
(tests/integration/test_prometheus_lab.py)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

yaml = pytest.importorskip("yaml")

FILES = Path(__file__).resolve().parents[2] / "k8s_sync" / "deploy" / "chart" / "autoheal-sync" / "files"
DASHBOARD = FILES / "autoheal-dashboard.json"
#: Panel types of Grafana 10/11 (schemaVersion 36..39) this dashboard may use.
PANEL_TYPES = {"timeseries", "stat", "table", "gauge", "bargauge", "text", "row"}
#: What the issue asks the dashboard to show, by panel title.
REQUIRED = {"Fleet health", "Faults by kind", "Fault -> drain (node side)", "Requeued job: eligible -> running again",
            "Jobs requeued, swapped, and guard actions", "Remediation circuit breaker", "Sync pass latency",
            "Sync writes", "xid-watch per node: heartbeat age", "Fault -> job running again",
            "Hot-spare jobs: node losses by result"}


def dashboard():
    return json.loads(DASHBOARD.read_text())


def targets():
    return [(p["title"], t) for p in dashboard()["panels"] for t in p.get("targets", [])]


def lab_promql(expr: str) -> str:
    from autoheal_lab.prometheus import grafana_promql

    return grafana_promql(expr)


def test_dashboard_is_well_formed_for_its_schema_version():
    d = dashboard()
    assert isinstance(d["schemaVersion"], int) and 36 <= d["schemaVersion"] <= 39
    assert d["uid"] and d["title"] and isinstance(d["panels"], list) and d["panels"]
    variables = {v["name"]: v for v in d["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource" and variables["datasource"]["query"] == "prometheus"
    ids, cells = set(), set()
    for p in d["panels"]:
        assert isinstance(p["id"], int) and p["id"] not in ids, p.get("title")
        ids.add(p["id"])
        assert p["type"] in PANEL_TYPES and p["title"]
        g = p["gridPos"]
        assert all(isinstance(g[k], int) for k in ("h", "w", "x", "y"))
        assert g["w"] >= 1 and g["h"] >= 1 and 0 <= g["x"] and g["x"] + g["w"] <= 24 and g["y"] >= 0
        for x in range(g["x"], g["x"] + g["w"]):
            for y in range(g["y"], g["y"] + g["h"]):
                assert (x, y) not in cells, f"{p['title']} overlaps another panel at {x},{y}"
                cells.add((x, y))
        assert p["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
        refs = [t["refId"] for t in p["targets"]]
        assert refs and len(set(refs)) == len(refs)
        for t in p["targets"]:
            assert t["expr"].strip() and t["datasource"] == p["datasource"]
    assert REQUIRED <= {p["title"] for p in d["panels"]}


def test_every_query_reads_autoheal_metrics_with_bounded_labels():
    for title, t in targets():
        assert re.search(r"\bautoheal_(sync|xid_watch|guard)_", t["expr"]), title
        # legends name only bounded labels (never a job id)
        assert set(re.findall(r"\{\{\s*(\w+)\s*\}\}", t.get("legendFormat", ""))) <= \
            {"state", "kind", "node", "instance", "xid", "check", "path", "result"}, title


def test_every_query_parses_with_prometheus_itself(tmp_path):
    promtool = shutil.which("promtool")
    if not promtool:
        pytest.skip("promtool is not installed (apt-get install prometheus)")
    # promtool parses PromQL in a rules file: one recording rule per panel query
    rules = {"groups": [{"name": "dashboard", "rules": [
        {"record": f"dashboard:q{i}", "expr": lab_promql(t["expr"])} for i, (_title, t) in enumerate(targets())]}]}
    path = tmp_path / "q.yaml"
    path.write_text(yaml.safe_dump(rules))
    res = subprocess.run([promtool, "check", "rules", str(path)], capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stdout + res.stderr


def test_chart_ships_the_dashboard_as_a_sidecar_configmap():
    from helpers import helm_or_skip

    helm = helm_or_skip()
    argv = [helm, "template", "autoheal-sync", str(FILES.parent), "--namespace", "slurm"]
    res = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    cms = [d for d in yaml.safe_load_all(res.stdout) if d and d["kind"] == "ConfigMap"
           and (d["metadata"].get("labels") or {}).get("grafana_dashboard") == "1"]
    assert len(cms) == 1 and cms[0]["metadata"]["namespace"] == "slurm"
    assert json.loads(cms[0]["data"]["slurm-autoheal.json"]) == dashboard()
    res = subprocess.run(argv + ["--set", "grafanaDashboard.enabled=false,grafanaDashboard.namespace=x"],
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 0 and "grafana_dashboard" not in res.stdout
