"""Experiment loggers: CSV by default, W&B on request (offline unless an API key is set)."""

import os
from pathlib import Path

from lightning.pytorch.loggers import CSVLogger, Logger, WandbLogger
from omegaconf import DictConfig, OmegaConf


def wandb_mode(requested: str) -> str:
    """auto: online only when an API key is configured, so nothing hangs on a machine without W&B access."""
    if requested != "auto":
        return requested
    return "online" if os.environ.get("WANDB_API_KEY") else "offline"


def make_logger(cfg: DictConfig, run_dir: Path) -> Logger | None:
    if cfg.logger.kind == "none":
        return None
    if cfg.logger.kind == "csv":
        return CSVLogger(save_dir=run_dir, name="logs", version="")
    w = cfg.logger.wandb
    logger = WandbLogger(
        project=w.project,
        entity=w.entity,
        group=w.group or cfg.experiment,
        name=w.name,
        tags=list(w.tags),
        save_dir=str(run_dir),
        mode=wandb_mode(w.mode),
    )
    logger.log_hyperparams(OmegaConf.to_container(cfg, resolve=True))
    return logger
