#!/usr/bin/env python3
"""Lost steps and fault -> training resumed: durable-only vs the peer-memory tier, requeue vs hot spare.

One lab (4 nodes, each with its own loopback address and memory, hooks, ``SlurmdTimeout=10``,
``cred_expire=10``). Per case: submit a 2-node job (``--spare-nodes 1`` for the hot-spare cases) of the
tiny trainer (0.1 s steps, ~100 bytes of state; its ranks are not coupled: the survivor trains on
and saves past the fault, the lab's kindness that issue 23 section 1 removes) or a small real PyTorch
MLP (~9 MB of model + Adam state, ranks coupled by a gloo all_reduce every step, when torch is
installed), durable checkpoint every N steps, and with the memory tier also a
memory copy every K steps; then kill -9 the non-batch node (its slurmd, its slurmstepds and every
process on it; its memory wiped: ``Lab.crash_node``) and read the trainers' own output:

- lost steps: the killed node's rank, last step it printed before the kill minus the step it resumed at;
- fault -> resumed: from the kill to the first step line of that rank after its restart, split at srun's
  "Node failure" line (slurmctld declared the node down: SlurmdTimeout's share); the bench reads the
  output file every 20 ms, which is the resolution;
- save cost: the memory tier's per-save time as the torch trainer reports it (p50).

    python bench/bench_ckpt_tiers.py [--only tiny|torch] [--path requeue|hotspare] [--tier durable|memory]
                                     [--json] [--k 1] [--n 20]

Needs root and Debian's Slurm (like ``autoheal lab up``). Targets: memory tier lost steps <= K; hot spare +
memory tier fault -> resumed <= 3 s.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Dict, List, Optional

from bench_requeue_resume import wait_for  # the benches' one poll-until helper (bench/ is on sys.path)

import autoheal.sbatch_helpers as sbh
from autoheal.slurm.cli_backend import CliSlurm
from autoheal_lab.cluster import Lab

TINY = Path(sbh.__file__).parent / "examples" / "tiny_trainer.py"
TORCH = Path(__file__).resolve().parent / "tiers_torch_trainer.py"
START = re.compile(r"^(\d+): autoheal-trainer: start step=(\d+) resumed_from=(\S+) restart=(\d+) host=(\S+)", re.M)


class Bench:
    def __init__(self, lab: Lab, k: int, n: int):
        self.lab, self.k, self.n = lab, k, n
        self.env = lab.slurm_env()
        self.slurm = CliSlurm(slurm_conf=str(lab.layout().slurm_conf), env=self.env)

    def script(self, root: Path, trainer: str, tier: str) -> Path:
        prog = TINY if trainer == "tiny" else TORCH
        args = f"--steps 100000 --checkpoint-every {self.n}" + (f" --memory-every {self.k}" if tier == "memory" else "")
        args += " --step-seconds 0.1" if trainer == "tiny" else " --step-seconds 0.05"
        path = root / "job.sh"
        path.write_text(f"#!/bin/bash\n#SBATCH -N 2 --ntasks-per-node=1 -o {root}/out.txt\n"
                        f"srun -l {sys.executable} {prog} {args}\n")
        return path

    def case(self, trainer: str, path: str, tier: str) -> Dict[str, object]:
        root = Path(tempfile.mkdtemp(prefix=f"bench-tiers-{trainer}-{path}-{tier}-"))
        env = dict(self.env, **({"AUTOHEAL_MEMORY_TIER": "1"} if tier == "memory" else {}))
        extra = ["--spare-nodes", "1"] if path == "hotspare" else []
        argv = [sys.executable, "-m", "autoheal.cli.main", "sbatch", "--grace", "30", *extra, "--parsable",
                str(self.script(root, trainer, tier))]
        res = subprocess.run(argv, cwd=root, env=env, capture_output=True, text=True, timeout=60)
        if res.returncode != 0:
            raise SystemExit(f"bench: sbatch failed: {res.stderr.strip()}")
        jid = res.stdout.strip().split(";")[0]
        out = root / "out.txt"
        starts = wait_for(lambda: len(START.findall(_text(out))) >= 2 and START.findall(_text(out)), 120, "job start")
        job = self.slurm.get_job(jid)
        victim = next(n for n in job.nodes if n != job.batch_host and any(s[4] == n for s in starts))
        rank = next(s[0] for s in starts if s[4] == victim)
        wait_for(lambda: _last_step(_text(out), rank) >= 3 * self.n + 5, 180, "training under way")
        before_len = len(_text(out))
        t_fault = time.time()
        self.lab.crash_node(victim)
        resumed_at, resumed_step, origin, restart_pos, detected_at = self._watch(out, rank, before_len, 240)
        text = _text(out)
        last = _last_step(text[:restart_pos], rank)  # the victim's lines that left the node before it died
        saves = [float(m) for m in re.findall(rf"^{rank}: autoheal-trainer: memory saved .* ms=([\d.]+)", text, re.M)]
        self._cleanup(jid, victim)
        return {"trainer": trainer, "path": path, "tier": tier, "K": self.k if tier == "memory" else None, "N": self.n,
                "lost_steps": last - resumed_step, "fault_to_resumed_s": round(resumed_at - t_fault, 2),
                "fault_to_detected_s": round(detected_at - t_fault, 2) if detected_at else None,
                "detected_to_resumed_s": round(resumed_at - detected_at, 2) if detected_at else None,
                "resumed_from": origin, "save_ms_p50": round(statistics.median(saves), 1) if saves else None}

    def _watch(self, out: Path, rank: str, offset: int, timeout: float):
        """(time the restarted rank's first step line appeared, the step it started at, where from, where
        its start line is in the output)."""
        deadline = time.monotonic() + timeout
        start_rx = re.compile(rf"^{rank}: autoheal-trainer: start step=(\d+) resumed_from=(\S+)", re.M)
        detected_at = None
        while time.monotonic() < deadline:
            tail = _text(out)[offset:]
            if detected_at is None and "srun: error: Node failure on" in tail:
                detected_at = time.time()  # srun was told by slurmctld: the node is DOWN
            m = start_rx.search(tail)
            if m and re.search(rf"^{rank}: autoheal-trainer: step=\d+$", tail[m.end():], re.M):
                return time.time(), int(m.group(1)), m.group(2), offset + m.start(), detected_at
            time.sleep(0.02)
        raise SystemExit(f"bench: rank {rank} did not resume within {timeout}s; see {out}")

    def _cleanup(self, jid: str, victim: str) -> None:
        subprocess.run(["scancel", jid], env=self.env, capture_output=True, timeout=30)
        self.lab.start_slurmd(victim)
        wait_for(lambda: self.slurm.get_node(victim).responding, 90, f"{victim} back")
        node = self.slurm.get_node(victim)
        if node.drain or node.down:
            self.slurm.resume(victim)
        wait_for(lambda: all(n.state == "IDLE" and not n.drain for n in self.slurm.list_nodes()), 180, "nodes idle")


def _text(path: Path) -> str:
    return path.read_text(errors="replace") if path.exists() else ""


def _last_step(text: str, rank: str) -> int:
    steps = re.findall(rf"^{rank}: autoheal-trainer: step=(\d+)$", text, re.M)
    return max(map(int, steps)) if steps else 0


def _torch_available() -> bool:
    try:
        import torch  # noqa: F401
    except ImportError:
        return False
    return True


def main(argv: Optional[List[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--only", choices=("tiny", "torch"))
    p.add_argument("--k", type=int, default=1, help="memory copy every K steps (default 1)")
    p.add_argument("--n", type=int, default=20, help="durable checkpoint every N steps (default 20)")
    p.add_argument("--path", choices=("requeue", "hotspare"), help="only this recovery path")
    p.add_argument("--tier", choices=("durable", "memory"), help="only this tier")
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    trainers = [t for t in ("tiny", "torch") if args.only in (None, t)]
    if "torch" in trainers and not _torch_available():
        print("bench: torch not installed: torch cases skipped", file=sys.stderr)
        trainers.remove("torch")
    root = Path(tempfile.mkdtemp(prefix="autoheal-bench-tiers-"))
    lab = Lab(root)
    rows = []
    try:
        lab.up(nodes=4, gpus=1, spares=0, hooks=True, xid_watch=False, install=False,
               extra_conf=["SlurmdTimeout=10", f"AuthInfo=socket={root}/munge/munge.socket.2,cred_expire=10"])
        bench = Bench(lab, args.k, args.n)
        for trainer in trainers:
            for path in [x for x in ("requeue", "hotspare") if args.path in (None, x)]:
                for tier in [x for x in ("durable", "memory") if args.tier in (None, x)]:
                    rows.append(bench.case(trainer, path, tier))
                    if not args.json:
                        print(_row(rows[-1]), flush=True)
    finally:
        lab.down()
    if args.json:
        print(json.dumps(rows, indent=1))
    return 0


def _row(r: Dict[str, object]) -> str:
    tier = f"memory K={r['K']}" if r["tier"] == "memory" else f"durable N={r['N']}"
    save = f"  save p50 {r['save_ms_p50']} ms" if r["save_ms_p50"] is not None else ""
    origin = str(r["resumed_from"]) if str(r["resumed_from"]).startswith("memory:") else "durable"
    return (f"{r['trainer']:5} {r['path']:8} {tier:14} lost steps {r['lost_steps']:5}  fault->resumed "
            f"{r['fault_to_resumed_s']:6.2f} s (fault->node declared down {r['fault_to_detected_s']} s, "
            f"then ->resumed {r['detected_to_resumed_s']} s)  from {origin}{save}")


if __name__ == "__main__":
    sys.exit(main())
