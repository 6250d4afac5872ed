"""The run directory contract (DESIGN.md): `.hydra/`, `checkpoints/last.ckpt`, `metrics.json`, `ablation/`, `DONE` last.

Each stage reads the previous stage's files from here, so any stage can be rerun alone.
"""

from dataclasses import dataclass
from pathlib import Path

import torch
from omegaconf import DictConfig, OmegaConf

from headcount.config.model import ModelConfig
from headcount.errors import ConfigError
from headcount.io import atomic_write_text
from headcount.model.transformer import Transformer


@dataclass(frozen=True)
class RunPaths:
    root: Path

    @property
    def config(self) -> Path:
        return self.root / ".hydra" / "config.yaml"

    @property
    def checkpoints(self) -> Path:
        return self.root / "checkpoints"

    @property
    def last_ckpt(self) -> Path:
        return self.checkpoints / "last.ckpt"

    @property
    def metrics(self) -> Path:
        return self.root / "metrics.json"

    @property
    def ablation(self) -> Path:
        return self.root / "ablation"

    @property
    def done(self) -> Path:
        return self.root / "DONE"


def is_done(run_dir: str | Path) -> bool:
    return RunPaths(Path(run_dir)).done.exists()


def mark_done(run_dir: str | Path) -> None:
    atomic_write_text(RunPaths(Path(run_dir)).done, "")


def model_config_from_dict(model: dict | DictConfig) -> ModelConfig:
    """A typed ModelConfig from a plain or OmegaConf mapping (what checkpoints and run configs store)."""
    return OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(ModelConfig), model))


def load_model(ckpt_path: str | Path, map_location: str | torch.device = "cpu") -> Transformer:
    """The Transformer stored in a headcount checkpoint (a Lightning one or a structurally pruned export)."""
    ckpt = torch.load(ckpt_path, map_location=map_location, weights_only=False)
    model = Transformer(model_config_from_dict(ckpt["hyper_parameters"]["model"]))
    state = {k.removeprefix("model."): v for k, v in ckpt["state_dict"].items() if k.startswith("model.")}
    model.load_state_dict(state)
    return model


def load_run_config(run_dir: str | Path) -> DictConfig:
    paths = RunPaths(Path(run_dir))
    if not paths.config.exists():
        raise ConfigError("run_dir", str(run_dir), "is not a headcount run directory (no .hydra/config.yaml)")
    return OmegaConf.load(paths.config)


def finished_checkpoint(run_dir: str | Path) -> Path:
    """last.ckpt of a run whose training finished (metrics.json is written after the last step)."""
    paths = RunPaths(Path(run_dir))
    if not (paths.last_ckpt.exists() and paths.metrics.exists()):
        raise ConfigError(
            "run_dir", str(run_dir), "has no finished training run (needs checkpoints/last.ckpt and metrics.json)"
        )
    return paths.last_ckpt
