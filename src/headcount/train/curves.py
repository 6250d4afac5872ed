"""Training curves that survive resumes: logs/metrics.csv holds every logged step exactly once, however often the run
was stopped and resumed.

Lightning's CSVLogger deletes metrics.csv when it starts, and logs a step's training row after the step's
checkpoint could be written: a resumed run lost the earlier rows, and a run killed between the two lost a row for good.
Here `TrainingCurve` logs the training row (epoch, step, train/loss, train/acc: the row Lightning would log, every
`log_every_n_steps` steps) as the step ends, before any checkpoint of that step, and `AppendOnlyCSVLogger` keeps the
file: when training starts at step s (0 for a fresh run), it drops the rows logged at step s or later, which a killed
run wrote after its last checkpoint and the resumed run logs again, identically. A row cut short by a kill is dropped
with them. Rows are appended as they come; the file is rewritten (atomically) only when a new column appears.
"""

import csv
import io
import os
from pathlib import Path
from typing import Any

import lightning as L
from lightning.fabric.loggers.logger import rank_zero_experiment
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.core.saving import save_hparams_to_yaml
from lightning.pytorch.loggers import CSVLogger

from headcount.io import atomic_write_text


class MetricsCSV:
    """The writer behind AppendOnlyCSVLogger: metrics.csv with a `step` column and one column per metric, sorted."""

    def __init__(self, log_dir: str):
        self.log_dir = log_dir
        self.path = Path(log_dir) / "metrics.csv"
        self.metrics: list[dict[str, Any]] = []  # rows logged since the last save
        self.keys: list[str] = self._rows_on_disk()[0]
        Path(log_dir).mkdir(parents=True, exist_ok=True)

    def _rows_on_disk(self) -> tuple[list[str], list[dict[str, str]]]:
        """The header and the complete rows (a last line without its newline was cut by a kill)."""
        if not self.path.exists():
            return [], []
        lines = self.path.read_text().splitlines(keepends=True)
        complete = [line for line in lines if line.endswith("\n")]
        reader = csv.DictReader(complete)
        rows = list(reader)
        return list(reader.fieldnames or []), rows

    def forget_from(self, step: int) -> None:
        """Drop the rows logged at `step` or later (and a row cut short)."""
        keys, rows = self._rows_on_disk()
        kept = [row for row in rows if row.get("step") and int(row["step"]) < step]
        if self.path.exists() and (len(kept) < len(rows) or not self.path.read_text().endswith("\n")):
            self._rewrite(keys, kept)

    def log_metrics(self, metrics: dict[str, Any], step: int | None = None) -> None:
        values = {key: value.item() if hasattr(value, "item") else value for key, value in metrics.items()}
        self.metrics.append({**values, "step": len(self.metrics) if step is None else step})

    def log_hparams(self, params: dict[str, Any]) -> None:
        save_hparams_to_yaml(os.path.join(self.log_dir, "hparams.yaml"), params)

    def save(self) -> None:
        if not self.metrics:
            return
        new_keys = set().union(*self.metrics) - set(self.keys)
        if new_keys or not self.path.exists():
            self.keys = sorted({*self.keys, *new_keys})
            self._rewrite(self.keys, self._rows_on_disk()[1] + self.metrics)
        else:
            with self.path.open("a", newline="") as f:
                csv.DictWriter(f, fieldnames=self.keys).writerows(self.metrics)
        self.metrics = []

    def _rewrite(self, keys: list[str], rows: list[dict[str, Any]]) -> None:
        text = io.StringIO(newline="")
        writer = csv.DictWriter(text, fieldnames=keys)
        writer.writeheader()
        writer.writerows(rows)
        atomic_write_text(self.path, text.getvalue())


class AppendOnlyCSVLogger(CSVLogger):
    """Lightning's CSVLogger writing through MetricsCSV: an existing metrics.csv is kept, not deleted."""

    @property
    @rank_zero_experiment
    def experiment(self) -> MetricsCSV:
        if self._experiment is None:
            self._experiment = MetricsCSV(self.log_dir)
        return self._experiment

    def forget_from(self, step: int) -> None:
        self.experiment.forget_from(step)


class TrainingCurve(Callback):
    """Logs each `log_every_n_steps`-th step's training loss and accuracy as the step ends (the module logs them to
    the progress bar only), and has the CSV forget what a killed run logged after the checkpoint this run starts from.
    Lightning runs checkpoint callbacks after the others, so the row is written before the step's checkpoint."""

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        for logger in trainer.loggers:
            if isinstance(logger, AppendOnlyCSVLogger) and trainer.is_global_zero:
                logger.forget_from(trainer.global_step)

    def on_train_batch_end(self, trainer: L.Trainer, *args: Any) -> None:
        if trainer.global_step % trainer.log_every_n_steps != 0:
            return
        metrics = {key: float(value) for key, value in trainer.callback_metrics.items() if key.startswith("train/")}
        # The row Lightning's own step logging writes: the current epoch, at the count of steps before this one.
        for logger in trainer.loggers:
            logger.log_metrics({**metrics, "epoch": trainer.current_epoch}, step=trainer.global_step - 1)
            logger.save()
