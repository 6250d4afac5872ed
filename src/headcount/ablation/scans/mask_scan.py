"""What the mask scans share: each evaluates a list of named masks exactly, resumably, into one row per mask with
deltas against the unmasked model, and draws `delta_loss` (in nats) as its figure."""

from functools import cached_property
from pathlib import Path

import pandas as pd

from headcount.ablation.evaluator import MaskTotals
from headcount.ablation.masks import HeadMask
from headcount.ablation.scans.base import Scan

SCAN_COLUMNS = ["scan", "mask", "layer", "head", "mode", "loss", "acc", "delta_loss", "delta_acc", "n_heads_off"]
FIGURE_VALUE = "delta_loss"
FIGURE_LABEL = "loss increase (nats)"  # what FIGURE_VALUE is, with its unit


class MaskScan(Scan):
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
        return (self.kind, [(m.name, m.heads_off) for m in self.head_masks])

    def compute(self, key: str) -> pd.DataFrame:
        totals = self.evaluate(self.head_masks, key)
        return scan_table(self.name, self.session.settings.mode, self.head_masks, totals, self.session.baseline)

    def figures(self, table: pd.DataFrame) -> list[Path | None]:
        return [self.figure(table, self.path(".png"), self.session.subject)]


def figure_title(table: pd.DataFrame, subject: str) -> str:
    """The scan, the metric with its unit, the mode, and on a second line the model and the data."""
    title = f"{table['scan'].iloc[0]}: {FIGURE_LABEL}, {table['mode'].iloc[0]} ablation"
    return f"{title}\n{subject}" if subject else title


def scan_table(scan: str, mode: str, masks: list[HeadMask], totals: MaskTotals, baseline: dict) -> pd.DataFrame:
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
