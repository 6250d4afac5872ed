"""Result files in <run>/ablation/: names that carry the ablation mode, tables that record how they were computed, and
fingerprints, hashed from content, of what every result depends on. Every write is atomic; a scan's CSV appears only
once it is complete.

Names: zero ablation keeps the plain names (`single_head.csv`, `single_head.png`, `pruned.ckpt`); mean and resample
put the mode before the extension (`single_head.mean.csv`, `pruning.resample.png`, `pruned.mean.ckpt`,
`single_head.mean.partial.csv`), so the modes' results sit side by side. Results no mode changes (head_scores) keep
plain names. summary.json holds one section per mode (ablation/summary.py).

Fingerprints hash the model's weights and config (not the checkpoint file, whose bytes embed absolute paths), the
data's token content, the settings and the masks: a run directory copied or moved elsewhere reads its results back.
"""

import hashlib
import json
from pathlib import Path

import pandas as pd
import torch
from omegaconf import DictConfig, OmegaConf
from rich.markup import escape

from headcount.ablation import summary as summary_file
from headcount.config import plain
from headcount.errors import ConfigError
from headcount.io import atomic_write_text, writable
from headcount.model.transformer import Transformer
from headcount.processes import console, first_process
from headcount.run_dir import RunPaths

# Constant columns every result table ends with (where a scan has them), so that a CSV says how it was computed.
RECORD_COLUMNS = ("mode", "metric", "split", "n_eval", "n_targets", "reference_split", "n_reference")


def fingerprint(*parts) -> str:
    """A short stable hash of JSON-able parts."""
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:16]


def model_fingerprint(model: Transformer) -> str:
    """A hash of the model's config and every tensor of its state_dict (name, dtype, shape and values)."""
    digest = hashlib.sha256(json.dumps(plain(model.cfg), sort_keys=True, default=str).encode())
    digest.update(json.dumps(model.heads_per_layer).encode())
    for name, tensor in sorted(model.state_dict().items()):
        flat = tensor.detach().cpu().contiguous().reshape(-1)
        digest.update(f"{name}:{flat.dtype}:{tuple(tensor.shape)}".encode())
        digest.update(flat.view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()[:16]


def section_name(mode: str, metric: str = "loss") -> str:
    """The results of one mode and metric: their section of summary.json and the tag in their file names. The mode
    alone for loss (zero, mean, resample: as results were named before other metrics), else mode.metric
    (patch.logit_diff, zero.answer_prob)."""
    return mode if metric == "loss" else f"{mode}.{metric}"


def mode_tag(section: str | None) -> str:
    """What a result file's name carries for its section: nothing for zero-mode loss (and mode-independent results)."""
    return "" if section in (None, "zero") else f".{section}"


def result_path(ablation_dir: Path, stem: str, section: str | None, ext: str) -> Path:
    """<ablation_dir>/<stem><section tag><ext>, e.g. single_head.mean.csv, single_head.patch.logit_diff.csv."""
    return Path(ablation_dir) / f"{stem}{mode_tag(section)}{ext}"


def metric_name(spec) -> str:
    """The name of the metric ablation.metric gives (None: loss; a mapping: its name or its function's)."""
    if spec is None:
        return "loss"
    if hasattr(spec, "keys"):
        return str(spec.get("name") or str(spec["_target_"]).rsplit(".", 1)[-1])
    return str(spec)


def tasks_dir(ablation_dir: Path) -> Path:
    """Where the results of tasks go: <run>/ablation/tasks/<task name>/, one folder (and summary.json) per task."""
    return Path(ablation_dir) / "tasks"


def configured_results(run_dir: str | Path, config: DictConfig | None = None) -> tuple[Path, str]:
    """The folder and section of the results a run's own config asks for (its ablation mode and metric, on its task
    or its data): what its report and its finding read. A task's default metric is the one its folder recorded."""
    paths = RunPaths(Path(run_dir))
    if config is None:
        config = OmegaConf.load(paths.config) if paths.config.exists() else OmegaConf.create({})
    mode = str(OmegaConf.select(config, "ablation.mode", default="zero"))
    spec = OmegaConf.select(config, "ablation.metric", default=None)
    task = OmegaConf.select(config, "task.source", default=None)
    if task is None:
        return paths.ablation, section_name(mode, metric_name(spec))
    from headcount.config import typed
    from headcount.config.task import TaskConfig
    from headcount.tasks import task_name  # tasks load their sources only when a run has one

    folder = tasks_dir(paths.ablation) / task_name(typed(config.task, TaskConfig))
    metric = (
        metric_name(spec)
        if spec is not None
        else summary_file.read_summary(folder / "summary.json").get("default_metric", "loss")
    )
    return folder, section_name(mode, metric)


def configured_mode(config: DictConfig) -> str:
    """The section (mode, and metric unless loss) a run's own config asks for on its data."""
    mode = str(OmegaConf.select(config, "ablation.mode", default="zero"))
    return section_name(mode, metric_name(OmegaConf.select(config, "ablation.metric", default=None)))


def run_mode(run_dir: str | Path) -> str:
    """The section of the results a run directory's config asks for; zero for a folder without a config."""
    return configured_results(run_dir)[1]


def file_digest(path: Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()[:16]


def matches_record(csv_path: Path, entry: dict) -> bool:
    """Whether a result table is the file its summary.json entry recorded (entries from before digests: trusted)."""
    return "sha256" not in entry or file_digest(csv_path) == entry["sha256"]


def read_checked(csv_path: Path) -> pd.DataFrame:
    """A result table, after checking it is the file summary.json (in its folder) recorded; ConfigError naming it
    otherwise (a table replaced after its record, or cut short), so that no reader uses one that lies."""
    csv_path = Path(csv_path)
    entry = summary_file.entry_of_file(csv_path.parent / "summary.json", csv_path.name)
    if entry is not None and not matches_record(csv_path, entry):
        raise ConfigError(
            "scan",
            str(csv_path),
            "does not match what summary.json recorded for it (changed or cut short since it was written): run the "
            "scan again (headcount-ablate) to compute it anew",
        )
    return read_csv(csv_path)


def with_record(table: pd.DataFrame, record: dict) -> pd.DataFrame:
    """The table with the record's constant columns appended (those it does not have already)."""
    return table.assign(**{k: ("" if v is None else v) for k, v in record.items() if k not in table.columns})


def write_csv(path: Path, table: pd.DataFrame) -> None:
    atomic_write_text(path, table.to_csv(index=False))


def read_csv(path: Path) -> pd.DataFrame:
    return pd.read_csv(path, keep_default_na=False, dtype={"mask": str})


class ResultFiles:
    """One session's <run>/ablation/ folder: its mode's section of summary.json, what is up to date, and every file
    the session wrote. `shared=True` addresses the mode-independent section instead."""

    def __init__(self, out: Path, mode: str, key: str):
        self.out, self.mode, self.key = out, mode, key
        self.summary_path = out / "summary.json"
        self.written: list[Path] = []
        self.console = console()  # silent in a distributed scan's other processes

    def open(self, header: dict) -> None:
        """Record the session's fingerprint, inputs and baseline; earlier results of this mode under another
        fingerprint move to summary.json's `superseded`, with a notice."""
        reason, changed = summary_file.open_mode(self.summary_path, self.mode, {"fingerprint": self.key, **header})
        if changed:
            self.note_written(self.summary_path)
        if reason is not None:
            self.console.print(
                f"[yellow]note:[/yellow] earlier {self.mode}-mode results no longer apply ({escape(reason)}); "
                "summary.json keeps their record under `superseded`, and their files are replaced as scans rerun",
                highlight=False,
                soft_wrap=True,
            )

    def up_to_date(self, name: str, key: str, csv_path: Path, announce: bool = True, shared: bool = False):
        """The scan's table if summary.json says it was computed under this fingerprint and its CSV is there, the very
        file summary.json recorded (a CSV replaced after its record, or cut short, is computed again)."""
        entry = summary_file.scan_entry(self.summary_path, None if shared else self.mode, name)
        matches = entry.get("fingerprint") == key and csv_path.exists()
        if matches and not matches_record(csv_path, entry):
            self.console.print(
                f"[yellow]note:[/yellow] {escape(str(csv_path))} is not the table summary.json recorded for it "
                "(changed or cut short since): computing it again",
                highlight=False,
                soft_wrap=True,
            )
            matches = False
        if not matches:
            if not writable(self.out):  # refused before the scan computes what it could not write
                raise ConfigError(
                    "run_dir",
                    str(self.out.parent),
                    f"is on read-only storage: scan {name} ({self.mode} mode) is not up to date there, and its results "
                    "cannot be written; ablate a copy of the run on writable storage",
                )
            return None
        if announce:
            self.console.print(f"[green]up to date:[/green] {csv_path}", highlight=False, soft_wrap=True)
        return read_csv(csv_path)

    def record(
        self,
        name: str,
        kind: str,
        key: str,
        files: list[Path | None],
        seconds: float,
        rows: int,
        shared: bool = False,
        **how: float,
    ) -> None:
        """Record a scan's result in summary.json; `how`: how it was computed beyond its seconds (a distributed
        scan's processes and reduction time)."""
        files = [f for f in files if f is not None]
        self.written.extend(files)
        if not first_process():  # it wrote none of them
            return
        entry = {"kind": kind, "fingerprint": key, "files": [f.name for f in files], "rows": rows, "seconds": seconds}
        entry |= how
        entry["sha256"] = file_digest(files[0])  # the table as written: a reader checks it is still this one
        summary_file.record_scan(self.summary_path, None if shared else self.mode, name, entry)
        self.note_written(self.summary_path)

    def update_summary(self, updates: dict, shared: bool = False) -> None:
        if summary_file.update_section(self.summary_path, None if shared else self.mode, updates):
            self.note_written(self.summary_path)

    def note_written(self, path: Path) -> None:
        if path not in self.written:
            self.written.append(path)
