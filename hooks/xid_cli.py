"""``autoheal xid explain N`` and ``autoheal xid table``: NVIDIA's catalog next to what autoheal does."""

from __future__ import annotations

from typing import Dict, Optional

import click

from autoheal.cliutil import config_option, handle_errors, json_option, print_json


@click.group("xid")
def xid() -> None:
    """What an XID means (NVIDIA's Xid catalog) and what autoheal does about it.

    \b
    The default policy is built from the catalog's immediate-action bucket (RESTART_APP: the job's
    problem; RESET_GPU: drain and reset; RESTART_BM: reboot; CONTACT_SUPPORT: drain for a human; ...);
    hooks.xid_policy overrides it per XID.
    """


def _overrides(config_path: Optional[str]) -> Dict[str, str]:
    from autoheal.config import load_config

    return dict(load_config(config_path).hooks.xid_policy)


@xid.command("explain")
@click.argument("number", type=click.IntRange(1, 1000000))
@config_option
@json_option
@handle_errors
def explain(number: int, config_path: Optional[str], as_json: bool) -> None:
    """What NVIDIA says about XID NUMBER, what autoheal will do on this site, and why.

    \b
    Examples:
      autoheal xid explain 46
      autoheal xid explain 79 --json
    """
    from autoheal.hooks.xid_catalog import explain as _explain

    out = _explain(number, _overrides(config_path))
    if as_json:
        print_json(out)
        return
    if out["known"]:
        click.echo(f"XID {number} {out['mnemonic']}: {out['description']}")
        gens = out["applies"]
        assert isinstance(gens, dict)
        said = ", ".join(f"{g} {'yes' if a else 'no'}" for g, a in gens.items() if a is not None)
        unsaid = ", ".join(g for g, a in gens.items() if a is None)
        click.echo(f"  NVIDIA: immediate action {out['immediate'] or '(none given)'}, investigatory "
                   f"{out['investigatory'] or '(none given)'}; applies to: {said or '?'}"
                   + (f" (shipped data says nothing for {unsaid})" if unsaid else ""))
    else:
        click.echo(f"XID {number}: not in NVIDIA's catalog as shipped")
    click.echo(f"  autoheal: {out['policy']}: {out['does']}")
    click.echo(f"  why: {out['why']}" + (" (a deliberate difference from the catalog)"
                                         if out["deliberate_difference"] else ""))
    click.echo(f"  catalog: {out['source']}")


@xid.command("table")
@click.option("--bucket", help="Only XIDs of this immediate-action bucket (e.g. RESET_GPU).")
@config_option
@json_option
@handle_errors
def table(bucket: Optional[str], config_path: Optional[str], as_json: bool) -> None:
    """Every catalog XID: NVIDIA's bucket and autoheal's policy on this site."""
    from autoheal.hooks.xid_catalog import explain as _explain
    from autoheal.hooks.xid_catalog import load

    over = _overrides(config_path)
    rows = [_explain(x, over) for x in sorted(load()[0])]
    if bucket:
        rows = [r for r in rows if r["immediate"] == bucket.upper()]
    if as_json:
        print_json(rows)
        return
    for r in rows:
        mark = "*" if r["deliberate_difference"] or r["site_override"] else " "
        click.echo(f"{r['xid']:>4} {str(r['immediate']) or '-':<22} {mark}{r['policy']:<9} {r['description']}")
