"""What headcount-ablate runs its scans under, and every check on it that needs no weights, so that a mistake is one
line before any work: in a multirun (-m), before the first job (`ValidateAblateJobsFirst`, listed in conf/ablate.yaml);
for a pretrained model, before its weights are converted or anything is written in its run directory.

`ablated_config` is the config a job's scans run under: the run's own (its data, seed and model), its ablation
section overridden by the `ablation.*` keys typed on the command line, the scans selected there, the command's
trainer section, and the command's task when it names one. `check_ablate_job` checks it as headcount-train's
pre-flight checks a job (cli/preflight.py): the ablation settings, the task built with the model's tokenizer (only the
tokenizer: a pretrained checkpoint's weights are not read), and each scan's checks against the model's heads, on the
meta device.
"""

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf

from headcount.config.ablation import AblationConfig, mode_setting_keys, unselected_scans_dropped


def typed_ablation_keys(overrides: Sequence[str]) -> list[str]:
    """The `ablation.*` keys of command-line overrides, scans aside (they come from the selected scan configs)."""
    keys = [override.split("=", 1)[0].lstrip("+~") for override in overrides]
    return [key for key in keys if key.startswith("ablation.") and not key.startswith("ablation.scans")]


def task_selected(overrides: Sequence[str]) -> bool:
    """Whether the command line names a task (task=..., task.*=...), which then replaces the run's own."""
    return any(override.split("=", 1)[0].lstrip("+~").split(".")[0] == "task" for override in overrides)


def ablated_config(cfg: DictConfig, run_cfg: DictConfig, typed_keys: Sequence[str], task_given: bool) -> DictConfig:
    """The config the scans of a composed ablate config (cfg) run under, on the run whose config is run_cfg (changed
    in place); typed_keys: the dotted `ablation.*` keys to take from cfg over the run's own settings; task_given: the
    command line selected a task (else the run's own task section, if it has one, applies)."""
    base = OmegaConf.to_container(run_cfg.get("ablation") or OmegaConf.create({}))
    base.pop("scans", None)
    if "ablation.mode" in typed_keys and OmegaConf.select(cfg, "ablation.mode") != base.get("mode"):
        for key in mode_setting_keys():  # the run's own mode's keys stay with it (another mode refuses them)
            if f"ablation.{key}" not in typed_keys:
                base.pop(key, None)
    ablation = OmegaConf.merge(OmegaConf.structured(AblationConfig), base)
    for key in typed_keys:
        OmegaConf.update(ablation, key.removeprefix("ablation."), OmegaConf.select(cfg, key), merge=True)
    unselected_scans_dropped(cfg)
    ablation.scans = cfg.ablation.scans
    run_cfg.ablation = ablation
    run_cfg.trainer = cfg.trainer  # the processes this command shares its scans out over, not the run's training's
    if task_given or "task" not in run_cfg:
        run_cfg.task = cfg.task
    return run_cfg


def job_run_config(cfg: DictConfig) -> DictConfig:
    """The config of the run a composed ablate config works on: the finished run's own, or, for a pretrained model
    whose run directory is not made yet, what it will record (the model the checkpoint implies: its config is read,
    not its weights)."""
    from headcount.cli.pretrained_run import pretrained_run_config
    from headcount.run_dir import RunPaths, load_run_config

    if cfg.model.pretrained is not None and not RunPaths(Path(cfg.run_dir)).config.exists():
        return pretrained_run_config(cfg)
    return load_run_config(cfg.run_dir)


def check_ablate_job(cfg: DictConfig, overrides: Sequence[str]) -> None:
    """ConfigError for the first thing wrong with one headcount-ablate job (cfg composed from overrides), before any
    work: the settings, the task encoded with the model's tokenizer, every selected scan's checks against the model's
    heads, and the processes the trainer section asks for."""
    from headcount.ablation.records.distributed import check_scan_trainer
    from headcount.ablation.session import typed_ablation
    from headcount.cli.preflight import check_ablation, model_on_meta
    from headcount.config import typed
    from headcount.config.model import ModelConfig
    from headcount.config.train import TrainerConfig

    ablated = ablated_config(cfg, job_run_config(cfg), typed_ablation_keys(overrides), task_selected(overrides))
    settings = typed_ablation(ablated.ablation)
    check_ablation(settings, model_on_meta(typed(ablated.model, ModelConfig), ablated.trainer), ablated)
    check_scan_trainer(typed(ablated.trainer, TrainerConfig), settings.device)


class ValidateAblateJobsFirst(Callback):
    """Before the first job of a headcount-ablate multirun starts, checks every job (check_ablate_job); the first
    failure is one line naming the job, and exit code 2. A single run checks itself as it starts (the session)."""

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        from headcount.cli.sweep import check_every_job

        check_every_job(config, check_ablate_job)
