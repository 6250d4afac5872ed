"""Typed config schema, registered with Hydra's ConfigStore so a misspelt key or a wrong type fails at compose time.

conf/train.yaml and conf/ablate.yaml name these schemas first in their defaults lists; every group file then merges
onto a typed node.
"""

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING, DictConfig, OmegaConf

from headcount.ablation.config import AblationConfig, ScanConfig
from headcount.data.config import DataConfig
from headcount.errors import ConfigError
from headcount.model.transformer import ModelConfig

CONF_DIR = str(Path(__file__).resolve().parents[2] / "conf")
PRECISIONS = ("32-true", "64-true", "bf16-mixed", "16-mixed", "bf16-true")
LOGGERS = ("csv", "wandb", "none")


@dataclass
class OptimConfig:
    lr: float = 1e-3
    weight_decay: float = 0.1
    beta1: float = 0.9
    beta2: float = 0.95
    warmup_steps: int = 50
    min_lr_ratio: float = 0.1  # cosine decays to lr * min_lr_ratio at max_steps
    grad_clip: float = 1.0


@dataclass
class TrainerConfig:
    accelerator: str = "cpu"
    devices: Any = 1
    strategy: str = "auto"
    num_nodes: int = 1
    precision: str = "32-true"
    max_steps: int = 500
    val_check_interval: int = 100  # steps between validations (and best-checkpoint checks)
    limit_val_batches: float = 1.0
    log_every_n_steps: int = 10
    compile: bool = False
    deterministic: bool = True
    progress_bar: bool = True
    optim: OptimConfig = field(default_factory=OptimConfig)


@dataclass
class WandbConfig:
    project: str = "headcount"
    entity: str | None = None
    group: str | None = None  # default: the experiment or sweep name
    name: str | None = None  # default: the command-line overrides
    tags: list[str] = field(default_factory=list)
    mode: str = "auto"  # auto (online with an API key and network, else offline) | online | offline | disabled


@dataclass
class LoggerConfig:
    kind: str = "csv"  # csv | wandb | none
    wandb: WandbConfig = field(default_factory=WandbConfig)


@dataclass
class TrainConfig:
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    logger: LoggerConfig = field(default_factory=LoggerConfig)
    ablation: AblationConfig = field(default_factory=AblationConfig)
    seed: int = 0
    experiment: str | None = None  # set by experiment=<name> files; names the W&B group and the report
    # A multirun writes to outputs/multirun/<sweep_name>, default the experiment name, else "sweep": the same command
    # finds the same folder again and skips finished jobs; a fresh sweep needs a new name (or hydra.sweep.dir=...).
    sweep_name: str | None = None
    size: str = "cpu"  # cpu | gpu | smoke: which size of an experiment runs (conf/size/)
    finding: str | None = None  # set by experiment files: the published finding checked on the results


@dataclass
class AblateConfig:
    run_dir: str = MISSING  # a finished training run
    ablation: AblationConfig = field(default_factory=AblationConfig)


def register_configs() -> None:
    cs = ConfigStore.instance()
    cs.store(name="train_schema", node=TrainConfig)
    cs.store(name="ablate_schema", node=AblateConfig)
    cs.store(group="ablation", name="scan_schema", node=ScanConfig)


def validate_train_config(cfg: DictConfig) -> None:
    """Checks across sections that a single dataclass cannot express; raises ConfigError."""
    from headcount.data import data_vocab_size
    from headcount.model.transformer import validate_model_config

    model_cfg: ModelConfig = OmegaConf.to_object(cfg.model)
    validate_model_config(model_cfg)
    if cfg.data.seq_len > cfg.model.n_ctx:
        raise ConfigError("data.seq_len", cfg.data.seq_len, f"must be at most model.n_ctx={cfg.model.n_ctx}")
    data_vocab = data_vocab_size(OmegaConf.to_object(cfg.data))
    if data_vocab > cfg.model.vocab_size:
        raise ConfigError(
            "model.vocab_size", cfg.model.vocab_size, f"must be at least the data's vocabulary ({data_vocab})"
        )
    if cfg.trainer.precision not in PRECISIONS:
        raise ConfigError("trainer.precision", cfg.trainer.precision, f"allowed: {', '.join(PRECISIONS)}")
    if cfg.trainer.max_steps < 1:
        raise ConfigError("trainer.max_steps", cfg.trainer.max_steps, "must be a positive integer")
    if cfg.logger.kind not in LOGGERS:
        raise ConfigError("logger.kind", cfg.logger.kind, f"allowed: {', '.join(LOGGERS)}")
