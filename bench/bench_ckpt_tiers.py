#!/usr/bin/env python3
"""Lost steps and fault -> training resumed: durable-only vs the peer-memory tier, requeue vs hot spare,
on faults that reach the job the way real ones do (issue 23).

One lab (4 nodes x 1 fake GPU, each node with its own loopback address and memory, hooks and xid-watch,
``SlurmdTimeout=10``, ``KillWait=5``, ``cred_expire=10``). Per case: a 2-node job (``--spare-nodes 1``
for the hot-spare cases; ``--grace 10 --hang-after-fault 5`` unless told) of

- the tiny trainer with ``--device lab --collective --timestamps``: every step is a call on the step's
  fake GPU and a real TCP allreduce between the ranks (a dead peer blocks the other, NCCL-like), or
- a small real PyTorch MLP (``tiers_torch_trainer.py --device lab``: ~9 MB of model + Adam state, a gloo
  ``all_reduce`` of the gradients every step, failing as NCCL does: blocked, signals pending),

durable checkpoint every N steps, and with the memory tier also a memory copy every K steps. Then one
fault on the GPU / node of the rank that is not on the batch host:

- ``xid79``: XID 79 on its GPU: the rank's next GPU call fails, it cannot save; its peer blocks in the
  next collective; xid-watch drains the node and sends the grace signal; the runner's hang detection
  ends the blocked step;
- ``node-killed``: ``kill -9`` of the node's slurmd, its slurmstepds and every process on it, its
  memory wiped (``Lab.crash_node``); no signal comes: Slurm finds the node dead after SlurmdTimeout.

Figures, from the evidence's own clocks where it has one:

- lost steps: from the trainers' output (``autoheal_lab.lostwork``): the newest step a rank had printed
  before the restart minus the step the ranks resumed from;
- fault -> resumed: the trainer's own ``time=`` stamp on the first step of the restarted run minus the
  fault's time;
- fault -> step ended: when the runner's line "ending the step now" appeared (the bench reads the output
  every 20 ms; the runner's own "N s after the signal" is shown next to it), for a step whose ranks
  blocked after a fault signal; the target is the grace + 5 s;
- save cost: the memory tier's per-save time as the torch trainer reports it (p50, p95), the state's size,
  and the tier's memory per node (the lab node's /dev/shm just before the fault);
- phases: seconds after the fault of the drain and grace signal (journal), the rank's device error and the
  restarted ranks' start (the trainers' own clocks), the runner's end of the step and swap / requeue, and
  srun's "step creation temporarily disabled" / "Step created" (first seen): where the seconds go.

    python bench/bench_ckpt_tiers.py [--only tiny|torch] [--path requeue|hotspare] [--tier durable|memory]
                                     [--fault xid79|node-killed] [--json] [--k 1] [--n 20]
                                     [--hang-after-fault 5]

Needs root and Debian's Slurm (like ``autoheal lab up``); torch for the torch cases. Targets (printed,
not asserted): memory tier lost steps <= K; hot spare + memory tier fault -> resumed <= 3 s; a hang after
a fault ended within the grace + 5 s.
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
from typing import Dict, List, Optional, Tuple

from bench_requeue_resume import wait_for  # the benches' one poll-until helper (bench/ is on sys.path)

import autoheal.sbatch_helpers as sbh
from autoheal.slurm.cli_backend import CliSlurm
from autoheal_lab import lostwork
from autoheal_lab.cluster import Lab
from autoheal_lab.gpus import inject

TINY = Path(sbh.__file__).parent / "examples" / "tiny_trainer.py"
TORCH = Path(__file__).resolve().parent / "tiers_torch_trainer.py"
START = re.compile(r"^(\d+): autoheal-trainer: start step=(\d+) resumed_from=(\S+) restart=(\d+) host=(\S+)", re.M)
STEP = re.compile(r"^(\d+): autoheal-trainer: step=(\d+) time=([\d.]+)$", re.M)
ENDED = re.compile(r"the job's ranks are hung: .*ending the step now \(([\d.]+)s after the signal")
#: runner and srun lines whose first appearance the bench stamps (it reads the output every 20 ms): where
#: the seconds between the fault and the restarted run's first step go
MARKS = (("swapped", "swapped for spare"), ("step busy", "step creation temporarily disabled"),
         ("step created", "Step created for job"), ("down", "srun: error: Node failure on"))
EVENT_TIME = re.compile(r" time=([\d.]+)")
GRACE = 10
FAULTS = ("xid79", "node-killed")


class Bench:
    def __init__(self, lab: Lab, k: int, n: int, hang_after_fault: float):
        self.lab, self.k, self.n, self.hang_after_fault = lab, k, n, hang_after_fault
        self.env = lab.slurm_env()
        self.slurm = CliSlurm(slurm_conf=str(lab.layout().slurm_conf), env=self.env)

    def script(self, root: Path, trainer: str, tier: str) -> Path:
        args = f"--steps 100000 --checkpoint-every {self.n} --device lab"
        args += f" --memory-every {self.k}" if tier == "memory" else ""
        if trainer == "tiny":  # MASTER_ADDR: every lab node is this machine, rank 0's node is reachable here
            run = f"export MASTER_ADDR=127.0.0.1\nsrun -l {sys.executable} {TINY} {args} --step-seconds 0.1 " \
                  f"--collective --timestamps --event-times\n"
        else:
            run = f"srun -l {sys.executable} {TORCH} {args} --step-seconds 0.05\n"
        path = root / "job.sh"
        path.write_text(f"#!/bin/bash\n#SBATCH -N 2 --ntasks-per-node=1 --gres=gpu:1 -o {root}/out.txt\n{run}")
        return path

    def submit(self, root: Path, trainer: str, path: str, tier: str) -> Tuple[str, Path]:
        env = dict(self.env, **({"AUTOHEAL_MEMORY_TIER": "1"} if tier == "memory" else {}))
        extra = ["--spare-nodes", "1"] if path == "hotspare" else []
        argv = [sys.executable, "-m", "autoheal.cli.main", "sbatch", "--grace", str(GRACE), "--hang-after-fault",
                f"{self.hang_after_fault:g}", *extra, "--parsable", str(self.script(root, trainer, tier))]
        res = subprocess.run(argv, cwd=root, env=env, capture_output=True, text=True, timeout=60)
        if res.returncode != 0:
            raise SystemExit(f"bench: sbatch failed: {res.stderr.strip()}")
        return res.stdout.strip().split(";")[0], root / "out.txt"

    def case(self, trainer: str, path: str, tier: str, fault: str) -> Dict[str, object]:
        root = Path(tempfile.mkdtemp(prefix=f"bench-tiers-{trainer}-{path}-{tier}-{fault}-"))
        jid, out = self.submit(root, trainer, path, tier)
        starts = wait_for(lambda: len(START.findall(_text(out))) >= 2 and START.findall(_text(out)), 150, "job start")
        job = self.slurm.get_job(jid)
        victim = next(n for n in job.nodes if n != job.batch_host and any(s[4] == n for s in starts))
        rank = next(s[0] for s in starts if s[4] == victim)
        gpu = int(wait_for(lambda: re.search(rf"^{rank}: autoheal-trainer: device lab gpus=(\d+)", _text(out), re.M),
                           30, "device line").group(1))
        wait_for(lambda: _last_step(_text(out), rank) >= 2 * self.n + self.n // 2, 240, "training under way")
        offset = len(_text(out))
        shm = self._memory_bytes(job.nodes) if tier == "memory" else {}
        t_fault = time.time()
        if fault == "xid79":
            inject(self.lab, victim, gpu, "xid", xid=79)
        else:
            self.lab.crash_node(victim)
        seen = self._watch(out, offset, 300)
        text = _text(out)
        try:
            resume = lostwork.resumes(text)[0]
        finally:
            self._cleanup(jid, victim)
        restarted = [m for m in START.finditer(text) if m.start() >= offset]
        first = next(m for m in STEP.finditer(text) if m.start() > max(r.start() for r in restarted))
        saves = [float(m) for m in re.findall(r"^\d+: autoheal-trainer: memory saved .* ms=([\d.]+)", text, re.M)]
        sizes = [int(m) for m in re.findall(r"^\d+: autoheal-trainer: memory saved .* bytes=(\d+)", text, re.M)]
        ended = seen.get("ended")
        phases = self._phases(text[offset:], jid, t_fault, seen, float(first.group(3)))
        return {"trainer": trainer, "path": path, "tier": tier, "fault": fault, "K": self.k if tier == "memory"
                else None, "N": self.n, "lost_steps": resume.lost, "resumed_step": min(resume.resumed.values()),
                "fault_to_resumed_s": round(float(first.group(3)) - t_fault, 2),
                "fault_to_step_ended_s": round(ended[0] - t_fault, 2) if ended else None,
                "runner_waited_s": float(ended[1]) if ended else None,
                "fault_to_node_down_s": phases.get("srun told node down"),
                "resumed_from": next(m.group(3) for m in restarted if m.group(1) == rank),
                "requeued": any(m.group(4) != "0" for m in restarted),
                "nodes_before": sorted(s[4] for s in starts), "nodes_after": sorted(m.group(5) for m in restarted),
                "save_ms_p50": round(statistics.median(saves), 1) if saves else None,
                "save_ms_p95": round(_quantile(saves, 0.95), 1) if saves else None,
                "state_mb": round(max(sizes) / 1e6, 2) if sizes else None,
                "memory_per_node_mb": round(max(shm.values()) / 1e6, 2) if shm else None,
                "phases": phases}

    def _phases(self, tail: str, jid: str, t_fault: float, seen: Dict[str, tuple],
                first_step: float) -> Dict[str, float]:
        """Seconds after the fault of each phase, from the evidence's own clock where it has one: the
        journal's record time (drain, grace signal, swap / requeue), the trainers' own time= stamps (a rank's
        device error, the restarted ranks' start), else when the bench first saw the runner's or srun's line."""
        at: Dict[str, float] = {}
        for rec in self._journal(t_fault):
            if rec.get("event") in ("drain", "signal", "job-hot-swap", "job-requeue") and \
                    (rec.get("event") == "drain" or jid in rec.get("job_ids", []) or rec.get("job_id") == jid):
                at.setdefault({"job-hot-swap": "swapped", "job-requeue": "requeued"}.get(rec["event"], rec["event"]),
                              float(rec["time"]))
        for m in re.finditer(r"^\d+: autoheal-trainer: (device error|collective failed|device lab) .*", tail, re.M):
            t = EVENT_TIME.search(m.group(0))
            if t:  # "device lab": a restarted rank is up, its imports done (the later rank's counts)
                name = "ranks imported" if m.group(1) == "device lab" else f"rank {m.group(1)}"
                at[name] = max(at.get(name, 0.0), float(t.group(1))) if name == "ranks imported" \
                    else at.get(name, float(t.group(1)))
        names = {"ended": "step ended", "step busy": "srun: step busy", "step created": "srun: step created",
                 "down": "srun told node down"}
        for key, value in seen.items():
            at.setdefault(names.get(key, key), value[0])
        starts = [float(t.group(1)) for t in (EVENT_TIME.search(line) for line in
                                               re.findall(r"^\d+: autoheal-trainer: start step=.*$", tail, re.M)) if t]
        if starts:  # the later rank: training resumes when both have loaded their state
            at["ranks started"] = max(starts)
        at["first step"] = first_step
        return {k: round(v - t_fault, 2) for k, v in sorted(at.items(), key=lambda kv: kv[1])}

    def _memory_bytes(self, nodes) -> Dict[str, int]:
        """Bytes the memory tier holds in each node's memory (the lab's per-node /dev/shm), just before the fault."""
        base = self.lab.layout().memory_base
        return {n: sum(f.stat().st_size for f in Path(base.replace("{node}", n)).rglob("*") if f.is_file())
                for n in nodes}

    def _journal(self, since: float) -> List[dict]:
        path = self.lab.root / "journal" / "journal.jsonl"
        out = []
        for line in _text(path).splitlines():
            try:
                rec = json.loads(line)
            except ValueError:
                continue
            if isinstance(rec, dict) and float(rec.get("time", 0)) >= since - 1:
                out.append(rec)
        return out

    def _watch(self, out: Path, offset: int, timeout: float) -> Dict[str, tuple]:
        """Until both ranks printed a step of the restarted run: when the runner ended a blocked step (and
        its own figure), and when each of MARKS first appeared."""
        deadline = time.monotonic() + timeout
        seen: Dict[str, tuple] = {}
        while time.monotonic() < deadline:
            tail = _text(out)[offset:]
            now = time.time()
            m = ENDED.search(tail)
            if m and "ended" not in seen:
                seen["ended"] = (now, m.group(1))
            for name, text in MARKS:
                if name not in seen and text in tail:
                    seen[name] = (now,)
            restart = list(START.finditer(tail))
            if len(restart) >= 2 and len({s.group(1) for s in STEP.finditer(tail[restart[-1].end():])}) >= 2:
                return seen
            time.sleep(0.02)
        raise SystemExit(f"bench: the job did not resume within {timeout}s; see {out}")

    def _cleanup(self, jid: str, victim: str) -> None:
        """The job gone and the victim back in service: slurmd, GPU, the hooks' fault record, Slurm's drain."""
        subprocess.run(["scancel", jid], env=self.env, capture_output=True, timeout=30)
        from autoheal.errors import SlurmError
        from autoheal_lab import procs

        def over() -> bool:  # its epilogs done too (COMPLETING until then): the next case starts on clean nodes
            try:
                return self.slurm.get_job(jid).state not in ("RUNNING", "PENDING", "COMPLETING", "CONFIGURING",
                                                             "REQUEUED", "SUSPENDED")
            except SlurmError:
                return True

        wait_for(over, 120, f"job {jid} over")

        rec = self.lab.records().get(f"slurmd-{victim}")
        if not rec or not procs.is_alive(rec):
            self.lab.start_slurmd(victim)
        wait_for(lambda: self.slurm.get_node(victim).responding, 90, f"{victim} back")
        inject(self.lab, victim, 0, "clear")
        subprocess.run([sys.executable, "-m", "autoheal.cli.main", "check", "--clear-faults", "--node", victim],
                       env=dict(self.env, **self.lab.node_env(victim)), capture_output=True, timeout=30)
        node = self.slurm.get_node(victim)
        if node.drain or node.down:
            self.slurm.resume(victim)
        wait_for(lambda: all(n.state == "IDLE" and not n.drain for n in self.slurm.list_nodes()), 180, "nodes idle")


def _text(path: Path) -> str:
    return path.read_text(errors="replace") if path.exists() else ""


def _quantile(values: List[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def _last_step(text: str, rank: str) -> int:
    steps = [int(m.group(2)) for m in STEP.finditer(text) if m.group(1) == rank]
    return max(steps) if steps else 0


def _torch_available() -> bool:
    try:
        import torch  # noqa: F401
    except ImportError:
        return False
    return True


def parse_args(argv: Optional[List[str]]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--only", choices=("tiny", "torch"))
    p.add_argument("--k", type=int, default=1, help="memory copy every K steps (default 1)")
    p.add_argument("--n", type=int, default=20, help="durable checkpoint every N steps (default 20)")
    p.add_argument("--path", choices=("requeue", "hotspare"), help="only this recovery path")
    p.add_argument("--tier", choices=("durable", "memory"), help="only this tier")
    p.add_argument("--fault", choices=FAULTS, help="only this fault")
    p.add_argument("--hang-after-fault", type=float, default=5.0,
                   help="the runner's --hang-after-fault (default 5 s; the grace is %d s)" % GRACE)
    p.add_argument("--json", action="store_true")
    return p.parse_args(argv)


def main(argv: Optional[List[str]] = None) -> int:
    args = parse_args(argv)
    trainers = [t for t in ("tiny", "torch") if args.only in (None, t)]
    if "torch" in trainers and not _torch_available():
        print("bench: torch not installed: torch cases skipped", file=sys.stderr)
        trainers.remove("torch")
    root = Path(tempfile.mkdtemp(prefix="autoheal-bench-tiers-"))
    lab = Lab(root)
    rows = []
    try:
        lab.up(nodes=4, gpus=1, spares=0, hooks=True, xid_watch=True, install=False,
               extra_conf=["SlurmdTimeout=10", "KillWait=5",
                           f"AuthInfo=socket={root}/munge/munge.socket.2,cred_expire=10"])
        bench = Bench(lab, args.k, args.n, args.hang_after_fault)
        for trainer in trainers:
            for fault in [x for x in FAULTS if args.fault in (None, x)]:
                for path in [x for x in ("requeue", "hotspare") if args.path in (None, x)]:
                    for tier in [x for x in ("durable", "memory") if args.tier in (None, x)]:
                        rows.append(bench.case(trainer, path, tier, fault))
                        if not args.json:
                            print(_row(rows[-1]), flush=True)
    finally:
        lab.down()
    if args.json:
        print(json.dumps(rows, indent=1))
    else:
        print(_targets(rows, args.k))
    return 0


def _row(r: Dict[str, object]) -> str:
    tier = f"memory K={r['K']}" if r["tier"] == "memory" else f"durable N={r['N']}"
    save = (f"  save p50 {r['save_ms_p50']} ms p95 {r['save_ms_p95']} ms of {r['state_mb']} MB"
            if r["save_ms_p50"] is not None else "")
    save += f"  tier memory/node {r['memory_per_node_mb']} MB" if r["memory_per_node_mb"] is not None else ""
    origin = str(r["resumed_from"]).split("@")[0] if str(r["resumed_from"]).startswith("memory:") else "durable"
    ended = (f"  fault->step ended {r['fault_to_step_ended_s']} s (runner: {r['runner_waited_s']} s after "
             f"the signal)" if r["fault_to_step_ended_s"] is not None else "")
    down = f"  fault->srun told node down {r['fault_to_node_down_s']} s" if r["fault_to_node_down_s"] else ""
    phases = "\n      phases (s after the fault): " + ", ".join(f"{k} {v}" for k, v in r["phases"].items())  # type: ignore
    how = "requeued" if r["requeued"] else "same allocation"
    return (f"{r['trainer']:5} {r['fault']:11} {r['path']:8} {tier:14} lost steps {r['lost_steps']:3} "
            f"fault->resumed {r['fault_to_resumed_s']:6.2f} s ({how}, from {origin}){ended}{down}{save}{phases}")


def _targets(rows: List[Dict[str, object]], k: int) -> str:
    mem = [r for r in rows if r["tier"] == "memory"]
    hot, req = [r for r in mem if r["path"] == "hotspare"], [r for r in mem if r["path"] == "requeue"]
    ended = [r for r in rows if r["fault_to_step_ended_s"] is not None]
    lines = [f"targets: memory tier lost steps <= K={k}: hot spare max "
             f"{max((r['lost_steps'] for r in hot), default='-')} over {len(hot)} case(s); requeued max "
             f"{max((r['lost_steps'] for r in req), default='-')} over {len(req)} case(s)"]
    for r in req:  # why a requeued run did not resume from memory: where Slurm placed it
        before, after = list(r["nodes_before"]), list(r["nodes_after"])  # type: ignore[call-overload]
        if not str(r["resumed_from"]).startswith("memory:"):
            lines.append(f"  {r['trainer']} {r['fault']} requeue: {','.join(before)} -> {','.join(after)}: "
                         f"the copies on {','.join(sorted(set(before) - set(after))) or '-'} out of reach, "
                         f"resumed from durable")
    lines += [f"targets: hot spare + memory tier fault -> resumed <= 3 s: max "
              f"{max((r['fault_to_resumed_s'] for r in hot), default='-')} s over {len(hot)} case(s)",
              f"targets: hang after a fault ended within grace {GRACE} + 5 s: max "
              f"{max((r['fault_to_step_ended_s'] for r in ended), default='-')} s over {len(ended)} case(s)"]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
