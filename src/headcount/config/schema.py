"""Typed config schema, registered with Hydra's ConfigStore so a misspelt key or a wrong type fails at compose time.

conf/train.yaml and conf/ablate.yaml name these schemas first in their defaults lists; every group file then merges
onto a typed node.
"""

from dataclasses import dataclass, field
from pathlib import Path

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING, DictConfig, OmegaConf

from headcount.config.ablation import AblationConfig, ScanConfig
from headcount.config.data import DataConfig
from headcount.config.logger import LOGGERS, LoggerConfig
from headcount.config.model import ModelConfig, validate_model_config
from headcount.config.train import PRECISIONS, TrainerConfig
from headcount.errors import ConfigError

CONF_DIR = str(Path(__file__).resolve().parents[3] / "conf")


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
