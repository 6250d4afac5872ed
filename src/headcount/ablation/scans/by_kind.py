"""An encoder-decoder's heads in tables and figures: a table of grid rows gets each head's kind and its kind's own
layer (`with_kinds`), and figures draw the three kinds of heads apart: one (layer, head) panel per kind (encoder
self-attention, decoder self-attention, cross-attention), on one colour scale centred on zero, so that a cell is read
against the cells of every kind; a layer scan's figure is one column with a row per kind's layer (enc.L0, cross.L1)."""

from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib.colors import TwoSlopeNorm

from headcount.io import atomic_savefig
from headcount.labels import HEAD_KINDS, KIND_NAMES, KindRows
from headcount.plotting import layer_head_grid, new_figure


def kinds_of(table: pd.DataFrame) -> list[str]:
    """The kinds a table's rows name, in the model's order (enc, dec, cross)."""
    present = set(table["kind"].astype(str))
    return [kind for kind in HEAD_KINDS if kind in present]


def kind_panels(
    table: pd.DataFrame, path: Path, value: str, title: str, value_label: str, columns: str = "head"
) -> Path:
    """One (layer, head) heatmap of `value` per kind, side by side, one colour scale; `columns` names what the
    table's head column holds (a key/value head in the kv_groups scan's)."""
    kinds = kinds_of(table)
    grids = [layer_head_grid(table[table["kind"] == kind], value) for kind in kinds]
    finite = [g[np.isfinite(g)] for g in grids]
    limit = max((float(np.abs(v).max()) for v in finite if v.size), default=0.0) or 1e-12
    width = sum(max(1.6 + 0.6 * g.shape[1], 2.8) for g in grids) + 1.5
    fig = new_figure(min(width, 18), min(2.5 + 0.5 * max(g.shape[0] for g in grids), 12))
    axes = fig.subplots(1, len(kinds), squeeze=False)[0]
    norm = TwoSlopeNorm(0.0, -limit, limit)
    for ax, kind, grid in zip(axes, kinds, grids):
        image = ax.imshow(grid, cmap="RdBu_r", norm=norm, aspect="auto")
        L, H = grid.shape
        ax.set_xticks(range(H), [str(h) for h in range(H)])
        ax.set_yticks(range(L), [f"{kind}.L{layer}" for layer in range(L)])
        ax.set(xlabel=columns, title=KIND_NAMES[kind])
        for r in range(L):
            for c in range(H):
                if np.isfinite(grid[r, c]):
                    dark = abs(grid[r, c]) > 0.6 * limit
                    ax.text(
                        c, r, f"{grid[r, c]:.3g}", ha="center", va="center", fontsize=7, color="white" if dark else "k"
                    )
    fig.colorbar(image, ax=list(axes), label=value_label)
    fig.suptitle(title, fontsize=9)
    atomic_savefig(fig, path, dpi=120)
    return Path(path)


def with_kinds(table: pd.DataFrame, heads_per_layer: list[int]) -> pd.DataFrame:
    """A table whose `layer` column holds grid rows, with a `kind` column before it and the kind's own layer in it
    on an encoder-decoder (labels.KindRows); unchanged on a one-stack model."""
    if not isinstance(heads_per_layer, KindRows):
        return table
    rows = [heads_per_layer.rows[row] for row in table["layer"]]
    table = table.assign(layer=[layer for _, layer in rows])
    table.insert(table.columns.get_loc("layer"), "kind", [kind for kind, _ in rows])
    return table
