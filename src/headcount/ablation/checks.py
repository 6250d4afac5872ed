"""The checks on an ablation section that need no model or data beyond its own settings and the task section: the
components it names (mode, metric, scans) and how they combine. Every command and the Python API run them before
any work, so a mistake is one line; they run once per settings: `plan` (ablation/plan.py) takes what they return,
`CheckedSettings`, and checks nothing again."""

from dataclasses import dataclass
from enum import Enum

from headcount.ablation.engine.metrics import resolve_metric
from headcount.ablation.engine.modes import MODES, AblationMode
from headcount.ablation.scans import validate_scans
from headcount.ablation.task_seeds import check_generated, check_task_seeds
from headcount.config.ablation import AblationConfig, mode_setting_keys, validate_ablation_config
from headcount.config.task import TaskConfig, validate_task_config
from headcount.errors import ConfigError
from headcount.tasks import SOURCES


@dataclass(frozen=True)
class CheckedSettings:
    """Settings that passed validate_settings, with the task section they were checked against and their mode."""

    settings: AblationConfig
    task: TaskConfig | None
    mode: AblationMode


def validate_settings(s: AblationConfig, task: TaskConfig | None) -> CheckedSettings:
    """The settings checked, with their mode; ConfigError for the first thing wrong. task: the task section, None for
    the run's own data. Every scan's settings are its kind's (typed by ablation/scans/base.py's typed_scan)."""
    validate_ablation_config(s)
    if s.task_seeds is not None:
        check_task_seeds(s.task_seeds)
        check_generated(task, seeds=s.task_seeds)
    mode = MODES.get(str(s.mode))()
    if task is not None:
        validate_task_config(task, list(SOURCES))
    metric = resolve_metric(s.metric, task=task is not None) if s.metric is not None else None
    if task is None and mode.needs_task:
        raise ConfigError("ablation.mode", mode.name, mode.needs_task)
    if task is None and s.patch_positions == "each":
        raise ConfigError(
            "ablation.patch_positions",
            "each",
            "positions are named by a task (task=ioi: IO, S1, S1+1, S2, end); the run's data names none",
        )
    if task is not None and s.split != "val":  # a task evaluates its own prompts: the split was silently ignored
        raise ConfigError(
            "ablation.split",
            s.split,
            "a task is evaluated on its own prompts, never on a split of the run's data: leave ablation.split out "
            "with a task (task.n_prompts and task.seed choose the prompts)",
        )
    if task is None and metric is not None and metric.needs_wrong:
        raise ConfigError("ablation.metric", metric.name, "needs a wrong answer per prompt: only a task has them")
    if s.prune.export and not mode.foldable(s):
        raise ConfigError(
            "ablation.prune.export",
            True,
            f"a smaller model can fold only zero or position-averaged mean ablation; {mode.described(s)} varies with "
            "the input",
        )
    refuse_other_modes_keys(s, mode)
    validate_scans(s)
    return CheckedSettings(s, task, mode)


def refuse_other_modes_keys(s: AblationConfig, mode: AblationMode) -> None:
    """A one-line ConfigError for a key another mode alone reads set away from its default (mean_per_position under
    mode=zero): it was ignored, and the result looked like the setting's."""
    defaults = AblationConfig()
    for key in mode_setting_keys():
        value = getattr(s, key)
        if key in mode.own_keys or value == getattr(defaults, key):
            continue
        owners = [name for name in MODES.names() if key in MODES[name].own_keys]
        shown = value.value if isinstance(value, Enum) else value
        raise ConfigError(
            f"ablation.{key}",
            shown,
            f"is read by mode={' or '.join(owners)} only, and ablation.mode is {mode.name}: leave it out, or set "
            f"ablation.mode={owners[0]}",
        )
