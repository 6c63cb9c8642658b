#!/usr/bin/env python3
"""A minimal PyTorch DDP trainer (CPU, gloo) that checkpoints with autoheal's API.

Run one process per task (``srun python ddp_trainer.py``) or a single process. The rendezvous address
is computed inside the step from ``MASTER_ADDR``/``MASTER_PORT`` or the step's node list, so it stays
right when a requeued job lands on other nodes. All ranks agree at each step boundary whether a
preemption signal arrived (an all-reduce of the flag), so they stop together; rank 0 saves with
``mgr.saving()`` + ``torch.save``. Output lines and exit codes match tiny_trainer.py (README.md).
"""

from __future__ import annotations

import argparse
import hashlib
import os
import re
import socket
import sys
import time
from datetime import timedelta
from pathlib import Path
from typing import Any, Optional, Tuple

try:
    from autoheal.sbatch_helpers import checkpoint as ck
    from autoheal.sbatch_helpers import preempt
except ImportError:  # running from a source checkout that is not installed
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    import checkpoint as ck  # type: ignore[no-redef]
    import preempt  # type: ignore[no-redef]

try:
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel
except ImportError as _exc:  # reported by main(), so importing this file never fails
    torch = None  # type: ignore[assignment]
    _TORCH_ERROR: Optional[str] = str(_exc)
else:
    _TORCH_ERROR = None

EXIT_DONE = 0
EXIT_CRASH = 1
EXIT_USAGE = 2
EXIT_NO_TORCH = 3  # PyTorch is not installed
EXIT_PREEMPTED_NOT_SAVED = 98
EXIT_PREEMPTED = 99

MODEL_FILE = "model.pt"


def say(text: str) -> None:
    sys.stdout.write(f"autoheal-trainer: {text}\n")
    sys.stdout.flush()


def first_host(nodelist: str) -> Optional[str]:
    """First host of a Slurm node list: ``gpu[03-05,07],cpu1`` -> ``gpu03``."""
    m = re.match(r"\s*([^,\[\s]+)(?:\[([^\]]+)\])?", nodelist or "")
    if not m:
        return None
    prefix, ranges = m.group(1), m.group(2)
    if not ranges:
        return prefix
    return prefix + ranges.split(",")[0].split("-")[0]


def rendezvous(world: int) -> tuple:
    env = os.environ
    addr = env.get("MASTER_ADDR") or first_host(env.get("SLURM_STEP_NODELIST") or env.get("SLURM_JOB_NODELIST", ""))
    port = env.get("MASTER_PORT")
    if not port:
        job = env.get("SLURM_JOB_ID", "")
        if job.isdigit():
            port = str(20000 + int(job) % 20000)
        elif world == 1:
            with socket.socket() as s:
                s.bind(("127.0.0.1", 0))
                port = str(s.getsockname()[1])
        else:
            port = "29500"
    return addr or "127.0.0.1", int(port)


def parse_args(argv: Optional[list]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=50)
    p.add_argument("--step-seconds", type=float, default=0.0, help="extra sleep per step")
    p.add_argument("--checkpoint-every", type=int, default=10)
    p.add_argument("--checkpoint-dir", default=os.environ.get("AUTOHEAL_CHECKPOINT_DIR") or None)
    p.add_argument("--keep", type=int, default=3)
    p.add_argument("--timeout", type=float, default=300.0, help="process group timeout, seconds")
    args = p.parse_args(argv)
    if args.steps < 0 or args.checkpoint_every < 1 or args.keep < 1:
        p.error("--steps >= 0, --checkpoint-every >= 1 and --keep >= 1 are required")
    return args


def batch(step: int, rank: int, world: int):
    g = torch.Generator().manual_seed(step * world + rank)
    x = torch.randn(16, 8, generator=g)
    return x, x.sum(dim=1, keepdim=True)


def state_digest(model) -> str:
    h = hashlib.sha256()
    for name, t in sorted(model.state_dict().items()):
        h.update(name.encode())
        h.update(",".join(float(v).hex() for v in t.detach().cpu().flatten().tolist()).encode())
    return h.hexdigest()[:16]


def _torch_load(path: Path):
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except TypeError:  # torch < 1.13 has no weights_only
        return torch.load(path, map_location="cpu")


def pick_resume(mgr: Optional[ck.CheckpointManager]) -> Optional[ck.Checkpoint]:
    """Rank 0's choice: ``AUTOHEAL_RESUME_FROM`` if it verifies, else the newest valid checkpoint."""
    resume = os.environ.get("AUTOHEAL_RESUME_FROM", "").strip()
    if resume:
        try:
            return ck.open_checkpoint(resume)
        except ck.NoValidCheckpoint as exc:
            say(f"warning AUTOHEAL_RESUME_FROM ignored: {exc}")
    found = mgr.latest_valid() if mgr else None
    for r in mgr.rejections if mgr else []:
        say(f"warning skipped {r}")
    return found


def resolve_step(step: int, mgr: Optional[ck.CheckpointManager]) -> ck.Checkpoint:
    """On the other ranks: the checkpoint rank 0 chose, found by its step (shared filesystem)."""
    resume = os.environ.get("AUTOHEAL_RESUME_FROM", "").strip()
    if resume:
        with_step = None
        try:
            with_step = ck.checkpoint_step(resume)
        except ValueError:
            pass
        if with_step == step:
            return ck.open_checkpoint(resume, verify="size")
    if mgr is None:
        raise ck.NoValidCheckpoint(f"rank 0 resumes from step {step} but this rank has no checkpoint dir")
    return mgr.load(step, verify="size")


def main(argv: Optional[list] = None) -> int:
    args = parse_args(argv)
    if torch is None:
        sys.stderr.write(
            f"autoheal-trainer: error ddp_trainer.py needs PyTorch, which is not importable ({_TORCH_ERROR}); "
            "install it (pip install torch) or use tiny_trainer.py\n"
        )
        return EXIT_NO_TORCH
    rank, world = ck.env_rank(), ck.env_world_size()
    host = os.environ.get("SLURMD_NODENAME") or socket.gethostname()
    restart = os.environ.get("AUTOHEAL_RESTART_COUNT") or os.environ.get("SLURM_RESTART_COUNT") or "0"
    preempt.on_preempt()

    addr, port = rendezvous(world)
    dist.init_process_group(
        "gloo", init_method=f"tcp://{addr}:{port}", rank=rank, world_size=world,
        timeout=timedelta(seconds=args.timeout),
    )
    code = _train(args, rank, world, host, restart)
    dist.barrier()  # leave together: a rank tearing down early makes gloo abort its peers
    dist.destroy_process_group()
    return code


def _resume(mgr: Any, rank: int, model: Any, opt: Any) -> Tuple[Any, int]:
    """Every rank loads the checkpoint rank 0 chose (the newest valid one): (it, its step), or (None, 0)."""
    found = pick_resume(mgr) if rank == 0 else None
    chosen = torch.tensor([found.step if found else -1], dtype=torch.long)
    dist.broadcast(chosen, src=0)  # every rank resumes from rank 0's choice
    if chosen.item() < 0:
        return found, 0
    if rank != 0 or found is None:  # rank 0 chose `found` (never None here)
        found = resolve_step(int(chosen.item()), mgr)
    state = _torch_load(found.file(MODEL_FILE))
    model.module.load_state_dict(state["model"])
    opt.load_state_dict(state["optim"])
    return found, int(state["step"])


def _save(mgr: Any, rank: int, world: int, model: Any, opt: Any, step: int) -> Optional[Path]:
    """Rank 0 saves model and optimiser at ``step``; every rank waits for it (a barrier)."""
    if rank == 0 and mgr is not None:
        meta = {"trainer": "ddp", "world_size": world, "state": state_digest(model.module)}
        with mgr.saving(step, meta) as tmp:
            torch.save({"model": model.module.state_dict(), "optim": opt.state_dict(), "step": step},
                       tmp / MODEL_FILE)
        path: Optional[Path] = mgr.directory / ck.checkpoint_name(step)
        say(f"checkpoint saved step={step} path={path}")
    else:
        path = None
    dist.barrier()
    return path


def _train(args: argparse.Namespace, rank: int, world: int, host: str, restart: str) -> int:
    mgr = ck.CheckpointManager(args.checkpoint_dir, keep=args.keep, rank=rank) if args.checkpoint_dir else None
    torch.manual_seed(0)
    model = DistributedDataParallel(torch.nn.Linear(8, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)

    found, step = _resume(mgr, rank, model, opt)
    say(
        f"start step={step} resumed_from={found.path if found else 'none'} restart={restart} host={host} rank={rank} "
        f"world={world} steps={args.steps}"
    )

    def save() -> Optional[Path]:
        return _save(mgr, rank, world, model, opt, step)

    loss = float("nan")
    saved_step = step if found else None
    while step < args.steps:
        x, y = batch(step, rank, world)
        opt.zero_grad()
        out = torch.nn.functional.mse_loss(model(x), y)
        out.backward()
        opt.step()
        loss = out.item()
        step += 1
        if rank == 0:
            say(f"step={step} loss={loss:.6f}")
        if args.step_seconds:
            time.sleep(args.step_seconds)
        flag = torch.tensor([1 if preempt.preempt_requested() else 0])
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        if flag.item():
            sig = preempt.received_signal()
            say(f"signal received {preempt.signal_name(sig) if sig else 'peer'} at step={step}")
            if saved_step != step:
                path = save()
            else:
                path = mgr.directory / ck.checkpoint_name(step) if (mgr and rank == 0) else None
            code = EXIT_PREEMPTED if (path or rank != 0) else EXIT_PREEMPTED_NOT_SAVED
            say(f"preempted step={step} checkpoint={path or ('rank0' if rank else 'none')} exit={code}")
            return code
        if step % args.checkpoint_every == 0 and step < args.steps:
            save()
            saved_step = step
    if saved_step != step:
        save()
    say(f"done step={step} loss={loss:.6f} final_state={state_digest(model.module)}")
    return EXIT_DONE


if __name__ == "__main__":
    exit_code = main()
    if exit_code in (EXIT_PREEMPTED, EXIT_PREEMPTED_NOT_SAVED):
        # Preempted: the checkpoint is on disk (fsync'd, renamed, marker last) and the process group is
        # gone. Skip the interpreter's teardown of torch: seconds on a busy node (3-4 s measured on the
        # lab), during which torchrun, srun and the autoheal runner wait for this process before the
        # job can be requeued.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(exit_code)
    sys.exit(exit_code)
