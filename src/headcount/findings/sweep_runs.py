"""A sweep's finished runs as one table, for the findings that compare configurations."""

from pathlib import Path

import pandas as pd

from headcount.report.sweep_report import collect_runs


def finished_runs(sweep_dir: Path) -> pd.DataFrame:
    runs, _ = collect_runs(sweep_dir)
    return runs[runs.status == "finished"].reset_index(drop=True)


def mean_over_seeds(runs: pd.DataFrame, keys: list[str], metric: str) -> pd.Series:
    return runs.groupby(keys)[metric].mean()


def seed_noise(runs: pd.DataFrame, keys: list[str], metric: str) -> pd.Series:
    """Per dataset, the largest standard deviation over seeds of any configuration: a difference between two
    configurations counts only when it is larger than this (0 with a single seed)."""
    return runs.groupby(keys)[metric].std().fillna(0.0).groupby(level="data").max()
