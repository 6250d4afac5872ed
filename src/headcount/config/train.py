"""The trainer section: how Lightning trains (steps, precision, devices), how often it checkpoints, and the optimiser.

The defaults are the default preset, `trainer=cpu`. Every field named like an argument of `lightning.Trainer` goes to
it unchanged (train/trainer.py), so a new Trainer setting needs only a field here.
"""

from dataclasses import dataclass, field
from typing import Any

from headcount.config.choice import check_bools, check_choice, choices
from headcount.errors import ConfigError, check_non_negative, check_positive, finite

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
    checkpoint_every_n_steps: int = 250  # steps between writes of last.ckpt, the point a killed run resumes from
    compile: bool = False  # torch.compile the model
    progress_bar: bool = True
    # how long the processes of a job over several nodes wait for each other to join before it ends in one line
    # (torch.distributed's own default: 30 minutes, silent); collectives after the join keep torch's default
    rendezvous_timeout_s: int = 300
    optim: OptimConfig = field(default_factory=OptimConfig)


GPU_ACCELERATORS = ("gpu", "cuda")


def check_devices_here(cfg: TrainerConfig) -> None:
    """ConfigError for devices this machine does not have, before any work: Lightning fails on them deep inside a
    run (a traceback), and a scan of one process would run on the CPU without a word."""
    import torch  # the machine's devices: only the commands ask

    has_gpu = torch.cuda.is_available()
    if cfg.accelerator in GPU_ACCELERATORS and not has_gpu:
        raise ConfigError(
            "trainer.accelerator", cfg.accelerator, "this machine has no GPU: use trainer.accelerator=cpu"
        )
    if cfg.num_nodes > 1 and not cluster_starts_nodes():
        raise ConfigError(
            "trainer.num_nodes",
            cfg.num_nodes,
            "more than one node needs a process started on each, which nothing here does (the job would wait for "
            "them forever): run it under SLURM (hydra/launcher=slurm) or torchrun, or set MASTER_ADDR, MASTER_PORT "
            "and NODE_RANK on every node",
        )
    on_cpu = cfg.accelerator == "cpu" or (cfg.accelerator == "auto" and not has_gpu)
    if on_cpu and str(cfg.devices).strip() == "-1":
        raise ConfigError(
            "trainer.devices",
            cfg.devices,
            "on the CPU, the number of processes: a positive integer (-1 means every GPU)",
        )


def cluster_starts_nodes() -> bool:
    """Whether a cluster environment Lightning knows starts this job's processes on its nodes, or the user has set
    the variables that join nodes by hand (Lightning's default environment reads them)."""
    import os

    from lightning.fabric.plugins.environments import (
        LSFEnvironment,
        MPIEnvironment,
        SLURMEnvironment,
        TorchElasticEnvironment,
    )

    # (Kubeflow's environment is never detected: it is given to the Trainer as a plugin, which headcount does not do)
    clusters = (SLURMEnvironment, TorchElasticEnvironment, LSFEnvironment, MPIEnvironment)
    return any(cluster.detect() for cluster in clusters) or {"MASTER_ADDR", "NODE_RANK"} <= set(os.environ)


def check_at_least(key: str, value: float, least: float, what: str) -> None:
    if value < least:
        raise ConfigError(key, value, what)


def validate_trainer_config(cfg: TrainerConfig, least_steps: int = 1) -> None:
    """What a type cannot check: values Lightning would fail on deep inside a run, or silently misuse. least_steps=0
    lets max_steps=0 through (a pretrained model evaluated as it is)."""
    check_choice("trainer.precision", cfg.precision, Precision)
    check_bools("trainer", cfg)
    if cfg.max_steps < least_steps:
        allowed = "must be a positive integer (0 only with model.pretrained: evaluate it as it is)"
        raise ConfigError("trainer.max_steps", cfg.max_steps, allowed if least_steps else "must be 0 or more")
    for key in (
        "val_check_interval",
        "checkpoint_every_n_steps",
        "log_every_n_steps",
        "num_nodes",
        "rendezvous_timeout_s",
    ):
        check_at_least(f"trainer.{key}", getattr(cfg, key), 1, "must be a positive integer")
    limit = cfg.limit_val_batches
    if not (finite(limit) and (0 <= limit <= 1 or limit == int(limit) > 1)):
        # Lightning reads a float above 1 as a number of batches, and fails inside the run on one that is not whole
        allowed = "must be a share of the validation batches in [0, 1] (0: no validation) or a whole number of them"
        raise ConfigError("trainer.limit_val_batches", limit, allowed)
    o = cfg.optim
    check_positive("trainer.optim.lr", o.lr)
    for key in ("weight_decay", "warmup_steps", "grad_clip"):
        check_non_negative(f"trainer.optim.{key}", getattr(o, key))
    for key in ("beta1", "beta2"):
        if not 0 <= getattr(o, key) < 1:
            raise ConfigError(f"trainer.optim.{key}", getattr(o, key), "must be in [0, 1)")
    if not 0 <= o.min_lr_ratio <= 1:
        raise ConfigError("trainer.optim.min_lr_ratio", o.min_lr_ratio, "must be in [0, 1]")
