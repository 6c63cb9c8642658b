"""Job listings from ``squeue``'s text formats, filtered by Slurm, on every version (``cli_backend.
job_read_format``). 26.05's ``squeue --json`` applies the filters but prints about 19 kB per job: the JSON
of 10,000 pending jobs is 188 MB and 15 s, the text 18 MB and 1.6 s. Slurm 22.05's ``squeue --json``
ignores every filter (``--states``, ``-w``, ``-j``, ``-u``: observed on 22.05.8, it prints every job in
slurmctld's memory with every field). Under a flood of 10,000 held jobs carrying 4 kB of user text each
that is 70 MB of JSON, 4.5-5.5 s and 620 MB of RSS for squeue alone (lab, 2026-12-01), on every guard
pass and every xid-watch look-up. With the filters and only the fields autoheal reads, ``squeue -j ID``
is one job (16 ms) and the pending list 10 MB (0.9 s).

Job text is hostile: a comment or a job name may hold newlines, tabs and any separator (Slurm takes
``--comment=$'x\\n123|RUNNING|gpu1'``: a line-based parser would read a forged job). So each call uses a
fresh random token the user cannot know when they submitted: records start with ``<token>R`` and fields
are separated by ``<token>F``; a record must split into exactly the expected fields. The few fields only
``--Format`` has (restart count, eligible time, requeue flag, end and start time) come from a second call that
prints no user text at all, one line per job, joined by Slurm's job id.
Not in any text format (22.05 to 26.05): the sbatch command line (``Job.submit_line``, JSON only).

What text cannot tell: when a job has a state description Slurm prints it instead of the reason code.
That matters for one description only, "job requeued in held state" (``scontrol requeuehold``), which
both JobHeldUser (the guard may release it) and JobHeldAdmin (an admin held it since: never touched)
carry. Such a job comes back with an empty ``state_reason`` (``needs_reason``), and the caller resolves it
from the JSON record (``CliSlurm``), never by guessing.
"""

from __future__ import annotations

import secrets
import time
from typing import Dict, List, Optional, Tuple

from autoheal.errors import SlurmParseError
from autoheal.slurm.hostlist import expand
from autoheal.slurm.model import REQUEUE_HELD_DESCRIPTION, Job

#: ``-o`` fields in order; the free-text ones (command, name, comment) may hold anything but the token.
O_FIELDS: Tuple[Tuple[str, str], ...] = (
    ("raw_id", "%A"), ("job_id", "%i"), ("array_job", "%F"), ("array_task", "%K"), ("state", "%T"),
    ("nodes", "%N"), ("batch_host", "%B"), ("priority", "%Q"), ("reason", "%r"), ("excluded", "%x"),
    ("user", "%u"), ("command", "%o"), ("name", "%j"), ("comment", "%k"),
)
#: ``--Format`` fields (no user text among them), the job id first.
CAP_FIELDS: Tuple[str, ...] = ("JobID", "RestartCnt", "EligibleTime", "Requeue", "EndTime", "StartTime")

#: What ``squeue --states`` takes for "every state a job on a node can be in" (all but PENDING, which
#: ``-w`` would also match for jobs that merely asked for the node: a user can queue thousands of those).
NODE_STATES = ("RUNNING", "CONFIGURING", "COMPLETING", "SUSPENDED", "STOPPED", "SIGNALING", "RESIZING",
               "STAGE_OUT", "COMPLETED", "CANCELLED", "FAILED", "TIMEOUT", "PREEMPTED", "NODE_FAIL",
               "BOOT_FAIL", "DEADLINE", "OUT_OF_MEMORY", "SPECIAL_EXIT", "REQUEUED", "REQUEUE_HOLD",
               "REQUEUE_FED", "REVOKED", "RESV_DEL_HOLD")


def new_token() -> str:
    return secrets.token_hex(16)


def o_format(token: str) -> str:
    return f"{token}R" + f"{token}F".join(code for _name, code in O_FIELDS)


def _cap_sep(token: str) -> str:
    # a letter first: squeue reads the digits after the ":" as the field width ("0" + "23ab.." = width 23)
    return f"x{token}"


def cap_format(token: str) -> str:
    # ":0": no padding, no truncation; the suffix after the width separates the fields
    return ",".join(f"{name}:0{_cap_sep(token)}" for name in CAP_FIELDS)


def _null(value: str) -> str:
    return "" if value in ("(null)", "N/A", "n/a", "None", "NONE") else value


def _int(value: str) -> Optional[int]:
    try:
        return int(value)
    except ValueError:
        return None


def _epoch(value: str) -> Optional[int]:
    """``2026-12-01T21:50:27`` (local time, as squeue prints it) -> epoch seconds; None for N/A, NONE."""
    try:
        return int(time.mktime(time.strptime(value, "%Y-%m-%dT%H:%M:%S")))
    except ValueError:
        return None


def parse_o(text: str, token: str) -> List[Dict[str, str]]:
    """Records of an ``o_format(token)`` listing."""
    records = text.split(f"{token}R")
    if records[0].strip():
        raise SlurmParseError(f"squeue: output before the first record: {records[0][:60]!r}")
    out = []
    for rec in records[1:]:
        if rec.endswith("\n"):
            rec = rec[:-1]  # the one newline squeue ends each record with; the comment keeps its own
        fields = rec.split(f"{token}F")
        if len(fields) != len(O_FIELDS):
            raise SlurmParseError(f"squeue: a record has {len(fields)} fields, not {len(O_FIELDS)}")
        out.append(dict(zip((name for name, _code in O_FIELDS), fields)))
    return out


def parse_cap(text: str, token: str) -> Dict[str, Dict[str, str]]:
    """Slurm job id -> the ``--Format`` fields of a ``cap_format(token)`` listing."""
    out: Dict[str, Dict[str, str]] = {}
    for line in text.splitlines():
        if not line.strip():
            continue
        fields = line.split(_cap_sep(token))
        if len(fields) != len(CAP_FIELDS) + 1 or fields[-1].strip():
            raise SlurmParseError(f"squeue --Format: unexpected line {line[:80]!r}")
        rec = dict(zip(CAP_FIELDS, fields))
        out[rec["JobID"]] = rec
    return out


def jobs_from_text(o_text: str, cap_text: str, token: str) -> List[Job]:
    """Jobs from the two listings. A job missing from the second (it appeared between the two calls) is
    left out: the next look sees it whole."""
    caps = parse_cap(cap_text, token)
    jobs = []
    for r in parse_o(o_text, token):
        cap = caps.get(r["raw_id"])
        if cap is None or _int(r["raw_id"]) is None:
            continue
        task = r["array_task"]
        in_array = _null(task) != ""
        reason = r["reason"]
        ambiguous = reason.strip().lower() == REQUEUE_HELD_DESCRIPTION
        jobs.append(Job(
            job_id=f"{r['array_job']}_{task}" if task.isdigit() else r["raw_id"],
            raw_id=r["raw_id"], state=r["state"].strip().upper() or "UNKNOWN",
            nodes=tuple(expand(_null(r["nodes"]))), name="" if r["name"] == "(null)" else r["name"],
            user=_null(r["user"]),
            comment="" if r["comment"] == "(null)" else r["comment"],
            excluded_nodes=tuple(expand(_null(r["excluded"]))),
            requeue=cap["Requeue"].strip() == "1", restart_count=_int(cap["RestartCnt"]) or 0,
            batch_host=_null(r["batch_host"]), end_time=_epoch(cap["EndTime"]),
            state_reason="" if ambiguous else reason, state_description=reason if ambiguous else "",
            priority=_int(r["priority"]),
            array_job_id=r["array_job"] if in_array else None,
            array_task_id=task if task.isdigit() else None,
            command=_null(r["command"]), eligible_time=_epoch(cap["EligibleTime"]),
            start_time=_epoch(cap["StartTime"])))
    return jobs


def needs_reason(job: Job) -> bool:
    """A job whose reason code text could not tell (see the module docstring)."""
    return not job.state_reason and job.state_description.strip().lower() == REQUEUE_HELD_DESCRIPTION
