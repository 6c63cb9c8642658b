"""A real multi-node Slurm cluster on one machine: munged, slurmctld, one ``slurmd -N`` per node.

Everything (config, state, sockets, logs, fake GPU state, kernel logs) lives under one directory, so
several labs can coexist. ``lab.json`` in that directory records each process by PID and start time;
``down`` stops exactly those processes.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import pwd
import shutil
import socket
import subprocess
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Dict, Iterator, List, Optional

from autoheal.errors import AutohealError
from autoheal_lab import procs
from autoheal_lab.slurmconf import LabLayout, render_gres_conf, render_slurm_conf

STATE_FILE = "lab.json"
#: ``down`` stops processes in this order (0: every client first), each while what it talks to still runs.
_STOP_ORDER = {"kube-api": 1, "kube-api-faults": 1, "kube-controller-manager": 1, "kube-apiserver": 2, "etcd": 3,
               "slurmctld": 4, "munged": 5}
#: Directories every lab has (besides the state ones in ``autoheal_lab.cleanup.STATE_DIRS``).
LAB_DIRS = ("etc", "state", "spool", "run", "log", "munge", "dev", "gpus", "kmsg", "hooks", "journal")
STATE_ONLY_DIRS = ("nodestate", "metrics", "dcgm", "kube", "drill", "lib")
APT_PACKAGES = ["slurmctld", "slurmd", "slurm-client", "munge", "slurmrestd"]
# From 25.11 on slurmrestd refuses root and SlurmUser (see Lab._unprivileged_restd): it runs as this account
RESTD_UNPRIVILEGED_SINCE = (25, 11)
RESTD_ACCOUNT = "slurm"


def stop_order(names) -> List[str]:
    """The lab's processes in the order ``Lab.down`` stops them: clients before what they talk to."""
    return sorted(names, key=lambda n: (_STOP_ORDER.get(n, 0), n))


class LabError(AutohealError):
    """The lab could not be brought up, inspected or torn down."""


def default_dir() -> Path:
    """``$XDG_STATE_HOME/lab/autoheal_lab`` (``~/.local/state/lab/autoheal_lab``)."""
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


#: The character-device major number of NVIDIA's GPU device files (/dev/nvidia<minor>).
NVIDIA_MAJOR = 195


def make_gpu_device(path: Path, minor: int) -> None:
    """The lab's GPU device file: a character device (195, minor) like /dev/nvidia<minor>. Slurm (22.05)
    puts a GRES into the step's CUDA_VISIBLE_DEVICES / SLURM_STEP_GPUS only when its gres.conf ``File=``
    is a character device; no driver sits behind 195 on a lab machine, so opening it fails (nothing
    does) and a device cgroup allowing or denying it touches no real device."""
    import stat

    want = os.makedev(NVIDIA_MAJOR, minor)
    try:
        st = os.lstat(path)
        if stat.S_ISCHR(st.st_mode) and st.st_rdev == want:
            return
        path.unlink()  # a regular placeholder file from an older lab
    except FileNotFoundError:
        pass
    try:
        os.mknod(path, stat.S_IFCHR | 0o666, want)
    except PermissionError:  # not root: Slurm still indexes a plain file, it just sets no GPU variables
        path.touch()


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
        tmp = self.state_path.with_name(f".{STATE_FILE}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(state, indent=2, sort_keys=True))
        os.replace(tmp, self.state_path)

    @contextlib.contextmanager
    def edit_state(self) -> Iterator[dict]:
        """Read, change and write lab.json under a lock: the spare pool and the lab's reboot program
        record processes from their own processes while ``lab up`` or a test records its own."""
        self.root.mkdir(parents=True, exist_ok=True)
        with open(self.root / ".lab.lock", "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            st = self.load_state() or {}
            yield st
            self._save_state(st)

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
        with self.edit_state() as st:
            st.setdefault("procs", {})[rec.name] = rec.to_dict()

    def record_url(self, name: str, url: str) -> None:
        """Remember where a lab process serves HTTP (the sync's /metrics), for ``status``."""
        with self.edit_state() as st:
            st.setdefault("urls", {})[name] = url

    def _forget(self, name: str) -> None:
        with self.edit_state() as st:
            st.get("procs", {}).pop(name, None)

    def env(self) -> Dict[str, str]:
        """Environment a shell (or a test) needs to use this lab's Slurm and autoheal."""
        lay = self.layout()
        env = {"SLURM_CONF": str(lay.slurm_conf), "AUTOHEAL_CONFIG": str(lay.autoheal_conf),
               "AUTOHEAL_LAB_DIR": str(self.root), "AUTOHEAL_MEMTIER_BASE": lay.memory_base}
        st = self.load_state() or {}
        if st.get("nvml_lib_dir"):
            lib = st["nvml_lib_dir"]
            env["AUTOHEAL_LAB_NVML_LIB_DIR"] = lib
            # what `autoheal check --node gpu1` needs from a shell: the fake libnvidia-ml.so.1 (prepended
            # to the caller's path; that folder holds nothing else) and the per-node GPU state, whose
            # {node} the fake library fills in from --node / $SLURMD_NODENAME / $AUTOHEAL_NODE
            old = [d for d in os.environ.get("LD_LIBRARY_PATH", "").split(":") if d and d != lib]
            env["LD_LIBRARY_PATH"] = ":".join([lib, *old])
            env["AUTOHEAL_FAKE_NVML_STATE"] = str(lay.path("gpus", "{node}.state"))
        if st.get("kubeconfig"):
            env["KUBECONFIG"] = st["kubeconfig"]
        return env

    def slurm_env(self) -> Dict[str, str]:
        return dict(os.environ, **self.env())

    # ---- up / down --------------------------------------------------------------------------------
    def up(self, nodes: int = 3, gpus: int = 8, spares: int = 1, slurm_defaults: bool = False,
           hooks: bool = True, xid_watch: bool = True, extra_conf: Optional[List[str]] = None,
           install: bool = True, wait: float = 60.0, kube: bool = False, spare_delay: float = 1.0,
           keep_state: bool = False, hooks_conf: Optional[Dict[str, object]] = None) -> dict:
        """Bring the lab up (idempotent: a lab already up with every process alive is left alone).

        ``slurm_defaults`` leaves out the recommended slurm.conf fragment (to compare with Slurm's
        defaults); ``hooks`` wires HealthCheckProgram/Prolog/Epilog to autoheal's hooks and
        ``xid_watch`` runs one ``autoheal xid-watch`` per node, each when that part is installed.
        ``kube`` adds Kubernetes (``autoheal_lab.kube``): the real control plane with Nodes and
        slurmd pods, ``autoheal sync`` with
        remediation and the spare pool, which fulfils replacements after ``spare_delay`` s.

        A lab that is started (not already up) starts from a clean cluster state: Slurm's saved jobs and
        node states, the journal, node state, fake GPU faults, kernel logs, Kubernetes objects, the
        spare pool's bookkeeping and old drills are forgotten (``autoheal_lab.cleanup``), unless
        ``keep_state``. ``hooks_conf``: ``[hooks]`` settings written into the lab's autoheal.toml before
        any daemon starts (xid-watch reads its config once), e.g. the soak's ``lemon_faults``.
        """
        from autoheal_lab import cleanup, wiring
        from autoheal_lab import gpus as labgpus

        st = self.load_state()
        if st and st.get("procs"):
            dead = [n for n, r in self.records().items() if not procs.is_alive(r)]
            if not dead:
                return self.status()
            # Partly dead (a process killed from outside, a reboot): start over cleanly.
            self.down()
        self._check_lab_dir()
        if kube:
            from autoheal_lab import kube as labkube

            why = labkube.cannot_start()
            if why:  # before anything starts: one line naming what to install, nothing left running
                raise LabError(why)
        if not keep_state:
            cleanup.clean(self.root)
        ensure_slurm_installed(install)
        names = [f"gpu{i}" for i in range(1, nodes + 1)]
        spare_names = [f"spare{i}" for i in range(1, spares + 1)]
        ports = _free_ports(2 + len(names) + len(spare_names))
        lay = LabLayout(root=self.root, nodes=names, spares=spare_names, gpus=gpus, ctld_port=ports[0],
                        rest_port=ports[1], node_ports=dict(zip(names + spare_names, ports[2:])),
                        extra_conf=list(extra_conf or []))
        for sub in LAB_DIRS:
            (self.root / sub).mkdir(parents=True, exist_ok=True)
        for i in range(gpus):
            make_gpu_device(self.root / "dev" / f"nvidia{i}", i)
        for name in lay.all_nodes:
            lay.kernel_log(name).touch()
        state = {"layout": {**asdict(lay), "root": str(lay.root)}, "procs": {}, "started": time.time(),
                 "slurm_defaults": slurm_defaults,
                 # what start_node() needs to bring a spare up like every other node
                 "options": {"hooks": hooks, "xid_watch": xid_watch, "kube": kube, "spare_delay": spare_delay,
                             "keep_state": keep_state}}
        with self.edit_state() as st:
            st.clear()
            st.update(state)
        lib_dir = labgpus.setup_gpus(self) or ""
        hook_lines = wiring.write_hook_wrappers(lay, lib_dir) if hooks else {}
        version = "%d.%02d" % _slurm_version()
        fragment = [] if slurm_defaults else wiring.drop_keys(
            wiring.recommended_fragment(version, existing={"AuthInfo": f"socket={lay.munge_socket}"}), hook_lines)
        self._write_configs(lay, hook_lines, fragment)
        if hooks_conf:
            set_toml_values(lay.autoheal_conf, "hooks", hooks_conf)
        self._write_jwt_key(lay)
        self._start_munge(lay)
        self._start_slurmctld(lay)
        in_service = self._spares_in_service(lay)
        self.hold_spares([s for s in lay.spares if s not in in_service])
        for name in lay.nodes + in_service:
            self.start_slurmd(name)
        self.wait_nodes_up(lay.nodes, timeout=wait)
        for name in lay.nodes + in_service:
            self.start_node_daemons(name)
        for daemon in wiring.controller_daemons(state["options"]):
            self.start_controller_daemon(daemon.name, daemon.argv(""))
        if kube:
            from autoheal_lab import kube as labkube

            labkube.start(self, spare_delay=spare_delay, keep_state=keep_state)
        return self.status()

    def _check_lab_dir(self) -> None:
        """Refuse a directory that holds no lab but has folders with the lab's names: the lab would
        adopt them, and a later clean start would empty them."""
        if self.root.exists() and not self.root.is_dir():
            raise LabError(f"{self.root} is not a directory")
        if not self.root.is_dir() or self.state_path.is_file():
            return
        clash = sorted(sub for sub in LAB_DIRS + STATE_ONLY_DIRS if (self.root / sub).exists())
        if clash:
            raise LabError(f"{self.root} holds no lab ({STATE_FILE}) but has {', '.join(clash)}: pick an empty "
                           f"or new directory for the lab")

    def _spares_in_service(self, lay: LabLayout) -> List[str]:
        """Spares an earlier run put into service (only with keep_state: a clean start forgets them)."""
        from autoheal_lab.sparepool import USED_FILE

        try:
            used = json.loads((self.root / "kube" / USED_FILE).read_text())
        except (OSError, ValueError):
            return []
        return [s for s in lay.spares if s in set(used.values())]

    def spare_reason(self) -> str:
        """The drain reason holding a spare out of service: it starts with the sync's
        ``spare_reason_prefix`` from this lab's config, the one test the sync uses to recognise a spare
        (resume it when it takes over, keep it out of the breaker's count)."""
        from autoheal.config import load_config
        from autoheal_lab.slurmconf import spare_reason

        return spare_reason(load_config(self.layout().autoheal_conf).sync.spare_reason_prefix)

    def hold_spares(self, spares: List[str]) -> None:
        """Drain each spare with ``spare_reason()``: defined in Slurm, out of service until it replaces a
        node. Done with scontrol, not ``State=DRAIN`` in slurm.conf: slurmctld re-applies a configured
        state and reason on every restart, which would drain a spare already in service again."""
        reason = self.spare_reason()
        for spare in spares:
            res = subprocess.run([_which("scontrol") or "scontrol", "update", f"nodename={spare}", "state=drain",
                                  f"reason={reason}"], env=self.slurm_env(), capture_output=True, text=True,
                                 timeout=15)
            if res.returncode != 0:
                raise LabError(f"could not hold spare {spare} out of service: {res.stderr.strip()}")

    def restart_slurmctld(self) -> procs.ProcRecord:
        """Stop slurmctld (SIGTERM, it saves its state) and start it again; returns once it answers."""
        rec = self.records().get("slurmctld")
        if rec:
            procs.stop(rec)
        self._start_slurmctld(self.layout())
        return self.records()["slurmctld"]

    def start_node(self, node: str) -> None:
        """Bring a node into service like ``up`` does: its slurmd and its node daemons (xid-watch). The
        spare pool uses this for a spare taking over a failed node."""
        self.start_slurmd(node)
        self.start_node_daemons(node)

    def stop_node(self, node: str) -> List[str]:
        """The machine goes away: stop its slurmd and node daemons. Returns the names stopped."""
        stopped = [f"slurmd-{node}"] if self.stop_slurmd(node) else []
        return stopped + self.stop_node_daemons(node)

    def stop_node_daemons(self, node: str) -> List[str]:
        """Stop the node's daemons (xid-watch), as its shutdown does. Returns the names stopped."""
        from autoheal_lab import wiring

        stopped = []
        recs = self.records()
        for daemon in wiring.node_daemons(self._options()):
            name = daemon.proc_name(node)
            if name in recs:
                if procs.stop(recs[name]):
                    stopped.append(name)
                self._forget(name)
        return stopped

    def _options(self) -> dict:
        return (self.load_state() or {}).get("options") or {"xid_watch": True}

    def start_node_daemons(self, node: str) -> None:
        """The per-node daemons this lab runs (``wiring.node_daemons``), each with the node's environment."""
        from autoheal_lab import wiring

        for daemon in wiring.node_daemons(self._options()):
            self.start_node_daemon(daemon.proc_name(node), node, daemon.argv(node))

    def start_controller_daemon(self, proc_name: str, argv: List[str]) -> procs.ProcRecord:
        """Run a controller-side daemon with the lab's Slurm and autoheal environment."""
        old = self.records().get(proc_name)
        if old and procs.is_alive(old):
            procs.stop(old)
        rec = procs.spawn(proc_name, argv, self.root / "log" / f"{proc_name}.log", env=self.slurm_env())
        self._record(rec)
        return rec

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
        name = f"slurmrestd-{auth}"
        if version >= RESTD_UNPRIVILEGED_SINCE:
            argv_head = self._unprivileged_restd(lay, auth)
        else:
            env["SLURMRESTD_SECURITY"] = "disable_user_check"
            argv_head = [_which("slurmrestd") or "slurmrestd", "-f", str(lay.slurm_conf)]
        if auth == "jwt":
            env["SLURM_JWT"] = "daemon"
            listen = f"127.0.0.1:{lay.rest_port}"
            url = f"http://{listen}"
            argv = [*argv_head, "-s", plugin, "-a", "rest_auth/jwt", listen]
        else:
            sock = lay.path("run", "slurmrestd.sock")
            url = f"unix:{sock}"
            argv = [*argv_head, "-s", plugin, "-a", "rest_auth/local", f"unix:{sock}"]
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

    def _unprivileged_restd(self, lay: LabLayout, auth: str) -> List[str]:
        """slurmrestd's argv head on 25.11+: as Debian's ``slurm`` account, with its own slurm.conf copy.

        25.11+ release builds abort on ``SLURMRESTD_SECURITY=disable_user_check`` ("should only be used
        for development") and refuse root, SlurmUser (root in the lab) and nobody; ``become_user`` mode
        still refuses SlurmUser. So slurmrestd runs as an unprivileged account, which must read slurm.conf
        after it drops root (the lab directory may be a 0700 one): a copy in a directory it owns. The
        local auth then accepts only that account's own connections, no Slurm admin: only JWT (a root
        token passed through, ``SLURM_JWT=daemon``) can drain or requeue, so local auth is refused here."""
        if auth != "jwt":
            raise LabError("Slurm 25.11+ runs slurmrestd only as an account that is neither root nor SlurmUser, "
                           "and its local auth accepts only that account's connections (no Slurm admin): "
                           "use --auth jwt")
        try:
            account = pwd.getpwnam(RESTD_ACCOUNT)
        except KeyError:
            raise LabError(f"no '{RESTD_ACCOUNT}' account to run slurmrestd as (Debian's slurm packages "
                           f"create it)") from None
        private = _restd_private_dir(self.root)
        shutil.rmtree(private, ignore_errors=True)
        private.mkdir(parents=True, mode=0o700)
        conf = private / "slurm.conf"
        shutil.copyfile(lay.slurm_conf, conf)
        for path in (private, conf):
            os.chown(path, account.pw_uid, account.pw_gid)
        return [_which("slurmrestd") or "slurmrestd", "-u", str(account.pw_uid), "-g", str(account.pw_gid),
                "-f", str(conf)]

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

    def crash_node(self, node: str) -> List[int]:
        """The machine dies at once: SIGKILL its slurmd, its slurmstepds and every process they started
        (the job's tasks and agents on it), and its memory is gone (the memory tier's copies with it).
        Returns the PIDs killed. ``start_slurmd`` brings it back (empty memory, as after a reboot)."""
        lay = self.layout()
        log = str(lay.path("log", f"slurmd-{node}.log"))
        pids = set()
        rec = self.records().get(f"slurmd-{node}")
        if rec and procs.is_alive(rec):
            pids.add(rec.pid)
        for pid in procs.step_daemons(self.root):
            if log in procs.open_files(pid):
                pids.add(pid)
                pids.update(procs.descendants(pid))
        pids.difference_update(procs.ancestors(os.getpid()))
        for pid in sorted(pids):
            procs.kill_pid(pid)
        self.wipe_node_memory(node)
        return sorted(pids)

    def wipe_node_memory(self, node: str) -> None:
        mem = Path(self.layout().memory_base.replace("{node}", node))
        shutil.rmtree(mem, ignore_errors=True)
        self.node_memory(node)

    def node_memory(self, node: str) -> Path:
        """The node's memory folder, made as /dev/shm is (root's, 1777: any user may make a folder there,
        also one named for someone else; the lab is never kinder than the world)."""
        mem = Path(self.layout().memory_base.replace("{node}", node))
        mem.mkdir(parents=True, exist_ok=True)
        mem.chmod(0o1777)
        return mem

    def start_slurmd(self, node: str) -> procs.ProcRecord:
        """Start (or restart) one node's slurmd; the lab's "reboot" and spare bring-up use this."""
        lay = self.layout()
        self.node_memory(node)
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
               "AUTOHEAL_CONFIG": str(lay.autoheal_conf), "AUTOHEAL_MEMTIER_BASE": lay.memory_base}
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
        """Stop every recorded process (daemons first, munged last). Returns the names stopped.

        Jobs still running are killed first: a slurmstepd runs in its own session and outlives slurmd,
        so its job's processes would keep running (seen on 24.11 when a drill's final scancel raced the
        slurmd shutdown; with KillWait=120 a cancel alone takes two minutes to reach SIGKILL)."""
        self._kill_job_processes()
        if (self.load_state() or {}).get("layout"):
            shutil.rmtree(Path(self.layout().memory_base).parent, ignore_errors=True)
            # the hooks (root) left a config snapshot in the machine's /run/autoheal, named by this lab's
            # config path: lab state outside the lab root, shared by every lab on the machine
            # (and one of its secrets file's webhooks, when a test wrote that file)
            from autoheal.config.snapshot import secrets_path, snapshot_path

            for kept in (snapshot_path(str(self.layout().autoheal_conf)),
                         secrets_path(str(self.layout().path("etc", "secrets.toml")))):
                with contextlib.suppress(OSError):
                    os.unlink(kept)
        recs = self.records()
        # clients first (slurmd, node and controller daemons, sync, spare pool), then the fault proxy in
        # front of the API server, then the control plane, slurmctld and munged last: each
        # still reaches what it talks to while it shuts down
        order = stop_order(recs)
        stopped = []
        for name in order:
            if procs.stop(recs[name]):
                stopped.append(name)
            self._forget(name)
        shutil.rmtree(_restd_private_dir(self.root), ignore_errors=True)
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
        ports = st.get("ports") or {}
        plist = [{"name": n, "pid": r.pid, "alive": procs.is_alive(r), "log": r.log, "port": ports.get(n)}
                 for n, r in sorted(recs.items())]
        states = self._node_states(lay) if recs.get("slurmctld") and procs.is_alive(recs["slurmctld"]) else {}
        nodes = [{"name": n, "spare": n in lay.spares, "state": states.get(n, "unknown"),
                  "gpu_state_file": str(lay.gpu_state(n)), "kernel_log": str(lay.kernel_log(n)),
                  "slurmd_port": lay.node_ports[n]} for n in lay.all_nodes]
        up = bool(plist) and all(p["alive"] for p in plist)
        urls = st.get("urls") or {}
        for p in plist:
            if p["name"] in urls:
                p["url"] = urls[p["name"]]
        return {"dir": str(self.root), "up": up, "slurm_conf": str(lay.slurm_conf),
                "autoheal_conf": str(lay.autoheal_conf), "processes": plist, "nodes": nodes,
                "metrics": {p["name"]: p["url"] for p in plist if p.get("url") and p["alive"]}}


def _restd_private_dir(root: Path) -> Path:
    """Where an unprivileged slurmrestd (25.11+) of the lab in ``root`` finds its slurm.conf copy."""
    import hashlib

    return Path("/run/autoheal-lab-slurmrestd") / hashlib.sha256(str(root.resolve()).encode()).hexdigest()[:16]


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


def set_toml_values(path: Path, section: str, values: Dict[str, object]) -> None:
    """Set ``values`` in ``[section]`` of the lab's generated TOML ``path`` (one ``key = json`` line each,
    replacing the key's old line; the section is added when missing). The generated file has no nested
    tables or multi-line values, so a line edit is enough; a hand-edited file keeps its other lines."""
    lines = path.read_text().splitlines()
    head = f"[{section}]"
    if head not in lines:
        lines += ["", head]
    start = lines.index(head)
    end = next((i for i in range(start + 1, len(lines)) if lines[i].startswith("[")), len(lines))
    body = [ln for ln in lines[start + 1:end] if ln.split("=")[0].strip() not in values]
    while body and not body[-1].strip():
        body.pop()
    body += [f"{k} = {json.dumps(v)}" for k, v in values.items()]
    tail = [""] + lines[end:] if end < len(lines) else []
    path.write_text("\n".join(lines[:start + 1] + body + tail) + "\n")


def render_autoheal_toml(lay: LabLayout) -> str:
    """The autoheal config every lab process uses (journal, node state and kernel logs under the lab
    dir). Only keys the installed config schema knows are written, so parts can add settings freely."""
    from autoheal.config import Config, describe

    wanted = {
        "slurm": {"slurm_conf": str(lay.slurm_conf), "timeout": 10.0},
        "journal": {"path": str(lay.path("journal", "journal.jsonl")), "job_spool": str(lay.path("journal", "jobs"))},
        # the lab's own secrets file (absent unless a test writes one), never the host's /etc/autoheal
        "notify": {"secrets_file": str(lay.path("etc", "secrets.toml"))},
        "hooks": {"state_dir": f"{lay.root}/nodestate/{{node}}", "kernel_log": f"{lay.root}/kmsg/{{node}}.log",
                  "expected_gpus": lay.gpus, "dcgm_mapping_dir": f"{lay.root}/dcgm/{{node}}",
                  "reset_command": [sys.executable, "-m", "autoheal_lab.cli", "gpu-reset", "--dir", str(lay.root),
                                    "--node", "{node}", "--gpu", "{gpu}"],
                  "resume_cooldown": 5.0, "textfile_dir": f"{lay.root}/metrics/{{node}}",
                  # a short grace window and NVML budget keep lab drills and tests quick
                  "grace_seconds": 10.0, "nvml_timeout": 3.0,
                  # a lab node drained by another process is noticed by its xid-watch within seconds
                  "xid_watch_self_check": 10.0,
                  # lab tests inject faults on the same few nodes again and again, each repaired for real:
                  # with the default (3 in 7 d) every test after the third would meet a lemon. Lemons are
                  # on where a lab asks for them: the soak (up(hooks_conf=...), SoakOptions.lemon_faults)
                  # and tests/integration/test_lemon_lab.py.
                  "lemon_faults": 0},
        # metrics: `lab up` gives each sync a free port (`lab status` shows it), on loopback only
        "sync": {"slurm_resync_seconds": 2.0, "lease_duration_seconds": 5.0, "metrics_port": 0,
                 "metrics_address": "127.0.0.1",
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
