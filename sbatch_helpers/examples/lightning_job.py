#!/usr/bin/env python3
"""PyTorch Lightning + autoheal: ``SLURMEnvironment(auto_requeue=True)`` matched to autoheal's grace.

Submit with plain ``sbatch lightning_job.sbatch`` (next to this file). The batch script asks for
``--signal=USR2@<grace>`` (no ``B:``: the signal goes to the srun step, where Lightning runs). On a GPU
fault autoheal drains the node and delivers that same signal at once, as Slurm does near the time
limit; Lightning's handler then saves ``hpc_ckpt_<N>.ckpt`` into ``default_root_dir`` and runs
``scontrol requeue`` (rank 0). The requeued job starts on another node and ``Trainer.fit`` resumes from
the newest ``hpc_ckpt_*`` by itself. A job that does neither within ``hooks.grace_seconds`` is
requeued by autoheal (SIGTERM, KillWait, SIGKILL) and resumes from its last regular checkpoint.

Settings that matter:
- ``requeue_signal=signal.SIGUSR2`` and ``#SBATCH --signal=USR2@...``: the same signal (Lightning's
  default is SIGUSR1, which NCCL may use).
- the ``@`` time = ``hooks.grace_seconds`` of your cluster (ask your admins), and an epoch/step time
  short enough that a checkpoint fits in it; KillWait >= the checkpoint time.
- ``#SBATCH --requeue --open-mode=append``.
- ``report_progress(step)`` after each checkpoint when the job runs under ``autoheal sbatch`` (it is a
  no-op otherwise), so the runner's no-progress rule sees Lightning's checkpoints.

Not run by the default CI (no torch there): ``pytest -m torch`` runs it on the lab where torch and
lightning are installed (tests/integration/test_frameworks_torch.py); ``--help`` needs only Python.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time
from typing import Callable, Optional


def build_trainer(root_dir: str, max_epochs: int, log_every: int = 0):
    import lightning.pytorch as pl
    from lightning.pytorch.plugins.environments import SLURMEnvironment

    report_progress: Optional[Callable[[int], object]]
    try:
        from autoheal.sbatch_helpers import report_progress
    except ImportError:
        report_progress = None

    class ReportProgress(pl.Callback):
        def on_save_checkpoint(self, trainer, pl_module, checkpoint):
            if report_progress is not None:
                report_progress(int(trainer.global_step))

    class SayProgress(pl.Callback):
        """One line at the start (the step it resumed from) and every ``log_every`` steps."""

        def on_train_start(self, trainer, pl_module):
            print(f"lightning-job: start global_step={trainer.global_step} "
                  f"node={os.environ.get('SLURMD_NODENAME', '')} restart={os.environ.get('SLURM_RESTART_COUNT', '0')}",
                  flush=True)

        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            if log_every and trainer.global_step % log_every == 0:
                print(f"lightning-job: global_step={trainer.global_step}", flush=True)

        def on_save_checkpoint(self, trainer, pl_module, checkpoint):
            print(f"lightning-job: checkpoint global_step={trainer.global_step}", flush=True)

    return pl.Trainer(default_root_dir=root_dir, max_epochs=max_epochs, accelerator="auto",
                      plugins=[SLURMEnvironment(auto_requeue=True, requeue_signal=signal.SIGUSR2)],
                      callbacks=[ReportProgress(), SayProgress()], enable_progress_bar=False)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description="Lightning job that checkpoints and requeues on SIGUSR2")
    ap.add_argument("--root", default=os.environ.get("CKPT_DIR", "lightning-runs"),
                    help="default_root_dir: where hpc_ckpt_*.ckpt land (shared filesystem)")
    ap.add_argument("--epochs", type=int, default=20)
    ap.add_argument("--step-seconds", type=float, default=0.0, help="extra sleep per training step (demos)")
    ap.add_argument("--log-every", type=int, default=50, help="print the step every N steps (0: never)")
    args = ap.parse_args(argv)
    import lightning.pytorch as pl
    import torch
    from torch.utils.data import DataLoader, TensorDataset

    class Tiny(pl.LightningModule):
        def __init__(self):
            super().__init__()
            self.layer = torch.nn.Linear(16, 1)

        def training_step(self, batch, _idx):
            if args.step_seconds:
                time.sleep(args.step_seconds)
            x, y = batch
            return torch.nn.functional.mse_loss(self.layer(x), y)

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.01)

    gen = torch.Generator().manual_seed(0)
    data = TensorDataset(torch.randn(4096, 16, generator=gen), torch.randn(4096, 1, generator=gen))
    trainer = build_trainer(args.root, args.epochs, args.log_every)
    trainer.fit(Tiny(), DataLoader(data, batch_size=32))
    print(f"lightning-job: done global_step={trainer.global_step}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
