"""The job runner's side of the memory tier: start one agent per node of the allocation, stop them.

The agents are one Slurm step (``srun --overlap``: they share the job's CPUs instead of waiting for
them; ``--no-kill``: a node that dies takes its agent, not the others'), so Slurm ends them with the
job; the epilog kills what a kill -9 of the job left. Each agent's ready line comes back through
srun's stdout; the runner exports ``AUTOHEAL_MEMTIER_AGENTS`` from them to the user's script.
"""

from __future__ import annotations

import atexit
import os
import re
import selectors
import shutil
import signal
import subprocess
import sys
import time
from typing import Any, Dict, List, Mapping, Optional, Sequence

from autoheal.sbatch_helpers.memtier import AGENTS_ENV, ENABLE_ENV
from autoheal.sbatch_helpers.memtier_agent import READY

#: The agents' step name: the runner never kills this step when it ends a hung one (hang detection).
AGENT_STEP_NAME = "autoheal-memtier"
START_TIMEOUT = 30.0
STOP_TIMEOUT = 5.0
_READY_RE = re.compile(re.escape(READY) + r" node=(\S+) addr=(\S+) port=(\d+)")
_TRUE = frozenset({"1", "true", "yes", "on"})


def wanted(env: Mapping[str, str]) -> bool:
    return env.get(ENABLE_ENV, "").strip().lower() in _TRUE


def agent_argv(srun: str, nodes: Sequence[str]) -> List[str]:
    n = str(len(nodes))
    return [srun, "--overlap", "--no-kill", "--kill-on-bad-exit=0", f"--job-name={AGENT_STEP_NAME}", "-N", n,
            "-n", n, "--ntasks-per-node=1", f"--nodelist={','.join(nodes)}", "--cpus-per-task=1",
            sys.executable, "-m", "autoheal.sbatch_helpers.memtier_agent"]


def parse_ready(lines: Sequence[str]) -> Dict[str, str]:
    """{node: "addr:port"} from the agents' ready lines."""
    found = {}
    for line in lines:
        m = _READY_RE.search(line)
        if m:
            found[m.group(1)] = f"{m.group(2)}:{m.group(3)}"
    return found


class AgentStep:
    """The agents' srun step."""

    def __init__(self, proc: subprocess.Popen, agents: Dict[str, str]):
        self.proc, self.agents = proc, agents

    @classmethod
    def start(cls, nodes: Sequence[str], env: Mapping[str, str], say=print,
              timeout: float = START_TIMEOUT) -> Optional[AgentStep]:
        """Start the agents and wait for their ready lines; None (and a warning) when none came up."""
        srun = shutil.which("srun", path=env.get("PATH"))
        if not srun or not nodes:
            say("warning: memory tier off: " + ("srun not found" if not srun else "the job's nodes are unknown"))
            return None
        proc = subprocess.Popen(agent_argv(srun, nodes), env=dict(env), stdout=subprocess.PIPE,
                                stdin=subprocess.DEVNULL, start_new_session=True)
        assert proc.stdout is not None
        began = time.monotonic()
        lines = _read_lines(proc, len(nodes), timeout)
        agents = parse_ready(lines)
        for line in lines:
            if "unavailable" in line:
                say(f"warning: {line.strip()}")
        if not agents:
            ended = proc.poll()
            say("warning: memory tier off: " + (f"the agents' srun exited with {ended}" if ended is not None
                                                else f"no agent came up within {timeout:g}s"))
            cls(proc, {}).stop()
            return None
        missing = sorted(set(nodes) - set(agents))
        none_on = (f"; none on {','.join(missing)} after {time.monotonic() - began:.1f}s "
                   f"(srun {'running' if proc.poll() is None else f'exited {proc.returncode}'})") if missing else ""
        say(f"memory tier: agents on {','.join(sorted(agents))}{none_on}")
        return cls(proc, agents)

    def env(self) -> Dict[str, str]:
        return {AGENTS_ENV: ",".join(f"{n}={a}" for n, a in sorted(self.agents.items()))}

    def stop(self) -> None:
        """SIGTERM the step (srun forwards it to every agent), SIGKILL after STOP_TIMEOUT."""
        if self.proc.poll() is not None:
            return
        try:
            os.killpg(self.proc.pid, signal.SIGTERM)
            self.proc.wait(STOP_TIMEOUT)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(STOP_TIMEOUT)
        except (ProcessLookupError, ChildProcessError):
            pass


def _read_lines(proc: subprocess.Popen, want: int, timeout: float) -> List[str]:
    """Lines from the step's stdout until ``want`` agents answered (ready or unavailable) or the timeout."""
    assert proc.stdout is not None
    sel = selectors.DefaultSelector()
    sel.register(proc.stdout, selectors.EVENT_READ)
    buf, lines = b"", []  # type: bytes, List[str]
    deadline = time.monotonic() + timeout
    while len(lines) < want and time.monotonic() < deadline:
        if not sel.select(max(0.0, deadline - time.monotonic())):
            break
        chunk = os.read(proc.stdout.fileno(), 65536)
        if not chunk:
            break
        buf += chunk
        *done, buf = buf.split(b"\n")
        lines += [d.decode("utf-8", "replace") for d in done if d.startswith(b"autoheal-memtier-agent:")]
    sel.close()
    return lines


def start_for_runner(runner: Any, env: Dict[str, str]) -> Dict[str, str]:
    """The runner's one call: agents on every node of the allocation (spares too: a rank restarted on a
    spare stores there), stopped when the runner exits; the user's script's environment with the
    agents' addresses (also kept in the runner's own base environment, for hot-spare restarts)."""
    from autoheal.sbatch_helpers.runner import say

    if not wanted(env):
        return env
    # the batch environment, not the step's: a hot-spare job's step environment keeps srun off the spares
    step = AgentStep.start(list(runner.job_nodes), runner.env, say=say)
    if step is None:
        return env
    atexit.register(step.stop)
    runner.env.update(step.env())
    return dict(env, **step.env())
