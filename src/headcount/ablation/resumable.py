"""Resumable mask evaluation: an interrupted scan picks up from its partial file `<scan>.partial.csv`.

The partial file starts with a `# fingerprint=...` line (what the numbers depend on: checkpoint, data, settings, masks,
batching, metric); a partial file with another fingerprint is ignored and overwritten. Its rows hold each mask's
running sums of every metric column in float64 (written with repr, read back exactly), so a resumed scan ends with the
same numbers as an uninterrupted one. Every write is atomic.
"""

import csv
import io
import time
from pathlib import Path

import pandas as pd
import torch
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

from headcount.ablation.evaluator import MaskEvaluator, MaskTotals
from headcount.ablation.masks import HeadMask, masks_to_gates
from headcount.ablation.results import fingerprint
from headcount.io import atomic_write_text

SAVE_INTERVAL_S = 5.0  # the partial file is rewritten after a pass at most this often (and always at the end)


def evaluate_resumably(
    evaluator: MaskEvaluator,
    masks: list[HeadMask],
    partial: Path,
    key: str,
    label: str,
    show_progress: bool,
    positions: list[str] = (),
) -> MaskTotals:
    """Evaluate the masks, starting from a partial file saved under the same key if there is one, and keeping it up
    to date as passes finish. positions: the named positions masks may name (the columns of named_pos). The caller
    writes the final results and deletes the partial file."""
    columns = evaluator.columns
    masks_key = [(m.name, m.heads_off, m.position) if m.position else (m.name, m.heads_off) for m in masks]
    key = fingerprint(
        key, masks_key, evaluator.batch_size, len(evaluator.batches), *([columns] if columns != ("loss", "acc") else [])
    )
    gates_MLH = masks_to_gates(masks, evaluator.model.heads_per_layer)
    position_M = torch.tensor([list(positions).index(m.position) if m.position else -1 for m in masks])
    totals = load_partial(partial, key, masks, columns) or MaskTotals.empty(len(masks), columns)
    n_batches = len(evaluator.batches)
    last_save = time.monotonic()

    with progress_bar(show_progress) as progress:
        task = progress.add_task(
            f"{label}: {len(masks)} masks x {n_batches} batches",
            total=len(masks) * n_batches,
            completed=int(totals.batches_done.sum()),
        )

        def on_pass(totals: MaskTotals, n_masks: int) -> None:
            nonlocal last_save
            progress.advance(task, n_masks)
            if time.monotonic() - last_save >= SAVE_INTERVAL_S:
                save_partial(partial, key, masks, totals)
                last_save = time.monotonic()

        evaluator.accumulate(gates_MLH, totals, on_pass, position_M)
    return totals


def progress_bar(show: bool) -> Progress:
    return Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
        console=Console(stderr=True),
        disable=not show,
    )


def partial_columns(columns: tuple[str, ...]) -> list[str]:
    return ["mask", "batches_done", *(f"{column}_sum" for column in columns), "n_targets"]


def save_partial(path: Path, key: str, masks: list[HeadMask], totals: MaskTotals) -> None:
    out = io.StringIO()
    out.write(f"# fingerprint={key}\n")
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(partial_columns(totals.columns))
    for i, mask in enumerate(masks):
        sums = [repr(float(v)) for v in totals.sums[i]]
        writer.writerow([mask.name, int(totals.batches_done[i]), *sums, int(totals.n_targets[i])])
    atomic_write_text(path, out.getvalue())


def load_partial(path: Path, key: str, masks: list[HeadMask], columns: tuple[str, ...]) -> MaskTotals | None:
    """The sums saved for these masks under the same fingerprint, or None."""
    if not path.exists():
        return None
    with open(path) as f:
        if f.readline().strip() != f"# fingerprint={key}":
            return None
        saved = pd.read_csv(f, float_precision="round_trip", keep_default_na=False, dtype={"mask": str}).set_index(
            "mask"
        )
    if list(saved.columns) != partial_columns(columns)[1:]:
        return None
    totals = MaskTotals.empty(len(masks), columns)
    for i, mask in enumerate(masks):
        if mask.name in saved.index:
            row = saved.loc[mask.name]
            totals.batches_done[i] = int(row["batches_done"])
            totals.sums[i] = torch.tensor([float(row[f"{column}_sum"]) for column in columns], dtype=torch.float64)
            totals.n_targets[i] = int(row["n_targets"])
    return totals
