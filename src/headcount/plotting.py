"""Figures from result tables: head heatmaps, pair heatmaps, bar charts of custom masks, pruning curves.

Each function takes a table as the ablation stage writes it (a scan CSV, importance.csv, pruning.csv) and a path, so a
sweep report can draw the same figures from files alone. Figures are built on matplotlib's object API with the Agg
canvas: no pyplot state, no display needed, nothing changed for a caller that uses another backend.
"""

import re
from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.colors import TwoSlopeNorm
from matplotlib.figure import Figure

from headcount.io import atomic_savefig

ANNOTATE_UP_TO = 16  # write each cell's value when the grid is at most this many cells each way
HEAD_NAME = re.compile(r"L(\d+)H(\d+)")


def new_figure(width: float, height: float) -> Figure:
    fig = Figure(figsize=(width, height), layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def heatmap(
    values_RC: np.ndarray,
    path: str | Path,
    title: str,
    row_labels: list[str],
    col_labels: list[str],
    xlabel: str,
    ylabel: str,
    value_label: str,
) -> Path:
    """A diverging heatmap centred on zero (NaN cells blank), with the values written in small grids."""
    R, C = values_RC.shape
    limit = float(np.nanmax(np.abs(values_RC))) if np.isfinite(values_RC).any() else 0.0
    limit = limit or 1e-12  # an all-zero grid still needs vmin < 0 < vmax
    fig = new_figure(min(2 + 0.7 * C, 16), min(1.5 + 0.5 * R, 14))
    ax = fig.add_subplot()
    image = ax.imshow(values_RC, cmap="RdBu_r", norm=TwoSlopeNorm(0.0, -limit, limit), aspect="auto")
    fig.colorbar(image, ax=ax, label=value_label)
    ax.set_xticks(range(C), col_labels, rotation=90 if C > 16 else 0)
    ax.set_yticks(range(R), row_labels)
    ax.set(xlabel=xlabel, ylabel=ylabel, title=title)
    if R <= ANNOTATE_UP_TO and C <= ANNOTATE_UP_TO:
        for r in range(R):
            for c in range(C):
                if np.isfinite(values_RC[r, c]):
                    dark = abs(values_RC[r, c]) > 0.6 * limit
                    ax.text(
                        c,
                        r,
                        f"{values_RC[r, c]:.3g}",
                        ha="center",
                        va="center",
                        fontsize=7,
                        color="white" if dark else "black",
                    )
    atomic_savefig(fig, path, dpi=120)
    return Path(path)


def layer_head_grid(table: pd.DataFrame, value: str) -> np.ndarray:
    """(layers, heads) values from rows with layer and head columns; NaN where a head has no row."""
    grid = np.full((int(table["layer"].max()) + 1, int(table["head"].max()) + 1), np.nan)
    grid[table["layer"].to_numpy(int), table["head"].to_numpy(int)] = table[value].to_numpy(float)
    return grid


def head_heatmap(table: pd.DataFrame, path: str | Path, value: str, title: str) -> Path:
    grid = layer_head_grid(table, value)
    L, H = grid.shape
    return heatmap(grid, path, title, [str(l) for l in range(L)], [str(h) for h in range(H)], "head", "layer", value)


def pairs_heatmap(table: pd.DataFrame, path: str | Path, value: str, title: str) -> Path:
    """Heads x heads, symmetric: the cell of (a, b) is the pair's value."""
    pairs = [tuple(HEAD_NAME.findall(name)) for name in table["mask"]]
    heads = sorted({head for pair in pairs for head in pair}, key=lambda h: (int(h[0]), int(h[1])))
    index = {head: i for i, head in enumerate(heads)}
    grid = np.full((len(heads), len(heads)), np.nan)
    for (a, b), v in zip(pairs, table[value].to_numpy(float)):
        grid[index[a], index[b]] = grid[index[b], index[a]] = v
    labels = [f"L{layer}H{head}" for layer, head in heads]
    return heatmap(grid, path, title, labels, labels, "head", "head", value)


def bar_chart(table: pd.DataFrame, path: str | Path, value: str, title: str) -> Path:
    """One horizontal bar per mask, coloured by sign."""
    fig = new_figure(8, min(1.5 + 0.3 * len(table), 20))
    ax = fig.add_subplot()
    values = table[value].to_numpy(float)
    ax.barh(range(len(table)), values, color=np.where(values >= 0, "tab:red", "tab:blue"))
    ax.set_yticks(range(len(table)), table["mask"].tolist())
    ax.invert_yaxis()
    ax.axvline(0, color="black", linewidth=0.8)
    ax.set(xlabel=value, title=title)
    atomic_savefig(fig, path, dpi=120)
    return Path(path)


def scan_figure(table: pd.DataFrame, kind: str, path: str | Path, value: str = "delta_loss") -> Path | None:
    """The figure that fits a scan kind's table (a scan CSV); the baseline scan, one number, gets none."""
    title = f"{table['scan'].iloc[0]}: {value}, {table['mode'].iloc[0]} ablation"
    if kind in ("single_head", "leave_one_in"):
        return head_heatmap(table, path, value, title)
    if kind == "layer":
        grid = table[value].to_numpy(float)[:, None]
        labels = [str(layer) for layer in table["layer"]]
        return heatmap(grid, path, title, labels, ["all heads"], "", "layer", value)
    if kind == "pairs":
        return pairs_heatmap(table, path, value, title)
    if kind == "custom":
        return bar_chart(table, path, value, title)
    return None


def pruning_figure(curves: pd.DataFrame, path: str | Path, baseline_loss: float, tolerance: float, title: str) -> Path:
    """Loss against the fraction of heads pruned, a line per order; random as the mean over seeds with a min-max
    band; the baseline and the tolerance threshold as horizontal lines."""
    fig = new_figure(7, 4.5)
    ax = fig.add_subplot()
    for order, curve in curves.groupby("order", sort=False):
        by_fraction = curve.groupby("fraction")["loss"]
        mean = by_fraction.mean()
        (line,) = ax.plot(mean.index, mean.to_numpy(), marker="o", markersize=3, label=order)
        if curve["seed"].nunique() > 1:
            ax.fill_between(mean.index, by_fraction.min(), by_fraction.max(), color=line.get_color(), alpha=0.2)
    ax.axhline(baseline_loss, color="black", linestyle="--", linewidth=1, label="baseline")
    ax.axhline(
        baseline_loss * (1 + tolerance), color="grey", linestyle=":", linewidth=1, label=f"tolerance {tolerance:g}"
    )
    ax.set(xlabel="fraction of heads pruned", ylabel="loss", title=title)
    ax.legend()
    atomic_savefig(fig, path, dpi=120)
    return Path(path)
