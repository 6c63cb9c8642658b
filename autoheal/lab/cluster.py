"""A real multi-node Slurm cluster on one machine: munged, slurmctld, one ``slurmd -N`` per node.

Everything (config, state, sockets, logs, fake GPU state, kernel logs) lives under one directory, so
several labs can coexist. ``lab.json`` in that directory records each process by PID and start time;
``down`` stops exactly those processes.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Dict, List, Optional

from autoheal.errors import AutohealError
from autoheal.lab import procs
from autoheal.lab.slurmconf import LabLayout, render_gres_conf, render_slurm_conf

STATE_FILE = "lab.json"
APT_PACKAGES = ["slurmctld", "slurmd", "slurm-client", "munge", "slurmrestd"]


class LabError(AutohealError):
    """The lab could not be brought up, inspected or torn down."""


def default_dir() -> Path:
    """``$XDG_STATE_HOME/autoheal/lab`` (``~/.local/state/autoheal/lab``)."""
    base = os.environ.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"), ".local", "state")
    return Path(base) / "autoheal" / "lab"


def _free_ports(n: int) -> List[int]:
    socks, ports = [], []
    try:
        for _ in range(n):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            socks.append(s)
            ports.append(s.getsockname()[1])
    finally:
        for s in socks:
            s.close()
    return ports


def ensure_slurm_installed(install: bool = True) -> None:
    """Install Debian's Slurm and munge with apt when missing (root only), else say what to run."""
    missing = [b for b in ("slurmctld", "slurmd", "scontrol", "munged") if not _which(b)]
    if not missing:
        return
    if not install:
        raise LabError(f"missing {', '.join(missing)}: run `apt-get install {' '.join(APT_PACKAGES)}`")
    if os.geteuid() != 0:
        raise LabError(f"missing {', '.join(missing)} and not root: run "
                       f"`sudo apt-get install {' '.join(APT_PACKAGES)}` first")
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    for argv in (["apt-get", "update", "-q"], ["apt-get", "install", "-y", "-q", *APT_PACKAGES]):
        res = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=900)
        if res.returncode != 0:
            raise LabError(f"{' '.join(argv)} failed: {res.stderr.strip()[-500:]}")


def _which(name: str) -> Optional[str]:
    return shutil.which(name) or next((str(p) for d in ("/usr/sbin", "/usr/bin", "/sbin")
                                       if (p := Path(d, name)).exists()), None)


class Lab:
    """One lab cluster rooted at ``root``."""

    def __init__(self, root: Optional[Path] = None):
        self.root = Path(root or default_dir()).resolve()

    # ---- persisted state -------------------------------------------------------------------------
    @property
    def state_path(self) -> Path:
        return self.root / STATE_FILE

    def load_state(self) -> Optional[dict]:
        try:
            return json.loads(self.state_path.read_text())
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as exc:
            raise LabError(f"{self.state_path}: unreadable lab state: {exc}") from None

    def _save_state(self, state: dict) -> None:
        tmp = self.state_path.with_suffix(".tmp")
        tmp.write_text(json.dumps(state, indent=2, sort_keys=True))
        os.replace(tmp, self.state_path)

    def layout(self) -> LabLayout:
        st = self.load_state()
        if not st:
            raise LabError(f"no lab at {self.root}: run `autoheal lab up --dir {self.root}`")
        lay = st["layout"]
        return LabLayout(root=Path(lay["root"]), nodes=lay["nodes"], spares=lay["spares"], gpus=lay["gpus"],
                         ctld_port=lay["ctld_port"], node_ports=lay["node_ports"], rest_port=lay["rest_port"],
                         cluster_name=lay["cluster_name"], extra_conf=lay.get("extra_conf", []))

    def records(self) -> Dict[str, procs.ProcRecord]:
        st = self.load_state() or {}
        return {name: procs.ProcRecord(**rec) for name, rec in st.get("procs", {}).items()}

    def _record(self, rec: procs.ProcRecord) -> None:
        st = self.load_state() or {}
        st.setdefault("procs", {})[rec.name] = rec.to_dict()
        self._save_state(st)

    def _forget(self, name: str) -> None:
        st = self.load_state() or {}
        st.get("procs", {}).pop(name, None)
        self._save_state(st)

    def env(self) -> Dict[str, str]:
        """Environment a shell (or a test) needs to use this lab's Slurm and autoheal."""
        lay = self.layout()
        env = {"SLURM_CONF": str(lay.slurm_conf), "AUTOHEAL_CONFIG": str(lay.autoheal_conf),
               "AUTOHEAL_LAB_DIR": str(self.root)}
        st = self.load_state() or {}
        if st.get("nvml_lib_dir"):
            env["AUTOHEAL_LAB_NVML_LIB_DIR"] = st["nvml_lib_dir"]
        if st.get("kubeconfig"):
            env["KUBECONFIG"] = st["kubeconfig"]
        return env

    def slurm_env(self) -> Dict[str, str]:
        return dict(os.environ, **self.env())

    # ---- up / down --------------------------------------------------------------------------------
    def up(self, nodes: int = 3, gpus: int = 8, spares: int = 1, slurm_defaults: bool = False,
           hooks: bool = True, xid_watch: bool = True, extra_conf: Optional[List[str]] = None,
           install: bool = True, wait: float = 60.0, kube: bool = False, spare_delay: float = 1.0) -> dict:
        """Bring the lab up (idempotent: a lab already up with every process alive is left alone).

        ``slurm_defaults`` leaves out the recommended slurm.conf fragment (to compare with Slurm's
        defaults); ``hooks`` wires HealthCheckProgram/Prolog/Epilog to autoheal's hooks and
        ``xid_watch`` runs one ``autoheal xid-watch`` per node, each when that part is installed.
        ``kube`` adds the fake Kubernetes API (Nodes + slurmd pods), ``autoheal sync`` with remediation
        and the spare pool (``autoheal.lab.kube``), which fulfils replacements after ``spare_delay`` s.
        """
        from autoheal.lab import gpus as labgpus
        from autoheal.lab import wiring

        st = self.load_state()
        if st and st.get("procs"):
            dead = [n for n, r in self.records().items() if not procs.is_alive(r)]
            if not dead:
                return self.status()
            # Partly dead (a process killed from outside, a reboot): start over cleanly.
            self.down()
        ensure_slurm_installed(install)
        names = [f"gpu{i}" for i in range(1, nodes + 1)]
        spare_names = [f"spare{i}" for i in range(1, spares + 1)]
        ports = _free_ports(2 + len(names) + len(spare_names))
        lay = LabLayout(root=self.root, nodes=names, spares=spare_names, gpus=gpus, ctld_port=ports[0],
                        rest_port=ports[1], node_ports=dict(zip(names + spare_names, ports[2:])),
                        extra_conf=list(extra_conf or []))
        for sub in ("etc", "state", "spool", "run", "log", "munge", "dev", "gpus", "kmsg", "hooks", "journal"):
            (self.root / sub).mkdir(parents=True, exist_ok=True)
        for i in range(gpus):
            (self.root / "dev" / f"nvidia{i}").touch()
        for name in lay.all_nodes:
            lay.kernel_log(name).touch()
        state = {"layout": {**asdict(lay), "root": str(lay.root)}, "procs": {}, "started": time.time(),
                 "slurm_defaults": slurm_defaults}
        self._save_state(state)
        lib_dir = labgpus.setup_gpus(self) or ""
        hook_lines = wiring.write_hook_wrappers(lay, lib_dir) if hooks else {}
        version = "%d.%02d" % _slurm_version()
        fragment = [] if slurm_defaults else wiring.drop_keys(
            wiring.recommended_fragment(version, existing={"AuthInfo": f"socket={lay.munge_socket}"}), hook_lines)
        self._write_configs(lay, hook_lines, fragment)
        self._write_jwt_key(lay)
        self._start_munge(lay)
        self._start_slurmctld(lay)
        for name in lay.all_nodes:
            if name not in lay.spares:
                self.start_slurmd(name)
        self.wait_nodes_up(lay.nodes, timeout=wait)
        if xid_watch and wiring.xid_watch_available():
            for name in lay.nodes:
                self.start_node_daemon(f"xid-watch-{name}", name, wiring.xid_watch_argv(name))
        if kube:
            from autoheal.lab import kube as labkube

            labkube.start(self, spare_delay=spare_delay)
        return self.status()

    def start_node_daemon(self, proc_name: str, node: str, argv: List[str]) -> procs.ProcRecord:
        """Run a per-node daemon with that node's environment (fake GPUs, kernel log, config)."""
        env = self._daemon_env(self.layout())
        env.update(self.node_env(node))
        env["SLURMD_NODENAME"] = node
        old = self.records().get(proc_name)
        if old and procs.is_alive(old):
            procs.stop(old)
        rec = procs.spawn(proc_name, argv, self.root / "log" / f"{proc_name}.log", env=env)
        self._record(rec)
        return rec

    def _write_configs(self, lay: LabLayout, hooks: Dict[str, str], fragment: List[str]) -> None:
        lay.slurm_conf.write_text(render_slurm_conf(lay, hooks, fragment))
        lay.path("etc", "gres.conf").write_text(render_gres_conf(lay))
        if not lay.autoheal_conf.exists():
            lay.autoheal_conf.write_text(render_autoheal_toml(lay))

    def _write_jwt_key(self, lay: LabLayout) -> None:
        key = lay.path("etc", "jwt.key")
        if not key.exists():
            fd = os.open(key, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "wb") as fh:
                fh.write(os.urandom(32).hex().encode())

    def start_slurmrestd(self, auth: str = "local") -> dict:
        """Start slurmrestd: ``local`` auth on a unix socket, or ``jwt`` on a loopback TCP port.

        Returns {"url": ..., "user": ..., "token": ...} for the REST backend (token only for jwt).
        """
        lay = self.layout()
        version = _slurm_version()
        plugin = "openapi/slurmctld" if version >= (23, 11) else "openapi/v0.0.%d" % {
            (22, 5): 38, (23, 2): 39}.get(version[:2], 38)
        env = self._daemon_env(lay)
        env["SLURMRESTD_SECURITY"] = "disable_user_check"
        name = f"slurmrestd-{auth}"
        if auth == "jwt":
            env["SLURM_JWT"] = "daemon"
            listen = f"127.0.0.1:{lay.rest_port}"
            url = f"http://{listen}"
            argv = [_which("slurmrestd") or "slurmrestd", "-f", str(lay.slurm_conf), "-s", plugin,
                    "-a", "rest_auth/jwt", listen]
        else:
            sock = lay.path("run", "slurmrestd.sock")
            url = f"unix:{sock}"
            argv = [_which("slurmrestd") or "slurmrestd", "-f", str(lay.slurm_conf), "-s", plugin,
                    "-a", "rest_auth/local", f"unix:{sock}"]
        old = self.records().get(name)
        if old and procs.is_alive(old):
            procs.stop(old)
        if auth != "jwt":
            # a socket file left by an earlier slurmrestd would pass the wait below before this one listens
            lay.path("run", "slurmrestd.sock").unlink(missing_ok=True)
        rec = procs.spawn(name, argv, lay.path("log", f"{name}.log"), env=env)
        self._record(rec)
        info = {"url": url, "user": "", "token": ""}
        if auth == "jwt":
            out = subprocess.run([_which("scontrol") or "scontrol", "token", "username=root", "lifespan=3600"],
                                 env=self._daemon_env(lay), capture_output=True, text=True, timeout=10)
            if out.returncode != 0:
                raise LabError(f"scontrol token failed: {out.stderr.strip()}")
            info.update(user="root", token=out.stdout.strip().split("=", 1)[-1])
            _wait_for(lambda: _port_open(lay.rest_port), 15, "slurmrestd to listen", rec)
        else:
            _wait_for(lambda: lay.path("run", "slurmrestd.sock").exists(), 15, "slurmrestd socket", rec)
        return info

    def _start_munge(self, lay: LabLayout) -> None:
        key = lay.path("munge", "munge.key")
        if not key.exists():
            key.write_bytes(os.urandom(1024))
            key.chmod(0o400)
        munged = _which("munged") or "munged"
        argv = [munged, "-F", "--force", f"--socket={lay.munge_socket}", f"--key-file={key}",
                f"--pid-file={lay.path('munge', 'munged.pid')}", f"--seed-file={lay.path('munge', 'seed')}",
                f"--log-file={lay.path('log', 'munged.log')}"]
        rec = procs.spawn("munged", argv, lay.path("log", "munged.out"))
        self._record(rec)
        _wait_for(lambda: lay.munge_socket.exists(), 10, "munged socket", rec)

    def _start_slurmctld(self, lay: LabLayout) -> None:
        argv = [_which("slurmctld") or "slurmctld", "-D", "-i", "-f", str(lay.slurm_conf)]
        rec = procs.spawn("slurmctld", argv, lay.path("log", "slurmctld.out"), env=self._daemon_env(lay))
        self._record(rec)
        _wait_for(lambda: self._ping(lay), 30, "slurmctld to answer", rec)

    def _daemon_env(self, lay: LabLayout) -> Dict[str, str]:
        return dict(os.environ, SLURM_CONF=str(lay.slurm_conf))

    def _ping(self, lay: LabLayout) -> bool:
        try:
            res = subprocess.run([_which("scontrol") or "scontrol", "ping"], env=self._daemon_env(lay),
                                 capture_output=True, text=True, timeout=5)
        except subprocess.TimeoutExpired:
            return False
        return res.returncode == 0 and " UP" in res.stdout

    def start_slurmd(self, node: str) -> procs.ProcRecord:
        """Start (or restart) one node's slurmd; the lab's "reboot" and spare bring-up use this."""
        lay = self.layout()
        name = f"slurmd-{node}"
        old = self.records().get(name)
        if old and procs.is_alive(old):
            procs.stop(old)
        env = self._daemon_env(lay)
        env.update(self.node_env(node))
        argv = [_which("slurmd") or "slurmd", "-D", "-N", node, "-f", str(lay.slurm_conf)]
        rec = procs.spawn(name, argv, lay.path("log", f"slurmd-{node}.out"), env=env)
        self._record(rec)
        return rec

    def stop_slurmd(self, node: str) -> bool:
        rec = self.records().get(f"slurmd-{node}")
        if not rec:
            return False
        stopped = procs.stop(rec)
        self._forget(rec.name)
        return stopped

    def node_env(self, node: str) -> Dict[str, str]:
        """What a process "on" ``node`` sees: its fake GPUs and its kernel log."""
        lay = self.layout()
        env = {"AUTOHEAL_FAKE_NVML_STATE": str(lay.gpu_state(node)), "AUTOHEAL_NODE": node,
               "AUTOHEAL_CONFIG": str(lay.autoheal_conf)}
        st = self.load_state() or {}
        if st.get("nvml_lib_dir"):
            env["LD_LIBRARY_PATH"] = st["nvml_lib_dir"]
        return env

    def wait_nodes_up(self, nodes: List[str], timeout: float = 60.0) -> None:
        """Wait until every node has registered (no longer UNKNOWN / NOT_RESPONDING)."""
        lay = self.layout()
        deadline = time.monotonic() + timeout
        pending = list(nodes)
        while time.monotonic() < deadline:
            states = self._node_states(lay)
            pending = [n for n in nodes if n not in states or
                       any(bad in states[n] for bad in ("UNKNOWN", "NOT_RESPONDING", "DOWN", "*"))]
            if not pending:
                return
            time.sleep(0.3)
        raise LabError(f"nodes {', '.join(pending)} did not come up in {timeout:.0f}s; "
                       f"see {lay.path('log')}/slurmd-<node>.log")

    def _node_states(self, lay: LabLayout) -> Dict[str, str]:
        try:
            res = subprocess.run([_which("sinfo") or "sinfo", "-N", "-h", "-o", "%N %T"],
                                 env=self._daemon_env(lay), capture_output=True, text=True, timeout=10)
        except subprocess.TimeoutExpired:
            return {}
        out = {}
        for line in res.stdout.splitlines():
            parts = line.split()
            if len(parts) == 2:
                out[parts[0]] = parts[1].upper()
        return out

    def down(self) -> List[str]:
        """Stop every recorded process (slurmd first, munged last). Returns the names stopped.

        Jobs still running are killed first: a slurmstepd runs in its own session and outlives slurmd,
        so its job's processes would keep running (seen on 24.11 when a drill's final scancel raced the
        slurmd shutdown; with KillWait=120 a cancel alone takes two minutes to reach SIGKILL)."""
        self._kill_job_processes()
        recs = self.records()
        order = sorted(recs, key=lambda n: (0 if n.startswith(("slurmd-", "xid-watch", "sync", "kube",
                                                                   "spare-pool", "slurmrestd")) else
                                            1 if n == "slurmctld" else 2, n))
        stopped = []
        for name in order:
            if procs.stop(recs[name]):
                stopped.append(name)
            self._forget(name)
        return stopped

    def _kill_job_processes(self) -> None:
        """SIGKILL, by PID, the lab's slurmstepd processes, everything they started, and job processes
        already orphaned from them (an srun whose batch shell died of the cancel's SIGTERM)."""
        st = self.load_state() or {}
        if not st.get("layout"):
            return
        pids = set(procs.job_processes(str(self.layout().slurm_conf)))
        for pid in procs.step_daemons(self.root):
            pids.add(pid)
            pids.update(procs.descendants(pid))
        pids.difference_update(procs.ancestors(os.getpid()))
        for pid in sorted(pids):
            procs.kill_pid(pid)

    # ---- status -----------------------------------------------------------------------------------
    def status(self) -> dict:
        """Every lab process with pid and liveness, every node with its Slurm state and files."""
        st = self.load_state()
        if not st:
            return {"dir": str(self.root), "up": False, "processes": [], "nodes": []}
        lay = self.layout()
        recs = self.records()
        plist = [{"name": n, "pid": r.pid, "alive": procs.is_alive(r), "log": r.log} for n, r in sorted(recs.items())]
        states = self._node_states(lay) if recs.get("slurmctld") and procs.is_alive(recs["slurmctld"]) else {}
        nodes = [{"name": n, "spare": n in lay.spares, "state": states.get(n, "unknown"),
                  "gpu_state_file": str(lay.gpu_state(n)), "kernel_log": str(lay.kernel_log(n)),
                  "slurmd_port": lay.node_ports[n]} for n in lay.all_nodes]
        up = bool(plist) and all(p["alive"] for p in plist)
        return {"dir": str(self.root), "up": up, "slurm_conf": str(lay.slurm_conf),
                "autoheal_conf": str(lay.autoheal_conf), "processes": plist, "nodes": nodes}


def _slurm_version() -> tuple:
    # slurmctld -V needs no slurm.conf (scontrol --version does, and tries DNS SRV lookups without one)
    res = subprocess.run([_which("slurmctld") or "slurmctld", "-V"], capture_output=True, text=True, timeout=10)
    import re

    m = re.search(r"(\d+)\.(\d+)", res.stdout)
    return (int(m.group(1)), int(m.group(2))) if m else (0, 0)


def _port_open(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.2)
        return s.connect_ex(("127.0.0.1", port)) == 0


def _wait_for(pred, timeout: float, what: str, rec: procs.ProcRecord) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return
        if not procs.is_alive(rec):
            raise LabError(f"{rec.name} exited while waiting for {what}; see {rec.log}: "
                           f"{_tail(rec.log)}")
        time.sleep(0.1)
    raise LabError(f"timed out after {timeout:.0f}s waiting for {what}; see {rec.log}: {_tail(rec.log)}")


def _tail(path: str, n: int = 3) -> str:
    try:
        lines = Path(path).read_text(errors="replace").strip().splitlines()
    except OSError:
        return ""
    return " | ".join(lines[-n:])


def render_autoheal_toml(lay: LabLayout) -> str:
    """The autoheal config every lab process uses (journal, node state and kernel logs under the lab
    dir). Only keys the installed config schema knows are written, so parts can add settings freely."""
    from autoheal.config import Config, describe

    wanted = {
        "slurm": {"slurm_conf": str(lay.slurm_conf), "timeout": 10.0},
        "journal": {"path": str(lay.path("journal", "journal.jsonl"))},
        "hooks": {"state_dir": f"{lay.root}/nodestate/{{node}}", "kernel_log": f"{lay.root}/kmsg/{{node}}.log",
                  "expected_gpus": lay.gpus, "dcgm_mapping_dir": f"{lay.root}/dcgm/{{node}}",
                  "reset_command": [sys.executable, "-m", "autoheal.lab.cli", "gpu-reset", "--dir", str(lay.root),
                                    "--node", "{node}", "--gpu", "{gpu}"],
                  "resume_cooldown": 5.0, "textfile_dir": f"{lay.root}/metrics/{{node}}",
                  # a short grace window and NVML budget keep lab drills and tests quick
                  "grace_seconds": 10.0, "nvml_timeout": 3.0},
        "sync": {"slurm_resync_seconds": 2.0, "lease_duration_seconds": 5.0, "metrics_port": 0,
                 # the lab's sync replaces nodes: NodeReplacement CRs fulfilled by the spare pool
                 "enabled_steps": ["slurm-to-pods", "health-to-nodes", "nodes-to-slurm", "remediate"],
                 "replacement_action": "custom-resource", "remediation_grace_seconds": 60.0,
                 "remediation_drain_timeout_seconds": 30.0, "remediation_replace_timeout_seconds": 90.0,
                 # a 3-node lab: 50% lets one node at a time be replaced (25% of 3 would be none)
                 "breaker_max_concurrent": 2, "breaker_max_percent": 50.0, "breaker_rearm_percent": 34.0,
                 "breaker_cooldown_seconds": 30.0},
    }
    known = {key for key, _doc, _default in describe(Config)}
    lines = ["# Generated by `autoheal lab up`."]
    for section, values in wanted.items():
        body = [f"{k} = {json.dumps(v)}" for k, v in values.items() if f"{section}.{k}" in known]
        if body:
            lines += ["", f"[{section}]", *body]
    return "\n".join(lines) + "\n"
