"""Figures that compare the runs of a sweep: metrics against each swept value, pruning curves per configuration,
single-head ablation heatmaps side by side. Each takes the report's runs table (report.py) and returns the path it
wrote, or None when the sweep has nothing to draw. Seeds are replicates: figures show their mean and spread.

Each figure's title says what it shows and, on a second line, the sweep's subject (`sweep_subject`: the model and the
data where the runs share them, and the ablation mode whose results it reads, each run's own: zero unless its
experiment says otherwise); axes carry units. Pruning curves are relative to each run's baseline, in %, on an axis
linear up to the tolerance and logarithmic beyond, so that the tolerance line stays visible.
"""

from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib.colors import TwoSlopeNorm
from matplotlib.ticker import FuncFormatter
from omegaconf import OmegaConf

from headcount.ablation.engine.metrics import table_metric
from headcount.ablation.records.address import run_address
from headcount.ablation.records.results import read_checked
from headcount.ablation.scans.base import configured_variant
from headcount.ablation.scans.mask_scan import table_metric as scan_figure_value
from headcount.captions import describe_data, describe_model
from headcount.io import atomic_savefig
from headcount.plotting import layer_head_grid, new_figure, set_title
from headcount.run_dir import RunPaths

PANELS_PER_ROW = 3
DEFAULT_TOLERANCE = 0.01  # ablation.pruning.tolerance's default, for runs whose config does not say


def run_config(sweep_dir: Path, run: str):
    path = RunPaths(sweep_dir / run).config
    return OmegaConf.load(path) if path.exists() else OmegaConf.create({})


def sweep_subject(runs: pd.DataFrame, sweep_dir: Path) -> str:
    """The model, the data and the ablation mode of the runs, each named where the runs share it."""
    models, datas, modes = set(), set(), set()
    for run in runs["run"]:
        config = run_config(sweep_dir, run)
        modes.add(run_address(sweep_dir / run, config).section)
        if "model" in config and "data" in config:
            models.add(describe_model(config, sweep_dir / run))
            datas.add(describe_data(config))
    parts = [
        models.pop() if len(models) == 1 else "models by configuration" if models else "",
        datas.pop() if len(datas) == 1 else "data by configuration" if datas else "",
        f"{modes.pop()} ablation" if len(modes) == 1 else "each run's ablation mode",
    ]
    return ", ".join(part for part in parts if part)


def metric_label(metric: str) -> str:
    """A metric with its unit: losses in nats, accuracies and prunable fractions as fractions."""
    if metric.endswith("loss"):
        return f"{metric} (nats)"
    if metric.startswith("prunable_fraction"):
        return f"{metric} (fraction of heads)"
    return f"{metric} (fraction)" if metric.endswith("acc") else metric


def ablation_csv(sweep_dir: Path, run: str, scan: str) -> Path:
    """A run's result file for a scan, in the mode and metric (and on the task) its config asks for, with the scan's
    own variant as its config sets it."""
    config = run_config(sweep_dir, run)
    return run_address(sweep_dir / run, config).file(scan, ".csv", scan_variant=configured_variant(config, scan))


def x_positions(values: list) -> tuple[np.ndarray, list[str]]:
    """Numbers stay on a numeric axis; anything else (names, booleans) goes on evenly spaced ticks."""
    if all(isinstance(v, int | float) and not isinstance(v, bool) for v in values):
        return np.asarray(values, dtype=float), [str(v) for v in values]
    return np.arange(len(values), dtype=float), [str(v) for v in values]


def metrics_against(
    runs: pd.DataFrame, key: str, others: list[str], metrics: list[str], path: Path, subject: str = ""
) -> Path:
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
        ax.set(xlabel=key, ylabel=metric_label(metric))
        set_title(ax, f"{metric} against {short_key(key)} (mean over seeds)", 4.5)
    if others:
        axes[-1].legend(fontsize=7)
    suptitle(fig, subject)
    atomic_savefig(fig, path, dpi=110)
    return path


def pruning_curves(
    runs: pd.DataFrame, sweep_dir: Path, configs: list[str], path: Path, subject: str = ""
) -> Path | None:
    """The loss relative to each run's baseline (loss / baseline - 1, in %) against the fraction of heads pruned: one
    panel per pruning order, one line per configuration, the mean over its seeds (and over the random order's
    permutations); the tolerance as a dotted line."""
    tables, tolerances = [], set()
    for _, run in runs.iterrows():
        csv = ablation_csv(sweep_dir, run["run"], "pruning")
        curves = read_checked(csv) if csv.exists() else pd.DataFrame()
        if "fraction" in curves and (curves["fraction"] == 0).any():  # a scan that drew no curve: nothing to compare
            metric = table_metric(curves)
            values = curves[metric.primary]
            baseline = float(values[curves["fraction"] == 0].iloc[0])
            config = config_label(configs, tuple(run[k] for k in configs))
            worse = 100 * metric.damage(values, baseline) / abs(baseline)
            tables.append(curves.assign(config=config, relative=worse))
            config_file = run_config(sweep_dir, run["run"])
            tolerances.add(
                float(OmegaConf.select(config_file, "ablation.pruning.tolerance", default=DEFAULT_TOLERANCE))
            )
    if not tables:
        return None
    curves = pd.concat(tables).groupby(["order", "config", "fraction"], sort=False)["relative"].mean()
    orders = list(curves.index.unique("order"))
    linthresh = max(100 * min(tolerances), 0.1)
    fig, axes = panels(len(orders))
    for ax, order in zip(axes, orders):
        for config, curve in curves[order].groupby(level="config", sort=False):
            ax.plot(curve.index.get_level_values("fraction"), curve.to_numpy(), marker="o", markersize=3, label=config)
        ax.axhline(0, color="black", linestyle="--", linewidth=1)
        for tolerance in sorted(tolerances):
            ax.axhline(
                100 * tolerance, color="tab:red", linestyle=":", linewidth=1.2, label=f"tolerance {100 * tolerance:g}%"
            )
        ax.set_yscale("symlog", linthresh=linthresh)
        ax.set_ylim(bottom=min(1.2 * float(curves.min()), -0.5 * linthresh))
        ax.yaxis.set_major_formatter(FuncFormatter(lambda value, _: f"{value:g}%"))
        ax.set(xlabel="fraction of heads pruned", ylabel="worse than the baseline (% of it, mean over seeds)")
        set_title(ax, f"pruning order: {order}", 4.5)
    ax.legend(fontsize=7)
    suptitle(fig, subject)
    atomic_savefig(fig, path, dpi=110)
    return path


def single_head_title(runs: pd.DataFrame, sweep_dir: Path) -> str:
    """The single-head section's title: the metric's change and the mode of the first run's table (a task's patch
    scan is titled by its logit difference, not by the loss)."""
    for _, run in runs.iterrows():
        csv = ablation_csv(sweep_dir, run["run"], "single_head")
        if csv.exists():
            table = read_checked(csv)
            mode = f", {table['mode'].iloc[0]} ablation" if "mode" in table and len(table) else ""
            return f"Single-head ablation ({scan_figure_value(table)[1]} with each head off alone{mode})"
    return "Single-head ablation"


def single_head_grid(
    runs: pd.DataFrame, sweep_dir: Path, configs: list[str], path: Path, subject: str = ""
) -> Path | None:
    """The single_head scan of every run: a row per configuration, a column per seed, one colour scale (loss increase
    when that head alone is off, blue below zero, red above)."""
    grids, label = {}, ""
    for _, run in runs.iterrows():
        csv = ablation_csv(sweep_dir, run["run"], "single_head")
        if csv.exists():
            table = read_checked(csv).dropna(subset=["layer", "head"])
            value, label = scan_figure_value(table)
            grids[run["run"]] = layer_head_grid(table, value)
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
    fig.colorbar(image, ax=axes, label=f"{label} with the head off alone", shrink=0.6)
    suptitle(fig, subject)
    atomic_savefig(fig, path, dpi=110)
    return path


def suptitle(fig, subject: str) -> None:
    if subject:
        fig.suptitle(subject, fontsize=9)


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
