"""The logger section: CSV, W&B or none, and the W&B run's project, group and mode."""

from dataclasses import dataclass, field

from omegaconf import DictConfig

from headcount.errors import ConfigError

LOGGERS = ("csv", "wandb", "none")
WANDB_MODES = ("auto", "online", "offline", "disabled")
WANDB_PROJECT_FORBIDDEN = "/\\#?%:"


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


def validate_wandb_project(project: str | None) -> None:
    """The project names W&B refuses, caught before any job starts; raises ConfigError."""
    project = project or ""
    if not project or len(project) > 128 or any(c in project for c in WANDB_PROJECT_FORBIDDEN):
        raise ConfigError(
            "logger.wandb.project",
            project,
            f"W&B needs 1 to 128 characters, none of {' '.join(WANDB_PROJECT_FORBIDDEN)}",
        )


def validate_wandb_config(w: DictConfig) -> None:
    validate_wandb_project(w.project)
    if w.mode not in WANDB_MODES:
        raise ConfigError("logger.wandb.mode", w.mode, f"allowed: {', '.join(WANDB_MODES)}")
