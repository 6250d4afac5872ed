"""checkpoints/last.ckpt: the point a run resumes from, written so that the resumed run ends bit for bit where the
uninterrupted run ends.

A checkpoint holds what Lightning saves (weights, optimiser and schedule, loop progress, the training loader's place
in the shuffled data: data/resumable.py) and, here, every random number generator training draws from (torch on the
CPU and the GPUs, Python's, NumPy's): dropout and the evaluation loaders draw from the global one. They are restored
when training starts, after anything the restart itself draws.

`LastCheckpoint` writes last.ckpt every `trainer.checkpoint_every_n_steps` steps, when a stop signal arrived
(train/signals.py), and when training ends. It writes at a step boundary that Lightning knows how to resume from:
after the step, or after the step's validation when one follows it (resuming from before a due validation would skip
it), after the ModelCheckpoint that keeps best.ckpt, so the state saved includes that step's verdict on the best.
The final checkpoint is written once the fit loop has closed its last epoch, so a rerun of a run killed after
training (during evaluation or the scans) logs its final numbers at the same step and epoch.

Writes are atomic (`AtomicCheckpointIO`: a temporary file in the same folder, flushed to disk, then renamed), so a
kill during a write leaves the previous last.ckpt whole.
"""

import random
from pathlib import Path
from typing import Any

import lightning as L
import numpy as np
import torch
from lightning.fabric.plugins import TorchCheckpointIO
from lightning.pytorch.callbacks import Checkpoint
from rich.console import Console

from headcount.io import atomic_write
from headcount.train.signals import StoppedBySignal, StopRequests


class AtomicCheckpointIO(TorchCheckpointIO):
    def save_checkpoint(self, checkpoint: dict[str, Any], path: Any, storage_options: Any | None = None) -> None:
        atomic_write(path, lambda f: torch.save(checkpoint, f), binary=True)


def rng_states() -> dict[str, Any]:
    """Every generator's state, as types Lightning's (weights-only) checkpoint loading accepts."""
    kind, keys, position, has_gauss, cached_gaussian = np.random.get_state()
    states = {
        "torch": torch.get_rng_state(),
        "python": random.getstate(),
        "numpy": (kind, torch.from_numpy(keys.astype(np.int64)), position, has_gauss, cached_gaussian),
    }
    if torch.cuda.is_available():
        states["torch.cuda"] = torch.cuda.get_rng_state_all()
    return states


def set_rng_states(states: dict[str, Any]) -> None:
    torch.set_rng_state(states["torch"])
    random.setstate(states["python"])
    kind, keys, position, has_gauss, cached_gaussian = states["numpy"]
    np.random.set_state((kind, keys.numpy().astype(np.uint32), position, has_gauss, cached_gaussian))
    if "torch.cuda" in states and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(states["torch.cuda"])


def remove_partial_writes(folder: Path) -> None:
    """Temporary files of writes a kill interrupted (io.atomic_write names them .<name>.<random>.tmp)."""
    for path in folder.glob(".*.tmp"):
        path.unlink(missing_ok=True)


class LastCheckpoint(Checkpoint):
    def __init__(self, path: Path, every_n_steps: int, stops: StopRequests | None = None):
        self.path, self.every_n_steps = Path(path), every_n_steps
        self.stops = stops or StopRequests()
        self._rng_to_restore: dict[str, Any] | None = None

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if stage == "fit":
            if trainer.is_global_zero:
                remove_partial_writes(self.path.parent)
            self.stops.install()

    def teardown(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if stage == "fit":
            self.stops.uninstall()

    def state_dict(self) -> dict[str, Any]:
        return {"rng": rng_states()}  # taken when any checkpoint is written, best.ckpt's too

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self._rng_to_restore = state_dict.get("rng")

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self._rng_to_restore is not None:
            set_rng_states(self._rng_to_restore)
            self._rng_to_restore = None
        count_the_epoch_lightning_skips(trainer)

    def on_train_batch_end(self, trainer: L.Trainer, *args: Any) -> None:
        if trainer.global_step < trainer.max_steps and not validation_follows(trainer):
            self._at_step_boundary(trainer)

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        fitting = trainer.state.fn == "fit" and not trainer.sanity_checking
        if fitting and trainer.global_step < trainer.max_steps:
            self._at_step_boundary(trainer)

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        trainer.save_checkpoint(self.path)
        if (signum := self._stop_requested(trainer)) is not None:
            self._stop(trainer, signum)

    def _at_step_boundary(self, trainer: L.Trainer) -> None:
        signum = self._stop_requested(trainer)
        if signum is not None or trainer.global_step % self.every_n_steps == 0:
            trainer.save_checkpoint(self.path)
        if signum is not None:
            self._stop(trainer, signum)

    def _stop_requested(self, trainer: L.Trainer) -> int | None:
        """The signal that asked to stop; under DDP, any process's (every process must stop at the same step)."""
        if trainer.world_size == 1:
            return self.stops.signum
        stop = trainer.strategy.reduce_boolean_decision(self.stops.signum is not None, all=False)
        return (self.stops.signum or 15) if stop else None  # a process that got no signal stops as for SIGTERM

    def _stop(self, trainer: L.Trainer, signum: int) -> None:
        if trainer.is_global_zero:
            Console(stderr=True).print(
                f"[yellow]stopped[/yellow] at step {trainer.global_step}: wrote {self.path}; "
                "run the same command again to resume",
                soft_wrap=True,
                highlight=False,
            )
        if (requeue := self.stops.launcher_handler(signum)) is not None:
            requeue(signum, None)  # submitit: requeues the job, then exits
        raise StoppedBySignal(signum)


def validation_follows(trainer: L.Trainer) -> bool:
    """Whether Lightning validates right after this step's on_train_batch_end: with validation every
    `val_check_interval` steps counted across epochs (train/trainer.py sets check_val_every_n_epoch=None), as its
    training epoch loop decides."""
    interval = trainer.val_check_batch
    return trainer.enable_validation and isinstance(interval, int) and trainer.global_step % interval == 0


def count_the_epoch_lightning_skips(trainer: L.Trainer) -> None:
    """Lightning (2.6) resumes a checkpoint written after an epoch's last step by closing that epoch, then starts the
    next one without counting it as started: its epoch counters stay one behind, and a checkpoint written later
    resumes in the wrong epoch (the curves' epoch column goes wrong). Count it, as the uninterrupted run does."""
    fit_loop = trainer.fit_loop
    epoch_loop = fit_loop.epoch_loop
    if (
        fit_loop.restarted_mid_epoch
        and epoch_loop.restarted_on_train_batch_end
        and epoch_loop.batch_progress.is_last_batch
    ):
        fit_loop.epoch_progress.increment_ready()
        fit_loop.epoch_progress.increment_started()
