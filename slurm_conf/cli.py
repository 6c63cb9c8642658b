"""`autoheal slurm-conf` (print the recommended fragment) and `autoheal doctor` (check a live cluster)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING, Dict

import click

from autoheal.cliutil import config_option, handle_errors, json_option, print_json
from autoheal.errors import ConfigError, SlurmParseError
from autoheal.slurm_conf.recommendations import KNOWN_VERSIONS

if TYPE_CHECKING:
    from autoheal.slurm_conf.doctor import Report

_MARK = {"ok": "ok  ", "warn": "WARN", "fail": "FAIL", "skip": "skip"}


def read_conf_keys(path: str) -> Dict[str, str]:
    """Top-level ``Key=Value`` lines of a slurm.conf (last one wins, as in Slurm); node, partition and
    include lines are ignored."""
    out: Dict[str, str] = {}
    try:
        text = Path(path).read_text(encoding="utf-8", errors="replace")
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read: {exc.strerror}") from None
    for line in text.splitlines():
        line = line.split("#", 1)[0].strip()
        if "=" not in line:
            continue
        key, value = line.split("=", 1)
        key = key.strip()
        if " " in key or key.lower() in ("nodename", "partitionname", "nodeset", "frontendname",
                                         "downnodes", "switchname"):
            continue
        out[key] = value.strip()
    return out


@click.command("slurm-conf")
@click.option("--version", "version", default="auto", show_default=True,
              type=click.Choice(["auto", *KNOWN_VERSIONS]),
              help="Slurm release to write settings for; auto asks the installed Slurm.")
@click.option("--format", "fmt", default="conf", show_default=True, type=click.Choice(["conf", "json"]),
              help="conf: slurm.conf lines with comments; json: the same as data.")
@click.option("--merge-with", type=click.Path(dir_okay=False),
              help="An existing slurm.conf: comma-list keys (SchedulerParameters, AuthInfo, ...) come out "
                   "merged with its values, ready to replace its lines.")
@handle_errors
def slurm_conf(version: str, fmt: str, merge_with: str) -> None:
    """Print the slurm.conf settings self-healing needs, for a Slurm version.

    \b
    Each setting comes with why it matters and what it changes, e.g. the
    requeue delay (AuthInfo=cred_expire: requeued jobs wait 121 s by default),
    PrologFlags=Alloc, SchedulerParameters=nohold_on_prolog_fail, KillWait
    for the checkpoint window, and the gres.conf lines for GPUs.

    \b
    Examples:
      autoheal slurm-conf                          # for the installed Slurm
      autoheal slurm-conf --version 24.11 --format json
      autoheal slurm-conf --merge-with /etc/slurm/slurm.conf
    Then check the running cluster with `autoheal doctor`.
    """
    from autoheal.slurm_conf import fragment

    existing = read_conf_keys(merge_with) if merge_with else None
    if fmt == "json":
        print_json(fragment.render_json(version, existing))
    else:
        click.echo("\n".join(fragment.render_conf(version, existing)))


def _print_report(report: Report, strict: bool) -> None:
    click.echo(f"autoheal doctor: Slurm {report.slurm_version} "
               f"(recommendations for {report.recommendations_for})")
    for kind, title in (("setting", "slurm.conf settings"), ("install", "installation on this node")):
        rows = [f for f in report.findings if f.kind == kind]
        if not rows:
            continue
        click.echo(f"\n{title}:")
        for f in rows:
            click.echo(f"  {_MARK.get(f.status, f.status)}  {f.id:<26} {f.what}: {f.current}")
            if f.status in ("warn", "fail"):
                click.echo(f"        want: {f.recommended}")
                click.echo(f"        effect: {f.effect}")
                click.echo(f"        why: {f.why}")
    s = report.summary()
    code = report.exit_code(strict)
    click.echo(f"\n{s['ok']} ok, {s['warn']} warn, {s['fail']} fail, {s['skip']} skipped"
               f"{' (--strict: warnings count)' if strict else ''} -> exit {code}")


@click.command("doctor")
@json_option
@click.option("--strict", is_flag=True, help="Warnings count as problems (exit 1).")
@click.option("--from-file", type=click.Path(dir_okay=False),
              help="Judge a saved `scontrol show config` output instead of asking slurmctld "
                   "(settings only: the installation checks need the live node).")
@click.option("--settings-only", is_flag=True, help="Skip the installation checks of this node.")
@config_option
@handle_errors
def doctor(as_json: bool, strict: bool, from_file: str, settings_only: bool, config_path: str) -> None:
    """Check the Slurm settings and this node's autoheal installation. Never changes anything.

    \b
    Reads `scontrol show config` and the node list, and reports per recommended
    setting: ok / warn / fail, the current and recommended value, why, and the
    effect (e.g. "requeued jobs wait 121 s before they can start again").
    Then checks this node: hook programs named in HealthCheckProgram/Prolog/
    Epilog exist and are executable, the autoheal config validates, NVML loads
    and xid-watch runs (GPU nodes: hooks.expected_gpus > 0), the journal is
    writable.

    \b
    Exit codes: 0 all ok (with --strict: no warnings either), 1 problems,
    2 could not check (slurmctld unreachable, unreadable output, bad config).
    Fix settings with `autoheal slurm-conf`.
    """
    from autoheal.config import Config
    from autoheal.slurm.parse import parse_show_config
    from autoheal.slurm_conf import doctor as doc
    from autoheal.slurm_conf import install_checks

    config_finding, cfg = install_checks.check_config(config_path)
    if from_file:
        try:
            text = Path(from_file).read_text(encoding="utf-8", errors="replace")
        except OSError as exc:
            raise ConfigError(f"{from_file}: cannot read: {exc.strerror}") from None
        try:
            conf = parse_show_config(text)
        except SlurmParseError as exc:
            raise SlurmParseError(f"{from_file}: {exc}") from None
        nodes = None
        settings_only = True
    else:
        if cfg is None:
            # A broken config must not stop the settings check: reach Slurm with the defaults.
            from autoheal.slurm import get_adapter

            adapter = get_adapter(Config())
        else:
            from autoheal.slurm import get_adapter

            adapter = get_adapter(cfg)
        conf, nodes = doc.gather(adapter)
    report = doc.diagnose(conf, nodes, doc.expected_gpus_of(cfg))
    if not settings_only:
        report.findings += doc.installation(conf, cfg or Config(), config_finding)
    elif cfg is None:
        report.findings.append(config_finding)
    if as_json:
        print_json(report.to_dict(strict))
    else:
        _print_report(report, strict)
    sys.exit(report.exit_code(strict))
