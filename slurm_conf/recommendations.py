"""The recommended slurm.conf settings as data (``data/recommendations.toml``), selected per Slurm version."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

from autoheal.errors import AutohealError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - 3.9/3.10
    import tomli as tomllib

DATA_FILE = Path(__file__).with_name("data") / "recommendations.toml"

# Versions `autoheal slurm-conf --version` accepts (Slurm releases every six months).
KNOWN_VERSIONS = ("22.05", "23.02", "23.11", "24.05", "24.11", "25.05", "25.11", "26.05")
CHECKS = ("set", "min", "range", "one_of", "has_item", "item_max")


def version_tuple(text: str) -> Tuple[int, int]:
    """``"24.11"`` / ``"24.11.5"`` -> (24, 11); ValueError on anything else."""
    parts = text.strip().split(".")
    if len(parts) < 2 or not parts[0].isdigit() or not parts[1].isdigit():
        raise ValueError(f"not a Slurm version: {text!r} (expected YY.MM, e.g. 24.11)")
    return int(parts[0]), int(parts[1])


@dataclass(frozen=True)
class Recommendation:
    """One setting: what to write, how to judge the live value, and why it matters."""

    id: str
    key: str
    value: str
    check: str
    why: str
    effect_bad: str
    effect_good: str
    severity: str = "fail"
    merge: bool = False
    default: str = "(null)"
    min: Optional[float] = None
    max: Optional[float] = None
    accepted: Tuple[str, ...] = ()
    item: str = ""
    item_default: Optional[float] = None
    # item_max only: a comma-list item of another key that, when present, replaces `item` (25.11+:
    # SchedulerParameters requeue_delay= replaces AuthInfo cred_expire as the requeue delay)
    override_key: str = ""
    override_item: str = ""
    when_preempting: str = ""
    since: str = ""
    until: str = ""
    lab_owned: bool = False
    only_with_gpus: bool = False
    zero_is_default: bool = False  # `scontrol show config` prints 0 for "not set": Slurm uses `default`

    def applies_to(self, version: Tuple[int, int]) -> bool:
        """True when this entry is meant for Slurm ``version`` (since inclusive, until exclusive)."""
        if self.since and version < version_tuple(self.since):
            return False
        if self.until and version >= version_tuple(self.until):
            return False
        return True

    @property
    def recommended_text(self) -> str:
        """The recommendation as a human reads it (``KillWait >= 120``, ``PrologFlags has Alloc``)."""
        if self.check == "min":
            return f"{self.key} >= {_num(self.min)}"
        if self.check == "range":
            return f"{self.key} between {_num(self.min)} and {_num(self.max)}"
        if self.check == "one_of":
            return f"{self.key} = {' or '.join(self.accepted)}"
        if self.check == "has_item":
            return f"{self.key} includes {' or '.join(self.accepted)}"
        if self.check == "item_max":
            text = f"{self.key} {self.item} <= {_num(self.max)}"
            if self.override_key:
                text += f" (or {self.override_key} {self.override_item} <= {_num(self.max)}, which overrides it)"
            return text
        return f"{self.key} set (e.g. {self.value})"


def _num(x: Optional[float]) -> str:
    return "?" if x is None else (str(int(x)) if float(x).is_integer() else str(x))


class DataError(AutohealError):
    """The shipped recommendation data is malformed (a packaging bug)."""


def _from_table(t: Dict[str, Any]) -> Recommendation:
    known = set(Recommendation.__dataclass_fields__)
    unknown = set(t) - known
    if unknown:
        raise DataError(f"{DATA_FILE.name}: {t.get('id', '?')}: unknown field(s) {', '.join(sorted(unknown))}")
    data = dict(t)
    data["accepted"] = tuple(str(a) for a in data.get("accepted", ()))
    for k in ("value", "default"):
        if k in data:
            data[k] = str(data[k])
    try:
        rec = Recommendation(**data)
    except TypeError as exc:
        raise DataError(f"{DATA_FILE.name}: {t.get('id', '?')}: {exc}") from None
    if rec.check not in CHECKS:
        raise DataError(f"{DATA_FILE.name}: {rec.id}: unknown check {rec.check!r}")
    return rec


def load_all(path: Path = DATA_FILE) -> List[Recommendation]:
    """Every entry of the data file, in file order."""
    try:
        raw = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise DataError(f"{path}: cannot read recommendation data: {exc}") from None
    return [_from_table(t) for t in raw.get("recommendation", [])]


def for_version(version: Tuple[int, int], path: Path = DATA_FILE) -> List[Recommendation]:
    """The entries that apply to Slurm ``version`` (one per id)."""
    return [r for r in load_all(path) if r.applies_to(version)]


def nearest_known(version: Tuple[int, int]) -> str:
    """The newest known release not newer than ``version`` (older than 22.05: 22.05)."""
    best = KNOWN_VERSIONS[0]
    for v in KNOWN_VERSIONS:
        if version_tuple(v) <= version:
            best = v
    return best
