"""The site's secrets file (``notify.secrets_file``): what only root's processes may read.

The main config must be readable by every user (the job runner, running as the user, reads its Slurm
and spool settings), so it must hold nothing secret: whoever has a Slack webhook URL can post fake
alerts to the on-call (issue 25, item 4). The webhook URLs go in a second TOML file, owned by root and
mode 0600::

    [notify]
    webhooks = ["https://hooks.slack.com/services/T000/B000/XXXX"]

Root's processes (hooks, xid-watch, guard, sync) read both files; the job runner never reads this one.
A process that may not read it (any user's) goes on without it, silently. A file others can change, or
owned by another user, is a ConfigError (whoever can write it redirects every alert); one others can
read works, with a warning. An older install with ``webhooks`` in the main file keeps working, with a
warning (to root) when others can read that file.
"""

from __future__ import annotations

import os
import stat
import sys

from autoheal.config import values as V
from autoheal.config.schema import from_mapping, setting
from autoheal.errors import ConfigError
from autoheal.records import record

TYPE_CHECKING = False  # typing and pathlib are not imported at run time: the hooks start fast

if TYPE_CHECKING:
    from typing import List, Optional, Set

    from autoheal.config import Config

_WARNED: Set[str] = set()
MAX_BYTES = 1 << 16


@record
class NotifySecrets:
    """The ``[notify]`` table of the secrets file."""

    webhooks: List[str] = setting(default_factory=list, doc="Webhook URLs, added to notify.webhooks.",
                                  item=V.http_url)


@record
class SecretsFile:
    """The whole secrets file."""

    notify: NotifySecrets = setting(default_factory=NotifySecrets, doc="Notification secrets.")


def warn_once(text: str) -> None:
    if text not in _WARNED:
        _WARNED.add(text)
        print(f"autoheal: warning: {text}", file=sys.stderr)


def others_can_read(path: Optional[str]) -> bool:
    if not path:
        return False
    try:
        return bool(os.stat(path).st_mode & (stat.S_IRGRP | stat.S_IROTH))
    except OSError:
        return False


def merge_secrets(cfg: Config, snapshot: bool = False) -> None:
    """Add the secrets file's webhooks to ``cfg`` (see the module docstring); ConfigError when it is unsafe
    or invalid. ``snapshot``: use (and leave) the webhooks parsed before from the file's very bytes
    (``autoheal.config.snapshot``: the hooks); the owner and mode checks are made either way."""
    from autoheal.config import _one_line

    euid = os.geteuid()
    if cfg.notify.webhooks and euid == 0 and others_can_read(cfg.source):
        warn_once(f"{cfg.source}: notify.webhooks can be read by every user, who can then post fake alerts: "
                  f"move them to {cfg.notify.secrets_file} (owned by root, mode 0600)")
    path = cfg.notify.secrets_file
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        return
    except PermissionError:
        if euid != 0:
            return  # root's secrets, not this user's: go on without them
        raise ConfigError(_one_line(f"{path}: cannot read the secrets file: permission denied")) from None
    except (OSError, ValueError) as exc:
        raise ConfigError(_one_line(f"{path}: cannot read the secrets file: "
                                    f"{getattr(exc, 'strerror', None) or exc}")) from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise ConfigError(_one_line(f"{path}: the secrets file is not a regular file"))
        if st.st_uid not in (0, euid):
            raise ConfigError(_one_line(f"{path}: the secrets file is owned by uid {st.st_uid}, not root: "
                                        f"not used (chown root {path})"))
        if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
            raise ConfigError(_one_line(f"{path}: other users can change the secrets file: not used "
                                        f"(chmod 0600 {path})"))
        if st.st_mode & (stat.S_IRGRP | stat.S_IROTH):
            warn_once(f"{path}: other users can read the secrets file: chmod 0600 {path}")
        with os.fdopen(fd, "rb", closefd=False) as fh:
            data = fh.read(MAX_BYTES + 1)
    finally:
        os.close(fd)
    if len(data) > MAX_BYTES:
        raise ConfigError(_one_line(f"{path}: more than {MAX_BYTES} bytes; not a secrets file"))
    webhooks: Optional[List[str]] = None
    if snapshot:
        from autoheal.config import snapshot as snap

        webhooks = snap.load_secrets(path, data)  # parsed before from these very bytes: no TOML
    if webhooks is None:
        webhooks = _parse(path, data)
        if snapshot:
            snap.write_secrets(path, data, webhooks)
    cfg.notify.webhooks = list(dict.fromkeys(cfg.notify.webhooks + webhooks))


def _parse(path: str, data: bytes) -> List[str]:
    """The webhooks of the secrets file's bytes; ConfigError naming the file when they are not valid."""
    from autoheal.config import _one_line

    if sys.version_info >= (3, 11):  # only when there is a secrets file: most nodes have none
        import tomllib
    else:  # pragma: no cover - exercised on 3.9/3.10 compute nodes
        import tomli as tomllib
    try:
        doc = tomllib.loads(data.decode("utf-8-sig"))
        found: SecretsFile = from_mapping(SecretsFile, doc)
    except ConfigError as exc:
        raise ConfigError(_one_line(f"{path}: {exc}")) from None
    except (ValueError, RecursionError) as exc:  # not TOML, not UTF-8, nested too deep
        raise ConfigError(_one_line(f"{path}: not a valid secrets file: {exc}")) from None
    return list(found.notify.webhooks)
