"""Mask scans: the masks each scan kind evaluates, a resumable evaluation of them, and the long-format table.

Kinds: `baseline` (nothing off), `single_head` (each head off alone), `layer` (every head of one layer off),
`leave_one_in` (in one layer only one head on), `pairs` (two heads off together: all pairs, or pairs among the
`top_k` heads with the largest single-head loss increase) and `custom` (masks from a file, see masks.py).
"""

import time
from collections.abc import Callable
from pathlib import Path

import pandas as pd
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

from headcount.ablation import masks as M
from headcount.ablation.evaluator import MaskEvaluator, MaskTotals
from headcount.ablation.results import fingerprint, load_partial, save_partial

MASK_SCANS = ("baseline", "single_head", "layer", "leave_one_in", "pairs", "custom")
SCAN_COLUMNS = ["scan", "mask", "layer", "head", "mode", "loss", "acc", "delta_loss", "delta_acc", "n_heads_off"]
SAVE_INTERVAL_S = 5.0  # the partial file is rewritten after a pass at most this often (and always at the end)


def scan_masks(kind: str, heads_per_layer: list[int], top_heads: Callable[[], list[M.Head]] | None = None):
    """The masks of a built-in scan kind; `top_heads()` gives the heads pairs are drawn from (default: all)."""
    if kind == "baseline":
        return M.baseline_masks()
    if kind == "single_head":
        return M.single_head_masks(heads_per_layer)
    if kind == "layer":
        return M.layer_masks(heads_per_layer)
    if kind == "leave_one_in":
        return M.leave_one_in_masks(heads_per_layer)
    if kind == "pairs":
        return M.pair_masks(top_heads() if top_heads is not None else M.all_heads(heads_per_layer))
    raise ValueError(f"{kind} is not a mask scan kind")


def evaluate_resumably(
    evaluator: MaskEvaluator,
    masks: list[M.HeadMask],
    partial: Path,
    key: str,
    label: str,
    show_progress: bool,
) -> MaskTotals:
    """Evaluate the masks, starting from a partial file saved under the same key if there is one, and keeping it up
    to date as passes finish. The caller writes the final results and deletes the partial file."""
    key = fingerprint(key, [(m.name, m.heads_off) for m in masks], evaluator.batch_size, len(evaluator.batches))
    gates_MLH = M.masks_to_gates(masks, evaluator.model.heads_per_layer)
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


def scan_table(scan: str, mode: str, masks: list[M.HeadMask], totals: MaskTotals, baseline: dict) -> pd.DataFrame:
    """The long-format results: one row per mask, with deltas against the unmasked model."""
    loss, acc = totals.loss().numpy(), totals.acc().numpy()
    return pd.DataFrame(
        {
            "scan": scan,
            "mask": [m.name for m in masks],
            "layer": [m.layer for m in masks],
            "head": [m.head for m in masks],
            "mode": mode,
            "loss": loss,
            "acc": acc,
            "delta_loss": loss - baseline["loss"],
            "delta_acc": acc - baseline["acc"],
            "n_heads_off": [len(m.heads_off) for m in masks],
        },
        columns=SCAN_COLUMNS,
    )
