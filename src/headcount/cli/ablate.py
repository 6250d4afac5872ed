"""`headcount-ablate run_dir=<run> ablation=<scan> ablation.mode=<mode>`: ablation scans on a finished run.

The run's .hydra/config.yaml supplies the data and the seed (the checkpoint supplies the model). Its ablation section
is the base; each `ablation.*` key typed on the command line overrides it, and the scans are the ones selected here
(`ablation=single_head` by default, `ablation=[single_head,layer,pruning]` for several). Hydra's own files go to
<run>/ablation/logs/, so nothing lands in the working directory.

Before Hydra starts, run_dir must name a finished training run (else one line, exit 2, and nothing created), and the
command takes the run's lock (run_lock.py): one process at a time works on a run, training or ablating.

`headcount-ablate model.pretrained=<checkpoint> data=<source> [run_dir=<folder>]` (or model=<pretrained preset>;
`hydra.run.dir=<folder>` names the run directory too)
ablates a pretrained model as it is, without training: cli/pretrained_run.py prepares its run directory (default
under outputs/pretrained/), then the scans run there as on any run.
"""

import shutil
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf

from headcount import processes, run_lock
from headcount.cli.ablate_checks import ablated_config, check_ablate_job, task_selected, typed_ablation_keys
from headcount.cli.errors import (
    BAD_INPUT,
    discarded_if_rejected,
    exit_on_config_error,
    print_error,
    run_hydra_command,
    typed_value,
)
from headcount.cli.pretrained_run import (
    default_run_dir,
    discard_refused_run,
    prepare_pretrained_run,
    pretrained_requested,
)
from headcount.components import take_list_flag
from headcount.config import CONF_DIR, register_configs, typed
from headcount.config.schema import check_bool_overrides
from headcount.config.train import TrainerConfig, check_devices_here
from headcount.errors import ConfigError
from headcount.io import writable
from headcount.run_dir import RunPaths, finished_checkpoint, load_run_config, read_pretrained
from headcount.train import peers
from headcount.train.quiet import take_verbosity_flags

# Torch, Lightning and the stages load inside the functions that start work, not here: composing, checking (the
# config's component names against registry.py's index: cli/sweep.py's NamesFirst) and --list answer at once
# (docs/BENCHMARKS.md, tests/test_cli_imports.py).


def ablate(cfg: DictConfig, typed_keys: Sequence[str] = (), task_given: bool = False) -> list[Path]:
    """Run the scans of a composed ablate config (run_dir, ablation, task) on its run; typed_keys are the dotted
    `ablation.*` keys to take from cfg over the run's own settings; task_given: the command line selected a task
    (else the run's own task section, if it has one, applies). Returns the files written."""
    from headcount.ablation.session import run_ablations

    run_cfg = ablated_config(cfg, load_run_config(cfg.run_dir), typed_keys, task_given)
    return run_ablations(run_cfg, Path(cfg.run_dir))


def print_written(paths: list[Path]) -> None:
    console = processes.console()
    if not paths:
        console.print("[green]nothing to write:[/green] every result asked for is up to date")
        return
    console.print("[green]wrote[/green]")
    for path in dict.fromkeys(paths):
        console.print(f"  {path}", highlight=False, soft_wrap=True, markup=False)  # sweep paths hold [ ]


MULTIRUN_FLAGS = {"-m", "--multirun"}

register_configs()
OmegaConf.register_new_resolver("headcount.pretrained_run_dir", default_run_dir, replace=True)


def quote_run_dir(args: list[str]) -> list[str]:
    """Sweep run directories are named after their overrides (`model.attn.n_heads=4,seed=0`), which Hydra's override
    grammar would parse as a sweep; quote an unquoted run_dir value so any path can be passed as typed."""
    quoted = []
    for arg in args:
        key, sep, value = arg.partition("=")
        if key == "run_dir" and sep and value[:1] not in ("'", '"'):
            arg = "run_dir='" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"
        quoted.append(arg)
    return quoted


def hydra_run_dir_as_run_dir(args: list[str]) -> list[str]:
    """`hydra.run.dir=<dir>`, which names a run directory for headcount-train, names it here too: it becomes
    `run_dir=<dir>` (Hydra's own files go to <dir>/ablation/logs/ as always). ConfigError if run_dir names another."""

    def values(key: str) -> list[str]:
        return [arg.partition("=")[2] for arg in args if arg.partition("=")[0].lstrip("+") == key]

    def path(value: str) -> str:  # as Hydra will read it (quoted or not)
        return str(typed_value(quote_run_dir([f"run_dir={value}"])[0]))

    hydra_dirs, run_dirs = values("hydra.run.dir"), values("run_dir")
    if not hydra_dirs:
        return args
    if run_dirs and path(hydra_dirs[-1]) != path(run_dirs[-1]):
        raise ConfigError(
            "hydra.run.dir",
            path(hydra_dirs[-1]),
            f"names headcount-ablate's run directory, as run_dir does; give one of them (run_dir={path(run_dirs[-1])})",
        )
    kept = [arg for arg in args if arg.partition("=")[0].lstrip("+") not in ("hydra.run.dir", "run_dir")]
    return [*kept, f"run_dir={hydra_dirs[-1]}"]


def run_dir_argument(args: list[str]) -> Path:
    """The finished run that `run_dir=` names (quoted by quote_run_dir); ConfigError if none, or not a finished run."""
    values = [typed_value(arg) for arg in args if arg.partition("=")[0].lstrip("+") == "run_dir"]
    if not values:
        raise ConfigError("run_dir", None, "missing: headcount-ablate run_dir=<a finished training run> [ablation=...]")
    return finished_run(Path(str(values[-1])))


def finished_run(run_dir: Path) -> Path:
    """run_dir, if it holds a finished run (trained, or a pretrained model's); else ConfigError."""
    if not run_dir.is_dir():
        raise ConfigError("run_dir", str(run_dir), "no such folder")
    load_run_config(run_dir)
    if read_pretrained(run_dir) is None or read_pretrained(run_dir)["weights"] != "as_pretrained":
        finished_checkpoint(run_dir)
    return run_dir


@hydra.main(version_base="1.3", config_path=CONF_DIR, config_name="ablate")
@exit_on_config_error
def ablate_job(cfg: DictConfig) -> None:
    from headcount.train.launch import ddp_confined_to_this_job  # torch: once the names are checked (NamesFirst)

    if processes.launched_as_secondary():  # one of a distributed scan's processes, but the first (main, SLURM's tasks)
        processes.set_first_process(False)
    run_dir = Path(cfg.run_dir)
    new_pretrained_run = cfg.model.pretrained is not None and not RunPaths(run_dir).config.exists()
    peers.observe_children()
    try:
        with discarded_if_rejected(Path(HydraConfig.get().runtime.output_dir), run_dir), ddp_confined_to_this_job():
            check_bool_overrides(cfg, HydraConfig.get().overrides.task)
            check_devices_here(typed(cfg.trainer, TrainerConfig))
            if cfg.model.pretrained is not None:  # checked before its weights are converted or its folder written
                prepare_pretrained_run(cfg, run_dir, lambda: check_ablate_job(cfg, HydraConfig.get().overrides.task))
            elif processes.first_process():  # a distributed scan's other processes work under the first one's lock
                run_lock.acquire_if_writable(finished_run(run_dir), "headcount-ablate", "run_dir")
            overrides = HydraConfig.get().overrides.task
            print_written(ablate(cfg, typed_ablation_keys(overrides), task_selected(overrides)))
    except BAD_INPUT:
        if new_pretrained_run:  # what this command made for a pretrained run that was refused goes too
            discard_refused_run(run_dir)
            discard_empty_run_dir(run_dir)
        raise


def discard_empty_run_dir(run_dir: Path) -> None:
    """run_dir and the folders above it that it leaves empty (up to the working directory), if nothing but its lock
    is in it."""
    run_lock.release(run_dir)
    cwd = Path.cwd().resolve()
    folder = run_dir.resolve()
    while folder != cwd and folder.is_relative_to(cwd) and folder.is_dir() and not any(folder.iterdir()):
        folder.rmdir()
        folder = folder.parent


def take_run(args: list[str]) -> Path | None:
    """Take the run's lock before Hydra writes anything there. Returns the run directory if it is on read-only storage:
    the command then only reads it (results up to date are read back; one that is not is refused in one line).
    A multirun (-m: a launcher such as hydra/launcher=slurm runs the job elsewhere) only checks the lock is free: the
    job takes it where it runs."""
    if MULTIRUN_FLAGS & set(args):
        run_dir = run_dir_argument(args)
        run_lock.check_free(run_dir, "run_dir", str(run_dir))
        return None
    if pretrained_requested(args):
        named = [Path(str(typed_value(arg))) for arg in args if arg.partition("=")[0].lstrip("+") == "run_dir"]
        if not named or not RunPaths(named[-1]).config.exists() or writable(named[-1]):
            return None  # a new run, or a default folder known once the config is composed: the job takes the lock
        run_lock.check_free(named[-1], "run_dir", str(named[-1]))
        return named[-1]
    run_dir = run_dir_argument(args)
    return None if run_lock.acquire_if_writable(run_dir, "headcount-ablate", "run_dir") else run_dir


def main() -> None:
    """`headcount-ablate [-v|-vv] run_dir=<run> [ablation=<scan>] [ablation.*=...]`."""
    args = take_verbosity_flags(take_list_flag(sys.argv[1:]))
    peers.watch(print_error, run_lock.release_all)
    if processes.launched_as_secondary():
        # One of a distributed scan's extra processes, rerunning the first one's command line (with Lightning's
        # hydra.run.dir for its logs): it computes its share in the first one's run, takes no lock, writes nothing.
        processes.set_first_process(False)
        sys.argv[1:] = args
        run_hydra_command(ablate_job)
        return
    sys.argv[1:] = quote_run_dir(exit_on_config_error(hydra_run_dir_as_run_dir)(args))
    if exit_on_config_error(take_run)(sys.argv[1:]) is None:
        run_hydra_command(ablate_job)
        return
    # Hydra's own files (the composed config, the log) go to <run>/ablation/logs/, which read-only storage refuses
    logs = tempfile.mkdtemp(prefix="headcount-ablate-")
    sys.argv.append(f"hydra.run.dir={logs}")
    try:
        run_hydra_command(ablate_job)
    finally:
        shutil.rmtree(logs, ignore_errors=True)


if __name__ == "__main__":
    main()
