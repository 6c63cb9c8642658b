"""Installation checks of `autoheal doctor`: hook programs, autoheal config, NVML, xid-watch, journal.

Every check only reads (stat, open for reading, NVML init/shutdown): doctor never changes anything.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Dict, List, Optional, Tuple

from autoheal.slurm_conf import values
from autoheal.slurm_conf.checks import FAIL, OK, SKIP, WARN, Finding, lookup

if TYPE_CHECKING:
    from autoheal.config import Config

HOOK_KEYS = ("HealthCheckProgram", "Prolog", "Epilog")


def hook_paths(conf: Dict[str, str]) -> List[Tuple[str, str]]:
    """(key, path) for every hook program Slurm will run. Prolog/Epilog may list several (comma)."""
    out = []
    for key in HOOK_KEYS:
        value = lookup(conf, key)
        if values.is_null(value):
            continue
        for path in values.items(value):
            out.append((key, path))
    return out


def check_hooks(conf: Dict[str, str]) -> List[Finding]:
    """Each hook program exists and is executable at the path Slurm uses (on this node)."""
    findings = []
    for key, path in hook_paths(conf):
        fid = f"hook_{key.lower()}"
        why = f"slurmd runs {key} by this exact path, as root, with almost no environment."
        if any(ch in path for ch in "*?["):
            # Prolog/Epilog accept globs (23.02+): check the directory holds at least one program.
            matches = sorted(str(p) for p in Path(path).parent.glob(Path(path).name))
            ok = [m for m in matches if os.access(m, os.X_OK)]
            status = OK if ok else FAIL
            findings.append(Finding(fid, status, f"{key} program", path, "executable file(s) matching",
                                    why, f"{len(ok)} executable match(es)" if ok else
                                    "no executable matches: the hook never runs", kind="install"))
            continue
        p = Path(path)
        if not p.is_absolute():
            status, effect = FAIL, "Slurm needs an absolute path: the hook never runs"
        elif not p.exists():
            status, effect = FAIL, "file missing: slurmd logs an error and the check never runs"
        elif not p.is_file():
            status, effect = FAIL, "not a regular file"
        elif not os.access(p, os.X_OK):
            status, effect = FAIL, "not executable: the hook fails every time (prolog failures drain nodes)"
        else:
            status, effect = OK, "exists and is executable"
        findings.append(Finding(fid, status, f"{key} program", path, "existing executable file", why, effect,
                                kind="install"))
    return findings


def check_config(config_path: Optional[str]) -> Tuple[Finding, Optional[Config]]:
    """The autoheal config validates. Returns (finding, config or None)."""
    from autoheal.config import config_path as resolve
    from autoheal.config import load_config
    from autoheal.errors import ConfigError

    path, _explicit = resolve(config_path)
    why = "Every autoheal hook and daemon reads it; a bad key stops them all."
    try:
        cfg = load_config(config_path)
    except ConfigError as exc:
        return Finding("autoheal_config", FAIL, "autoheal config", str(path), "a valid config", why, str(exc),
                       kind="install"), None
    shown = cfg.source or f"{path} (absent: all defaults)"
    return Finding("autoheal_config", OK, "autoheal config", shown, "a valid config", why, "validates",
                   kind="install"), cfg


def _nvml_probe() -> int:
    import pynvml

    pynvml.nvmlInit()
    try:
        return int(pynvml.nvmlDeviceGetCount())
    finally:
        try:
            pynvml.nvmlShutdown()
        except Exception:
            pass


def check_nvml(expected_gpus: int, timeout: float = 10.0, probe: Callable[[], int] = _nvml_probe) -> Finding:
    """NVML loads and sees GPUs, bounded by ``timeout`` (a hung driver must not hang doctor)."""
    why = "The healthcheck, prolog and xid-watch read GPU health through NVML."
    if not expected_gpus:
        return Finding("nvml", SKIP, "NVML", "", "loads on GPU nodes", why,
                       "hooks.expected_gpus is 0 or unset: not a GPU node", kind="install")
    result: Dict[str, int | str] = {}

    def run() -> None:
        try:
            result["count"] = probe()
        except Exception as exc:
            result["error"] = f"{type(exc).__name__}: {exc}"

    t = threading.Thread(target=run, name="doctor-nvml", daemon=True)
    t.start()
    t.join(timeout)
    if t.is_alive():
        return Finding("nvml", FAIL, "NVML", f"no answer in {timeout:g} s", "nvmlInit answers", why,
                       "NVML hangs: every GPU check on this node will time out", kind="install")
    if "error" in result:
        return Finding("nvml", FAIL, "NVML", str(result["error"])[:200], "nvmlInit succeeds", why,
                       "GPU checks cannot run on this node", kind="install")
    count = int(result.get("count", 0))
    status = OK if count == expected_gpus else WARN
    effect = "loads" if status == OK else f"NVML sees {count} GPU(s), config expects {expected_gpus}"
    return Finding("nvml", status, "NVML", f"{count} GPU(s)", f"{expected_gpus} GPU(s)", why, effect,
                   kind="install")


def xid_watch_pids(proc: str = "/proc") -> List[int]:
    """PIDs whose command line runs ``xid-watch`` (``autoheal xid-watch`` or the module)."""
    pids = []
    for entry in Path(proc).iterdir() if Path(proc).is_dir() else []:
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if any(a == b"xid-watch" or a.endswith(b"xid_watch") for a in argv):
            pids.append(int(entry.name))
    return sorted(pids)


def check_xid_watch(proc: str = "/proc") -> Finding:
    """An xid-watch daemon runs on this node."""
    why = "xid-watch sees GPU errors (XIDs) as they happen, between healthchecks."
    pids = xid_watch_pids(proc)
    if pids:
        return Finding("xid_watch", OK, "xid-watch daemon", f"running (pid {', '.join(map(str, pids[:5]))})",
                       "running", why, "XIDs are acted on within seconds", kind="install")
    return Finding("xid_watch", WARN, "xid-watch daemon", "not running", "running (systemd unit "
                   "autoheal-xid-watch)", why, "XIDs are noticed only at the next healthcheck/prolog",
                   kind="install")


def check_journal(path: str) -> Finding:
    """The journal can be appended to, tested without writing: open for append (no write) or dir perms."""
    why = "Every detection and action is recorded there; hooks must not fail to record."
    p = Path(path)
    if p.exists():
        try:
            # O_APPEND without writing: proves permission, leaves the file byte-identical.
            fd = os.open(p, os.O_WRONLY | os.O_APPEND)
            os.close(fd)
        except OSError as exc:
            return Finding("journal", FAIL, "journal", path, "writable", why, f"cannot append: {exc.strerror}",
                           kind="install")
        return Finding("journal", OK, "journal", path, "writable", why, "appendable", kind="install")
    parent = p.parent
    while not parent.exists() and parent != parent.parent:
        parent = parent.parent
    if os.access(parent, os.W_OK | os.X_OK):
        return Finding("journal", OK, "journal", f"{path} (not yet created)", "writable", why,
                       f"{parent} is writable: created on first record", kind="install")
    return Finding("journal", FAIL, "journal", path, "writable", why, f"{parent} is not writable",
                   kind="install")
