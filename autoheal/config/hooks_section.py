"""Config of the node side (``autoheal.hooks``): checks, thresholds, XID policy, drains and resumes.

Defaults are for an H100/H200/A100 fleet. Paths may contain ``{node}`` (expanded with the node name,
so several lab nodes can share one machine).
"""

from __future__ import annotations

from autoheal import signals
from autoheal.config.schema import setting
from autoheal.errors import ConfigError
from autoheal.lazyre import LazyPattern
from autoheal.reasons import RUNNER_MARKER
from autoheal.records import record
from autoheal.signals import SLURM_SIGNALS, UNCATCHABLE, SignalNameError

TYPE_CHECKING = False  # typing only for mypy: the hooks load this module on every run
if TYPE_CHECKING:
    from typing import Dict, List

#: What an XID policy may say. reset/reboot/replace drain the node and name the first repair rung.
#: hooks.xid_policy values, from the mildest (autoheal.hooks.xid_catalog says what each does).
XID_POLICIES = ("ignore", "warn", "job", "requeue", "recovery", "human", "drain", "reset", "reboot", "replace")
#: Check names (for ``disabled_checks``).
CHECK_NAMES = ("gpu-count", "gpu-lost", "xid", "ecc", "remapped-rows", "retired-pages", "pcie", "nvlink",
               "clocks", "temperature", "recovery-action", "driver", "persistence")
#: Signal names scancel --signal understands (Slurm's sig_name2num), less KILL and STOP: a grace
#: signal must be one a job can catch.
GRACE_SIGNALS = tuple(s for s in SLURM_SIGNALS if s not in UNCATCHABLE)
#: Warning signs that precede GPU failures, for the pre-emptive swap of hot-spare jobs (hooks/preswap.py).
PRESWAP_SIGNS = ("remap-pending", "ecc-rate", "xid", "thermal", "pcie", "nvlink")
_XID_KEY = LazyPattern(r"[1-9][0-9]{0,5}")


def signal_name(value: str) -> str:
    """``SIGUSR2`` / ``usr2`` / ``USR2`` / ``12`` -> ``USR2``; ConfigError-free: "" when it is not a grace signal."""
    try:
        return signals.signal_name(value, catchable=True)
    except SignalNameError:
        return ""


@record
class HooksSection:
    """Node-side health checks and the Slurm entry points (healthcheck, prolog, epilog, xid-watch)."""

    state_dir: str = setting("/var/lib/autoheal/node", doc="Per-node state: last check result, seen XIDs, "
                             "consecutive passes, recovery-ladder counts. May contain {node}.")
    resume_after_passes: int = setting(2, doc="Consecutive passing healthchecks before we resume a node "
                                       "we drained.", min=1, max=100)
    resume_cooldown: float = setting(300.0, doc="Seconds after our drain before we may resume the node.",
                                     min=0, max=86400)
    # ---- sources ---------------------------------------------------------------------------------
    kernel_log: str = setting("/dev/kmsg", doc="Kernel log to scan for NVRM Xid lines: /dev/kmsg, or a file of "
                              "/dev/kmsg records written by root (only facility-0 records count; syslog and dmesg "
                              "text lines are not trusted: docs/security.md). May contain {node}. Empty: off.")
    expected_gpus: int = setting(-1, doc="GPUs this node must have. -1: count the node's gpu lines in "
                                 "gres.conf (next to slurm.conf); 0: do not check the count.", min=-1, max=256)
    gres_conf: str = setting("", doc="gres.conf to read the expected GPU count from (empty: the gres.conf "
                             "beside SLURM_CONF / slurm.slurm_conf, else /etc/slurm/gres.conf).")
    nvml_timeout: float = setting(8.0, doc="Seconds the healthcheck waits for all NVML reads; GPUs not read by "
                                  "then are 'unknown' (a hung GPU never hangs the hook; Slurm kills it at 60 s).",
                                  min=0.2, max=50)
    prolog_nvml_timeout: float = setting(3.0, doc="NVML budget of the prolog and epilog (they delay job start "
                                         "and end).", min=0.2, max=50)
    slurm_timeout: float = setting(5.0, doc="Seconds per scontrol call made by the hooks (the hooks must stay "
                                   "well inside Slurm's limits).", min=0.5, max=30)
    prolog_slurm_timeout: float = setting(2.0, doc="Seconds the prolog may wait for `scontrol -d show job` "
                                          "(to learn the job's GPU indices); on timeout no mapping is written.",
                                          min=0.2, max=30)
    prolog_max_age: float = setting(600.0, doc="A healthcheck result younger than this is reused by the prolog "
                                    "(plus cheap live reads).", min=0, max=86400)
    # ---- checks and thresholds -------------------------------------------------------------------
    disabled_checks: List[str] = setting(default_factory=list, doc="Checks to skip, among: "
                                         + ", ".join(CHECK_NAMES) + ".")
    ecc_dbe_max: int = setting(0, doc="Volatile uncorrectable (DBE) ECC errors tolerated since the last "
                               "reset/reboot; above this the GPU fails.", min=0, max=1000000)
    retired_pages_max: int = setting(60, doc="Retired pages (pre-A100 GPUs) above which the GPU should be "
                                     "replaced (NVIDIA's RMA limit is 64).", min=1, max=1000)
    pcie_check_gen: bool = setting(True, doc="Fail a busy GPU whose PCIe generation is below its max (the "
                                   "generation drops while idle, so idle GPUs are not judged).")
    pcie_check_width: bool = setting(True, doc="Fail a GPU whose PCIe link width is below its max.")
    nvlink_check: bool = setting(True, doc="Fail a GPU with an NVLink link down.")
    temperature_max: int = setting(90, doc="GPU temperature (C) at or above which the GPU fails.",
                                   min=30, max=130)
    temperature_warn: int = setting(85, doc="GPU temperature (C) at or above which the GPU warns.",
                                    min=30, max=130)
    clock_events_fail: bool = setting(False, doc="Fail (not only warn) on HW slowdown / thermal clock events.")
    driver_version: str = setting("", doc="Pin the driver version (e.g. 550.54.15); empty: any version.")
    persistence_required: bool = setting(True, doc="Warn when a GPU has persistence mode off (first NVML "
                                         "calls then take seconds).")
    unknown_runs_to_fail: int = setting(3, doc="Consecutive healthchecks in which a GPU could not be read "
                                        "(NVML hang) before it is failed as unresponsive.", min=1, max=100)
    # ---- XIDs ------------------------------------------------------------------------------------
    xid_policy: Dict[str, str] = setting(default_factory=dict, doc="Per-XID policy overriding the default "
                                         "built from NVIDIA's Xid catalog (`autoheal xid explain N`), e.g. "
                                         "{\"13\" = \"warn\", \"109\" = \"reset\"}. Values: "
                                         + ", ".join(XID_POLICIES) + ". An XID the catalog does not know: "
                                         "recovery (warn; NVML's recovery action decides).")
    app_xid_repeat: int = setting(5, doc="Application XIDs (policy job) of one job on one node within "
                                  "app_xid_window after which its user is told again. They never drain the "
                                  "node (a job's bug is the job's).", min=2, max=10000)
    app_xid_window: float = setting(3600.0, doc="Seconds over which one job's application XIDs are counted.",
                                    min=60, max=7 * 86400)
    lemon_faults: int = setting(3, doc="Hardware faults (drain episodes) within lemon_window, each after the "
                                "node was returned to service, that make it a lemon: drained 'autoheal: lemon: "
                                "...', no repair, no automatic return (the sync asks for a replacement). 0: off.",
                                min=0, max=1000)
    lemon_window: float = setting(7 * 86400.0, doc="Seconds over which lemon_faults are counted.", min=3600,
                                  max=365 * 86400)
    xid_dedupe_seconds: float = setting(120.0, doc="The same XID on the same GPU seen again within this many "
                                        "seconds (NVML event and kernel log, companion XIDs) is one fault.",
                                        min=0, max=86400)
    # ---- xid-watch -------------------------------------------------------------------------------
    xid_poll_ms: int = setting(1000, doc="nvmlEventSetWait timeout per loop of xid-watch (ms).", min=50,
                               max=60000)
    kernel_log_poll: float = setting(0.2, doc="Seconds between polls of a kernel-log file by xid-watch.",
                                     min=0.05, max=60)
    grace_signal: str = setting("TERM", doc="Signal xid-watch sends to the steps (never the batch shell) of "
                                "jobs on a node drained for a fault that asked for no --signal of their own "
                                "and are not run by `autoheal sbatch`; a job's own --signal wins. TERM: "
                                "requeue at once, KillWait is the grace.")
    grace_seconds: float = setting(120.0, doc="Seconds between the grace signal and the requeue (match "
                                   "KillWait; tell researchers: their --signal=SIG@<this>).", min=0, max=3600)
    runner_comment: str = setting(RUNNER_MARKER, doc="Job comment prefix of jobs run by `autoheal sbatch`: "
                                  "they get runner_signal on their batch shell and requeue themselves.")
    runner_signal: str = setting("USR2", doc="Signal for the batch shell of `autoheal sbatch` jobs.")
    xid_watch_self_check: float = setting(60.0, doc="Seconds between xid-watch's slow self-checks of the "
                                          "node in Slurm (jittered), which catch a drain for a GPU fault made by "
                                          "another process that could not record it; Slurm is otherwise asked "
                                          "only while a fault is open.", min=5, max=3600)
    xid_watch_health_poll: float = setting(5.0, doc="Seconds between xid-watch's polls of the NVML health "
                                           "state (the healthcheck's own reads and checks): a hard fault without "
                                           "an XID (uncorrectable ECC, row remap, page retirement, GPU lost, "
                                           "NVLink down, a recovery action) drains the node at once instead of "
                                           "at the next HealthCheckInterval. Thermal and PCIe are left to the "
                                           "healthcheck. 0: off; under 1 counts as 1.", min=0, max=3600)
    requeue_jobs: bool = setting(True, doc="Requeue jobs still running on the drained node after the grace "
                                 "window (false: leave them to Slurm / the user).")
    textfile_dir: str = setting("/var/lib/prometheus/node-exporter", doc="node-exporter textfile collector "
                                "directory for xid-watch counters (empty: off). May contain {node}.")
    # ---- DCGM mapping and recovery ladder --------------------------------------------------------
    dcgm_mapping_dir: str = setting("/var/run/dcgm-job-mapping", doc="dcgm-exporter --hpc-job-mapping-dir: "
                                    "one file per GPU index holding job ids (empty: off). May contain {node}.")
    reset_command: List[str] = setting(default_factory=lambda: ["nvidia-smi", "--gpu-reset", "-i", "{gpu}"],
                                       doc="argv of the GPU reset rung ({node}, {gpu} substituted); run "
                                       "only when the node is drained by us and idle. Empty: skip the rung.")
    reset_timeout: float = setting(30.0, doc="Seconds the reset command may take.", min=1, max=50)
    reboot_enabled: bool = setting(True, doc="Allow the reboot rung (`scontrol reboot ASAP nextstate=resume`).")
    ladder_window: float = setting(7 * 86400.0, doc="A fault that returns within this many seconds after a "
                                   "repair escalates to the next rung (reset -> reboot -> replace).",
                                   min=60, max=365 * 86400)

    # ---- pre-emptive swap (hot-spare jobs) --------------------------------------------------------
    preswap_signs: List[str] = setting(default_factory=lambda: list(PRESWAP_SIGNS), doc="Warning signs on which "
                                       "the healthcheck drains a node that runs the active step of an `autoheal "
                                       "sbatch --spare-nodes` job with a spare left, with the reason `autoheal: "
                                       "pre-emptive swap: ...`: the job goes on and its runner swaps the node for "
                                       "a spare at the next checkpoint. Among: " + ", ".join(PRESWAP_SIGNS)
                                       + " (remap-pending: row remap / page retirement pending; ecc-rate: XID 92, "
                                       "high correctable ECC rate; xid: preswap_xids repeated; thermal: thermal/HW "
                                       "slowdown or temperature_warn; pcie: link degraded; nvlink: link down). "
                                       "Other nodes are handled as without it. Empty: off.")
    preswap_xids: List[int] = setting(default_factory=lambda: [63, 64], doc="XIDs whose repetition on one GPU is "
                                      "a warning sign (sign 'xid'): 63 row remap recorded, 64 row remap failure.")
    preswap_xid_repeat: int = setting(2, doc="Times one of preswap_xids must be seen on one GPU within "
                                      "preswap_xid_window to be a warning sign.", min=1, max=10000)
    preswap_xid_window: float = setting(3600.0, doc="Seconds over which preswap_xids are counted (since the "
                                        "GPU's last repair).", min=60, max=7 * 86400)

    def validate(self) -> None:
        for name in self.disabled_checks:
            if name not in CHECK_NAMES:
                raise ConfigError(f"hooks.disabled_checks: unknown check {name!r}; use one of "
                                  + ", ".join(CHECK_NAMES))
        for key, value in self.xid_policy.items():
            # only canonical decimal XID numbers: "079" or "²" (isdigit() is True for it) would never match
            # an XID and the policy would be silently ignored
            if not (isinstance(key, str) and key.isascii() and _XID_KEY.fullmatch(key)):
                raise ConfigError(f"hooks.xid_policy: key {key!r} is not an XID number; write it in decimal "
                                  f"without leading zeros, e.g. \"79\"")
            if value not in XID_POLICIES:
                raise ConfigError(f"hooks.xid_policy.{key}: {value!r} is not allowed; use one of "
                                  + ", ".join(XID_POLICIES))
        for name in self.preswap_signs:
            if name not in PRESWAP_SIGNS:
                raise ConfigError(f"hooks.preswap_signs: unknown warning sign {name!r}; use one of "
                                  + ", ".join(PRESWAP_SIGNS))
        for xid in self.preswap_xids:
            if not (isinstance(xid, int) and not isinstance(xid, bool) and 0 < xid < 1000000):
                raise ConfigError(f"hooks.preswap_xids: {xid!r} is not an XID number")
        if self.temperature_warn > self.temperature_max:
            raise ConfigError("hooks.temperature_warn: must not exceed hooks.temperature_max")
        for key in ("grace_signal", "runner_signal"):
            value = getattr(self, key)
            if not signal_name(value):
                raise ConfigError(f"hooks.{key}: {value!r} is not a signal a job can catch; use one of "
                                  + ", ".join(GRACE_SIGNALS) + " (with or without SIG)")
