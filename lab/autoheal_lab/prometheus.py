"""A real Prometheus on the lab (Debian's ``prometheus`` and ``prometheus-node-exporter``), scraping what a
site's would: the sync's /metrics, and on every node a node-exporter whose textfile collector reads that
node's xid-watch file (``<lab>/metrics/<node>``), plus one for the guard's file on the "controller"
(``<lab>/metrics/controller``). It evaluates the product's alert rules (the chart's
``files/autoheal-rules.yaml``), with every ``for:`` shortened to ``LAB_FOR`` so a test sees an alert
within seconds; expressions and thresholds are the product's, unchanged.

Everything listens on loopback ports picked free at start, is recorded by PID in lab.json, and is stopped
by ``autoheal lab down``. Intervals: scrape ``SCRAPE_INTERVAL``, rule evaluation ``EVAL_INTERVAL``.
"""

from __future__ import annotations

import json
import shutil
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any, Dict, List, Optional

from autoheal_lab import procs

PROM_PROC = "prometheus"
EXPORTER_PROC = "node-exporter-{node}"
CONTROLLER = "controller"  # the node-exporter of the slurmctld host, where the guard writes its file
SCRAPE_INTERVAL = "1s"
EVAL_INTERVAL = "1s"
LAB_FOR = "2s"


def product_file(name: str) -> Path:
    """A file of the chart's ``files/`` (the rules, the dashboard), as the installed product ships it."""
    import autoheal.k8s_sync as ks

    return Path(ks.__file__).parent / "deploy" / "chart" / "autoheal-sync" / "files" / name


def grafana_promql(expr: str) -> str:
    """A dashboard query as Grafana sends it: its interval variables replaced by a fixed window."""
    return expr.replace("$__rate_interval", "1m").replace("$__interval", "1m").replace("$__range", "1h")


def binaries() -> Dict[str, str]:
    """Paths of prometheus and prometheus-node-exporter, or a LabError naming the package to install."""
    from autoheal_lab.cluster import LabError

    found = {name: shutil.which(name) or "" for name in ("prometheus", "prometheus-node-exporter")}
    missing = [n for n, p in found.items() if not p]
    if missing:
        raise LabError(f"missing {', '.join(missing)}: run `apt-get install --no-install-recommends "
                       f"{' '.join(missing)}`")
    return found


def lab_rules(src: Path, for_: str = LAB_FOR) -> str:
    """The product's rules with every ``for:`` set to ``for_`` (nothing else changes)."""
    import yaml

    doc = yaml.safe_load(src.read_text())
    for group in doc["groups"]:
        group["interval"] = EVAL_INTERVAL
        for rule in group["rules"]:
            if "for" in rule:
                rule["for"] = for_
    return yaml.safe_dump(doc, sort_keys=False)


def prometheus_config(sync_targets: List[str], node_targets: List[str], rules: str) -> Dict[str, Any]:
    return {
        "global": {"scrape_interval": SCRAPE_INTERVAL, "evaluation_interval": EVAL_INTERVAL,
                   "scrape_timeout": SCRAPE_INTERVAL},
        "rule_files": [rules],
        "scrape_configs": [
            {"job_name": "autoheal-sync", "static_configs": [{"targets": sync_targets}]},
            {"job_name": "autoheal-nodes", "static_configs": [{"targets": node_targets}]},
        ],
    }


def _sync_targets(lab) -> List[str]:
    urls = (lab.load_state() or {}).get("urls") or {}
    out = []
    for url in urls.values():
        parsed = urllib.parse.urlparse(url)
        if parsed.path.rstrip("/") == "/metrics" and parsed.netloc:
            out.append(parsed.netloc)
    return sorted(out)


def start(lab, wait: float = 30.0) -> str:
    """Start a node-exporter per lab node and the controller's, restart the guard writing its textfile,
    and start Prometheus. Returns Prometheus's base URL (also recorded in lab.json as ``prometheus``)."""
    from autoheal_lab import wiring
    from autoheal_lab.cluster import LabError, _free_ports

    bins = binaries()
    lay = lab.layout()
    pdir = lab.root / "prometheus"
    pdir.mkdir(parents=True, exist_ok=True)
    hosts = [*lay.all_nodes, CONTROLLER]
    ports = _free_ports(len(hosts) + 1)
    node_targets = []
    for host, port in zip(hosts, ports):
        tdir = lab.root / "metrics" / host
        tdir.mkdir(parents=True, exist_ok=True)
        name = EXPORTER_PROC.format(node=host)
        old = lab.records().get(name)
        if old and procs.is_alive(old):
            procs.stop(old)
        # only the textfile collector: the lab's nodes share one machine, whose CPU and disk metrics
        # would be the same five times over
        argv = [bins["prometheus-node-exporter"], "--collector.disable-defaults", "--collector.textfile",
                f"--collector.textfile.directory={tdir}", f"--web.listen-address=127.0.0.1:{port}"]
        lab._record(procs.spawn(name, argv, lay.path("log", f"{name}.log")))
        node_targets.append(f"127.0.0.1:{port}")
    guard = lab.records().get("guard")
    if guard is not None:
        # the lab's guard, now also writing its textfile where the controller's node-exporter reads it
        lab.start_controller_daemon("guard", [*wiring.guard_argv(""), "--textfile-dir",
                                              str(lab.root / "metrics" / CONTROLLER)])
    rules = pdir / "autoheal-rules.lab.yaml"
    rules.write_text(lab_rules(product_file("autoheal-rules.yaml")))
    cfg = pdir / "prometheus.yml"
    cfg.write_text(json.dumps(prometheus_config(_sync_targets(lab), node_targets, str(rules)), indent=2))
    port = ports[-1]
    argv = [bins["prometheus"], f"--config.file={cfg}", f"--storage.tsdb.path={pdir / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}", "--storage.tsdb.retention.time=1d", "--log.level=warn"]
    old = lab.records().get(PROM_PROC)
    if old and procs.is_alive(old):
        procs.stop(old)
    rec = procs.spawn(PROM_PROC, argv, lay.path("log", f"{PROM_PROC}.log"))
    lab._record(rec)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + wait
    while time.monotonic() < deadline:
        if not procs.is_alive(rec):
            break
        try:
            with urllib.request.urlopen(f"{url}/-/ready", timeout=1) as resp:
                if resp.status == 200:
                    lab.record_url(PROM_PROC, url)
                    return url
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(0.2)
    from autoheal_lab.cluster import _tail

    raise LabError(f"prometheus did not become ready at {url}; see {rec.log}: {_tail(rec.log)}")


def url(lab) -> str:
    from autoheal_lab.cluster import LabError

    found = ((lab.load_state() or {}).get("urls") or {}).get(PROM_PROC)
    if not found:
        raise LabError(f"no Prometheus on the lab at {lab.root}: run `autoheal lab prometheus --dir {lab.root}`")
    return str(found)


def api(base: str, path: str, params: Optional[Dict[str, str]] = None, timeout: float = 10.0) -> Any:
    """GET ``base/api/v1/<path>``; returns ``data`` of a successful answer, raises RuntimeError else."""
    q = f"?{urllib.parse.urlencode(params)}" if params else ""
    try:
        with urllib.request.urlopen(f"{base}/api/v1/{path}{q}", timeout=timeout) as resp:
            body = json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        body = json.loads(exc.read() or b"{}")
    if body.get("status") != "success":
        raise RuntimeError(f"prometheus {path}: {body.get('errorType')}: {body.get('error')}")
    return body["data"]


def query(base: str, promql: str) -> List[Dict[str, Any]]:
    """An instant query's result vector (or matrix/scalar data as Prometheus gives it)."""
    data = api(base, "query", {"query": promql})
    result = data.get("result")
    if data.get("resultType") == "scalar":
        return [{"value": result}]
    return list(result or [])


def firing(base: str, alertname: str) -> List[Dict[str, Any]]:
    """The alerts named ``alertname`` that are firing now (labels and activeAt)."""
    return [a for a in api(base, "alerts").get("alerts", [])
            if a.get("labels", {}).get("alertname") == alertname and a.get("state") == "firing"]


def rss_kib(lab) -> Dict[str, int]:
    """Resident memory of the lab's Prometheus and node-exporters, KiB, by process name."""
    out = {}
    for name, rec in lab.records().items():
        if name != PROM_PROC and not name.startswith("node-exporter-"):
            continue
        if not procs.is_alive(rec):
            continue
        try:
            for line in Path(f"/proc/{rec.pid}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    out[name] = int(line.split()[1])
        except OSError:
            continue
    return out


if __name__ == "__main__":  # python -m autoheal_lab.prometheus LAB_DIR: start it on a running lab
    from autoheal_lab.cluster import Lab

    print(start(Lab(Path(sys.argv[1]))))
