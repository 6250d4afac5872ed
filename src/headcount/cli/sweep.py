"""What headcount adds to Hydra's multirun: checks that make bad input fail before the first job rather than at job
17, and the resolvers that name a sweep's folder and size the parallel launcher.

- `check_launcher_installed`: a `hydra/launcher=<name>` whose plugin package is missing names the package to install
  (Hydra alone says only that the config was not found).
- `ValidateJobsFirst` (a Hydra callback, listed in conf/train.yaml): composes every job of the sweep and validates it.
  Hydra's basic sweeper does compose each job up front, but reports a misspelt key as a multi-line trace with exit 1,
  and checks across sections (heads that do not divide the width, a bad W&B project) would only fail inside the job.
  Jobs are expanded with the basic sweeper's own function (a hydra-core internal), so they match its jobs exactly.
- `sweep_folder_name`: behind `hydra.sweep.dir`, so the same command finds the same folder again.
"""

import sys
from importlib.util import find_spec
from pathlib import Path
from typing import Any

from hydra import compose
from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.experimental.callback import Callback
from hydra.utils import get_method
from omegaconf import DictConfig, OmegaConf
from rich.console import Console
from rich.markup import escape

from headcount.cli.errors import BAD_INPUT, describe, print_error
from headcount.config import CONF_DIR
from headcount.errors import ConfigError
from headcount.findings import check_finding, reads_sweep
from headcount.report.sweep_report import print_summary, write_report

# Launcher plugin configs (as Hydra registers them, by name prefix) -> (module, pip package).
LAUNCHER_PLUGINS = {
    "joblib": ("hydra_plugins.hydra_joblib_launcher", "hydra-joblib-launcher"),
    "submitit": ("hydra_plugins.hydra_submitit_launcher", "hydra-submitit-launcher"),
}


def sweep_folder_name(sweep_name: str | None, experiment: str | None) -> str:
    return sweep_name or experiment or "sweep"


def parallel_jobs() -> int:
    """hydra/launcher=parallel's n_jobs: one job per GPU; without GPUs, joblib's -1 (one per CPU core, each limited
    to one thread by joblib)."""
    import torch

    return torch.cuda.device_count() or -1


def register_resolvers() -> None:
    """`${headcount.sweep_folder:${sweep_name},${experiment}}` (OmegaConf's oc.select cannot fall back past a key
    set to null) and `${headcount.parallel_jobs:}`, used in conf/."""
    OmegaConf.register_new_resolver("headcount.sweep_folder", sweep_folder_name, replace=True)
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


class ValidateJobsFirst(Callback):
    """Before any job of a multirun starts, composes each job's config and passes it to `validate` (a dotted path to
    a function that raises ConfigError); the first failure is one line naming the job, and exit code 2."""

    def __init__(self, validate: str):
        self.validate = validate

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        if not config.hydra.sweeper._target_.endswith(".BasicSweeper"):
            return  # other sweepers choose their jobs as they go
        validate = get_method(self.validate)
        for num, overrides in enumerate(jobs := sweep_jobs(config)):
            try:
                validate(compose(config.hydra.job.config_name, overrides=overrides))
            except BAD_INPUT as e:
                print_error(f"job {num} of {len(jobs)} ({' '.join(overrides)}): {describe(e)}; no job started")
                sys.exit(2)


class ReportAndCheckFinding(Callback):
    """After the last job of an experiment's sweep: the sweep report, then the experiment's finding on it (a finding
    that reads single runs is checked inside each job instead)."""

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        finding = config.get("finding")
        if finding is None or not reads_sweep(finding):
            return
        sweep_dir = Path(config.hydra.sweep.dir)
        out, runs, _ = write_report(sweep_dir)
        print_summary(out, runs)
        written = check_finding(finding, sweep_dir)
        Console(stderr=True).print(f"[green]wrote[/green] {escape(str(written))}", soft_wrap=True)
