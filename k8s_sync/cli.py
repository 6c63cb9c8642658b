"""`autoheal sync` (the daemon / one pass) and `autoheal sync status`."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any, Callable, Dict, List, NoReturn, Optional, Sequence, Tuple

import click

from autoheal.cliutil import config_option, handle_errors, json_option, load_cfg, print_json
from autoheal.errors import EXIT_OK, EXIT_PROBLEM, EXIT_USAGE

if TYPE_CHECKING:
    from autoheal.config import Config
    from autoheal.journal import Journal
    from autoheal.k8s_sync.kube import KubeApi
    from autoheal.notify import Notifier
    from autoheal.slurm.base import SlurmAdapter


def _kube(cfg: Config, kubeconfig: Optional[str], in_cluster: Optional[bool]) -> KubeApi:
    from autoheal.k8s_sync.kube import KubeApi

    return KubeApi.from_settings(kubeconfig or cfg.sync.kubeconfig, in_cluster or cfg.sync.in_cluster,
                                 cfg.sync.request_timeout_seconds, connections=kube_connections(cfg.sync))


def kube_connections(sync: Any) -> int:
    """Connections the sync's client keeps: the write pool's, two watches, the Lease and one to spare."""
    return int(sync.api_write_concurrency) + 4


def _slurm(cfg: Config) -> SlurmAdapter:
    from autoheal.slurm import get_adapter

    return get_adapter(cfg)


@click.group("sync", invoke_without_command=True)
@click.option("--kubeconfig", type=click.Path(dir_okay=False), envvar="KUBECONFIG",
              help="kubeconfig file [env KUBECONFIG; default sync.kubeconfig, ~/.kube/config].")
@click.option("--in-cluster", is_flag=True, help="Use the pod's ServiceAccount (in a Deployment).")
@click.option("--once", is_flag=True, help="Run one reconcile pass, print what it did and exit "
              "(no watch, no leader election: do not run it next to a Deployment that writes).")
@click.option("--dry-run", is_flag=True, help="Read both sides and print every write a pass would make; "
              "write nothing.")
@click.option("--metrics-port", type=click.IntRange(0, 65535), default=None,
              help="Port of /metrics, /healthz, /readyz [default sync.metrics_port; 0: off].")
@click.option("--log-level", default="info", show_default=True,
              type=click.Choice(["debug", "info", "warning", "error"]), help="Structured log level.")
@config_option
@json_option
@click.pass_context
@handle_errors
def sync(ctx: click.Context, kubeconfig: Optional[str], in_cluster: bool, once: bool, dry_run: bool,
         metrics_port: Optional[int], log_level: str, config_path: Optional[str], as_json: bool) -> None:
    """Keep Slurm and Kubernetes views of every node in agreement, both ways.

    \b
    Slurm -> Kubernetes: each slurmd pod gets SlurmNodeState* conditions
    (Slinky's names: `kubectl wait --for=condition=SlurmNodeStateIdle pod/...`);
    a node under an autoheal hardware drain gets the Node condition
    GPUHealthy=False (reason e.g. XID79) and the taint autoheal.io/gpu-unhealthy.
    Kubernetes -> Slurm: `kubectl cordon` (or a configured taint/condition)
    drains the Slurm node with reason "autoheal: k8s: node cordoned[: <the
    autoheal.io/cordon-reason annotation>]"; uncordon resumes it. Only drains
    autoheal made are ever resumed; admin drains are never touched.

    \b
    Without --once it runs as a daemon: list+watch caches, a Slurm read every
    sync.slurm_resync_seconds, only the Lease holder writes (run 2 replicas).
    A failed Slurm or Kubernetes read changes nothing.

    \b
    Examples:
      autoheal sync --once --dry-run        # what would change right now
      autoheal sync --kubeconfig ~/.kube/config --metrics-port 9464
      autoheal sync status                  # leader, nodes out of sync
      autoheal sync remediation             # node replacements and their state
      autoheal sync remediation retry gpu7  # start a failed replacement again

    Exit codes: 0 ok; 1 a pass failed to read or write; 2 config/credentials error.
    """
    ctx.ensure_object(dict)
    ctx.obj.update(kubeconfig=kubeconfig, in_cluster=in_cluster, config_path=config_path)
    if ctx.invoked_subcommand is not None:
        return
    from autoheal.k8s_sync import logs

    logs.setup(log_level)
    cfg = load_cfg(config_path)
    kube = _kube(cfg, kubeconfig, in_cluster)
    slurm = _slurm(cfg)
    journal = _journal(cfg)
    notifier = None if journal is None or dry_run else _notifier(cfg, journal)
    if once:
        _run_once(cfg, slurm, kube, journal, notifier, dry_run, as_json)
    _run_daemon(cfg, slurm, kube, journal, notifier, dry_run, metrics_port)


def _journal(cfg: Config) -> Optional[Journal]:
    try:
        from autoheal.journal import Journal

        return Journal.from_config(cfg)
    except Exception:  # a journal is a record, not a requirement for syncing
        return None


def _notifier(cfg: Config, journal: Journal) -> Optional[Notifier]:
    try:
        from autoheal.notify import Notifier

        return Notifier.from_config(cfg, journal)
    except Exception:  # notifications are best effort
        return None


def _run_once(cfg: Config, slurm: SlurmAdapter, kube: KubeApi, journal: Optional[Journal],
              notifier: Optional[Notifier], dry_run: bool, as_json: bool) -> NoReturn:
    """``--once``: one pass, what it planned and did, exit 0 or 1."""
    from autoheal.k8s_sync.engine import Reconciler

    res = Reconciler(slurm, kube, cfg.sync, dry_run=dry_run, journal=journal, notifier=notifier).run_pass()
    summary = res.summary()
    summary["dry_run"] = dry_run
    if as_json:
        print_json(summary)
    else:
        if res.read_error:
            click.echo(f"nothing written: read failed: {res.read_error}")
        for line in summary["planned"]:
            click.echo(("would: " if dry_run else "did:   ") + line)
        for line in res.problems:
            click.echo(f"problem: {line}")
        for line in res.errors:
            click.echo(f"error: {line}")
        click.echo(f"{res.nodes} Slurm nodes, {res.mapped} mapped, {len(res.planned)} changes "
                   f"{'planned' if dry_run else 'planned, ' + str(len(res.applied)) + ' applied'}, "
                   f"{res.deferred} deferred, {res.seconds:.3f}s")
    sys.exit(EXIT_OK if res.ok and not res.errors else EXIT_PROBLEM)


def _run_daemon(cfg: Config, slurm: SlurmAdapter, kube: KubeApi, journal: Optional[Journal],
                notifier: Optional[Notifier], dry_run: bool, metrics_port: Optional[int]) -> NoReturn:
    """The daemon: list+watch, passes, leader election, the metrics/health server until a signal."""
    from autoheal.k8s_sync.daemon import SyncDaemon
    from autoheal.k8s_sync.metrics import HealthServer, Metrics

    for text in cfg.sync.deprecations():
        click.echo(f"autoheal sync: warning: {text}", err=True)
    metrics = Metrics()
    port = cfg.sync.metrics_port if metrics_port is None else metrics_port
    server = HealthServer(metrics, cfg.sync.metrics_address, port, cfg.sync.slurm_resync_seconds,
                          cfg.sync.metrics_read_timeout_seconds).start() \
        if port else None
    daemon = SyncDaemon(slurm, kube, cfg.sync, dry_run=dry_run, metrics=metrics, journal=journal,
                        notifier=notifier)
    daemon.install_signal_handlers()
    try:
        daemon.run()
    finally:
        if server is not None:
            server.stop()
    sys.exit(EXIT_OK)


@sync.command("status")
@json_option
@click.pass_context
@handle_errors
def status(ctx: click.Context, as_json: bool) -> None:
    """Show the Lease holder and what a pass would change now (a dry run).

    Exit 0 when both sides agree, 1 when changes are pending or reads fail, 2 on config errors.
    """
    import time

    from autoheal.k8s_sync.engine import Reconciler
    from autoheal.k8s_sync.kube import KubeError
    from autoheal.k8s_sync.leader import lease_expired
    from autoheal.k8s_sync.remediation import RS

    obj = ctx.obj or {}
    cfg = load_cfg(obj.get("config_path"))
    kube = _kube(cfg, obj.get("kubeconfig"), obj.get("in_cluster"))
    lease_info = {}
    try:
        lease = kube.get_lease(cfg.sync.namespace, cfg.sync.lease_name)
        if lease:
            spec = lease.get("spec") or {}
            lease_info = {"holder": spec.get("holderIdentity") or "", "renew_time": spec.get("renewTime"),
                          "expired": lease_expired(lease, time.time()),
                          "transitions": spec.get("leaseTransitions")}
    except KubeError as exc:
        lease_info = {"error": str(exc)}
    res = Reconciler(_slurm(cfg), kube, cfg.sync, dry_run=True).run_pass()
    data = {"lease": lease_info, **res.summary()}
    if as_json:
        print_json(data)
    else:
        holder = lease_info.get("holder") or "(none)"
        click.echo(f"leader: {holder}" + (" (expired)" if lease_info.get("expired") else ""))
        if res.read_error:
            click.echo(f"read failed: {res.read_error}")
        else:
            click.echo(f"{res.nodes} Slurm nodes, {res.mapped} mapped to Kubernetes, "
                       f"{len(res.planned)} pending changes")
        if res.breaker:
            b = res.breaker
            click.echo("breaker: " + (f"TRIPPED: {b['why']}" if b["tripped"] else
                                      f"armed ({b['starts_in_window']} starts in window)"))
        for kname, r in sorted(res.remediations.items()):
            click.echo(f"remediation: {kname} (Slurm {r['slurm_node']}): {r['state']}"
                       + (f" ({r['limit']}, since {_when(r['since'])}" + (f", until {_when(r['until'])}"
                          if r.get("until") else "") + ")" if r["state"] == RS.WAITING else "")
                       + (f": {r['reason']}" if r["reason"] else "") + f" [attempt {r['attempts']}]"
                       + (f"; {r['retry']}" if r.get("retry") else ""))
        if (res.capacity or {}).get("warning"):
            click.echo(f"capacity: {res.capacity['warning']}")
        for kname, o in sorted(res.opted_out.items()):
            click.echo(f"opted out: {kname} (Slurm {o['slurm_node']}) needs a replacement but {o['why']}")
        for line in data["planned"]:
            click.echo(f"pending: {line}")
        for line in res.problems:
            click.echo(f"problem: {line}")
    sys.exit(EXIT_PROBLEM if (res.read_error or res.planned or res.problems) else EXIT_OK)


def _when(epoch: Any) -> str:
    import datetime as dt

    return dt.datetime.fromtimestamp(float(epoch or 0), dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def waiting_rows(nodes: Dict[str, Dict[str, Any]], prefix: str) -> List[Dict[str, Any]]:
    """Nodes whose remediation waits for a breaker limit, oldest first (the order they start in)."""
    from autoheal.k8s_sync.remediation import RS, NodeRemediation

    rows = []
    for kname, node in nodes.items():
        cur = NodeRemediation.from_node(node, prefix)
        if cur.state == RS.WAITING:
            rows.append({"node": kname, "slurm_node": cur.slurm_node, "since": cur.since, "until": cur.until,
                         "limit": cur.limit, "why": cur.reason})
    return sorted(rows, key=lambda r: (r["since"], r["node"]))


def breaker_reset_patch() -> Dict[str, Any]:
    """The ConfigMap patch that re-arms the breaker (starts forgotten; nothing is replayed: only nodes
    that still ask for a replacement start, within the limits)."""
    return {"data": {"trippedAt": None, "starts": "[]", "why": None, "nodes": None}}


@sync.group("breaker", invoke_without_command=True)
@json_option
@click.pass_context
@handle_errors
def breaker(ctx: click.Context, as_json: bool) -> None:
    """Show the remediation circuit breaker; `reset` re-arms it by hand.

    \b
    The breaker stops *new* remediations (node replacements) when more than
    sync.breaker_max_percent of nodes are in remediation or drained by
    autoheal; detection and drains by the hooks go on. It re-arms on its own
    after sync.breaker_cooldown_seconds once the share is below
    sync.breaker_rearm_percent. State: ConfigMap sync.breaker_configmap.
    """
    if ctx.invoked_subcommand is not None:
        return
    from autoheal.k8s_sync.remediation import Breaker

    obj = ctx.obj or {}
    cfg = load_cfg(obj.get("config_path"))
    kube = _kube(cfg, obj.get("kubeconfig"), obj.get("in_cluster"))
    from autoheal.k8s_sync.kube import KubeError

    cm = kube.get_configmap(cfg.sync.namespace, cfg.sync.breaker_configmap) or {}
    b = Breaker.from_cfg(cfg.sync, cm.get("data") or {})
    data: Dict[str, Any] = {"tripped": b.tripped, "tripped_at": b.tripped_at, "why": b.why,
                            "starts_in_window": len(b.starts), "window_seconds": b.window_seconds,
                            "max_percent": b.max_percent, "max_concurrent": b.max_concurrent}
    try:  # the queue: what the limits hold back (the breaker's state itself is read above)
        nodes, _ = kube.list_nodes()
        data["waiting"] = waiting_rows(nodes, cfg.sync.annotation_prefix)
    except KubeError as exc:
        data["waiting"], data["waiting_error"] = None, str(exc)
    if as_json:
        print_json(data)
    else:
        click.echo(f"breaker: {'TRIPPED: ' + b.why if b.tripped else 'armed'}; {len(b.starts)} starts recorded "
                   f"(at most {b.max_percent:.0f}% of the pool per {b.window_seconds:.0f}s window, "
                   f"{b.max_concurrent} at once)")
        for r in data["waiting"] or []:
            click.echo(f"waiting: {r['node']} (Slurm {r['slurm_node'] or '?'}) since {_when(r['since'])}"
                       + (f", until {_when(r['until'])}" if r["until"] else "") + f" [{r['limit']}]: {r['why']}")
        if data["waiting"] is None:
            click.echo(f"waiting: not read: {data['waiting_error']}")
    sys.exit(EXIT_PROBLEM if b.tripped else EXIT_OK)


@breaker.command("reset")
@click.option("--dry-run", is_flag=True, help="Say what would be reset; change nothing.")
@json_option
@click.pass_context
@handle_errors
def breaker_reset(ctx: click.Context, dry_run: bool, as_json: bool) -> None:
    """Re-arm a tripped breaker now (old faults are not replayed: only nodes that still ask for a
    replacement start, within the limits). Writes an Event (AutohealBreakerReset, on the ConfigMap) and a
    journal record under each node that tripped it. Exit 0 done, 1 the API write failed."""
    from autoheal.k8s_sync.kube import KubeError
    from autoheal.k8s_sync.remediation import Breaker

    obj = (ctx.parent.obj if ctx.parent else None) or ctx.obj or {}
    cfg = load_cfg(obj.get("config_path"))
    kube = _kube(cfg, obj.get("kubeconfig"), obj.get("in_cluster"))
    ns, name = cfg.sync.namespace, cfg.sync.breaker_configmap
    try:
        cm = kube.get_configmap(ns, name)
        b = Breaker.from_cfg(cfg.sync, (cm or {}).get("data") or {})
        if cm is None:
            out = {"reset": False, "message": "no breaker state yet: nothing to reset"}
        elif dry_run:
            out = {"reset": False, "dry_run": True, "tripped": b.tripped, "nodes": b.nodes,
                   "message": f"would reset the breaker in ConfigMap {ns}/{name}"
                              + (f" (tripped: {b.why})" if b.tripped else " (armed)")}
        else:
            kube.patch_configmap(ns, name, breaker_reset_patch())
            out = {"reset": True, "was_tripped": b.tripped, "nodes": b.nodes,
                   "message": f"breaker re-armed (ConfigMap {ns}/{name})"}
            _record_cli(cfg, kube, "breaker-reset", b.nodes, f"circuit breaker reset by hand ({_who()})"
                        + (f"; it had tripped: {b.why}" if b.tripped else ""),
                        ("AutohealBreakerReset", {"metadata": {"name": name}}, "ConfigMap"),
                        {"was_tripped": b.tripped, "why": b.why})
    except KubeError as exc:
        click.echo(f"error: {exc}", err=True)
        sys.exit(EXIT_PROBLEM)
    if as_json:
        print_json(out)
    else:
        click.echo(out["message"])
    sys.exit(EXIT_OK)


def _who() -> str:
    import getpass

    try:
        return getpass.getuser()
    except (KeyError, OSError):  # no passwd entry in a container
        return "unknown user"


def _record_cli(cfg: Config, kube: KubeApi, event: str, nodes: Sequence[Optional[str]], message: str,
                k8s_event: Tuple[str, Dict[str, Any], str], evidence: Dict[str, Any]) -> None:
    """An operator's action: one Event (reason, object, kind) and a journal record under each node (the
    host when none); both best effort after the change itself succeeded."""
    import datetime as dt

    from autoheal.k8s_sync.kube import KubeError

    reason, obj, kind = k8s_event
    now = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    try:
        kube.create_event(cfg.sync.namespace, obj, reason, message, "Normal", now, kind=kind)
    except KubeError as exc:
        click.echo(f"warning: Event not posted: {exc}", err=True)
    try:
        from autoheal.journal import Journal

        journal = Journal.from_config(cfg)
        for node in (list(nodes) or [None]):
            journal.record(event, node=node, action=event, outcome="done", message=message, severity="action",
                           source="cli", evidence=dict(evidence, user=_who()))
    except Exception as exc:  # a record, not a requirement: the change was made
        click.echo(f"warning: journal record not written: {exc}", err=True)


@sync.group("remediation", invoke_without_command=True)
@json_option
@click.pass_context
@handle_errors
def remediation(ctx: click.Context, as_json: bool) -> None:
    """Show node replacements (step "remediate") and their state; `retry`
    starts a failed one again.

    \b
    A failed remediation is retried on its own after
    sync.remediation_retry_seconds while attempts are left
    (sync.remediation_max_attempts); `retry NODE` starts another at once.
    Reads only Kubernetes (the Node annotations autoheal.io/remediation-*).
    Exit 0 none failed, 1 some failed or a read failed, 2 config errors.
    """
    if ctx.invoked_subcommand is not None:
        return
    from autoheal.k8s_sync.kube import KubeError
    from autoheal.k8s_sync.remediation import RS, NodeRemediation, keys

    obj = ctx.obj or {}
    cfg = load_cfg(obj.get("config_path"))
    kube = _kube(cfg, obj.get("kubeconfig"), obj.get("in_cluster"))
    prefix = cfg.sync.annotation_prefix
    try:
        nodes, _ = kube.list_nodes()
    except KubeError as exc:
        click.echo(f"error: {exc}", err=True)
        sys.exit(EXIT_PROBLEM)
    rows = []
    for kname, node in sorted(nodes.items()):
        cur = NodeRemediation.from_node(node, prefix)
        opted = ((node.get("metadata") or {}).get("annotations") or {}).get(keys(prefix)["opted-out"], "")
        if cur.state or opted:
            rows.append({"node": kname, "slurm_node": cur.slurm_node, "state": cur.state or "opted-out",
                         "since": cur.since, "attempts": cur.attempts, "reason": cur.reason or opted})
            if cur.state == RS.WAITING:
                rows[-1].update(until=cur.until, limit=cur.limit)
    if as_json:
        print_json({"remediations": rows})
    elif not rows:
        click.echo("no node remediations")
    else:
        for r in rows:
            wait = (f" ({r['limit']}, since {_when(r['since'])}" + (f", until {_when(r['until'])}" if r["until"]
                    else "") + ")") if r["state"] == RS.WAITING else ""
            click.echo(f"{r['node']} (Slurm {r['slurm_node'] or '?'}): {r['state']}{wait} [attempt {r['attempts']}]"
                       + (f": {r['reason']}" if r["reason"] else ""))
    sys.exit(EXIT_PROBLEM if any(r["state"] == RS.FAILED for r in rows) else EXIT_OK)


def _failing(node: str, as_json: bool) -> Callable[[int, str], NoReturn]:
    """``fail(code, message)``: the one-line error (and the JSON envelope with --json), then exit ``code``."""
    def fail(code: int, message: str) -> NoReturn:
        if as_json:
            print_json({"ok": False, "node": node, "error": message})
        click.echo(f"autoheal: error: {message}", err=True)
        sys.exit(code)

    return fail


def _retry_requested(cfg: Any, kube: Any, kname: str, knode: Dict[str, Any], cur: Any) -> str:
    """Journal and Event of a retry written to the Node; the message for the person."""
    _record_cli(cfg, kube, "remediation-retry-requested", [cur.slurm_node] if cur.slurm_node else [],
                f"Node {kname} (Slurm {cur.slurm_node}): retry of the failed remediation requested by "
                f"{_who()}; it had failed: {cur.reason}",
                ("AutohealRemediationRetryRequested", knode, "Node"),
                {"k8s_node": kname, "attempts": cur.attempts, "previous_reason": cur.reason})
    return (f"retry of {kname} requested: the sync leader starts it again on its next pass "
            f"(opt-out check and circuit breaker apply)")


@remediation.command("retry")
@click.argument("node")
@click.option("--dry-run", is_flag=True, help="Say what would be retried; change nothing.")
@json_option
@click.pass_context
@handle_errors
def remediation_retry(ctx: click.Context, node: str, dry_run: bool, as_json: bool) -> None:
    """Start a failed remediation of NODE again (a Kubernetes Node or Slurm node name).

    \b
    Clears the failed state (attempts kept); the leader starts it afresh on
    its next pass, like a new fault: opt-out check, circuit breaker, jobs
    leaving, cordon, evictions, a new replacement request. Records an Event
    (AutohealRemediationRetryRequested) and a journal record.

    \b
    Examples:
      autoheal sync remediation retry gpu7 --dry-run
      autoheal sync remediation retry gpu7 --json

    Exit 0 retry requested; 1 NODE's remediation is not failed, or the API
    write failed (409: the leader wrote at the same moment: run it again);
    2 no such node, or config errors.
    """
    import time as _time

    from autoheal.k8s_sync.kube import KubeError
    from autoheal.k8s_sync.remediation import NodeRemediation, retry_patch

    obj = ctx.obj or {}
    cfg = load_cfg(obj.get("config_path"))
    kube = _kube(cfg, obj.get("kubeconfig"), obj.get("in_cluster"))
    prefix = cfg.sync.annotation_prefix
    fail = _failing(node, as_json)
    try:
        nodes, _ = kube.list_nodes()
    except KubeError as exc:
        fail(EXIT_PROBLEM, str(exc))
    kname = node if node in nodes else next(
        (n for n, o in sorted(nodes.items()) if NodeRemediation.from_node(o, prefix).slurm_node == node), None)
    if kname is None:
        fail(EXIT_USAGE, f"{node}: no Kubernetes Node of that name, and no Node remediated for a Slurm node of "
                         f"that name")
    cur = NodeRemediation.from_node(nodes[kname], prefix)
    try:
        body = retry_patch(nodes[kname], prefix, _time.time(), _who())
    except ValueError as exc:
        fail(EXIT_PROBLEM, f"{kname}: {exc}")
    out = {"ok": True, "node": kname, "slurm_node": cur.slurm_node, "previous_reason": cur.reason,
           "attempts": cur.attempts, "dry_run": dry_run}
    if dry_run:
        out["message"] = (f"would retry the failed remediation of {kname} (Slurm {cur.slurm_node}; "
                          f"{cur.attempts} attempts so far; failed: {cur.reason})")
    else:
        try:
            kube.patch_node(kname, body, "merge")
        except KubeError as exc:
            fail(EXIT_PROBLEM, f"{kname}: {exc}")
        out["message"] = _retry_requested(cfg, kube, kname, nodes[kname], cur)
    if as_json:
        print_json(out)
    else:
        click.echo(out["message"])
    sys.exit(EXIT_OK)


__all__ = ["EXIT_USAGE", "sync"]
