#!/usr/bin/env python3
"""A small real PyTorch model for bench_ckpt_tiers.py: an MLP (~0.8 M parameters) trained with Adam on
synthetic regression data, CPU only. Its state (model + optimizer, ~10 MB) goes to the durable tier
every ``--checkpoint-every`` steps (rank 0) and, with ``--memory-every K``, to the peer-memory tier.

Data parallel as DDP does it: every step the ranks average their gradients with a real gloo
``all_reduce`` over TCP between the nodes' addresses, so a rank whose peer died blocks in its next
collective (as with NCCL) instead of training on alone; on a restart all ranks start from one step (the
durable checkpoint, or the newest step every rank has in memory: ``newest(consistent=True)``).

Prints the tiny trainer's line formats (``autoheal-trainer: start step=.. resumed_from=.. ...``,
``step=N``), so the bench reads both the same way.
"""

from __future__ import annotations

import argparse
import io
import os
import socket
import sys
import time
from datetime import timedelta

import torch

from autoheal.sbatch_helpers import checkpoint as ck
from autoheal.sbatch_helpers import preempt


def say(text: str) -> None:
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


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=100000)
    p.add_argument("--checkpoint-every", type=int, default=20)
    p.add_argument("--memory-every", type=int, default=0)
    p.add_argument("--step-seconds", type=float, default=0.05, help="extra sleep per step")
    args = p.parse_args()
    torch.set_num_threads(1)
    preempt.on_preempt()
    rank = ck.env_rank()
    host = os.environ.get("SLURMD_NODENAME") or socket.gethostname()
    mgr = ck.CheckpointManager(os.environ["AUTOHEAL_CHECKPOINT_DIR"], keep=2, rank=rank)
    model, opt = build()
    step, origin = 0, "none"
    found = mgr.latest_valid()
    if found is not None:
        step, origin = load(model, opt, found.read_bytes()), str(found.path)
    tier = None
    if args.memory_every:
        from autoheal.sbatch_helpers import memtier

        tier = memtier.MemoryTier.from_env()
        copy = tier.newest(min_step=step, consistent=True) if tier else None
        if copy is not None:
            step, origin = load(model, opt, copy.payload), f"memory:{copy.source}@{copy.node}"
    say(f"start step={step} resumed_from={origin} restart={os.environ.get('AUTOHEAL_RESTART_COUNT', '0')} "
        f"host={host} rank={rank} world={ck.env_world_size()} steps={args.steps} "
        f"reason={os.environ.get('AUTOHEAL_REQUEUE_REASON') or 'none'}")
    world = ck.env_world_size()
    dist = init_collective(rank, world)
    gen = torch.Generator().manual_seed(1234 + rank + 7919 * step)
    while step < args.steps:
        x = torch.randn(64, 256, generator=gen)
        loss = ((model(x) - x[:, :1]) ** 2).mean()
        opt.zero_grad()
        loss.backward()
        if dist is not None:  # DDP's gradient averaging: blocks while a peer is gone
            for param in model.parameters():
                dist.all_reduce(param.grad)
                param.grad /= world
        opt.step()
        step += 1
        say(f"step={step}")
        if args.step_seconds:
            time.sleep(args.step_seconds)
        if preempt.preempt_requested():
            if rank == 0:
                mgr.save(step, state_bytes(model, opt, step))
            say(f"preempted step={step}")
            return 99
        if rank == 0 and step % args.checkpoint_every == 0:
            mgr.save(step, state_bytes(model, opt, step))
        if tier is not None and step % args.memory_every == 0:
            t0 = time.perf_counter()
            kept = tier.save(step, state_bytes(model, opt, step))
            say(f"memory saved step={step} nodes={','.join(kept.stored) or 'none'} "
                f"ms={1000 * (time.perf_counter() - t0):.1f}")
    say(f"done step={step}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
