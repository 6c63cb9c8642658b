"""A node's warm interpreter (``autoheal sbatch --preload MODULES``; the design is in ``warm.py``).

``python -m autoheal.sbatch_helpers.warm_zygote --preload torch,torch.optim`` -- one per node, started by
the job runner as one Slurm step (``warm_launch.py``), so it lives and dies with the job; the epilog kills
it after a kill -9 of the job (its pid is in the job's memory folder, next to its socket). It imports the
modules, then serves ``autoheal-warm`` clients on ``<job's memory folder>/warm.sock`` (0600 in a 0700
folder of the job's user; a peer of another uid is refused, SO_PEERCRED). It never touches a GPU: a CUDA
context does not survive a fork, so every rank initialises its device after the fork, as a fresh one does.

One thread only (it forks): one ``selectors`` loop over the listening socket, the clients of the running
children (a client's signal is forwarded to its child's process group; its EOF SIGKILLs that group) and
a wakeup pipe for SIGCHLD (the child's status goes back to its client). Signals other than SIGTERM,
SIGINT, SIGHUP are ignored: a signal for the whole job reaches each rank through its own client. On
SIGTERM it stops taking requests and ends once its children have (Slurm's SIGKILL of the step follows;
each child dies with it: PR_SET_PDEATHSIG).
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import importlib
import io
import os
import runpy
import selectors
import signal
import socket
import struct
import sys
import time
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

from autoheal.sbatch_helpers import warm

PR_SET_PDEATHSIG = 1
#: Synchronous fault signals keep their default action in the warm interpreter (ignoring them is undefined).
_FAULTS = {signal.SIGSEGV, signal.SIGBUS, signal.SIGFPE, signal.SIGILL, signal.SIGABRT, signal.SIGTRAP, signal.SIGSYS}
_ENDS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
_KEEP: List[object] = []  # the warm interpreter's stdio objects, kept alive in a child (they close fds 0-2)


def say(text: str) -> None:
    """One line to the job's output; a line that cannot be written is not worth the ranks served."""
    try:
        sys.stdout.write(f"autoheal-warm: {text}\n")
        sys.stdout.flush()
    except (OSError, ValueError):
        pass


class Job:
    """What a forked child runs: the request, how, its stdio descriptors, the warm interpreter's pid."""

    def __init__(self, req: warm.Request, launch: warm.Launch, fds: Sequence[int], parent: int):
        self.req, self.launch, self.fds, self.parent = req, launch, list(fds), parent


class Zygote:
    def __init__(self, listener: socket.socket, facts: warm.Facts, node: str, keep_fds: Sequence[int] = ()):
        self.listener, self.facts, self.node = listener, facts, node
        self.keep_fds = list(keep_fds)  # the zygote's own descriptors a child must not inherit
        self.sel = selectors.DefaultSelector()
        self.children: Dict[int, Optional[socket.socket]] = {}
        self.readers: Dict[int, warm.FrameReader] = {}
        self.draining = False
        self.wake_r, self.wake_w = os.pipe()
        for fd in (self.wake_r, self.wake_w):
            os.set_blocking(fd, False)

    # ---- signals -----------------------------------------------------------------------------------
    def _signals(self) -> None:
        signal.set_wakeup_fd(self.wake_w)
        signal.signal(signal.SIGCHLD, lambda *_: None)  # a Python handler: the wakeup fd is written
        for sig in _ENDS:
            signal.signal(sig, self._end)
        ignore_others()

    def _end(self, signum: int, frame: object) -> None:
        self.draining = True

    # ---- the loop ----------------------------------------------------------------------------------
    def serve(self) -> Optional[Job]:
        """Serve until told to end and no child is left (None); in a forked child, its Job."""
        self._signals()
        self.sel.register(self.listener, selectors.EVENT_READ, "listen")
        self.sel.register(self.wake_r, selectors.EVENT_READ, "wake")
        while True:
            if self.draining and self.listener.fileno() >= 0:
                self.sel.unregister(self.listener)
                self.listener.close()
                say(f"{self.node}: ending: no new ranks; {len(self.children)} running")
            if self.draining and not self.children:
                return None
            for key, _ in self.sel.select(timeout=1.0):
                if key.data == "listen":
                    job = self._accept()
                    if job is not None:
                        return job
                elif key.data == "wake":
                    with contextlib.suppress(OSError):
                        while os.read(self.wake_r, 512):
                            pass
                else:
                    self._from_client(key.fileobj, key.data)  # type: ignore[arg-type]
            self._reap()

    def _accept(self) -> Optional[Job]:
        try:
            conn, _ = self.listener.accept()
        except OSError:
            return None
        fds: List[int] = []
        peer_ok = False
        # one bound for the whole request, not for each read: the ranks already running wait for this loop
        deadline = time.monotonic() + warm.REQUEST_TIMEOUT
        try:
            conn.settimeout(warm.REQUEST_TIMEOUT)
            _, uid, _ = struct.unpack("3i", conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED,
                                                            struct.calcsize("3i")))
            if uid != os.getuid():
                raise warm.WireError(f"a process of uid {uid} connected (this job's user is {os.getuid()})")
            peer_ok = True
            marker, fds, _, _ = socket.recv_fds(conn, 1, 3)
            if marker != b"F" or len(fds) != 3:
                raise warm.WireError("the request came without its three stdio descriptors")
            req = warm.Request.from_msg(_read_frame(conn, deadline))
            conn.settimeout(warm.REQUEST_TIMEOUT)  # for the replies: what was left of the bound may be nothing
        except (OSError, warm.WireError) as exc:
            say(f"{self.node}: a request refused: {exc}")
            if peer_ok:  # the job's own client is told why (it said only "ended before it answered")
                with contextlib.suppress(OSError, warm.WireError):
                    conn.settimeout(1.0)
                    conn.sendall(warm.encode({"refused": f"the warm interpreter refused the request: {exc}"}))
            _close(fds)
            conn.close()
            return None
        decision = warm.judge(req, self.facts)
        if isinstance(decision, warm.Launch):  # the threads counted now, right before the fork
            why = warm.fork_safe(warm.thread_count())
            decision = warm.Refusal(why) if why else decision
        if isinstance(decision, warm.Refusal):
            with contextlib.suppress(OSError):
                conn.sendall(warm.encode({"refused": decision.why}))
            _close(fds)
            conn.close()
            return None
        return self._fork(conn, req, decision, fds)

    def _fork(self, conn: socket.socket, req: warm.Request, launch: warm.Launch, fds: List[int]) -> Optional[Job]:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(OSError, ValueError):
                stream.flush()
        parent = os.getpid()
        # Every signal blocked across the fork: the client forwards one as soon as it has the child's pid,
        # and until become() has put the child's signals back to their defaults the warm interpreter's
        # dispositions hold there (USR1 ignored, TERM only noted): a signal that came then was lost. Held
        # pending instead (Linux keeps a blocked signal even when ignored), become() unblocks it.
        old_mask = signal.pthread_sigmask(signal.SIG_BLOCK, signal.valid_signals())
        try:
            pid = os.fork()
        except OSError as exc:  # the step's process limit, memory: this rank starts afresh, the others go on
            signal.pthread_sigmask(signal.SIG_SETMASK, old_mask)
            with contextlib.suppress(OSError):
                conn.sendall(warm.encode({"refused": f"the warm interpreter cannot fork ({exc.strerror})"}))
            _close(fds)
            conn.close()
            return None
        if pid == 0:
            self._forget(conn)
            return Job(req, launch, fds, parent)
        signal.pthread_sigmask(signal.SIG_SETMASK, old_mask)
        with contextlib.suppress(OSError):  # both sides set it: no window where a signal misses the group
            os.setpgid(pid, pid)
        _close(fds)
        self.children[pid] = conn
        self.readers[pid] = warm.FrameReader()
        try:
            conn.sendall(warm.encode({"pid": pid}))
            conn.setblocking(False)
            self.sel.register(conn, selectors.EVENT_READ, pid)
        except OSError:  # the client went away already: so does the rank
            self._client_gone(pid)
        return None

    def _forget(self, conn: socket.socket) -> None:
        """In a child: drop every descriptor of the warm interpreter's (the listener, other clients'
        sockets, the wakeup pipe, the memory folder)."""
        signal.set_wakeup_fd(-1)
        self.sel.close()
        for sock in [self.listener, conn, *[c for c in self.children.values() if c is not None]]:
            sock.close()
        _close([self.wake_r, self.wake_w, *self.keep_fds])

    def _from_client(self, conn: socket.socket, pid: int) -> None:
        try:
            data = conn.recv(4096)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if not data:  # the client ended without the rank's status (SIGKILL, its step killed): so does the rank
            self._client_gone(pid)
            return
        try:
            msgs = self.readers[pid].feed(data)
        except warm.WireError:
            self._client_gone(pid)
            return
        for msg in msgs:
            sig = msg.get("kill")
            if isinstance(sig, int) and 0 < sig < signal.NSIG:
                with contextlib.suppress(OSError):
                    os.killpg(pid, sig)

    def _client_gone(self, pid: int) -> None:
        conn = self.children.get(pid)
        if conn is not None:
            with contextlib.suppress(KeyError, ValueError):
                self.sel.unregister(conn)
            conn.close()
            self.children[pid] = None
        with contextlib.suppress(OSError):
            os.killpg(pid, signal.SIGKILL)

    def _reap(self) -> None:
        """Every child that ended: what is left of its process group is killed while the zombie still
        holds the group's id (a step's leftovers end with it), then its status goes to its client."""
        while True:
            try:
                info = os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT)
            except ChildProcessError:
                return
            if info is None or not info.si_pid:
                return
            pid = info.si_pid
            with contextlib.suppress(OSError):
                os.killpg(pid, signal.SIGKILL)
            _, status = os.waitpid(pid, 0)
            conn = self.children.pop(pid, None)
            self.readers.pop(pid, None)
            if conn is not None:
                with contextlib.suppress(KeyError, ValueError):
                    self.sel.unregister(conn)
                with contextlib.suppress(OSError):
                    conn.setblocking(True)
                    conn.settimeout(1.0)
                    conn.sendall(warm.encode(warm.exit_msg(status)))
                conn.close()


def ignore_others() -> None:
    """Every signal but the ending ones, SIGCHLD and the fault signals ignored: a signal for every step of
    the job (``scancel --signal`` without ``--batch``) reaches each rank through its own client."""
    for sig in signal.valid_signals():
        if sig in (signal.SIGKILL, signal.SIGSTOP, signal.SIGCHLD) or sig in _ENDS or sig in _FAULTS:
            continue
        with contextlib.suppress(OSError, ValueError):
            signal.signal(sig, signal.SIG_IGN)


def _read_frame(conn: socket.socket, deadline: float) -> Dict[str, object]:
    reader = warm.FrameReader()
    while True:
        left = deadline - time.monotonic()
        try:
            if left <= 0:
                raise socket.timeout
            conn.settimeout(left)
            data = conn.recv(65536)
        except socket.timeout:
            raise warm.WireError(f"the request was not whole within {warm.REQUEST_TIMEOUT:g}s") from None
        if not data:
            raise warm.WireError("the client closed before its request was whole")
        frames = reader.feed(data)
        if frames:
            return frames[0]


def _close(fds: Sequence[int]) -> None:
    for fd in fds:
        with contextlib.suppress(OSError):
            os.close(fd)


# ---- the child -------------------------------------------------------------------------------------


def become(job: Job) -> int:
    """In the forked child: take the client's surroundings and run its script as ``__main__``."""
    req, how = job.req, job.launch
    with contextlib.suppress(OSError):
        os.setpgid(0, 0)
    _die_with(job.parent)
    _default_signals()
    for target, fd in enumerate(job.fds):
        os.dup2(fd, target)
    _close([fd for fd in job.fds if fd > 2])
    os.umask(req.umask)
    os.environ.clear()
    os.environ.update(req.env)
    os.environ[warm.MARKER_ENV] = str(job.parent)
    _stdio(how.unbuffered)
    try:
        os.chdir(req.cwd)
    except OSError as exc:
        print(f"autoheal-warm: cannot enter {req.cwd}: {exc.strerror}", file=sys.stderr)
        return 2
    if req.cpus:
        with contextlib.suppress(OSError, ValueError):  # the step's CPU binding, as far as this cgroup allows
            os.sched_setaffinity(0, req.cpus)
    sys.dont_write_bytecode = how.no_bytecode
    base = sys.path[1:]  # the interpreter's path without its own sys.path[0]
    if how.module:
        sys.argv = [how.target, *how.args]
        sys.path[:] = [req.cwd, *base]
        runpy.run_module(how.target, run_name="__main__", alter_sys=True)
    else:
        sys.argv = [how.target, *how.args]
        sys.path[:] = [os.path.dirname(os.path.realpath(how.target)), *base]
        runpy.run_path(how.target, run_name="__main__")
    return 0


def _die_with(parent: int) -> None:
    """The child ends when the warm interpreter does (killed with its step, or by the epilog)."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
    except (OSError, AttributeError):
        pass
    if os.getppid() != parent:  # it died before the prctl
        os._exit(128 + signal.SIGKILL)


def _default_signals() -> None:
    """As a fresh interpreter starts: every signal at its default, SIGINT as KeyboardInterrupt, SIGPIPE
    and SIGXFSZ ignored, none blocked."""
    for sig in signal.valid_signals():
        if sig in (signal.SIGKILL, signal.SIGSTOP):
            continue
        with contextlib.suppress(OSError, ValueError):
            signal.signal(sig, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    for sig in (signal.SIGPIPE, signal.SIGXFSZ):
        signal.signal(sig, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_SETMASK, [])


def _stdio(unbuffered: bool) -> None:
    """New sys.stdin/stdout/stderr on the client's descriptors, buffered as a fresh interpreter would
    (line-buffered on a terminal, stderr always; ``-u``: unbuffered)."""
    for fd, name in ((0, "stdin"), (1, "stdout"), (2, "stderr")):
        old = getattr(sys, name)
        _KEEP.append(old)
        encoding = getattr(old, "encoding", None) or "utf-8"
        errors = getattr(old, "errors", None) or "strict"
        stream: io.TextIOWrapper[Any]
        if fd == 0:
            stream = io.TextIOWrapper(io.BufferedReader(io.FileIO(fd, "rb", closefd=False)), encoding=encoding,
                                      errors=errors)
        else:
            stream = io.TextIOWrapper(io.BufferedWriter(io.FileIO(fd, "wb", closefd=False)), encoding=encoding,
                                      errors=errors, write_through=unbuffered,
                                      line_buffering=fd == 2 or unbuffered or os.isatty(fd))
        setattr(sys, name, stream)
        setattr(sys, f"__{name}__", stream)


# ---- main --------------------------------------------------------------------------------------------


def _listen(dir_fd: int) -> socket.socket:
    """The socket in the job's memory folder, 0600 (bound through /proc/self/fd: the folder's path may be
    longer than a unix socket's 108 bytes)."""
    with contextlib.suppress(FileNotFoundError):
        os.unlink(warm.SOCKET_NAME, dir_fd=dir_fd)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    old = os.umask(0o177)
    try:
        listener.bind(f"/proc/self/fd/{dir_fd}/{warm.SOCKET_NAME}")
    finally:
        os.umask(old)
    listener.listen(64)
    listener.setblocking(False)
    return listener


def _preload(modules: Sequence[str]) -> Tuple[float, List[str]]:
    t0 = time.monotonic()
    failed = []
    for name in modules:
        try:
            importlib.import_module(name)
        except Exception as exc:  # the others are still worth having
            failed.append(f"{name} ({type(exc).__name__}: {exc})")
    return time.monotonic() - t0, failed


def _settled_threads() -> int:
    """The threads left once the libraries that stop their own threads for a fork have done so: numpy's
    OpenBLAS starts a worker per core when it is loaded (``import torch`` loads it) and stops them in its
    pthread_atfork handler, starting them again only at its next call, which the warm interpreter never
    makes. One probe fork (a child that exits at once) lets them stop; a thread still there after it is
    one no handler stops, and forking with it is not safe."""
    if warm.thread_count() == 1:
        return 1
    pid = os.fork()
    if pid == 0:  # nothing runs here: the probe's child only exits
        os._exit(0)
    os.waitpid(pid, 0)
    return warm.thread_count()


def main(argv: Optional[Sequence[str]] = None) -> int:
    p = argparse.ArgumentParser(prog="python -m autoheal.sbatch_helpers.warm_zygote")
    p.add_argument("--preload", default="", help="modules to import, comma-separated")
    args = p.parse_args(argv)
    ignore_others()  # already while importing (seconds)
    started = dict(os.environ)  # before the imports: what the ranks' environments are compared with
    node = started.get("SLURMD_NODENAME") or socket.gethostname()
    from autoheal.sbatch_helpers.memtier_store import CopyStore, StoreError

    try:
        modules = warm.parse_preload(args.preload)
        path = warm.socket_path(node, os.getuid(), started.get("SLURM_JOB_ID", ""), started)
        store = CopyStore(Path(path).parent, keep=1)  # the job's private memory folder, created or checked
    except (ValueError, OSError, StoreError) as exc:
        say(f"{node}: unavailable: {exc}; the ranks start afresh")
        return 3
    took, failed = _preload(modules)
    why = warm.fork_safe(_settled_threads())
    if why:
        say(f"{node}: not serving: {why}; the ranks start afresh")
        return 0
    listener = _listen(store.fd)
    restarts = started.get("SLURM_RESTART_COUNT", "0")
    store.write_pidfile(int(restarts) if restarts.isdigit() else 0, name=warm.PIDFILE)
    say(f"{node}: ready: imported {','.join(modules) or 'nothing'} in {took:.2f}s"
        + (f"; failed: {'; '.join(failed)}" if failed else "") + f" (pid {os.getpid()})")
    job = Zygote(listener, warm.Facts(sys.executable, started), node, keep_fds=[store.fd]).serve()
    if job is not None:
        return become(job)
    for name in (warm.SOCKET_NAME, warm.PIDFILE):
        with contextlib.suppress(OSError):
            os.unlink(name, dir_fd=store.fd)
    store.close()
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
