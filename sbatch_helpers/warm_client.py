"""``autoheal-warm COMMAND [ARGS]...``: start a rank in its node's warm interpreter (``warm.py``).

Used in a job submitted with ``autoheal sbatch --preload MODULES``::

    srun autoheal-warm python train.py --lr 0.1

The client hands the command, its environment (the step's: GPUs, ranks, ``AUTOHEAL_*``), working
directory, umask, CPU affinity and its stdin/stdout/stderr to the node's warm interpreter, which forks a
child with the preloaded modules imported and runs the script as ``__main__``. The client then stands in
for the rank: every signal it gets goes to the child's process group (the grace signal reaches the
trainer as before), it exits with the child's exit code, or dies of the child's signal; killed itself by
SIGKILL (the runner ending a hung step, Slurm's step kill), its socket closes and the warm interpreter
SIGKILLs the child's process group.

No warm interpreter to use (the job has no ``--preload``, it has not finished its imports, it ended, it
runs another Python, the rank's environment differs where the preloaded modules read it): the client
execs COMMAND itself, with one line on stderr saying why. The script works everywhere.
"""

from __future__ import annotations

import os
import signal
import socket
import sys
from typing import Any, Dict, List, Optional, Sequence, Set, Tuple

from autoheal.sbatch_helpers import warm

CONNECT_TIMEOUT = 2.0
#: A busy warm interpreter answers one request at a time (each takes milliseconds: a fork).
REPLY_TIMEOUT = 10.0 + warm.REQUEST_TIMEOUT


def say(text: str) -> None:
    sys.stderr.write(f"autoheal-warm: {text}\n")
    sys.stderr.flush()


def forwarded() -> Set[int]:
    """Every signal the client can catch, except SIGCHLD (the client has no children)."""
    skip = {signal.SIGKILL, signal.SIGSTOP, signal.SIGCHLD}
    return {s for s in signal.valid_signals() if s not in skip}


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help"):
        say("usage: autoheal-warm COMMAND [ARGS]...  (srun autoheal-warm python train.py, in a job submitted "
            "with autoheal sbatch --preload MODULES)")
        return 2 if not args else 0
    import shutil

    env = dict(os.environ)
    exe = shutil.which(args[0], path=env.get("PATH")) or ""
    node = env.get("SLURMD_NODENAME", "")
    # blocked until it is known who handles them: the warm child (forwarded) or the exec'd command
    old_mask = signal.pthread_sigmask(signal.SIG_BLOCK, forwarded())
    sock, got = ask(args, exe, env, node)
    if sock is None:
        return run_afresh(args, got, node, old_mask)
    return follow(sock, got, node, old_mask)


def ask(args: List[str], exe: str, env: Dict[str, str], node: str) -> Tuple[Optional[socket.socket], Any]:
    """(the connection to the started child, its frame reader) or (None, why the command starts afresh)."""
    if not env.get(warm.PRELOAD_ENV):
        return None, "the job was submitted without --preload"
    job = env.get("SLURM_JOB_ID", "")
    if not exe:
        return None, f"{args[0]} is not on PATH"
    if not node or not job:
        return None, "not in a Slurm job step"
    try:
        path = warm.socket_path(node, os.getuid(), job, env)
        cwd = os.getcwd()
    except (OSError, ValueError) as exc:
        return None, f"no warm interpreter ({exc})"
    try:
        dir_fd = open_job_dir(os.path.dirname(path))
    except FileNotFoundError:
        return None, "no warm interpreter on this node (the job's memory folder is missing)"
    except (OSError, warm.WireError) as exc:
        return None, f"no warm interpreter to trust on this node ({exc})"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.settimeout(CONNECT_TIMEOUT)
        try:
            sock.connect(f"/proc/self/fd/{dir_fd}/{warm.SOCKET_NAME}")
        except (FileNotFoundError, ConnectionRefusedError):
            sock.close()
            return None, "no warm interpreter on this node (still importing, or ended)"
        _check_peer(sock)
        umask = os.umask(0)
        os.umask(umask)
        cpus = tuple(sorted(os.sched_getaffinity(0))) if hasattr(os, "sched_getaffinity") else ()
        req = warm.Request(tuple(args), exe, env, cwd, umask, cpus)
        reader = warm.FrameReader()
        socket.send_fds(sock, [b"F"], [0, 1, 2])
        sock.sendall(warm.encode(req.to_msg()))
        sock.settimeout(REPLY_TIMEOUT)
        reply = _read(sock, reader)
    except (OSError, warm.WireError) as exc:
        sock.close()
        return None, f"the warm interpreter did not take the rank ({exc})"
    finally:
        os.close(dir_fd)
    if reply is None or "pid" not in reply:
        sock.close()
        why = reply.get("refused") if reply else None
        return None, str(why or "the warm interpreter ended before it answered")
    return sock, reader


def open_job_dir(job_dir: str) -> int:
    """An fd of the job's memory folder, which must be, like its parent ``autoheal-memtier-<uid>``, a
    folder (no symlink) of this user's, private: the base is world-writable (``/dev/shm``), and a folder
    planted there by another user could hold a ``warm.sock`` symlink to any socket this user serves (the
    warm interpreter of another of their jobs), which the peer check would then pass."""
    flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
    user_fd = _private(os.open(os.path.dirname(job_dir), flags), os.path.dirname(job_dir))
    try:
        job_fd = os.open(os.path.basename(job_dir), flags, dir_fd=user_fd)
    finally:
        os.close(user_fd)
    return _private(job_fd, job_dir)


def _private(fd: int, path: str) -> int:
    st = os.fstat(fd)
    if st.st_uid != os.getuid() or st.st_mode & 0o077:
        os.close(fd)
        raise warm.WireError(f"{path} is uid {st.st_uid}'s with mode {st.st_mode & 0o777:o}, not this user's "
                             f"private folder")
    return fd


def _check_peer(sock: socket.socket) -> None:
    """The socket's server runs as this user (the folder is the user's, 0700: this is belt and braces)."""
    import struct

    _, uid, _ = struct.unpack("3i", sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i")))
    if uid != os.getuid():
        raise warm.WireError(f"its socket is served by uid {uid}, not this job's user")


def _read(sock: socket.socket, reader: warm.FrameReader) -> Optional[Dict[str, Any]]:
    """The next frame (one that came with the previous one first), or None at EOF."""
    while True:
        msg = reader.take()
        if msg is not None:
            return msg
        data = sock.recv(4096)
        if not data:
            return None
        reader.feed(data)


def run_afresh(args: List[str], why: str, node: str, old_mask: Set[int]) -> int:
    """Exec the command itself, its signals as they were (any that came meanwhile is delivered now)."""
    say(f"{node or 'here'}: {why}: starting {args[0]} afresh")
    signal.pthread_sigmask(signal.SIG_SETMASK, old_mask)
    try:
        os.execvp(args[0], args)
    except OSError as exc:
        say(f"cannot run {args[0]}: {exc.strerror}")
        return 126 if isinstance(exc, PermissionError) else 127
    return 127  # pragma: no cover (exec does not return)


def follow(sock: socket.socket, reader: warm.FrameReader, node: str, old_mask: Set[int]) -> int:
    """Forward signals to the child until its status comes; exit with it (a signal's death re-raised)."""

    def forward(signum: int, frame: object) -> None:
        try:
            sock.sendall(warm.encode({"kill": signum}))
        except OSError:
            pass

    for sig in forwarded():
        try:
            signal.signal(sig, forward)
        except (OSError, ValueError):
            pass
    sock.settimeout(None)
    signal.pthread_sigmask(signal.SIG_SETMASK, old_mask)
    while True:
        try:
            msg = _read(sock, reader)
        except (OSError, warm.WireError):
            msg = None
        if msg is None:  # the warm interpreter died: its children die with it (PR_SET_PDEATHSIG)
            say(f"{node}: the warm interpreter ended before the rank did (the rank was killed with it)")
            return die_of(signal.SIGKILL)
        if "signal" in msg:
            return die_of(int(msg["signal"]))
        if "exit" in msg:
            return int(msg["exit"])


def die_of(signum: int) -> int:
    """End the way the child ended: by the same signal (its default action), else 128 + its number."""
    sys.stderr.flush()
    try:
        signal.signal(signum, signal.SIG_DFL)
    except (OSError, ValueError):  # SIGKILL and SIGSTOP have no handler to reset
        pass
    signal.pthread_sigmask(signal.SIG_UNBLOCK, [signum])
    os.kill(os.getpid(), signum)
    return 128 + signum


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
