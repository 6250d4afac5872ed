"""The trainer section: how Lightning trains (steps, precision, devices) and the optimiser.

The defaults are the default preset, `trainer=cpu`. Every field named like an argument of `lightning.Trainer` goes to
it unchanged (train/trainer.py), so a new Trainer setting needs only a field here.
"""

from dataclasses import dataclass, field
from typing import Any

from headcount.config.choice import check_choice, choices
from headcount.errors import ConfigError

Precision = choices("Precision", ["32-true", "64-true", "bf16-mixed", "16-mixed", "bf16-true"])


@dataclass
class OptimConfig:
    lr: float = 3e-3  # small models tolerate (and need, to learn in minutes on a CPU) a high rate
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
    precision: Precision = Precision["32-true"]
    max_steps: int = 4000
    val_check_interval: int = 1000  # steps between validations (and best-checkpoint checks)
    limit_val_batches: float = 1.0
    log_every_n_steps: int = 10
    deterministic: bool = True
    # headcount's own settings, not Trainer arguments:
    compile: bool = False  # torch.compile the model
    progress_bar: bool = True
    optim: OptimConfig = field(default_factory=OptimConfig)


def validate_trainer_config(cfg: TrainerConfig) -> None:
    check_choice("trainer.precision", cfg.precision, Precision)
    if cfg.max_steps < 1:
        raise ConfigError("trainer.max_steps", cfg.max_steps, "must be a positive integer")
