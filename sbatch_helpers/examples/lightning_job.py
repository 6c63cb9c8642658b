#!/usr/bin/env python3
"""PyTorch Lightning + autoheal: ``SLURMEnvironment(auto_requeue=True)`` matched to autoheal's grace.

Submit with plain ``sbatch lightning_job.sbatch`` (next to this file). The batch script asks for
``--signal=USR2@<grace>`` (no ``B:``: the signal goes to the srun step, where Lightning runs). On a GPU
fault autoheal drains the node and delivers that same signal at once, as Slurm does near the time
limit; Lightning's handler then saves ``hpc_ckpt_<N>.ckpt`` into ``default_root_dir`` and runs
``scontrol requeue`` (rank 0). The requeued job starts on another node and resumes from the newest
valid checkpoint (``resume_path``: a save killed half way leaves a torn file, which is skipped). A job
that does neither within ``hooks.grace_seconds`` is requeued by autoheal (SIGTERM, KillWait, SIGKILL)
and resumes from its last regular checkpoint.

Settings that matter:
- ``requeue_signal=signal.SIGUSR2`` and ``#SBATCH --signal=USR2@...``: the same signal (Lightning's
  default is SIGUSR1, which NCCL may use).
- the ``@`` time = ``hooks.grace_seconds`` of your cluster (ask your admins), and an epoch/step time
  short enough that a checkpoint fits in it; KillWait >= the checkpoint time.
- ``#SBATCH --requeue --open-mode=append``.
- ``report_progress(step)`` after each checkpoint when the job runs under ``autoheal sbatch`` (it is a
  no-op otherwise), so the runner's no-progress rule sees Lightning's checkpoints.
- a regular checkpoint too (``--checkpoint-every-epochs``, a ``ModelCheckpoint`` into ``<root>/checkpoints``),
  resumed from when it is newer than the last ``hpc_ckpt``: a GPU that fell off the bus (XID 79) fails the
  next step before the handler could copy the weights off it, so no ``hpc_ckpt`` is written then and the
  job (requeued by ``autoheal sbatch``) resumes from the regular one. Lightning only resumes an ``hpc_ckpt``
  by itself (its highest-numbered one, torn or not: the recipe passes the newest valid one instead);
  without a regular checkpoint it would start again from step 0.

``--device lab`` (the autoheal lab only) makes each step's forward, backward and optimizer step and each
save a "GPU call" on the step's fake GPUs (``autoheal_lab.fakedevice``), so a lab fault reaches the job as
on real hardware; without it (the default, and on a real cluster) nothing of the lab is imported.

Not run by the default CI (no torch there): ``pytest -m torch`` runs it on the lab where torch and
lightning are installed (tests/integration/test_frameworks_torch.py); ``--help`` needs only Python.
"""

from __future__ import annotations

import argparse
import glob
import hashlib
import os
import signal
import sys
import time
from typing import Any, Callable, List, Optional

CHECKPOINTS = "checkpoints"  # the regular checkpoints, under the root dir


class _NoDevice:
    """The default: CPU only, no GPU calls (``--device lab`` puts a fakedevice.FakeDevice in its place)."""

    def step(self) -> None:
        pass

    def copy_to_host(self) -> None:
        pass


def open_device(kind: str) -> Any:
    """``lab``: the step's fake GPUs (imported only then: a real cluster never imports the lab)."""
    if kind != "lab":
        return _NoDevice()
    from autoheal_lab import fakedevice

    dev = fakedevice.FakeDevice.from_env()
    print(f"lightning-job: device lab gpus={dev.describe()}", flush=True)
    return dev


#: Where a torn checkpoint is moved when no valid one is left (a folder: Lightning lists only the root's files)
TORN = "torn-checkpoints"


def checkpoint_problem(path: str) -> Optional[str]:
    """Why ``path`` is not a whole checkpoint, or None when it is. Lightning does not guarantee one.

    Lightning 2.x saves through ``TorchCheckpointIO`` -> ``_atomic_save``: ``torch.save`` into memory,
    then, inside an fsspec transaction, a write to a temporary file that is moved to the final name on
    commit. On a local or shared POSIX filesystem that temporary file is ``tempfile.mkstemp()``'s, i.e.
    in ``$TMPDIR`` (node-local ``/tmp``), and the move is ``shutil.move``: a rename only when the target
    is on the same filesystem; to a shared filesystem it is a copy into the final name, so a kill during
    the copy (a grace period that ran out mid-save) leaves a torn file under the checkpoint's own name
    (seen: 18 MB of a 400 MB checkpoint after a kill -9, the root on tmpfs and /tmp on ext4).
    Nothing is fsynced either way, so a node that crashes after the save can leave a short or zero-filled
    file behind even after a rename. ``hpc_ckpt_<N>`` (the save on the requeue signal) takes the same path.

    What is checked (no torch needed, one sequential read of the file): ``torch.save`` writes a zip
    archive of stored members whose central directory comes last, so a file cut short has none (or a
    broken one), and each member carries a CRC-32 that catches a hole or zeros where data never reached
    the disk. ``torch.load`` checks no CRC: a damaged tensor would load as wrong weights. A member whose
    CRC is 0 is not read (``torch.serialization.set_crc32_options(False)`` writes 0 for every member):
    only its structure counts. A checkpoint that is a folder (a sharded strategy's) is not this recipe's
    and is rejected: a CheckpointIO of your own needs its own check here."""
    import zipfile

    if not os.path.isfile(path):
        return "not a file"
    try:
        size = os.path.getsize(path)
        with zipfile.ZipFile(path) as zf:
            members = zf.infolist()
            if not any(m.filename.endswith("/data.pkl") or m.filename == "data.pkl" for m in members):
                return "no data.pkl: not a torch.save archive"
            for m in members:
                if m.header_offset + 30 + len(m.filename.encode()) + m.compress_size > size:
                    return f"{m.filename} runs past the end of the file"
                with zf.open(m) as f:  # checks the member's local header
                    # zipfile checks the CRC-32 once a member is read to its end
                    while m.CRC != 0 and f.read(1 << 20):
                        pass
    except (zipfile.BadZipFile, zipfile.LargeZipFile, OSError, EOFError, ValueError) as exc:
        return f"{type(exc).__name__}: {exc}"
    return None


def resume_path(root_dir: str) -> Optional[str]:
    """The checkpoint to resume from: the newest *valid* one (:func:`checkpoint_problem`), regular
    (``<root>/checkpoints/*.ckpt``) or Lightning's ``hpc_ckpt_*``, by modification time; on a tie the
    hpc one (the later save, on the signal). A torn one is skipped (a line says so) for the next newest.

    Always a path when a valid checkpoint exists: with ``ckpt_path=None`` under Slurm, Lightning itself
    resumes from the highest-numbered ``hpc_ckpt`` without looking at it, torn or not. None when none is
    valid (the run starts from scratch); then torn ``hpc_ckpt`` files are first moved into
    ``<root>/torn-checkpoints`` (kept for a post-mortem, never deleted), or Lightning would pick one.
    Every rank of a job may run this at once: a file another rank moved already is not an error."""
    regular = glob.glob(os.path.join(root_dir, CHECKPOINTS, "*.ckpt"))
    hpc = glob.glob(os.path.join(root_dir, "hpc_ckpt_*.ckpt"))
    found = []
    for path in regular + hpc:
        try:
            found.append((os.path.getmtime(path), path in hpc, path))
        except OSError:  # moved away by another rank meanwhile
            continue
    torn = []
    for _mtime, is_hpc, path in sorted(found, reverse=True):
        problem = checkpoint_problem(path)
        if problem is None:
            return path
        print(f"lightning-job: skipped torn checkpoint {path}: {problem}", flush=True)
        if is_hpc:
            torn.append(path)
    for path in torn:
        aside = os.path.join(root_dir, TORN)
        os.makedirs(aside, exist_ok=True)
        try:
            os.replace(path, os.path.join(aside, os.path.basename(path)))
        except FileNotFoundError:
            pass  # another rank moved it
    return None


def state_digest(module: Any) -> str:
    """A digest of the weights: a resumed run must end with an uninterrupted run's."""
    h = hashlib.sha256()
    for name, t in sorted(module.state_dict().items()):
        h.update(name.encode())
        h.update(",".join(float(v).hex() for v in t.detach().cpu().flatten().tolist()).encode())
    return h.hexdigest()[:16]


def build_trainer(root_dir: str, max_epochs: int, log_every: int = 0, every_epochs: int = 1, device: Any = None,
                  accelerator: str = "auto"):
    import lightning.pytorch as pl
    from lightning.pytorch.callbacks import ModelCheckpoint
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

    dev = device if device is not None else _NoDevice()

    class DeviceCalls(pl.Callback):
        """Where a CUDA job meets its GPU: each forward, backward and optimizer step, and each save
        (the weights come off the GPU first). First in the list: a failed copy means no checkpoint."""

        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
            dev.step()

        def on_before_backward(self, trainer, pl_module, loss):
            dev.step()

        def on_before_optimizer_step(self, trainer, pl_module, optimizer):
            dev.step()

        def on_save_checkpoint(self, trainer, pl_module, checkpoint):
            dev.copy_to_host()

    callbacks: List[Any] = [DeviceCalls(), ReportProgress(), SayProgress()]
    if every_epochs > 0:
        callbacks.append(ModelCheckpoint(dirpath=os.path.join(root_dir, CHECKPOINTS), every_n_epochs=every_epochs,
                                         save_top_k=1, save_on_train_epoch_end=True))
    return pl.Trainer(default_root_dir=root_dir, max_epochs=max_epochs, accelerator=accelerator,
                      plugins=[SLURMEnvironment(auto_requeue=True, requeue_signal=signal.SIGUSR2)],
                      callbacks=callbacks, enable_progress_bar=False, logger=False)


def device_error(exc: RuntimeError) -> int:
    """A GPU call that failed ends the run without saving, as on real hardware (exit 1); any other
    error is raised as it is."""
    if type(exc).__module__ != "autoheal_lab.fakedevice":
        raise exc
    print(f"lightning-job: device error {str(exc).splitlines()[0]}", flush=True)
    return 1


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description="Lightning job that checkpoints and requeues on SIGUSR2")
    ap.add_argument("--root", default=os.environ.get("CKPT_DIR", "lightning-runs"),
                    help="default_root_dir: where hpc_ckpt_*.ckpt land (shared filesystem)")
    ap.add_argument("--epochs", type=int, default=20)
    ap.add_argument("--step-seconds", type=float, default=0.0, help="extra sleep per training step (demos)")
    ap.add_argument("--log-every", type=int, default=50, help="print the step every N steps (0: never)")
    ap.add_argument("--checkpoint-every-epochs", type=int, default=1,
                    help="a regular checkpoint every N epochs into <root>/checkpoints (0: only Lightning's hpc_ckpt)")
    ap.add_argument("--device", choices=("none", "lab"), default="none",
                    help="lab: each step on the step's fake GPUs (the autoheal lab only; default none)")
    ap.add_argument("--accelerator", default=None,
                    help="Lightning's accelerator (default auto; cpu with --device lab, where the GPUs are fake)")
    args = ap.parse_args(argv)
    accelerator = args.accelerator or ("cpu" if args.device == "lab" else "auto")
    try:
        device = open_device(args.device)
    except RuntimeError as exc:
        return device_error(exc)
    if args.device == "lab":
        # torch is shown no CUDA device: the lab's GPUs exist only in its fake NVML, with no CUDA driver
        # behind them. Lightning sets PYTORCH_NVML_BASED_CUDA_CHECK=1 on import, so torch counts GPUs
        # through NVML, calls CUDA "available", and its first CUDA call (Lightning's isolate_rng saves the
        # CUDA RNG states even with accelerator=cpu) fails with "Found no NVIDIA driver". A real node has
        # both, and --device none leaves the environment alone. The fake device has read its GPUs already.
        os.environ["CUDA_VISIBLE_DEVICES"] = ""
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
    torch.manual_seed(0)  # the same initial weights in every run
    model = Tiny()
    try:
        trainer = build_trainer(args.root, args.epochs, args.log_every, args.checkpoint_every_epochs, device,
                                accelerator)
        ckpt = resume_path(args.root)
        if ckpt:
            print(f"lightning-job: resume from={ckpt}", flush=True)
        trainer.fit(model, DataLoader(data, batch_size=32), ckpt_path=ckpt)
    except RuntimeError as exc:
        return device_error(exc)
    print(f"lightning-job: done global_step={trainer.global_step} final_state={state_digest(model)}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
