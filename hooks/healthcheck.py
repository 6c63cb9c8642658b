"""``autoheal-healthcheck``: Slurm's HealthCheckProgram.

Runs every check for ``$SLURMD_NODENAME``, drains the node on failure with ``autoheal: <reason>``,
climbs the recovery ladder once the node is drained and idle, and resumes a drain of ours after
``hooks.resume_after_passes`` passing runs and ``hooks.resume_cooldown``. Takes no arguments (Slurm
passes none) and imports neither click nor requests: its start-up time is the budget.

Exit codes: 0 healthy, 1 failed (node drained), 2 could not tell (NVML unknown, slurmctld unreachable,
bad config). Slurm only logs the exit code; the drain is done here.
"""

from __future__ import annotations

import os
import sys


def run(source: str = "healthcheck") -> int:
    from autoheal.errors import AutohealError

    try:
        from autoheal.hooks.context import Context
        from autoheal.hooks.engine import health_pass

        ctx = Context.load(source)
        p = health_pass(ctx)
    except AutohealError as exc:
        print(f"autoheal-healthcheck: error: {exc}", file=sys.stderr)
        return 2
    except TimeoutError as exc:  # state lock held by a stuck hook
        print(f"autoheal-healthcheck: error: {exc}", file=sys.stderr)
        return 2
    line = p.summary()
    for err in p.errors:
        line += f" [{err}]"
    print(line, file=sys.stderr if p.exit_code else sys.stdout)
    return p.exit_code


def main() -> None:
    code = run()
    sys.stdout.flush()
    sys.stderr.flush()
    # os._exit: an NVML worker thread may still be stuck in the driver; do not wait for it at exit.
    os._exit(code)


if __name__ == "__main__":
    main()
