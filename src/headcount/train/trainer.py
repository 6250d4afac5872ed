"""The Lightning Trainer a run trains with, from the trainer section of its config."""

import inspect
from pathlib import Path

import lightning as L
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.loggers import Logger
from omegaconf import DictConfig

from headcount.config import plain, typed
from headcount.config.train import TrainerConfig
from headcount.run_dir import RunPaths
from headcount.train.checkpointing import AtomicCheckpointIO, LastCheckpoint
from headcount.train.curves import TrainingCurve
from headcount.train.progress import StepProgressBar
from headcount.train.quiet import verbosity
from headcount.train.rendezvous import strategy_for

TRAINER_ARGUMENTS = frozenset(inspect.signature(L.Trainer.__init__).parameters) - {"self"}


def build_trainer(cfg: DictConfig, run_dir: Path, logger: Logger | None) -> L.Trainer:
    """Every trainer field named like a Trainer argument passes through as it is; the rest are headcount's own
    (checkpoint_every_n_steps, compile, progress_bar, optim) or need translating: validation every val_check_interval
    steps rather than per epoch, never later than the last step, and the optimiser's gradient clipping.

    Checkpoints: best.ckpt (lowest val/loss) at validations, last.ckpt as train/checkpointing.py says, both written
    atomically. Lightning's model summary only with -v: its FLOP count is 0 for this model (train/job.py logs ours)."""
    t: TrainerConfig = typed(cfg.trainer, TrainerConfig)
    passed = {key: value for key, value in plain(t).items() if key in TRAINER_ARGUMENTS}
    paths = RunPaths(run_dir)
    best = ModelCheckpoint(
        dirpath=paths.checkpoints, filename="best", monitor="val/loss", save_top_k=1, enable_version_counter=False
    )
    # Lightning calls checkpoint callbacks after the others, in this order: last.ckpt records best.ckpt's verdict.
    callbacks = [TrainingCurve(), best, LastCheckpoint(paths.last_ckpt, t.checkpoint_every_n_steps)]
    translated = dict(
        val_check_interval=max(1, min(t.val_check_interval, t.max_steps)),  # max_steps=0: no fit
        check_val_every_n_epoch=None,
        gradient_clip_val=t.optim.grad_clip or None,
        enable_progress_bar=t.progress_bar,
        enable_model_summary=verbosity() > 0,
        logger=logger if logger is not None else False,
        callbacks=[*callbacks, *([StepProgressBar()] if t.progress_bar else [])],
        plugins=[AtomicCheckpointIO()],
        default_root_dir=run_dir,
        strategy=strategy_for(t, t.strategy),  # over several nodes, joined within trainer.rendezvous_timeout_s
    )
    return L.Trainer(**{**passed, **translated})
