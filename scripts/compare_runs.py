"""Compare the CSV tables of two run directories (the same experiment run by two source trees).

Every CSV under each run's ablation/, findings/ and report/ (a sweep's), recursively, is compared byte for byte. Where
two files differ, the columns they share are compared cell by cell: numeric columns by the largest absolute difference
(NaN equal to NaN), other columns by the number of cells that differ (a cell empty on both sides is equal). Columns only
one side has are listed, as are files only one side has. Rows are matched by position; a table whose row count changed
is reported as such. For a sweep, pass the sweep folder and each job's folder as pairs.

    python scripts/compare_runs.py BEFORE_RUN AFTER_RUN [BEFORE_RUN2 AFTER_RUN2 ...]

Prints, per pair, how many tables both have and how many are identical, then one line per differing file.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

TABLE_FOLDERS = ("ablation", "findings", "report")


@dataclass
class FileDiff:
    """How one CSV differs between the two runs."""

    name: str
    max_abs: float = 0.0
    max_abs_column: str = ""
    text_cells: int = 0
    text_columns: list[str] = field(default_factory=list)
    new_columns: list[str] = field(default_factory=list)
    dropped_columns: list[str] = field(default_factory=list)
    rows: tuple[int, int] | None = None  # (before, after) when the row count changed


def tables(run: Path) -> dict[str, Path]:
    """Every CSV under the run's table folders, by its path relative to the run."""
    found = {}
    for folder in TABLE_FOLDERS:
        for path in sorted((run / folder).rglob("*.csv")):
            found[str(path.relative_to(run))] = path
    return found


def compare_file(name: str, before: Path, after: Path) -> FileDiff | None:
    """None when the two files are equal byte for byte, else what differs."""
    if before.read_bytes() == after.read_bytes():
        return None
    diff = FileDiff(name)
    old, new = pd.read_csv(before), pd.read_csv(after)
    diff.new_columns = [c for c in new.columns if c not in old.columns]
    diff.dropped_columns = [c for c in old.columns if c not in new.columns]
    if len(old) != len(new):
        diff.rows = (len(old), len(new))
        return diff
    for column in [c for c in old.columns if c in new.columns]:
        a, b = old[column], new[column]
        if pd.api.types.is_numeric_dtype(a) and pd.api.types.is_numeric_dtype(b):
            x, y = a.to_numpy(dtype=float), b.to_numpy(dtype=float)
            both_nan = np.isnan(x) & np.isnan(y)
            gap = np.where(both_nan, 0.0, np.abs(x - y))
            gap = np.where(np.isnan(gap), np.inf, gap)  # NaN on one side only
            worst = float(gap.max()) if len(gap) else 0.0
            if worst > diff.max_abs:
                diff.max_abs, diff.max_abs_column = worst, column
        else:
            both_missing = a.isna() & b.isna()  # pandas' string dtype keeps NaN through astype(str)
            unequal = int(((a.astype(str) != b.astype(str)) & ~both_missing).sum())
            if unequal:
                diff.text_cells += unequal
                diff.text_columns.append(column)
    return diff


def compare_runs(before: Path, after: Path) -> tuple[list[FileDiff], list[str], list[str], int]:
    """The differing files, the files only before has, only after has, and how many files both have."""
    old, new = tables(before), tables(after)
    shared = [n for n in old if n in new]
    diffs = [d for n in shared if (d := compare_file(n, old[n], new[n])) is not None]
    return diffs, [n for n in old if n not in new], [n for n in new if n not in old], len(shared)


def describe(diff: FileDiff) -> str:
    """One line for a differing file."""
    parts = [diff.name]
    if diff.rows:
        parts.append(f"rows {diff.rows[0]} -> {diff.rows[1]}")
    else:
        parts.append(f"max |diff| {diff.max_abs:.3g}" + (f" ({diff.max_abs_column})" if diff.max_abs_column else ""))
    if diff.text_cells:
        parts.append(f"{diff.text_cells} text cells differ in {', '.join(diff.text_columns)}")
    if diff.new_columns:
        parts.append(f"new columns: {', '.join(diff.new_columns)}")
    if diff.dropped_columns:
        parts.append(f"dropped columns: {', '.join(diff.dropped_columns)}")
    return "; ".join(parts)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", type=Path, help="pairs: BEFORE_RUN AFTER_RUN ...")
    args = parser.parse_args()
    if len(args.runs) % 2:
        parser.error("runs: give pairs BEFORE_RUN AFTER_RUN")
    for before, after in zip(args.runs[::2], args.runs[1::2], strict=True):
        diffs, only_before, only_after, shared = compare_runs(before, after)
        print(f"== {before} vs {after}: {shared} tables in both, {shared - len(diffs)} identical byte for byte")
        for diff in diffs:
            print("  " + describe(diff))
        for name in only_before:
            print(f"  only before: {name}")
        for name in only_after:
            print(f"  only after: {name}")


if __name__ == "__main__":
    main()
