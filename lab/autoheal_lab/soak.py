"""``autoheal lab soak``: a seeded campaign of compound faults against the whole loop, invariants live.

The runner starts a clean lab, submits a mixed workload (a hot-spare trainer, ``autoheal sbatch
--spare-nodes 1``; a submitit ``Checkpointable`` job through ``autoheal sbatch``; ``autoheal sbatch``
trainers on 2 nodes and on 1 node with different grace and restart limits, a job array under ``autoheal
sbatch``, a plain ``sbatch`` job, a job that runs into its time limit, short jobs that come and go), then
carries out the schedule of ``autoheal_lab.soak_plan`` (same seed, same schedule) while taking snapshots of
Slurm and Kubernetes, which ``autoheal_lab.soak_checks.Monitor`` checks as they come. After the last fault
it lets the loop settle (bounded), reads the journal and the trainers' outputs, stops the lab, looks for
processes left behind, and reports.

The remediation circuit breaker latches when most of the fleet is affected (a human must look): the
soak's on-call admin is paged when a snapshot shows it tripped, and after the schedule's delay for that
trip looks (``autoheal sync breaker``) and resets it (``autoheal sync breaker reset``), through the real
CLI, as a site's on-call would. When the lab's spare pool is empty, a technician repairs in place a node
waiting for its replacement (the fake GPUs healed, ``autoheal check --clear-faults``, ``autoheal node
resume``). The report counts trips, resets and repairs.

Fault targets are resolved when the fault fires: ``@replacement`` is the newest spare in service; a
node that left (retired, its slurmd stopped) is swapped for a node in service (``note`` says so), and
an admin's drain goes to a node in service (an admin drains working nodes for maintenance).
"""

from __future__ import annotations

import heapq
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Dict, List, Optional

from autoheal_lab.cluster import Lab, LabError
from autoheal_lab.soak_checks import (
    Injected,
    JobMeta,
    Monitor,
    Snapshot,
    Trip,
    comment_swaps,
    node_in_service,
    ours_kind,
)
from autoheal_lab.soak_plan import HOT_SPARE, KINDS, REPLACEMENT, Schedule, make_schedule

STEP_SECONDS = 0.1


@dataclass
class SoakOptions:
    seed: int = 1
    faults: int = 30
    jobs: int = 2  # autoheal sbatch trainers: the first on 2 nodes, the others on 1 (the hot-spare trainer
    # and the submitit job come on top)
    kube: bool = True
    nodes: int = 4
    spares: int = 2
    gpus: int = 4
    gap: tuple = (4.0, 10.0)
    include: Optional[List[str]] = None
    exclude: List[str] = field(default_factory=list)
    settle: float = 150.0  # seconds after the last fault for the loop to finish its work
    snapshot_every: float = 1.0
    trainer_seconds: Optional[float] = None  # uninterrupted run time of a trainer [default: 0.6 x the span]
    short_every: float = 8.0
    # hooks.lemon_faults of the soak's lab: the product's default, so bad repairs are judged (0: lemons off)
    lemon_faults: int = 3


@dataclass
class SoakReport:
    seed: int
    schedule: dict
    injected: List[dict] = field(default_factory=list)
    counts: Dict[str, dict] = field(default_factory=dict)
    recovery: Dict[str, dict] = field(default_factory=dict)
    restarts: Dict[str, int] = field(default_factory=dict)
    jobs: Dict[str, dict] = field(default_factory=dict)
    violations: List[dict] = field(default_factory=list)
    notes: List[str] = field(default_factory=list)
    wall_seconds: float = 0.0
    snapshots: int = 0
    timeline: List[dict] = field(default_factory=list)
    breaker: dict = field(default_factory=dict)  # trips, resets by the on-call, episodes
    per_fault: Dict[int, dict] = field(default_factory=dict)  # each fault's figures (Monitor.per_fault)

    @property
    def ok(self) -> bool:
        return not self.violations

    def to_dict(self, timeline: bool = False) -> dict:
        out = {k: getattr(self, k) for k in ("seed", "counts", "recovery", "restarts", "jobs", "violations",
                                               "notes", "wall_seconds", "snapshots", "injected", "schedule",
                                               "breaker", "per_fault")}
        out["ok"] = self.ok
        if timeline:
            out["timeline"] = self.timeline
        return out


class Soak:
    #: Seconds after an admin's resume or a user's release that they look again (``_admin_resume``).
    PEOPLE_LOOK_AGAIN = 30.0
    #: Seconds the soak goes on after a person's last action before it judges the end state: what the
    #: action set off must be visible (slurmd answering again after a repair, a bad repair's defect back
    #: and drained). Seed 48213: a technician's resume 14 ms before the final snapshot showed the node
    #: IDLE+NOT_RESPONDING and judged a lemon "not retired" that was drained again 1 s later.
    PEOPLE_SETTLE = 15.0

    def __init__(self, lab: Lab, opts: SoakOptions, log: Callable[[str], None] = lambda s: None):
        self.lab = lab
        self.opts = opts
        self.log = log
        self.schedule: Schedule = make_schedule(opts.seed, opts.faults, [f"gpu{i}" for i in range(1, opts.nodes + 1)],
                                                opts.gpus, kube=opts.kube, gap=opts.gap, include=opts.include,
                                                exclude=opts.exclude, spares=opts.spares, hot_spare=True)
        self.jobs: List[JobMeta] = []
        self.events: list = []  # heap of (time, seq, description, callable)
        self._seq = 0
        self.t0 = 0.0
        self.monitor: Optional[Monitor] = None
        self.injected: Dict[int, Injected] = {}
        self.cancelled: List[str] = []
        self.notes: List[str] = []
        self.workdir: Path = Path()
        self._core = None
        self._ctld_down = False
        self._paged = 0
        self._people_acted = 0.0  # time of the newest person's command that went through
        self._client: Optional[subprocess.Popen] = None  # the submitit job's client
        self._client_out = ""
        self._bad_repairs: list = []  # soak_storm.BadRepair, watched on every snapshot

    # ---- lab -----------------------------------------------------------------------------------------
    def start_lab(self) -> None:
        st = self.lab.load_state()
        if st and st.get("procs"):
            self.lab.down()
        # the real control plane; the sync reaches it through the lab's fault proxy (autoheal_lab.apifaults),
        # which makes the soak's API fault windows
        self.lab.up(nodes=self.opts.nodes, gpus=self.opts.gpus, spares=self.opts.spares, kube=self.opts.kube,
                    hooks_conf={"lemon_faults": self.opts.lemon_faults})
        self.lay = self.lab.layout()
        self.env = self.lab.slurm_env()
        from autoheal.config import load_config
        from autoheal.slurm.cli_backend import CliSlurm

        # one try, a short timeout: a snapshot while slurmctld is down must fail fast, not hold the loop
        # (and with it the planned restart of slurmctld)
        self.slurm = CliSlurm(env=self.env, timeout=5, retries=0)
        self.cfg = load_config(self.lay.autoheal_conf)
        self.workdir = self.lay.path("drill", f"soak-{self.opts.seed}-{os.getpid()}")
        self.workdir.mkdir(parents=True, exist_ok=True)
        if self.opts.kube:
            from kubernetes import client
            from kubernetes import config as kconfig

            cfg = client.Configuration()
            kconfig.load_kube_config(config_file=self.lab.load_state()["kubeconfig"], client_configuration=cfg)
            self._api = client.ApiClient(cfg)
            self._core = client.CoreV1Api(self._api)
            self._custom = client.CustomObjectsApi(self._api)

    def _run(self, argv: List[str], timeout: float = 30.0, check: bool = True) -> subprocess.CompletedProcess:
        res = subprocess.run(argv, env=self.env, capture_output=True, text=True, timeout=timeout,
                             cwd=str(self.workdir), stdin=subprocess.DEVNULL)
        if check and res.returncode != 0:
            raise LabError(f"{' '.join(argv[:4])}...: {res.stderr.strip() or res.stdout.strip()}")
        return res

    # ---- workload ------------------------------------------------------------------------------------
    def _trainer_cmd(self, steps: int, every: int = 20) -> str:
        import autoheal.sbatch_helpers as helpers

        trainer = Path(helpers.__file__).parent / "examples" / "tiny_trainer.py"
        return " ".join(shlex.quote(a) for a in [sys.executable, str(trainer), "--steps", str(steps),
                                                 "--step-seconds", str(STEP_SECONDS), "--checkpoint-every",
                                                 str(every)])

    def _autoheal_sbatch(self, name: str, nodes: int, steps: int, extra: List[str], array: str = "") -> str:
        out = self.workdir / (f"{name}-%a.out" if array else f"{name}.out")
        script = self.workdir / f"{name}.sh"
        script.write_text("\n".join([
            "#!/bin/bash", f"#SBATCH --job-name={name}", f"#SBATCH --nodes={nodes}", "#SBATCH --ntasks-per-node=1",
            f"#SBATCH --output={out}",
            f"srun {self._trainer_cmd(steps)}", ""]))
        ckpt = self.workdir / (f"ckpt-{name}-%a" if array else f"ckpt-{name}")
        argv = [sys.executable, "-m", "autoheal.cli.main", "sbatch", *extra, "--parsable", "--checkpoint-dir",
                str(ckpt)]
        if array:
            argv.append(f"--array={array}")
        res = self._run(argv + [str(script)], timeout=60)
        return res.stdout.strip().splitlines()[-1].split(";")[0]

    def _sbatch(self, name: str, wrap: str, extra: List[str] = ()) -> str:
        res = self._run(["sbatch", "--parsable", f"--job-name={name}", f"--output={self.workdir}/{name}-%j.out",
                         *extra, "--wrap", wrap], timeout=15)
        return res.stdout.strip().splitlines()[-1].split(";")[0]

    def submit_workload(self) -> None:
        span = self.schedule.span
        work = self.opts.trainer_seconds or max(30.0, 0.6 * span)
        steps = int(work / STEP_SECONDS)
        # first the hot-spare trainer (3 nodes with a free core each: 2 active, 1 idle spare; a fault on
        # the active node that is not the batch host is swapped to the spare, on the batch host or once the
        # spare is used it is requeued) and the submitit job, so that both run when the faults start
        jid = self._autoheal_sbatch("hotspare", 2, steps, ["--spare-nodes", "1", "--grace", "10",
                                                           "--max-restarts", "20"])
        self.jobs.append(JobMeta(jid, "hotspare", opted_in=True, steps=steps, nodes=2,
                                 output=str(self.workdir / "hotspare.out")))
        self._submit_submitit(steps)
        for i in range(self.opts.jobs):
            nodes = 2 if i == 0 else 1
            grace, restarts = (("10", "20") if i % 2 == 0 else ("20", "10"))
            name = f"trainer{i + 1}"
            jid = self._autoheal_sbatch(name, nodes, steps, ["--grace", grace, "--max-restarts", restarts])
            self.jobs.append(JobMeta(jid, "trainer", opted_in=True, steps=steps, nodes=nodes,
                                     output=str(self.workdir / f"{name}.out")))
        asteps = max(100, steps // 3)
        jid = self._autoheal_sbatch("array", 1, asteps, ["--grace", "10", "--max-restarts", "20"], array="0-1")
        self.jobs.append(JobMeta(jid, "array", opted_in=True, steps=asteps, nodes=1,
                                 output=str(self.workdir / "array-%a.out")))
        jid = self._sbatch("plain", f"sleep {int(work)}", ["--requeue"])
        self.jobs.append(JobMeta(jid, "plain", nodes=1))
        self.log(f"workload: {', '.join(f'{j.role} {j.job_id}' for j in self.jobs)}")

    def _submit_submitit(self, steps: int) -> None:
        """A submitit ``Checkpointable`` job (the recipe in sbatch_helpers/examples/submitit_job.py, the
        real submitit), submitted by its own client through ``autoheal sbatch``. On the grace signal
        submitit pickles the trainer (``checkpoint()``) and requeues the job itself; autoheal's runner
        forwards the signal and leaves the requeue to it. The client waits for the result."""
        try:
            import submitit  # noqa: F401
        except ImportError:
            self.notes.append("submitit is not installed (pip install -e '.[test]'): no submitit job in the workload")
            return
        from autoheal_lab.drill_submitit import start_client

        folder = self.workdir / "submitit"
        out = self.workdir / "submitit-client.out"
        self._client, jid = start_client(self.env, self.workdir, folder, steps, STEP_SECONDS,
                                         int(self.cfg.hooks.grace_seconds), ["--via-autoheal-sbatch"], out)
        self.jobs.append(JobMeta(jid, "submitit", opted_in=True, steps=steps, nodes=1,
                                 output=str(folder / f"{jid}_0_log.out")))
        self._client_out = str(out)

    def _stop_client(self) -> None:
        c = self._client
        if c is not None and c.poll() is None:
            c.terminate()
            try:
                c.wait(timeout=10)
            except subprocess.TimeoutExpired:
                c.kill()
                c.wait(timeout=10)

    def _short_job(self) -> None:
        if self._ctld_down:
            return  # the last snapshot found slurmctld down: a submission would only hold the loop
        try:
            jid = self._sbatch("short", "sleep 3")
            self.jobs.append(JobMeta(jid, "short", nodes=1))
            self.monitor.jobs[jid] = self.jobs[-1]
        except (LabError, subprocess.TimeoutExpired) as exc:
            self.notes.append(f"a short job could not be submitted: {exc}")

    # ---- snapshots -----------------------------------------------------------------------------------
    def snapshot(self) -> Optional[Snapshot]:
        from autoheal.errors import SlurmError
        from autoheal.slurm import parse

        now = time.time()
        try:
            nodes = self.slurm.list_nodes()
            jobs = parse.jobs_from_json(self.slurm._read("squeue", "--json", "--states=all"), "squeue --json")
        except (SlurmError, subprocess.TimeoutExpired, OSError):
            return None  # slurmctld down for a moment (a planned kill): the next snapshot will tell
        ours = {j.job_id for j in self.jobs}
        snap = Snapshot(now)
        for n in nodes:
            snap.nodes[n.name] = {"state": n.state_text if hasattr(n, "state_text") else n.state,
                                  "drain": n.drain, "reason": n.reason or "", "responding": n.responding}
        for j in jobs:
            base = j.array_job_id or j.job_id.split("_")[0]
            if j.job_id not in ours and base not in ours:
                continue
            snap.jobs[j.job_id] = {"state": j.state, "reason": j.state_reason or "", "comment": j.comment or "",
                                   "restarts": j.restart_count, "nodes": list(j.nodes), "held": j.held}
        if self._core is not None:
            try:
                snap.kube = {}
                for kn in self._api.sanitize_for_serialization(self._core.list_node(_request_timeout=5))["items"]:
                    meta = kn["metadata"]
                    ann = meta.get("annotations") or {}
                    snap.kube[meta["name"]] = {"unschedulable": bool((kn.get("spec") or {}).get("unschedulable")),
                                               "remediation": ann.get(f"{self.cfg.sync.annotation_prefix}/"
                                                                      "remediation-state", ""),
                                               "labels": meta.get("labels") or {},
                                               **self._waiting_view(ann)}
                crs = self._custom.list_cluster_custom_object("autoheal.io", "v1alpha1", "nodereplacements",
                                                              _request_timeout=5)["items"]
                snap.replacements = [{"node": (c.get("spec") or {}).get("nodeName") or c["metadata"]["name"],
                                      "name": c["metadata"]["name"]} for c in crs]
                snap.breaker = self._breaker_state()
            except Exception:  # the API in a planned 5xx/429/slow window: no Kubernetes view this time
                snap.kube = None
        return snap

    def _waiting_view(self, ann: dict) -> dict:
        """What a Node says of a remediation waiting on a breaker limit (since, limit, until)."""
        p = f"{self.cfg.sync.annotation_prefix}/remediation-"
        return {"since": ann.get(p + "since", ""), "waiting_limit": ann.get(p + "waiting-limit", ""),
                "waiting_until": ann.get(p + "waiting-until", "")}

    def _breaker_state(self) -> dict:
        """The breaker's ConfigMap as the sync keeps it (what pages the on-call): {tripped_at, why}."""
        from kubernetes.client import ApiException

        try:
            cm = self._core.read_namespaced_config_map(self.cfg.sync.breaker_configmap, self.cfg.sync.namespace,
                                                       _request_timeout=5)
        except ApiException as exc:
            if exc.status == 404:
                return {"tripped_at": None, "why": ""}  # no state yet: never tripped
            raise
        data = cm.data or {}
        try:
            at = float(data["trippedAt"]) if data.get("trippedAt") else None
        except ValueError:
            at = 0.0  # hand-edited: the sync keeps such a breaker tripped, so does the page
        return {"tripped_at": at, "why": data.get("why") or ""}

    # ---- the on-call admin ---------------------------------------------------------------------------
    def _autoheal(self, *args: str, timeout: float = 60.0) -> subprocess.CompletedProcess:
        return self._run([sys.executable, "-m", "autoheal.cli.main", *args], timeout=timeout, check=False)

    def _oncall(self, trip: Trip) -> None:
        """Paged ``trip.delay`` s ago: look at the breaker, reset it if it is still tripped. Retried
        through API outages like every person's command; given up, the next look is another delay away."""
        oncall = self.monitor.oncall

        def look_and_reset() -> None:
            res = self._autoheal("sync", "breaker", "--json")
            state = json.loads(res.stdout)  # not JSON: raises, tried again 1 s later
            if "tripped" not in state:  # the error envelope (the API refused): they could not tell
                raise LabError(f"autoheal sync breaker: {state.get('error') or res.stderr.strip()}"[:300])
            if not state["tripped"]:
                oncall.looked(trip, time.time(), still_tripped=False)
                self.log(f"t+{time.time() - self.t0:6.1f} on-call: breaker armed again by itself (trip {trip.n})")
                return
            res = self._autoheal("sync", "breaker", "reset", "--json")
            out = json.loads(res.stdout)
            if res.returncode != 0 or not out.get("reset"):
                raise LabError(f"autoheal sync breaker reset: {out}")
            oncall.did_reset(trip, time.time())
            self.log(f"t+{time.time() - self.t0:6.1f} on-call: breaker reset after {time.time() - trip.start:.0f} s "
                     f"(trip {trip.n}: {trip.why})")

        self._person(f"on-call resets the breaker (trip {trip.n})", look_and_reset, within=120.0,
                     failed=lambda: oncall.gave_up(trip))

    def _oncall_resume(self, node: str) -> None:
        """A node Slurm drained by itself with a runbook reason (``ONCALL_RESUMES``): the on-call looks
        at it again and resumes it (``scontrol update state=resume``) if the reason is still Slurm's."""
        from autoheal.reasons import strip_reason_suffix
        from autoheal_lab.soak_checks import ONCALL_RESUMES

        oncall = self.monitor.oncall

        def look_and_resume() -> None:
            n = self.slurm.get_node(node)
            reason = strip_reason_suffix(n.reason or "")
            if not n.drain or reason not in ONCALL_RESUMES:
                oncall.resumed(node, time.time(), f"not needed any more: {reason or 'in service'}")
                return
            self._run(["scontrol", "update", f"nodename={node}", "state=resume"])
            oncall.resumed(node, time.time(), "resumed")
            self.log(f"t+{time.time() - self.t0:6.1f} on-call: resumed {node} (Slurm's own drain: {reason})")

        self._person(f"on-call resumes {node}", look_and_resume, within=120.0,
                     failed=lambda: oncall.resumed(node, time.time(), "gave up"))

    def _technician(self, node: str) -> None:
        """``node`` waited for a replacement the empty pool cannot give: a technician swaps its broken
        GPUs (the fake ones healed), then hands it back as a site would: ``autoheal check --clear-faults``
        (the node forgets the faults and its recovery ladder) and ``autoheal node resume`` (only a drain
        of autoheal's; the sync then abandons the replacement request)."""
        from autoheal_lab import gpus as labgpus

        oncall = self.monitor.oncall

        def repair() -> None:
            from autoheal.reasons import strip_reason_suffix

            # looked at again on every try: while they were kept out (slurmctld restarting) the node may
            # have been replaced, resumed, or drained for a new fault, and then there is nothing to repair
            now_reason = strip_reason_suffix(self.slurm.get_node(node).reason or "")
            from autoheal_lab.soak_checks import PERSON_REPLACES

            if not now_reason.startswith(PERSON_REPLACES):
                oncall.repaired(node, time.time(), f"not needed any more: {now_reason or 'in service'}")
                return
            if f"slurmd-{node}" not in self.lab.records():
                # the spare pool took the machine away (a replacement arrived; soak seed 46688: the sync then
                # failed the remediation and the name kept its replace reason): nothing left to repair here
                oncall.repaired(node, time.time(), "not possible: the machine left the cluster")
                return
            labgpus.clear_all(self.lab, node)
            res = self._autoheal("check", "--node", node, "--clear-faults", "--json")
            if res.returncode != 0:
                raise LabError(f"autoheal check --clear-faults: {res.stderr.strip() or res.stdout.strip()}"[:300])
            res = self._autoheal("node", "resume", node, "--json")
            try:
                out = json.loads(res.stdout)
            except ValueError:
                raise LabError(f"autoheal node resume: {res.stderr.strip()}"[:300]) from None
            if "error" in out:  # the error envelope (slurmctld restarting): try again 1 s later
                raise LabError(f"autoheal node resume: {out['error']}"[:300])
            outcome = "resumed" if res.returncode == 0 else f"left alone: {out.get('action')} {out.get('reason') or ''}"
            oncall.repaired(node, time.time(), outcome.strip())
            self.log(f"t+{time.time() - self.t0:6.1f} technician: {node} repaired in place: {outcome}")

        self._person(f"technician repairs {node}", repair, within=120.0,
                     failed=lambda: oncall.repaired(node, time.time(), "gave up"))

    # ---- fault execution -----------------------------------------------------------------------------
    def _at(self, t: float, what: str, fn: Callable[[], None]) -> None:
        self._seq += 1
        heapq.heappush(self.events, (t, self._seq, what, fn))

    def _in_service(self, snap: Optional[Snapshot]) -> List[str]:
        if snap is None:
            return []
        return sorted(n for n, v in snap.nodes.items() if node_in_service(v))

    def _alive_nodes(self, snap: Optional[Snapshot]) -> List[str]:
        """Nodes that are still machines of the lab: not retired, not a spare still held."""
        recs = self.lab.records()
        out = []
        for n in self.lay.all_nodes:
            v = (snap.nodes.get(n) if snap else None) or {}
            if ours_kind(v.get("reason", ""), self._spare_prefix()) in ("retired", "spare") and v.get("drain"):
                continue
            if f"slurmd-{n}" not in recs:
                continue
            out.append(n)
        return out

    def _spare_prefix(self) -> str:
        return self.cfg.sync.spare_reason_prefix

    def _resolve(self, f, snap: Optional[Snapshot]) -> tuple:
        node, note = f.node, ""
        if node == REPLACEMENT:
            used = [s for s in self.lay.spares if s in self._alive_nodes(snap)]
            node = used[-1] if used else f.fallback
            note = f"on replacement {node}" if used else f"no spare in service yet: on {node}"
        elif node == HOT_SPARE:
            node, note = self._hot_spare_target(f, snap)
        if f.kind == "admin-drain":
            ok = self._in_service(snap)
            if node not in ok and ok:
                new = ok[f.id % len(ok)]
                note, node = f"{node} not in service: admin drains {new} instead", new
        elif node and node not in self._alive_nodes(snap):
            alive = self._alive_nodes(snap)
            if alive:
                new = alive[f.id % len(alive)]
                note, node = f"{node} left the cluster: on {new} instead", new
        return node, note

    def _hot_spare_target(self, f, snap: Optional[Snapshot]) -> tuple:
        """The hot-spare job's second active node (its comment's ``nodes=``: the batch host first, which
        cannot leave the allocation), where a fault is swapped to the spare while one is left, else
        requeued; the previous fault's node for a fault during its recovery; ``f.fallback`` when the job
        is not running on two active nodes."""
        from autoheal_lab.soak_checks import comment_field

        if f.overlap == "during-recovery" and f.id - 1 in self.injected:
            prev = self.injected[f.id - 1].node
            return prev, f"during the recovery on {prev}"
        hot = next((j.job_id for j in self.jobs if j.role == "hotspare"), "")
        view = (snap.jobs.get(hot) if snap else None) or {}
        active = [n for n in comment_field(view.get("comment", ""), "nodes").split(",") if n]
        if view.get("state") == "RUNNING" and len(active) > 1 and active[1] in (view.get("nodes") or []):
            spares = comment_field(view.get("comment", ""), "spares")
            return active[1], f"on hot-spare job {hot}'s active node {active[1]} (spares={spares})"
        return f.fallback, f"hot-spare job {hot or '-'} not running on two active nodes: on {f.fallback}"

    def fire(self, f, snap: Optional[Snapshot]) -> None:
        spec = KINDS[f.kind]
        node, note = self._resolve(f, snap)
        inj = Injected(f.id, f.kind, spec.group, time.time(), node=node, gpu=f.gpu, note=note)
        end = inj.start + f.duration if f.duration else None
        self.log(f"t+{inj.start - self.t0:6.1f} fault {f.id} {f.kind} {node or ''}"
                 f"{'' if f.gpu is None else f' GPU {f.gpu}'} {note}")
        self._do(f, spec, inj, node, end, snap)
        # recorded once carried out: a fault whose injection failed (noted by the loop) explains nothing
        self.injected[f.id] = inj
        self.monitor.add_fault(inj)

    def _do(self, f, spec, inj: Injected, node: str, end: Optional[float], snap: Optional[Snapshot]) -> None:
        from autoheal_lab import gpus as labgpus

        def ended():
            inj.end = time.time()

        if f.kind in ("job-storm", "bad-repair"):  # issue 22: autoheal_lab.soak_storm
            from autoheal_lab import soak_storm

            if f.kind == "job-storm":
                soak_storm.job_storm(self, inj, f.xid, snap)
            else:
                watch = soak_storm.BadRepair(inj, node, f.gpu)
                watch.start(self)
                self._bad_repairs.append(watch)
            return
        if spec.group == "gpu":
            if f.kind == "flapping":
                labgpus.inject(self.lab, node, f.gpu, "thermal")
                inj.count = 3
                for k, dt in enumerate((2.0, 4.0, 6.0, 8.0, 10.0)):
                    kind = "clear" if k % 2 == 0 else "thermal"
                    self._at(inj.start + dt, f"flap {node}",
                             lambda kind=kind: labgpus.inject(self.lab, node, f.gpu, kind))
                self._at(end, f"flapping over on {node}", lambda: (labgpus.inject(self.lab, node, f.gpu, "clear"),
                                                                   ended()))
                return
            labgpus.inject(self.lab, node, f.gpu, spec.gpu_inject, xid=f.xid if f.xid is not None else spec.xid)
            if end:
                self._at(end, f"{f.kind} over on {node}",
                         lambda: (labgpus.inject(self.lab, node, f.gpu, "clear"), ended()))
            return
        if f.kind == "kill-slurmd":
            self._kill(f"slurmd-{node}")
            self._at(end, f"slurmd-{node} restarted", lambda: (self.lab.start_slurmd(node), ended()))
        elif f.kind == "kill-slurmctld":
            lost = self._drains_it_may_lose(time.time())
            self._kill("slurmctld")
            self._at(end, "slurmctld restarted", lambda: (self.lab.restart_slurmctld(), ended(),
                                                          self._admins_look_after_restart(lost)))
        elif f.kind == "kill-xid-watch":
            from autoheal_lab import wiring

            self._kill(f"xid-watch-{node}")
            self._at(end, f"xid-watch-{node} restarted",
                     lambda: (self.lab.start_node_daemon(f"xid-watch-{node}", node, wiring.xid_watch_argv(node)),
                              ended()))
        elif f.kind == "kill-sync":
            from autoheal_lab import kube as labkube

            self._kill(labkube.SYNC_PROC)
            self._at(end, "sync restarted", lambda: (labkube.start_sync(self.lab), ended()))
        elif spec.group == "api":
            rule = {"api-5xx": {"status": 503}, "api-429": {"status": 429, "retry_after": 1},
                    "api-slow": {"latency_ms": 1500}}[f.kind]
            from autoheal_lab.realkube import fault_control

            control = fault_control(self.lab)
            # every API call of the sync in the window (its watches too: an overloaded server refuses new
            # ones); the window's end is the proxy's own too, should the soak die before it removes the rule
            added = control.add(path_regex="^/api", end=end, **rule)
            inj.note = (inj.note + f" rule {added['id']}").strip()
            self._at(end, f"{f.kind} over", lambda: (control.remove(added["id"]), ended()))
        elif f.kind == "admin-drain":
            inj.reason = f"admin: soak maintenance {f.id}"
            self._pending(inj)
            if node not in self._in_service(snap):
                inj.note = (inj.note + " no node in service: the admin leaves them alone").strip()
                return
            self._person(f"admin drains {node}", lambda: self._run(["scontrol", "update", f"nodename={node}",
                                                                     "state=drain", f"reason={inj.reason}"]),
                         then=lambda: self._started(inj, f.duration, f"admin resumes {node}",
                                                    lambda: self._admin_resume(inj)))
        elif f.kind == "kubectl-cordon":
            def uncordon():
                self._person(f"uncordon {node}",
                             lambda: self._core.patch_node(node, {"spec": {"unschedulable": False}}), then=ended)

            def cordon() -> bool:
                # as kubectl: a Node already cordoned (autoheal's remediation) is left as it is
                # ("already cordoned"), so there is no cordon of theirs for anyone to keep or undo
                if (self._core.read_node(node).spec.unschedulable):
                    return False
                self._core.patch_node(node, {"spec": {"unschedulable": True}})
                return True

            def cordoned(done: List[bool]) -> None:
                if done[0]:
                    self._started(inj, f.duration, f"uncordon {node}", uncordon)
                else:
                    inj.note = (inj.note + " already cordoned: kubectl cordon changed nothing").strip()
                    ended()

            done: List[bool] = [False]
            self._pending(inj)
            self._person(f"cordon {node}", lambda: done.__setitem__(0, cordon()), then=lambda: cordoned(done))
        elif f.kind == "user-cancel":
            target = self._cancel_target(snap)
            inj.job = target
            if target:
                self.cancelled.append(target)
                self._person(f"scancel {target}", lambda: self._run(["scancel", target]))
            else:
                inj.note = "no job of the user's to cancel"
        elif f.kind in ("user-hold", "time-limit"):
            name, wrap, extra = (("held", "sleep 3", ["--hold"]) if f.kind == "user-hold"
                                 else ("timelimit", "sleep 600", ["--time=1"]))

            def submitted(jid: str) -> None:
                inj.job = jid
                self.jobs.append(JobMeta(jid, "short" if f.kind == "user-hold" else "time-limit", nodes=1))
                self.monitor.jobs[jid] = self.jobs[-1]
                if f.kind == "user-hold":
                    self._started(inj, f.duration, f"release {jid}",
                                  lambda: self._person(f"release {jid}",
                                                       lambda: self._run(["scontrol", "release", jid]),
                                                       then=lambda: (ended(), self._user_looks_again(jid))))

            self._person(f"submit {name}", lambda: submitted(self._sbatch(name, wrap, extra)))

    def _user_looks_again(self, jid: str) -> None:
        """The user who released their job looks at it again a little later and releases it once more if
        it is still held: a ``kill -9`` of slurmctld seconds after the release loses it, as it loses an
        admin's resume (``_admin_resume``)."""
        from autoheal.errors import SlurmNotFound

        def look() -> None:
            try:
                job = self.slurm.get_job(jid)
            except SlurmNotFound:
                return  # it ran and left Slurm's memory
            if job.held:
                self.notes.append(f"user: job {jid} was held again after their release (a slurmctld restart "
                                  "lost it): released again")
                self._run(["scontrol", "release", jid])

        self._at(time.time() + self.PEOPLE_LOOK_AGAIN, f"user looks at {jid} again",
                 lambda: self._person(f"user looks at {jid} again", look))

    def _cancel_target(self, snap: Optional[Snapshot]) -> str:
        """The newest short job still queued or running, else the plain job."""
        live = {j for j, v in (snap.jobs if snap else {}).items() if v.get("state") in ("PENDING", "RUNNING")}
        for j in reversed(self.jobs):
            if j.role == "short" and j.job_id in live and j.job_id not in self.cancelled:
                return j.job_id
        plain = next((j.job_id for j in self.jobs if j.role == "plain"), "")
        return plain if plain in live and plain not in self.cancelled else ""

    def _pending(self, inj: Injected) -> None:
        """A person's change not made yet: it starts (and is checked) only once it worked."""
        inj.start = float("inf")

    def _started(self, inj: Injected, duration: float, what: str, undo: Callable[[], None]) -> None:
        inj.start = time.time()
        self._at(inj.start + duration, what, undo)

    def _person(self, what: str, call: Callable[[], object], then: Callable[[], object] = lambda: None,
                within: float = 60.0, _deadline: Optional[float] = None,
                failed: Callable[[], object] = lambda: None) -> None:
        """A person's command (scontrol, sbatch, kubectl): tried now and, while slurmctld restarts or the
        API refuses, again 1 s later through the event queue (never blocking the loop, whose snapshots
        and daemon restarts must go on), for ``within`` seconds; ``then`` once it worked, ``failed``
        when they gave up."""
        deadline = time.time() + within if _deadline is None else _deadline
        try:
            call()
            self._people_acted = time.time()
        except Exception as exc:
            if time.time() >= deadline:
                self.notes.append(f"{what}: gave up after {within:.0f} s: {type(exc).__name__}: {exc}"[:300])
                failed()
                return
            self._at(time.time() + 1.0, what, lambda: self._person(what, call, then, within, deadline, failed))
            return
        then()

    def _admin_resume(self, inj: Injected) -> None:
        """The admin ends the maintenance: resumes the node if it still has their reason, and looks once
        more a little later. A ``kill -9`` of slurmctld within seconds of an update loses it (slurmctld
        saves node state in the background: seed 1 of the 200-fault bench, resume at 16:35:30.161, kill
        2 s later, "Recovered state of 6 nodes" with spare2 still drained "admin: soak maintenance 192"),
        and an admin who finds their maintenance drain back resumes it again."""
        from autoheal.reasons import strip_reason_suffix

        def theirs() -> bool:
            n = self.slurm.get_node(inj.node)
            return bool(n.drain) and strip_reason_suffix(n.reason) == inj.reason

        def look() -> None:
            if theirs():
                self._run(["scontrol", "update", f"nodename={inj.node}", "state=resume"])
            inj.end = time.time()
            self._at(time.time() + self.PEOPLE_LOOK_AGAIN, f"admin looks at {inj.node} again",
                     lambda: self._person(f"admin looks at {inj.node} again", look_again))

        def look_again() -> None:
            if theirs():
                self.notes.append(f"admin: {inj.node} was drained again with their reason after their resume "
                                  "(a slurmctld restart lost it): resumed again")
                self._run(["scontrol", "update", f"nodename={inj.node}", "state=resume"])

        self._person(f"admin resumes {inj.node}", look)

    #: Seconds before a ``kill -9`` of slurmctld within which an admin's drain may be lost: the bench's
    #: SLURMCTLD_STATE_LAG (10 s) measured job updates; seed 60613 lost an admin's drain made 15.5 s before
    #: the kill on a loaded machine ("Recovered state of 6 nodes", gpu1 with no reason).
    ADMIN_DRAIN_LOSS = 30.0

    def _drains_it_may_lose(self, now: float) -> List[Injected]:
        """Admins' maintenance drains made shortly before a slurmctld kill and not ended: the restarted
        slurmctld may come back without them. Until their admin has looked again they may be missing
        (``lost_until``), which is Slurm's doing, not autoheal's."""
        out = []
        for inj in self.injected.values():
            if inj.kind == "admin-drain" and inj.end is None and inj.start <= now \
                    and now - inj.start <= self.ADMIN_DRAIN_LOSS:
                inj.lost_until = float("inf")
                out.append(inj)
        return out

    def _admins_look_after_restart(self, drains: List[Injected]) -> None:
        """A site's runbook after a controller crash: the admins who had just drained a node look at it
        again once slurmctld is back, and drain it again if it came back without their drain."""
        from autoheal.reasons import strip_reason_suffix

        for inj in drains:
            def look(inj: Injected = inj) -> None:
                if inj.end is not None:  # their maintenance ended meanwhile
                    inj.lost_until = time.time()
                    return
                n = self.slurm.get_node(inj.node)
                if not (n.drain and strip_reason_suffix(n.reason) == inj.reason):
                    self._run(["scontrol", "update", f"nodename={inj.node}", "state=drain", f"reason={inj.reason}"])
                    self.notes.append(f"admin: {inj.node} came back from the slurmctld restart without their "
                                      f"maintenance drain (lost): drained again")
                inj.lost_until = time.time() + 2.0  # the next snapshot shows it

            self._at(time.time() + self.PEOPLE_LOOK_AGAIN, f"admin looks at {inj.node} after the restart",
                     lambda look=look, inj=inj: self._person(f"admin looks at {inj.node} after the restart", look,
                                                             failed=lambda: setattr(inj, "lost_until", time.time())))

    def _kill(self, proc_name: str) -> None:
        rec = self.lab.records().get(proc_name)
        if rec is None:
            self.notes.append(f"no {proc_name} to kill")
            return
        try:
            os.kill(rec.pid, signal.SIGKILL)
        except ProcessLookupError:
            self.notes.append(f"{proc_name} was already gone")
        from autoheal_lab import procs

        procs._reap(rec.pid)

    # ---- the run -------------------------------------------------------------------------------------
    def run(self) -> SoakReport:
        wall0 = time.monotonic()
        self.start_lab()
        try:
            self.submit_workload()
            self.monitor = Monitor(self.jobs, seed=self.opts.seed, breaker_max=self.cfg.sync.breaker_max_concurrent,
                                   spare_prefix=self._spare_prefix(),
                                   opt_out_label=self.cfg.sync.opt_out_label if self.opts.kube else "",
                                   oncall_delays=self.schedule.oncall, repair_delays=self.schedule.repair,
                                   wait_bound=self.cfg.sync.breaker_window_seconds if self.opts.kube else None,
                                   slurm_only=not self.opts.kube)
            self._wait_running(60.0)
            self.t0 = time.time()
            for f in self.schedule.faults:
                self._at(self.t0 + f.at, f"fault {f.id}", lambda f=f: self.fire(f, self._last))
            t = self.t0 + self.opts.short_every
            while t < self.t0 + self.schedule.span:
                self._at(t, "short job", self._short_job)
                t += self.opts.short_every
            self._last: Optional[Snapshot] = self.snapshot()
            self._loop(until_events=True)
            self._settle()
            report = self._finish()
        finally:
            self._stop_client()
            self.lab.down()
        report.violations += [v.to_dict() for v in self.monitor.check_leaks(self.leaked(), time.time())]
        report.wall_seconds = round(time.monotonic() - wall0, 1)
        return report

    def _wait_running(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            snap = self.snapshot()
            running = {k for k, j in (snap.jobs if snap else {}).items() if j["state"] == "RUNNING"}
            first = {j.job_id for j in self.jobs if j.role in ("hotspare", "submitit")}
            if snap and len(running) >= min(3, len(self.jobs)) and first <= running:
                return
            time.sleep(0.5)
        self.notes.append(f"the workload was not running after {timeout:.0f} s; faults start anyway")

    def _loop(self, until_events: bool, deadline: Optional[float] = None,
              done: Optional[Callable[[], bool]] = None) -> None:
        next_snap = 0.0
        while True:
            now = time.time()
            while self.events and self.events[0][0] <= now:
                _t, _s, what, fn = heapq.heappop(self.events)
                try:
                    fn()
                except Exception as exc:  # an injection failed: say so, the soak goes on
                    self.notes.append(f"{what} at t+{now - self.t0:.1f}: {type(exc).__name__}: {exc}")
            if now >= next_snap:
                snap = self.snapshot()
                self._ctld_down = snap is None
                if snap is not None:
                    self._last = snap
                    for v in self.monitor.observe(snap):
                        self.log(f"VIOLATION {v.invariant}: {v.message}")
                    self._watch_bad_repairs(snap)
                    trip = self.monitor.oncall.current
                    if trip is not None and len(self.monitor.oncall.trips) > self._paged:
                        self._paged = len(self.monitor.oncall.trips)
                        self.log(f"t+{now - self.t0:6.1f} on-call paged: breaker tripped ({trip.why}); "
                                 f"acting in {trip.delay:.0f} s")
                    trip = self.monitor.oncall.due(time.time())
                    if trip is not None:
                        self._oncall(trip)
                    for node in self.monitor.oncall.repairs_due(time.time()):
                        self._technician(node)
                    for node in self.monitor.oncall.resumes_due(time.time()):
                        self._oncall_resume(node)
                next_snap = time.time() + self.opts.snapshot_every
            if until_events and not self.events:
                return
            if deadline is not None and time.time() >= deadline:
                return
            if done is not None and done():
                return
            wait = min([next_snap - time.time()] + ([self.events[0][0] - time.time()] if self.events else []))
            time.sleep(max(0.05, min(wait, 0.5)))

    def _watch_bad_repairs(self, snap: Snapshot) -> None:
        from autoheal_lab.soak_storm import BAD_REPAIR_XID

        for w in self._bad_repairs:
            fixed = [float(r["done"]) for r in self.monitor.oncall.repairs
                     if r["node"] == w.node and r["outcome"] == "resumed"]
            before = w.inj.count
            try:
                w.observe(self, snap, fixed)
            except Exception as exc:  # an injection failed: say so, the soak goes on
                self.notes.append(f"bad repair of {w.node} at t+{snap.time - self.t0:.1f}: {type(exc).__name__}: {exc}")
            if w.inj.count > before:
                # the same defect again: its fault is open again (seed 43585: gpu4's lemon drain 3 minutes
                # after its first return read as a drain with no fault on the node)
                self.monitor.reopen(w.inj.id, time.time())
                self.log(f"t+{snap.time - self.t0:6.1f} bad repair: {w.node} back in service, its xid "
                         f"{BAD_REPAIR_XID} comes back ({w.inj.count})")

    def _jobs_done(self) -> bool:
        s = self._last
        if s is None:
            return False
        for j in self.jobs:
            views = [v for k, v in s.jobs.items() if k == j.job_id or k.split("_")[0] == j.job_id]
            if j.role in ("trainer", "hotspare", "submitit", "array", "short", "plain") and any(
                    v["state"] in ("PENDING", "RUNNING", "COMPLETING", "REQUEUED", "SUSPENDED") for v in views):
                return False
        return True

    def _settled(self) -> bool:
        s = self._last
        if s is None or not self._jobs_done():
            return False
        for name, v in s.nodes.items():
            if node_in_service(v):
                continue
            kind = ours_kind(v.get("reason", ""), self._spare_prefix()) if v.get("drain") else ""
            if kind in ("spare", "retired") or (kind == "" and v.get("drain")):
                continue
            if kind == "health" and self.monitor._limit_wait_ok(name, s.time):
                continue  # waits visibly on a configured limit, which may be an hour away
            return False
        return True

    def _settle(self) -> None:
        self.log("faults done: letting the loop settle")
        self._loop(until_events=False, deadline=time.time() + self.opts.settle, done=self._settled)
        if not self._jobs_done():
            # "no lost work" is judged on the trainers' final state: a job still running (a loaded machine,
            # a late restart) gets up to one more settle period to finish, nodes or not
            self._loop(until_events=False, deadline=time.time() + self.opts.settle, done=self._jobs_done)
        quiet = self._people_acted + self.PEOPLE_SETTLE - time.time()
        if quiet > 0:  # once, bounded: a person acting again meanwhile is judged as the world left it
            self._loop(until_events=False, deadline=time.time() + quiet)
        if not self._settled():
            self.notes.append(f"not settled {self.opts.settle:.0f} s after the last fault")

    def _finish(self) -> SoakReport:
        from autoheal.journal import Journal

        final = self.monitor.with_last_seen(self.snapshot() or self._last)
        journal = Journal(self.lay.path("journal", "journal.jsonl"))
        res = journal.read_all()
        records = [r.to_dict() for r in res.records]
        for inj in self.injected.values():
            if inj.group != "gpu":
                continue
            drains = [r["time"] for r in records if r.get("event") == "drain" and r.get("node") == inj.node
                      and r.get("time", 0) >= inj.start - 0.2]
            if drains:
                self.monitor.note_drain_time(inj.id, min(drains) - inj.start)
        outputs = {}
        for j in self.jobs:
            if j.role in ("trainer", "hotspare"):
                outputs[j.job_id] = _read(j.output)
            elif j.role == "submitit":
                if (final.jobs.get(j.job_id) or {}).get("state") == "COMPLETED" and self._client is not None:
                    try:  # the client reads the result pickle once a second
                        self._client.wait(timeout=20)
                    except subprocess.TimeoutExpired:
                        pass  # judged below: a COMPLETED job whose client got no result is a violation
                outputs[j.job_id] = _read(j.output) + "\n" + _read(self._client_out)
            elif j.role == "array":
                for task in (0, 1):
                    outputs[f"{j.job_id}_{task}"] = _read(j.output.replace("%a", str(task)))
        # array tasks are checked against the array's step count
        for key in list(outputs):
            if "_" in key:
                base = next(j for j in self.jobs if j.job_id == key.split("_")[0])
                self.monitor.jobs.setdefault(key, JobMeta(key, "trainer", True, base.steps, 1))
        self.monitor.finish(final, records, res.skipped, outputs, user_cancelled=self.cancelled, awaiting_ok=True,
                            recovery_bound=self.recovery_bound())
        from autoheal_lab import soak_storm

        self.monitor.violations += soak_storm.check(list(self.injected.values()), records, final,
                                                    self.cfg.hooks.lemon_faults, self._bad_repairs)
        if self.monitor.recovering:
            self.notes.append("still recovering at the end, within the loop's bound: "
                              f"{', '.join(self.monitor.recovering)}")
        if self.monitor.queued_at_end:
            self.notes.append(f"pending at the end, waiting their turn with enough usable nodes: "
                              f"{', '.join(self.monitor.queued_at_end)}")
        if self.monitor.waiting_human:
            self.notes.append(f"waiting for the on-call or the technician at the end: "
                              f"{', '.join(self.monitor.waiting_human)}")
        if self.monitor.waiting_limit:
            self.notes.append(f"waiting visibly on a configured breaker limit at the end (starts by itself when "
                              f"it allows): {', '.join(self.monitor.waiting_limit)}")
        if self.monitor.awaiting:
            self.notes.append(f"awaiting a replacement at the end (requested; no spare left): "
                              f"{', '.join(self.monitor.awaiting)}")
        report = SoakReport(seed=self.opts.seed, schedule=self.schedule.to_dict())
        report.injected = [vars(i) for i in self.injected.values()]
        counts: Dict[str, dict] = {}
        for i in self.injected.values():
            c = counts.setdefault(i.kind, {"injected": 0, "retargeted": 0})
            c["injected"] += 1
            c["retargeted"] += 1 if ("instead" in i.note or "no spare" in i.note) else 0
        report.counts = dict(sorted(counts.items()))
        report.recovery = self.monitor.recovery()
        report.per_fault = self.monitor.per_fault()
        for jid, v in sorted(final.jobs.items()):
            meta = self.monitor.jobs.get(jid) or self.monitor.jobs.get(jid.split("_")[0])
            report.jobs[jid] = {"role": meta.role if meta else "", "state": v["state"], "reason": v["reason"],
                                "comment": v["comment"], "restarts": v["restarts"]}
            if v.get("purged"):  # slurmctld forgot it (MinJobAge): its state is the last one a snapshot saw
                report.jobs[jid]["purged"] = True
            if meta and meta.role == "hotspare":
                report.jobs[jid]["swaps"] = comment_swaps(v["comment"])
            if meta and meta.role in ("trainer", "hotspare", "submitit", "array"):
                report.restarts[jid] = v["restarts"]
        report.notes = self.notes
        report.snapshots = self.monitor.snapshots
        report.timeline = self.monitor.timeline
        report.breaker = self.monitor.oncall.summary()
        report.violations = [v.to_dict() for v in self.monitor.violations]
        return report

    def recovery_bound(self) -> float:
        """Seconds the loop needs by design to bring a drained node back: a healthcheck to find the
        fault and one to repair it, ``hooks.resume_after_passes`` passing ones, the cool-down, and 15 s
        of slack (HealthCheckInterval read from the lab's slurm.conf)."""
        m = re.search(r"^HealthCheckInterval=(\d+)", self.lay.slurm_conf.read_text(), re.M)
        interval = float(m.group(1)) if m else 30.0
        return (2 + self.cfg.hooks.resume_after_passes) * interval + self.cfg.hooks.resume_cooldown + 15.0

    def leaked(self) -> List[str]:
        """Processes still running after ``down`` that belong to this lab (a path under its directory in
        their command line, or a job of its slurm.conf), other than this process and its parents."""
        from autoheal_lab import procs

        mine = set(procs.ancestors(os.getpid()))
        root = str(self.lab.root)
        pids = set(procs.job_processes(str(self.lay.slurm_conf))) | set(procs.step_daemons(self.lab.root))
        for entry in os.listdir("/proc"):
            if entry.isdigit():
                cmd = procs.proc_cmdline(int(entry)) or []
                if any(root in a for a in cmd):
                    pids.add(int(entry))
        out = []
        for pid in sorted(pids - mine):
            cmd = procs.proc_cmdline(pid)
            if cmd:
                out.append(f"pid {pid}: {' '.join(cmd)[:160]}")
        return out


def _read(path: str) -> str:
    try:
        return Path(path).read_text(errors="replace")
    except OSError:
        return ""


def render(report: SoakReport) -> str:
    """The human report: faults per kind, recovery percentiles, restarts, violations, verdict."""
    lines = [f"autoheal lab soak: seed {report.seed}, {len(report.injected)} faults, {report.snapshots} snapshots, "
             f"{report.wall_seconds:.0f} s"]
    lines.append("")
    lines.append(f"{'fault kind':<16} {'injected':>8} {'retargeted':>10}")
    for kind, c in report.counts.items():
        lines.append(f"{kind:<16} {c['injected']:>8} {c['retargeted']:>10}")
    lines.append("")
    lines.append(f"{'recovery (s)':<38} {'n':>4} {'p50':>7} {'p95':>7} {'max':>7}")
    for name, p in report.recovery.items():
        def f(x):
            return "-" if x is None else f"{x:.1f}"
        lines.append(f"{name:<38} {p['n']:>4} {f(p['p50']):>7} {f(p['p95']):>7} {f(p['max']):>7}")
    lines.append("")
    b = report.breaker or {}
    if b:
        w = b.get("tripped_to_reset_s") or {}
        lines.append(f"breaker: {b['trips']} trip(s), {b['resets']} reset by the on-call"
                     + (f" (tripped -> reset p50 {w['p50']:.0f} s, max {w['max']:.0f} s)" if w.get("n") else "")
                     + f", {b['rearmed_by_itself']} re-armed by itself, {b['open_at_end']} open at the end; "
                     f"{b.get('repairs', 0)} node(s) repaired in place by a technician (spare pool empty); "
                     f"{b.get('slurm_drains_resumed', 0)} Slurm drain(s) of the runbook resumed by the on-call")
        lines.append("")
    lines.append("jobs: " + ", ".join(f"{j} {v['role']} {v['state']} restarts={v['restarts']}"
                                      + (f" swaps={v['swaps']}" if "swaps" in v else "")
                                      for j, v in report.jobs.items()))
    for note in report.notes:
        lines.append(f"note: {note}")
    lines.append("")
    if report.ok:
        lines.append(f"soak PASSED: 0 violations (replay: --seed {report.seed})")
    else:
        lines.append(f"soak FAILED: {len(report.violations)} violation(s) (replay: --seed {report.seed})")
        for v in report.violations:
            lines.append(f"  [{v['invariant']}] {v['message']}")
            lines.append(f"      evidence: {json.dumps(v['evidence'], default=str)[:600]}")
    return "\n".join(lines)


def plot(report: SoakReport, path: str) -> None:
    """A PNG timeline: one row per node (in service / drained by autoheal / admin / down / retired /
    spare), fault markers, and one row per job (running or not). Needs matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise LabError("--plot needs matplotlib: pip install 'slurm-autoheal[plot]'") from None
    tl = report.timeline
    if not tl:
        raise LabError("nothing to plot: the soak took no snapshot")
    t0 = tl[0]["t"]
    nodes = sorted({n for s in tl for n in s["nodes"]})
    jobs = sorted({j for s in tl for j in s["jobs"]}, key=lambda x: (len(x), x))[:20]
    colors = {"in": "tab:green", "health": "tab:red", "k8s": "tab:orange", "admin": "tab:purple",
              "down": "black", "retired": "tab:gray", "spare": "lightgray"}
    rows = nodes + [f"job {j}" for j in jobs]
    fig, ax = plt.subplots(figsize=(12, 0.35 * len(rows) + 2))
    for i, s in enumerate(tl):
        x0 = s["t"] - t0
        width = (tl[i + 1]["t"] - s["t"]) if i + 1 < len(tl) else 1.0
        for r, n in enumerate(nodes):
            st = s["nodes"].get(n)
            if st:
                ax.barh(len(rows) - 1 - r, width, left=x0, color=colors.get(st, "tab:blue"), height=0.8, linewidth=0)
        for r, j in enumerate(jobs):
            st = s["jobs"].get(j)
            if st:
                ax.barh(len(rows) - 1 - len(nodes) - r, width, left=x0, height=0.5, linewidth=0,
                        color="tab:blue" if st == "RUNNING" else "khaki" if st == "PENDING" else "lightgray")
    for inj in report.injected:
        x = inj["start"] - t0
        if inj["node"] in nodes:
            y = len(rows) - 1 - nodes.index(inj["node"])
            ax.plot([x], [y], marker="v", color="black", markersize=6)
            ax.annotate(inj["kind"], (x, y + 0.3), fontsize=6, rotation=45)
        else:
            ax.axvline(x, color="gray", linestyle=":", linewidth=0.8)
            ax.annotate(inj["kind"], (x, len(rows) - 0.4), fontsize=6, rotation=45)
    for v in report.violations:
        ax.axvline(v["time"] - t0, color="red", linewidth=1.2)
    ax.set_yticks(range(len(rows)))
    ax.set_yticklabels(list(reversed(rows)), fontsize=7)
    ax.set_xlabel("seconds since the soak started")
    ax.set_title(f"autoheal lab soak, seed {report.seed}: {len(report.injected)} faults, "
                 f"{len(report.violations)} violation(s)  (green in service, red drained by autoheal, orange "
                 f"k8s drain, purple admin, gray retired)", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
