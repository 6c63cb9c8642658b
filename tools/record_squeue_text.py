#!/usr/bin/env python3
"""Record the ``squeue`` text listings and the JSON of the same jobs that ``tests/unit/test_squeue_text.py``
reads, from a throwaway lab on this machine's Slurm (run as root, in the checkout's venv; in a chroot for
another Slurm: ``.ci/slurm-chroot forky exec /opt/autoheal-venv/bin/python tools/record_squeue_text.py``):

    python tools/record_squeue_text.py tests/fixtures/slurm-26.05/squeue-text

Writes ``o.txt`` and ``cap.txt`` (``squeue -h --states=all -j IDS`` with ``squeue_text.o_format(TOKEN)`` and
``cap_format(TOKEN)``, the fixed ``TOKEN`` below where a real call draws a random one) and ``squeue.json``
(``squeue --json`` cut to those jobs: 22.05's JSON ignores ``-j``). squeue prints local times: the lab's
commands run with ``TZ=UTC``. The jobs, each meant to catch a parser out (users write job names and
comments; the root-run hooks read them):

- an array of two tasks running on gpu2; a job running on gpu1 whose comment holds a newline;
- a job held at submission whose comment forges a record (``\\n`` then a near-token record of a RUNNING
  job) and whose name holds a tab; one whose name and comment hold the field separator of another token,
  ``|``, ``%`` and non-ASCII text (an umlaut, CJK, an emoji);
- a job requeue-held by ``scontrol requeuehold`` (JobHeldUser + "job requeued in held state": the text shows
  only the description), and one requeue-held, released and held by root (JobHeldAdmin);
- a job running with an autoheal-looking comment.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable, Dict, List

TOKEN = "0123456789abcdef0123456789abcdef"
NEAR = TOKEN[:-1] + "0"  # what a user who guessed at the token's shape could write
ODD_NAME = f"x{NEAR}Fy|ünï 名前 🚀 100%"
ODD_COMMENT = f"a|b{NEAR}R1{NEAR}F ü名🚀\n%j %k"


def _run(env: Dict[str, str], *argv: str, timeout: float = 60) -> str:
    res = subprocess.run(list(argv), env=env, capture_output=True, text=True, timeout=timeout, cwd="/tmp",
                         stdin=subprocess.DEVNULL)
    if res.returncode != 0:
        sys.exit(f"record_squeue_text: {' '.join(argv[:4])}: exit {res.returncode}: {res.stderr.strip()[:300]}")
    return res.stdout


def _sbatch(env: Dict[str, str], *args: str) -> str:
    return _run(env, "sbatch", "--parsable", "-o", "/dev/null", *args, "--wrap", "sleep 3600").strip().split(";")[0]


def _wait(what: str, ok: Callable[[], bool], timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while not ok():
        if time.monotonic() > deadline:
            sys.exit(f"record_squeue_text: gave up waiting for {what}")
        time.sleep(0.5)


def _state(env: Dict[str, str], job: str) -> str:
    return _run(env, "squeue", "-h", "--states=all", "-j", job, "-o", "%T|%r").strip()


def _submit(env: Dict[str, str]) -> List[str]:
    """The jobs (see the module docstring), settled: running ones running, held ones held and no longer
    completing. Returns their Slurm ids (the array's own id first)."""
    array = _sbatch(env, "--array=0-1", "-w", "gpu2")
    run = _sbatch(env, "-w", "gpu1", "--comment=run\nfake")
    forged = _sbatch(env, "-H", f"--comment=evil\n{NEAR}R99999{NEAR}FRUNNING", "--job-name=name\twith tab")
    odd = _sbatch(env, "-H", f"--comment={ODD_COMMENT}", f"--job-name={ODD_NAME}")
    requeued = _sbatch(env, "-w", "gpu3", "--requeue", "--comment=autoheal-runner state=running")
    admin = _sbatch(env, "-w", "gpu3", "--requeue", "--comment=autoheal-runner state=requeueing excl=gpu3")
    ours = _sbatch(env, "-w", "gpu1", "--comment=autoheal: requeued after XID 79 on gpu9")
    for job in (run, requeued, admin, ours):
        _wait(f"job {job} running", lambda j=job: _state(env, j).startswith("RUNNING"))
    for job in (requeued, admin):
        _run(env, "scontrol", "requeuehold", job)
    for job in (requeued, admin):
        _wait(f"job {job} held", lambda j=job: _state(env, j).startswith("PENDING|"))
    # a hold of a held job changes nothing: released and at once held again (its requeue's EligibleTime,
    # cred_expire + 1 s away, keeps it from starting in between)
    _run(env, "scontrol", "release", admin)
    _run(env, "scontrol", "hold", admin)
    # (squeue may print the state description instead of the code: scontrol says which hold it is)
    _wait(f"job {admin} held by root",
          lambda: " Reason=JobHeldAdmin" in _run(env, "scontrol", "-o", "show", "job", admin))
    _wait(f"array {array} running", lambda: _run(env, "squeue", "-h", "-j", array, "-o", "%T").split() ==
          ["RUNNING", "RUNNING"])
    return [array, run, forged, odd, requeued, admin, ours]


def _record(env: Dict[str, str], ids: List[str], out: Path) -> None:
    from autoheal.slurm import squeue_text

    sel = ["-h", "--states=all", "-j", ",".join(ids)]
    (out / "o.txt").write_text(_run(env, "squeue", *sel, "-o", squeue_text.o_format(TOKEN)))
    (out / "cap.txt").write_text(_run(env, "squeue", *sel, "-O", squeue_text.cap_format(TOKEN)))
    data = json.loads(_run(env, "squeue", "--json", "--states=all", "-j", ",".join(ids), timeout=120))
    wanted = set(ids)
    data["jobs"] = [j for j in data["jobs"] if str(_number(j.get("job_id"))) in wanted
                    or str(_number(j.get("array_job_id"))) in wanted]
    (out / "squeue.json").write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n")
    print(f"recorded {len(data['jobs'])} jobs ({', '.join(ids)}) into {out}")


def _number(value: object) -> object:
    return value.get("number") if isinstance(value, dict) else value


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path, help="the fixture folder to write")
    args = ap.parse_args()
    from autoheal_lab.cluster import Lab

    args.out.mkdir(parents=True, exist_ok=True)
    root = Path(tempfile.mkdtemp(prefix="autoheal-record-squeue-"))
    lab = Lab(root)
    lab.up(nodes=3, gpus=2, spares=0, hooks=False, xid_watch=False, install=False)
    try:
        env = dict(lab.slurm_env(), TZ="UTC")
        ids = _submit(env)
        _record(env, ids, args.out)
        _run(env, "scancel", *ids)
    finally:
        lab.down()
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
