"""The recovery ladder, as a pure decision: which repair to try next for a fault on a node or GPU.

Rungs, cheapest first: reset the GPU, reboot the node, ask for a replacement. A fault starts at the
rung its check suggests and climbs one rung each time it comes back after a repair (counts are kept
per node and GPU in the node state, across restarts, for ``hooks.ladder_window``).
"""

from __future__ import annotations

from autoheal.hooks.checks import REBOOT, REPLACE, RESET, CheckAction
from autoheal.strenum import StrEnum

TYPE_CHECKING = False  # typing is for mypy only: not imported at run time (the hooks start fast)
if TYPE_CHECKING:
    from typing import Dict, Optional

RUNGS = (RESET, REBOOT, REPLACE)


class Rung(StrEnum):
    """A rung as the node state counts it (``ladder`` -> ``{"reset": [times], ...}``): the word today's
    state files hold, where the check's suggestion says ``reset-gpu`` / ``reboot-node`` / ``replace-node``."""

    RESET = "reset"
    REBOOT = "reboot"
    REPLACE = "replace"


#: The rung each repair action of a check climbs to, one name per rung between the check and the state.
RUNG_OF: Dict[CheckAction, Rung] = {RESET: Rung.RESET, REBOOT: Rung.REBOOT, REPLACE: Rung.REPLACE}


def next_rung(first: CheckAction, resets: int, reboots: int, can_reset: bool = True,
              can_reboot: bool = True) -> Optional[CheckAction]:
    """The rung to run now for a fault whose check suggested ``first``.

    ``resets``/``reboots``: repairs already made for this GPU (or node) within the window; a fault seen
    again after them escalates. Returns None when the action is not a repair (drain only, warn).
    """
    if first not in RUNGS:
        return None
    level = RUNGS.index(first)
    if level <= 0 and resets >= 1:
        level = 1
    if level <= 1 and reboots >= 1:
        level = 2
    if level == 0 and not can_reset:
        level = 1
    if level == 1 and not can_reboot:
        level = 2
    return RUNGS[level]
