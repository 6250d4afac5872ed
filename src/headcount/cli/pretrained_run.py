"""The run directory `headcount-ablate model.pretrained=<checkpoint> data=<source>` works in, without a training run.

`prepare_pretrained_run` writes what a finished run holds, so the scans, reports and findings read it like any run:
.hydra/config.yaml (the model the checkpoint implies, the data, the seed), data_fingerprint.json and pretrained.json
(the checkpoint's provenance; weights "as_pretrained": no checkpoint file, the model is read from the source again).
The same command again finds the same folder and its up-to-date results. A folder that holds a training run, or the
run of another checkpoint or other data, is refused in one line. The default folder is named after the data, or after
the task when the command gives one (outputs/pretrained/<checkpoint>/ioi-<hash>), since that is what it measures.
"""

import hashlib
import json
from collections.abc import Callable
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from headcount import run_lock
from headcount.config import TrainConfig, typed, validate_train_config
from headcount.config.data import DataConfig
from headcount.config.task import TaskConfig
from headcount.errors import ConfigError
from headcount.io import atomic_write_text
from headcount.processes import console, first_process
from headcount.run_dir import RunPaths, read_pretrained, record_data_fingerprint, record_pretrained

DEFAULT_ROOT = Path("outputs") / "pretrained"
RECORDED = ("model", "data", "seed")  # what a pretrained run directory is the run of


def default_run_dir(source: str | None, data: DictConfig, task: DictConfig | None = None) -> str:
    """outputs/pretrained/<checkpoint name>/<data source>-<8 hex digits of the source and the data section>; with a
    task, what the run measures: <task name>-<8 hex digits of the source, the data and the task sections>. The
    data-named folder of a run that holds this task's results already (made before runs on a task were named after
    it) is found and used: its results are read back there (prepare_pretrained_run says so)."""
    if source is None:
        raise ConfigError("run_dir", None, "missing: headcount-ablate run_dir=<a finished run> or model.pretrained=...")
    root = DEFAULT_ROOT / (Path(source.split(":", 1)[-1]).name.removesuffix(".gguf") or "model")
    data_section = {k: v for k, v in OmegaConf.to_container(data, resolve=False).items() if k != "cache_dir"}
    by_data = root / f"{data.source}-{digest(source, data_section)}"
    if task is None or task.get("source") is None:
        return str(by_data)
    from headcount.tasks import task_name  # the task sources load only for a run on a task

    name = task_name(typed(task, TaskConfig))
    from headcount.ablation.records.address import ResultAddress

    if ResultAddress(RunPaths(by_data).ablation, task=name).folder.is_dir():
        return str(by_data)  # this task's results from before runs on a task were named after it
    return str(root / f"{name}-{digest(source, data_section, OmegaConf.to_container(task, resolve=False))}")


def digest(*parts) -> str:
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:8]


def named_after_data(cfg: DictConfig) -> bool:
    """Whether a pretrained run on a task works in the folder named after its data (one that held the task's results
    before runs on a task were named after it, found by default_run_dir)."""
    if cfg.task.source is None:
        return False
    return Path(cfg.run_dir) == Path(default_run_dir(cfg.model.pretrained, cfg.data))


def prepare_pretrained_run(cfg: DictConfig, run_dir: Path, check: Callable[[], None] = lambda: None) -> None:
    """Take run_dir's lock, check the config (and call `check`: the scans' checks), and write (or find, up to date)
    the run of model.pretrained on the data. ConfigError, before anything is written or converted, for bad input or a
    folder that holds another run."""
    # transformers and torch load here, not when the command starts: a config is checked before they do
    from headcount.pretrained.run_config import cached_pretrained, text_tokenizer

    if first_process():  # a distributed scan's other processes find the run their first one prepared, and its lock
        run_lock.acquire_if_writable(run_dir, "headcount-ablate", "run_dir")  # read-only storage: reading a run
    check()
    resolved = resolved_pretrained_run(cfg)
    paths = RunPaths(run_dir)
    wanted = plain_run(resolved)
    if paths.config.exists():
        check_same_run(run_dir, wanted)
        if named_after_data(cfg):
            console().print(
                f"[yellow]note:[/yellow] {run_dir} holds this task's results from before runs on a task were named "
                "after the task (not the data): they are read back and kept there",
                highlight=False,
                soft_wrap=True,
            )
        return
    from headcount.data import HeadcountDataModule  # datasets loads only when data is built

    data = HeadcountDataModule(typed(resolved.data, DataConfig), text_tokenizer(resolved))
    data.setup()  # bad data fails here, before the run directory holds anything
    pretrained = cached_pretrained(resolved.model.pretrained)
    record_data_fingerprint(run_dir, data.splits)
    record_pretrained(run_dir, pretrained.provenance, wanted["model"], as_pretrained=True)
    paths.config.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(paths.config, OmegaConf.to_yaml(OmegaConf.create(wanted)))  # last: the run is complete


def resolved_pretrained_run(cfg: DictConfig) -> DictConfig:
    """A train config of cfg's model (the one model.pretrained implies: its config is read, not its weights), data and
    seed, checked; ConfigError for bad input."""
    from headcount.pretrained.run_config import resolve_pretrained  # transformers loads here, after the name checks

    train_like = OmegaConf.merge(
        OmegaConf.structured(TrainConfig), {"model": cfg.model, "data": cfg.data, "seed": cfg.seed}
    )
    resolved = resolve_pretrained(train_like)
    validate_train_config(resolved)
    return resolved


def pretrained_run_config(cfg: DictConfig) -> DictConfig:
    """The .hydra/config.yaml that prepare_pretrained_run writes for cfg, without writing or converting anything."""
    return OmegaConf.create(plain_run(resolved_pretrained_run(cfg)))


def discard_refused_run(run_dir: Path) -> None:
    """After a command on a new pretrained run was refused (a check that needs the weights: a baseline that overflows
    ablation.dtype, the data): the files prepare_pretrained_run wrote go again, if this process holds the run's lock
    and no scan wrote a result there; files it did not write are kept."""
    paths = RunPaths(run_dir)
    logs = paths.ablation / "logs"
    results = [p for p in paths.ablation.rglob("*") if p.is_file() and not p.is_relative_to(logs)]
    if not run_lock.holds(run_dir) or results:
        return
    for path in (paths.config, paths.data_fingerprint, paths.pretrained):
        path.unlink(missing_ok=True)
    for folder in (paths.config.parent, logs, paths.ablation):
        if folder.is_dir() and not any(folder.iterdir()):
            folder.rmdir()


def plain_run(cfg: DictConfig) -> dict:
    return {
        key: OmegaConf.to_container(cfg[key], resolve=True, enum_to_str=True) if key != "seed" else cfg.seed
        for key in RECORDED
    }


def check_same_run(run_dir: Path, wanted: dict) -> None:
    if read_pretrained(run_dir) is None:
        raise ConfigError(
            "run_dir", str(run_dir), "holds a training run: ablate it without model.pretrained (its own model and data)"
        )
    existing = OmegaConf.to_container(OmegaConf.load(RunPaths(run_dir).config), resolve=True, enum_to_str=True)
    for key in RECORDED:
        if existing.get(key) != wanted[key]:
            what = (existing.get("model") or {}).get("pretrained")
            raise ConfigError(
                "run_dir",
                str(run_dir),
                f"holds the run of model.pretrained={what} with another {key} section; choose another run_dir",
            )


def pretrained_requested(args: list[str]) -> bool:
    """A command line that selects a model (model=<preset> or model.*=...): the pretrained path, whose run directory
    is known only once the config is composed."""
    return any(arg.partition("=")[0].lstrip("+~").split(".")[0].split("/")[0] == "model" for arg in args)
