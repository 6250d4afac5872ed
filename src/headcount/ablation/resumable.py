"""Resumable mask evaluation: an interrupted scan picks up from its partial file `<scan>.partial.csv`.

The partial file starts with a `# fingerprint=...` line (what the numbers depend on: checkpoint, data, settings, masks,
batching); a partial file with another fingerprint is ignored and overwritten. Its rows hold each mask's running sums
in float64 (written with repr, read back exactly), so a resumed scan ends with the same numbers as an uninterrupted
one. Every write is atomic.
"""

import csv
import io
import time
from pathlib import Path

import pandas as pd
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

from headcount.ablation.evaluator import MaskEvaluator, MaskTotals
from headcount.ablation.masks import HeadMask, masks_to_gates
from headcount.ablation.results import fingerprint
from headcount.io import atomic_write_text

PARTIAL_COLUMNS = ["mask", "batches_done", "nll_sum", "n_correct", "n_targets"]
SAVE_INTERVAL_S = 5.0  # the partial file is rewritten after a pass at most this often (and always at the end)


def evaluate_resumably(
    evaluator: MaskEvaluator,
    masks: list[HeadMask],
    partial: Path,
    key: str,
    label: str,
    show_progress: bool,
) -> MaskTotals:
    """Evaluate the masks, starting from a partial file saved under the same key if there is one, and keeping it up
    to date as passes finish. The caller writes the final results and deletes the partial file."""
    key = fingerprint(key, [(m.name, m.heads_off) for m in masks], evaluator.batch_size, len(evaluator.batches))
    gates_MLH = masks_to_gates(masks, evaluator.model.heads_per_layer)
    totals = load_partial(partial, key, masks) or MaskTotals.empty(len(masks))
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

        evaluator.accumulate(gates_MLH, totals, on_pass)
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
