"""``autoheal``: the command-line entry point. Subcommands load lazily (see ``lazy.py``)."""

from __future__ import annotations

import click

from autoheal import __version__
from autoheal.cli.lazy import LazyGroup

# name -> "module:attribute". Parts add their commands here; modules are imported only when used.
LAZY_COMMANDS = {
    "config": "autoheal.cli.config_cmd:config",
    "events": "autoheal.cli.events_cmd:events",
    "node": "autoheal.cli.node_cmd:node",
    "status": "autoheal.cli.status_cmd:status",
    "check": "autoheal.hooks.cli:check",
    "xid-watch": "autoheal.hooks.cli:xid_watch",
    "xid": "autoheal.hooks.xid_cli:xid",
    "slurm-conf": "autoheal.slurm_conf.cli:slurm_conf",
    "doctor": "autoheal.slurm_conf.cli:doctor",
    "sbatch": "autoheal.sbatch_helpers.cli:sbatch",
    "guard": "autoheal.sbatch_helpers.guard_cli:guard",
    "sync": "autoheal.k8s_sync.cli:sync",
}

# name -> the distribution that adds it through the autoheal.commands entry point (lab/setup.cfg).
OPTIONAL_COMMANDS = {
    "lab": "slurm-autoheal-lab",
}

CONTEXT = {"help_option_names": ["-h", "--help"], "auto_envvar_prefix": "AUTOHEAL"}


@click.group(cls=LazyGroup, lazy_commands=LAZY_COMMANDS, optional_commands=OPTIONAL_COMMANDS,
             context_settings=CONTEXT)
@click.version_option(__version__, prog_name="autoheal")
def cli() -> None:
    """Self-healing Slurm GPU clusters.

    \b
    Detect GPU faults on nodes (NVML events, kernel-log XIDs, health checks), drain the node with a
    plain reason, give jobs a grace signal, requeue and resume them from their newest checkpoint, and
    keep Kubernetes in step. Start with the lab (it comes with slurm-autoheal-lab):
      autoheal lab up          a real 3-node Slurm cluster with fake GPUs on this machine
      autoheal lab inject ...  break a GPU
      autoheal events          what autoheal saw and did

    Shell completion: eval "$(_AUTOHEAL_COMPLETE=bash_source autoheal)".
    Exit codes: 0 ok, 1 problem found, 2 usage or config error.
    """


def main() -> None:
    cli(prog_name="autoheal")


if __name__ == "__main__":
    main()
