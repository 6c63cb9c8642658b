"""A validated snapshot of the parsed config, so the hooks do not parse and validate TOML on every run.

Slurm starts the healthcheck on every node every ``HealthCheckInterval`` and the prolog and epilog
around every job, each a fresh process; parsing the TOML (``tomllib``) and validating every section
(``typing.get_type_hints``, every value's checks) was a fifth of a healthy pass (issue 24 section 6).
After a parse that succeeded, a hook running as root writes the validated values as JSON to
``/run/autoheal/config-snapshot-<crc32 of the config path>`` (tmpfs: gone at boot); the next hook uses
it instead of parsing, when and only when all of this holds:

* the directory and the file are root's and nobody else can write them (written 0700 and 0600;
  checked: no group or other write bit, one link, a regular file opened without following a symlink):
  the hooks run as root and never trust a file a user could write;
* its key equals the live one: the config path, the length and ``zlib.crc32`` of the config file's
  bytes as read now (the content, not a ``stat``: an NFS client serves a path ``stat`` from its attribute
  cache for up to a minute after an edit, and a same-size rewrite within one coarse timestamp tick keeps
  size and times), this package's version and the (size, mtime_ns) of the config's own modules (a new schema
  or validator is never fed an old snapshot);
* it parses as a snapshot and builds the config's sections (an unknown or missing field, a wrong shape:
  parse the TOML).

Anything else, and any error, means "parse the TOML as before" (and write a new snapshot). A snapshot is
only written when the config rebuilt from it equals the parsed one. The secrets file is never part of it
(``merge_secrets`` runs after either way, with the owner and mode checks on the secrets file it always
makes); the webhooks it parses are kept the same way in a snapshot of their own
(``secrets-snapshot-<crc32 of its path>``, 0600 like the secrets file), keyed by that file's bytes, so a
site with a secrets file does not parse TOML on every hook either. No config file (all defaults) has
nothing to snapshot.
"""

from __future__ import annotations

import dataclasses
import json
import os
import stat
import sys
import zlib

TYPE_CHECKING = False  # typing is not imported at run time: the hooks start fast
if TYPE_CHECKING:
    from typing import Any, Dict, List, Optional

    from autoheal.config import Config

#: tmpfs on every systemd machine, root's; a reboot (a new driver, a new config) starts afresh.
SNAPSHOT_DIR = "/run/autoheal"
FORMAT = 1
#: Who must own the directory and the file, and the only user who writes them: root, who runs the hooks.
TRUSTED_UID = 0
#: A snapshot is the config's values as JSON: a few kilobytes. Larger is not ours.
MAX_BYTES = 1 << 20
#: The modules whose code decides what a config file means: a change to any of them is a new key.
_CODE = ("autoheal.config", "autoheal.config.schema", "autoheal.config.values", "autoheal.config.core_sections",
         "autoheal.config.hooks_section", "autoheal.config.sbatch_section", "autoheal.config.sync_section",
         "autoheal.config.snapshot", "autoheal.records", "autoheal.signals",
         "autoheal.reasons", "autoheal.lazyre")


def snapshot_path(config_path: str, directory: Optional[str] = None) -> str:
    """Where the snapshot of the config at ``config_path`` lives (one file per config path, so lab nodes
    with configs of their own on one machine do not overwrite each other's)."""
    name = "config-snapshot-%08x" % zlib.crc32(os.fsencode(config_path))
    return os.path.join(SNAPSHOT_DIR if directory is None else directory, name)


def file_key(data: bytes) -> List[int]:
    """The identity of the config file's content: its length and CRC-32. crc32, not a cryptographic hash
    (hashlib is kept off the hooks' imports): only root writes the snapshot and the config file is the
    admin's, so there is no adversary to resist; the checksum only has to notice an edit, and any edit
    that keeps both the length and the CRC-32 of a text file by accident is one in 2**32."""
    return [len(data), zlib.crc32(data)]


def code_key() -> List[Any]:
    """This package's version and the (size, mtime_ns) of the config's modules."""
    import autoheal

    out: List[Any] = [autoheal.__version__, sys.version_info[:2]]
    for name in _CODE:
        where = getattr(sys.modules.get(name), "__file__", None)
        try:
            st = os.stat(where) if where else None
        except OSError:
            st = None
        out.append([st.st_size, st.st_mtime_ns] if st is not None else None)
    back: List[Any] = json.loads(json.dumps(out))  # as it reads back from the file (tuples are lists)
    return back


def _trusted_dir(directory: str) -> bool:
    try:
        st = os.lstat(directory)
    except OSError:
        return False
    return stat.S_ISDIR(st.st_mode) and st.st_uid == TRUSTED_UID and not st.st_mode & (stat.S_IWGRP | stat.S_IWOTH)


def _read_trusted(path: str) -> Optional[bytes]:
    """The snapshot's bytes when root owns it and nobody else can change it; else None."""
    if not _trusted_dir(os.path.dirname(path)):
        return None
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except (OSError, ValueError):
        return None
    try:
        st = os.fstat(fd)
        if (not stat.S_ISREG(st.st_mode) or st.st_uid != TRUSTED_UID or st.st_nlink != 1
                or st.st_mode & (stat.S_IWGRP | stat.S_IWOTH) or st.st_size > MAX_BYTES):
            return None
        with os.fdopen(fd, "rb", closefd=False) as fh:
            data = fh.read(MAX_BYTES + 1)
        return data if len(data) <= MAX_BYTES else None
    except OSError:
        return None
    finally:
        os.close(fd)


def build(cls: type, data: Any) -> Any:
    """``cls`` (a config dataclass) from its values as ``to_mapping`` wrote them; nested sections (fields
    whose default factory is a dataclass) built the same way. TypeError/ValueError on a wrong shape."""
    if not isinstance(data, dict):
        raise ValueError(f"{cls.__name__}: not a table")
    kwargs: Dict[str, Any] = {}
    for f in dataclasses.fields(cls):
        if f.name not in data:
            raise ValueError(f"{cls.__name__}.{f.name}: missing")
        value = data[f.name]
        factory = f.default_factory
        if isinstance(factory, type) and dataclasses.is_dataclass(factory):
            value = build(factory, value)
        kwargs[f.name] = value
    if len(kwargs) != len(data):
        raise ValueError(f"{cls.__name__}: unknown fields")
    return cls(**kwargs)


def load(config_path: str, directory: Optional[str] = None) -> Optional[Config]:
    """The config the snapshot of ``config_path`` holds, when it is trusted and its key is the live one;
    None otherwise (the caller parses the TOML). Never raises."""
    try:
        from autoheal.config import Config, _read_config_bytes

        raw = _read_trusted(snapshot_path(config_path, directory))
        if raw is None:
            return None
        doc = json.loads(raw)
        if not isinstance(doc, dict) or doc.get("format") != FORMAT:
            return None
        live = {"path": config_path, "file": file_key(_read_config_bytes(config_path)), "code": code_key()}
        if doc.get("key") != live:
            return None
        cfg: Config = build(Config, doc.get("config"))
        return cfg if cfg.source == config_path else None
    except Exception:  # a torn, hand-edited or foreign file: parse as before
        return None


def secrets_path(secrets_file: str, directory: Optional[str] = None) -> str:
    """Where the parsed webhooks of the secrets file at ``secrets_file`` are kept (beside the config's)."""
    name = "secrets-snapshot-%08x" % zlib.crc32(os.fsencode(secrets_file))
    return os.path.join(SNAPSHOT_DIR if directory is None else directory, name)


def load_secrets(secrets_file: str, data: bytes, directory: Optional[str] = None) -> Optional[List[str]]:
    """The webhooks parsed before from these very bytes of ``secrets_file`` (read and checked by the
    caller: owner, mode), when that snapshot is trusted and keyed by them; None otherwise (the caller
    parses the TOML). Never raises."""
    try:
        raw = _read_trusted(secrets_path(secrets_file, directory))
        if raw is None:
            return None
        doc = json.loads(raw)
        live = {"path": secrets_file, "file": file_key(data), "code": code_key()}
        if not isinstance(doc, dict) or doc.get("format") != FORMAT or doc.get("key") != live:
            return None
        hooks = doc.get("webhooks")
        if not isinstance(hooks, list) or not all(isinstance(h, str) for h in hooks):
            return None
        return hooks
    except Exception:  # a torn, hand-edited or foreign file: parse as before
        return None


def write_secrets(secrets_file: str, data: bytes, webhooks: List[str], directory: Optional[str] = None) -> bool:
    """Leave the webhooks parsed from ``data`` (the bytes of ``secrets_file``) for the next hook: only
    root, only into the root-only directory, mode 0600 (as the secrets file itself must be). False when
    none was written; never raises."""
    if os.geteuid() != TRUSTED_UID:
        return False
    try:
        where = _own_dir(directory)
        if where is None:
            return False
        doc = {"format": FORMAT, "key": {"path": secrets_file, "file": file_key(data), "code": code_key()},
               "webhooks": list(webhooks)}
        from autoheal.atomicfile import write_atomic

        write_atomic(secrets_path(secrets_file, where), json.dumps(doc, separators=(",", ":")).encode(),
                     mode=0o600, fsync=False)
        return True
    except Exception:
        return False


def _own_dir(directory: Optional[str]) -> Optional[str]:
    """The snapshot directory, made 0700 when missing; None when it is not root's alone."""
    where = SNAPSHOT_DIR if directory is None else directory
    try:
        os.mkdir(where, 0o700)
    except FileExistsError:
        pass
    return where if _trusted_dir(where) else None


def write(cfg: Config, text: bytes, directory: Optional[str] = None) -> bool:
    """Leave a snapshot of ``cfg``, parsed from ``text``, the bytes read from ``cfg.source`` (the key is
    computed on the very bytes that were parsed: an edit after the read makes the next key differ).
    Only root writes one, only into a directory that is root's alone, and only when the config rebuilt
    from it equals ``cfg``. False when none was written; never raises (the snapshot only saves time)."""
    from autoheal.config import Config
    from autoheal.config.schema import to_mapping

    if os.geteuid() != TRUSTED_UID or not cfg.source:
        return False
    try:
        where = _own_dir(directory)
        if where is None:
            return False
        values = to_mapping(cfg)
        data = json.dumps({"format": FORMAT, "key": {"path": cfg.source, "file": file_key(text), "code": code_key()},
                           "config": values}, separators=(",", ":")).encode()
        if build(Config, json.loads(data)["config"]) != cfg:  # a value JSON does not carry as it is
            return False
        from autoheal.atomicfile import write_atomic

        write_atomic(snapshot_path(cfg.source, where), data, mode=0o600, fsync=False)
        return True
    except Exception:
        return False
