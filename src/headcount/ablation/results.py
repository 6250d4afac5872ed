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
from rich.console import Console
from rich.markup import escape

from headcount.ablation import summary as summary_file
from headcount.config import plain
from headcount.io import atomic_write_text
from headcount.model.transformer import Transformer
from headcount.run_dir import RunPaths

# Constant columns every result table ends with (where a scan has them), so that a CSV says how it was computed.
RECORD_COLUMNS = ("mode", "split", "n_eval", "n_targets", "reference_split", "n_reference")


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


def mode_tag(mode: str | None) -> str:
    """What a result file's name carries for its mode: nothing for zero (and for mode-independent results)."""
    return "" if mode in (None, "zero") else f".{mode}"


def result_path(ablation_dir: Path, stem: str, mode: str | None, ext: str) -> Path:
    """<ablation_dir>/<stem><mode tag><ext>, e.g. single_head.mean.csv."""
    return Path(ablation_dir) / f"{stem}{mode_tag(mode)}{ext}"


def configured_mode(config: DictConfig) -> str:
    """The ablation mode a run's own config asks for: the results its report and its finding read."""
    return str(OmegaConf.select(config, "ablation.mode", default="zero"))


def run_mode(run_dir: str | Path) -> str:
    """configured_mode of a run directory; zero for a folder without a config."""
    config = RunPaths(Path(run_dir)).config
    return configured_mode(OmegaConf.load(config)) if config.exists() else "zero"


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
        self.console = Console(stderr=True)

    def open(self, header: dict) -> None:
        """Record the session's fingerprint, inputs and baseline; earlier results of this mode under another
        fingerprint move to summary.json's `superseded`, with a notice."""
        reason = summary_file.open_mode(self.summary_path, self.mode, {"fingerprint": self.key, **header})
        self.note_written(self.summary_path)
        if reason is not None:
            self.console.print(
                f"[yellow]note:[/yellow] earlier {self.mode}-mode results no longer apply ({escape(reason)}); "
                "summary.json keeps their record under `superseded`, and their files are replaced as scans rerun",
                highlight=False,
                soft_wrap=True,
            )

    def up_to_date(self, name: str, key: str, csv_path: Path, announce: bool = True, shared: bool = False):
        """The scan's table if summary.json says it was computed under this fingerprint and its CSV is there."""
        entry = summary_file.scan_entry(self.summary_path, None if shared else self.mode, name)
        if entry.get("fingerprint") != key or not csv_path.exists():
            return None
        if announce:
            self.console.print(f"[green]up to date:[/green] {csv_path}", highlight=False)
        return read_csv(csv_path)

    def record(
        self, name: str, kind: str, key: str, files: list[Path | None], seconds: float, rows: int, shared: bool = False
    ) -> None:
        files = [f for f in files if f is not None]
        self.written.extend(files)
        entry = {"kind": kind, "fingerprint": key, "files": [f.name for f in files], "rows": rows, "seconds": seconds}
        self.update_summary({"scans": {name: entry}}, shared)

    def update_summary(self, updates: dict, shared: bool = False) -> None:
        summary_file.update_section(self.summary_path, None if shared else self.mode, updates)
        self.note_written(self.summary_path)

    def note_written(self, path: Path) -> None:
        if path not in self.written:
            self.written.append(path)
