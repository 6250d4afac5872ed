"""`kv_groups`: under grouped-query attention, each key/value head off with every query head that reads it (one mask
per group, named `L1KV0`). It is the smallest unit structural pruning can remove to shrink the key/value cache: a
key/value head goes only when all its query heads go. Without grouped-query attention each group is one head. Its
table adds `kv_head` (the group's key/value head in its layer) after `head`; its figure is a layer x key/value head
grid. On an encoder-decoder the groups are each kind's own (encoder self-attention, decoder self-attention,
cross-attention, each with its own group sizes), named by kind (`enc.L0KV1`, `cross.L1KV0`), the table with its `kind`
column and the figure with a panel per kind."""

from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from headcount.ablation.engine.masks import HeadMask, kv_group_masks
from headcount.ablation.scans.base import KINDS, ScanResult
from headcount.ablation.scans.by_kind import kind_panels
from headcount.ablation.scans.mask_scan import MaskScan, figure_title, table_metric
from headcount.labels import KindRows
from headcount.plotting import heatmap

if TYPE_CHECKING:
    from headcount.model.encoder_decoder import EncoderDecoder
    from headcount.model.transformer import Transformer

KV_NAME_PREFIX = "KV"


@KINDS.register
class KvGroupsScan(MaskScan):
    kind = "kv_groups"
    doc = "each key/value head off with every query head that reads it"
    reads = MaskScan.reads | {"model"}

    def masks(self) -> list[HeadMask]:
        return model_kv_group_masks(self.session.model)

    def compute(self, key: str) -> ScanResult:
        result = super().compute(key)
        result.table.insert(result.table.columns.get_loc("head") + 1, "kv_head", kv_heads(result.table["mask"]))
        return result

    @classmethod
    def figure(cls, table: pd.DataFrame, path: Path, subject: str = "") -> Path:
        kv = kv_heads(table["mask"])
        value, label = table_metric(table)
        if "kind" in table:  # an encoder-decoder's: a (layer, key/value head) panel per kind
            return kind_panels(
                table.assign(head=kv), path, value, figure_title(table, subject), label, "key/value head"
            )
        grid = np.full((int(table["layer"].max()) + 1, max(kv) + 1), np.nan)
        grid[table["layer"].to_numpy(), kv] = table[value].to_numpy(float)
        rows, cols = [str(layer) for layer in range(grid.shape[0])], [str(g) for g in range(grid.shape[1])]
        return heatmap(grid, path, figure_title(table, subject), rows, cols, "key/value head", "layer", label)


def model_kv_group_masks(model: "Transformer | EncoderDecoder") -> list[HeadMask]:
    """A model's key/value group masks: per layer of a one-stack model, per grid row (a kind's layer, with that
    attention's own groups) of an encoder-decoder."""
    grid = model.heads_per_layer
    if isinstance(grid, KindRows):
        return kv_group_masks([model.attention(kind, layer).kv_groups for kind, layer in grid.rows], grid)
    return kv_group_masks([block.attn.kv_groups for block in model.blocks])


def kv_heads(mask_names: pd.Series) -> list[int]:
    """The key/value head of each mask, read off its name (`L1KV0`, `cross.L1KV0` -> 0)."""
    return [int(name.rsplit(KV_NAME_PREFIX, 1)[1]) for name in mask_names]
