"""Partial results of a mask evaluation: an interrupted scan picks up from its partial file `<scan>.partial.csv` (and,
after a distributed run, from its processes' `<scan>.partial.rank<r>.csv`, merged, whatever the number of processes
now).

The partial file starts with a `# fingerprint=...` line (what the numbers depend on: checkpoint, data, settings, masks,
batching, metric); a partial file with another fingerprint is ignored and overwritten. Its rows hold each mask's
running sums of every metric column in float64 (written with repr, read back exactly), so a resumed scan ends with the
same numbers as an uninterrupted one, and, where the evaluation keeps them, each example's sums (`example_sums`, the
bootstrap's units: space-separated reprs), so that a resumed scan's intervals are the uninterrupted one's. Every
write is atomic.
"""

import csv
import io
import time
from pathlib import Path

import pandas as pd
import torch
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

from headcount.ablation.engine.evaluator import MaskEvaluator, MaskTotals
from headcount.ablation.engine.masks import HeadMask
from headcount.ablation.records.results import fingerprint
from headcount.io import atomic_write_text
from headcount.processes import console, first_process

SAVE_INTERVAL_S = 5.0  # the partial file is rewritten after a pass at most this often (and always at the end)


def partial_key(evaluator: MaskEvaluator, masks: list[HeadMask], key: str) -> str:
    """What a partial file's sums depend on: the scan's key, the masks, the batching and the metric's columns."""
    columns = evaluator.columns
    masks_key = [(m.name, m.heads_off, m.position) if m.position else (m.name, m.heads_off) for m in masks]
    extra = [columns] if evaluator.metric.named_in_results else []  # loss's partial files predate other metrics
    return fingerprint(key, masks_key, evaluator.batch_size, len(evaluator.batches), *extra)


def mask_positions(masks: list[HeadMask], positions: list[str]) -> torch.Tensor:
    """(M,) the column of named_pos each mask names, -1 for none."""
    return torch.tensor([list(positions).index(m.position) if m.position else -1 for m in masks])


class PartialSaver:
    """The on_pass hook of a resumable evaluation: advances the progress bar and rewrites the partial file at most
    every SAVE_INTERVAL_S (and once more when the evaluation ends)."""

    def __init__(self, path: Path, key: str, masks: list[HeadMask], label: str, n_batches: int, show: bool):
        self.path, self.key, self.masks, self.n_batches = path, key, masks, n_batches
        self.label, self.progress = f"{label} x {n_batches} batches", progress_bar(show)
        self.last_save = time.monotonic()

    def __enter__(self) -> "PartialSaver":
        self.progress.start()
        return self

    def __exit__(self, *exc) -> None:
        self.progress.stop()

    def begin(self, totals: MaskTotals) -> None:
        total = len(self.masks) * self.n_batches
        self.task = self.progress.add_task(self.label, total=total, completed=int(totals.batches_done.sum()))

    def __call__(self, totals: MaskTotals, n_masks: int) -> None:
        self.progress.advance(self.task, n_masks)
        if time.monotonic() - self.last_save >= SAVE_INTERVAL_S:
            self.save(totals)

    def save(self, totals: MaskTotals) -> None:
        save_partial(self.path, self.key, self.masks, totals)
        self.last_save = time.monotonic()


def progress_bar(show: bool) -> Progress:
    return Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
        console=console(),
        disable=not show,
    )


EXAMPLE_SUMS = "example_sums"  # the partial file's column of each example's sums, where the evaluation keeps them


def partial_columns(columns: tuple[str, ...]) -> list[str]:
    return ["mask", "batches_done", *(f"{column}_sum" for column in columns), "n_targets"]


def save_partial(path: Path, key: str, masks: list[HeadMask], totals: MaskTotals) -> None:
    out = io.StringIO()
    out.write(f"# fingerprint={key}\n")
    writer = csv.writer(out, lineterminator="\n")
    examples = totals.examples
    writer.writerow(partial_columns(totals.columns) + ([EXAMPLE_SUMS] if examples is not None else []))
    for i, mask in enumerate(masks):
        sums = [repr(float(v)) for v in totals.sums[i]]
        row = [mask.name, int(totals.batches_done[i]), *sums, int(totals.n_targets[i])]
        writer.writerow(row + ([" ".join(map(repr, examples[i].tolist()))] if examples is not None else []))
    atomic_write_text(path, out.getvalue(), every_process=True)  # each process of a distributed scan keeps its own


def partial_files(partial: Path) -> list[Path]:
    """A scan's partial file and those the processes of a distributed run of it keep (<scan>.partial.rank<r>.csv)."""
    return [partial, *sorted(partial.parent.glob(f"{partial.stem}.rank*.csv"))]


def rank_partial(partial: Path, rank: int) -> Path:
    return partial.with_name(f"{partial.stem}.rank{rank}.csv")


def discard_partials(partial: Path) -> None:
    """Delete the partial files once the result is written (by the process that wrote it), and the temporary files
    of partial saves a killed process left (io.atomic_write's hidden `.<name>.*.tmp`)."""
    if first_process():
        for path in [*partial_files(partial), *partial.parent.glob(f".{partial.stem}.*.tmp")]:
            path.unlink(missing_ok=True)


def load_partials(partial: Path, key: str, masks: list[HeadMask], columns: tuple[str, ...]) -> MaskTotals | None:
    """The sums saved for these masks under the same fingerprint, merged over the scan's partial files: each mask's
    row that has seen the most batches (one process or many, in this run or the interrupted one, saved them)."""
    loaded = [t for path in partial_files(partial) if (t := load_partial(path, key, masks, columns)) is not None]
    if not loaded:
        return None
    merged = loaded[0]
    if any(
        t.examples is None or t.examples.shape != merged.examples.shape for t in loaded if merged.examples is not None
    ):
        merged.examples = None  # a file without them (or of other examples): the merged sums have none
    for totals in loaded[1:]:
        further = totals.batches_done > merged.batches_done
        merged.batches_done[further] = totals.batches_done[further]
        merged.sums[further] = totals.sums[further]
        merged.n_targets[further] = totals.n_targets[further]
        if merged.examples is not None:
            merged.examples[further] = totals.examples[further]
    return merged


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
    kept = list(saved.columns) == [*partial_columns(columns)[1:], EXAMPLE_SUMS]
    if list(saved.columns) != partial_columns(columns)[1:] and not kept:
        return None
    parse = lambda text: torch.tensor([float(v) for v in str(text).split()], dtype=torch.float64)  # noqa: E731
    n_examples = len(parse(saved[EXAMPLE_SUMS].iloc[0])) if kept and len(saved) else None
    totals = MaskTotals.empty(len(masks), columns, n_examples)
    for i, mask in enumerate(masks):
        if mask.name in saved.index:
            row = saved.loc[mask.name]
            totals.batches_done[i] = int(row["batches_done"])
            totals.sums[i] = torch.tensor([float(row[f"{column}_sum"]) for column in columns], dtype=torch.float64)
            totals.n_targets[i] = int(row["n_targets"])
            if n_examples is not None:
                totals.examples[i] = parse(row[EXAMPLE_SUMS])
    return totals
