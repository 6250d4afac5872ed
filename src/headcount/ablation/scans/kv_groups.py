"""`kv_groups`: under grouped-query attention, each key/value head off with every query head that reads it (one mask
per group, named `L1KV0`). It is the smallest unit structural pruning can remove to shrink the key/value cache: a
key/value head goes only when all its query heads go. Without grouped-query attention each group is one head. Its
table adds `kv_head` (the group's key/value head in its layer) after `head`; its figure is a layer x key/value head
grid."""

from pathlib import Path

import numpy as np
import pandas as pd

from headcount.ablation.engine.masks import HeadMask, kv_group_masks
from headcount.ablation.scans.base import KINDS, ScanResult
from headcount.ablation.scans.mask_scan import MaskScan, figure_title, table_metric
from headcount.plotting import heatmap

KV_NAME_PREFIX = "KV"


@KINDS.register
class KvGroupsScan(MaskScan):
    kind = "kv_groups"
    doc = "each key/value head off with every query head that reads it"
    reads = MaskScan.reads | {"model"}

    def masks(self) -> list[HeadMask]:
        return kv_group_masks([block.attn.kv_groups for block in self.session.model.blocks])

    def compute(self, key: str) -> ScanResult:
        result = super().compute(key)
        result.table.insert(result.table.columns.get_loc("head") + 1, "kv_head", kv_heads(result.table["mask"]))
        return result

    @classmethod
    def figure(cls, table: pd.DataFrame, path: Path, subject: str = "") -> Path:
        kv = kv_heads(table["mask"])
        grid = np.full((int(table["layer"].max()) + 1, max(kv) + 1), np.nan)
        grid[table["layer"].to_numpy(), kv] = table[table_metric(table)[0]].to_numpy(float)
        rows, cols = [str(layer) for layer in range(grid.shape[0])], [str(g) for g in range(grid.shape[1])]
        return heatmap(
            grid, path, figure_title(table, subject), rows, cols, "key/value head", "layer", table_metric(table)[1]
        )


def kv_heads(mask_names: pd.Series) -> list[int]:
    """The key/value head of each mask, read off its name (`L1KV0` -> 0)."""
    return [int(name.rsplit(KV_NAME_PREFIX, 1)[1]) for name in mask_names]
