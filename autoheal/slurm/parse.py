"""Parsers for Slurm's output: JSON of 22.05 (openapi v0.0.38 layout) and 23.02+ (v0.0.39+ layout),
``scontrol -o`` one-liners, and ``scontrol show config``. Pure functions over text.

Anything we cannot read raises ``SlurmParseError`` naming what was wrong: a caller must never mistake
unreadable output for "no nodes" or "no jobs".
"""

from __future__ import annotations

import json
import re
from typing import Any, Dict, List, Optional, Tuple

from autoheal.errors import SlurmParseError, SlurmUnavailable
from autoheal.slurm.hostlist import expand
from autoheal.slurm.model import Job, Node, WarnSignal, parse_state


def _loads(text: str, what: str) -> Dict[str, Any]:
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        snippet = (text or "").strip()[:60]
        raise SlurmParseError(f"{what}: not valid JSON ({exc.msg} at char {exc.pos}); "
                              f"output began {snippet!r}") from None
    if not isinstance(data, dict):
        raise SlurmParseError(f"{what}: expected a JSON object, got {type(data).__name__}")
    errors = data.get("errors") or []
    if errors:
        first = errors[0]
        msg = first.get("error") or first.get("description") if isinstance(first, dict) else str(first)
        if _controller_unreachable(first):
            raise SlurmUnavailable(f"{what}: Slurm could not load the data ({msg}): slurmctld down or unreachable?")
        raise SlurmParseError(f"{what}: Slurm reported an error: {msg}")
    return data


def _controller_unreachable(error: Any) -> bool:
    """An ``errors`` entry that means "no answer from slurmctld", not "bad data".

    22.05's ``sinfo --json`` / ``squeue --json`` exit 0 when slurmctld is dead and report only
    ``{"error": "Unspecified error", "errno": -1}`` (observed): the load call failed before Slurm knew why.
    Later versions name the communication error."""
    from autoheal.slurm.base import unavailable_if

    if not isinstance(error, dict):
        return unavailable_if(str(error))
    number = error.get("error_number", error.get("errno"))
    text = " ".join(str(error.get(k) or "") for k in ("error", "description"))
    return number == -1 or unavailable_if(text)


def _num(value: Any) -> Optional[int]:
    """Numbers are plain in v0.0.38 and ``{"set": true, "infinite": false, "number": N}`` later."""
    if isinstance(value, dict):
        if not value.get("set", True) or value.get("infinite"):
            return None
        value = value.get("number")
    if value is None or isinstance(value, bool):
        return None
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


def _str(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, list):
        return ",".join(str(v) for v in value)
    return str(value)


def node_from_json(obj: Dict[str, Any]) -> Node:
    """One node object of either JSON layout."""
    if not isinstance(obj, dict) or not obj.get("name"):
        raise SlurmParseError(f"node JSON without a name: {str(obj)[:80]!r}")
    raw_state = obj.get("state")
    if isinstance(raw_state, list):  # 23.02+: ["IDLE", "DRAIN"]
        base, flags = parse_state("+".join(str(s) for s in raw_state))
    else:  # 22.05: "idle" + state_flags
        base, flags = parse_state(str(raw_state or ""), obj.get("state_flags") or [])
    parts = obj.get("partitions") or []
    return Node(name=str(obj["name"]), state=base, flags=flags, reason=_str(obj.get("reason")),
                reason_user=_str(obj.get("reason_set_by_user")), reason_time=_num(obj.get("reason_changed_at")),
                gres=_str(obj.get("gres")),
                partitions=tuple(parts if isinstance(parts, list) else str(parts).split(",")),
                cpus=_num(obj.get("cpus")) or 0, address=_str(obj.get("address")),
                slurmd_start_time=_num(obj.get("slurmd_start_time")) or None)


def nodes_from_json(text: str, what: str = "node list") -> List[Node]:
    """``sinfo --json`` (22.05) or ``scontrol --json show node`` (23.02+)."""
    data = _loads(text, what)
    nodes = data.get("nodes")
    if not isinstance(nodes, list):
        raise SlurmParseError(f"{what}: JSON has no 'nodes' list (keys: {', '.join(sorted(data)) or 'none'})")
    return [node_from_json(n) for n in nodes]


def _job_state(value: Any) -> str:
    if isinstance(value, list):
        return str(value[0]).upper() if value else "UNKNOWN"
    return str(value or "UNKNOWN").upper()


def job_from_json(obj: Dict[str, Any]) -> Job:
    """One job object of either JSON layout."""
    if not isinstance(obj, dict) or _num(obj.get("job_id")) is None:
        raise SlurmParseError(f"job JSON without a job_id: {str(obj)[:80]!r}")
    raw_id = str(_num(obj["job_id"]))
    array_job = _num(obj.get("array_job_id"))
    array_task = _num(obj.get("array_task_id"))
    job_id = f"{array_job}_{array_task}" if array_job and array_task is not None else raw_id
    return Job(job_id=job_id, raw_id=raw_id, state=_job_state(obj.get("job_state")),
               nodes=tuple(expand(_str(obj.get("nodes")))), name=_str(obj.get("name")),
               user=_str(obj.get("user_name")), comment=_str(obj.get("comment")),
               excluded_nodes=tuple(expand(_str(obj.get("excluded_nodes")))),
               requeue=bool(obj.get("requeue")), restart_count=_num(obj.get("restart_cnt")) or 0,
               batch_host=_str(obj.get("batch_host")), end_time=_num(obj.get("end_time")),
               state_reason=_str(obj.get("state_reason")),
               state_description=_str(obj.get("state_description")), priority=_num(obj.get("priority")),
               array_job_id=str(array_job) if array_job else None,
               array_task_id=str(array_task) if array_job and array_task is not None else None,
               submit_line=_str(obj.get("submit_line")), command=_str(obj.get("command")),
               eligible_time=_num(obj.get("eligible_time")) or None,
               start_time=_num(obj.get("start_time")) or None)


def jobs_from_json(text: str, what: str = "job list") -> List[Job]:
    """``squeue --json`` of any supported version."""
    data = _loads(text, what)
    jobs = data.get("jobs")
    if not isinstance(jobs, list):
        raise SlurmParseError(f"{what}: JSON has no 'jobs' list (keys: {', '.join(sorted(data)) or 'none'})")
    return [job_from_json(j) for j in jobs]


# ---- scontrol -o one-liners ------------------------------------------------------------------------
# Values may contain spaces (OS=Linux 6.1 #1 SMP, Reason=...). A new field starts at " Key=" where Key
# is CamelCase without spaces; a Reason can contain "x=y" too, so Reason runs to the end of the line
# except for the few keys Slurm prints after it.
_KEY = re.compile(r"(?:^|\s)([A-Z][A-Za-z0-9_:/]*)=")
_AFTER_REASON = ("Comment", "Extra", "ExtraReason")


def parse_oneliner(line: str) -> Dict[str, str]:
    """``Key=Value Key2=Value two ...`` -> dict; robust to spaces in values."""
    line = line.rstrip("\n")
    fields: Dict[str, str] = {}
    reason_at = line.find(" Reason=")
    tail = ""
    if reason_at >= 0:
        line, tail = line[:reason_at], line[reason_at + 1:]
    matches = list(_KEY.finditer(line))
    for i, m in enumerate(matches):
        end = matches[i + 1].start() if i + 1 < len(matches) else len(line)
        fields[m.group(1)] = line[m.end():end].strip()
    if tail:
        value = tail[len("Reason="):]
        for key in _AFTER_REASON:
            cut = value.find(f" {key}=")
            if cut >= 0:
                fields.update(parse_oneliner(value[cut + 1:]))
                value = value[:cut]
        fields["Reason"] = value.strip()
    return fields


def _null(value: Optional[str]) -> str:
    return "" if value in (None, "(null)", "None", "N/A") else str(value)


def node_from_oneliner(line: str) -> Node:
    f = parse_oneliner(line)
    if "NodeName" not in f:
        raise SlurmParseError(f"scontrol node line without NodeName: {line[:80]!r}")
    base, flags = parse_state(f.get("State", ""))
    reason = _null(f.get("Reason"))
    user = ""
    when: Optional[int] = None
    m = re.search(r"\s*\[([^\[\]@]+)@([^\[\]]+)\]$", reason)
    if m:
        user = m.group(1)
        when = _local_time(m.group(2))
        reason = reason[: m.start()].strip()
    try:
        cpus = int(f.get("CPUTot", "0"))
    except ValueError:
        cpus = 0
    return Node(name=f["NodeName"], state=base, flags=flags, reason=reason, reason_user=user, reason_time=when,
                gres=_null(f.get("Gres")), partitions=tuple(p for p in _null(f.get("Partitions")).split(",") if p),
                cpus=cpus, address=_null(f.get("NodeAddr")))


def _local_time(text: str) -> Optional[int]:
    """Slurm's text time (``2026-12-03T08:40:01``, slurmctld's local time, whole seconds) as epoch seconds,
    as the JSON output gives it (``reason_changed_at``); None for anything else (``Unknown``)."""
    from datetime import datetime

    try:
        return int(datetime.strptime(text.strip(), "%Y-%m-%dT%H:%M:%S").timestamp())
    except ValueError:
        return None


def nodes_from_oneliners(text: str) -> List[Node]:
    """``scontrol -o show node``; "No nodes in the system" is an empty list."""
    lines = [ln for ln in text.splitlines() if ln.strip()]
    if lines and lines[0].startswith("No nodes"):
        return []
    return [node_from_oneliner(ln) for ln in lines]


# ---- scontrol show config ---------------------------------------------------------------------------
_CONF_LINE = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*(?:\[\d+\])?)\s*=\s?(.*)$")
_INDEXED_KEY = re.compile(r"^(.+)\[(\d+)\]$")
# slurm.conf keys that take a comma list of programs, printed one per index by 24.11 (``Prolog[0]``).
# Other indexed keys (``SlurmctldHost[0]``: primary, backups) are not such lists and stay as printed.
_PROGRAM_LIST_KEYS = ("Prolog", "Epilog", "PrologSlurmctld", "EpilogSlurmctld")


def parse_show_config(text: str) -> Dict[str, str]:
    """``scontrol show config`` -> {Key: value} (first section only: slurm.conf values).

    Keeps Slurm's own spelling of keys and values (``KillWait = 30 sec`` -> ``"30 sec"``). Slurm 23.02+
    prints the keys that may hold several programs with an index (24.11: ``Prolog[0] = /a``,
    ``Prolog[1] = /b``); those are also given under the plain key as slurm.conf spells it
    (``Prolog`` -> ``"/a,/b"``), as 22.05 prints it.
    """
    out: Dict[str, str] = {}
    lines = text.splitlines()
    if not lines or not lines[0].startswith("Configuration data as of"):
        head = (lines[0] if lines else "")[:60]
        raise SlurmParseError(f"scontrol show config: unexpected first line {head!r}")
    for line in lines[1:]:
        if not line.strip():
            # later sections (cgroup.conf, MPI plugins, "Slurmctld(primary) at ...") are not slurm.conf
            if out:
                break
            continue
        m = _CONF_LINE.match(line)
        if m:
            out[m.group(1)] = m.group(2).strip()
    if not out:
        raise SlurmParseError("scontrol show config: no Key = value lines found")
    indexed: Dict[str, List[Tuple[int, str]]] = {}
    for key, value in out.items():
        im = _INDEXED_KEY.match(key)
        if im and im.group(1) in _PROGRAM_LIST_KEYS:
            indexed.setdefault(im.group(1), []).append((int(im.group(2)), value))
    for key, items in indexed.items():
        if key not in out:
            out[key] = ",".join(v for _i, v in sorted(items) if v and v != "(null)") or "(null)"
    return out


# ---- the warning signal a job asked for (--signal) -------------------------------------------------
_NO_WARNING = frozenset({"KILL", "STOP"})  # cannot be caught: never a warning to deliver


def _signal_name(text: str) -> str:
    """``USR2`` / ``SIGUSR2`` / ``12`` -> ``USR2``; "" when it is no signal. Numbers are Linux numbers."""
    import signal as _signal

    word = text.strip().upper()
    if word.isdigit():
        num = int(word)
        if not 0 < num < 65:
            return ""
        try:
            word = _signal.Signals(num).name
        except ValueError:
            return str(num)
        if word.startswith("SIGRT"):
            return str(num)  # a real-time signal: scancel takes the number
    if word.startswith("SIG"):
        word = word[3:]
    if not re.fullmatch(r"[A-Z][A-Z0-9]{1,8}", word) or not hasattr(_signal, "SIG" + word):
        return ""
    return word


def parse_signal_spec(value: str) -> Optional[WarnSignal]:
    """``[{R|B}:]SIG[@SECS]`` as sbatch takes it -> WarnSignal; None when unreadable, or KILL/STOP.

    >>> parse_signal_spec("B:USR2@90").spec
    'B:USR2@90'
    >>> parse_signal_spec("12").spec
    'USR2@60'
    """
    text = str(value or "").strip()
    batch = False
    m = re.match(r"^([RrBb]{1,2}):(.*)$", text)
    if m:
        batch = "B" in m.group(1).upper()
        text = m.group(2)
    sig, _, secs = text.partition("@")
    name = _signal_name(sig)
    if not name or name in _NO_WARNING:
        return None
    seconds = 60
    if secs.strip():
        if not secs.strip().isdigit():
            return None
        seconds = int(secs.strip())
    return WarnSignal(signal=name, seconds=seconds, batch=batch)


def _split_words(text: str, comments: bool = False) -> List[str]:
    import shlex

    try:
        return shlex.split(text, comments=comments)
    except ValueError:  # an unbalanced quote: sbatch would not have taken it either; best effort
        return text.split("#", 1)[0].split() if comments else text.split()


def _signal_from_words(words: List[str]) -> Optional[str]:
    """The value of the last ``--signal=V`` / ``--signal V`` among option words (the last one wins)."""
    found = None
    for i, w in enumerate(words):
        if w.startswith("--signal="):
            found = w[len("--signal="):]
        elif w == "--signal" and i + 1 < len(words):
            found = words[i + 1]
    return found


def signal_from_script(script: str) -> Optional[str]:
    """The ``--signal`` of a batch script's ``#SBATCH`` lines, read as sbatch reads them: only the lines
    before the first command (blank lines and comments may come between), the last one winning."""
    found = None
    for i, line in enumerate((script or "").splitlines()):
        stripped = line.strip()
        if i == 0 and stripped.startswith("#!"):
            continue
        if not stripped or (stripped.startswith("#") and not line.startswith("#SBATCH")):
            continue
        if not line.startswith("#SBATCH"):
            break  # the first command: sbatch stops reading directives here
        value = _signal_from_words(_split_words(line[len("#SBATCH"):], comments=True))
        if value is not None:
            found = value
    return found


def signal_from_submit_line(submit_line: str, command: str = "") -> Optional[str]:
    """The ``--signal`` of an sbatch command line (``Job.submit_line``), options before the script only
    (the script's own arguments may say ``--signal`` too)."""
    words = _split_words(submit_line or "")
    if command:
        base = command.rsplit("/", 1)[-1]
        for i, w in enumerate(words):
            if i and (w == command or w.rsplit("/", 1)[-1] == base):
                words = words[:i]
                break
    return _signal_from_words(words[1:] if words else words)


def requested_signal(submit_line: str = "", script: str = "", command: str = "") -> Optional[WarnSignal]:
    """The warning a job asked for: its sbatch command line overrides its script's ``#SBATCH`` lines
    (as in sbatch). None when it asked for none (or for KILL/STOP, which warn nobody)."""
    value = signal_from_submit_line(submit_line, command)
    if value is None:
        value = signal_from_script(script)
    return parse_signal_spec(value) if value is not None else None


# ---- a job's GPUs (``scontrol -d show job``) ------------------------------------------------------------
_IDX_RE = re.compile(r"\(IDX:([0-9,\-]+)\)")


def gpu_indices(text: str) -> List[int]:
    """``0-1,4`` -> [0, 1, 4]; anything malformed -> []."""
    out: List[int] = []
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        try:
            if "-" in part:
                a, b = part.split("-", 1)
                out.extend(range(int(a), int(b) + 1))
            else:
                out.append(int(part))
        except ValueError:
            return []
    return sorted({i for i in out if 0 <= i < 1024})


def job_gpus_from_show_job(text: str, node: str) -> List[int]:
    """GPU indices of ``node`` in ``scontrol -d show job`` output (``Nodes=gpu1 ... GRES=gpu:2(IDX:0-1)``)."""
    for line in text.splitlines():
        line = line.strip()
        if not line.startswith("Nodes=") or "IDX:" not in line:
            continue
        names = line.split()[0].split("=", 1)[1]
        try:
            if node not in expand(names):
                continue
        except Exception:
            continue
        m = _IDX_RE.search(line)
        if m:
            return gpu_indices(m.group(1))
    return []
