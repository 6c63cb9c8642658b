#!/usr/bin/env python3
"""The pyslurm backend next to the CLI backend on one throwaway lab (issue 28): reads compared, writes
made through pyslurm and read back through the CLI. For a pyslurm that is installed in the running venv
with this checkout, e.g. the one built by hand against 26.05 (docs/slurm-versions.md, "pyslurm on 26.05"):

    .ci/slurm-chroot forky exec /opt/ps/bin/python tools/pyslurm_lab_check.py

Prints one line per check and exits 1 when any failed. Not a lab test: no pyslurm on PyPI matches a Slurm
any registry here ships, so the suite cannot install one.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, List, Tuple

JOB_FIELDS = ("job_id", "state", "nodes", "user", "comment", "requeue", "restart_count", "batch_host",
              "state_reason")


def _wait(what: str, ok: Callable[[], Any], timeout: float) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = ok()
        if got:
            return got
        time.sleep(0.5)
    raise AssertionError(f"gave up waiting for {what}")


def _checks(cli: Any, ps: Any, job: str) -> List[Tuple[str, Callable[[], Any]]]:
    def nodes() -> Any:
        a = {n.name: (n.state, n.flags, n.reason) for n in cli.list_nodes()}
        b = {n.name: (n.state, n.flags, n.reason) for n in ps.list_nodes()}
        assert a == b, (a, b)
        return sorted(a)

    def drain() -> str:
        ps.drain("gpu1", "autoheal: pyslurm drain")
        node = cli.get_node("gpu1")
        assert node.drain and node.reason == "autoheal: pyslurm drain", node
        ps.resume("gpu1")
        _wait("gpu1 resumed", lambda: not cli.get_node("gpu1").drain, 30)
        return "drained and resumed"

    def one_job() -> str:
        a, b = cli.get_job(job), ps.get_job(job)
        diff = {f: (getattr(a, f), getattr(b, f)) for f in JOB_FIELDS if getattr(a, f) != getattr(b, f)}
        assert not diff, diff
        return a.state

    def node_jobs() -> List[str]:
        got, want = [j.job_id for j in ps.list_jobs(node="gpu2")], [j.job_id for j in cli.list_jobs(node="gpu2")]
        assert got == want, (got, want)
        return got

    def comment() -> str:
        ps.set_job_comment(job, "autoheal: pyslurm comment")
        assert cli.get_job(job).comment == "autoheal: pyslurm comment"
        return "set"

    def requeue_hold() -> str:
        ps.requeue(job, hold=True)
        held = _wait("the requeue hold", lambda: (lambda j: j if j.state == "PENDING" else None)(cli.get_job(job)), 150)
        assert held.held and held.requeue_held, held
        ps.release(job)
        assert not cli.get_job(job).held
        return "held and released"

    return [("version", lambda: str(ps.version())), ("list_nodes == cli", nodes), ("ping", ps.ping),
            ("drain/resume", drain), ("get_job == cli", one_job), ("list_jobs(node) == cli", node_jobs),
            ("update_job comment", comment), ("requeue hold / release", requeue_hold),
            ("show_config keys", lambda: len(ps.show_config()))]


def _run_checks(env: dict) -> int:
    os.environ.update(env)  # libslurm's init reads SLURM_CONF when pyslurm is imported
    from autoheal.slurm.cli_backend import CliSlurm
    from autoheal.slurm.pyslurm_backend import PyslurmSlurm

    cli, ps = CliSlurm(env=env), PyslurmSlurm()
    print(f"pyslurm {ps.ps.__version__}, Slurm {cli.version()}")
    job = subprocess.run(["sbatch", "--parsable", "-w", "gpu2", "--requeue", "-o", "/dev/null",
                          "--comment=autoheal-runner state=running", "--wrap", "sleep 600"], env=env,
                         capture_output=True, text=True, timeout=30, cwd="/tmp").stdout.strip()
    _wait(f"job {job} running", lambda: cli.get_job(job).running, 60)
    failed = 0
    for name, check in _checks(cli, ps, job):
        try:
            print(f"ok    {name}: {check()}")
        except Exception as exc:  # report every check, not only the first failure
            failed += 1
            print(f"FAIL  {name}: {exc!r}"[:400])
    subprocess.run(["scancel", job], env=env, timeout=30, check=False)
    return failed


def main() -> None:
    from autoheal_lab.cluster import Lab

    root = Path(tempfile.mkdtemp(prefix="autoheal-pyslurm-check-"))
    lab = Lab(root)
    lab.up(nodes=3, gpus=2, spares=0, hooks=False, xid_watch=False, install=False)
    try:
        failed = _run_checks(lab.slurm_env())
    finally:
        lab.down()
        shutil.rmtree(root, ignore_errors=True)
    print(f"{'all checks passed' if not failed else f'{failed} check(s) failed'}")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
