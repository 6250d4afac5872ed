"""The Lightning Trainer a run trains with, from the trainer section of its config."""

from pathlib import Path

import lightning as L
from lightning.pytorch.callbacks import ModelCheckpoint, RichProgressBar
from omegaconf import DictConfig

from headcount.run_dir import RunPaths


def build_trainer(cfg: DictConfig, run_dir: Path, logger) -> L.Trainer:
    t = cfg.trainer
    callbacks = [
        ModelCheckpoint(
            dirpath=RunPaths(run_dir).checkpoints,
            filename="best",
            monitor="val/loss",
            save_last=True,
            save_top_k=1,
            enable_version_counter=False,
        )
    ]
    if t.progress_bar:
        callbacks.append(RichProgressBar())
    return L.Trainer(
        accelerator=t.accelerator,
        devices=t.devices,
        strategy=t.strategy,
        num_nodes=t.num_nodes,
        precision=t.precision,
        max_steps=t.max_steps,
        val_check_interval=min(t.val_check_interval, t.max_steps),
        check_val_every_n_epoch=None,
        limit_val_batches=t.limit_val_batches,
        log_every_n_steps=t.log_every_n_steps,
        gradient_clip_val=t.optim.grad_clip or None,
        deterministic=t.deterministic,
        enable_progress_bar=t.progress_bar,
        logger=logger if logger is not None else False,
        callbacks=callbacks,
        default_root_dir=run_dir,
    )
