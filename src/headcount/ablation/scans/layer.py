"""`layer`: every head of one layer off together; its figure is one column, a cell per layer."""

from pathlib import Path

import pandas as pd

from headcount.ablation.engine.masks import HeadMask, layer_masks
from headcount.ablation.scans.base import KINDS
from headcount.ablation.scans.mask_scan import MaskScan, figure_title, table_metric
from headcount.plotting import heatmap


@KINDS.register
class LayerScan(MaskScan):
    kind = "layer"
    doc = "all heads of one layer off"
    reads = MaskScan.reads | {"model"}

    def masks(self) -> list[HeadMask]:
        return layer_masks(self.session.model.heads_per_layer)

    @classmethod
    def figure(cls, table: pd.DataFrame, path: Path, subject: str = "") -> Path:
        grid = table[table_metric(table)[0]].to_numpy(float)[:, None]
        # an encoder-decoder's rows are a kind's layers, named so (enc.L0, cross.L1)
        labels = table["mask"].tolist() if "kind" in table else [str(layer) for layer in table["layer"]]
        title = figure_title(table, subject)
        return heatmap(grid, path, title, labels, ["all heads"], "", "layer", table_metric(table)[1])
