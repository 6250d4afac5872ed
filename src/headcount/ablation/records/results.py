"""Result files in <run>/ablation/: tables that record how they were computed, and fingerprints, hashed from content,
of what every result depends on. Every write is atomic; a scan's CSV appears only once it is complete. Where each
result lives (its folder, file names and section of summary.json) is its address (ablation/records/address.py).

Fingerprints hash the model's weights and config (not the checkpoint file, whose bytes embed absolute paths), the
data's token content, the settings and the masks: a run directory copied or moved elsewhere reads its results back.
"""

import hashlib
import json
from pathlib import Path

import pandas as pd
import torch
from rich.markup import escape

from headcount.ablation.records import summary as summary_file
from headcount.ablation.records.address import ResultAddress
from headcount.config import plain
from headcount.errors import ConfigError
from headcount.io import atomic_write_text, writable
from headcount.model.transformer import Transformer
from headcount.processes import console, first_process

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


def file_digest(path: Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()[:16]


def recorded_digest(entry: dict, file_name: str) -> str | None:
    """The sha256 a summary.json entry recorded for one of its files: `digests` holds every file's; entries from
    before it hold only the table's (`sha256`), entries from before digests none."""
    if file_name in entry.get("digests", {}):
        return entry["digests"][file_name]
    files = entry.get("files", [])
    return entry.get("sha256") if files and files[0] == file_name else None


def matches_record(path: Path, entry: dict) -> bool:
    """Whether a result file is the one its summary.json entry recorded (a file it recorded no digest of: trusted)."""
    digest = recorded_digest(entry, Path(path).name)
    return digest is None or file_digest(path) == digest


def result_intact(folder: Path, entry: dict) -> bool:
    """Whether every file a summary.json entry recorded is there and is the file it recorded: a result is read back
    whole or computed again, never in part (its second table changed, its figure deleted)."""
    return all((folder / name).exists() and matches_record(folder / name, entry) for name in entry.get("files", []))


def read_checked(csv_path: Path) -> pd.DataFrame:
    """A result table (any table of a result), after checking it is the file summary.json (in its folder) recorded;
    ConfigError naming it otherwise (a table replaced after its record, or cut short), so that no reader uses one
    that lies."""
    csv_path = Path(csv_path)
    entry = summary_file.entry_of_file(summary_file.summary_beside(csv_path), csv_path.name)
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
    """One session's results at its address: its section of summary.json, what is up to date, and every file the
    session wrote. `shared=True` addresses the mode-independent section instead."""

    def __init__(self, address: ResultAddress, key: str):
        self.address, self.key = address, key
        self.out, self.mode = address.folder, address.section
        self.summary_path = address.summary_path
        self.written: list[Path] = []
        self.console = console()  # silent in a distributed scan's other processes

    def replacements_file(self) -> Path:
        return self.address.replacements_file()

    def open(self, header: dict) -> None:
        """Record the session's fingerprint, inputs and baseline; earlier results of this mode under another
        fingerprint move to summary.json's `superseded`, with a notice."""
        header = {"fingerprint": self.key, "address": self.address.record(), **header}
        reason, changed = summary_file.open_mode(self.summary_path, self.mode, header)
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
        if matches and not result_intact(self.out, entry):
            changed = [f for f in entry["files"] if not result_intact(self.out, {**entry, "files": [f]})]
            self.console.print(
                f"[yellow]note:[/yellow] {escape(str(self.out / changed[0]))} is not the file summary.json recorded "
                f"for {escape(name)} (changed, cut short or removed since): computing it again",
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

    def adopt(self, plain: str, entry: str, key: str, rename: dict[str, str], shared: bool = False) -> None:
        """A scan variant's result recorded under the scan's plain name, from before variants named their own files
        (top_heads ranked by retrieval_scores in top_heads.csv): when its fingerprint is the variant's (which holds
        the setting) and its table is the one recorded, its files take the variant's names (`rename`: each plain
        file name to the variant's) and its record moves to the variant's entry, with a notice; else nothing."""
        mode = None if shared else self.mode
        old = summary_file.scan_entry(self.summary_path, mode, plain)
        files = [self.out / name for name in old.get("files", [])]
        if old.get("fingerprint") != key or not files or not files[0].exists() or not matches_record(files[0], old):
            return
        if not writable(self.out) or not all(f.name in rename for f in files):
            return
        for path in files:
            if path.exists():
                path.replace(self.out / rename[path.name])
        moved = {**old, "files": [rename[f.name] for f in files], "scan": plain, "variant": entry.split(".")[1:]}
        if "digests" in old:
            moved["digests"] = {rename.get(name, name): digest for name, digest in old["digests"].items()}
        summary_file.rename_scan(self.summary_path, mode, plain, entry, moved)
        self.console.print(
            f"[yellow]note:[/yellow] {escape(str(files[0]))} holds {entry}'s result, named before such results had "
            f"names of their own: now {escape(rename[files[0].name])}",
            highlight=False,
            soft_wrap=True,
        )

    def record(
        self,
        name: str,
        kind: str,
        key: str,
        files: list[Path | None],
        seconds: float,
        rows: int,
        shared: bool = False,
        **how: float | str | list[str] | dict,
    ) -> None:
        """Record a scan's result in summary.json under `name` (its entry's name); `how`: how it was computed beyond
        its seconds (a distributed scan's processes and reduction time), and a scan's own variant (`scan`,
        `variant`)."""
        files = [f for f in files if f is not None]
        self.written.extend(files)
        if not first_process():  # it wrote none of them
            return
        entry = {"kind": kind, "fingerprint": key, "files": [f.name for f in files], "rows": rows, "seconds": seconds}
        entry |= how
        entry["sha256"] = file_digest(files[0])  # the table as written: a reader checks it is still this one
        entry["digests"] = {f.name: file_digest(f) for f in files}  # every file of the result, the table's included
        summary_file.record_scan(self.summary_path, None if shared else self.mode, name, entry)
        self.note_written(self.summary_path)

    def note_replaced(self, name: str, key: str, path: Path, settings: dict, shared: bool = False) -> None:
        """One line when a scan's result is being replaced by one computed under other settings (its own, or
        the session's): which file, and what changed where the scan records its settings (path_patching's senders
        and receivers); summary.json keeps the earlier record under `superseded` (summary.record_scan)."""
        old = summary_file.scan_entry(self.summary_path, None if shared else self.mode, name)
        if old.get("fingerprint") in (None, key) or not path.exists():
            return
        before = old.get("settings", {})
        changed = [f"{k}: {before.get(k)} -> {v}" for k, v in settings.items() if before.get(k) != v and before]
        what = f" ({'; '.join(changed)})" if changed else ""
        self.console.print(
            f"[yellow]note:[/yellow] {escape(str(path))} is replaced: {escape(name)} is computed again under other "
            f"settings{escape(what)}; summary.json keeps the earlier record under `superseded`",
            highlight=False,
            soft_wrap=True,
        )

    def section_value(self, name: str, shared: bool = False):
        """What this session's section of summary.json (shared: the mode-independent one) holds under `name`."""
        summary = summary_file.read_summary(self.summary_path)
        section = summary.get(summary_file.SHARED, {}) if shared else summary["modes"].get(self.mode, {})
        return section[name]

    def update_summary(self, updates: dict, shared: bool = False) -> None:
        if summary_file.update_section(self.summary_path, None if shared else self.mode, updates):
            self.note_written(self.summary_path)

    def note_written(self, path: Path) -> None:
        if path not in self.written:
            self.written.append(path)
