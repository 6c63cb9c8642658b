#!/usr/bin/env python3
"""A tiny deterministic "trainer" for requeue/resume drills and integration tests (stdlib only).

Its state is an order-sensitive running hash of the step numbers, so a run that was preempted and
resumed ends with the same ``final_state`` as an uninterrupted one only if no step was lost or
repeated. Every line it prints starts with ``autoheal-trainer:`` and is flushed at once; see
README.md beside this file for the line formats and exit codes.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import socket
import sys
import time
from pathlib import Path
from typing import Optional

try:
    from autoheal.sbatch_helpers import checkpoint as ck
    from autoheal.sbatch_helpers import preempt
except ImportError:  # running from a source checkout that is not installed
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    import checkpoint as ck  # type: ignore[no-redef]
    import preempt  # type: ignore[no-redef]

EXIT_DONE = 0
EXIT_CRASH = 1  # --crash-at-step, or an unexpected error
EXIT_USAGE = 2
EXIT_PREEMPTED_NOT_SAVED = 98  # stopped on the grace signal, but no checkpoint could be written
EXIT_PREEMPTED = 99  # stopped on the grace signal after the checkpoint was saved (rank 0)

MODULUS = 2**61 - 1


def advance(state: int, step: int) -> int:
    """State after running step number ``step`` (0-based) from ``state``."""
    return (state * 1_000_003 + step + 1) % MODULUS


def expected_final_state(steps: int) -> int:
    state = 0
    for i in range(steps):
        state = advance(state, i)
    return state


def say(text: str) -> None:
    sys.stdout.write(f"autoheal-trainer: {text}\n")
    sys.stdout.flush()


def _word(value: Optional[str], default: str = "none") -> str:
    value = (value or "").strip()
    return re.sub(r"\s+", "_", value) if value else default


def parse_args(argv: Optional[list]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=100, help="total steps (default 100)")
    p.add_argument("--step-seconds", type=float, default=0.2, help="sleep per step (default 0.2)")
    p.add_argument("--checkpoint-every", type=int, default=10, help="save every K steps (default 10)")
    p.add_argument(
        "--checkpoint-dir",
        default=os.environ.get("AUTOHEAL_CHECKPOINT_DIR") or None,
        help="checkpoint folder (default $AUTOHEAL_CHECKPOINT_DIR)",
    )
    p.add_argument("--keep", type=int, default=3, help="checkpoints to keep (default 3)")
    p.add_argument("--crash-at-step", type=int, default=None, help="exit 1 after this step, without saving")
    p.add_argument("--memory-every", type=int, default=0,
                   help="also keep the state in the peer-memory tier every K steps (submit with "
                        "AUTOHEAL_MEMORY_TIER=1; default 0: off)")
    args = p.parse_args(argv)
    if args.steps < 0 or args.checkpoint_every < 1 or args.step_seconds < 0 or args.keep < 1:
        p.error("--steps >= 0, --checkpoint-every >= 1, --step-seconds >= 0 and --keep >= 1 are required")
    return args


def find_start(mgr: Optional[ck.CheckpointManager]) -> Optional[ck.Checkpoint]:
    resume = os.environ.get("AUTOHEAL_RESUME_FROM", "").strip()
    if resume:
        try:
            return ck.open_checkpoint(resume)
        except ck.NoValidCheckpoint as exc:
            say(f"warning AUTOHEAL_RESUME_FROM ignored: {exc}")
    if mgr is None:
        return None
    found = mgr.latest_valid()
    for r in mgr.rejections:
        say(f"warning skipped {r}")
    return found


def load_state(found: ck.Checkpoint) -> tuple:
    doc = json.loads(found.read_bytes().decode("utf-8"))
    if doc.get("step") != found.step or not isinstance(doc.get("state"), int):
        raise ValueError(f"checkpoint {found.path} does not hold a tiny_trainer state")
    return found.step, doc["state"]


def _save(mgr: Optional[ck.CheckpointManager], rank: int, step: int, state: int, steps: int) -> Optional[Path]:
    """Rank 0 saves the state at ``step`` (the other ranks hold the same state: nothing to write)."""
    if mgr is None or rank != 0:
        return None
    payload = json.dumps({"trainer": "tiny", "step": step, "state": state}).encode()
    path = mgr.save(step, payload, {"trainer": "tiny", "state": state, "steps": steps})
    say(f"checkpoint saved step={step} path={path}")
    return path


def _preempted(mgr: Optional[ck.CheckpointManager], rank: int, step: int, state: int, steps: int,
               saved_step: Optional[int], signal_step: int) -> int:
    """The grace signal came: save (rank 0, unless this step is saved already) and say how it ended."""
    sig = preempt.received_signal()
    say(f"signal received {preempt.signal_name(sig) if sig else 'unknown'} at step={signal_step}")
    if rank != 0:
        say(f"preempted step={step} checkpoint=rank0 exit={EXIT_PREEMPTED}")
        return EXIT_PREEMPTED
    try:
        path = _save(mgr, rank, step, state, steps) if saved_step != step \
            else mgr.directory / ck.checkpoint_name(step)  # type: ignore[union-attr]
    except (OSError, ck.CheckpointError) as exc:
        say(f"checkpoint failed step={step} error={_word(str(exc))}")
        path = None
    code = EXIT_PREEMPTED if path else EXIT_PREEMPTED_NOT_SAVED
    say(f"preempted step={step} state={state} checkpoint={path or 'none'} exit={code}")
    return code


def _memory_tier(args: argparse.Namespace):  # -> Optional[memtier.MemoryTier]; imported only when asked for
    if args.memory_every <= 0:
        return None
    from autoheal.sbatch_helpers import memtier

    tier = memtier.MemoryTier.from_env()
    if tier is None:
        say("warning --memory-every without the memory tier's agents (submit with AUTOHEAL_MEMORY_TIER=1)")
    return tier


def _from_memory(tier, found: Optional[ck.Checkpoint], step: int, state: int, origin: str) -> tuple:
    """The newest of the memory copy this rank can reach and the durable checkpoint."""
    copy = tier.newest(min_step=found.step if found else -1)
    if copy is None:
        return step, state, origin
    doc = json.loads(copy.payload.decode("utf-8"))
    if doc.get("step") != copy.step or not isinstance(doc.get("state"), int):
        say(f"warning memory copy from {copy.node} is not a tiny_trainer state; ignored")
        return step, state, origin
    return copy.step, doc["state"], f"memory:{copy.source}@{copy.node}"


def main(argv: Optional[list] = None) -> int:
    args = parse_args(argv)
    rank, world = ck.env_rank(), ck.env_world_size()
    host = os.environ.get("SLURMD_NODENAME") or socket.gethostname()
    restart = os.environ.get("AUTOHEAL_RESTART_COUNT") or os.environ.get("SLURM_RESTART_COUNT") or "0"
    reason = _word(os.environ.get("AUTOHEAL_REQUEUE_REASON"))

    mgr = ck.CheckpointManager(args.checkpoint_dir, keep=args.keep, rank=rank) if args.checkpoint_dir else None
    if mgr is None:
        say("warning no checkpoint dir (--checkpoint-dir or AUTOHEAL_CHECKPOINT_DIR): not saving")

    progress = {"step": 0}
    preempt.on_preempt(lambda signum: progress.setdefault("signal_step", progress["step"]))

    found = find_start(mgr)
    step, state = load_state(found) if found else (0, 0)
    origin = str(found.path) if found else "none"
    tier = _memory_tier(args)
    if tier is not None:
        step, state, origin = _from_memory(tier, found, step, state, origin)
    progress["step"] = step
    say(
        f"start step={step} resumed_from={origin} restart={_word(restart, '0')} "
        f"host={host} rank={rank} world={world} steps={args.steps} reason={reason}"
    )
    saved_step = step if found else None

    while step < args.steps:
        if args.step_seconds:
            time.sleep(args.step_seconds)
        state = advance(state, step)
        step += 1
        progress["step"] = step
        say(f"step={step}")
        if args.crash_at_step is not None and step >= args.crash_at_step:
            say(f"crash requested at step={step}")
            return EXIT_CRASH
        if preempt.preempt_requested():
            return _preempted(mgr, rank, step, state, args.steps, saved_step, progress["signal_step"])
        if step % args.checkpoint_every == 0 and step < args.steps:
            _save(mgr, rank, step, state, args.steps)
            saved_step = step
        if tier is not None and step % args.memory_every == 0 and step < args.steps:
            kept = tier.save(step, json.dumps({"trainer": "tiny", "step": step, "state": state}).encode())
            say(f"memory saved step={step} nodes={','.join(kept.stored) or 'none'}")
    if saved_step != step:
        _save(mgr, rank, step, state, args.steps)
    say(f"done step={step} final_state={state}")
    return EXIT_DONE


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:
        sys.exit(130)
