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
- ``ecc``: an uncorrectable (double-bit) ECC error on its GPU (``ecc-dbe``: NVML's DBE count, XID 48 and
  its event): the rank's next GPU call aborts the process, as CUDA kills the context; its peer blocks in
  the next collective; xid-watch drains and signals; the hang detection ends the blocked step;
- ``nvlink``: an NVLink link of its GPU down (``nvlink-down``: XID 74): compute still works but the
  collective over the link never completes, so both ranks hang in it, signals pending; xid-watch drains
  and signals; the hang detection must end the step (no rank exits by itself);
- ``node-killed``: ``kill -9`` of the node's slurmd, its slurmstepds and every process on it, its
  memory wiped (``Lab.crash_node``); no signal comes: Slurm finds the node dead after SlurmdTimeout.

The faults are the lab's own injections (``autoheal_lab.gpus.inject``, as ``autoheal lab inject`` and the
integration tests make them); the trainers meet them through their fake GPU (``autoheal_lab.fakedevice``).

Figures, from the evidence's own clocks where it has one:

- lost steps: from the trainers' output (``autoheal_lab.lostwork``): the newest step a rank had printed
  before the restart minus the step the ranks resumed from;
- fault -> resumed: the trainer's own ``time=`` stamp on the first step of the restarted run minus the
  fault's time;
- fault -> step ended: when the runner's line "ending the step now" appeared (the bench reads the output
  every 20 ms; the runner's own "N s after the signal" is shown next to it), for a step whose ranks
  blocked after a fault signal (XID 79, ECC, NVLink: a row of theirs without it says "not ended by the
  hang detection" and misses the target); the target is the grace + 5 s;
- save cost: the memory tier's per-save time as the torch trainer reports it (p50, p95), the state's size,
  and the tier's memory per node, from the lab nodes' /dev/shm just before the fault: the job's own copies
  on its fullest node at the first read, the peak of its copies and copies being written over 25 reads
  20 ms apart, and other jobs' copies there if any (a job that is over, not yet freed by the hooks);
- phases: seconds after the fault of the drain and grace signal (journal), the rank's device error and the
  restarted ranks' start (the trainers' own clocks), the runner's end of the step and swap / requeue, and
  srun's "step creation temporarily disabled" / "Step created" (first seen): where the seconds go.

    python bench/bench_ckpt_tiers.py [--only tiny|torch] [--path requeue|hotspare] [--tier durable|memory]
                                     [--fault xid79|ecc|nvlink|node-killed] [--json] [--k 1] [--n 20]
                                     [--hang-after-fault 5] [--preload [MODULES]]

--json: one document (the run's start, end, load averages and torch version, the rows, the targets met
or not) on stdout; each row's text goes to stderr as it is measured. ``bench/run_all.py --tiers`` writes
it into docs/benchmarks.md and docs/researcher-guide.md.
A case that fails (no resume within 300 s) is a row with its ``error``; the matrix goes on.

Needs root and Debian's Slurm (like ``autoheal lab up``); torch for the torch cases. Targets (printed,
not asserted): memory tier lost steps <= K; hot spare + memory tier fault -> resumed <= 3 s; a hang after
a fault ended within the grace + 5 s.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

from bench_requeue_resume import wait_for  # the benches' one poll-until helper (bench/ is on sys.path)

import autoheal.sbatch_helpers as sbh
from autoheal import memtier_base
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
#: the seconds between the fault and the restarted run's first step go. "rank aborted": the line CUDA's
#: abort leaves on the crashed rank's stderr (an uncorrectable ECC error; it carries no clock of its own)
MARKS = (("swapped", "swapped for spare"), ("step busy", "step creation temporarily disabled"),
         ("step created", "Step created for job"), ("down", "srun: error: Node failure on"),
         ("rank aborted", "uncorrectable ECC error encountered"))
EVENT_TIME = re.compile(r" time=([\d.]+)")
GRACE = 10
#: --preload: what tiers_torch_trainer.py imports (torch._dynamo: the first torch.optim.Adam() imports it;
#: the lab's fake GPU module is only imported: each rank opens its device after the fork, as CUDA must be)
PRELOAD = ("torch,torch.optim,torch._dynamo,torch.distributed,autoheal.sbatch_helpers.checkpoint,"
           "autoheal.sbatch_helpers.memtier,autoheal.sbatch_helpers.preempt,autoheal_lab.fakedevice")
FAULTS = ("xid79", "ecc", "nvlink", "node-killed")
#: the faults xid-watch sees (an XID on the node) and signals the job for: their blocked step must be ended
#: by the runner's hang detection within the grace + 5 s. A killed node sends no signal (Slurm notices it).
SIGNALLED = frozenset({"xid79", "ecc", "nvlink"})
HANG_MARGIN = 5.0
MEMORY_READS = 25  # reads of the nodes' memory before the fault, 20 ms apart: about 0.5 s, a few saves
RESUME_TARGET_S = 3.0


def break_gpu_or_node(lab: Lab, fault: str, node: str, gpu: int) -> None:
    """The fault, by the lab's own injection (what ``autoheal lab inject`` and the integration tests do)."""
    if fault == "xid79":
        inject(lab, node, gpu, "xid", xid=79)  # fallen off the bus: the GPU's next call fails
    elif fault == "ecc":
        inject(lab, node, gpu, "ecc-dbe")  # DBE count, XID 48 and its event: the next GPU call aborts the rank
    elif fault == "nvlink":
        inject(lab, node, gpu, "nvlink-down")  # XID 74, link 0 down: the collective over it never completes
    elif fault == "node-killed":
        lab.crash_node(node)
    else:
        raise ValueError(f"unknown fault {fault!r}")


class Bench:
    def __init__(self, lab: Lab, k: int, n: int, hang_after_fault: float, preload: str = ""):
        self.lab, self.k, self.n, self.hang_after_fault = lab, k, n, hang_after_fault
        self.preload = preload  # --preload: the ranks start through autoheal-warm (warm interpreters)
        self.env = lab.slurm_env()
        self.slurm = CliSlurm(slurm_conf=str(lab.layout().slurm_conf), env=self.env)

    def script(self, root: Path, trainer: str, tier: str) -> Path:
        args = f"--steps 100000 --checkpoint-every {self.n} --device lab"
        args += f" --memory-every {self.k}" if tier == "memory" else ""
        if trainer == "tiny":  # MASTER_ADDR: every lab node is this machine, rank 0's node is reachable here
            run = f"export MASTER_ADDR=127.0.0.1\nsrun -l {sys.executable} {TINY} {args} --step-seconds 0.1 " \
                  f"--collective --timestamps --event-times\n"
        else:
            warm = f"{Path(sys.executable).parent / 'autoheal-warm'} " if self.preload else ""
            run = f"srun -l {warm}{sys.executable} {TORCH} {args} --step-seconds 0.05\n"
        path = root / "job.sh"
        path.write_text(f"#!/bin/bash\n#SBATCH -N 2 --ntasks-per-node=1 --gres=gpu:1 -o {root}/out.txt\n{run}")
        return path

    def submit(self, root: Path, trainer: str, path: str, tier: str) -> Tuple[str, Path]:
        env = dict(self.env, **({"AUTOHEAL_MEMORY_TIER": "1"} if tier == "memory" else {}))
        extra = ["--spare-nodes", "1"] if path == "hotspare" else []
        extra += ["--preload", self.preload] if self.preload and trainer == "torch" else []
        argv = [sys.executable, "-m", "autoheal.cli.main", "sbatch", "--grace", str(GRACE), "--hang-after-fault",
                f"{self.hang_after_fault:g}", *extra, "--parsable", str(self.script(root, trainer, tier))]
        res = subprocess.run(argv, cwd=root, env=env, capture_output=True, text=True, timeout=60)
        if res.returncode != 0:
            raise SystemExit(f"bench: sbatch failed: {res.stderr.strip()}")
        return res.stdout.strip().split(";")[0], root / "out.txt"

    def case(self, trainer: str, path: str, tier: str, fault: str) -> Dict[str, object]:
        """One case measured; a case that fails (no start, no resume) is a row with its ``error``, and the
        lab is put back in order either way (a failed cleanup ends the matrix: the next case would not
        start on clean nodes)."""
        head: Dict[str, object] = {"trainer": trainer, "path": path, "tier": tier, "fault": fault,
                                   "K": self.k if tier == "memory" else None, "N": self.n,
                                   "preload": self.preload if trainer == "torch" else ""}
        root = Path(tempfile.mkdtemp(prefix=f"bench-tiers-{trainer}-{path}-{tier}-{fault}-"))
        jid, out = self.submit(root, trainer, path, tier)
        victim: Optional[str] = None
        try:
            starts = wait_for(lambda: len(START.findall(_text(out))) >= 2 and START.findall(_text(out)), 150,
                              "job start")
            job = self.slurm.get_job(jid)
            victim = next(n for n in job.nodes if n != job.batch_host and any(s[4] == n for s in starts))
            rank = next(s[0] for s in starts if s[4] == victim)
            gpu = int(wait_for(lambda: re.search(rf"^{rank}: autoheal-trainer: device lab gpus=(\d+)", _text(out),
                                                 re.M), 30, "device line").group(1))
            wait_for(lambda: _last_step(_text(out), rank) >= 2 * self.n + self.n // 2, 240, "training under way")
            offset = len(_text(out))
            held = self._memory_held(job.nodes, jid) if tier == "memory" else []
            t_fault = time.time()
            break_gpu_or_node(self.lab, fault, victim, gpu)
            seen = self._watch(out, offset, 300)
            text = _text(out)
            row = dict(head, **figures(text, offset, rank, t_fault, seen, [s[4] for s in starts]))
            row.update(memory_figures(held))
            row["phases"] = phases(text[offset:], self._journal(t_fault), jid, t_fault, seen,
                                   row.pop("first_step_time"))  # type: ignore[arg-type]
            return row
        except (SystemExit, StopIteration, IndexError, ValueError) as exc:
            return dict(head, error=f"{type(exc).__name__}: {exc}"[:300], output=str(out))
        finally:
            self._cleanup(jid, victim)

    def _memory_held(self, nodes: Sequence[str], jid: str, reads: int = MEMORY_READS) -> List[Dict[str, Held]]:
        """What each node's memory (the lab's per-node /dev/shm) holds, read ``reads`` times 20 ms apart
        just before the fault: the first read is the figure, the others catch the peak (a save in flight)."""
        base = self.lab.layout().memory_base
        out = []
        for _ in range(reads):
            out.append({n: memory_held(Path(base.replace("{node}", n)), jid) for n in nodes})
            time.sleep(0.02)
        return out

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
            if resumed_in(tail):
                return seen
            time.sleep(0.02)
        raise SystemExit(f"bench: the job did not resume within {timeout}s; see {out}")

    def _cleanup(self, jid: str, victim: Optional[str]) -> None:
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
        if victim is not None:
            rec = self.lab.records().get(f"slurmd-{victim}")
            if not rec or not procs.is_alive(rec):
                self.lab.start_slurmd(victim)
            wait_for(lambda: self.slurm.get_node(victim).responding, 90, f"{victim} back")
            inject(self.lab, victim, 0, "clear")  # a GPU reset: the ECC count, the link, the lost GPU
            subprocess.run([sys.executable, "-m", "autoheal.cli.main", "check", "--clear-faults", "--node", victim],
                           env=dict(self.env, **self.lab.node_env(victim)), capture_output=True, timeout=30)
            node = self.slurm.get_node(victim)
            if node.drain or node.down:
                self.slurm.resume(victim)
        wait_for(lambda: all(n.state == "IDLE" and not n.drain for n in self.slurm.list_nodes()), 180, "nodes idle")


@dataclass(frozen=True)
class Held:
    """Bytes in one node's memory folder: the job's published copies, its copies being written (the
    agent's temporaries: a save in flight), and every other job's files (copies left by a job that is
    over: what the hooks' sweep frees)."""

    copies: int = 0
    in_flight: int = 0
    other_jobs: int = 0


def memory_held(base: Path, jid: str) -> Held:
    """One read of a node's memory folder ``base`` for job ``jid`` (``autoheal/memtier_files.py``'s
    layout). A file the agent renames or drops while it is read counts as gone, never as an error."""
    copies = in_flight = other = 0
    for user in _entries(base, memtier_base.USER_DIR_PREFIX):
        for job in _entries(user, ""):
            for f in _entries(job, ""):
                try:
                    size = f.stat(follow_symlinks=False).st_size
                except FileNotFoundError:
                    continue
                if job.name != jid:
                    other += size
                elif f.name.endswith(".copy"):
                    copies += size
                elif f.name.startswith(".tmp-"):
                    in_flight += size
    return Held(copies, in_flight, other)


def _entries(folder: Path, prefix: str) -> List[Path]:
    try:
        return [p for p in folder.iterdir() if p.name.startswith(prefix)]
    except (FileNotFoundError, NotADirectoryError):
        return []


def memory_figures(reads: List[Dict[str, Held]]) -> Dict[str, Optional[float]]:
    """The row's memory figures in MB from the reads (pure): the job's copies on its fullest node at the
    first read (the tier's bound: copies x the node's ranks and its ring predecessor's x the state),
    the peak over every read of the job's copies and temporaries on one node, and the most other jobs'
    bytes on one node (copies of a job that is over the hooks had not freed yet)."""
    if not reads:
        return {"memory_per_node_mb": None, "memory_peak_mb": None, "memory_other_jobs_mb": None}
    first = reads[0].values()
    peak = max(h.copies + h.in_flight for read in reads for h in read.values())
    return {"memory_per_node_mb": round(max(h.copies for h in first) / 1e6, 2),
            "memory_peak_mb": round(peak / 1e6, 2),
            "memory_other_jobs_mb": round(max(h.other_jobs for read in reads for h in read.values()) / 1e6, 2)}


def resumed_in(tail: str) -> bool:
    """Both ranks printed a step after the newest start block: training resumed (pure)."""
    restart = list(START.finditer(tail))
    return len(restart) >= 2 and len({s.group(1) for s in STEP.finditer(tail[restart[-1].end():])}) >= 2


def figures(text: str, offset: int, rank: str, t_fault: float, seen: Dict[str, tuple],
            nodes_before: Sequence[str]) -> Dict[str, object]:
    """A case's figures from the job's output (``text``; the fault came when it was ``offset`` long) and
    what the watch saw (pure): lost steps, fault -> resumed (the trainer's own clock on the restarted run's
    first step), fault -> step ended, the memory tier's save cost, where each run ran. ``first_step_time``
    is for :func:`phases`."""
    resume = lostwork.resumes(text)[0]
    restarted = [m for m in START.finditer(text) if m.start() >= offset]
    first = next(m for m in STEP.finditer(text) if m.start() > max(r.start() for r in restarted))
    saves = [float(m) for m in re.findall(r"^\d+: autoheal-trainer: memory saved .* ms=([\d.]+)", text, re.M)]
    sizes = [int(m) for m in re.findall(r"^\d+: autoheal-trainer: memory saved .* bytes=(\d+)", text, re.M)]
    ended = seen.get("ended")
    down = seen.get("down")
    return {"lost_steps": resume.lost, "resumed_step": min(resume.resumed.values()),
            "fault_to_resumed_s": round(float(first.group(3)) - t_fault, 2),
            "fault_to_step_ended_s": round(ended[0] - t_fault, 2) if ended else None,
            "runner_waited_s": float(ended[1]) if ended else None,
            "fault_to_node_down_s": round(down[0] - t_fault, 2) if down else None,
            "resumed_from": next((m.group(3) for m in restarted if m.group(1) == rank), restarted[0].group(3)),
            "requeued": any(m.group(4) != "0" for m in restarted),
            "nodes_before": sorted(nodes_before), "nodes_after": sorted(m.group(5) for m in restarted),
            "save_ms_p50": round(statistics.median(saves), 1) if saves else None,
            "save_ms_p95": round(_quantile(saves, 0.95), 1) if saves else None,
            "state_mb": round(max(sizes) / 1e6, 2) if sizes else None,
            "first_step_time": float(first.group(3))}


def phases(tail: str, journal: List[dict], jid: str, t_fault: float, seen: Dict[str, tuple],
           first_step: float) -> Dict[str, float]:
    """Seconds after the fault of each phase, from the evidence's own clock where it has one: the
    journal's record time (drain, grace signal, swap / requeue), the trainers' own time= stamps (a rank's
    device error, the restarted ranks' start), else when the bench first saw the runner's or srun's line
    (pure: ``journal`` holds the records since the fault)."""
    at: Dict[str, float] = {}
    for rec in journal:
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


@dataclass(frozen=True)
class Target:
    """One of issue 23's targets over the cases it applies to: the worst figure, and the cases that
    missed it (a failed case, or a hang the runner did not end, misses it)."""

    name: str
    limit: float
    unit: str
    worst: Optional[float]
    cases: int
    missed: List[str] = field(default_factory=list)

    @property
    def met(self) -> bool:
        return self.cases > 0 and not self.missed


def _label(r: Dict[str, object]) -> str:
    return f"{r['trainer']} {r['fault']} {r['path']} {r['tier']}"


def _target(name: str, limit: float, unit: str, rows: List[Dict[str, object]], key: str) -> Target:
    values = [r.get(key) for r in rows]
    known = [float(v) for v in values if v is not None]  # type: ignore[arg-type]
    missed = [_label(r) for r, v in zip(rows, values) if v is None or float(v) > limit]  # type: ignore[arg-type]
    return Target(name, limit, unit, max(known) if known else None, len(rows), missed)


def check_targets(rows: List[Dict[str, object]], k: int, grace: float = GRACE) -> List[Target]:
    """Issue 23's targets on the lab, judged over the rows (pure): memory tier lost steps <= K (hot spare
    and requeue apart: a requeue onto other nodes leaves the copies out of reach), hot spare + memory tier
    fault -> resumed <= 3 s, and a step blocked after a signalled fault ended within the grace + 5 s."""
    mem = [r for r in rows if r["tier"] == "memory"]
    hot = [r for r in mem if r["path"] == "hotspare"]
    return [_target(f"memory tier lost steps <= K={k}, hot spare", k, "steps", hot, "lost_steps"),
            _target(f"memory tier lost steps <= K={k}, requeue", k, "steps",
                    [r for r in mem if r["path"] == "requeue"], "lost_steps"),
            _target("hot spare + memory tier fault -> resumed <= 3 s", RESUME_TARGET_S, "s", hot,
                    "fault_to_resumed_s"),
            _target(f"hang after a fault ended within grace {grace:g} + {HANG_MARGIN:g} s", grace + HANG_MARGIN,
                    "s", [r for r in rows if r["fault"] in SIGNALLED], "fault_to_step_ended_s")]


def _text(path: Path) -> str:
    return path.read_text(errors="replace") if path.exists() else ""


def _quantile(values: List[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def _last_step(text: str, rank: str) -> int:
    steps = [int(m.group(2)) for m in STEP.finditer(text) if m.group(1) == rank]
    return max(steps) if steps else 0


def _torch_version() -> Optional[str]:
    try:
        import torch
    except ImportError:
        return None
    return str(torch.__version__)


def _uptime() -> str:
    try:
        return subprocess.run(["uptime"], capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "load average: %.2f, %.2f, %.2f" % os.getloadavg()


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
    p.add_argument("--preload", nargs="?", const=PRELOAD, default="", metavar="MODULES",
                   help=f"torch cases: warm interpreters preloading MODULES (default {PRELOAD}), the ranks "
                        f"started through autoheal-warm")
    p.add_argument("--json", action="store_true", help="one JSON document on stdout (rows' text on stderr)")
    return p.parse_args(argv)


def main(argv: Optional[List[str]] = None) -> int:
    args = parse_args(argv)
    trainers = [t for t in ("tiny", "torch") if args.only in (None, t)]
    torch_version = _torch_version()
    if "torch" in trainers and torch_version is None:
        print("bench: torch not installed: torch cases skipped", file=sys.stderr)
        trainers.remove("torch")
    meta: Dict[str, object] = {"argv": sys.argv[1:] if argv is None else list(argv), "k": args.k, "n": args.n,
                               "grace": GRACE, "hang_after_fault": args.hang_after_fault, "preload": args.preload,
                               "torch": torch_version,
                               "commit": _commit(), "started": _utc(), "uptime_start": _uptime()}
    print(f"bench: started {meta['started']}: {meta['uptime_start']}", file=sys.stderr, flush=True)
    root = Path(tempfile.mkdtemp(prefix="autoheal-bench-tiers-"))
    lab = Lab(root)
    rows: List[Dict[str, object]] = []
    out = sys.stderr if args.json else sys.stdout
    try:
        lab.up(nodes=4, gpus=1, spares=0, hooks=True, xid_watch=True, install=False,
               extra_conf=["SlurmdTimeout=10", "KillWait=5",
                           f"AuthInfo=socket={root}/munge/munge.socket.2,cred_expire=10"])
        bench = Bench(lab, args.k, args.n, args.hang_after_fault, args.preload)
        for trainer in trainers:
            for fault in [x for x in FAULTS if args.fault in (None, x)]:
                for path in [x for x in ("requeue", "hotspare") if args.path in (None, x)]:
                    for tier in [x for x in ("durable", "memory") if args.tier in (None, x)]:
                        rows.append(bench.case(trainer, path, tier, fault))
                        print(render_row(rows[-1]), file=out, flush=True)
    except SystemExit as exc:  # a case's cleanup failed: the lab is not fit for the next; keep what was measured
        meta["aborted"] = str(exc)
        print(f"bench: matrix aborted after {len(rows)} case(s): {exc}", file=sys.stderr, flush=True)
    finally:
        lab.down()
    meta.update(ended=_utc(), uptime_end=_uptime())
    targets = check_targets(rows, args.k)
    print(render_targets(rows, targets), file=out, flush=True)
    print(f"bench: ended {meta['ended']}: {meta['uptime_end']}", file=sys.stderr, flush=True)
    if args.json:
        print(json.dumps({**meta, "rows": rows, "targets": [dict(asdict(t), met=t.met) for t in targets]}, indent=1))
    return 0


def _commit() -> str:
    """The tree the figures were taken on: its commit, ``+changes`` when it differs from it."""
    here = str(Path(__file__).resolve().parent)
    try:
        head = subprocess.run(["git", "-C", here, "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                              timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "-C", here, "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "?"
    return (head or "?") + ("+changes" if dirty else "")


def _utc() -> str:
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")


def render_row(r: Dict[str, object]) -> str:
    """One case as the bench prints it (and docs/benchmarks.md holds it)."""
    tier = f"memory K={r['K']}" if r["tier"] == "memory" else f"durable N={r['N']}"
    if r.get("error"):
        return (f"{r['trainer']:5} {r['fault']:11} {r['path']:8} {tier:14} FAILED: {r['error']} "
                f"(output: {r.get('output')})")
    save = (f"  save p50 {r['save_ms_p50']} ms p95 {r['save_ms_p95']} ms of {r['state_mb']} MB"
            if r["save_ms_p50"] is not None else "")
    save += f"  tier memory/node {r['memory_per_node_mb']} MB" if r["memory_per_node_mb"] is not None else ""
    save += f" (peak {r['memory_peak_mb']} MB)" if r.get("memory_peak_mb") is not None else ""
    save += f" (+{r['memory_other_jobs_mb']} MB of other jobs)" if r.get("memory_other_jobs_mb") else ""
    origin = str(r["resumed_from"]).split("@")[0] if str(r["resumed_from"]).startswith("memory:") else "durable"
    if r["fault_to_step_ended_s"] is not None:
        ended = (f"  fault->step ended {r['fault_to_step_ended_s']} s (runner: {r['runner_waited_s']} s after "
                 f"the signal)")
    elif r["fault"] in SIGNALLED:  # the step was expected to block and be ended by the hang detection
        ended = "  fault->step ended: not ended by the hang detection"
    else:
        ended = ""
    down = f"  fault->srun told node down {r['fault_to_node_down_s']} s" if r["fault_to_node_down_s"] else ""
    phases = "\n      phases (s after the fault): " + ", ".join(f"{k} {v}" for k, v in r["phases"].items())  # type: ignore
    how = "requeued" if r["requeued"] else "same allocation"
    how += ", warm interpreters" if r.get("preload") else ""
    return (f"{r['trainer']:5} {r['fault']:11} {r['path']:8} {tier:14} lost steps {r['lost_steps']:3} "
            f"fault->resumed {r['fault_to_resumed_s']:6.2f} s ({how}, from {origin}){ended}{down}{save}{phases}")


def render_targets(rows: List[Dict[str, object]], targets: List[Target]) -> str:
    """The targets met or not, and why a requeued memory-tier run resumed from the durable tier."""
    lines = []
    for t in targets:
        verdict = "met" if t.met else ("no case" if not t.cases else f"NOT met ({len(t.missed)} of {t.cases}: "
                                                                      f"{'; '.join(t.missed)})")
        worst = "-" if t.worst is None else f"{t.worst:g} {t.unit}"
        lines.append(f"targets: {t.name}: max {worst} over {t.cases} case(s): {verdict}")
    for r in rows:  # why a requeued run did not resume from memory: where Slurm placed it
        if r["tier"] == "memory" and r["path"] == "requeue" and not r.get("error") \
                and not str(r["resumed_from"]).startswith("memory:"):
            before, after = list(r["nodes_before"]), list(r["nodes_after"])  # type: ignore[call-overload]
            lines.append(f"  {r['trainer']} {r['fault']} requeue: {','.join(before)} -> {','.join(after)}: "
                         f"the copies on {','.join(sorted(set(before) - set(after))) or '-'} out of reach, "
                         f"resumed from durable")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
