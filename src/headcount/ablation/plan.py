"""The one setup path of an ablation, in two steps: `plan` (the settings checked, the task built, the metric resolved,
the mode checked against the task, the results' address) needs only the model's shape; the session then prepares
the rest with the model itself (replacements, evaluator, baseline: ablation/session.py). headcount-ablate, the
training command, the Python API's evaluate and scan, and the pre-flight check all plan here."""

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from headcount.ablation.checks import CheckedSettings
from headcount.ablation.engine.metrics import Metric, resolve_metric
from headcount.ablation.engine.modes import AblationMode
from headcount.ablation.records.address import ResultAddress, variant_of
from headcount.config.ablation import AblationConfig
from headcount.config.task import TaskConfig
from headcount.errors import ConfigError
from headcount.tasks import SOURCES, TaskSet


@dataclass
class AblationPlan:
    """What an ablation does, decided before any evaluation: settings, mode, metric, task (None: the run's own
    data) and where its results live."""

    settings: AblationConfig
    mode: AblationMode
    metric: Metric
    task: TaskSet | None
    address: ResultAddress

    @property
    def positions(self) -> list[str]:
        """The task's named positions (the columns of a batch's named_pos); none on the run's data."""
        return [] if self.task is None else list(self.task.positions)


def plan(checked: CheckedSettings, make_task: Callable[[TaskConfig], TaskSet], ablation_dir: Path) -> AblationPlan:
    """From settings checked once (ablation/checks.py validate_settings), build the task they were checked with using
    `make_task` (its prompts encoded for the model's tokenizer), resolve the metric (a task's default: logit_diff when
    it has wrong answers) and check the mode against the task (ConfigError for the first thing wrong). ablation_dir:
    the run's <run>/ablation/."""
    settings, task_cfg, mode = checked.settings, checked.task, checked.mode
    task = None if task_cfg is None else make_task(task_cfg)
    metric = resolve_metric(settings.metric, None if task is None else task.has_wrong, task=task is not None)
    mode.check(settings, None if task is None else task.has_corrupted)
    # a masked-LM task is an encoder's (ablation/encoder_checks.py), whose every position reads every other
    if task is not None and settings.patch_positions == "each" and not SOURCES.get(task_cfg.source).masked_lm:
        check_patched_positions(task)
    variant = variant_of(settings.mode, settings.patch_direction, settings.patch_positions, settings.dtype)
    address = ResultAddress(Path(ablation_dir), settings.mode, metric.name, "" if task is None else task.name, variant)
    return AblationPlan(settings, mode, metric, task, address)


def check_patched_positions(task: TaskSet) -> None:
    """ConfigError when a named position lies after a prompt's last scored token: patching it cannot change the
    score (the model is causal; an encoder's masked-LM task is not checked), so every delta at it would be 0.0. A
    prompts file that scores before its end (`position: -3`) met this at its `end`."""
    last_scored_N = task.score_mask.long().cumsum(1).argmax(1)  # the index of each prompt's last scored token
    for name, where_N in task.positions.items():
        after = ((where_N > last_scored_N) & (where_N >= 0)).nonzero().flatten().tolist()
        if after:
            i = after[0]
            raise ConfigError(
                "ablation.patch_positions",
                "each",
                f"the task's position {name!r} is token {int(where_N[i])} of prompt {i}, after the token it scores "
                f"({int(last_scored_N[i])}): patching it cannot change the score. Patch each position only of prompts "
                "scored at or after every named position (name them in the file), or ablation.patch_positions=all",
            )
