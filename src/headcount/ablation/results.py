"""Result files in <run>/ablation/: a scan's CSV appears only once it is complete, and summary.json collects the
headline numbers as scans finish, with each scan's fingerprint (what its numbers depend on), so that a scan whose
CSV is up to date is read back rather than rerun. summary.json starts afresh when the session's settings change.
Every write is atomic.
"""

import hashlib
import json
from pathlib import Path

import pandas as pd
from rich.console import Console

from headcount.io import atomic_write_json, atomic_write_text


def fingerprint(*parts) -> str:
    """A short stable hash of JSON-able parts."""
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:16]


def file_digest(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(2**20), b""):
            digest.update(block)
    return digest.hexdigest()[:16]


def write_csv(path: Path, table: pd.DataFrame) -> None:
    atomic_write_text(path, table.to_csv(index=False))


def read_summary(path: Path, key: str) -> dict:
    """summary.json if it was written under the same settings fingerprint; otherwise a fresh one."""
    if path.exists():
        summary = json.loads(path.read_text())
        if summary.get("fingerprint") == key:
            return summary
    return {"fingerprint": key}


def update_summary(path: Path, key: str, updates: dict) -> dict:
    """Merge `updates` into summary.json (one level deep for dict values) and write it atomically."""
    summary = read_summary(path, key)
    for name, value in updates.items():
        if isinstance(value, dict) and isinstance(summary.get(name), dict):
            summary[name] = {**summary[name], **value}
        else:
            summary[name] = value
    atomic_write_json(path, summary)
    return summary


class ResultFiles:
    """One session's <run>/ablation/ folder: summary.json under the settings fingerprint `key`, what is up to date,
    and every file the session wrote."""

    def __init__(self, out: Path, key: str):
        self.out, self.key = out, key
        self.summary_path = out / "summary.json"
        self.written: list[Path] = []
        self.console = Console(stderr=True)

    def up_to_date(self, name: str, key: str, csv_path: Path, announce: bool = True) -> pd.DataFrame | None:
        """The scan's table if summary.json says it was computed under this fingerprint and its CSV is there."""
        entry = read_summary(self.summary_path, self.key).get("scans", {}).get(name, {})
        if entry.get("fingerprint") != key or not csv_path.exists():
            return None
        if announce:
            self.console.print(f"[green]up to date:[/green] {csv_path}", highlight=False)
        return pd.read_csv(csv_path, keep_default_na=False, dtype={"mask": str})

    def record(self, name: str, kind: str, key: str, files: list[Path | None], seconds: float, rows: int) -> None:
        files = [f for f in files if f is not None]
        self.written.extend(files)
        entry = {"kind": kind, "fingerprint": key, "files": [f.name for f in files], "rows": rows, "seconds": seconds}
        self.update_summary({"scans": {name: entry}})

    def update_summary(self, updates: dict) -> None:
        update_summary(self.summary_path, self.key, updates)
        if self.summary_path not in self.written:
            self.written.append(self.summary_path)
