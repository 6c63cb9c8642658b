#!/usr/bin/env python3
"""A minimal PyTorch DDP trainer (CPU, gloo) that checkpoints with autoheal's API.

Run one process per task (``srun python ddp_trainer.py``) or a single process. The rendezvous address
is computed inside the step from ``MASTER_ADDR``/``MASTER_PORT`` or the step's node list, so it stays
right when a requeued job lands on other nodes. All ranks agree at each step boundary whether a
preemption signal arrived (an all-reduce of the flag), so they stop together; rank 0 saves with
``mgr.saving()`` + ``torch.save``. Output lines and exit codes match tiny_trainer.py (README.md).

With the peer-memory tier (submitted with ``AUTOHEAL_MEMORY_TIER=1``) every rank also hands its state to
the tier every ``--memory-every`` K steps (default 1 then), and a restart resumes from the newer of the
durable checkpoint and the newest step every rank still has in memory (``memtier.resume_source``), so
a node lost between two durable saves costs at most K steps.

``--device lab`` (the autoheal lab only) runs every step on the step's fake GPUs
(``autoheal_lab.fakedevice``): the forward pass, the backward pass and the optimizer step are GPU calls,
and the collectives (DDP's gradient all-reduce inside ``backward()``, the preemption flag, the barriers)
behave as NCCL's: a lab fault reaches the rank as on real hardware. Without it (the default, and on a
real cluster) nothing of the lab is imported.
"""

from __future__ import annotations

import argparse
import hashlib
import io
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
    from autoheal.sbatch_helpers import progress as hb
except ImportError:  # running from a source checkout that is not installed
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    import checkpoint as ck  # type: ignore[no-redef]
    import preempt  # type: ignore[no-redef]
    import progress as hb  # type: ignore[no-redef]

# the start line says whether torch was imported before this script began (a warm interpreter,
# autoheal sbatch --preload) and what importing it took here
_TORCH_PRELOADED = "torch" in sys.modules
_IMPORT_T0 = time.perf_counter()
try:
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel
except ImportError as _exc:  # reported by main(), so importing this file never fails
    torch = None  # type: ignore[assignment]
    _TORCH_ERROR: Optional[str] = str(_exc)
else:
    _TORCH_ERROR = None
_IMPORT_MS = 1000 * (time.perf_counter() - _IMPORT_T0)

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


def _word(value: str) -> str:
    return re.sub(r"\s+", "_", value.strip()) or "none"


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
    p.add_argument("--memory-every", type=int, default=None, metavar="K",
                   help="keep each rank's state in the peer-memory tier every K steps (default: 1 when the job was "
                        "submitted with AUTOHEAL_MEMORY_TIER=1, else off; 0: off)")
    p.add_argument("--device", choices=("none", "lab"), default="none",
                   help="lab: run each step on the step's fake GPUs (autoheal_lab.fakedevice): a lab fault reaches "
                        "the rank as on real hardware (default none: CPU only)")
    args = p.parse_args(argv)
    if args.steps < 0 or args.checkpoint_every < 1 or args.keep < 1:
        p.error("--steps >= 0, --checkpoint-every >= 1 and --keep >= 1 are required")
    if args.memory_every is not None and args.memory_every < 0:
        p.error("--memory-every must be >= 0")
    return args


class _NoDevice:
    """The default: CPU only, no GPU calls; the collective is just the call. ``--device lab`` puts a
    fakedevice.FakeDevice, which has the same methods, in its place."""

    def step(self) -> None:
        pass

    def copy_to_host(self) -> None:
        pass

    def collective(self, call, timeout: float, signals=()):
        return call()

    def describe(self) -> str:
        return "none"


DEVICE: Any = _NoDevice()
DEVICE_ERRORS: tuple = ()  # the device's error types (set by _open_device)
COLLECTIVE_TIMEOUT = 300.0  # --timeout: how long a collective may block (the process group's timeout)


def _open_device(args: argparse.Namespace) -> None:
    """``--device lab``: the step's fake GPUs (imported only then: a real cluster never imports the lab)."""
    global DEVICE, DEVICE_ERRORS, COLLECTIVE_TIMEOUT
    COLLECTIVE_TIMEOUT = args.timeout
    if args.device == "lab":
        from autoheal_lab import fakedevice

        DEVICE_ERRORS = (fakedevice.DeviceError,)
        DEVICE = fakedevice.FakeDevice.from_env()
        say(f"device lab gpus={DEVICE.describe()}")


def collective(call):
    """A collective among the ranks (gloo here, NCCL on GPUs), as the device meets it (``--device lab``:
    a link down hangs it, a dead peer blocks it until the timeout, as NCCL's)."""
    return DEVICE.collective(call, COLLECTIVE_TIMEOUT, signals=preempt.default_signals())


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
    progress = {"step": 0}
    try:
        _open_device(args)
        addr, port = rendezvous(world)
        dist.init_process_group(
            "gloo", init_method=f"tcp://{addr}:{port}", rank=rank, world_size=world,
            timeout=timedelta(seconds=args.timeout),
        )
        code = _train(args, rank, world, host, restart, progress)
        collective(dist.barrier)  # leave together: a rank tearing down early makes gloo abort its peers
    except DEVICE_ERRORS as exc:  # an uncaught CUDA error (or NCCL's watchdog) ends the rank without saving
        kind = "collective failed" if type(exc).__name__ == "CollectiveTimeout" else "device error"
        say(f"{kind} step={progress['step']} error={_word(str(exc))} exit={EXIT_CRASH}")
        return EXIT_CRASH
    dist.destroy_process_group()
    return code


def _memory_tier(args: argparse.Namespace) -> Any:
    """The peer-memory tier (``memtier.MemoryTier``) when the job was submitted with it and K > 0, else None
    (nothing of it is imported then). Sets ``args.memory_every`` to the K in use."""
    wanted = os.environ.get("AUTOHEAL_MEMORY_TIER", "").strip().lower() in ("1", "true", "yes", "on")
    if args.memory_every is None:
        args.memory_every = 1 if wanted else 0
    if args.memory_every <= 0:
        return None
    tier = ck.memory_tier()
    if tier is None:
        say("warning --memory-every without the memory tier's agents (submit with AUTOHEAL_MEMORY_TIER=1)")
    return tier


def _state_bytes(model: Any, opt: Any, step: int) -> bytes:
    buf = io.BytesIO()
    torch.save({"model": model.module.state_dict(), "optim": opt.state_dict(), "step": step}, buf)
    return buf.getvalue()


def _load_state(model: Any, opt: Any, state: dict) -> int:
    model.module.load_state_dict(state["model"])
    opt.load_state_dict(state["optim"])
    return int(state["step"])


def _memory_copy(tier: Any, durable: int) -> Any:
    """This rank's copy at the newest step every rank has in memory, if newer than the durable ``durable``
    (memtier.resume_source); None otherwise. Every rank must come to the same step, or none uses memory:
    their steps are compared with an all-reduce (max of the step and of its negation)."""
    copy = tier.newest(min_step=durable, consistent=True) if tier is not None else None
    from_memory = None
    if copy is not None:
        from autoheal.sbatch_helpers import memtier

        pick = memtier.resume_source(copy, durable if durable >= 0 else None)
        from_memory = copy if pick is not None and pick[0] != "durable" else None
    mine = from_memory.step if from_memory is not None else -1
    both = torch.tensor([mine, -mine], dtype=torch.long)
    collective(lambda: dist.all_reduce(both, op=dist.ReduceOp.MAX))
    agreed = int(both[0].item()) == -int(both[1].item())
    return from_memory if agreed and mine >= 0 else None


def _resume(mgr: Any, rank: int, model: Any, opt: Any, tier: Any) -> Tuple[str, int, bool]:
    """Every rank loads what rank 0 chose (the newest valid durable checkpoint) unless every rank has a newer
    memory copy of one step: (where from, its step, whether that is a durable checkpoint)."""
    found = pick_resume(mgr) if rank == 0 else None
    chosen = torch.tensor([found.step if found else -1], dtype=torch.long)
    collective(lambda: dist.broadcast(chosen, src=0))  # every rank resumes from rank 0's choice
    copy = _memory_copy(tier, int(chosen.item())) if tier is not None else None
    if copy is not None:
        state = torch.load(io.BytesIO(copy.payload), map_location="cpu", weights_only=True)
        return f"memory:{copy.source}@{copy.node}", _load_state(model, opt, state), False
    if chosen.item() < 0:
        return "none", 0, False
    if rank != 0 or found is None:  # rank 0 chose `found` (never None here)
        found = resolve_step(int(chosen.item()), mgr)
    return str(found.path), _load_state(model, opt, _torch_load(found.file(MODEL_FILE))), True


def _save_memory(tier: Any, model: Any, opt: Any, step: int) -> None:
    """This rank's state into the memory tier (its node and its peer): off the GPU first."""
    DEVICE.copy_to_host()
    kept = tier.save(step, _state_bytes(model, opt, step))
    say(f"memory saved step={step} nodes={','.join(kept.stored) or 'none'}")


def _save(mgr: Any, rank: int, world: int, model: Any, opt: Any, step: int) -> Optional[Path]:
    """Rank 0 saves model and optimiser at ``step``; every rank waits for it (a barrier)."""
    if rank == 0 and mgr is not None:
        DEVICE.copy_to_host()  # the state comes off the GPU first: impossible from a GPU that is gone
        meta = {"trainer": "ddp", "world_size": world, "state": state_digest(model.module)}
        with mgr.saving(step, meta) as tmp:
            torch.save({"model": model.module.state_dict(), "optim": opt.state_dict(), "step": step},
                       tmp / MODEL_FILE)
        path: Optional[Path] = mgr.directory / ck.checkpoint_name(step)
        say(f"checkpoint saved step={step} path={path}")
    else:
        path = None
    collective(dist.barrier)
    return path


def _train_step(model: Any, opt: Any, step: int, rank: int, world: int) -> float:
    """One step: forward, backward (DDP all-reduces the gradients inside it: the collective), update;
    each is a GPU call on the rank's device. Returns the loss."""
    x, y = batch(step, rank, world)
    opt.zero_grad()
    DEVICE.step()  # the forward pass's kernels
    out = torch.nn.functional.mse_loss(model(x), y)
    collective(out.backward)
    DEVICE.step()  # the optimizer's kernels
    opt.step()
    return out.item()


def _agree_preempted() -> bool:
    """Whether any rank got the grace signal (an all-reduce of the flag): the ranks stop together."""
    flag = torch.tensor([1 if preempt.preempt_requested() else 0])
    collective(lambda: dist.all_reduce(flag, op=dist.ReduceOp.MAX))
    return bool(flag.item())


def _preempted(mgr: Any, rank: int, step: int, saved_step: Optional[int], save) -> int:
    """Every rank agreed that a grace signal came: rank 0 saves (unless this step is saved already)."""
    sig = preempt.received_signal()
    say(f"signal received {preempt.signal_name(sig) if sig else 'peer'} at step={step}")
    if saved_step != step:
        path = save()
    else:
        path = mgr.directory / ck.checkpoint_name(step) if (mgr and rank == 0) else None
    code = EXIT_PREEMPTED if (path or rank != 0) else EXIT_PREEMPTED_NOT_SAVED
    say(f"preempted step={step} checkpoint={path or ('rank0' if rank else 'none')} exit={code}")
    return code


def _train(args: argparse.Namespace, rank: int, world: int, host: str, restart: str, progress: dict) -> int:
    mgr = ck.CheckpointManager(args.checkpoint_dir, keep=args.keep, rank=rank) if args.checkpoint_dir else None
    torch.manual_seed(0)
    model = DistributedDataParallel(torch.nn.Linear(8, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)

    tier = _memory_tier(args)
    origin, step, durable = _resume(mgr, rank, model, opt, tier)
    progress["step"] = step
    say(
        f"start step={step} resumed_from={origin} restart={restart} host={host} rank={rank} "
        f"world={world} steps={args.steps} torch_import_ms={_IMPORT_MS:.0f} "
        f"torch_preloaded={'yes' if _TORCH_PRELOADED else 'no'} "
        f"warm={os.environ.get('AUTOHEAL_WARM') or 'no'}"  # set by the warm interpreter (autoheal-warm)
    )

    def save() -> Optional[Path]:
        return _save(mgr, rank, world, model, opt, step)

    loss = float("nan")
    saved_step = step if durable else None  # a memory copy is not on the durable tier
    while step < args.steps:
        loss = _train_step(model, opt, step, rank, world)
        step += 1
        progress["step"] = step
        hb.heartbeat(step)  # the runner's hang detection: this rank made progress (a no-op outside autoheal sbatch)
        if rank == 0:
            say(f"step={step} loss={loss:.6f}")
        if args.step_seconds:
            time.sleep(args.step_seconds)
        if _agree_preempted():
            return _preempted(mgr, rank, step, saved_step, save)
        if step % args.checkpoint_every == 0 and step < args.steps:
            save()
            saved_step = step
        if tier is not None and step % args.memory_every == 0 and step < args.steps:
            _save_memory(tier, model, opt, step)
    if saved_step != step:
        save()
    say(f"done step={step} loss={loss:.6f} final_state={state_digest(model.module)}")
    return EXIT_DONE


if __name__ == "__main__":
    exit_code = main()
    if exit_code in (EXIT_PREEMPTED, EXIT_PREEMPTED_NOT_SAVED, EXIT_CRASH):
        # Preempted: the checkpoint is on disk (fsync'd, renamed, marker last) and the process group is
        # gone (crashed: nothing left to tear down matters, and tearing down a group whose peer is gone
        # can block). Skip the interpreter's teardown of torch: seconds on a busy node (3-4 s measured on the
        # lab), during which torchrun, srun and the autoheal runner wait for this process before the
        # job can be requeued.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(exit_code)
    sys.exit(exit_code)
