"""`autoheal sync` (the daemon / one pass) and `autoheal sync status`."""

from __future__ import annotations

import sys

import click

from autoheal.cliutil import config_option, handle_errors, json_option, load_cfg, print_json
from autoheal.errors import EXIT_OK, EXIT_PROBLEM, EXIT_USAGE


def _kube(cfg, kubeconfig, in_cluster):
    from autoheal.k8s_sync.kube import KubeApi

    return KubeApi.from_settings(kubeconfig or cfg.sync.kubeconfig, in_cluster or cfg.sync.in_cluster,
                                 cfg.sync.request_timeout_seconds)


def _slurm(cfg):
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
def sync(ctx, kubeconfig, in_cluster, once, dry_run, metrics_port, log_level, config_path, as_json):
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
    journal = None
    try:
        from autoheal.journal import Journal

        journal = Journal.from_config(cfg)
    except Exception:  # a journal is a record, not a requirement for syncing
        journal = None
    notifier = None
    if journal is not None and not dry_run:
        try:
            from autoheal.notify import Notifier

            notifier = Notifier.from_config(cfg, journal)
        except Exception:  # notifications are best effort
            notifier = None
    if once:
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
    from autoheal.k8s_sync.daemon import SyncDaemon
    from autoheal.k8s_sync.metrics import HealthServer, Metrics

    metrics = Metrics()
    port = cfg.sync.metrics_port if metrics_port is None else metrics_port
    server = HealthServer(metrics, cfg.sync.metrics_address, port, cfg.sync.slurm_resync_seconds).start() \
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
def status(ctx, as_json):
    """Show the Lease holder and what a pass would change now (a dry run).

    Exit 0 when both sides agree, 1 when changes are pending or reads fail, 2 on config errors.
    """
    from autoheal.k8s_sync.engine import Reconciler
    from autoheal.k8s_sync.kube import KubeError
    from autoheal.k8s_sync.leader import lease_expired
    import time

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
                       + (f": {r['reason']}" if r["reason"] else "") + f" [attempt {r['attempts']}]")
        for line in data["planned"]:
            click.echo(f"pending: {line}")
        for line in res.problems:
            click.echo(f"problem: {line}")
    sys.exit(EXIT_PROBLEM if (res.read_error or res.planned or res.problems) else EXIT_OK)


def breaker_reset_patch() -> dict:
    """The ConfigMap patch that re-arms the breaker (starts forgotten; nothing is replayed: only nodes
    that still ask for a replacement start, within the limits)."""
    return {"data": {"trippedAt": None, "starts": "[]", "why": None}}


@sync.group("breaker", invoke_without_command=True)
@json_option
@click.pass_context
@handle_errors
def breaker(ctx, as_json):
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
    cm = kube.get_configmap(cfg.sync.namespace, cfg.sync.breaker_configmap) or {}
    b = Breaker.from_cfg(cfg.sync, cm.get("data") or {})
    data = {"tripped": b.tripped, "tripped_at": b.tripped_at, "why": b.why, "starts_in_window": len(b.starts)}
    if as_json:
        print_json(data)
    else:
        click.echo(f"breaker: {'TRIPPED: ' + b.why if b.tripped else 'armed'}; {len(b.starts)} starts recorded")
    sys.exit(EXIT_PROBLEM if b.tripped else EXIT_OK)


@breaker.command("reset")
@click.option("--dry-run", is_flag=True, help="Say what would be reset; change nothing.")
@json_option
@click.pass_context
@handle_errors
def breaker_reset(ctx, dry_run, as_json):
    """Re-arm a tripped breaker now (old faults are not replayed: only nodes that still ask for a
    replacement start, within the limits). Exit 0 done, 1 the API write failed."""
    from autoheal.k8s_sync.kube import KubeError

    obj = (ctx.parent.obj if ctx.parent else None) or ctx.obj or {}
    cfg = load_cfg(obj.get("config_path"))
    kube = _kube(cfg, obj.get("kubeconfig"), obj.get("in_cluster"))
    ns, name = cfg.sync.namespace, cfg.sync.breaker_configmap
    if dry_run:
        click.echo(f"would reset the breaker in ConfigMap {ns}/{name}")
        sys.exit(EXIT_OK)
    try:
        if kube.get_configmap(ns, name) is None:
            out = {"reset": False, "message": "no breaker state yet: nothing to reset"}
        else:
            kube.patch_configmap(ns, name, breaker_reset_patch())
            out = {"reset": True, "message": f"breaker re-armed (ConfigMap {ns}/{name})"}
    except KubeError as exc:
        click.echo(f"error: {exc}", err=True)
        sys.exit(EXIT_PROBLEM)
    if as_json:
        print_json(out)
    else:
        click.echo(out["message"])
    sys.exit(EXIT_OK)


__all__ = ["sync", "EXIT_USAGE"]
