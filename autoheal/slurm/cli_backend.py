"""The default Slurm backend: ``scontrol``, ``sinfo``, ``squeue`` and ``scancel`` as subprocesses.

Every call is an argv list with a timeout. Output formats by version: node lists come from
``sinfo --json`` on 22.05 (``scontrol --json`` does not exist there) and ``scontrol --json show node``
on 23.02+. Jobs: Slurm filters them (``--states``, ``-w``, ``-j``) so a flood of other users' jobs is
never formatted, read or parsed, and which of squeue's outputs a read uses is ``job_read_format``'s
choice: listings read the token-delimited text formats of ``squeue_text`` on every version, one job the
JSON where its filters work (23.02+).
"""

from __future__ import annotations

import os
import subprocess
from typing import TYPE_CHECKING, Dict, List, Optional, Tuple

from autoheal.errors import SlurmError, SlurmNotFound, SlurmUnavailable
from autoheal.slurm import parse, squeue_text
from autoheal.slurm.base import SlurmAdapter, filter_jobs, job_outcome, not_found_if, unavailable_if, with_retries
from autoheal.slurm.binaries import find_binary
from autoheal.slurm.model import Job, JobUpdate, Node, SlurmVersion

if TYPE_CHECKING:
    from autoheal.config.core_sections import SlurmSection

TEXT = "text"
JSON = "json"


def job_read_format(version: SlurmVersion, one_job: bool) -> str:
    """Which of squeue's outputs a job read uses: ``TEXT`` (``squeue_text``) or ``JSON``.

    Listings (``one_job`` false) read text on every version. 22.05's ``squeue --json`` ignores every
    filter (the whole cluster: 70 MB under a 10,000-job flood); 23.02+ applies them, but the pending list
    is then the flood itself, and 26.05's JSON of it gave no answer within the adapter's 3 s (the text:
    well inside; docs/slurm-versions.md, "Job listings under a flood"). One job (``get_job``) reads the
    JSON on 23.02+: its ``-j`` makes it one record, and only the JSON carries ``submit_line`` (the
    ``--signal`` given on the sbatch command line, which jobside reads from it); 22.05 reads text.
    """
    if one_job and version.at_least(23, 2):
        return JSON
    return TEXT


class CliSlurm(SlurmAdapter):
    """Slurm through its command-line tools."""

    name = "cli"

    def __init__(self, bin_dir: str = "", slurm_conf: str = "", timeout: float = 10.0, retries: int = 2,
                 env: Optional[Dict[str, str]] = None):
        self.bin_dir = bin_dir
        self.timeout = timeout
        self.retries = retries
        self._env = dict(os.environ if env is None else env)
        if slurm_conf:
            self._env["SLURM_CONF"] = slurm_conf
        self._env.setdefault("PATH", "/usr/bin:/bin:/usr/sbin:/sbin")
        self._version: Optional[SlurmVersion] = None

    @classmethod
    def from_config(cls, section: SlurmSection) -> CliSlurm:
        return cls(bin_dir=section.bin_dir, slurm_conf=section.slurm_conf, timeout=section.timeout,
                   retries=section.retries)

    # ---- process plumbing ------------------------------------------------------------------------
    def run(self, tool: str, *args: str, timeout: Optional[float] = None,
            env: Optional[Dict[str, str]] = None) -> str:
        """Run a Slurm tool; typed errors for timeouts, unreachable controller and refusals."""
        argv = [find_binary(tool, self.bin_dir, self._env.get("PATH")), *args]
        limit = self.timeout if timeout is None else timeout
        try:
            res = subprocess.run(argv, env=self._env if env is None else env, capture_output=True, text=True,
                                 timeout=limit, stdin=subprocess.DEVNULL)
        except subprocess.TimeoutExpired:
            raise SlurmUnavailable(f"{tool} {' '.join(args[:3])}: no answer within {limit:g}s "
                                   f"(slurmctld down or unreachable?)") from None
        except OSError as exc:
            raise SlurmError(f"{tool}: cannot run {argv[0]}: {exc}") from None
        if res.returncode != 0:
            msg = " ".join((res.stderr or res.stdout).split())[:300] or f"exit code {res.returncode}"
            if res.returncode < 0:  # killed by a signal: no answer, not a refusal
                raise SlurmUnavailable(f"{tool} {' '.join(args[:2])}: killed by signal {-res.returncode}")
            if unavailable_if(msg):
                raise SlurmUnavailable(f"{tool}: {msg}")
            kind = job_outcome(msg)
            if kind is not None:
                raise kind(f"{tool} {' '.join(args[:2])}: {msg}")
            if not_found_if(msg):
                raise SlurmNotFound(f"{tool}: {msg}")
            raise SlurmError(f"{tool} {' '.join(args[:2])}: {msg}")
        return res.stdout

    def _read(self, tool: str, *args: str) -> str:
        return with_retries(lambda: self.run(tool, *args), self.retries)

    # ---- reads -------------------------------------------------------------------------------------
    def version(self) -> SlurmVersion:
        if self._version is None:
            self._version = SlurmVersion.parse(self.run("scontrol", "--version"))
        return self._version

    def installed_version(self) -> SlurmVersion:
        """The installed Slurm's version without a cluster: ``scontrol --version``, else the daemons'
        ``-V`` (22.05's scontrol needs a readable slurm.conf, else it tries configless DNS and dies, and
        the lab asks before it has written one). SlurmError naming what was tried when none answers."""
        try:
            return self.version()
        except SlurmError as exc:
            tried = [f"scontrol ({exc})"]
        for tool in ("slurmctld", "slurmd"):
            try:
                self._version = SlurmVersion.parse(self.run(tool, "-V"))
                return self._version
            except SlurmError as exc:
                tried.append(f"{tool} ({exc})")
        raise SlurmError(f"cannot detect the Slurm version: {'; '.join(tried)}")

    def list_nodes(self) -> List[Node]:
        if self.version().at_least(23, 2):
            return parse.nodes_from_json(self._read("scontrol", "--json", "show", "node"), "scontrol --json show node")
        return parse.nodes_from_json(self._read("sinfo", "--json"), "sinfo --json")

    def get_node(self, name: str) -> Node:
        text = self._read("scontrol", "-o", "show", "node", name)
        nodes = parse.nodes_from_oneliners(text)
        for node in nodes:
            if node.name == name:
                return node
        raise SlurmNotFound(f"node {name!r} not found")

    def _json_filters(self) -> bool:
        """Whether ``squeue --json`` applies squeue's filters (23.02+; 22.05 prints every job)."""
        return self.version().at_least(23, 2)

    def _unfiltered(self) -> List[str]:
        """The filter of a listing without one: every job the JSON of this version listed (22.05's every
        job slurmctld remembers; 23.02+ applies squeue's default state filter to JSON and text alike)."""
        return [] if self._json_filters() else ["--states=all"]

    def _filters(self, node: Optional[str], states: Optional[List[str]], job_ids: Optional[List[str]]) -> List[str]:
        args = []
        if states:
            args.append("--states=" + ",".join(s.upper() for s in states))
        elif node:
            # -w also matches PENDING jobs that asked for the node (a user can queue thousands): a job with
            # an allocation there is in one of these
            args.append("--states=" + ",".join(squeue_text.NODE_STATES))
        elif job_ids:
            args.append("--states=all")
        if node:
            args += ["-w", node]
        if job_ids:
            args += ["-j", ",".join(job_ids)]
        return args

    def _text_jobs(self, filters: List[str]) -> List[Job]:
        token = squeue_text.new_token()
        o_text = self._read("squeue", "-h", *filters, "-o", squeue_text.o_format(token))
        cap_text = self._read("squeue", "-h", *filters, "-O", squeue_text.cap_format(token))
        jobs = squeue_text.jobs_from_text(o_text, cap_text, token)
        if any(squeue_text.needs_reason(j) for j in jobs):
            jobs = self._resolve_reasons(jobs)
        return jobs

    def _resolve_reasons(self, jobs: List[Job]) -> List[Job]:
        """Jobs held by requeuehold, or by an admin since: only the JSON record says which, and on 22.05
        that is the whole job list (its JSON ignores -j; 23.02+ reads only those jobs). Read only while
        such a job exists (the guard releases it within seconds), with a timeout of its own: on 22.05
        under a flood it takes several seconds (70 MB at 10,000 jobs). If it fails, those jobs stay
        unresolved (``requeue_held`` false: not released this time, never wrongly) and the rest of the
        listing stands."""
        # 23.02+: those jobs' records only (-j works there)
        ids = [j.raw_id for j in jobs if squeue_text.needs_reason(j)]
        only = ["--states=all", "-j", ",".join(ids)] if self._json_filters() else []
        try:
            text = self.run("squeue", "--json", *only, timeout=max(60.0, 6 * self.timeout))
            exact = {j.raw_id: j for j in parse.jobs_from_json(text, "squeue --json")}
        except SlurmError:
            return jobs
        return [exact.get(j.raw_id, j) if squeue_text.needs_reason(j) else j for j in jobs]

    def list_jobs(self, node: Optional[str] = None, states: Optional[List[str]] = None) -> List[Job]:
        filters = self._filters(node, states, None) or self._unfiltered()
        jobs = self._jobs(filters, one_job=False)
        # squeue -w also matches pending jobs that asked for the node: filter_jobs keeps real allocations
        return filter_jobs(jobs, node, states)

    def _jobs(self, filters: List[str], one_job: bool) -> List[Job]:
        if job_read_format(self.version(), one_job) == JSON:
            return parse.jobs_from_json(self._read("squeue", "--json", *filters), "squeue --json")
        return self._text_jobs(filters)

    def get_job(self, job_id: str) -> Job:
        # --states=all (_filters): 23.02+ squeue applies its default state filter (24.11: `squeue --json -j
        # ID` of a job that just COMPLETED/FAILED lists no job at all)
        try:
            jobs = self._jobs(self._filters(None, None, [str(job_id)]), one_job=True)
        except SlurmNotFound:
            raise SlurmNotFound(f"job {job_id} not found") from None
        for job in jobs:
            if job.job_id == str(job_id) or job.raw_id == str(job_id):
                return job
        # An array's own id names its tasks: return the first task (squeue -j <array id> lists them all)
        for job in jobs:
            if job.array_job_id == str(job_id):
                return job
        raise SlurmNotFound(f"job {job_id} not found")

    def batch_script(self, job_id: str) -> str:
        # "-" writes to stdout (22.05 and later); root or the job's owner may read it
        return self._read("scontrol", "write", "batch_script", str(job_id), "-")

    def job_gpus(self, job_id: str, node: str, timeout: Optional[float] = None) -> List[int]:
        return parse.job_gpus_from_show_job(self.run("scontrol", "-d", "show", "job", str(job_id),
                                                     timeout=timeout), node)

    def job_state_history(self, job_id: str) -> Optional[List[str]]:
        # one line per run (-D: duplicates, i.e. every requeue), the allocation only (-X)
        try:
            out = self.run("sacct", "-n", "-P", "-X", "-D", "-j", str(job_id), "-o", "State")
        except SlurmError:  # not installed, "Slurm accounting storage is disabled", slurmdbd down...
            return None
        states = [ln.strip() for ln in out.splitlines() if ln.strip()]
        return states or None

    def show_config(self) -> Dict[str, str]:
        return parse.parse_show_config(self._read("scontrol", "show", "config"))

    def ping(self) -> bool:
        try:
            out = self.run("scontrol", "ping")
        except SlurmError:
            return False
        return " UP" in out

    # ---- writes --------------------------------------------------------------------------------------
    def _write(self, tool: str, *args: str) -> None:
        # Idempotent writes (node updates, job field updates) may be retried like reads.
        with_retries(lambda: self.run(tool, *args), self.retries)

    def drain(self, node: str, reason: str) -> None:
        self._write("scontrol", "update", f"nodename={node}", "state=drain", f"reason={reason}")

    def resume(self, node: str) -> None:
        self._write("scontrol", "update", f"nodename={node}", "state=resume")

    def set_reason(self, node: str, reason: str) -> None:
        self._write("scontrol", "update", f"nodename={node}", f"reason={reason}")

    def reboot(self, node: str, reason: str, asap: bool = True, nextstate: str = "resume") -> None:
        args = ["reboot"] + (["ASAP"] if asap else []) + [f"nextstate={nextstate}", f"reason={reason}", node]
        self.run("scontrol", *args)

    def requeue(self, job_id: str, hold: bool = False) -> None:
        # Not retried here: a requeue whose answer was lost may have happened; the caller decides
        # (a second requeue of a requeued job answers SlurmJobAlreadyPending).
        self.run("scontrol", "requeuehold" if hold else "requeue", str(job_id))

    def release(self, job_id: str) -> None:
        # Idempotent: releasing a job that is not held succeeds (observed on 22.05).
        self._write("scontrol", "release", str(job_id))

    def update_job(self, job_id: str, update: JobUpdate) -> None:
        fields = update.scontrol_fields()
        if not fields:
            return
        self._write("scontrol", "update", f"jobid={job_id}", *(f"{k}={v}" for k, v in fields.items()))

    def shrink_job(self, job_id: str, keep: List[str]) -> None:
        if not keep:
            raise SlurmError(f"job {job_id}: refusing to shrink to no node at all")
        # scontrol run from inside the job it resizes writes slurm_job_<id>_resize.{sh,csh} into its
        # working directory (the user's submit directory): not when it does not know it is that job.
        env = {k: v for k, v in self._env.items() if k not in ("SLURM_JOB_ID", "SLURM_JOBID")}
        with_retries(lambda: self.run("scontrol", "update", f"jobid={job_id}", f"NodeList={','.join(keep)}",
                                      env=env), self.retries)

    def job_steps(self, job_id: str) -> List[Tuple[str, str]]:
        steps = []
        for line in self._read("squeue", "-h", "--steps", f"--jobs={job_id}", "-o", "%i %j").splitlines():
            step, _, name = line.strip().partition(" ")
            if step:
                steps.append((step, name.strip()))
        return steps

    def signal_job(self, job_id: str, signal: str, batch: bool = False, full: bool = False) -> None:
        args = [f"--signal={signal}"]
        if batch:
            args.append("--batch")
        elif full:
            args.append("--full")
        self.run("scancel", *args, str(job_id))

    # ---- added for the guard's lost-prolog rule (last in the file: other branches edit the listings) ----
    def job_start_time(self, job_id: str) -> Optional[int]:
        """StartTime from ``scontrol -o show job ID``: one job, on every version (22.05's text listings lack
        it, its JSON ignores -j); None when unknown or ambiguous (``show_job``)."""
        from autoheal.slurm.show_job import start_time_from_show_job

        return start_time_from_show_job(self._read("scontrol", "-o", "show", "job", str(job_id)))
