"""Figures that compare the runs of a sweep: metrics against each swept value, pruning curves per configuration,
single-head ablation heatmaps side by side. Each takes the report's runs table (report.py) and returns the path it
wrote, or None when the sweep has nothing to draw. Seeds are replicates: figures show their mean and spread.
"""

from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib.colors import TwoSlopeNorm

from headcount.io import atomic_savefig
from headcount.plotting import layer_head_grid, new_figure
from headcount.run_dir import RunPaths

PANELS_PER_ROW = 3


def x_positions(values: list) -> tuple[np.ndarray, list[str]]:
    """Numbers stay on a numeric axis; anything else (names, booleans) goes on evenly spaced ticks."""
    if all(isinstance(v, int | float) and not isinstance(v, bool) for v in values):
        return np.asarray(values, dtype=float), [str(v) for v in values]
    return np.arange(len(values), dtype=float), [str(v) for v in values]


def metrics_against(runs: pd.DataFrame, key: str, others: list[str], metrics: list[str], path: Path) -> Path:
    """One panel per metric: the metric against `key`, one line per combination of the `others` swept keys, each
    point the mean over the runs that share it (the seeds), with their standard deviation as error bars."""
    values = sorted(runs[key].dropna().unique().tolist(), key=sort_key)
    xs, labels = x_positions(values)
    fig, axes = panels(len(metrics))
    groups = runs.groupby(others, dropna=False, sort=True) if others else [((), runs)]
    for ax, metric in zip(axes, metrics):
        for group, members in groups:
            stats = members.groupby(key)[metric].agg(["mean", "std"]).reindex(values)
            ax.errorbar(xs, stats["mean"], yerr=stats["std"], marker="o", capsize=3, label=config_label(others, group))
        ax.set_xticks(xs, labels)
        ax.set(xlabel=key, ylabel=metric, title=f"{metric} against {short_key(key)}")
    if others:
        axes[-1].legend(fontsize=7)
    atomic_savefig(fig, path, dpi=110)
    return path


def pruning_curves(runs: pd.DataFrame, sweep_dir: Path, configs: list[str], path: Path) -> Path | None:
    """Loss against the fraction of heads pruned: one panel per pruning order, one line per configuration, the mean
    over its seeds (and over the random order's permutations)."""
    tables = []
    for _, run in runs.iterrows():
        csv = RunPaths(sweep_dir / run["run"]).ablation / "pruning.csv"
        if csv.exists():
            tables.append(pd.read_csv(csv).assign(config=config_label(configs, tuple(run[k] for k in configs))))
    if not tables:
        return None
    curves = pd.concat(tables).groupby(["order", "config", "fraction"], sort=False)["loss"].mean()
    orders = list(curves.index.unique("order"))
    fig, axes = panels(len(orders))
    for ax, order in zip(axes, orders):
        for config, curve in curves[order].groupby(level="config", sort=False):
            ax.plot(curve.index.get_level_values("fraction"), curve.to_numpy(), marker="o", markersize=3, label=config)
        ax.set(xlabel="fraction of heads pruned", ylabel="loss (mean over seeds)", title=f"pruning order: {order}")
    ax.legend(fontsize=7)
    atomic_savefig(fig, path, dpi=110)
    return path


def single_head_grid(runs: pd.DataFrame, sweep_dir: Path, configs: list[str], path: Path) -> Path | None:
    """The single_head scan of every run: a row per configuration, a column per seed, one colour scale (loss increase
    when that head alone is off, blue below zero, red above)."""
    grids = {}
    for _, run in runs.iterrows():
        csv = RunPaths(sweep_dir / run["run"]).ablation / "single_head.csv"
        if csv.exists():
            table = pd.read_csv(csv).dropna(subset=["layer", "head"])
            grids[run["run"]] = layer_head_grid(table, "delta_loss")
    if not grids:
        return None
    runs = runs[runs["run"].isin(grids)]
    rows = runs.groupby(configs, dropna=False, sort=True) if configs else [((), runs)]
    n_cols = max(len(members) for _, members in rows)
    limit = max(float(np.nanmax(np.abs(g))) for g in grids.values()) or 1e-12
    norm = TwoSlopeNorm(0.0, -limit, limit)
    fig = new_figure(min(2.2 * n_cols + 1.5, 20), min(2.0 * len(rows) + 0.8, 30))
    axes = fig.subplots(len(rows), n_cols, squeeze=False)
    for r, (group, members) in enumerate(rows):
        for c in range(n_cols):
            ax = axes[r, c]
            if c >= len(members):
                ax.set_axis_off()
                continue
            run = members.iloc[c]
            grid = grids[run["run"]]
            image = ax.imshow(grid, cmap="RdBu_r", norm=norm, aspect="auto")
            ax.set_xticks(range(grid.shape[1]))
            ax.set_yticks(range(grid.shape[0]))
            ax.set(xlabel="head", ylabel="layer")
            ax.set_title(f"{config_label(configs, group)}\nseed={run.get('seed', '-')}", fontsize=7)
    fig.colorbar(image, ax=axes, label="delta_loss (head off alone)", shrink=0.6)
    atomic_savefig(fig, path, dpi=110)
    return path


def panels(n: int):
    """A figure with n panels, PANELS_PER_ROW to a row; the spare cells of the last row hidden."""
    n_cols = min(n, PANELS_PER_ROW)
    n_rows = -(-n // n_cols)
    fig = new_figure(4.5 * n_cols, 3.6 * n_rows)
    axes = fig.subplots(n_rows, n_cols, squeeze=False).ravel()
    for ax in axes[n:]:
        ax.set_axis_off()
    return fig, axes[:n]


def short_key(key: str) -> str:
    return key.rsplit(".", 1)[-1]


def config_label(keys: list[str], values) -> str:
    values = values if isinstance(values, tuple) else (values,)
    return ", ".join(f"{short_key(k)}={v}" for k, v in zip(keys, values)) or "all runs"


def sort_key(value) -> tuple:
    """Numbers in numeric order, then everything else by its text."""
    is_number = isinstance(value, int | float) and not isinstance(value, bool)
    return (0, value, "") if is_number else (1, 0, str(value))
