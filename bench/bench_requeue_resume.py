#!/usr/bin/env python3
"""Requeue-to-running time of an ``autoheal sbatch`` job on a lab cluster.

From the node drain (what xid-watch does, followed by the grace signal to the batch shell) to the job
running again on another node, resumed from its checkpoint. Runs once with Slurm's defaults
(``slurm_defaults=True``: requeue eligibility after cred_expire+1 = 121 s) and once with
``AuthInfo=...,cred_expire=10`` (the recommended slurm.conf), unless ``--only`` says otherwise.

    python bench/bench_requeue_resume.py [--only defaults|recommended] [--json]

Needs root and Debian's Slurm (like ``autoheal lab up``). Every lab is torn down at the end.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import autoheal.sbatch_helpers as sbh
from autoheal import nodeops
from autoheal.slurm.cli_backend import CliSlurm
from autoheal_lab.cluster import Lab

TRAINER = Path(sbh.__file__).parent / "examples" / "tiny_trainer.py"


def wait_for(pred, timeout: float, what: str, poll: float = 0.2):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = pred()
        if value:
            return value
        time.sleep(poll)
    raise SystemExit(f"bench: {what} not reached within {timeout}s")


def one(mode: str, grace: int = 30) -> dict:
    root = Path(tempfile.mkdtemp(prefix=f"autoheal-bench-{mode}-"))
    lab = Lab(root)
    kwargs = dict(nodes=3, gpus=2, spares=0, hooks=False, xid_watch=False, install=False)
    try:
        if mode == "defaults":
            lab.up(slurm_defaults=True, **kwargs)
        else:
            lab.up(**kwargs)
            if not re.search(r"^AuthInfo=.*cred_expire", lab.layout().slurm_conf.read_text(), re.M):
                lab.down()
                lab.up(extra_conf=[f"AuthInfo=socket={lab.root}/munge/munge.socket.2,cred_expire=10"], **kwargs)
        env = lab.slurm_env()
        slurm = CliSlurm(slurm_conf=str(lab.layout().slurm_conf), env=env)
        script = root / "job.sh"
        script.write_text(f"#!/bin/bash\n#SBATCH -N 2 --ntasks-per-node=1 -o {root}/out-%j.txt\n"
                          f"srun {sys.executable} {TRAINER} --steps 100000 --step-seconds 0.1 --checkpoint-every 10\n")
        res = subprocess.run([sys.executable, "-m", "autoheal.cli.main", "sbatch", "--grace", str(grace),
                              "--parsable", str(script)], cwd=root, env=env, capture_output=True, text=True,
                             timeout=60, check=True)
        jid = res.stdout.strip().split(";")[0]
        out = root / f"out-{jid}.txt"
        wait_for(lambda: out.exists() and "checkpoint saved" in out.read_text(), 60, "first checkpoint")
        node = slurm.get_job(jid).batch_host
        t0 = time.monotonic()
        nodeops.drain(slurm, node, "autoheal: bench: simulated xid 79")
        slurm.signal_job(jid, "USR2", batch=True)
        wait_for(lambda: "requeued after" in out.read_text(), grace + 30, "requeue", 0.05)
        t_requeued = time.monotonic() - t0
        job = wait_for(lambda: (lambda j: j if j.state == "RUNNING" and j.restart_count >= 1 else None)(
            slurm.get_job(jid)), 400, "running again")
        t_running = time.monotonic() - t0
        m = wait_for(lambda: re.search(r"start step=(\d+) .*restart=1", out.read_text()), 60, "resumed trainer")
        t_resumed = time.monotonic() - t0
        slurm.signal_job(jid, "KILL")
        return {"mode": mode, "drain_to_requeued_s": round(t_requeued, 1), "drain_to_running_s": round(t_running, 1),
                "drain_to_trainer_resumed_s": round(t_resumed, 1), "resumed_step": int(m.group(1)),
                "new_nodes": list(job.nodes), "drained": node}
    finally:
        lab.down()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--only", choices=("defaults", "recommended"))
    p.add_argument("--json", action="store_true")
    a = p.parse_args()
    modes = [a.only] if a.only else ["recommended", "defaults"]
    results = [one(m) for m in modes]
    if a.json:
        print(json.dumps(results, indent=2))
    else:
        for r in results:
            print(f"{r['mode']:12s} drain->requeued {r['drain_to_requeued_s']:6.1f}s  drain->running "
                  f"{r['drain_to_running_s']:6.1f}s  drain->trainer resumed {r['drain_to_trainer_resumed_s']:6.1f}s "
                  f"(step {r['resumed_step']}, {r['drained']} -> {','.join(r['new_nodes'])})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
