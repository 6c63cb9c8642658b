"""A job flood, as a hostile (or careless) user makes one: thousands of held jobs, each as big as Slurm lets a
user make it, submitted as an unprivileged user (issue 25, item 5).

Each job is its own ``sbatch``: a job array would be one record in slurmctld (one comment for all its
pending tasks, one entry in ``squeue --json``), so it is no flood of job records. Slurm caps a job comment
at 1024 characters (22.05: "Pathname of a file, directory or other parameter too long" above that), so
the rest of each job's weight is user text Slurm takes up to 4096 characters and prints in every job
listing: the job name and the output and error paths (a held job's paths need not exist). About 4.3 kB of
the user's text per job, the comment holding markers that look like autoheal's own.

The lab's slurm.conf needs ``MaxJobCount`` above the flood (default 10,000): ``FLOOD_CONF``.
"""

from __future__ import annotations

import json
import os
import pwd
import subprocess
import sys
import time
from typing import Dict, List, Optional

#: slurm.conf lines a lab needs to hold a 10,000-job flood next to its own jobs
FLOOD_CONF = ["MaxJobCount=30000"]

COMMENT_LIMIT = 1024  # what sbatch --comment takes on 22.05 (observed)
PATH_LIMIT = 1400  # per path: name + output + error about 3.3 kB, under every limit Slurm applies


def flood_user() -> pwd.struct_passwd:
    """The unprivileged user the flood is submitted as (nobody: no home, no rights)."""
    return pwd.getpwnam("nobody")


def _comment(i: int) -> str:
    # looks like the runner's marker and autoheal's comment fields, to make every filter earn its keep
    head = f"autoheal-runner excl=gpu1,gpu2 state=requeueing flood={i} <!channel> "
    return (head + "x" * COMMENT_LIMIT)[:COMMENT_LIMIT]


def _path(kind: str, i: int) -> str:
    stem = f"/tmp/flood-{kind}-{i}-"
    return (stem + "p" * PATH_LIMIT)[:PATH_LIMIT]


#: Runs as the flood user and makes the sbatch calls: one argv (JSON) a line on stdin, the job id (or
#: ``ERROR <line>: <why>``) a line on stdout, in order. A small process of its own because a fork of the
#: caller that also changes the user cannot use vfork: each of 10,000 forks then copied the page tables of
#: the whole pytest worker (the part of the flood's time the caller itself spent: 2.7 of 11.4 CPU-ms a job
#: on a small caller, more on a test worker). This one changes no user, so its children are vforked.
_DRIVER = """
import json, subprocess, sys
from concurrent.futures import ThreadPoolExecutor
workers, timeout = int(sys.argv[1]), float(sys.argv[2])
def one(line):
    try:
        res = subprocess.run(json.loads(line), capture_output=True, text=True, timeout=timeout,
                             stdin=subprocess.DEVNULL)
    except (OSError, subprocess.SubprocessError) as exc:
        return "ERROR " + str(exc)[:200]
    if res.returncode != 0:
        return "ERROR sbatch exit %d: %s" % (res.returncode, res.stderr.strip()[:200])
    return res.stdout.strip().split(";")[0]
with ThreadPoolExecutor(max_workers=workers) as pool:
    for out in pool.map(one, sys.stdin):
        print(out)
        if out.startswith("ERROR"):
            sys.exit(1)
"""


def _argv(sbatch: str, i: int) -> List[str]:
    return [sbatch, "--parsable", "--hold", "--requeue", f"--job-name={'n' * 60}{i}", f"--comment={_comment(i)}",
            f"--output={_path('out', i)}", f"--error={_path('err', i)}", "--chdir=/tmp", "--wrap", "true"]


def submit(env: Dict[str, str], count: int, workers: int = 4, per_call_timeout: float = 60.0,
           sbatch: str = "sbatch") -> List[str]:
    """Submit ``count`` held jobs as the flood user, each with its own ``sbatch``; returns their ids.
    Raises RuntimeError naming the first failure (a flood that did not arrive proves nothing)."""
    user = flood_user()
    lines = "".join(json.dumps(_argv(sbatch, i)) + "\n" for i in range(count))
    # the system's interpreter (the driver needs nothing but the standard library): the flood user need not
    # reach the venv's (here a pyenv under /root)
    python = "/usr/bin/python3" if os.path.exists("/usr/bin/python3") else os.path.realpath(sys.executable)
    res = subprocess.run([python, "-I", "-c", _DRIVER, str(workers), str(per_call_timeout)], input=lines,
                         env=dict(env, HOME="/tmp"), capture_output=True, text=True, cwd="/tmp",
                         timeout=120 + count * per_call_timeout / workers, user=user.pw_uid, group=user.pw_gid,
                         extra_groups=[])
    outs = res.stdout.splitlines()
    bad = next((f"flood job {i}: {out[6:]}" for i, out in enumerate(outs) if out.startswith("ERROR")), None)
    if bad is None and (res.returncode != 0 or len(outs) != count):
        bad = f"flood job {len(outs)}: the driver's exit {res.returncode}: {res.stderr.strip()[-300:]}"
    if bad:
        raise RuntimeError(bad)
    return outs


def cancel(env: Dict[str, str], timeout: float = 120.0, scancel: str = "scancel") -> None:
    """Cancel every job of the flood user (one call)."""
    subprocess.run([scancel, "-u", flood_user().pw_name], env=env, capture_output=True, text=True,
                   timeout=timeout, stdin=subprocess.DEVNULL, check=False)


def timed(fn, repeat: int = 3) -> List[float]:  # type: ignore[no-untyped-def]
    """Wall seconds of ``repeat`` calls of ``fn``."""
    out = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return out


def environ_for(env: Optional[Dict[str, str]]) -> Dict[str, str]:
    return dict(os.environ if env is None else env)
