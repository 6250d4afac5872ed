"""The same run directory started again: what a run's records promise about its settings.

A single run's folder (hydra.run.dir) that already holds a run is checked before Hydra writes into it (Hydra would
otherwise rewrite .hydra/config.yaml and overrides.yaml with the new command's values, so that the run's records
describe a model that was never trained):

- a finished run (DONE) started again keeps its files: Hydra writes nothing there, and the command says it is
  finished; started with settings that change what it trained (model, data, trainer, seed) it is refused in one line
  naming them, since "already finished" would mean another run;
- an interrupted run (a checkpoint, no DONE) resumes only under the settings it was started with: other settings are
  refused in one line naming the keys, unless `allow_changes=true`, which resumes under the new settings and records
  what changed, and at which step, in <run>/config_changes.json.

Scans (ablation.*), the logger and the progress bars may change freely: they do not change what was trained (scans
carry their own fingerprints).
"""

import json
import time
from pathlib import Path

from omegaconf import DictConfig, OmegaConf, open_dict, read_write

from headcount import run_lock
from headcount.errors import ConfigError
from headcount.io import atomic_write_json
from headcount.processes import launched_as_secondary
from headcount.run_dir import RunPaths, is_done, read_checkpoint

TRAINED = ("model", "data", "trainer", "seed")  # what a run's weights depend on
# how and where, not what
NOT_TRAINED = ("trainer.progress_bar", "trainer.rendezvous_timeout_s", "data.cache_dir", "data.num_workers")


def flat(value, prefix: str = "") -> dict:
    if isinstance(value, dict):
        return {k: v for key, item in value.items() for k, v in flat(item, f"{prefix}{key}.").items()}
    return {prefix.removesuffix("."): value}


def changed_settings(saved: DictConfig, now: DictConfig) -> dict[str, list]:
    """key -> [saved value, new value] for every setting of TRAINED that differs (NOT_TRAINED aside)."""
    old, new = ({k: OmegaConf.to_container(c, resolve=False).get(k) for k in TRAINED} for c in (saved, now))
    old, new = flat(old), flat(new)
    keys = sorted(k for k in {*old, *new} if not k.startswith(NOT_TRAINED) and old.get(k) != new.get(k))
    return {key: [old.get(key), new.get(key)] for key in keys}


def described(changes: dict[str, list], n: int = 3) -> str:
    shown = ", ".join(f"{key}={old!r} (now {new!r})" for key, (old, new) in list(changes.items())[:n])
    return shown + (f" and {len(changes) - n} more" if len(changes) > n else "")


def check_rerun(config: DictConfig) -> None:
    """For a single run about to start in hydra.run.dir (config: the composed config, hydra node included); raises
    ConfigError, or keeps Hydra from rewriting a finished run's files, or records allowed changes."""
    run_dir = Path(config.hydra.run.dir)
    paths = RunPaths(run_dir)
    if not paths.config.exists() or launched_as_secondary():
        return  # DDP's other processes join the run their first process checked (and holds the lock of)
    run_lock.check_free(run_dir, "hydra.run.dir", str(run_dir))  # a run in use is refused as such, whatever it holds
    task = OmegaConf.masked_copy(config, [key for key in config if key != "hydra"])
    changes = changed_settings(OmegaConf.load(paths.config), task)
    key = "hydra.run.dir"
    if is_done(run_dir):
        if changes:
            raise ConfigError(
                key,
                str(run_dir),
                f"holds a finished run made with {described(changes)}: give the new "
                "settings their own hydra.run.dir (or delete its DONE to train it again as it was)",
            )
        with read_write(config.hydra), open_dict(config.hydra):
            config.hydra.output_subdir = None  # its .hydra/ stays the run's own record
        return
    if not changes or not paths.last_ckpt.exists():
        return  # the same settings resume; a folder with no checkpoint has nothing to resume
    if not config.get("allow_changes"):
        raise ConfigError(
            key,
            str(run_dir),
            f"holds an interrupted run made with {described(changes)}: run the same "
            "command to resume it, or set allow_changes=true to resume under the new settings (recorded in "
            "config_changes.json)",
        )
    record_changes(run_dir, changes)


def record_changes(run_dir: Path, changes: dict[str, list]) -> None:
    """Append what changed, when and at which step, to <run>/config_changes.json."""
    path = run_dir / "config_changes.json"
    history = json.loads(path.read_text()) if path.exists() else []
    step = int(read_checkpoint(RunPaths(run_dir).last_ckpt, "delete it to train from scratch")["global_step"])
    history.append({"at": time.strftime("%Y-%m-%dT%H:%M:%S"), "at_step": step, "changed": changes})
    atomic_write_json(path, history)
