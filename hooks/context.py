"""What every node-side entry point needs: the node name, the config, the node state, a Slurm
adapter with the hooks' short timeouts, the journal, and the expected GPU count.

Kept free of click and of anything slow to import: HealthCheckProgram runs every few minutes on every
node and its start-up time is the budget.
"""

from __future__ import annotations

import os
import sys

from autoheal.events import Event
from autoheal.hooks.state import NodeState, expand

TYPE_CHECKING = False  # typing is for mypy only: not imported at run time (the hooks start fast)
if TYPE_CHECKING:  # imported lazily below: hooks start fast
    from typing import Any, Optional

    from autoheal.config import Config
    from autoheal.journal import Journal
    from autoheal.notify import Notifier
    from autoheal.slurm.base import SlurmAdapter


def node_name(explicit: Optional[str] = None) -> str:
    """``--node``, else $SLURMD_NODENAME (Slurm sets it for hooks), $AUTOHEAL_NODE, the short hostname."""
    name = explicit or os.environ.get("SLURMD_NODENAME") or os.environ.get("AUTOHEAL_NODE")
    if name:
        return name
    import socket  # Slurm names the node for its hooks: socket only for a hand-run command

    return socket.gethostname().split(".")[0]


#: Seconds a hook waits for the node-state lock before it goes on with an in-memory copy. The prolog and
#: epilog delay every job start and end: they never wait long behind a stuck hook.
LOCK_TIMEOUT = {"prolog": 3.0, "epilog": 3.0, "xid-watch": 5.0}


class Context:
    """Lazily built collaborators for one run on one node."""

    def __init__(self, config: Config, node: str, source: str) -> None:
        self.cfg = config
        self.hooks = config.hooks
        self.node = node
        self.source = source
        # fallback: a read-only or full state dir, or a lock held by a stuck hook, is our own trouble:
        # the hook goes on with an in-memory copy and reports it; it never fails Slurm for it
        self.store = NodeState(expand(self.hooks.state_dir, node), lock_timeout=LOCK_TIMEOUT.get(source, 10.0),
                               fallback=True)
        self._slurm: Optional[SlurmAdapter] = None
        self._journal: Optional[Journal] = None
        self._notifier: Optional[Notifier] = None

    @classmethod
    def load(cls, source: str, node: Optional[str] = None, config_path: Optional[str] = None) -> Context:
        from autoheal.config import load_config

        # a trusted snapshot of the parsed config, when this very file was parsed before: no TOML, no
        # validation on a healthy pass (autoheal.config.snapshot)
        return cls(load_config(config_path, snapshot=True), node_name(node), source)

    def path(self, template: str) -> str:
        return expand(template, self.node)

    @property
    def slurm(self) -> SlurmAdapter:
        """The backend ``[slurm] backend`` chooses, with the hooks' timeouts (a hook must never wait long
        for slurmctld); built on first use, importing only that backend."""
        if self._slurm is None:
            from autoheal.slurm import get_adapter

            self._slurm = get_adapter(self.cfg, timeout=self.hooks.slurm_timeout, retries=1)
        return self._slurm

    @slurm.setter
    def slurm(self, adapter: SlurmAdapter) -> None:
        self._slurm = adapter

    @property
    def journal(self) -> Journal:
        if self._journal is None:
            from autoheal.journal import Journal

            self._journal = Journal.from_config(self.cfg)
        return self._journal

    def record(self, event: Event, **fields: Any) -> None:
        """Journal and notify actions and errors; never fails the caller and never waits for a webhook
        (deliveries run in the background; ``close`` waits a bounded time for them at exit)."""
        fields.setdefault("node", self.node)
        fields.setdefault("source", self.source)
        try:
            rec = self.journal.record(event, **fields)
        except Exception as exc:  # a journal path Python refuses (NUL), a bad field: say it, go on
            print(f"autoheal: warning: journal: {type(exc).__name__}: {exc}", file=sys.stderr)
            return
        if rec is not None and rec.severity in ("action", "error") and self.cfg.notify.webhooks:
            try:
                if self._notifier is None:
                    from autoheal.notify import Notifier

                    self._notifier = Notifier.from_config(self.cfg, self.journal)
                self._notifier.send(rec)
                self._notifier.flush(0)  # only forgets finished deliveries; never waits
            except Exception as exc:  # notifications are best effort
                print(f"autoheal: warning: notify failed: {exc}", file=sys.stderr)

    def close(self, timeout: Optional[float] = None) -> None:
        """At process exit: give pending notifications a bounded time (``notify.timeout``, at most 5 s)."""
        if self._notifier is None:
            return
        limit = min(5.0, self.cfg.notify.timeout) if timeout is None else timeout
        try:
            self._notifier.flush(limit)
        except Exception:
            pass

    def expected_gpus(self) -> int:
        """``hooks.expected_gpus``, or (-1) the GPUs gres.conf gives this node; 0 = do not check."""
        if self.hooks.expected_gpus >= 0:
            return self.hooks.expected_gpus
        path = self.hooks.gres_conf
        if not path:
            conf = self.cfg.slurm.slurm_conf or os.environ.get("SLURM_CONF") or "/etc/slurm/slurm.conf"
            path = os.path.join(os.path.dirname(conf), "gres.conf")
        try:
            with open(path, encoding="utf-8") as fh:
                return gres_gpu_count(fh.read(), self.node)
        except OSError:
            return 0


def gres_gpu_count(text: str, node: str) -> int:
    """GPUs gres.conf declares for ``node`` (``File=/dev/nvidia[0-7]`` or ``Count=8``); 0 when it
    cannot tell (AutoDetect, no gpu lines)."""
    from autoheal.slurm.hostlist import expand as hl_expand

    total = 0
    for raw in text.splitlines():
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        kv = {}
        for tok in line.split():
            if "=" in tok:
                k, v = tok.split("=", 1)
                kv[k.lower()] = v
        if kv.get("name") != "gpu":
            continue
        if "nodename" in kv:
            try:
                if node not in hl_expand(kv["nodename"]):
                    continue
            except Exception:
                continue
        if "count" in kv:
            try:
                total += int(kv["count"])
                continue
            except ValueError:
                return 0
        if "file" in kv:
            try:
                total += len(hl_expand(kv["file"]))
            except Exception:
                return 0
    return total


def report_own_trouble(hook: str, ctx: Optional[Context], what: str, err: BaseException | str) -> str:
    """Say, in one line and without a traceback, that a hook hit trouble of its own (config, state dir,
    a bug): a journal ``error`` record when the journal can be written, and always stderr (slurmd logs
    it). Returns the line. Never raises."""
    from autoheal.reasons import sanitize

    detail = err if isinstance(err, str) else f"{type(err).__name__}: {err}"
    line = sanitize(f"{what}: {detail}", 500)
    print(f"autoheal-{hook}: error: {line}", file=sys.stderr, flush=True)
    try:
        if ctx is not None:
            ctx.record(Event.ERROR, action="hook-trouble", message=f"{hook}: {line}", severity="error")
            return line
        from autoheal.journal import Journal

        Journal(_salvage_journal_path()).record(Event.ERROR, node=node_name(), source=hook, action="hook-trouble",
                                                message=f"{hook}: {line}", severity="error")
    except Exception:
        pass
    return line


def _salvage_journal_path() -> str:
    """The journal path of a config that did not load: its ``[journal] path`` if the file still parses
    as TOML, else the default."""
    from autoheal.config.core_sections import JournalSection

    try:
        from autoheal.config import config_path

        if sys.version_info >= (3, 11):
            import tomllib
        else:  # pragma: no cover - 3.9/3.10 compute nodes
            import tomli as tomllib
        path, _required = config_path()
        data = tomllib.loads(path.read_text(encoding="utf-8"))
        value = data.get("journal", {}).get("path")
        if isinstance(value, str) and value and "\0" not in value:
            return value
    except Exception:  # RecursionError, a missing file, anything: the default is the best guess
        pass
    return JournalSection().path
