"""The job runner's side of the warm interpreters (``autoheal sbatch --preload MODULES``; ``warm.py``).

One Slurm step, like the memory tier's agents (``memtier_launch.py``): ``srun --overlap`` (it shares the
job's resources instead of waiting for them), ``--no-kill`` (a node that dies takes its warm interpreter,
not the others'), its own step name (the runner's hang handling never ends it), one task per node of the
allocation, the spares included: a rank restarted on a spare finds one there. No ``--cpus-per-task``
(which implies ``--exact``): the step holds every CPU the job has on the node, because the ranks forked
from it run in its cgroup. The runner does not wait for the imports (seconds): the user's script starts
at once, and its first ranks start afresh if their node's warm interpreter is not ready yet. Its lines
(ready, import time) go to the job's output.
"""

from __future__ import annotations

import atexit
import shutil
import subprocess
import sys
from typing import Any, Dict, List, Sequence

from autoheal.sbatch_helpers import warm


def zygote_argv(srun: str, nodes: Sequence[str], preload: Sequence[str]) -> List[str]:
    n = str(len(nodes))
    return [srun, "--overlap", "--no-kill", "--kill-on-bad-exit=0", f"--job-name={warm.STEP_NAME}", "-N", n,
            "-n", n, "--ntasks-per-node=1", f"--nodelist={','.join(nodes)}", "--input=none",
            sys.executable, "-m", "autoheal.sbatch_helpers.warm_zygote", "--preload", ",".join(preload)]


def start_for_runner(runner: Any, env: Dict[str, str]) -> Dict[str, str]:
    """The runner's one call: warm interpreters on every node of the allocation, stopped when the runner
    exits; the user's script's environment (and the runner's own, for hot-spare restarts) says which
    modules they preload (``AUTOHEAL_PRELOAD``: ``autoheal-warm`` uses a warm interpreter only then)."""
    from autoheal.sbatch_helpers.memtier_launch import AgentStep
    from autoheal.sbatch_helpers.runner import say

    modules = warm.parse_preload(getattr(runner.opts, "preload", "") or "")
    if not modules:
        return env
    srun = shutil.which("srun", path=runner.env.get("PATH"))
    nodes = list(runner.job_nodes)
    if not srun or not nodes:
        say("warning: no warm interpreters: " + ("srun not found" if not srun else "the job's nodes are unknown"))
        return env
    preload = ",".join(modules)
    # the batch environment, not the step's: a hot-spare job's step environment keeps srun off the spares
    proc = subprocess.Popen(zygote_argv(srun, nodes, modules), env=dict(runner.env, **{warm.PRELOAD_ENV: preload}),
                            stdin=subprocess.DEVNULL, start_new_session=True)
    atexit.register(AgentStep(proc, {}).stop)
    say(f"warm interpreters: starting on {','.join(nodes)}, preloading {preload} (ranks started with "
        f"autoheal-warm use their node's once it is ready)")
    runner.env[warm.PRELOAD_ENV] = preload
    return dict(env, **{warm.PRELOAD_ENV: preload})
