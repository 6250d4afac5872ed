"""A sweep's finished runs as one table, for the findings that compare configurations."""

from pathlib import Path

import pandas as pd

from headcount.report import collect_runs


def finished_runs(sweep_dir: Path) -> pd.DataFrame:
    runs, _ = collect_runs(sweep_dir)
    return runs[runs.status == "finished"].reset_index(drop=True)


def mean_over_seeds(runs: pd.DataFrame, keys: list[str], metric: str) -> pd.Series:
    return runs.groupby(keys)[metric].mean()
