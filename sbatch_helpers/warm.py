"""Warm interpreters for a job's ranks (``autoheal sbatch --preload MODULES``): the pure parts.

A restarted rank (a hot-spare swap, a requeue) starts a fresh Python that imports torch again: 8 s of
imports and 6 s of building a model and its optimizer (the first ``torch.optim.Adam()`` imports
``torch._dynamo``) on the lab at load 10, against 0.1-0.3 s to load its state from the memory tier. So
the job runner starts one *warm interpreter* per node of the allocation, spares included
(``warm_zygote.py``, one ``srun --overlap`` step like the memory tier's agents): it imports the modules
the job names and waits on a unix socket in the job's private memory folder. A rank started as
``srun autoheal-warm python train.py ...`` (``warm_client.py``) hands its argv, environment, working
directory, umask, CPU affinity and stdio to its node's warm interpreter, which forks; the child sets them
up and runs the script as ``__main__``, with the modules already imported. The client forwards every
signal to the child and exits with its status; a client killed by SIGKILL makes the warm interpreter
SIGKILL the child's process group. No warm interpreter (not started, still importing, died, a
different Python, an option it cannot honour): the client execs the command itself, with one line saying
why.

This module: where the socket is, the wire format (length-prefixed JSON frames; the stdio descriptors go
with SCM_RIGHTS), and the decisions (may this request be forked, how to run it, is forking safe now).
"""

from __future__ import annotations

import json
import os
import struct
from typing import Any, Dict, List, Mapping, NamedTuple, Optional, Sequence, Tuple, Union

# No dataclasses, no pathlib: ``autoheal-warm`` imports this module on every rank's start, which is on
# the path from a fault to training again (dataclasses pulls in inspect: 35 ms, pathlib 55 ms at load 5).

PRELOAD_ENV = "AUTOHEAL_PRELOAD"  # the modules to preload (comma-separated), exported by the runner
MARKER_ENV = "AUTOHEAL_WARM"  # set in a rank the warm interpreter started: "<warm interpreter's pid>"
#: The warm interpreters' step, which the runner's hang handling never ends. Not "autoheal-warm": srun names
#: a step after its command, so that is the name of every user step that starts its ranks through it.
STEP_NAME = "autoheal-warm-interpreters"
SOCKET_NAME = "warm.sock"
PIDFILE = "warm.pid"  # in the job's memory folder, for the epilog after a kill -9 of the job
VERSION = 1
MAX_FRAME = 4 << 20  # a request carries the whole environment: generous, but bounded
#: How long the warm interpreter gives a client to send its request (it serves one at a time).
REQUEST_TIMEOUT = 5.0
#: Variables read when a module is imported (the interpreter's own, OpenMP's, the BLAS libraries', the
#: dynamic linker's): a rank whose environment differs in one of them from the warm interpreter's would
#: run with the preloaded modules set up for another environment, so it starts afresh instead.
IMPORT_TIME_PREFIXES = ("PYTHON", "OMP_", "GOMP_", "KMP_", "MKL_", "OPENBLAS_")
IMPORT_TIME_NAMES = ("LD_PRELOAD", "LD_LIBRARY_PATH")
#: PYTHON* variables the child honours itself after the fork (they are not import-time state).
CHILD_HONOURS = ("PYTHONUNBUFFERED", "PYTHONDONTWRITEBYTECODE")
_MODULE_WORD = r"[A-Za-z_][A-Za-z0-9_]*"


class WireError(ValueError):
    """A frame that is not one of ours (too long, not JSON, not an object, missing fields)."""


def socket_path(node: str, uid: int, job_id: str, environ: Optional[Mapping[str, str]] = None) -> str:
    """``<memory base>/autoheal-memtier-<uid>/<job id>/warm.sock``: the job's private folder on the node
    (``autoheal/memtier_files.py``), whose epilog cleanup also ends a warm interpreter left running.
    ValueError for a job id that is not a plain number or a node name not usable in a path."""
    from autoheal import memtier_base

    if not (job_id.isdigit() and job_id.isascii() and len(job_id) <= 12):
        raise ValueError(f"job id {job_id!r} is not a Slurm job id")
    return os.path.join(memtier_base.base_path(node, environ), f"{memtier_base.USER_DIR_PREFIX}{int(uid)}", job_id,
                        SOCKET_NAME)


def parse_preload(text: str) -> Tuple[str, ...]:
    """``"torch, torch.optim"`` -> ("torch", "torch.optim"); ValueError naming a word that is not a
    dotted module name (the list reaches ``importlib.import_module`` and a command line)."""
    import re

    names = tuple(w.strip() for w in (text or "").split(",") if w.strip())
    for name in names:
        if not re.fullmatch(rf"{_MODULE_WORD}(\.{_MODULE_WORD})*", name):
            raise ValueError(f"{name!r} is not a module name (give dotted names separated by commas)")
    return tuple(dict.fromkeys(names))


# ---- frames ------------------------------------------------------------------------------------------


def encode(msg: Mapping[str, Any]) -> bytes:
    """One frame: 4-byte big-endian length, then the JSON object (ASCII: strings holding undecodable
    bytes of an environment travel as their surrogate escapes and come back the same)."""
    body = json.dumps(dict(msg), separators=(",", ":"), ensure_ascii=True).encode("ascii")
    if len(body) > MAX_FRAME:
        raise WireError(f"frame of {len(body)} bytes (at most {MAX_FRAME})")
    return struct.pack(">I", len(body)) + body


class FrameReader:
    """Frames out of a byte stream fed in pieces."""

    def __init__(self) -> None:
        self.buf = b""
        self.pending: List[Dict[str, Any]] = []  # frames read but not yet taken (``take``)

    def take(self) -> Optional[Dict[str, Any]]:
        return self.pending.pop(0) if self.pending else None

    def feed(self, data: bytes) -> List[Dict[str, Any]]:
        """The frames ``data`` completed (and each is also queued for ``take``)."""
        self.buf += data
        out = []
        while len(self.buf) >= 4:
            (size,) = struct.unpack(">I", self.buf[:4])
            if size > MAX_FRAME:
                raise WireError(f"frame of {size} bytes (at most {MAX_FRAME})")
            if len(self.buf) < 4 + size:
                break
            body, self.buf = self.buf[4:4 + size], self.buf[4 + size:]
            out.append(decode(body))
        self.pending += out
        return out


def decode(body: bytes) -> Dict[str, Any]:
    try:
        msg = json.loads(body.decode("ascii"))
    except (UnicodeDecodeError, ValueError) as exc:
        raise WireError(f"not a frame: {exc}") from None
    if not isinstance(msg, dict):
        raise WireError("not a frame: not an object")
    return msg


class Request(NamedTuple):
    """What a client asks its node's warm interpreter to run, and in which surroundings."""

    argv: Tuple[str, ...]  # as given: ("python", "train.py", "--lr", "0.1")
    exe: str  # argv[0] found on the client's PATH
    env: Dict[str, str]
    cwd: str
    umask: int
    cpus: Tuple[int, ...] = ()  # the client's CPU affinity (the step's binding), () when unknown

    def to_msg(self) -> Dict[str, Any]:
        return {"v": VERSION, "argv": list(self.argv), "exe": self.exe, "env": dict(self.env), "cwd": self.cwd,
                "umask": self.umask, "cpus": list(self.cpus)}

    @classmethod
    def from_msg(cls, msg: Mapping[str, Any]) -> Request:
        if msg.get("v") != VERSION:
            raise WireError(f"request version {msg.get('v')!r}, this warm interpreter speaks {VERSION}")
        argv, env, cpus = msg.get("argv"), msg.get("env"), msg.get("cpus", [])
        if not (isinstance(argv, list) and argv and all(isinstance(a, str) for a in argv)):
            raise WireError("request: argv must be a non-empty list of strings")
        if not (isinstance(env, dict) and all(isinstance(k, str) and isinstance(v, str) for k, v in env.items())):
            raise WireError("request: env must map strings to strings")
        if not (isinstance(cpus, list) and all(isinstance(c, int) and c >= 0 for c in cpus)):
            raise WireError("request: cpus must be a list of CPU numbers")
        exe, cwd, umask = msg.get("exe"), msg.get("cwd"), msg.get("umask")
        if not isinstance(exe, str) or not isinstance(cwd, str) or not isinstance(umask, int) \
                or not 0 <= umask <= 0o777:
            raise WireError("request: exe and cwd must be strings, umask a mode")
        return cls(tuple(argv), exe, dict(env), cwd, umask, tuple(cpus))


def exit_msg(status: int) -> Dict[str, Any]:
    """The child's end as ``os.waitpid`` reported it: {"exit": code} or {"signal": number}."""
    if os.WIFSIGNALED(status):
        return {"signal": os.WTERMSIG(status)}
    if os.WIFEXITED(status):
        return {"exit": os.WEXITSTATUS(status)}
    return {"exit": 1}


# ---- decisions ---------------------------------------------------------------------------------------


class Launch(NamedTuple):
    """How the child runs the request: a script path or a module (``-m``), like ``python`` would."""

    module: bool
    target: str
    args: Tuple[str, ...]
    unbuffered: bool = False  # -u or PYTHONUNBUFFERED
    no_bytecode: bool = False  # -B or PYTHONDONTWRITEBYTECODE


class Refusal(NamedTuple):
    """Why a request starts afresh instead (the client says so in one line)."""

    why: str


class Facts(NamedTuple):
    """The warm interpreter's side of the judgement."""

    executable: str  # its sys.executable
    env: Mapping[str, str]  # its environment at its start (before the imports)


def parse_python_args(args: Sequence[str]) -> Union[Launch, Refusal]:
    """The interpreter options the child can honour after the fork (``-u``, ``-B``, ``-m MOD``, a
    script); any other option changes how the interpreter itself starts: Refusal."""
    unbuffered = no_bytecode = False
    i = 0
    while i < len(args):
        arg = args[i]
        if arg == "-m" or (arg.startswith("-m") and len(arg) > 2):
            mod = arg[2:] or (args[i + 1] if i + 1 < len(args) else "")
            rest = args[i + 2:] if arg == "-m" else args[i + 1:]
            if not mod:
                return Refusal("-m without a module")
            return Launch(True, mod, tuple(rest), unbuffered, no_bytecode)
        if arg == "--":
            i += 1
            break
        if arg.startswith("-") and arg != "-":
            flags = arg[1:]
            if not flags or any(f not in "uB" for f in flags):
                return Refusal(f"python option {arg} is not one the warm interpreter can honour")
            unbuffered = unbuffered or "u" in flags
            no_bytecode = no_bytecode or "B" in flags
            i += 1
            continue
        break
    if i >= len(args) or args[i] == "-":
        return Refusal("no script (an interactive python or a script on stdin)")
    return Launch(False, args[i], tuple(args[i + 1:]), unbuffered, no_bytecode)


def import_time_differences(started: Mapping[str, str], env: Mapping[str, str]) -> List[str]:
    """Names of the import-time variables (IMPORT_TIME_PREFIXES, IMPORT_TIME_NAMES) that differ between
    the warm interpreter's start and the rank's environment."""
    def relevant(name: str) -> bool:
        return (name.startswith(IMPORT_TIME_PREFIXES) or name in IMPORT_TIME_NAMES) and name not in CHILD_HONOURS

    names = {n for n in list(started) + list(env) if relevant(n)}
    return sorted(n for n in names if started.get(n) != env.get(n))


def same_interpreter(exe: str, executable: str) -> bool:
    """``exe`` (argv[0] on the client's PATH) is the warm interpreter's own Python: the same file in the
    same folder (a venv's ``bin/python`` is a symlink to the system's: the folder tells two venvs apart)."""
    if not exe or not executable:
        return False
    a, b = os.path.abspath(exe), os.path.abspath(executable)
    return os.path.dirname(a) == os.path.dirname(b) and os.path.realpath(a) == os.path.realpath(b)


def judge(req: Request, facts: Facts) -> Union[Launch, Refusal]:
    """May the warm interpreter run this request, and how."""
    job, own = req.env.get("SLURM_JOB_ID"), facts.env.get("SLURM_JOB_ID")
    if job != own:  # its ranks run in this job's step, die with this job: never another job's rank
        return Refusal(f"the rank is of job {job}, the warm interpreter of job {own}")
    if not same_interpreter(req.exe, facts.executable):
        return Refusal(f"{req.argv[0]} is {req.exe or 'not found'}, the warm interpreter is {facts.executable}")
    differ = import_time_differences(facts.env, req.env)
    if differ:
        shown = ",".join(differ[:4]) + (",..." if len(differ) > 4 else "")
        return Refusal(f"the rank's {shown} differ from the warm interpreter's (read when modules are imported: "
                       f"set them before autoheal sbatch, not in the script)")
    how = parse_python_args(req.argv[1:])
    if isinstance(how, Refusal):
        return how
    # a relative script stays relative (sys.argv[0] as python would have it): the child is in req.cwd
    return Launch(how.module, how.target, how.args, how.unbuffered or bool(req.env.get("PYTHONUNBUFFERED")),
                  how.no_bytecode or bool(req.env.get("PYTHONDONTWRITEBYTECODE")))


def fork_safe(threads: int) -> Optional[str]:
    """None when forking is safe (one thread: a fork copies only the calling thread, and a lock another
    thread held stays locked for ever in the child), else why not."""
    if threads == 1:
        return None
    if threads < 1:
        return "the warm interpreter cannot count its threads (/proc): forking may not be safe"
    return f"the warm interpreter has {threads} threads (a preloaded module started them): forking is not safe"


def thread_count(task_dir: str = "/proc/self/task") -> int:
    """This process's threads, from /proc (0 when it cannot tell: then no fork either)."""
    try:
        return len(os.listdir(task_dir))
    except OSError:
        return 0
