"""What the mask scans share: each evaluates a list of named masks exactly, resumably, into one row per mask with the
metric's values and their deltas against the unmasked model, and draws the metric's delta as its figure.

Columns: scan, mask, [kind: enc, dec or cross on an encoder-decoder], layer, head, [position], mode, each metric column
(loss and acc for loss), delta_<column> for each, [gap_fraction], n_heads_off, delta_<metric>_ci_low and _ci_high,
[gap_fraction_ci_low and _ci_high], top_share, then how the table was computed (ablation/records/results.py).
gap_fraction, on a task with corrupted prompts: the mask's delta as a share of the gap between the prompts and their
counterparts, delta / (counterpart - baseline) of the metric: the fraction of the clean-to-corrupted gap a mask removes
(noising) or restores (denoising, where the baseline is the corrupted run). delta_<metric>_ci_low and _ci_high: the
primary delta's 95% bootstrap interval over the examples; gap_fraction's the same over the same resamples (a prompt
drawn with its counterpart, the gap resampled with the delta); top_share: the share of resamples with the mask among the
scan's top heads by damage (intervals.py; summary.json's `intervals` entry has their stability); the second figure draws
the largest deltas with their intervals.
"""

from functools import cached_property
from pathlib import Path

import numpy as np
import pandas as pd

from headcount.ablation.engine.evaluator import MaskTotals
from headcount.ablation.engine.masks import HeadMask
from headcount.ablation.engine.metrics import Metric
from headcount.ablation.engine.metrics import table_metric as metric_of
from headcount.ablation.scans.base import Scan, ScanResult
from headcount.ablation.scans.by_kind import kind_panels
from headcount.ablation.scans.intervals import (
    BOOTSTRAP_RULE,
    example_points,
    example_sums,
    interval_figure,
    with_intervals,
)
from headcount.plotting import head_heatmap, heatmap

EXAMPLE_BASELINE = "no head off (each example's baseline)"  # the mask evaluated beside a scan's for its intervals
SCAN_COLUMNS = ["scan", "mask", "layer", "head", "mode", "loss", "acc", "delta_loss", "delta_acc", "n_heads_off"]
SCAN_COLUMNS += ["delta_loss_ci_low", "delta_loss_ci_high", "top_share"]  # intervals.py


class MaskScan(Scan):
    reads = Scan.reads | {"evaluator", "positions", "baseline", "counterpart", "counterpart_sums"}

    def masks(self) -> list[HeadMask]:
        raise NotImplementedError

    @classmethod
    def figure(cls, table: pd.DataFrame, path: Path, subject: str = "") -> Path | None:
        """The figure of a table of this kind (a scan CSV), its title naming the model and data in `subject`; None
        where one number needs none."""
        return None

    @cached_property
    def head_masks(self) -> list[HeadMask]:
        return self.masks()

    def fingerprint_parts(self) -> tuple:
        masks = [(m.name, m.heads_off, m.position) if m.position else (m.name, m.heads_off) for m in self.head_masks]
        return (self.kind, masks, BOOTSTRAP_RULE)

    def compute(self, key: str) -> ScanResult:
        session = self.session
        # the last mask turns no head off: each example's baseline sums, handed over from the clean pass (no forward)
        every = self.evaluate([*self.head_masks, HeadMask(EXAMPLE_BASELINE, ())], key)
        ex = every.examples
        totals = MaskTotals(
            every.batches_done[:-1],
            every.sums[:-1],
            every.n_targets[:-1],
            every.columns,
            None if ex is None else ex[:-1],
        )
        mode = session.settings.mode
        table = scan_table(
            self.name, mode, self.head_masks, totals, session.baseline, session.metric, session.counterpart
        )
        points, seed = example_points(session.evaluator), session.settings.seed
        baseline = None if ex is None else ex[-1]
        self.example_sums = example_sums(totals, baseline, points, seed)  # a subclass's own ratios resample them
        counterpart = session.counterpart_sums
        table, entry = with_intervals(table, totals, baseline, points, session.metric, seed, counterpart)
        return ScanResult(table, summary={"intervals": {self.name: entry}})

    def file_names(self) -> list[tuple[str, str]]:
        return [*super().file_names(), ("_intervals", ".png")]

    def figures(self, table: pd.DataFrame) -> list[Path | None]:
        figures = [self.figure(table, self.path(".png"), self.session.subject)]
        value, label = table_metric(table)
        if f"{value}_ci_low" in table and table[f"{value}_ci_low"].notna().any():
            title = self.title(f"{label}, the largest with their intervals")
            gap = "gap_fraction_ci_low" in table and table["gap_fraction_ci_low"].notna().any()
            beside = ("gap_fraction", "share of the clean-to-corrupted gap") if gap else None
            figures.append(interval_figure(table, self.path(".png", "_intervals"), title, label, value, beside=beside))
        return figures


def table_metric(table: pd.DataFrame) -> tuple[str, str]:
    """A scan table's figure value, the delta of its metric, and that value's label with its unit."""
    metric = metric_of(table)
    if not metric.named_in_results:
        return f"delta_{metric.primary}", f"{metric.primary} increase ({metric.unit})"
    return f"delta_{metric.primary}", f"change in {metric.name} ({metric.unit})"


def figure_title(table: pd.DataFrame, subject: str) -> str:
    """The scan, the metric with its unit, the mode, and on a second line the model and the data."""
    title = f"{table['scan'].iloc[0]}: {table_metric(table)[1]}, {table['mode'].iloc[0]} ablation"
    return f"{title}\n{subject}" if subject else title


def head_figure(table: pd.DataFrame, path: Path, subject: str = "") -> Path:
    """A (layer, head) heatmap of the metric's delta; per named position (a `position` column), one block of heads
    per position side by side."""
    value, label = table_metric(table)
    title = figure_title(table, subject)
    if "kind" in table:  # an encoder-decoder's: a panel per kind of head
        return kind_panels(table, path, value, title, label)
    if "position" not in table or not (table["position"].astype(str) != "").any():
        return head_heatmap(table, path, value, title, label)
    positions = list(dict.fromkeys(table["position"].astype(str)))
    L, H = int(table["layer"].max()) + 1, int(table["head"].max()) + 1
    grid = np.full((L, len(positions) * H), np.nan)
    for i, position in enumerate(positions):
        rows = table[table["position"].astype(str) == position]
        grid[rows["layer"].to_numpy(int), i * H + rows["head"].to_numpy(int)] = rows[value].to_numpy(float)
    columns = [f"{position}:{head}" for position in positions for head in range(H)]
    return heatmap(grid, path, title, [str(layer) for layer in range(L)], columns, "position:head", "layer", label)


def scan_table(
    scan: str,
    mode: str,
    masks: list[HeadMask],
    totals: MaskTotals,
    baseline: dict,
    metric: Metric,
    counterpart: dict | None = None,
) -> pd.DataFrame:
    """The long-format results: one row per mask, with deltas against the unmasked model."""
    values = {column: totals.value(column).numpy() for column in metric.columns}
    table = pd.DataFrame(
        {
            "scan": scan,
            "mask": [m.name for m in masks],
            **({"kind": [m.kind for m in masks]} if any(m.kind for m in masks) else {}),  # an encoder-decoder's
            "layer": [m.layer for m in masks],
            "head": [m.head for m in masks],
            **({"position": [m.position for m in masks]} if any(m.position for m in masks) else {}),
            "mode": mode,
            **values,
            **{f"delta_{column}": value - baseline[column] for column, value in values.items()},
        }
    )
    if counterpart is not None:
        primary = metric.primary
        gap = counterpart[primary] - baseline[primary]
        table["gap_fraction"] = (values[primary] - baseline[primary]) / gap if gap != 0 else float("nan")
    table["n_heads_off"] = [len(m.heads_off) for m in masks]
    return table
