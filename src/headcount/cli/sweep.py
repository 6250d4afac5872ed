"""What headcount adds to Hydra's runs and multiruns: checks that make bad input fail before the first job rather than
at job 17, run folders named by the swept keys, and the resolvers behind conf/train.yaml.

- `check_launcher_installed`: a `hydra/launcher=<name>` whose plugin package is missing names the package to install
  (Hydra alone says only that the config was not found).
- `ValidateJobsFirst` (a Hydra callback, listed in conf/train.yaml): validates a single run before Hydra writes its
  folder, and every job of a sweep before the first starts. Hydra's basic sweeper does compose each job up front,
  but checks across sections (heads that do not divide the width, a model too large for the machine, a scan setting)
  would only fail inside the job, after training. Jobs are expanded with the basic sweeper's own function (a
  hydra-core internal), so they match its jobs exactly. It then names the jobs' folders (report/names.py): the keys
  every job shares join Hydra's `override_dirname.exclude_keys`, so each job's folder (and its W&B run name) shows
  only what sets it apart, and refuses a folder that already holds a run made with other settings, or that another
  process is using.
- `NamesFirst` (headcount-ablate's callback, conf/ablate.yaml): the component names a run's config uses, checked
  against registry.py's index before Hydra writes a folder and before torch loads.
- `ReportAndCheckFinding`: the sweep's last word: the report and the finding of an experiment, and the
  `headcount-report` command.
- `sweep_folder_name`, `job_folder`: behind `hydra.sweep.dir` and `hydra.sweep.subdir`, so the same command finds
  the same folders again.
"""

import shlex
import sys
from collections.abc import Callable
from importlib.util import find_spec
from pathlib import Path
from typing import Any

from hydra import compose
from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.experimental.callback import Callback
from hydra.utils import get_method
from omegaconf import DictConfig, ListConfig, OmegaConf, open_dict, read_write
from rich.console import Console
from rich.markup import escape

from headcount import run_lock
from headcount.cli.errors import BAD_INPUT, describe, print_error
from headcount.cli.reruns import check_rerun
from headcount.config import CONF_DIR
from headcount.config.ablation import unselected_scans_dropped
from headcount.config.names import check_component_names
from headcount.config.schema import check_bool_overrides
from headcount.errors import ConfigError
from headcount.report.names import folder_name, override_values

# Launcher plugin configs (as Hydra registers them, by name prefix) -> (module, pip package).
LAUNCHER_PLUGINS = {
    "joblib": ("hydra_plugins.hydra_joblib_launcher", "hydra-joblib-launcher"),
    "submitit": ("hydra_plugins.hydra_submitit_launcher", "hydra-submitit-launcher"),
}
EXCLUDE_KEYS = "hydra.job.config.override_dirname.exclude_keys"


def sweep_folder_name(sweep_name: str | None, experiment: str | None) -> str:
    return sweep_name or experiment or "sweep"


def job_folder(task_overrides: ListConfig, exclude_keys: ListConfig) -> str:
    return folder_name(list(task_overrides), list(exclude_keys))


def parallel_jobs() -> int:
    """hydra/launcher=parallel's n_jobs: one job per GPU; without GPUs, joblib's -1 (one per CPU core, each limited
    to one thread by joblib)."""
    import torch

    return torch.cuda.device_count() or -1


def register_resolvers() -> None:
    """`${headcount.sweep_folder:${sweep_name},${experiment}}` (OmegaConf's oc.select cannot fall back past a key
    set to null), `${headcount.job_folder:<task overrides>,<excluded keys>}` and `${headcount.parallel_jobs:}`, used in
    conf/."""
    OmegaConf.register_new_resolver("headcount.sweep_folder", sweep_folder_name, replace=True)
    OmegaConf.register_new_resolver("headcount.job_folder", job_folder, replace=True)
    OmegaConf.register_new_resolver("headcount.parallel_jobs", parallel_jobs, replace=True)


def plugin_launcher(name: str) -> str:
    """The plugin launcher config a launcher name stands for: our conf/hydra/launcher/<name>.yaml files extend one
    through their defaults list; any other name is Hydra's or a plugin's own."""
    ours = Path(CONF_DIR) / "hydra" / "launcher" / f"{name}.yaml"
    if not ours.exists():
        return name
    return next(entry for entry in OmegaConf.load(ours).get("defaults", []) if entry != "_self_")


def check_launcher_installed(argv: list[str]) -> None:
    """Raises ConfigError for a `hydra/launcher=<name>` on the command line whose plugin package is not installed."""
    for arg in argv:
        key, _, name = arg.partition("=")
        if key.lstrip("+") != "hydra/launcher":
            continue
        plugin = plugin_launcher(name)
        for prefix, (module, package) in LAUNCHER_PLUGINS.items():
            if plugin.startswith(prefix) and find_spec(module) is None:
                raise ConfigError("hydra/launcher", name, f"needs the {package} package: pip install {package}")


def sweep_jobs(config: DictConfig) -> list[list[str]]:
    """Each job's overrides, expanded as the basic sweeper does: hydra.sweeper.params (from an experiment file) first,
    then the command line's task overrides."""
    params = [f"{key}={value}" for key, value in (config.hydra.sweeper.get("params") or {}).items()]
    overrides = OverridesParser.create().parse_overrides(params + list(config.hydra.overrides.task))
    return BasicSweeper.split_arguments(overrides, None)[0]


def swept_exclude_keys(jobs: list[list[str]], exclude: list[str]) -> list[str]:
    """Hydra's excluded keys plus every key all jobs give the same value: what is left names each job's folder. A
    sweep of one job keeps all its keys."""
    values = [override_values(job, exclude) for job in jobs]
    keys = sorted({key for job in values for key in job})
    shared = [key for key in keys if len({job.get(key) for job in values}) == 1]
    return exclude + shared if len(shared) < len(keys) else exclude


def first_difference(a: dict, b: dict) -> tuple[str, str | None, str | None]:
    """The first key two jobs' override values differ in, and its value in each (None: not set)."""
    key = next(k for k in sorted({*a, *b}) if a.get(k) != b.get(k))
    return key, a.get(key), b.get(key)


def setting(key: str, value: str | None) -> str:
    return f"{key}={value}" if value is not None else f"no {key}"


def check_job_folders(config: DictConfig, jobs: list[list[str]], exclude: list[str]) -> None:
    """ConfigError if two jobs would share a folder, or a job's folder holds a run made with other settings (the
    run would be taken as this job's and skipped as finished), or another process is using it."""
    sweep_dir = Path(config.hydra.sweep.dir)
    hydra_excluded = list(config.hydra.job.config.override_dirname.exclude_keys)
    by_folder: dict[str, int] = {}
    for num, job in enumerate(jobs):
        folder = folder_name(job, exclude)
        settings = override_values(job, hydra_excluded)
        if folder in by_folder:
            key, value, _ = first_difference(override_values(job, []), override_values(jobs[by_folder[folder]], []))
            raise ConfigError(
                key,
                value,
                f"jobs {by_folder[folder]} and {num} would share the run folder {folder}: keys that change only how "
                "a run is logged or named do not name folders; sweep them in separate sweeps (sweep_name=<name>)",
            )
        by_folder[folder] = num
        run_dir = sweep_dir / folder
        saved = run_dir / ".hydra" / "overrides.yaml"
        if saved.exists():
            existing = override_values(list(OmegaConf.load(saved)), hydra_excluded)
            if existing != settings:
                key, there, here = first_difference(existing, settings)
                raise ConfigError(
                    "sweep_name",
                    config.sweep_name,
                    f"{run_dir} holds a run made with {setting(key, there)}, not {setting(key, here)}; give this "
                    "sweep its own folder (sweep_name=<name>) or delete that run",
                )
        run_lock.check_free(run_dir, "sweep_name", config.sweep_name)


def name_folders_by(config: DictConfig, exclude: list[str]) -> None:
    """Every job's config is composed again from the launch config's Hydra overrides (ConfigLoader.load_sweep_config):
    one more there sets the excluded keys of every job."""
    quoted = ",".join("'" + key.replace("\\", "\\\\").replace("'", "\\'") + "'" for key in exclude)
    with read_write(config.hydra), open_dict(config.hydra):
        config.hydra.overrides.hydra.append(f"{EXCLUDE_KEYS}=[{quoted}]")
        config.hydra.job.config.override_dirname.exclude_keys = exclude


def without_hydra(config: DictConfig) -> DictConfig:
    return OmegaConf.masked_copy(config, [key for key in config if key != "hydra"])


def check_every_job(config: DictConfig, check: Callable[[DictConfig, list[str]], None]) -> list[list[str]]:
    """Each job of a multirun composed and passed to `check` (with its overrides) before the first starts; the first
    ConfigError is one line naming the job, and exit code 2. Returns the jobs' overrides (none for a sweeper that
    chooses its jobs as it goes)."""
    if not config.hydra.sweeper._target_.endswith(".BasicSweeper"):
        return []
    for num, overrides in enumerate(jobs := sweep_jobs(config)):
        try:
            job = compose(config.hydra.job.config_name, overrides=overrides)
            check_bool_overrides(job, overrides)
            check(job, overrides)
        except BAD_INPUT as e:
            print_error(f"job {num} of {len(jobs)} ({' '.join(overrides)}): {describe(e)}; no job started")
            sys.exit(2)
    return jobs


class ValidateJobsFirst(Callback):
    """Before a run or any job of a multirun starts, composes each job's config and passes it to `validate` (a dotted
    path to a function that raises ConfigError); the first failure is one line naming the job, and exit code 2."""

    def __init__(self, validate: str):
        self.validate = validate

    def on_run_start(self, config: DictConfig, **kwargs: Any) -> None:
        try:
            check_component_names(config)  # before torch loads: a misspelt name answers at once
            check_bool_overrides(without_hydra(config), config.hydra.overrides.task)
            get_method(self.validate)(without_hydra(config))
            check_rerun(config)
        except BAD_INPUT as e:
            print_error(describe(e))
            sys.exit(2)

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        if not config.hydra.sweeper._target_.endswith(".BasicSweeper"):
            return  # other sweepers choose their jobs as they go
        check_every_job(config, lambda job, overrides: check_component_names(job))  # every job's names, before torch
        validate = get_method(self.validate)
        jobs = check_every_job(config, lambda job, overrides: validate(job))
        exclude = swept_exclude_keys(jobs, list(config.hydra.job.config.override_dirname.exclude_keys))
        try:
            check_job_folders(config, jobs, exclude)
        except ConfigError as e:
            print_error(f"{e}; no job started")
            sys.exit(2)
        name_folders_by(config, exclude)


class NamesFirst(Callback):
    """headcount-ablate's: the component names a run's config uses (config/names.py), checked before Hydra writes a
    folder and before torch loads; the full checks follow in the job (headcount-train's ValidateJobsFirst does both)."""

    def on_run_start(self, config: DictConfig, **kwargs: Any) -> None:
        try:
            check_component_names(config)
        except BAD_INPUT as e:
            print_error(describe(e))
            sys.exit(2)


def skipped_finding(finding: str, scans: list[str]) -> bool:
    """Says so in one line when the finding cannot be checked because the scans it reads were not run."""
    from headcount.findings import missing_scans  # the findings' modules import torch: only once a job has run

    missing = missing_scans(finding, scans)
    if missing:
        Console(stderr=True).print(
            f"[yellow]finding {finding} skipped:[/yellow] it reads the {', '.join(missing)} scan results, and "
            f"ablation lists only {', '.join(scans) or 'no scans'}",
            soft_wrap=True,
            highlight=False,
        )
    return bool(missing)


class ReportAndCheckFinding(Callback):
    """After the last job of a sweep: for an experiment, the sweep report and then its finding (a finding that reads
    single runs is checked inside each job instead); for every sweep, the command that compares its runs."""

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        from headcount.findings import check_finding, reads_sweep  # torch and pandas: once the jobs have run
        from headcount.report.sweep_report import print_summary, write_report

        sweep_dir = Path(config.hydra.sweep.dir)
        finding = config.get("finding")
        console = Console(stderr=True)
        if finding is not None and reads_sweep(finding):
            out, runs, _ = write_report(sweep_dir)
            print_summary(out, runs)
            unselected_scans_dropped(config)
            if not skipped_finding(finding, list(config.ablation.scans)):
                written = check_finding(finding, sweep_dir)
                console.print(f"[green]wrote[/green] {escape(str(written))}", soft_wrap=True)
        console.print(
            f"[bold]compare the runs:[/bold] headcount-report {escape(shlex.quote(str(sweep_dir)))}",
            soft_wrap=True,
            highlight=False,
        )
