#!/usr/bin/env python3
"""A small real PyTorch model for bench_ckpt_tiers.py: an MLP (~0.8 M parameters) trained with Adam on
synthetic regression data, CPU only. Its state (model + optimizer, ~10 MB) goes to the durable tier
every ``--checkpoint-every`` steps (rank 0) and, with ``--memory-every K``, to the peer-memory tier.

Data parallel as DDP does it: every step the ranks average their gradients with a real gloo
``all_reduce`` over TCP between the nodes' addresses, so a rank whose peer died blocks in its next
collective instead of training on alone; on a restart all ranks start from one step (the durable
checkpoint, or the newest step every rank has in memory: ``newest(consistent=True)``).

The fault reaches it as on real hardware (issue 23 section 1), with ``--device lab``: each step's
"kernels" and each copy of the state off the GPU (before a save) are calls on the step's fake GPU
(``autoheal_lab.fakedevice``): after an XID 79 the rank's next call raises ``DeviceLost`` and the rank
ends without saving, as an uncaught CUDA error ends it; an uncorrectable ECC error aborts it. gloo
raises as soon as the peer's socket closes (a peer process the kernel ended); NCCL does not notice a
dead peer and waits out its timeout, with the main thread inside C++ where no Python signal handler
runs. So a failed ``all_reduce`` here blocks the rank the same way: the grace signals held pending
until ``--collective-timeout`` (default NCCL's 600 s), then the rank aborts.

Prints the tiny trainer's line formats (``autoheal-trainer: start step=.. resumed_from=.. ...``,
``step=N``), so the bench reads both the same way.
"""

from __future__ import annotations

import argparse
import io
import os
import signal
import socket
import sys
import time
from datetime import timedelta

_IMPORT_T0 = time.perf_counter()
import torch  # noqa: E402 (timed: the start line says what it took, 0 in a warm interpreter)

from autoheal.sbatch_helpers import checkpoint as ck  # noqa: E402
from autoheal.sbatch_helpers import preempt  # noqa: E402
from autoheal.sbatch_helpers import progress as hb  # noqa: E402

IMPORT_MS = 1000 * (time.perf_counter() - _IMPORT_T0)


def say(text: str) -> None:
    """Every line carries the trainer's own clock (the tiny trainer's --event-times): the bench times the
    phases of a recovery from it, not from when it got round to reading the line."""
    if " time=" not in text:
        text = f"{text} time={time.time():.3f}"
    sys.stdout.write(f"autoheal-trainer: {text}\n")
    sys.stdout.flush()


def build(seed: int = 0):
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(256, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 512),
                                torch.nn.ReLU(), torch.nn.Linear(512, 1))
    return model, torch.optim.Adam(model.parameters(), lr=1e-3)


def state_bytes(model, opt, step: int) -> bytes:
    buf = io.BytesIO()
    torch.save({"step": step, "model": model.state_dict(), "opt": opt.state_dict()}, buf)
    return buf.getvalue()


def load(model, opt, data: bytes) -> int:
    doc = torch.load(io.BytesIO(data), weights_only=True)
    model.load_state_dict(doc["model"])
    opt.load_state_dict(doc["opt"])
    return int(doc["step"])


def init_collective(rank: int, world: int):
    """The gloo process group, rendezvous on the first node's address; None for a single rank."""
    if world < 2:
        return None
    import torch.distributed as dist

    from autoheal.sbatch_helpers.memtier_agent import node_address
    from autoheal.slurm.hostlist import expand

    env = os.environ
    first = expand(env.get("SLURM_STEP_NODELIST") or env["SLURM_JOB_NODELIST"])[0]
    run = int(env.get("SLURM_JOB_ID", "0")) * 131 + int(env.get("AUTOHEAL_RESTART_COUNT", "0") or 0) * 17
    port = 20000 + (run + int(env.get("AUTOHEAL_SWAP_COUNT", "0") or 0)) % 30000  # a new rendezvous per run
    dist.init_process_group("gloo", init_method=f"tcp://{node_address(first, env)}:{port}", rank=rank,
                            world_size=world, timeout=timedelta(seconds=900))
    return dist


class NoDevice:
    """CPU only: no GPU calls (``--device none``)."""

    def step(self) -> None:
        return None

    def copy_to_host(self) -> None:
        return None

    def links_ok(self) -> bool:
        return True


DEVICE_ERRORS: tuple = ()  # the fake device's error types, once it is opened


def open_device(kind: str):
    """The step's fake GPUs (``--device lab``), imported only then."""
    global DEVICE_ERRORS
    if kind != "lab":
        return NoDevice()
    from autoheal_lab import fakedevice

    DEVICE_ERRORS = (fakedevice.DeviceError,)

    dev = fakedevice.FakeDevice.from_env()
    say(f"device lab gpus={dev.describe()}")
    return dev


def all_reduce_or_block(dist, model, world: int, timeout: float, links_ok: bool) -> None:
    """DDP's gradient averaging with gloo, failing the way NCCL does: a dead peer (or a link down) leaves
    the rank blocked with the grace signals pending until ``timeout``, then it aborts (NCCL's watchdog)."""
    why = "NVLink down"
    if links_ok:
        try:
            for param in model.parameters():
                dist.all_reduce(param.grad)
                param.grad /= world
            return
        except RuntimeError as exc:  # gloo: "Connection closed by peer" and the like
            why = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    signal.pthread_sigmask(signal.SIG_BLOCK, set(preempt.default_signals()))
    time.sleep(timeout)
    say(f"collective failed error={'_'.join(why.split())}")
    os._exit(1)


def parse_args():
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=100000)
    p.add_argument("--checkpoint-every", type=int, default=20)
    p.add_argument("--memory-every", type=int, default=0)
    p.add_argument("--step-seconds", type=float, default=0.05, help="extra sleep per step")
    p.add_argument("--device", choices=("none", "lab"), default="none",
                   help="lab: every step and every copy off the GPU is a call on the step's fake GPU")
    p.add_argument("--collective-timeout", type=float, default=600.0, help="NCCL's default: 600 s")
    return p.parse_args()


def resume(model, opt, mgr, memory_every: int):
    """(step, where from, the memory tier or None, what it took): the newer of the durable checkpoint and
    the newest memory copy every rank has; only the newer one is read into the model."""
    took = {}
    t0 = time.perf_counter()
    found = mgr.latest_valid()  # verified (size, checksum); its payload is read only if it is the newer
    took["durable_ms"] = 1000 * (time.perf_counter() - t0)
    tier, copy = None, None
    if memory_every:
        from autoheal.sbatch_helpers import memtier

        t0 = time.perf_counter()
        tier = memtier.MemoryTier.from_env()
        copy = tier.newest(min_step=found.step if found else -1, consistent=True) if tier else None
        took["memory_ms"] = 1000 * (time.perf_counter() - t0)
    t0 = time.perf_counter()
    step, origin = 0, "none"
    if copy is not None:
        step, origin = load(model, opt, copy.payload), f"memory:{copy.source}@{copy.node}"
    elif found is not None:
        step, origin = load(model, opt, found.read_bytes()), str(found.path)
    took["load_ms"] = 1000 * (time.perf_counter() - t0)
    return step, origin, tier, " ".join(f"{k}={v:.0f}" for k, v in took.items())


def main() -> int:
    args = parse_args()
    torch.set_num_threads(1)
    preempt.on_preempt()
    rank, world = ck.env_rank(), ck.env_world_size()
    host = os.environ.get("SLURMD_NODENAME") or socket.gethostname()
    try:
        device = open_device(args.device)
        mgr = ck.CheckpointManager(os.environ["AUTOHEAL_CHECKPOINT_DIR"], keep=2, rank=rank)
        t0 = time.perf_counter()
        model, opt = build()
        built_ms = 1000 * (time.perf_counter() - t0)
        step, origin, tier, took = resume(model, opt, mgr, args.memory_every)
        say(f"start step={step} resumed_from={origin} restart={os.environ.get('AUTOHEAL_RESTART_COUNT', '0')} "
            f"host={host} rank={rank} world={world} steps={args.steps} "
            f"reason={os.environ.get('AUTOHEAL_REQUEUE_REASON') or 'none'} build_ms={built_ms:.0f} {took} "
            f"import_ms={IMPORT_MS:.0f} warm={os.environ.get('AUTOHEAL_WARM') or 'no'}")
        return train(args, device, mgr, tier, model, opt, rank, world, step)
    except DEVICE_ERRORS as exc:  # an uncaught CUDA error ends the rank without saving
        say(f"device error error={'_'.join(str(exc).split())} exit=1")
        return 1


def train(args, device, mgr, tier, model, opt, rank: int, world: int, step: int) -> int:
    dist = init_collective(rank, world)
    gen = torch.Generator().manual_seed(1234 + rank + 7919 * step)
    while step < args.steps:
        device.step()  # this step's kernels: fails on a GPU that fell off the bus (the rank ends unsaved)
        x = torch.randn(64, 256, generator=gen)
        loss = ((model(x) - x[:, :1]) ** 2).mean()
        opt.zero_grad()
        loss.backward()
        if dist is not None:  # blocks while a peer is gone
            all_reduce_or_block(dist, model, world, args.collective_timeout, device.links_ok())
        opt.step()
        step += 1
        hb.heartbeat(step)  # the runner's hang detection: this rank made progress
        say(f"step={step} time={time.time():.3f}")
        if args.step_seconds:
            time.sleep(args.step_seconds)
        if preempt.preempt_requested():
            if rank == 0:
                device.copy_to_host()
                mgr.save(step, state_bytes(model, opt, step))
                say(f"checkpoint saved step={step}")
            say(f"preempted step={step}")
            return 99
        if rank == 0 and step % args.checkpoint_every == 0:
            device.copy_to_host()
            mgr.save(step, state_bytes(model, opt, step))
            say(f"checkpoint saved step={step}")
        if tier is not None and step % args.memory_every == 0:
            t0 = time.perf_counter()
            device.copy_to_host()
            payload = state_bytes(model, opt, step)  # serialising is part of the save's cost
            kept = tier.save(step, payload)
            say(f"memory saved step={step} nodes={','.join(kept.stored) or 'none'} "
                f"ms={1000 * (time.perf_counter() - t0):.1f} bytes={len(payload)}")
    say(f"done step={step}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
