"""`headcount-ablate run_dir=<run> ablation=<scan> ablation.mode=<mode>`: ablation scans on a finished run.

The run's .hydra/config.yaml supplies the data and the seed (the checkpoint supplies the model). Its ablation section
is the base; each `ablation.*` key typed on the command line overrides it, and the scans are the ones selected here
(`ablation=single_head` by default, `ablation=[single_head,layer,pruning]` for several). Hydra's own files go to
<run>/ablation/logs/, so nothing lands in the working directory.

Before Hydra starts, run_dir must name a finished training run (else one line, exit 2, and nothing created), and the
command takes the run's lock (run_lock.py): one process at a time works on a run, training or ablating.

`headcount-ablate model.pretrained=<checkpoint> data=<source> [run_dir=<folder>]` (or model=<pretrained preset>)
ablates a pretrained model as it is, without training: cli/pretrained_run.py prepares its run directory (default
under outputs/pretrained/), then the scans run there as on any run.
"""

import sys
from collections.abc import Sequence
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf
from rich.console import Console

from headcount import run_lock
from headcount.ablation.session import run_ablations
from headcount.cli.errors import BAD_INPUT, discarded_if_rejected, exit_on_config_error, run_hydra_command, typed_value
from headcount.cli.pretrained_run import default_run_dir, prepare_pretrained_run, pretrained_requested
from headcount.config import CONF_DIR, register_configs
from headcount.config.ablation import AblationConfig
from headcount.errors import ConfigError
from headcount.run_dir import RunPaths, finished_checkpoint, load_run_config, read_pretrained
from headcount.train.quiet import take_verbosity_flags


def ablate(cfg: DictConfig, typed_keys: Sequence[str] = ()) -> list[Path]:
    """Run the scans of a composed ablate config (run_dir, ablation) on its run; typed_keys are the dotted
    `ablation.*` keys to take from cfg over the run's own settings. Returns the files written."""
    run_cfg = load_run_config(cfg.run_dir)
    base = OmegaConf.to_container(run_cfg.get("ablation") or OmegaConf.create({}))
    base.pop("scans", None)
    ablation = OmegaConf.merge(OmegaConf.structured(AblationConfig), base)
    for key in typed_keys:
        OmegaConf.update(ablation, key.removeprefix("ablation."), OmegaConf.select(cfg, key), merge=True)
    ablation.scans = cfg.ablation.scans
    run_cfg.ablation = ablation
    return run_ablations(run_cfg, Path(cfg.run_dir))


def typed_ablation_keys(overrides: Sequence[str]) -> list[str]:
    """The `ablation.*` keys of command-line overrides, scans aside (they come from the selected scan configs)."""
    keys = [override.split("=", 1)[0].lstrip("+~") for override in overrides]
    return [key for key in keys if key.startswith("ablation.") and not key.startswith("ablation.scans")]


def print_written(paths: list[Path]) -> None:
    console = Console(stderr=True)
    console.print("[green]wrote[/green]")
    for path in dict.fromkeys(paths):
        console.print(f"  {path}", highlight=False, soft_wrap=True, markup=False)  # sweep paths hold [ ]


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
    run_dir = Path(cfg.run_dir)
    new_pretrained_run = cfg.model.pretrained is not None and not RunPaths(run_dir).config.exists()
    try:
        with discarded_if_rejected(Path(HydraConfig.get().runtime.output_dir), run_dir):
            if cfg.model.pretrained is not None:
                prepare_pretrained_run(cfg, run_dir)
            else:
                run_lock.acquire(finished_run(run_dir), "headcount-ablate", "run_dir")
            print_written(ablate(cfg, typed_ablation_keys(HydraConfig.get().overrides.task)))
    except BAD_INPUT:
        if new_pretrained_run:  # the folder Hydra made for a pretrained run that was refused goes too
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


def take_run(args: list[str]) -> None:
    if pretrained_requested(args):
        return  # its run directory is known once the config is composed: the job takes the lock
    run_lock.acquire(run_dir_argument(args), "headcount-ablate", "run_dir")


def main() -> None:
    """`headcount-ablate [-v|-vv] run_dir=<run> [ablation=<scan>] [ablation.*=...]`."""
    sys.argv[1:] = quote_run_dir(take_verbosity_flags(sys.argv[1:]))
    exit_on_config_error(take_run)(sys.argv[1:])
    run_hydra_command(ablate_job)


if __name__ == "__main__":
    main()
