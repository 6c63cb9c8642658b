"""Small helpers shared by the test modules (the tests folder is on sys.path)."""

from __future__ import annotations

import contextlib
import dataclasses
import time


def wait_text(path, pattern: str, timeout: float, count: int = 1) -> list:
    """Wait until ``pattern`` matches ``count`` times in the file ``path``; return the matches."""
    import re

    rx = re.compile(pattern, re.M)
    deadline = time.monotonic() + timeout
    text = ""
    while time.monotonic() < deadline:
        text = path.read_text(errors="replace") if path.exists() else ""
        found = rx.findall(text)
        if len(found) >= count:
            return found
        time.sleep(0.3)
    raise AssertionError(f"{pattern!r} x{count} not in {path} within {timeout}s; output:\n{text[-3000:]}")


def wait_for(pred, timeout: float = 10.0, what: str = "condition", step: float = 0.1):
    """Poll ``pred`` until it returns something truthy (returned) or fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        last = pred()
        if last:
            return last
        time.sleep(step)
    raise AssertionError(f"timed out after {timeout}s waiting for {what} (last: {last!r})")


def xid_judged(root, node: str, xid: int, gpu: int, since: float) -> tuple:
    """(sources, when) of xid-watch's judgements of ``xid`` on ``gpu`` since ``since`` (wall clock), read
    from its dedupe records in the node state (``recent_xids``): the sources (``nvml``, ``kmsg``/``file``)
    whose reports it judged (the other source's copy of one XID is added to that record's ``sources``) and
    the time of the newest record (0 when none)."""
    seen: set = set()
    newest = 0.0
    for r in node_state(root, node).get("recent_xids") or []:
        if r.get("xid") == xid and r.get("gpu") == gpu and float(r.get("time") or 0) >= since:
            seen.update(r.get("sources") or [])
            newest = max(newest, float(r["time"]))
    return seen, newest


def wait_xid_judged_from_both_sources(root, node: str, xid: int, gpu: int, since: float,
                                      timeout: float = 30.0) -> set:
    """Wait until xid-watch has judged every report of one XID injected at ``since`` that it will get: the
    kernel-log line, and the NVML event, or, when NVML does not tell it (an event set registered after the
    event, or without the GPU, never delivers it: as with the real driver), a health poll of xid-watch's
    (same process, same NVML) begun over a second after the kernel-log copy was judged, by when its event
    thread, which waits on NVML all the time, would have handed a pending event on. After that nothing is
    in flight that could still act on the XID."""
    def settled():
        seen, when = xid_judged(root, node, xid, gpu, since)
        if not seen & {"kmsg", "file"}:
            return None
        if "nvml" in seen or xid_watch_metric(root, node, "health_poll_started_timestamp_seconds") > when + 1.0:
            return seen
        return None

    try:
        return wait_for(settled, timeout, f"xid {xid} on GPU {gpu} of {node} judged from every source", step=0.2)
    except AssertionError as exc:
        raise AssertionError(f"{exc}; recent_xids: {node_state(root, node).get('recent_xids')}") from None


def xid_watch_metric(root, node: str, name: str) -> float:
    """One value xid-watch last wrote into its textfile (``<root>/metrics/<node>``: ``autoheal_xid_watch_``
    + ``name``, the node's series); 0 when there is none yet."""
    import re
    from pathlib import Path

    path = Path(root) / "metrics" / node / "autoheal_xid_watch.prom"
    try:
        text = path.read_text()
    except OSError:
        return 0.0
    m = re.search(rf"^autoheal_xid_watch_{re.escape(name)}\{{node=\"[^\"]*\"\}} (\S+)$", text, re.M)
    return float(m.group(1)) if m else 0.0


def xid_watch_beat(root, node: str) -> float:
    """The heartbeat xid-watch last wrote into its textfile (wall clock, 0 when none). Its main loop writes
    it right after a job-side step (housekeeping, at most every second)."""
    return xid_watch_metric(root, node, "heartbeat_timestamp_seconds")


def wait_xid_watch_looked_again(root, node: str, after: float, timeout: float = 30.0) -> float:
    """Wait until xid-watch has run its job side again after ``after`` (wall clock, e.g. the time of a
    journal record it wrote): its main loop writes the heartbeat right after each housekeeping job-side
    step, so of two distinct heartbeats later than ``after`` the second follows a step that began after
    ``after`` (the first may be the write that ends the very step that acted then). Returns that one."""
    beats: set = set()

    def second() -> float:
        b = xid_watch_beat(root, node)
        if b > after:
            beats.add(b)
        return max(beats) if len(beats) >= 2 else 0.0

    return wait_for(second, timeout, f"xid-watch on {node} to look again after {after:.3f}", step=0.2)


def rfc3339(text: str) -> float:
    """An RFC 3339 time as Go writes it (``2026-12-03T14:05:01.123456789Z``, nanoseconds, or an offset) as
    epoch seconds."""
    import datetime
    import re

    m = re.fullmatch(r"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(?:\.(\d+))?(Z|[+-]\d\d:\d\d)", text.strip())
    if not m:
        raise ValueError(f"not an RFC 3339 time: {text!r}")
    zone = "+00:00" if m.group(3) == "Z" else m.group(3)
    base = datetime.datetime.fromisoformat(m.group(1) + zone).timestamp()
    return base + (float("0." + m.group(2)) if m.group(2) else 0.0)


def node_state(root, node: str):
    """A lab node's state (``<root>/nodestate/<node>``) read as the hooks read it (``hooks.state.load``:
    every key present, older layouts upgraded); empty before the first hook wrote it."""
    from pathlib import Path

    from autoheal.hooks.state import NodeState

    return NodeState(str(Path(root) / "nodestate" / node)).read()


_FINAL_STATES = {"CANCELLED", "COMPLETED", "FAILED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "PREEMPTED",
                 "BOOT_FAIL", "DEADLINE"}


def cancel_job(env, job: str, timeout: float = 150.0) -> None:
    """Cancel ``job`` for good and wait until Slurm says so.

    One ``scancel`` is not enough right after a requeue: while the requeued job is still COMPLETING,
    Slurm may answer "Job/step already completing" and then put it back to PENDING, and once its node
    is resumed it runs again (``sleep 600``) and holds that node through the tests that follow (the
    cascade of one CI run). So scancel is repeated until the job is in a final state or gone."""
    import subprocess

    deadline = time.monotonic() + timeout
    state = "?"
    while time.monotonic() < deadline:
        subprocess.run(["scancel", str(job)], env=env, capture_output=True, timeout=20)
        out = subprocess.run(["scontrol", "-o", "show", "job", str(job)], env=env, capture_output=True,
                             text=True, timeout=20)
        if out.returncode != 0 and "Invalid job id" in (out.stderr or ""):
            return  # purged: gone for good
        fields = dict(tok.split("=", 1) for tok in out.stdout.split() if "=" in tok)
        state = fields.get("JobState", "?")
        if state in _FINAL_STATES:
            return
        time.sleep(0.5)
    raise AssertionError(f"job {job} still {state} {timeout}s after scancel")


def wait_node_idle(env, node: str, timeout: float = 60.0) -> None:
    """Wait until ``node`` is plain IDLE; on timeout, fail with what Slurm says about it and its jobs."""
    import subprocess

    def line() -> str:
        return subprocess.run(["scontrol", "-o", "show", "node", node], env=env, capture_output=True, text=True,
                              timeout=20).stdout

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if "State=IDLE " in line():
            return
        time.sleep(0.2)
    jobs = subprocess.run(["squeue", "-h", "-w", node, "-o", "%i %T %r %j"], env=env, capture_output=True,
                          text=True, timeout=20).stdout
    raise AssertionError(f"{node} not idle after {timeout}s: {line().strip()} | jobs: {jobs.strip() or 'none'}")


def cancel_all_jobs(env) -> None:
    """Cancel every job left in a shared lab, so one test's leftovers never hold nodes the next one needs."""
    import subprocess

    out = subprocess.run(["squeue", "-h", "-o", "%i"], env=env, capture_output=True, text=True, timeout=20)
    for job in sorted({j.split("_")[0] for j in out.stdout.split()}):
        cancel_job(env, job)


def wait_epilogs_done(env, node: str, timeout: float = 60.0) -> None:
    """Wait until no job is COMPLETING on ``node`` (its epilogs have ended). A test that resumes a node
    while the epilog of the job the fault killed still runs gets that epilog's exit 1 after the resume:
    Slurm then drains the node "Epilog error", a reason autoheal rightly never resumes (seen in CI).
    Best effort: a node whose slurmd is gone stays COMPLETING; the caller's own wait says what holds it."""
    import subprocess

    def completing() -> bool:
        out = subprocess.run(["scontrol", "-o", "show", "node", node], env=env, capture_output=True, text=True,
                             timeout=20).stdout
        return "COMPLETING" in out

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and completing():
        time.sleep(0.2)


@contextlib.contextmanager
def module_lab(tmp_path_factory, name: str, **up):
    """A lab for one test module (``Lab.up(install=False, **up)``), torn down by PID at the end, also when
    its start fails half way (the daemons it started then are still stopped)."""
    from conftest import _require_slurm

    from autoheal_lab.cluster import Lab

    _require_slurm()
    lab = Lab(tmp_path_factory.mktemp(name))
    try:
        lab.up(install=False, **up)
        yield lab
    finally:
        lab.down()


class JobLab:
    """A running module lab with what the job tests use: its layout, Slurm env, CLI adapter, journal."""

    def __init__(self, lab):
        from autoheal.config import load_config
        from autoheal.journal import Journal
        from autoheal.slurm.cli_backend import CliSlurm

        self.lab = lab
        self.layout = lab.layout()
        self.env = lab.slurm_env()
        self.slurm = CliSlurm(slurm_conf=str(self.layout.slurm_conf), env=self.env)
        self.journal = Journal(load_config(self.layout.autoheal_conf).journal.path)

    def clear_node(self, node: str) -> None:
        """``node``'s fake GPUs healthy, the hooks' fault record cleared (else the next prolog sees the
        XID again) and Slurm's drain or DOWN resumed."""
        import subprocess
        import sys

        from autoheal_lab.gpus import inject

        for gpu in range(self.layout.gpus):
            inject(self.lab, node, gpu, "clear")
        subprocess.run([sys.executable, "-m", "autoheal.cli.main", "check", "--clear-faults", "--node", node],
                       env=dict(self.env, **self.lab.node_env(node)), capture_output=True, timeout=30)
        n = self.slurm.get_node(node)
        if n.drain or n.down:
            self.slurm.resume(node)


class FakeSlurm:
    """The SlurmAdapter methods the sbatch runner uses, recording writes (the runner's unit tests)."""

    def __init__(self, job, nodes, node_script=None):
        self.job = job
        self.nodes = list(nodes)
        self.node_script = list(node_script or [])  # node lists returned by the next list_nodes calls
        self.calls = []

    def get_job(self, job_id):
        return self.job

    def list_nodes(self):
        if self.node_script:
            self.nodes = self.node_script.pop(0)
        return self.nodes

    def job_steps(self, job_id):
        return [(f"{job_id}.batch", "batch"), (f"{job_id}.extern", "extern"), (f"{job_id}.0", "autoheal-memtier"),
                (f"{job_id}.1", "python")]

    def signal_job(self, job_id, sig, batch=False, full=False):
        self.calls.append(("signal", job_id, sig, batch, full))

    def requeue(self, job_id, hold=False):
        self.calls.append(("requeuehold" if hold else "requeue", job_id))
        self.job = dataclasses.replace(self.job, state="PENDING", restart_count=self.job.restart_count + 1)

    def release(self, job_id):
        self.calls.append(("release", job_id))

    def update_job(self, job_id, update):
        fields = update.scontrol_fields()
        self.calls.append(("update", job_id, fields))
        if "ExcNodeList" in fields:
            self.job = dataclasses.replace(self.job, excluded_nodes=tuple(fields["ExcNodeList"].split(",")))

    def set_job_comment(self, job_id, comment):
        self.calls.append(("comment", job_id, comment))
        self.job = dataclasses.replace(self.job, comment=comment)

    def set_excluded_nodes(self, job_id, nodes):
        from autoheal.slurm.model import JobUpdate

        self.update_job(job_id, JobUpdate(excluded_nodes=tuple(nodes)))


def helm_or_skip() -> str:
    """The lab's helm (``lab/kube-tools/build.sh`` builds it once per machine; `./dev test` runs that first),
    or one on PATH; skips where neither is there, except under CI, where it must be."""
    import os
    import shutil

    import pytest

    from autoheal_lab import controlplane

    built = controlplane.cached_bindir() / "helm"
    found = str(built) if os.access(built, os.X_OK) else shutil.which("helm")
    if not found:
        if os.environ.get("CI"):
            pytest.fail(f"CI must have helm: {built} is missing (lab/kube-tools/build.sh builds it)")
        pytest.skip("helm is not built (lab/kube-tools/build.sh builds it)")
    return found


class WebhookRecorder:
    """A local webhook endpoint (a real HTTP server on loopback) that keeps every JSON body posted to it."""

    def __init__(self):
        import http.server
        import json
        import threading

        self.bodies = []
        hook = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self):
                hook.bodies.append(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/services/T/B/SECRET"

    def events(self):
        return [b["autoheal"]["event"] for b in self.bodies]

    def close(self):
        self.server.shutdown()
        self.server.server_close()
