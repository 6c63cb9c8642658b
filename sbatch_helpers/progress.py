"""A progress marker for jobs whose checkpoints are not in autoheal's format.

Frameworks keep their own checkpoints (submitit pickles the callable, Lightning writes ``.ckpt`` files).
The runner cannot read those, so without help it would record ``step=none`` at every restart and the
no-progress rule ("two restarts in a row resume from the same step") could stop a job that is making
progress. One call from the training loop, after each of the framework's checkpoints, fixes that::

    from autoheal.sbatch_helpers import report_progress
    report_progress(step)          # into $AUTOHEAL_CHECKPOINT_DIR (no-op outside `autoheal sbatch`)

The marker is a small JSON file written atomically (temp file, fsync, rename); reading it opens only a
regular file of bounded size, so a broken or hostile marker is ignored, never a hang.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import logging
import math
import os
import re
import stat
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, Iterator, Mapping, Optional, Set, Tuple, Union

log = logging.getLogger(__name__)

PROGRESS_FILE = "autoheal-progress.json"
_MAX_BYTES = 4096


def report_progress(step: int, directory: Union[str, os.PathLike[str], None] = None,
                    environ: Optional[Mapping[str, str]] = None) -> Optional[Path]:
    """Record that training reached ``step`` (a checkpoint of the framework's own exists for it).

    ``directory`` defaults to ``$AUTOHEAL_CHECKPOINT_DIR``; without either nothing is written and None
    is returned, so the call is safe in code that also runs outside ``autoheal sbatch``. Only rank 0
    (``RANK``/``SLURM_PROCID`` unset or 0) writes the marker; every rank also writes a :func:`heartbeat`."""
    from autoheal.sbatch_helpers.checkpoint import CheckpointError, _write_durable, env_rank

    env = os.environ if environ is None else environ
    target = directory if directory is not None else env.get("AUTOHEAL_CHECKPOINT_DIR")
    if not target:
        return None
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        raise CheckpointError(f"report_progress: step must be a whole number >= 0, got {step!r}")
    beat = heartbeat_file(env, directory=target)  # a framework's checkpoint is progress too (every rank)
    if beat is not None:
        _write_heartbeat(beat, step, PHASE_SAVED, force=True)
    if env_rank(env) != 0:
        return None
    path = Path(target) / PROGRESS_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    data = {"step": step, "time": round(time.time(), 3), "job": env.get("SLURM_JOB_ID", "")}
    _write_durable(path, json.dumps(data).encode())
    return path


def read_progress(directory: Union[str, os.PathLike[str], None]) -> Optional[int]:
    """The step of the last ``report_progress`` in ``directory``; None when there is none or it is not
    a small regular file holding a step."""
    from autoheal.sbatch_helpers.checkpoint import _read_regular

    if not directory:
        return None
    try:
        data = json.loads(_read_regular(Path(directory) / PROGRESS_FILE, limit=_MAX_BYTES))
    except (OSError, ValueError, RecursionError):
        return None
    step = data.get("step") if isinstance(data, dict) else None
    return step if isinstance(step, int) and not isinstance(step, bool) and step >= 0 else None


# ---------------------------------------------------------------- heartbeats (issue 23 §2: hang detection)
#
# Each rank says "I am alive at step N" with ``heartbeat(step)`` from its training loop and marks a
# checkpoint save with ``with saving(step):``. The runner (``hang.py``) reads the records to tell a blocked
# step (no rank advances) from a slow one (a long save, a long first step). One small file per rank,
# ``<checkpoint dir>/.autoheal-heartbeat/rank-<N>``, replaced atomically (temp file, rename). No fsync: a
# heartbeat is a liveness hint, not data, and an fsync per step on a shared filesystem is what makes
# heartbeats expensive. Writes of the same phase closer than HEARTBEAT_MIN_INTERVAL are skipped (a loop of
# 1,000 steps/s writes 2 files/s), so the recorded step may lag the real one by that much; a phase change
# (a save starting or ending) is always written.

HEARTBEAT_DIR = ".autoheal-heartbeat"
HEARTBEAT_MIN_INTERVAL = 0.5
#: ``step``: the training loop's own heartbeat(); ``saving``: inside a save; ``saved``: a save ended or a
#: framework's checkpoint was reported. The runner's watchdog judges only jobs that write ``step``
#: heartbeats: a job whose only records come from its (rare) saves is never ended for being quiet.
PHASE_STEP = "step"
PHASE_SAVING = "saving"
PHASE_SAVED = "saved"
PHASES = (PHASE_STEP, PHASE_SAVING, PHASE_SAVED)
_HEARTBEAT_RE = re.compile(r"^rank-(\d{1,7})$")
_MAX_HEARTBEAT_BYTES = 1024
#: Directory entries looked at when reading: a user may put millions of files there; the runner's poll
#: must stay bounded (a job has far fewer ranks than this).
MAX_HEARTBEAT_ENTRIES = 100_000
_O_NEW = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)

_hb_lock = threading.Lock()
_hb_last: Dict[Path, Tuple[float, str]] = {}   # path -> (monotonic time of the last write, its phase)
_hb_saving: Dict[Path, int] = {}               # path -> depth of nested saving() blocks
_hb_warned: Set[Path] = set()
_hb_paths: Dict[Tuple[str, Optional[int], Optional[str], Optional[str], Optional[str]], Path] = {}


@dataclass(frozen=True)
class Heartbeat:
    """One rank's last heartbeat: ``time`` is the writer's wall clock (seconds since the epoch); for the
    ``saving`` phase it is when the save began."""

    rank: int
    step: int
    time: float
    phase: str


def heartbeat_file(env: Mapping[str, str], rank: Optional[int] = None,
                   directory: Union[str, os.PathLike[str], None] = None) -> Optional[Path]:
    """This rank's heartbeat file (``rank`` defaults to the environment's); None outside ``autoheal
    sbatch`` (no ``directory`` and no ``$AUTOHEAL_CHECKPOINT_DIR``). Cached: heartbeat() runs every
    training step, and building the path (pathlib) was most of its cost."""
    from autoheal.sbatch_helpers.checkpoint import env_rank

    target = directory if directory is not None else env.get("AUTOHEAL_CHECKPOINT_DIR")
    if not target:
        return None
    key = (os.fspath(target), rank, env.get("LOCAL_RANK"), env.get("RANK"), env.get("SLURM_PROCID"))
    path = _hb_paths.get(key)
    if path is None:
        if len(_hb_paths) > 1024:  # callers passing ever new folders: bounded, never a leak
            _hb_paths.clear()
        path = Path(target) / HEARTBEAT_DIR / f"rank-{env_rank(env) if rank is None else int(rank)}"
        _hb_paths[key] = path
    return path


def _check_hb_step(step: int, what: str) -> None:
    from autoheal.sbatch_helpers.checkpoint import CheckpointError

    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        raise CheckpointError(f"{what}: step must be a whole number >= 0, got {step!r}")


def _write_heartbeat(path: Path, step: int, phase: str, force: bool) -> None:
    """Write the record unless throttled. Never raises OSError: a full or read-only filesystem must not
    stop training over a liveness hint (warned once per file)."""
    now = time.monotonic()
    with _hb_lock:
        last = _hb_last.get(path)
        if not force and last is not None and last[1] == phase and now - last[0] < HEARTBEAT_MIN_INTERVAL:
            return
        _hb_last[path] = (now, phase)
    rank = int(path.name.split("-", 1)[1])
    data = json.dumps({"rank": rank, "step": step, "time": round(time.time(), 3), "phase": phase,
                       "pid": os.getpid()}).encode()
    tmp = path.parent / f".{path.name}.tmp-{os.getpid()}-{threading.get_ident()}-{time.monotonic_ns()}"
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(tmp, _O_NEW, 0o644)
        try:
            os.write(fd, data)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except OSError as exc:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        with _hb_lock:
            _hb_last.pop(path, None)  # retry at the next call rather than trusting a write that failed
            first = path not in _hb_warned
            _hb_warned.add(path)
        if first:
            log.warning("autoheal heartbeat: cannot write %s (%s); training goes on", path, exc)


def heartbeat(step: int, directory: Union[str, os.PathLike[str], None] = None,
              environ: Optional[Mapping[str, str]] = None) -> Optional[Path]:
    """Record that this rank is alive at ``step``; call it once per training step (cheap, throttled).
    The runner's watchdog (``--watchdog``) judges a job once it has seen these; see ``hang.py``.

    ``directory`` defaults to ``$AUTOHEAL_CHECKPOINT_DIR``; without either nothing is written and None is
    returned (safe outside ``autoheal sbatch``). Inside a :func:`saving` block the record keeps saying
    ``saving``. Returns the heartbeat file's path."""
    env = os.environ if environ is None else environ
    _check_hb_step(step, "heartbeat")
    path = heartbeat_file(env, directory=directory)
    if path is None:
        return None
    with _hb_lock:
        phase = PHASE_SAVING if _hb_saving.get(path, 0) > 0 else PHASE_STEP
    _write_heartbeat(path, step, phase, force=False)
    return path


@contextlib.contextmanager
def saving(step: int, directory: Union[str, os.PathLike[str], None] = None,
           environ: Optional[Mapping[str, str]] = None) -> Iterator[Optional[Path]]:
    """Mark this rank as saving checkpoint ``step`` for the duration of the block, so a long save is
    never judged a hang. The mark is cleared in ``finally`` (an exception, KeyboardInterrupt or the
    grace signal's SystemExit in the block clear it too); only a kill -9 leaves it, and the runner ignores
    a mark older than its bound. Nested blocks clear it when the outermost ends. No-op outside
    ``autoheal sbatch`` (yields None)."""
    env = os.environ if environ is None else environ
    _check_hb_step(step, "saving")
    with saving_at(heartbeat_file(env, directory=directory), step) as path:
        yield path


@contextlib.contextmanager
def saving_at(path: Optional[Path], step: int) -> Iterator[Optional[Path]]:
    """:func:`saving` for a heartbeat file already found (the checkpoint manager knows its rank)."""
    if path is None:
        yield None
        return
    with _hb_lock:
        depth = _hb_saving.get(path, 0)
        _hb_saving[path] = depth + 1
    try:
        if depth == 0:
            _write_heartbeat(path, step, PHASE_SAVING, force=True)
        yield path
    finally:
        with _hb_lock:
            left = _hb_saving.get(path, 1) - 1
            if left > 0:
                _hb_saving[path] = left
            else:
                _hb_saving.pop(path, None)
        if left <= 0:
            _write_heartbeat(path, step, PHASE_SAVED, force=True)


def _parse_heartbeat(raw: bytes, rank: int) -> Optional[Heartbeat]:
    try:
        data = json.loads(raw)
    except (ValueError, RecursionError):
        return None
    if not isinstance(data, dict):
        return None
    step, when, phase = data.get("step"), data.get("time"), data.get("phase")
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        return None
    if isinstance(when, bool) or not isinstance(when, (int, float)) or not math.isfinite(when) or when < 0:
        return None
    if phase not in PHASES or data.get("rank", rank) != rank:
        return None
    return Heartbeat(rank=rank, step=step, time=float(when), phase=phase)


def read_heartbeats(directory: Union[str, os.PathLike[str], None]) -> Dict[int, Heartbeat]:
    """Every rank's heartbeat under ``directory`` (a checkpoint dir), by rank. Bounded and never blocking:
    only a real folder (not a symlink) is listed, at most MAX_HEARTBEAT_ENTRIES entries, and only small
    regular files named ``rank-<N>`` holding a valid record are read; anything else is skipped."""
    from autoheal.sbatch_helpers.checkpoint import _read_regular

    if not directory:
        return {}
    folder = Path(directory) / HEARTBEAT_DIR
    try:
        if not stat.S_ISDIR(os.lstat(folder).st_mode):
            return {}
        found: Dict[int, Heartbeat] = {}
        with os.scandir(folder) as entries:
            for entry in itertools.islice(entries, MAX_HEARTBEAT_ENTRIES):
                m = _HEARTBEAT_RE.match(entry.name)
                if m is None:
                    continue
                try:
                    raw = _read_regular(folder / entry.name, limit=_MAX_HEARTBEAT_BYTES + 1)
                except OSError:
                    continue
                if len(raw) > _MAX_HEARTBEAT_BYTES:
                    continue
                beat = _parse_heartbeat(raw, int(m.group(1)))
                if beat is not None:
                    found[beat.rank] = beat
        return found
    except OSError:
        return {}
