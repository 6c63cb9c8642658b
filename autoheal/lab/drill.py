"""``autoheal lab drill``: the whole self-healing loop on the lab, timed from the evidence.

A 2-node trainer runs under ``autoheal sbatch``; XID 79 is injected on one GPU of one of its nodes;
the drill then watches Slurm, the journal, the trainer's own output and (with ``kube``) the Kubernetes
API, and stamps each phase when its evidence appears — never from what it expects. A phase that never
comes is reported missing after a bounded wait, with the log lines that explain why.
"""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Dict, List, Optional, Tuple

from autoheal.journal import Journal
from autoheal.lab.cluster import Lab, LabError
from autoheal.lab.gpus import inject
from autoheal.reasons import is_ours

POLL = 0.1
TRAINER = "autoheal-trainer: "
Probe = Callable[[], Optional[Tuple[float, str]]]


@dataclass
class Phase:
    """One step of the loop: observed at ``at`` (epoch seconds) from ``source``, or missing/skipped."""

    name: str
    source: str
    probe: Optional[Probe] = None
    at: Optional[float] = None
    detail: str = ""
    skipped: str = ""  # why this phase does not apply to this drill
    failed: str = ""  # observed, but the evidence contradicts the mission (e.g. resumed from the wrong step)

    @property
    def ok(self) -> bool:
        return bool(self.skipped) or (self.at is not None and not self.failed)


@dataclass
class DrillReport:
    """The timeline and totals of one drill."""

    fault_time: float = 0.0
    node: str = ""
    job_id: str = ""
    opt_in: bool = True
    kube: bool = True
    slurm_defaults: bool = False
    phases: List[Phase] = field(default_factory=list)
    notes: List[str] = field(default_factory=list)
    logs: Dict[str, List[str]] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return bool(self.phases) and all(p.ok for p in self.phases)

    def since_fault(self, name_prefix: str) -> Optional[float]:
        for p in self.phases:
            if p.name.startswith(name_prefix) and p.at is not None:
                return round(p.at - self.fault_time, 3)
        return None

    def totals(self) -> Dict[str, Optional[float]]:
        return {"fault_to_drain_s": self.since_fault("drained"),
                "fault_to_job_running_again_s": self.since_fault("job running again"),
                "fault_to_replacement_in_service_s": self.since_fault("spare node in service")}

    def to_dict(self) -> dict:
        return {
            "ok": self.ok, "node": self.node, "job_id": self.job_id, "opt_in": self.opt_in, "kube": self.kube,
            "slurm_defaults": self.slurm_defaults, "fault_time": self.fault_time, "totals": self.totals(),
            "notes": self.notes, "logs": self.logs,
            "phases": [{"phase": p.name, "source": p.source, "detail": p.detail,
                        "seconds_after_fault": None if p.at is None else round(p.at - self.fault_time, 3),
                        "status": ("skipped" if p.skipped else "failed" if p.failed else
                                   "observed" if p.at is not None else "missing"),
                        **({"why": p.skipped or p.failed} if (p.skipped or p.failed) else {})}
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
            with open(self.path, "r", encoding="utf-8", errors="replace") as fh:
                fh.seek(self.offset)
                data = fh.read()
                self.offset = fh.tell()
        except FileNotFoundError:
            return
        now = time.time()
        data = self._partial + data
        *complete, self._partial = data.split("\n")
        self.lines.extend((now, ln) for ln in complete if ln.strip())

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

    def __init__(self, lab: Lab, opt_in: bool = True, kube: bool = True, gpu: int = 3,
                 phase_timeout: float = 240.0, step_seconds: float = 0.1):
        from autoheal.slurm.cli_backend import CliSlurm

        self.lab = lab
        self.lay = lab.layout()
        self.env = lab.slurm_env()
        self.slurm = CliSlurm(env=self.env, timeout=10)
        self.journal = Journal(self.lay.path("journal", "journal.jsonl"))
        self.opt_in = opt_in
        self.kube = kube and bool((lab.load_state() or {}).get("kubeconfig"))
        self.gpu = gpu
        self.phase_timeout = phase_timeout
        self.step_seconds = step_seconds
        self.workdir = self.lay.path("drill", time.strftime("%Y%m%d-%H%M%S"))
        self.report = DrillReport(opt_in=opt_in, kube=self.kube,
                                  slurm_defaults=bool((lab.load_state() or {}).get("slurm_defaults")))
        self.tail: Optional[OutputTail] = None
        self.saved_step: Optional[int] = None
        self.resumed_step: Optional[int] = None
        self.first_restart_line = 0

    # ---- submission --------------------------------------------------------------------------------
    def _script(self) -> Path:
        import autoheal.sbatch_helpers as helpers  # the example trainers ship as package data

        trainer = Path(helpers.__file__).parent / "examples" / "tiny_trainer.py"
        ckpt = ["--checkpoint-every", "10"] if self.opt_in else []
        cmd = " ".join(shlex.quote(a) for a in [sys.executable, str(trainer), "--steps", "100000",
                                                "--step-seconds", str(self.step_seconds), *ckpt])
        script = self.workdir / "train.sh"
        script.write_text("\n".join([
            "#!/bin/bash",
            "#SBATCH --job-name=drill-trainer",
            "#SBATCH --nodes=2",
            "#SBATCH --ntasks-per-node=1",
            f"#SBATCH --output={self.workdir}/job.out",
            f"#SBATCH --exclude={','.join(self.lay.spares)}" if self.lay.spares else "",
            f"srun {cmd}",
            "",
        ]))
        return script

    def submit(self) -> str:
        self.workdir.mkdir(parents=True, exist_ok=True)
        script = self._script()
        if self.opt_in:
            argv = [sys.executable, "-m", "autoheal.cli.main", "sbatch", "--parsable",
                    "--checkpoint-dir", str(self.workdir / "ckpt"), str(script)]
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
            if job.running and ready and len(job.nodes) == 2:
                # break a node other than the batch host: the batch shell (and the runner) survive, so the
                # hand-off between xid-watch and the runner is exercised, not just a dead job
                others = [n for n in job.nodes if n != job.batch_host]
                return others[0] if others else job.nodes[0]
            time.sleep(POLL)
        raise LabError(f"drill job {self.report.job_id} did not start and checkpoint within {timeout:.0f}s; "
                       f"see {self.workdir}/job.out")

    # ---- probes ------------------------------------------------------------------------------------
    def _journal_probe(self, events: Tuple[str, ...], node: Optional[str] = None, job: Optional[str] = None,
                       match: str = "") -> Probe:
        def probe():
            for rec in self.journal.read(node=node, job=job, since=self.report.fault_time - 0.5):
                if rec.event in events and (not match or match in (rec.message + rec.action + rec.outcome)):
                    return rec.time, f"{rec.event}: {rec.message or rec.outcome}"
            return None
        return probe

    def _drained_probe(self, node: str) -> Probe:
        def probe():
            n = self.slurm.get_node(node)
            if n.drain and is_ours(n.reason):
                return time.time(), f"{node} {n.state_text}: {n.reason}"
            return None
        return probe

    def _trainer_probe(self, pattern: str, after_restart: bool = False, check=None) -> Probe:
        def probe():
            start = self.first_restart_line if after_restart else 0
            if after_restart and not self.first_restart_line:
                return None
            hit = self.tail.find(pattern, after=self.report.fault_time, start=start)
            if not hit:
                return None
            t, line, m = hit
            if check:
                check(m)
            return t, line.split(TRAINER, 1)[-1]
        return probe

    def _requeued_probe(self) -> Probe:
        def probe():
            job = self.slurm.get_job(self.report.job_id)
            if job.restart_count >= 1:
                return time.time(), f"job {job.job_id} {job.state}, restart {job.restart_count}"
            return None
        return probe

    def _running_again_probe(self, bad: str) -> Probe:
        def probe():
            job = self.slurm.get_job(self.report.job_id)
            if job.running and job.restart_count >= 1:
                if bad in job.nodes:
                    raise _Contradiction(f"job runs again on the drained node {bad}")
                return time.time(), f"job {job.job_id} RUNNING on {','.join(job.nodes)} (restart {job.restart_count})"
            return None
        return probe

    def _restart_start_probe(self) -> Probe:
        def probe():
            hit = self.tail.find(r"start step=(\d+) resumed_from=(\S+) restart=([1-9]\d*) .*rank=0",
                                 after=self.report.fault_time)
            if not hit:
                return None
            t, line, m = hit
            self.first_restart_line = next(i for i, (tt, ln) in enumerate(self.tail.lines) if ln == line and tt == t)
            self.resumed_step = int(m.group(1))
            if self.opt_in:
                if self.saved_step is not None and self.resumed_step != self.saved_step:
                    raise _Contradiction(f"resumed from step {self.resumed_step}, but the last checkpoint saved "
                                         f"before the fault was step {self.saved_step}")
                detail = f"resumed from step {self.resumed_step} ({m.group(2)})"
            else:
                if self.resumed_step != 0:
                    raise _Contradiction(f"a job that did not opt in resumed from step {self.resumed_step}")
                detail = "restarted from step 0: the job did not opt in, so no checkpoint-resume"
            return t, detail
        return probe

    def _progress_probe(self) -> Probe:
        def probe():
            if self.resumed_step is None or not self.first_restart_line:
                return None
            rx = re.compile(r"(?:^|\s)step=(\d+)$")
            for t, line in self.tail.lines[self.first_restart_line:]:
                m = rx.search(line.strip())
                if m and int(m.group(1)) >= self.resumed_step + 5:
                    return t, f"training reached step {m.group(1)}"
            return None
        return probe

    def _record_probe(self) -> Probe:
        def probe():
            job = self.slurm.get_job(self.report.job_id)
            recs = [r for r in self.journal.read(job=self.report.job_id) if r.time >= self.report.fault_time - 0.5]
            marker = "restarts=" if self.opt_in else "autoheal: requeued"
            if marker in job.comment and recs:
                return time.time(), f"job comment: {job.comment!r}; {len(recs)} journal records for the job"
            return None
        return probe

    def _saved_probe(self) -> Probe:
        def check(m):
            self.saved_step = int(m.group(1))
            if m.group(2) == "none":
                raise _Contradiction("the trainer stopped without saving a checkpoint")
        return self._trainer_probe(r"preempted step=(\d+) state=\S+ checkpoint=(\S+)", check=check)

    def _kube_probes(self, node: str) -> List[Phase]:
        """Phases read from the Kubernetes API (the lab's fake API through the real client)."""
        kube = _KubeView(self.lab)
        order = ("quarantined", "draining", "drained", "replacing", "done")

        def reached(state: str) -> Probe:
            def probe():
                cur = kube.remediation_state(node)
                if cur == "failed":
                    raise _Contradiction(f"remediation failed: {kube.annotation(node, 'remediation-reason')}")
                if cur in order and order.index(cur) >= order.index(state):
                    return time.time(), f"Node {node} remediation-state={cur}"
                return None
            return probe

        def unhealthy_and_cordoned():
            n = kube.node(node)
            if n is None:
                return None
            cond = next((c for c in (n.get("status") or {}).get("conditions") or []
                         if c.get("type") == "GPUHealthy"), None)
            if cond and cond.get("status") == "False" and (n.get("spec") or {}).get("unschedulable"):
                return time.time(), f"GPUHealthy=False ({cond.get('reason')}), Node cordoned"
            return None

        def replacement_requested():
            crs = kube.replacements()
            mine = [c for c in crs if node in str(c.get("spec", {}))]
            if mine:
                return time.time(), f"NodeReplacement {mine[0]['metadata']['name']} created"
            return reached("replacing")()

        def spare_in_service():
            for spare in self.lay.spares:
                n = self.slurm.get_node(spare)
                if not n.drain and n.responding and n.state in ("IDLE", "MIXED", "ALLOCATED") and kube.node(spare):
                    old = self.slurm.get_node(node)
                    return time.time(), f"{spare} {n.state_text} in Slurm with a Kubernetes Node; {node}: {old.reason}"
            return None

        return [
            Phase("Kubernetes: GPUHealthy=False condition and cordon", "kubernetes", unhealthy_and_cordoned),
            Phase("opt-out label checked (no pod opted out)", "kubernetes", reached("draining")),
            Phase("pods evicted (node drained in Kubernetes)", "kubernetes", reached("drained")),
            Phase("replacement requested", "kubernetes", replacement_requested),
            Phase("spare node in service", "slurm + kubernetes", spare_in_service),
        ]

    # ---- the run -----------------------------------------------------------------------------------
    def phases_for(self, node: str) -> List[Phase]:
        phases = [
            Phase("detected (XID 79 seen on the node)", "journal",
                  self._journal_probe(("detection",), node=node)),
            Phase("drained in Slurm with an autoheal reason", "slurm", self._drained_probe(node)),
        ]
        if self.opt_in:
            phases += [
                Phase("grace signal delivered to the trainer", "trainer output",
                      self._trainer_probe(r"signal received (\S+) at step=(\d+)")),
                Phase("checkpoint saved after the signal", "trainer output", self._saved_probe()),
            ]
        else:
            why = "the job did not opt in (plain sbatch): Slurm's requeue sends SIGTERM, no checkpoint"
            phases += [Phase("grace signal delivered to the trainer", "trainer output", skipped=why),
                       Phase("checkpoint saved after the signal", "trainer output", skipped=why)]
        phases.append(Phase("job requeued", "slurm", self._requeued_probe()))
        if self.kube:
            phases += self._kube_probes(node)
        else:
            for name in ("Kubernetes: GPUHealthy=False condition and cordon", "opt-out label checked",
                         "pods evicted", "replacement requested", "spare node in service"):
                phases.append(Phase(name, "kubernetes", skipped="--no-kube"))
        phases += [
            Phase("job running again, away from the bad node", "slurm", self._running_again_probe(node)),
            Phase("trainer restarted at the right step", "trainer output", self._restart_start_probe()),
            Phase("training progressing past it", "trainer output", self._progress_probe()),
            Phase("user-visible record (job comment, autoheal events)", "slurm + journal", self._record_probe()),
        ]
        return phases

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
            self.report.phases.append(Phase(f"XID 79 injected on {node} gpu {self.gpu}", "lab inject",
                                            at=fault["time"], detail=fault["kernel_log"] or ""))
            pending = self.phases_for(node)
            self.report.phases.extend(pending)
            self._watch(pending)
        finally:
            self._collect_logs()
            subprocess.run(["scancel", self.report.job_id], env=self.env, capture_output=True, timeout=30)
        return self.report

    def _watch(self, phases: List[Phase]) -> None:
        deadline = time.monotonic() + self.phase_timeout
        open_phases = [p for p in phases if not p.skipped and p.at is None]
        while open_phases and time.monotonic() < deadline:
            self.tail.poll()
            for p in list(open_phases):
                try:
                    hit = p.probe() if p.probe else None
                except _Contradiction as exc:
                    p.at, p.failed = time.time(), str(exc)
                    open_phases.remove(p)
                    continue
                except Exception as exc:  # a transient read failure: try again next tick
                    p.detail = f"last probe error: {exc}"
                    continue
                if hit:
                    p.at, p.detail = hit
                    open_phases.remove(p)
            time.sleep(POLL)

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


class _Contradiction(Exception):
    """Evidence that a phase happened *wrongly* (e.g. resumed from the wrong step)."""


class _KubeView:
    """Read-only view of the lab's Kubernetes API for the drill's probes."""

    def __init__(self, lab: Lab):
        from kubernetes import client, config

        st = lab.load_state() or {}
        api = config.new_client_from_config(config_file=st["kubeconfig"])
        self.core = client.CoreV1Api(api)
        self.custom = client.CustomObjectsApi(api)

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
        return ((n.get("metadata") or {}).get("annotations") or {}).get(f"autoheal.io/{key}", "")

    def remediation_state(self, name: str) -> str:
        return self.annotation(name, "remediation-state")

    def replacements(self) -> List[dict]:
        from kubernetes.client.rest import ApiException

        try:
            return self.custom.list_cluster_custom_object("autoheal.io", "v1alpha1", "nodereplacements")["items"]
        except ApiException:
            return []


def render_timeline(report: DrillReport) -> str:
    """The human timeline: phase, time since fault, source of the evidence, then totals."""
    data = report.to_dict()
    lines = [f"{'t+ (s)':>9}  {'phase':<55} {'source':<16} detail"]
    for p in data["phases"]:
        if p["status"] == "skipped":
            t = "skipped"
        elif p["seconds_after_fault"] is None:
            t = "MISSING"
        else:
            t = f"{p['seconds_after_fault']:.2f}"
        detail = p.get("why") if p["status"] in ("skipped", "failed") else p["detail"]
        flag = "FAILED: " if p["status"] == "failed" else ""
        lines.append(f"{t:>9}  {p['phase']:<55} {p['source']:<16} {flag}{detail}")
    tot = data["totals"]

    def fmt(v):
        return "n/a" if v is None else f"{v:.1f} s"

    lines.append("")
    lines.append(f"fault -> drain: {fmt(tot['fault_to_drain_s'])}   fault -> job running again: "
                 f"{fmt(tot['fault_to_job_running_again_s'])}   fault -> replacement in service: "
                 f"{fmt(tot['fault_to_replacement_in_service_s'])}")
    for note in data["notes"]:
        lines.append(f"note: {note}")
    lines.append("drill " + ("PASSED: every phase observed" if data["ok"] else "FAILED: see the phases above"))
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
