"""`autoheal doctor`: the live Slurm configuration and this node's installation, judged.

``diagnose`` is pure (a parsed ``scontrol show config`` dict and node GPU counts in, a Report out);
``gather`` reads Slurm through the core adapter; the installation checks live in install_checks.
Nothing here changes Slurm, the config or the journal.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Tuple

from autoheal.errors import SlurmParseError
from autoheal.slurm_conf import checks, install_checks
from autoheal.slurm_conf.checks import Finding
from autoheal.slurm_conf.recommendations import for_version, nearest_known, version_tuple

if TYPE_CHECKING:
    from autoheal.config import Config
    from autoheal.slurm import SlurmAdapter


@dataclass
class Report:
    """Everything doctor found, with the Slurm version the recommendations were chosen for."""

    slurm_version: str
    recommendations_for: str
    findings: List[Finding] = field(default_factory=list)

    def exit_code(self, strict: bool = False) -> int:
        return checks.exit_code(self.findings, strict)

    def summary(self) -> Dict[str, int]:
        return {s: sum(1 for f in self.findings if f.status == s) for s in checks.STATUSES}

    def to_dict(self, strict: bool = False) -> Dict[str, Any]:
        code = self.exit_code(strict)
        return {"ok": code == 0, "exit_code": code, "strict": strict, "slurm_version": self.slurm_version,
                "recommendations_for": self.recommendations_for, "summary": self.summary(),
                "findings": [f.to_dict() for f in self.findings]}


def slurm_version_of(conf: Dict[str, str]) -> str:
    """SLURM_VERSION from ``scontrol show config``; SlurmParseError when absent or unreadable."""
    raw = checks.lookup(conf, "SLURM_VERSION")
    if not raw:
        raise SlurmParseError("scontrol show config: no SLURM_VERSION line; is this `scontrol show config` output?")
    try:
        version_tuple(raw)
    except ValueError:
        raise SlurmParseError(f"scontrol show config: unreadable SLURM_VERSION {raw!r}") from None
    return raw.strip()


def diagnose(conf: Dict[str, str], nodes_gpus: Optional[Dict[str, int]] = None,
             expected_gpus: int = 0) -> Report:
    """Judge every recommendation for the cluster's version, plus the nodes' GPU GRES counts."""
    version = slurm_version_of(conf)
    parsed = version_tuple(version)
    has_gpus = bool(expected_gpus) or nodes_gpus is None or any(nodes_gpus.values())
    findings = checks.evaluate_all(for_version(parsed), conf, has_gpus=has_gpus)
    findings += checks.check_node_gpus(nodes_gpus or {}, expected_gpus)
    return Report(version, nearest_known(parsed), findings)


def gather(adapter: SlurmAdapter) -> Tuple[Dict[str, str], Optional[Dict[str, int]]]:
    """(show config dict, {node: gpu count} or None when nodes cannot be listed)."""
    from autoheal.errors import SlurmError

    conf = adapter.show_config()
    nodes: Optional[Dict[str, int]]
    try:
        nodes = {n.name: n.gpu_count for n in adapter.list_nodes()}
    except SlurmError:
        nodes = None  # the settings can still be judged; the GRES count check is skipped
    return conf, nodes


def installation(conf: Dict[str, str], cfg: Config, config_finding: Finding) -> List[Finding]:
    """This node's installation: hooks, config, NVML and xid-watch (on GPU nodes), journal."""
    found = [config_finding]
    found += install_checks.check_hooks(conf)
    expected = int(getattr(getattr(cfg, "hooks", None), "expected_gpus", 0) or 0)
    found.append(install_checks.check_nvml(expected))
    if expected:
        found.append(install_checks.check_xid_watch())
    else:
        found.append(Finding("xid_watch", checks.SKIP, "xid-watch daemon", "", "running on GPU nodes",
                             "xid-watch runs on GPU nodes only.", "hooks.expected_gpus is 0 or unset: "
                             "not a GPU node", kind="install"))
    found.append(install_checks.check_journal(cfg.journal.path))
    return found


def expected_gpus_of(cfg: Optional[Config]) -> int:
    """``hooks.expected_gpus`` when the config defines it, else 0."""
    return int(getattr(getattr(cfg, "hooks", None), "expected_gpus", 0) or 0)
