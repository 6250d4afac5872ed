"""Result files in <run>/ablation/: a scan's CSV appears only once it is complete, a partial file lets an interrupted
scan resume, and summary.json collects the headline numbers as scans finish. Every write is atomic.

The partial file `<scan>.partial.csv` starts with a `# fingerprint=...` line (what the numbers depend on: checkpoint,
data, settings, masks, batching); a partial file with another fingerprint is ignored and overwritten. Its rows hold
each mask's running sums in float64 (written with repr, read back exactly), so a resumed scan ends with the same
numbers as an uninterrupted one.
"""

import csv
import hashlib
import io
import json
from pathlib import Path

import pandas as pd

from headcount.ablation.evaluator import MaskTotals
from headcount.ablation.masks import HeadMask
from headcount.io import atomic_write_json, atomic_write_text

PARTIAL_COLUMNS = ["mask", "batches_done", "nll_sum", "n_correct", "n_targets"]


def fingerprint(*parts) -> str:
    """A short stable hash of JSON-able parts."""
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:16]


def file_digest(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(2**20), b""):
            digest.update(block)
    return digest.hexdigest()[:16]


def save_partial(path: Path, key: str, masks: list[HeadMask], totals: MaskTotals) -> None:
    out = io.StringIO()
    out.write(f"# fingerprint={key}\n")
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(PARTIAL_COLUMNS)
    for i, mask in enumerate(masks):
        writer.writerow(
            [
                mask.name,
                int(totals.batches_done[i]),
                repr(float(totals.nll_sum[i])),
                repr(float(totals.n_correct[i])),
                int(totals.n_targets[i]),
            ]
        )
    atomic_write_text(path, out.getvalue())


def load_partial(path: Path, key: str, masks: list[HeadMask]) -> MaskTotals | None:
    """The sums saved for these masks under the same fingerprint, or None."""
    if not path.exists():
        return None
    with open(path) as f:
        if f.readline().strip() != f"# fingerprint={key}":
            return None
        saved = pd.read_csv(f, float_precision="round_trip", keep_default_na=False, dtype={"mask": str}).set_index(
            "mask"
        )
    totals = MaskTotals.empty(len(masks))
    for i, mask in enumerate(masks):
        if mask.name in saved.index:
            row = saved.loc[mask.name]
            totals.batches_done[i] = int(row["batches_done"])
            totals.nll_sum[i] = float(row["nll_sum"])
            totals.n_correct[i] = float(row["n_correct"])
            totals.n_targets[i] = int(row["n_targets"])
    return totals


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
