"""``autoheal-healthcheck``: Slurm's HealthCheckProgram.

Runs every check for ``$SLURMD_NODENAME``, drains the node on failure with ``autoheal: <reason>``,
climbs the recovery ladder once the node is drained and idle, and resumes a drain of ours after
``hooks.resume_after_passes`` passing runs and ``hooks.resume_cooldown``. Takes no arguments (Slurm
passes none) and imports neither click nor requests: its start-up time is the budget.

Exit codes: 0 healthy, 1 failed (node drained), 2 could not tell (NVML unknown, slurmctld unreachable,
bad config or one that crashes the loader, a node state that cannot be saved, any trouble of its own:
one line, a journal record, never a traceback). Slurm only logs the exit code; the drain is done here.
"""

from __future__ import annotations

import os
import sys


def run(source: str = "healthcheck") -> int:
    from autoheal.hooks.context import Context, report_own_trouble
    from autoheal.hooks.engine import health_pass

    try:
        ctx = Context.load(source)
    except Exception as exc:  # ConfigError, and whatever a broken config makes the loader raise
        report_own_trouble(source, None, "config", exc)
        return 2
    try:
        p = health_pass(ctx)
        trouble = ctx.store.trouble
        line = p.summary()
        for err in p.errors:
            line += f" [{err}]"
        print(line, file=sys.stderr if p.exit_code else sys.stdout)
        if trouble:
            report_own_trouble(source, ctx, "node state", trouble)
        # a requeued job's copies in node memory, left here once it is over (jobhook.sweep_memory_tier)
        from autoheal.hooks.jobhook import sweep_memory_tier

        sweep_memory_tier(ctx, source)
        return p.exit_code
    except Exception as exc:  # our own trouble (a bug, a disk): "could not tell", never a traceback
        report_own_trouble(source, ctx, "internal error", exc)
        return 2
    finally:
        ctx.close()


def main() -> None:
    from autoheal.hooks.hookargs import early_exit

    asked = early_exit("autoheal-healthcheck", __doc__, sys.argv[1:])
    if asked is not None:
        sys.exit(asked)
    try:
        code = run()
    except BaseException as exc:  # last line of defence: one line, exit 2, never a traceback
        print(f"autoheal-healthcheck: error: {type(exc).__name__}: {exc}", file=sys.stderr)
        code = 2
    sys.stdout.flush()
    sys.stderr.flush()
    # os._exit: an NVML worker thread may still be stuck in the driver; do not wait for it at exit.
    os._exit(code)


if __name__ == "__main__":
    main()
