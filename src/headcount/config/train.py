"""The trainer section: how Lightning trains (steps, precision, devices) and the optimiser."""

from dataclasses import dataclass, field
from typing import Any

PRECISIONS = ("32-true", "64-true", "bf16-mixed", "16-mixed", "bf16-true")


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
