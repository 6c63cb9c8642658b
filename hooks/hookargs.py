"""Command-line arguments of the Slurm hook programs (``autoheal-healthcheck``, ``-prolog``, ``-epilog``).

Slurm runs them with no arguments. An admin who types ``autoheal-healthcheck --help`` on a node must get
the help, not a real health pass that may drain the node. Anything else on the command line is a
misconfiguration the hook reports and then ignores: it still does its job, as Slurm expects of it.
No click here: these programs start on every job and every health-check interval.
"""

from __future__ import annotations

import sys

TYPE_CHECKING = False  # typing is for mypy only: not imported at run time (the hooks start fast)
if TYPE_CHECKING:
    from typing import Optional, Sequence

HELP_FLAGS = ("-h", "--help")


def early_exit(prog: str, doc: Optional[str], argv: Sequence[str]) -> Optional[int]:
    """The exit code when the arguments ask for help (printed here), else None: run the hook.

    Unknown arguments get one warning line on stderr (Slurm's log) and are ignored."""
    if any(a in HELP_FLAGS for a in argv):
        print(f"usage: {prog}   (run by Slurm with no arguments)\n\n{(doc or '').strip()}")
        return 0
    if argv:
        print(f"{prog}: warning: arguments ignored (Slurm passes none): {' '.join(argv)[:200]!r}",
              file=sys.stderr)
    return None
