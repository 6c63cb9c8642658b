"""What a hook did through Slurm or the recovery ladder: one typed value, from the engine, the prolog and
epilog, the pre-emptive swap and xid-watch's job side alike (issue 24 section 2: values, not text or
free dicts, between the parts).

A pass collects its ``Action`` values (``engine.Pass.actions``); callers read ``kind`` and ``outcome``
(an ``autoheal.nodeops`` outcome for a drain or resume, the rung's own word for a repair) as attributes,
and ``to_dict`` is the JSON ``autoheal check --json`` prints, with the keys it always had.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from autoheal.strenum import StrEnum

TYPE_CHECKING = False  # typing is for mypy only: not imported at run time (the hooks start fast)
if TYPE_CHECKING:
    from typing import Dict, List, Optional, Union


class Kind(StrEnum):
    """What was done (or looked at and left): a drain, a resume, forgetting a drain record, accepting
    someone else's resume, a pre-emptive swap's drain, or one rung of the recovery ladder (the rungs'
    words are ``checks.CheckAction``'s)."""

    DRAIN = "drain"
    RESUME = "resume"
    FORGET_DRAIN = "forget-drain"
    ACCEPT_RESUME = "accept-resume"
    PRESWAP_DRAIN = "preswap-drain"
    RESET = "reset-gpu"
    REBOOT = "reboot-node"
    REPLACE = "replace-node"


RUNGS = frozenset({Kind.RESET, Kind.REBOOT, Kind.REPLACE})


@dataclass
class Action:
    """One thing a hook did. ``outcome``: what came of it (``drained``, ``skipped: ...``, ``waiting:
    cooldown``, ``ok``, ``requested``, ...). The other fields are set by the kinds that have them:
    ``previous_reason`` (a drain), ``gpu``/``check`` (a rung), ``faults``/``stale_result`` (an accepted
    resume: the open faults forgotten, a failing result forgotten), ``jobs``/``signs`` (a pre-emptive
    swap: the jobs that swap the node out, the warning signs seen)."""

    kind: Kind
    outcome: str
    reason: str = ""
    dry_run: bool = False
    previous_reason: str = ""
    gpu: Optional[int] = None
    check: str = ""
    faults: List[str] = field(default_factory=list)
    stale_result: bool = False
    jobs: List[str] = field(default_factory=list)
    signs: List[str] = field(default_factory=list)

    @property
    def rung(self) -> bool:
        return self.kind in RUNGS

    def to_dict(self) -> Dict[str, Union[str, bool, int, List[str], None]]:
        """The JSON of ``autoheal check --json``: ``action`` (the kind) and ``outcome``, then the fields of
        this kind (a rung: gpu, check; a drain: reason, previous_reason; ...), ``dry_run`` when set."""
        out: Dict[str, Union[str, bool, int, List[str], None]] = {"action": self.kind.value,
                                                                    "outcome": self.outcome}
        if self.rung:
            out.update(gpu=self.gpu, check=self.check)
        else:
            out["reason"] = self.reason
        if self.kind is Kind.DRAIN:
            out["previous_reason"] = self.previous_reason
        if self.kind is Kind.ACCEPT_RESUME:
            out.update(faults=list(self.faults), stale_result=self.stale_result)
        if self.kind is Kind.PRESWAP_DRAIN:
            out["signs"] = list(self.signs)
            if self.jobs:
                out["jobs"] = list(self.jobs)
        if self.dry_run or self.kind in RUNGS or self.kind is Kind.DRAIN:
            out["dry_run"] = self.dry_run
        return out
