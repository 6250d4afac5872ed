"""The training progress bar: step k / max_steps, the latest losses, the time left.

Lightning's own bars count batches per epoch and, with training measured in steps, show `Epoch 0/-2`. A run here is
a number of steps, so is its bar; on resume it starts at the step the run resumed from.
"""

from typing import Any

import lightning as L
from lightning.pytorch.callbacks import ProgressBar
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn

SHOWN = ("train/loss", "val/loss")


class StepProgressBar(ProgressBar):
    def __init__(self) -> None:
        super().__init__()
        self._enabled = True
        self._progress: Progress | None = None
        self._console = Console(stderr=True)

    def disable(self) -> None:
        self._enabled = False

    def enable(self) -> None:
        self._enabled = True

    def print(self, *args: Any, **kwargs: Any) -> None:
        self._console.print(*args, **kwargs)

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if not (self._enabled and trainer.is_global_zero):
            return
        self._progress = Progress(
            TextColumn("{task.description}"),
            BarColumn(bar_width=12),
            TextColumn("step {task.completed:.0f}/{task.total:.0f}"),
            TextColumn("{task.fields[metrics]}"),
            TimeRemainingColumn(),
            console=self._console,
        )
        self._progress.add_task("train", total=trainer.max_steps, completed=trainer.global_step, metrics="")
        self._progress.start()

    def on_train_batch_end(self, trainer: L.Trainer, *args: Any) -> None:
        self._update(trainer, "train")

    def on_validation_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._update(trainer, "validating")

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._update(trainer, "train")

    def _update(self, trainer: L.Trainer, description: str) -> None:
        if self._progress is not None:
            metrics = trainer.progress_bar_metrics
            shown = "  ".join(f"{key} {float(metrics[key]):.4f}" for key in SHOWN if key in metrics)
            task = self._progress.task_ids[0]
            self._progress.update(task, description=description, completed=trainer.global_step, metrics=shown)

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._stop()

    def on_exception(self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException) -> None:
        self._stop()

    def _stop(self) -> None:
        if self._progress is not None:
            self._progress.stop()
            self._progress = None
