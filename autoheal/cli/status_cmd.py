"""``autoheal status``: one screen of what autoheal is doing to the fleet right now (reads only).

Each source is read on its own with a timeout, and one that fails is named on the screen while the others
still show: Slurm (through the adapter: nodes, jobs), the journal (the last hour's requeues and swaps),
Kubernetes when configured (remediation state per Node, the breaker ConfigMap, the sync's leader Lease),
and the heartbeats of xid-watch per node and of the guard, from Prometheus (``--prometheus``) or else from
their textfiles where this host can read them. The report itself is built in ``status_model``."""

from __future__ import annotations

import json
import os
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from typing import Any, Callable, Dict, List, Optional, Tuple

import click

from autoheal.cli.status_model import BreakerView, Heartbeat, Inputs, LeaseView, Remediation, Source, build, render
from autoheal.cliutil import config_option, handle_errors, load_cfg, print_json
from autoheal.errors import EXIT_OK, EXIT_PROBLEM

#: Seconds any one HTTP read (Prometheus) may take.
HTTP_TIMEOUT = 5.0
XID_FILE, GUARD_FILE = "autoheal_xid_watch.prom", "autoheal_guard.prom"


def _try(src: Source, fn: Callable[[], Any]) -> Any:
    """Run one read; on any failure mark ``src`` as error with a one-line reason and return None."""
    try:
        return fn()
    except Exception as exc:  # each source fails alone: status must say which, never crash on it
        src.state = "error"
        src.detail = f"{type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}"
        return None


def parse_textfile(text: str) -> Dict[Tuple[str, str], float]:
    """(metric name, node label or "") -> value, for the few lines status needs."""
    out: Dict[Tuple[str, str], float] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        key, _, val = line.rpartition(" ")
        name, _, labels = key.partition("{")
        node = ""
        for part in labels.rstrip("}").split(","):
            k, _, v = part.partition("=")
            if k == "node":
                node = v.strip('"')
        try:
            out[(name, node)] = float(val)
        except ValueError:
            continue
    return out


def prom_query(base: str, promql: str) -> List[Dict[str, Any]]:
    url = f"{base.rstrip('/')}/api/v1/query?{urllib.parse.urlencode({'query': promql})}"
    with urllib.request.urlopen(url, timeout=HTTP_TIMEOUT) as resp:
        body = json.loads(resp.read())
    if body.get("status") != "success":
        raise RuntimeError(f"{body.get('errorType')}: {body.get('error')}")
    return list(body["data"]["result"])


def heartbeats_from_prometheus(base: str) -> Tuple[Dict[str, Heartbeat], Optional[Heartbeat]]:
    """xid-watch per node and the guard (newest of several guards) from Prometheus."""
    xid: Dict[str, Heartbeat] = {}
    up = {r["metric"].get("node", ""): float(r["value"][1]) for r in prom_query(base, "autoheal_xid_watch_up")}
    for r in prom_query(base, "max by (node) (autoheal_xid_watch_heartbeat_timestamp_seconds)"):
        node = r["metric"].get("node", "")
        xid[node] = Heartbeat(float(r["value"][1]), up.get(node, 1.0) != 0)
    guard = None
    beats = prom_query(base, "max(autoheal_guard_heartbeat_timestamp_seconds)")
    if beats:
        gup = prom_query(base, "max(autoheal_guard_up)")
        guard = Heartbeat(float(beats[0]["value"][1]), not gup or float(gup[0]["value"][1]) != 0)
    return xid, guard


def heartbeats_from_textfiles(pattern: str, nodes: List[str]) -> Dict[str, Heartbeat]:
    """xid-watch heartbeats from ``hooks.textfile_dir`` ({node} filled in) on this host; nodes without a
    readable file are left out (the report calls them silent)."""
    out: Dict[str, Heartbeat] = {}
    for node in nodes:
        try:
            with open(os.path.join(pattern.replace("{node}", node), XID_FILE), encoding="utf-8") as fh:
                vals = parse_textfile(fh.read())
        except OSError:
            continue
        at = vals.get(("autoheal_xid_watch_heartbeat_timestamp_seconds", node))
        if at is not None:
            out[node] = Heartbeat(at, vals.get(("autoheal_xid_watch_up", node), 1.0) != 0)
    return out


def guard_from_textfile(directory: str) -> Optional[Heartbeat]:
    with open(os.path.join(directory, GUARD_FILE), encoding="utf-8") as fh:
        vals = parse_textfile(fh.read())
    at = vals.get(("autoheal_guard_heartbeat_timestamp_seconds", ""))
    return None if at is None else Heartbeat(at, vals.get(("autoheal_guard_up", ""), 1.0) != 0)


def read_kube(kube: Any, sync_cfg: Any, now: float) -> Tuple[Dict[str, Remediation], BreakerView, LeaseView]:
    """(Slurm node -> remediation, breaker, lease) from Kubernetes (any ``KubeClient``)."""
    from autoheal.k8s_sync.leader import lease_expired
    from autoheal.k8s_sync.remediation import Breaker, NodeRemediation

    nodes, _rv = kube.list_nodes()
    rem: Dict[str, Remediation] = {}
    for kname, knode in nodes.items():
        cur = NodeRemediation.from_node(knode, sync_cfg.annotation_prefix)
        if cur.state:
            rem[cur.slurm_node or kname] = Remediation(str(cur.state), kname, cur.since or None, cur.reason)
    cm = kube.get_configmap(sync_cfg.namespace, sync_cfg.breaker_configmap) or {}
    b = Breaker.from_cfg(sync_cfg, cm.get("data") or {})
    breaker = BreakerView(b.tripped, b.why, b.tripped_at or None, len(b.starts))
    lease = kube.get_lease(sync_cfg.namespace, sync_cfg.lease_name)
    spec = (lease or {}).get("spec") or {}
    lease_info = LeaseView(str(spec.get("holderIdentity") or ""), lease_expired(lease, now) if lease else True,
                           str(spec.get("renewTime") or ""))
    return rem, breaker, lease_info


def kube_configured(cfg: Any, kubeconfig: Optional[str]) -> bool:
    return bool(kubeconfig or cfg.sync.kubeconfig or cfg.sync.in_cluster or os.environ.get("KUBECONFIG"))


def gather(cfg: Any, slurm: Any, kube: Any, journal: Any, prometheus: Optional[str],
           guard_dir: Optional[str], now: Optional[float] = None, window: float = 3600.0) -> Inputs:
    """Read every source (each on its own: one failing leaves the others). ``kube`` None: not configured."""
    now = time.time() if now is None else now
    s_slurm, s_journal = Source("slurm"), Source("journal")
    s_kube = Source("kubernetes") if kube is not None else Source("kubernetes", "off", "not configured "
                                                                  "(--kubeconfig, $KUBECONFIG or sync.kubeconfig)")
    s_prom = Source("prometheus") if prometheus else None
    inp = Inputs(now=now, sources=[s_slurm, s_journal, s_kube] + ([s_prom] if s_prom else []),
                 spare_prefix=cfg.sync.spare_reason_prefix, window=window)
    inp.nodes = _try(s_slurm, slurm.list_nodes)
    if inp.nodes is not None:
        inp.jobs = _try(s_slurm, slurm.list_jobs)
    if journal is not None:
        inp.records = _try(s_journal, lambda: list(journal.read(since=now - window)))
    else:
        s_journal.state, s_journal.detail = "off", "no journal.path configured"
    if kube is not None:
        got = _try(s_kube, lambda: read_kube(kube, cfg.sync, now))
        if got is not None:
            inp.remediations, inp.breaker, inp.lease = got
    if s_prom is not None and prometheus:
        base = prometheus
        got_hb = _try(s_prom, lambda: heartbeats_from_prometheus(base))
        if got_hb is not None:
            inp.xid_watch, inp.guard = got_hb
            inp.xid_watch_source = inp.guard_source = "prometheus"
            if inp.guard is None:
                inp.guard_source = "no guard metrics in Prometheus (autoheal guard --textfile-dir)"
    else:
        pattern = cfg.hooks.textfile_dir
        names = [n.name for n in inp.nodes] if inp.nodes is not None else []
        if pattern and names:
            beats = heartbeats_from_textfiles(pattern, names)
            if beats:
                inp.xid_watch, inp.xid_watch_source = beats, f"textfiles under {pattern}"
            else:
                inp.xid_watch_source = f"no xid-watch textfile readable under {pattern} here (use --prometheus)"
        if guard_dir:
            src = Source("guard textfile")
            inp.guard = _try(src, lambda: guard_from_textfile(guard_dir))
            inp.guard_source = f"textfile in {guard_dir}" if src.state == "ok" else f"{guard_dir}: {src.detail}"
        else:
            inp.guard_source = "not seen (use --prometheus or --guard-textfile-dir)"
    return inp


@click.command("status")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON (for machines).")
@click.option("--watch", type=click.FloatRange(1, 3600), default=None, metavar="SECONDS",
              help="Refresh every SECONDS until Ctrl-C.")
@click.option("--prometheus", metavar="URL", envvar="AUTOHEAL_PROMETHEUS_URL",
              help="Prometheus to read the xid-watch and guard heartbeats from [env AUTOHEAL_PROMETHEUS_URL]; "
                   "without it they are read from their textfiles where this host can see them.")
@click.option("--guard-textfile-dir", metavar="DIR", envvar="AUTOHEAL_GUARD_TEXTFILE_DIR",
              help="Where `autoheal guard --textfile-dir` writes (when not using --prometheus).")
@click.option("--kubeconfig", type=click.Path(dir_okay=False), envvar="KUBECONFIG",
              help="kubeconfig [env KUBECONFIG; default sync.kubeconfig]; without any, Kubernetes is left out.")
@config_option
@handle_errors
def status(as_json: bool, watch: Optional[float], prometheus: Optional[str], guard_textfile_dir: Optional[str],
           kubeconfig: Optional[str], config_path: Optional[str]) -> None:
    """One screen: what autoheal is doing to the fleet right now. Reads only.

    \b
    Shows each node autoheal drained (reason, since when, ladder rung,
    remediation state, Kubernetes Node), the remediation breaker, the jobs
    requeued or swapped in the last hour and what became of them, and
    whether each component is alive: xid-watch on every node and the guard
    (their heartbeats), the sync's leader Lease. A source that cannot be
    read (slurmctld down, API server away) is named; the rest still shows.

    \b
    Examples:
      autoheal status
      autoheal status --prometheus http://prometheus:9090 --watch 5
      autoheal status --json | jq .problems

    Exit codes: 0 no problem found; 1 a problem found (listed at the end);
    2 usage or config error.
    """
    from autoheal.slurm import get_adapter

    cfg = load_cfg(config_path)
    if prometheus and not prometheus.startswith(("http://", "https://")):
        raise click.UsageError(f"--prometheus: {prometheus!r} is not an http(s) URL")
    slurm = get_adapter(cfg)
    if hasattr(slurm, "retries"):  # a slurmctld that is down is reported after one timeout, not retried
        slurm.retries = 0
    journal = None
    if cfg.journal.path:
        from autoheal.journal import Journal

        journal = Journal.from_config(cfg)
    kube = None
    if kube_configured(cfg, kubeconfig):
        from autoheal.cli.status_kube import StatusKube

        kube = StatusKube.from_settings(kubeconfig or cfg.sync.kubeconfig, cfg.sync.in_cluster,
                                        min(cfg.sync.request_timeout_seconds, 10.0),
                                        node_label=f"{cfg.sync.annotation_prefix}/remediation")
    while True:
        rep = build(gather(cfg, slurm, kube, journal, prometheus, guard_textfile_dir))
        if as_json:
            print_json(rep.to_dict())
        else:
            if watch:
                click.echo("\033[2J\033[H", nl=False)
            click.echo(render(rep))
        if not watch:
            sys.exit(EXIT_PROBLEM if rep.problems else EXIT_OK)
        try:
            time.sleep(watch)
        except KeyboardInterrupt:
            sys.exit(EXIT_PROBLEM if rep.problems else EXIT_OK)
