"""The figure primitives every stage draws with: a figure, a diverging heatmap, a (layer, head) grid from a table.

A scan kind's own figure lives beside it (ablation/scans/); reports and findings draw from result files with these.
Every figure's title names what it shows (the metric with its unit, the ablation mode, the model and the data) and
its axes carry units, so that a figure read on its own is not misread.
Figures are built on matplotlib's object API with the Agg canvas: no pyplot state, no display needed, nothing changed
for a caller that uses another backend.
"""

import textwrap
from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.colors import TwoSlopeNorm
from matplotlib.figure import Figure

from headcount.io import atomic_savefig

ANNOTATE_UP_TO = 16  # write each cell's value when the grid is at most this many cells each way


TITLE_POINTS = 9
CHARS_PER_INCH = 13  # at TITLE_POINTS: how much title text fits across a figure


def new_figure(width: float, height: float) -> Figure:
    fig = Figure(figsize=(width, height), layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def set_title(ax, title: str, fig_width: float | None = None) -> None:
    """The axes' title, each line wrapped to the figure's width so that none is cut off."""
    width = fig_width if fig_width is not None else ax.figure.get_figwidth()
    chars = max(int(width * CHARS_PER_INCH), 24)
    ax.set_title("\n".join(textwrap.fill(line, chars) for line in title.split("\n")), fontsize=TITLE_POINTS)


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
    fig = new_figure(min(max(2 + 0.7 * C, 5.5), 16), min(2 + 0.5 * R, 14))
    ax = fig.add_subplot()
    image = ax.imshow(values_RC, cmap="RdBu_r", norm=TwoSlopeNorm(0.0, -limit, limit), aspect="auto")
    fig.colorbar(image, ax=ax, label=value_label)
    ax.set_xticks(range(C), col_labels, rotation=90 if C > 16 else 0)
    ax.set_yticks(range(R), row_labels)
    ax.set(xlabel=xlabel, ylabel=ylabel)
    set_title(ax, title)
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


def head_heatmap(table: pd.DataFrame, path: str | Path, value: str, title: str, value_label: str | None = None) -> Path:
    """A (layer, head) heatmap of a table's `value` column; value_label (with its unit) names the colour scale."""
    grid = layer_head_grid(table, value)
    L, H = grid.shape
    rows, cols = [str(layer) for layer in range(L)], [str(head) for head in range(H)]
    return heatmap(grid, path, title, rows, cols, "head", "layer", value_label or value)
