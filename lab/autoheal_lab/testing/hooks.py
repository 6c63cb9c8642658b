"""The hooks' real context (``autoheal.hooks.context.Context``) for tests, with its journal records kept
in a list instead of written to a journal and sent as notifications.

Tests used to fake the context with ``SimpleNamespace`` objects carrying whatever attributes the code
under test happened to read: a fake that drifted from the real class (an attribute renamed, a property
added) still passed. ``hook_context`` builds the real one, so the code under test meets the same
attributes, store (lock timeout and fallback as in a real hook) and path expansion a hook meets on a
node; only ``record`` and, when given, the Slurm adapter are test doubles.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Dict, List, Optional, Tuple

from autoheal.config import Config
from autoheal.config.hooks_section import HooksSection
from autoheal.events import Event
from autoheal.hooks.context import Context
from autoheal.journal import Record
from autoheal.slurm.base import SlurmAdapter


class RecordingContext(Context):
    """A hooks context whose ``record`` keeps ``(event, fields)`` in ``records`` (in order)."""

    def __init__(self, config: Config, node: str, source: str, slurm: Optional[SlurmAdapter] = None) -> None:
        super().__init__(config, node, source)
        self.records: List[Tuple[Event, Dict[str, Any]]] = []
        if slurm is not None:
            self.slurm = slurm

    def record(self, event: Event, **fields: Any) -> None:
        Record(event, **fields)  # the journal's own fields: a test never records what a journal refuses
        self.records.append((event, fields))


def hook_context(hooks: Optional[HooksSection] = None, *, node: str = "n1", source: str = "test",
                 state_dir: Optional[str] = None, slurm: Optional[SlurmAdapter] = None) -> RecordingContext:
    """A context for one hook run on ``node`` with these hooks settings; ``state_dir`` (when given) is
    where the node state lives (``hooks.state_dir``), ``slurm`` the adapter the hook talks to (when not
    given, the configured backend, as a hook builds it on first use)."""
    hooks = hooks if hooks is not None else HooksSection()
    if state_dir is not None:
        hooks = dataclasses.replace(hooks, state_dir=state_dir)
    return RecordingContext(Config(hooks=hooks), node, source, slurm)
