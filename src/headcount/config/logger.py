"""The logger section: CSV, W&B or none, and the W&B run's project, group and mode."""

from dataclasses import dataclass, field

from headcount.config.choice import Choice, check_choice
from headcount.errors import ConfigError

WANDB_PROJECT_FORBIDDEN = "/\\#?%:"


class LoggerKind(Choice):
    csv = "csv"
    wandb = "wandb"
    none = "none"


class WandbMode(Choice):
    auto = "auto"  # online with an API key and a server that answers, else offline
    online = "online"
    offline = "offline"
    disabled = "disabled"


@dataclass
class WandbConfig:
    project: str = "headcount"
    entity: str | None = None
    group: str | None = None  # default: the experiment or sweep name
    name: str | None = None  # default: the command-line overrides
    tags: list[str] = field(default_factory=list)
    mode: WandbMode = WandbMode.auto


@dataclass
class LoggerConfig:
    kind: LoggerKind = LoggerKind.csv
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


def validate_logger_config(cfg: LoggerConfig) -> None:
    check_choice("logger.kind", cfg.kind, LoggerKind)
    if cfg.kind == "wandb":
        validate_wandb_project(cfg.wandb.project)
        check_choice("logger.wandb.mode", cfg.wandb.mode, WandbMode)
