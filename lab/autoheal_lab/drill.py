"""``autoheal lab drill``: the whole self-healing loop on the lab, timed from the evidence.

A 2-node trainer runs under ``autoheal sbatch``; XID 79 is injected on one GPU of one of its nodes;
the drill then watches Slurm, the journal, the trainer's own output and (with ``kube``) the Kubernetes
API, and stamps each phase when its evidence appears — never from what it expects. A phase that never
comes is reported missing after a bounded wait, with the log lines that explain why.

Every phase is tied to this fault's node and job: the job counts as requeued and running again only
with a restart count above the one it had before the fault (and never on the bad node); the spare in
service is the one named by *this* node's replacement request, looked at only once that request has
been seen. A probe that raises is a drill error (the drill could not tell), reported apart from a
missing phase: ``DrillReport.exit_code`` is 3 then, 1 for a missing or contradicted phase.

With ``fault_reaches_job`` the trainers run on the step's fake GPUs (``--device lab``) with a real
collective (``--collective``), and the XID goes to the GPU the broken rank holds: its next GPU call
fails and its peer blocks in the collective with the grace signal held pending, as on real hardware, so
nothing is saved after the fault. Either way the drill reports the **lost steps**: the newest step a
rank had completed before the restart minus the step it resumed from, read from the trainers' own output
(``autoheal_lab.lostwork``).
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Dict, List, Optional, Tuple, Union

from autoheal.errors import EXIT_OK, EXIT_PROBLEM
from autoheal.journal import Journal
from autoheal.reasons import is_ours
from autoheal_lab.cluster import Lab, LabError
from autoheal_lab.gpus import inject
from autoheal_lab.stamping import POLLED_NOTE, Clock, Evidence, Observation, pick, stamp_all

POLL = 0.1
#: With the fault reaching the job it is injected this many steps after the first checkpoint (the drill's
#: trainer saves every 10).
MID_INTERVAL = 5
TRAINER = "autoheal-trainer: "
#: the trainer's own clock at the end of its line (tiny_trainer --timestamps / --event-times)
TRAINER_TIME_RX = re.compile(r"\stime=(\d+(?:\.\d+)?)\s*$")
#: How long a probe whose phase Slurm already shows waits for the journal record that times it to the
#: millisecond (its writer records it just after Slurm took the change) before taking Slurm's whole second.
JOURNAL_WAIT = 2.0
#: Exit code of a drill whose probe raised: it could not tell whether the loop worked.
EXIT_DRILL_ERROR = 3
#: Job states a requeued drill job must never reach (the trainer runs far longer than any drill).
#: (NODE_FAIL is left out: Slurm may show it for a moment on a job it requeues after a node failure.)
ENDED = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "OUT_OF_MEMORY", "BOOT_FAIL", "DEADLINE")


class Waiting:
    """What a probe returns when its evidence is not there yet, with what it saw instead (shown for a
    phase that ends up missing)."""

    def __init__(self, note: str):
        self.note = note

    def __bool__(self) -> bool:
        return False


Probe = Callable[[], Union[Evidence, Waiting, None]]


@dataclass
class Phase:
    """One step of the loop: observed at ``at`` (epoch seconds) from ``source``, or missing/skipped.

    ``at`` is decided from the evidence's own clock (``clock``; autoheal_lab.stamping), never earlier
    than the fault or the phase it ``follows``; ``polled_at`` is when the drill's poll first saw it."""

    name: str
    source: str
    probe: Optional[Probe] = None
    at: Optional[float] = None
    detail: str = ""
    skipped: str = ""  # why this phase does not apply to this drill
    failed: str = ""  # observed, but the evidence contradicts the mission (e.g. resumed from the wrong step)
    error: str = ""  # the probe raised: the drill could not tell (not the same as a missing phase)
    last_error: str = ""  # a transient read failure in the last probe (an error if the phase never comes)
    # polled only once this phase is observed: every probe costs a Slurm or API call, and polling all of
    # them each tick made one tick last 1-2 s under load, stamping early phases late
    after: Optional[Phase] = None
    follows: Optional[Phase] = None  # the phase that causes this one (defaults to ``after``): it cannot come first
    evidence: Optional[Evidence] = None
    polled_at: Optional[float] = None
    clock: str = ""  # whose clock ``at`` came from (stamping.Clock)
    stamp_note: str = ""  # what the stamping adjusted (clamped, whole second, polled), "" when nothing
    uncertainty: float = 0.0

    @property
    def ok(self) -> bool:
        return bool(self.skipped) or (self.at is not None and not self.failed and not self.error)

    @property
    def status(self) -> str:
        if self.skipped:
            return "skipped"
        if self.error:
            return "error"
        if self.failed:
            return "failed"
        return "observed" if self.at is not None else "missing"


@dataclass
class DrillReport:
    """The timeline and totals of one drill."""

    fault_time: float = 0.0
    node: str = ""
    job_id: str = ""
    opt_in: bool = True
    kube: bool = True
    slurm_defaults: bool = False
    hot_spare: bool = False
    fault_reaches_job: bool = True
    lost_steps: Optional[int] = None  # from the trainers' own output (autoheal_lab.lostwork)
    phases: List[Phase] = field(default_factory=list)
    notes: List[str] = field(default_factory=list)
    logs: Dict[str, List[str]] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return bool(self.phases) and all(p.ok for p in self.phases)

    @property
    def errors(self) -> List[Phase]:
        return [p for p in self.phases if p.error]

    @property
    def exit_code(self) -> int:
        """0 every phase observed; 3 a probe raised (the drill could not tell); 1 a phase missing or
        contradicted."""
        if self.ok:
            return EXIT_OK
        return EXIT_DRILL_ERROR if self.errors else EXIT_PROBLEM

    def since_fault(self, name_prefix: str) -> Optional[float]:
        for p in self.phases:
            if p.name.startswith(name_prefix) and p.at is not None:
                return round(p.at - self.fault_time, 3)
        return None

    def totals(self) -> Dict[str, Optional[float]]:
        return {"fault_to_drain_s": self.since_fault("drained"),
                "fault_to_grace_signal_s": self.since_fault("grace signal"),
                "fault_to_requeued_s": self.since_fault("job requeued"),
                "fault_to_job_running_again_s": self.since_fault("job running again"),
                "fault_to_replacement_in_service_s": self.since_fault("spare node in service"),
                "fault_to_trainer_resumed_s": self.since_fault("trainer restarted at the right step")}

    def to_dict(self) -> dict:
        return {
            "ok": self.ok, "exit_code": self.exit_code, "node": self.node, "job_id": self.job_id,
            "opt_in": self.opt_in, "kube": self.kube, "slurm_defaults": self.slurm_defaults,
            "hot_spare": self.hot_spare, "fault_reaches_job": self.fault_reaches_job, "lost_steps": self.lost_steps,
            "fault_time": self.fault_time, "totals": self.totals(), "notes": self.notes, "logs": self.logs,
            "errors": [f"{p.name}: {p.error}" for p in self.errors],
            "phases": [{"phase": p.name, "source": p.source, "detail": p.detail,
                        "seconds_after_fault": None if p.at is None else round(p.at - self.fault_time, 3),
                        "clock": p.clock, "stamp_note": p.stamp_note, "uncertainty_s": round(p.uncertainty, 3),
                        "polled_s": None if p.polled_at is None else round(p.polled_at - self.fault_time, 3),
                        "status": p.status,
                        **({"why": p.skipped or p.error or p.failed} if (p.skipped or p.error or p.failed) else {})}
                       for p in self.phases],
        }


class OutputTail:
    """Follows the job's output file; stamps each trainer line with the time we first saw it."""

    def __init__(self, path: Path):
        self.path = path
        self.offset = 0
        self.lines: List[Tuple[float, str]] = []
        self._partial = ""

    def poll(self) -> None:
        try:
            with open(self.path, encoding="utf-8", errors="replace") as fh:
                fh.seek(self.offset)
                data = fh.read()
                self.offset = fh.tell()
        except FileNotFoundError:
            return
        now = time.time()
        data = self._partial + data
        *complete, self._partial = data.split("\n")
        self.lines.extend((now, ln) for ln in complete if ln.strip())

    def index_of(self, t: float, line: str) -> int:
        return next(i for i, (tt, ln) in enumerate(self.lines) if ln == line and tt == t)

    def find(self, pattern: str, after: float = 0.0, start: int = 0) -> Optional[Tuple[float, str, re.Match]]:
        rx = re.compile(pattern)
        for t, line in self.lines[start:]:
            if t < after:
                continue
            m = rx.search(line)
            if m:
                return t, line, m
        return None


class Drill:
    """Runs one drill on ``lab`` (already up)."""

    #: A trainer output line that says how far training got (the example trainer's ``... step=N``, with
    #: ``time=<epoch>`` after it under --timestamps).
    PROGRESS_RX = re.compile(r"(?:^|\s)step=(\d+)(?: time=[\d.]+)?$")

    def __init__(self, lab: Lab, opt_in: bool = True, kube: bool = True, gpu: int = 3,
                 phase_timeout: float = 240.0, step_seconds: float = 0.1, hot_spare: bool = False,
                 kube_not_run: str = "", fault_reaches_job: bool = True):
        from autoheal.slurm.cli_backend import CliSlurm

        self.lab = lab
        self.lay = lab.layout()
        self.env = lab.slurm_env()
        self.slurm = CliSlurm(env=self.env, timeout=10)
        self.journal = Journal(self.lay.path("journal", "journal.jsonl"))
        self.opt_in = opt_in
        self.kube = kube and bool((lab.load_state() or {}).get("kubeconfig"))
        #: why the Kubernetes phases cannot run here (Go missing to build the control plane), else ""
        self.kube_skip = f"not run: {kube_not_run}" if kube_not_run else "--no-kube"
        self.gpu = gpu
        self.phase_timeout = phase_timeout
        self.step_seconds = step_seconds
        self.workdir = self.lay.path("drill", time.strftime("%Y%m%d-%H%M%S") + f"-{os.getpid()}")
        self.hot_spare = hot_spare and opt_in
        self.fault_reaches_job = fault_reaches_job
        self.report = DrillReport(opt_in=opt_in, kube=self.kube, hot_spare=self.hot_spare,
                                  fault_reaches_job=fault_reaches_job,
                                  slurm_defaults=bool((lab.load_state() or {}).get("slurm_defaults")))
        self.spare: Optional[str] = None  # hot spare: the idle spare the runner named
        self.tail: Optional[OutputTail] = None
        self.saved_step: Optional[int] = None
        self.resumed_step: Optional[int] = None
        self.first_restart_line = 0
        self.baseline_restarts = 0  # the job's restart count when the fault was injected
        self.request: Optional[Dict[str, str]] = None  # this node's replacement request, once seen
        self.kube_view: Optional[_KubeView] = None

    # ---- submission --------------------------------------------------------------------------------
    def _script(self) -> Path:
        import autoheal.sbatch_helpers as helpers  # the example trainers ship as package data

        trainer = Path(helpers.__file__).parent / "examples" / "tiny_trainer.py"
        ckpt = ["--checkpoint-every", "10"] if self.opt_in else []
        # the fault reaches the job: each rank on the GPU Slurm gave its step, a real allreduce per step
        # (--event-times: every line carries the trainer's clock, the drill's stamp for that phase)
        real = ["--device", "lab", "--collective", "--timestamps", "--event-times"] if self.fault_reaches_job \
            else []
        cmd = " ".join(shlex.quote(a) for a in [sys.executable, str(trainer), "--steps", "100000",
                                                "--step-seconds", str(self.step_seconds), *ckpt, *real])
        script = self.workdir / "train.sh"
        script.write_text("\n".join([
            "#!/bin/bash",
            "#SBATCH --job-name=drill-trainer",
            "#SBATCH --nodes=2",
            "#SBATCH --ntasks-per-node=1",
            f"#SBATCH --output={self.workdir}/job.out",
            f"#SBATCH --exclude={','.join(self.lay.spares)}" if self.lay.spares else "",
            *(["#SBATCH --gres=gpu:1", "export MASTER_ADDR=127.0.0.1"] if self.fault_reaches_job else []),
            f"srun -l {cmd}" if self.fault_reaches_job else f"srun {cmd}",
            "",
        ]))
        return script

    def submit(self) -> str:
        self.workdir.mkdir(parents=True, exist_ok=True)
        script = self._script()
        if self.opt_in:
            argv = [sys.executable, "-m", "autoheal.cli.main", "sbatch", "--parsable",
                    "--checkpoint-dir", str(self.workdir / "ckpt"),
                    *(["--spare-nodes", "1"] if self.hot_spare else []), str(script)]
        else:
            argv = ["sbatch", "--parsable", "--requeue", "--open-mode=append", str(script)]
        res = subprocess.run(argv, env=self.env, capture_output=True, text=True, timeout=60, cwd=str(self.workdir))
        if res.returncode != 0:
            raise LabError(f"submitting the drill job failed: {res.stderr.strip() or res.stdout.strip()}")
        job_id = res.stdout.strip().splitlines()[-1].split(";")[0]
        self.report.job_id = job_id
        self.tail = OutputTail(self.workdir / "job.out")
        return job_id

    def wait_first_checkpoint(self, timeout: float = 90.0) -> str:
        """Until the job runs (and, opted in, has saved a checkpoint); returns the node to break."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self.tail.poll()
            job = self.slurm.get_job(self.report.job_id)
            ready = self.tail.find(r"checkpoint saved step=(\d+)") if self.opt_in else self.tail.find(r"step=5\b")
            if ready and self.opt_in and self.fault_reaches_job:
                # halfway to the next save, as a fault usually comes: the lost steps then mean something
                # (right after a save nothing can be lost)
                ready = self.tail.find(rf"(?:^|\s)step={int(ready[2].group(1)) + MID_INTERVAL}(?:\s|$)")
            hot = self.tail.find(r"hot spares: steps run on (\S+); idle spare\(s\) (\S+)") if self.hot_spare else None
            if job.running and ready and len(job.nodes) == (3 if self.hot_spare else 2) and (hot or not self.hot_spare):
                self.baseline_restarts = job.restart_count
                # break a node other than the batch host: the batch shell (and the runner) survive, so the
                # hand-off between xid-watch and the runner is exercised, not just a dead job
                others = [n for n in job.nodes if n != job.batch_host]
                if hot:  # an active node (the steps run there), not the idle spare
                    self.spare = hot[2].group(2)
                    others = [n for n in hot[2].group(1).split(",") if n != job.batch_host]
                node = others[0] if others else job.nodes[0]
                if self.fault_reaches_job and not self._aim_at_rank_on(node):
                    time.sleep(POLL)
                    continue
                return node
            time.sleep(POLL)
        raise LabError(f"drill job {self.report.job_id} did not start and checkpoint within {timeout:.0f}s; "
                       f"see {self.workdir}/job.out")

    def _aim_at_rank_on(self, node: str) -> bool:
        """The fault goes to the GPU the rank on ``node`` holds (its ``device lab gpus=N`` line): False
        until that rank has said where it runs and on which GPU."""
        start = self.tail.find(rf"^(\d+): {TRAINER}start step=\d+ .* host={re.escape(node)} rank=\d+ ")
        if not start:
            return False
        dev = self.tail.find(rf"^{start[2].group(1)}: {TRAINER}device lab gpus=(\d+)")
        if not dev:
            return False
        self.gpu = int(dev[2].group(1))
        return True

    # ---- probes ------------------------------------------------------------------------------------
    def _journal_probe(self, events: Tuple[str, ...], node: Optional[str] = None, job: Optional[str] = None,
                       match: str = "") -> Probe:
        def probe():
            rec = self._journal_record(events, node=node, job=job, match=match)
            return _stamp(f"{rec.event}: {rec.message or rec.outcome}", journal_time(rec)) if rec else None
        return probe

    def _journal_record(self, events: Tuple[str, ...], node: Optional[str] = None, job: Optional[str] = None,
                        match: str = ""):
        """The first journal record of ``events`` since the fault (half a second of slack for the clock)."""
        for rec in self.journal.read(node=node, job=job, since=self.report.fault_time - 0.5):
            if rec.event in events and (not match or match in (rec.message + rec.action + rec.outcome)):
                return rec
        return None

    def _drained_probe(self, node: str, record_wait: float = JOURNAL_WAIT) -> Probe:
        seen: List[float] = []  # when the poll first saw the drain in Slurm

        def probe():
            n = self.slurm.get_node(node)
            if n.drain and is_ours(n.reason):
                # when: xid-watch's drain record (sub-second), else Slurm's own reason time (whole seconds).
                # xid-watch writes the record just after Slurm took the drain: wait a moment for it (the
                # stamp is the evidence's time, so waiting costs no precision)
                rec = self._journal_record(("drain",), node=node)
                seen.append(time.monotonic())
                if rec is None and seen[-1] - seen[0] < record_wait:
                    return Waiting(f"{node} {n.state_text}: {n.reason} (waiting for xid-watch's journal record)")
                when = pick([journal_time(rec), slurm_time(n.reason_time)])
                return _stamp(f"{node} {n.state_text}: {n.reason}", when)
            return Waiting(f"{node} {n.state_text}" + (f": {n.reason}" if n.reason else ""))
        return probe

    def _trainer_probe(self, pattern: str, after_restart: bool = False, check=None) -> Probe:
        def probe():
            start = self.first_restart_line if after_restart else 0
            if after_restart and not self.first_restart_line:
                return None
            hit = self.tail.find(pattern, after=self.report.fault_time, start=start)
            if not hit:
                return None
            _t, line, m = hit
            if check:
                check(m)
            return trainer_evidence(_untimed(line.split(TRAINER, 1)[-1]), line)
        return probe

    def _requeued_probe(self, record_wait: float = JOURNAL_WAIT) -> Probe:
        seen: List[float] = []

        def probe():
            verdict = judge_requeued(self.slurm.get_job(self.report.job_id), self.baseline_restarts)
            if not verdict:
                return verdict
            # when: the runner's (or xid-watch's) journal record of the requeue, written just after it (Slurm
            # keeps no requeue time): waited for a moment, else the poll's time
            rec = self._journal_record(("job-requeue", "requeue"), job=self.report.job_id)
            seen.append(time.monotonic())
            if rec is None and seen[-1] - seen[0] < record_wait:
                return Waiting(f"{verdict} (waiting for the requeue's journal record)")
            return _stamp(verdict, journal_time(rec))
        return probe

    def _running_again_probe(self, bad: str) -> Probe:
        def probe():
            job = self.slurm.get_job(self.report.job_id)
            return _stamp(judge_running_again(job, self.baseline_restarts, bad), slurm_time(job.start_time))
        return probe

    def _restart_start_probe(self) -> Probe:
        def probe():
            hit = None
            start = 0
            while True:  # the first start line of a restart after this fault (restart count above the baseline)
                hit = self.tail.find(r"start step=(\d+) resumed_from=(\S+) restart=(\d+) .*rank=0",
                                     after=self.report.fault_time, start=start)
                if hit is None or int(hit[2].group(3)) > self.baseline_restarts:
                    break
                start = self.tail.index_of(hit[0], hit[1]) + 1
            if not hit:
                return None
            t, line, m = hit
            self.first_restart_line = self.tail.index_of(t, line)
            self.resumed_step = int(m.group(1))
            if self.opt_in:
                if self.saved_step is not None and self.resumed_step != self.saved_step:
                    raise Contradiction(f"resumed from step {self.resumed_step}, but the last checkpoint saved "
                                         f"before the fault was step {self.saved_step}")
                detail = f"resumed from step {self.resumed_step} ({m.group(2)})"
            else:
                if self.resumed_step != 0:
                    raise Contradiction(f"a job that did not opt in resumed from step {self.resumed_step}")
                detail = "restarted from step 0: the job did not opt in, so no checkpoint-resume"
            return trainer_evidence(detail, line)
        return probe

    def _progress_probe(self) -> Probe:
        def probe():
            if self.resumed_step is None or not self.first_restart_line:
                return None
            for _t, line in self.tail.lines[self.first_restart_line:]:
                m = self.PROGRESS_RX.search(line.strip())
                if m and int(m.group(1)) >= self.resumed_step + 5:
                    return trainer_evidence(f"training reached step {m.group(1)}", line)
            return None
        return probe

    def _record_probe(self) -> Probe:
        def probe():
            job = self.slurm.get_job(self.report.job_id)
            recs = [r for r in self.journal.read(job=self.report.job_id) if r.time >= self.report.fault_time - 0.5]
            if self.opt_in:
                m = re.search(r"\brestarts=(\d+)", job.comment)
                seen = bool(m) and int(m.group(1)) > self.baseline_restarts
            else:
                seen = "autoheal: requeued" in job.comment
            if seen and recs:
                return Evidence(f"job comment: {job.comment!r}; {len(recs)} journal records for the job")
            return Waiting(f"job comment {job.comment!r}; {len(recs)} journal records for the job since the fault")
        return probe

    def _saved_probe(self) -> Probe:
        def check(m):
            self.saved_step = int(m.group(1))
            if m.group(2) == "none":
                raise Contradiction("the trainer stopped without saving a checkpoint")
        return self._trainer_probe(r"preempted step=(\d+) state=\S+ checkpoint=(\S+)", check=check)

    def _kube_probes(self, node: str) -> List[Phase]:
        """Phases read from the Kubernetes API (the lab's real kube-apiserver, through the real client)."""
        kube = self.kube_view or _KubeView(self.lab)
        self.kube_view = kube
        order = ("quarantined", "draining", "drained", "replacing", "done")

        def reached(state: str) -> Probe:
            def probe():
                cur = kube.remediation_state(node)
                if cur == "failed":
                    raise Contradiction(f"remediation failed: {kube.annotation(node, 'remediation-reason')}")
                if cur in order and order.index(cur) >= order.index(state):
                    return Evidence(f"Node {node} remediation-state={cur}")  # an annotation: no time of its own
                return Waiting(f"Node {node} remediation-state={cur or '(none)'}")
            return probe

        def unhealthy_and_cordoned():
            n = kube.node(node)
            if n is None:
                return Waiting(f"no Node {node}")
            cond = next((c for c in (n.get("status") or {}).get("conditions") or []
                         if c.get("type") == "GPUHealthy"), None)
            if cond and cond.get("status") == "False" and (n.get("spec") or {}).get("unschedulable"):
                # when: the sync's journal record of the cordon, which comes after the condition; the
                # condition's own lastTransitionTime is not this phase's time (the cordon may follow it by
                # seconds: 0.9 s vs 8.8 s in a lab run), so without the record the poll's time it is
                cordon = self._journal_record(("remediation",), node=node, match="cordoned")
                return _stamp(f"GPUHealthy=False ({cond.get('reason')}), Node cordoned", journal_time(cordon))
            return Waiting(f"Node {node}: GPUHealthy={(cond or {}).get('status', '-')}, "
                           f"unschedulable={bool((n.get('spec') or {}).get('unschedulable'))}")

        def replacement_requested():
            crs = kube.replacements()
            req = find_request(crs, kube.node(node), node, self.report.fault_time, kube.prefix)
            if req is None:
                return Waiting(f"no replacement request for {node} since the fault")
            self.request = req
            cr = next((c for c in crs if c["metadata"].get("name") == req["name"]), None)
            created = kube_time((cr or {}).get("metadata", {}).get("creationTimestamp")) \
                if req["kind"] == "NodeReplacement" else None
            # when: the sync's journal record of the request (sub-second), else the object's creation time
            when = pick([journal_time(self._journal_record(("remediation",), node=node,
                                                           match="replacement requested")), created])
            return _stamp(f"{req['kind']} {req['name']} for {node}" + (
                f" (names {req['spare']})" if req["spare"] else ""), when)

        def spare_in_service():
            if self.request is None:
                return Waiting(f"waiting for {node}'s replacement request first")
            req = find_request(kube.replacements(), kube.node(node), node, self.report.fault_time, kube.prefix) \
                or self.request  # the old Node (and its annotation) may be gone once the remediation is done
            if req["spare"]:
                self.request = req
            spare = self.request["spare"]
            if not spare:
                return Waiting(f"{self.request['kind']} {self.request['name']} names no replacement yet")
            if spare not in self.lay.all_nodes:
                raise Contradiction(f"{self.request['kind']} {self.request['name']} names {spare}, not a lab node")
            verdict = judge_spare(spare, self.slurm.get_node(spare), kube.node(spare) is not None)
            if not verdict:
                return verdict
            old = self.slurm.get_node(node)
            return Evidence(f"{verdict}; named by {self.request['kind']} {self.request['name']}; {node}: {old.reason}")

        return [
            Phase("Kubernetes: GPUHealthy=False condition and cordon", "kubernetes", unhealthy_and_cordoned),
            Phase("opt-out label checked (no pod opted out)", "kubernetes", reached("draining")),
            Phase("pods evicted (node drained in Kubernetes)", "kubernetes", reached("drained")),
            Phase("replacement requested", "kubernetes", replacement_requested),
            Phase("spare node in service", "slurm + kubernetes", spare_in_service),
        ]

    # ---- the run -----------------------------------------------------------------------------------
    def _job_side_phases(self, node: str, drained: Phase) -> List[Phase]:
        """What the job sees of the fault: with the fault reaching it, the broken rank's GPU call fails and
        nothing can be saved after it; the kind trainer (the submitit drill's) saves on the signal."""
        if self.fault_reaches_job:
            failed = Phase("the broken rank's GPU call failed", "trainer output",
                           self._trainer_probe(r"device error step=(\d+) error=(\S+)"))
            if not self.opt_in:
                why = "the job did not opt in (plain sbatch): Slurm's requeue sends SIGTERM, no checkpoint"
                return [failed, Phase("grace signal sent to the job", "journal", skipped=why),
                        Phase("checkpoint saved after the signal", "trainer output", skipped=why)]
            why = ("the fault reaches the job: the broken rank cannot save, its peer is blocked in the collective "
                   "with the signal held pending; it resumes from the last save before the fault")
            return [failed,
                    Phase("grace signal sent to the job", "journal",
                          self._journal_probe(("signal",), job=self.report.job_id), follows=drained),
                    Phase("checkpoint saved after the signal", "trainer output", skipped=why)]
        if self.opt_in:
            signal = Phase("grace signal delivered to the trainer", "trainer output",
                           self._trainer_probe(r"signal received (\S+) at step=(\d+)"), follows=drained)
            return [signal, Phase("checkpoint saved after the signal", "trainer output", self._saved_probe(),
                                  follows=signal)]
        why = "the job did not opt in (plain sbatch): Slurm's requeue sends SIGTERM, no checkpoint"
        return [Phase("grace signal delivered to the trainer", "trainer output", skipped=why),
                Phase("checkpoint saved after the signal", "trainer output", skipped=why)]

    def phases_for(self, node: str) -> List[Phase]:
        detected = Phase("detected (XID 79 seen on the node)", "journal",
                         self._journal_probe(("detection",), node=node))
        drained = Phase("drained in Slurm with an autoheal reason", "slurm + journal", self._drained_probe(node),
                        follows=detected)
        phases = [detected, drained, *self._job_side_phases(node, drained)]
        if self.hot_spare:
            return phases + self._hot_spare_phases(node, drained)
        requeued = Phase("job requeued", "slurm + journal", self._requeued_probe(), after=drained)
        phases.append(requeued)
        if self.kube:
            kube_phases = self._kube_probes(node)
            for earlier, later in zip([drained] + kube_phases, kube_phases):
                later.after = earlier  # the remediation steps come in this order
            phases += kube_phases
        else:
            for name in ("Kubernetes: GPUHealthy=False condition and cordon", "opt-out label checked",
                         "pods evicted", "replacement requested", "spare node in service"):
                phases.append(Phase(name, "kubernetes", skipped=self.kube_skip))
        running = Phase("job running again, away from the bad node", "slurm", self._running_again_probe(node),
                        after=requeued)
        restarted = Phase("trainer restarted at the right step", "trainer output", self._restart_start_probe(),
                          follows=running)
        phases += [
            running,
            restarted,
            Phase("training progressing past it", "trainer output", self._progress_probe(), follows=restarted),
            Phase("user-visible record (job comment, autoheal events)", "slurm + journal", self._record_probe(),
                  after=requeued),
        ]
        return phases

    def _hot_spare_phases(self, node: str, drained: Phase) -> List[Phase]:
        """After the checkpoint: the node leaves the allocation (no requeue), a new step runs on the
        survivors and the spare, resuming from the checkpoint."""
        released = Phase("bad node released from the allocation (no requeue)", "slurm",
                         self._released_probe(node), after=drained)
        phases = [released]
        if self.kube:
            kube_phases = self._kube_probes(node)
            for earlier, later in zip([drained] + kube_phases, kube_phases):
                later.after = earlier
            phases += kube_phases
        else:
            for name in ("Kubernetes: GPUHealthy=False condition and cordon", "opt-out label checked",
                         "pods evicted", "replacement requested", "spare node in service"):
                phases.append(Phase(name, "kubernetes", skipped=self.kube_skip))
        restarted = Phase("trainer restarted at the right step", "trainer output", self._swap_start_probe(),
                          follows=released)
        phases += [
            Phase("step restarted on the spare", "trainer output", self._swap_start_probe(on_spare=True),
                  follows=released),
            restarted,
            Phase("training progressing past it", "trainer output", self._progress_probe(), follows=restarted),
            Phase("user-visible record (job comment, autoheal events)", "slurm + journal",
                  self._swap_record_probe(node), after=released),
        ]
        return phases

    def _released_probe(self, bad: str) -> Probe:
        def probe():
            job = self.slurm.get_job(self.report.job_id)
            if job.restart_count > self.baseline_restarts:
                raise Contradiction(f"job {job.job_id} was requeued (restart {job.restart_count}) instead of "
                                    f"swapping {bad} for the spare")
            if job.state in ENDED:
                raise Contradiction(f"job {job.job_id} ended {job.state}")
            if job.running and bad not in job.nodes:
                n = self.slurm.get_node(bad)
                # when: the runner's journal record of the swap (it writes it once the node is released)
                return _stamp(f"job {job.job_id} RUNNING on {','.join(job.nodes)} (restart {job.restart_count}); "
                              f"{bad} {n.state_text}",
                              journal_time(self._journal_record(("job-hot-swap",), job=self.report.job_id)))
            return Waiting(f"job {job.job_id} {job.state} on {','.join(job.nodes)}")
        return probe

    def _swap_start_probe(self, on_spare: bool = False) -> Probe:
        rx = r"start step=(\d+) resumed_from=(\S+) restart=\d+ host=(\S+) rank=(\d+) .*reason=hot-spare-swap"

        def probe():
            hit = self.tail.find(rx, after=self.report.fault_time)
            start = 0
            while hit is not None:
                t, line, m = hit
                if (m.group(3) == self.spare) if on_spare else m.group(4) == "0":
                    break
                start = self.tail.index_of(t, line) + 1
                hit = self.tail.find(rx, after=self.report.fault_time, start=start)
            if hit is None:
                return None
            t, line, m = hit
            step = int(m.group(1))
            if self.saved_step is not None and step != self.saved_step:
                raise Contradiction(f"resumed from step {step}, but the checkpoint saved after the signal was "
                                    f"step {self.saved_step}")
            if on_spare:
                return trainer_evidence(f"rank {m.group(4)} started on the spare {m.group(3)} at step {step}", line)
            idx = self.tail.index_of(t, line)
            self.first_restart_line = self.first_restart_line or idx
            self.resumed_step = step
            return trainer_evidence(f"resumed from step {step} ({m.group(2)})", line)
        return probe

    def _swap_record_probe(self, bad: str) -> Probe:
        def probe():
            job = self.slurm.get_job(self.report.job_id)
            recs = [r for r in self.journal.read(job=self.report.job_id)
                    if r.time >= self.report.fault_time - 0.5 and r.event == "job-hot-swap"]
            if recs and re.search(r"\bswaps=1\b", job.comment):
                return Evidence(f"job comment: {job.comment!r}; journal: {recs[0].message}")
            return Waiting(f"job comment {job.comment!r}; {len(recs)} job-hot-swap journal records")
        return probe

    def run(self) -> DrillReport:
        self.submit()
        try:
            node = self.wait_first_checkpoint()
            self.report.node = node
            before = self.tail.find(r"checkpoint saved step=(\d+)")
            if before:
                self.report.notes.append(f"last checkpoint before the fault: step {before[2].group(1)}")
            fault = inject(self.lab, node, self.gpu, "xid", xid=79)
            self.report.fault_time = fault["time"]
            self.report.phases.append(Phase(f"XID 79 injected on GPU {self.gpu} of {node}", "lab inject",
                                            at=fault["time"], detail=fault["kernel_log"] or ""))
            if self.hot_spare:
                self.report.notes.append(f"hot spare: steps on 2 of the job's 3 nodes, idle spare {self.spare}")
            self.report.phases[0].evidence = Evidence("", fault["time"], Clock.INJECT)
            self.report.phases[0].polled_at = fault["time"]
            pending = self.phases_for(node)
            self.report.phases.extend(pending)
            self._watch(pending)
            restamp(self.report.phases, self.report.fault_time)
            self._measure_lost_steps()
        finally:
            self._collect_logs()
            subprocess.run(["scancel", self.report.job_id], env=self.env, capture_output=True, timeout=30)
        return self.report

    def _measure_lost_steps(self) -> None:
        """Lost steps from the trainers' own output: the newest step completed before the restart minus
        the step resumed from (None when no restart was seen)."""
        from autoheal_lab.lostwork import resumes

        self.tail.poll()
        found = resumes("\n".join(line for _, line in self.tail.lines))
        if found and found[0].resumed:
            r = found[0]
            self.report.lost_steps = r.lost
            self.report.notes.append(f"lost steps (trainer output): newest step before the restart "
                                     f"{max(r.before.values())}, resumed from step {min(r.resumed.values())}")

    def _watch(self, phases: List[Phase]) -> None:
        watch(phases, self.phase_timeout, before_tick=self.tail.poll)

    def _collect_logs(self) -> None:
        """Tails of the logs that explain a missing phase."""
        if all(p.ok for p in self.report.phases):
            return
        node = self.report.node
        names = [f"xid-watch-{node}.log", "slurmctld.log", f"slurmd-{node}.log", "sync.log", "spare-pool.log"]
        for name in names:
            path = self.lay.path("log", name)
            if path.exists():
                self.report.logs[name] = path.read_text(errors="replace").splitlines()[-15:]
        out = self.workdir / "job.out"
        if out.exists():
            self.report.logs["job.out"] = out.read_text(errors="replace").splitlines()[-20:]


class Contradiction(Exception):
    """Evidence that a phase happened *wrongly* (e.g. resumed from the wrong step)."""



def _stamp(verdict: Union[str, Waiting], when: Optional[Evidence] = None) -> Union[Evidence, Waiting]:
    """A judge's verdict as a probe result: a detail string is evidence, timed by ``when`` (the source's
    own time for it) or else by the poll that saw it."""
    if isinstance(verdict, Waiting):
        return verdict
    return Evidence(verdict, when.time, when.clock) if when is not None else Evidence(verdict)


def _untimed(text: str) -> str:
    return TRAINER_TIME_RX.sub("", text)


def kube_time(ts: Optional[str]) -> Optional[Evidence]:
    """A Kubernetes object's time (RFC 3339, whole seconds) as timing evidence; None when absent."""
    created = _created({"metadata": {"creationTimestamp": ts}}) if ts else None
    return Evidence("", created, Clock.KUBE) if created is not None else None


def trainer_evidence(detail: str, line: str) -> Evidence:
    """A trainer line as evidence: timed by the trainer's own ``time=`` (--timestamps, --event-times)
    when the line has one."""
    m = TRAINER_TIME_RX.search(line)
    return Evidence(detail, float(m.group(1)), Clock.TRAINER) if m else Evidence(detail)


def slurm_time(epoch: Optional[int]) -> Optional[Evidence]:
    """A Slurm event time (whole seconds) as timing evidence; None when Slurm gave none."""
    return Evidence("", float(epoch), Clock.SLURM) if epoch else None


def journal_time(rec) -> Optional[Evidence]:
    return Evidence("", float(rec.time), Clock.JOURNAL) if rec is not None and rec.time else None


# ---- judges: pure decisions on recorded evidence (unit-tested without a lab) ---------------------------
def judge_requeued(job, baseline: int) -> Union[str, Waiting]:
    """This job was requeued after the fault: its restart count went above ``baseline`` (the count when
    the fault was injected; an older requeue does not count)."""
    if job.restart_count > baseline:
        return f"job {job.job_id} {job.state}, restart {job.restart_count}"
    return Waiting(f"job {job.job_id} {job.state}, restart {job.restart_count} (was {baseline} at the fault)")


def judge_running_again(job, baseline: int, bad: str) -> Union[str, Waiting]:
    """This job runs again after this requeue (restart count above ``baseline``), away from ``bad``.
    Raises Contradiction when it runs on ``bad`` or has ended (a drill job never finishes by itself)."""
    again = job.restart_count > baseline
    if again and job.running:
        if bad in job.nodes:
            raise Contradiction(f"job runs again on the drained node {bad}")
        return f"job {job.job_id} RUNNING on {','.join(job.nodes)} (restart {job.restart_count})"
    if job.state in ENDED:
        raise Contradiction(f"job {job.job_id} ended {job.state} (restart {job.restart_count}) instead of "
                            f"running again")
    why = f" ({job.state_reason})" if job.state_reason and job.state_reason != "None" else ""
    return Waiting(f"job {job.job_id} {job.state}{why}, restart {job.restart_count} (was {baseline} at the fault)"
                   + (f" on {','.join(job.nodes)}" if job.nodes else ""))


def _created(obj: Optional[dict]) -> Optional[float]:
    from datetime import datetime

    ts = ((obj or {}).get("metadata") or {}).get("creationTimestamp")
    if not ts:
        return None
    try:
        return datetime.fromisoformat(str(ts).replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def find_request(crs: List[dict], old_node: Optional[dict], node: str, since: float,
                 prefix: str = "autoheal.io") -> Optional[Dict[str, str]]:
    """This node's replacement request made for this fault: a NodeReplacement whose spec.nodeName is
    ``node`` created at or after ``since`` (1 s of slack: creationTimestamp has whole seconds), or else
    (label and webhook actions) the ``<prefix>/replacement-node`` annotation on the old Node. Returns
    {kind, name, spare} (spare "" until the provider names one), or None."""
    for cr in crs:
        spec = cr.get("spec") or {}
        if (spec.get("nodeName") or cr["metadata"].get("name")) != node:
            continue
        created = _created(cr)
        if created is not None and created < since - 1.0:
            continue  # an older request (a lab kept with --keep-state): not this fault's
        status = cr.get("status") or {}
        return {"kind": "NodeReplacement", "name": cr["metadata"]["name"],
                "spare": status.get("replacementSlurmNode") or status.get("replacementNode") or ""}
    ann = ((old_node or {}).get("metadata") or {}).get("annotations") or {}
    spare = ann.get(f"{prefix}/replacement-node", "")
    if spare:
        return {"kind": "Node annotation", "name": f"{node} {prefix}/replacement-node", "spare": spare}
    return None


def judge_spare(spare: str, snode, has_kube_node: bool) -> Union[str, Waiting]:
    """The named spare is in service: not drained, responding, idle or running jobs in Slurm, with a
    Kubernetes Node."""
    if snode.drain or not snode.responding or snode.state not in ("IDLE", "MIXED", "ALLOCATED"):
        return Waiting(f"{spare} {snode.state_text}" + (f": {snode.reason}" if snode.reason else ""))
    if not has_kube_node:
        return Waiting(f"{spare} {snode.state_text} in Slurm but no Kubernetes Node yet")
    return f"{spare} {snode.state_text} in Slurm with a Kubernetes Node"


def is_transient(exc: BaseException) -> bool:
    """A read failure worth another try next tick: slurmctld not answering, the API server restarting or
    refusing for a moment, a dropped connection. Anything else is a bug in the drill or the lab."""
    from autoheal.errors import SlurmUnavailable

    if isinstance(exc, (SlurmUnavailable, ConnectionError, TimeoutError)):
        return True
    try:
        from kubernetes.client.rest import ApiException
        from urllib3.exceptions import HTTPError as Urllib3Error
    except ImportError:
        return False
    if isinstance(exc, ApiException):
        return exc.status in (0, 429) or (exc.status or 0) >= 500
    return isinstance(exc, Urllib3Error)


def watch(phases: List[Phase], timeout: float, before_tick: Callable[[], None] = lambda: None,
          poll: float = POLL, clock: Callable[[], float] = time.monotonic,
          sleep: Callable[[float], None] = time.sleep) -> None:
    """Poll every open phase's probe until each is observed, contradicted or errored, or ``timeout``.

    A probe returning evidence stamps its phase; ``Waiting`` keeps it open with a note; Contradiction
    fails it; a transient read failure (``is_transient``) is retried, and is the phase's error if it is
    still failing at the deadline; any other exception is a drill error at once (never "missing")."""
    deadline = clock() + timeout
    open_phases = [p for p in phases if not p.skipped and p.at is None and not p.error]
    while open_phases and clock() < deadline:
        before_tick()
        for p in list(open_phases):
            if p.after is not None and p.after.at is None and not p.after.skipped:
                continue  # its cause has not been seen yet
            try:
                hit = p.probe() if p.probe else None
            except Contradiction as exc:
                p.at, p.failed = time.time(), str(exc)
                p.polled_at, p.clock = p.at, Clock.POLLED.value
                open_phases.remove(p)
                continue
            except Exception as exc:
                if is_transient(exc):
                    p.last_error = f"{type(exc).__name__}: {exc}"
                    continue
                p.error = f"probe raised {type(exc).__name__}: {exc}"
                open_phases.remove(p)
                continue
            p.last_error = ""
            if isinstance(hit, Waiting):
                p.detail = f"last seen: {hit.note}"
            elif hit:
                # at: provisional (the phases gated on this one need only know it was seen); restamp()
                # decides it from the evidence's own clock once every phase is in
                p.evidence, p.polled_at, p.detail = hit, time.time(), hit.detail
                p.at = p.polled_at
                open_phases.remove(p)
        sleep(poll)
    for p in open_phases:
        if p.last_error:
            p.error = f"probe kept failing until the deadline: {p.last_error}"


def restamp(phases: List[Phase], fault_time: float) -> None:
    """Each observed phase's time from its evidence's own clock (stamping.stamp_all): no earlier than the
    fault or the phase it follows; a phase with no evidence time keeps its poll time, marked polled."""
    index = {id(p): i for i, p in enumerate(phases)}
    obs = []
    for p in phases:
        cause = p.follows or p.after
        usable = p.evidence is not None and p.polled_at is not None and not p.failed
        obs.append(Observation(p.name, p.evidence if usable else None, p.polled_at if usable else None,
                               index.get(id(cause)) if cause is not None else None))
    for p, st in zip(phases, stamp_all(fault_time, obs)):
        if st is not None:
            p.at, p.clock, p.stamp_note, p.uncertainty = st.at, st.clock.value, st.note, st.uncertainty


class _KubeView:
    """Read-only view of the lab's Kubernetes API for the drill's probes."""

    def __init__(self, lab: Lab):
        from kubernetes import client, config

        from autoheal.config import load_config

        st = lab.load_state() or {}
        api = config.new_client_from_config(config_file=st["kubeconfig"])
        self.core = client.CoreV1Api(api)
        self.custom = client.CustomObjectsApi(api)
        self.prefix = load_config(lab.layout().autoheal_conf).sync.annotation_prefix

    def node(self, name: str) -> Optional[dict]:
        from kubernetes.client.rest import ApiException

        try:
            return self.core.api_client.sanitize_for_serialization(self.core.read_node(name))
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise

    def annotation(self, name: str, key: str) -> str:
        n = self.node(name) or {}
        return ((n.get("metadata") or {}).get("annotations") or {}).get(f"{self.prefix}/{key}", "")

    def remediation_state(self, name: str) -> str:
        return self.annotation(name, "remediation-state")

    def replacements(self) -> List[dict]:
        """NodeReplacements in every namespace (a read failure raises: the probe decides what it means)."""
        return self.custom.list_cluster_custom_object("autoheal.io", "v1alpha1", "nodereplacements")["items"]


def render_timeline(report: DrillReport) -> str:
    """The human timeline: phase, time since fault, source of the evidence, then totals."""
    data = report.to_dict()
    lines = [f"{'t+ (s)':>9}  {'phase':<55} {'clock':<22} detail"]
    for p in data["phases"]:
        if p["status"] in ("skipped", "error"):
            t = p["status"].upper() if p["status"] == "error" else (
                "not run" if (p.get("why") or "").startswith("not run") else "skipped")
        elif p["seconds_after_fault"] is None:
            t = "MISSING"
        else:
            t = f"{p['seconds_after_fault']:.2f}"
        detail = p.get("why") if p["status"] in ("skipped", "failed", "error") else p["detail"]
        flag = {"failed": "FAILED: ", "error": "DRILL ERROR: "}.get(p["status"], "")
        clock = p.get("clock") or p["source"]
        if p.get("uncertainty_s"):
            t = f"{t}±{p['uncertainty_s']:.1f}"
        lines.append(f"{t:>9}  {p['phase']:<55} {clock:<22} {flag}{detail}"
                     + (f" [{p['stamp_note']}]" if p.get("stamp_note") not in ("", None, POLLED_NOTE) else ""))
    tot = data["totals"]

    def fmt(v):
        return "n/a" if v is None else f"{v:.1f} s"

    lines.append("")
    lines.append(f"fault -> drain: {fmt(tot['fault_to_drain_s'])}   fault -> job running again: "
                 f"{fmt(tot['fault_to_job_running_again_s'])}   fault -> replacement in service: "
                 f"{fmt(tot['fault_to_replacement_in_service_s'])}")
    lost = "n/a" if data.get("lost_steps") is None else str(data["lost_steps"])
    lines.append(f"fault -> grace signal: {fmt(tot['fault_to_grace_signal_s'])}   fault -> requeued: "
                 f"{fmt(tot['fault_to_requeued_s'])}" + ("   (hot spare: no requeue)" if data.get("hot_spare") else ""))
    lines.append(f"fault -> training resumed (trainer output): {fmt(tot['fault_to_trainer_resumed_s'])}   "
                 f"lost steps: {lost} (trainer output)"
                 + ("" if data.get("fault_reaches_job", True) else "   (kind trainer: the fault never reached it)"))
    lines.append("clocks: each phase from its evidence's own time (journal, trainer clock, Slurm's and Kubernetes' "
                 "whole-second event times, ± what is left open); 'polled': no time of its own, when the poll saw it")
    for note in data["notes"]:
        lines.append(f"note: {note}")
    if data["ok"]:
        lines.append("drill PASSED: every phase observed")
    elif data["errors"]:
        lines.append(f"drill ERROR: {len(data['errors'])} probe(s) raised, so the drill could not tell whether "
                     f"those phases happened (exit {EXIT_DRILL_ERROR}): " + "; ".join(data["errors"]))
    else:
        lines.append("drill FAILED: see the phases above")
    for name, tail in data["logs"].items():
        lines.append(f"--- {name} (last lines) ---")
        lines.extend(tail)
    return "\n".join(lines)


def plot_timeline(report: DrillReport, path: str) -> None:
    """Draw the timeline as a PNG (needs matplotlib: pip install 'slurm-autoheal[plot]')."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise LabError("--plot needs matplotlib: pip install 'slurm-autoheal[plot]'") from None
    data = report.to_dict()
    rows = [p for p in data["phases"] if p["seconds_after_fault"] is not None]
    fig, ax = plt.subplots(figsize=(10, 0.4 * len(rows) + 1.5))
    ys = list(range(len(rows)))[::-1]
    ax.scatter([p["seconds_after_fault"] for p in rows], ys, color=["tab:red" if p["status"] == "failed"
                                                                     else "tab:blue" for p in rows])
    ax.set_yticks(ys)
    ax.set_yticklabels([f"{p['phase']}  [{p['source']}]" for p in rows], fontsize=8)
    ax.set_xlabel("seconds after the fault")
    ax.set_title(f"autoheal drill: XID 79 on {data['node']}, job {data['job_id']}")
    ax.grid(axis="x", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
