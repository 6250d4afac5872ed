"""What every scan kind shares: the registry of kinds, and the cached-result step.

A scan kind is a subclass of `Scan` decorated with `@register`: it names its fingerprint inputs, computes its table,
draws its figures and says what follows from its table. `Scan.run` does the rest, the same way for every kind:
read the table back when summary.json holds the same fingerprint and the CSV is there (announcing it), otherwise
compute it, write `<name>.csv`, drop the partial file a resumable scan kept, draw the figures and record the scan in
summary.json.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import ClassVar

import pandas as pd

from headcount.ablation.context import ScanContext
from headcount.ablation.evaluator import MaskTotals
from headcount.ablation.masks import HeadMask
from headcount.ablation.results import fingerprint, write_csv
from headcount.ablation.resumable import evaluate_resumably
from headcount.config.ablation import AblationConfig, ScanConfig

KINDS: dict[str, type[Scan]] = {}  # kind -> its Scan class, filled as the modules of this package are imported


def register(cls: type[Scan]) -> type[Scan]:
    KINDS[cls.kind] = cls
    return cls


class Scan:
    kind: ClassVar[str]

    def __init__(self, name: str, cfg: ScanConfig, session: ScanContext):
        self.name, self.cfg, self.session = name, cfg, session
        self.csv = session.out / f"{name}.csv"
        self.partial = session.out / f"{name}.partial.csv"  # where a resumable scan keeps its running sums

    # --- what a kind defines ----------------------------------------------------------------------------------

    @classmethod
    def check(cls, name: str, cfg: ScanConfig, settings: AblationConfig) -> None:
        """ConfigError for settings this kind cannot use; needs no model, so it runs before any work."""

    def prepare(self) -> None:
        """Checks against the loaded model (and anything they read), at the start of the session."""

    def fingerprint_parts(self) -> tuple:
        """What the table depends on beyond the session's checkpoint, data and settings."""
        return (self.kind,)

    def compute(self, key: str) -> pd.DataFrame:
        raise NotImplementedError

    def figures(self, table: pd.DataFrame) -> list[Path | None]:
        return []

    def use(self, table: pd.DataFrame) -> None:
        """What follows from the table, computed or read back: summary.json entries, values other scans need."""

    # --- the cached-result step ------------------------------------------------------------------------------

    def key(self) -> str:
        return fingerprint(self.session.key, *self.fingerprint_parts())

    def read_back(self, announce: bool = True) -> pd.DataFrame | None:
        """The table, if it is up to date."""
        return self.session.files.up_to_date(self.name, self.key(), self.csv, announce)

    def run(self, announce: bool = True) -> pd.DataFrame:
        table = self.read_back(announce)
        if table is None:
            key, start = self.key(), time.perf_counter()
            table = self.compute(key)
            write_csv(self.csv, table)
            self.partial.unlink(missing_ok=True)
            files = [self.csv, *self.figures(table)]
            self.session.files.record(self.name, self.kind, key, files, time.perf_counter() - start, len(table))
        self.use(table)
        return table

    def evaluate(self, masks: list[HeadMask], key: str) -> MaskTotals:
        """The masks' loss sums on the session's evaluator, resumable from this scan's partial file."""
        s = self.session.settings
        label = f"{self.name} ({s.mode})"
        return evaluate_resumably(self.session.evaluator, masks, self.partial, key, label, s.progress)
